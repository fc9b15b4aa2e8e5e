"""What Triton generates for the default configs, without a GPU: compile each kernel ahead
of time for sm_90 and report its global memory instructions (vector widths) and, from the
cubin, registers and local memory.

    python scripts/triton_ptx.py [--dtypes bf16,fp32] [--ns 128,1000,4096,4097,65536]

Specialisation as at run time for contiguous rows of a fresh tensor: pointers 16-byte
aligned; row strides and N marked divisible by 16 when they are.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from typing import Optional

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from triton_impl.configs import Config, default_config, kernel_for

TYPES = {"bf16": ("bf16", 2), "fp16": ("fp16", 2), "fp32": ("fp32", 4)}


def compile_default(dtype: str, n: int, cfg: Optional[Config] = None):
    """Compile the kernel default_config picks for many rows of (dtype, n), or cfg."""
    ty, elem = TYPES[dtype]
    cfg = cfg or default_config(n, elem)
    kernel, consts = kernel_for(cfg, elem, has_weight=True)
    warps = consts.pop("num_warps")
    sig = {"x_ptr": f"*{ty}", "w_ptr": f"*{ty}", "y_ptr": f"*{ty}"}
    sig.update(stride_x="i32", stride_y="i32")
    if cfg.kernel != "split":
        sig["M"] = "i32"
    sig.update(N="i32", eps="fp32")
    names = kernel.arg_names
    div = ["x_ptr", "w_ptr", "y_ptr"] + (["stride_x", "stride_y", "N"] if n % 16 == 0 else [])
    src = ASTSource(
        fn=kernel,
        signature={**sig, **{k: "constexpr" for k in consts}},
        constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(names.index(a),): [["tt.divisibility", 16]] for a in div},
    )
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps))  # fmt: skip
    return cfg, compiled


def memory_ops(ptx: str) -> dict:
    ops = collections.Counter()
    for line in ptx.splitlines():
        m = re.search(r"\b((?:ld|st)\.global[\w.:]*|cp\.async\.c[ag]\.shared\.global)", line)
        if m:
            ops[re.sub(r"\.L[12]::[\w:]+|\.L2::cache_hint", "", m.group(1))] += 1
    return dict(ops)


def resources(cubin: bytes) -> tuple:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout  # fmt: skip
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?LOCAL:(\d+)", out)
    return tuple(int(v) for v in m.groups()) if m else (None, None, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--ns", default="128,512,1000,4095,4096,4097,5120,8192,12288,32768,65536,131072")
    args = p.parse_args()
    cols = ["dtype", "N", "config", "global memory instructions in the PTX", "registers",
            "local bytes"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        for n in map(int, args.ns.split(",")):
            cfg, k = compile_default(dtype, n)
            regs, _stack, local = resources(k.asm["cubin"])
            ops = ", ".join(f"{c} {o}" for o, c in sorted(memory_ops(k.asm["ptx"]).items()))
            plain = Config(cfg.kernel, cfg.block_n, cfg.num_warps).as_dict()
            short = {k: v for k, v in cfg.as_dict().items() if k in plain and v != plain[k] or
                     k in ("kernel", "block_n", "num_warps")}  # fmt: skip
            print(f"| {dtype} | {n} | {short} | {ops} | {regs} | {local} |")


if __name__ == "__main__":
    main()
