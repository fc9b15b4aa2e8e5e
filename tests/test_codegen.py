"""What the compiler made of CUDA's quantised rows body, read from the built extension's
SASS (cuobjdump, which Triton's wheel ships): a thread's 16-byte x loads of every slot
issued together, before the first is used.

Why a test: the rows body holds a row in registers, several slots a thread, so the loads
of its slots are the row's only memory parallelism. Whether the compiler issues them
together depends on how it if-converts each slot's branch, and that can turn on code the
kernel does not even run: a field added to the arguments and a probe behind a define once
put a branch between every slot's load, a trip to memory a slot, and the static form lost
a quarter of its bandwidth (docs/notebook/18-fp8-outputs.md, v72). Runs without a GPU.
"""

import os
import re
import subprocess

import pytest
import triton

import cuda_impl

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
#: the rows kernels of 4 slots a thread, x 16-bit or fp32 and no residual (mangled:
#: rms_norm_quant_kernel<T, void, 4, ...>: one for every form, or one a form)
ROWS4 = re.compile(r"rms_norm_quant_kernelI(13__nv_bfloat16|6__half|f)vLi4E")
#: the most instructions the four loads may span: together they lie within a dozen or so;
#: a slot apart, each is tens of instructions behind the last
SPAN = 32


def quant_sass(tmp: str) -> str:
    """The SASS of forward_quant's cubin in the built extension (extracted into tmp)."""
    if not os.access(CUOBJDUMP, os.X_OK):
        pytest.skip(f"no cuobjdump in Triton's wheel at {CUOBJDUMP}")
    lib = cuda_impl.ops.LIBRARY
    run = dict(capture_output=True, text=True, check=True, cwd=tmp)
    listed = subprocess.run([CUOBJDUMP, "-lelf", lib], **run).stdout
    name = next(
        (w for w in listed.split() if w.startswith("forward_quant.") and w.endswith(".cubin")),
        None,
    )
    assert name, f"no forward_quant cubin in {lib}:\n{listed}"
    subprocess.run([CUOBJDUMP, "-xelf", name, lib], **run)
    return subprocess.run([CUOBJDUMP, "-sass", os.path.join(tmp, name)], **run).stdout


def test_rows_body_issues_its_slots_loads_together(tmp_path):
    """In each rows kernel of 4 slots without a residual (each x dtype, each form), some
    run of four 16-byte loads lies within SPAN instructions: the vector path's x slots,
    issued before any is used."""
    kernels = {}
    for block in re.split(r"\n\s*Function : ", quant_sass(str(tmp_path)))[1:]:
        name = block.split("\n", 1)[0].strip()
        if ROWS4.search(name):
            kernels[name] = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", block)
    dtypes = {ROWS4.search(name).group(1) for name in kernels}
    assert len(dtypes) == 3, f"rows kernels of 4 slots for 3 x dtypes, found {sorted(kernels)}"
    for name, code in kernels.items():
        at = [i for i, ins in enumerate(code) if "LDG.E.128" in ins]
        spans = [at[i + 3] - at[i] for i in range(len(at) - 3)]
        assert spans and min(spans) <= SPAN, (
            f"{name}: its 16-byte loads at instructions {at[:8]}: no four within {SPAN}"
        )
