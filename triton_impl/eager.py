"""The eager fast path of triton_impl.rms_norm: a plan cache and a direct kernel launch.

A decode-sized RMSNorm costs less on the GPU than the host spends launching it through
torch.library dispatch and Triton's JITFunction.run (which binds and specialises every
argument on each call). Eager calls therefore go through a plan cache instead: keyed by
everything the launch depends on besides the data (shape, strides, storage offset mod 16
bytes, dtypes, devices), a plan holds launch.plan's kernel, grid, integer arguments and
constexprs, and the compiled kernels for each combination of 16-byte alignment of the three
pointers (the only specialisation left to the data). A hit skips the argument checks (the
key implies they passed; eps is checked each time), the planning and Triton's launcher; a
miss, or a new alignment, goes once through the checked, generic path.

What the direct launch assumes of Triton's internals (none of it public API):
- ``kernel[grid](...)`` returns the CompiledKernel it ran (or a future of it, ``.result()``);
- a CompiledKernel has ``run``, ``function``, ``packed_metadata`` and ``launch_metadata``,
  and ``run(grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata,
  enter_hook, exit_hook, *args)`` takes every kernel argument, constexprs included, in
  signature order (as JITFunction.run calls it);
- ``triton.knobs.runtime`` holds the launch hooks and ``triton.runtime.driver.active`` the
  current stream.
Checked against Triton 3.6 and 3.8 (VERIFIED_TRITON). On any other version, or with
RMSNORM_TRITON_FAST_LAUNCH=0, a hit launches through the public ``kernel[grid](...)``
instead: slower on the host, never a crash or a wrong launch.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton

from rmsnorm_api import EPS_MAX, EPS_MIN, bypass_ok, check_inputs
from triton_impl.kernels import INTERPRET
from triton_impl.launch import plan

#: (major, minor) Triton versions whose launcher this module's direct launch matches.
VERIFIED_TRITON = ((3, 6), (3, 8))


def _version(text: str) -> tuple[int, int]:
    parts = (text.split("+")[0].split(".") + ["0", "0"])[:2]
    return tuple(int(p) if p.isdigit() else -1 for p in parts)  # type: ignore[return-value]


def direct_launch_ok() -> bool:
    """Whether hits may launch the compiled kernel directly: a verified Triton with the
    launch hooks where this module expects them, and not switched off."""
    return (
        os.environ.get("RMSNORM_TRITON_FAST_LAUNCH", "1") != "0"
        and _version(triton.__version__) in VERIFIED_TRITON
        and hasattr(triton, "knobs")
        and hasattr(triton.knobs, "runtime")
    )


DIRECT = direct_launch_ok()
PLANS: dict = {}
_MAX_PLANS = 4096


class _Plan:
    __slots__ = ("kernel", "grid", "ints", "meta", "consts", "direct", "compiled")

    def __init__(self, kernel, grid: tuple, ints: tuple, meta: dict) -> None:
        self.kernel, self.grid, self.ints, self.meta = kernel, grid, ints, meta
        # constexprs in signature order, after the runtime arguments x, w, y, ints, eps;
        # a signature of any other shape is launched generically
        names = list(getattr(kernel, "arg_names", ()))
        self.consts = tuple(meta[a] for a in names if a in meta)
        self.direct = DIRECT and len(names) == 3 + len(ints) + 1 + len(self.consts)
        self.compiled: dict = {}  # (x, w, y 16-byte aligned) -> compiled kernel, or False


def _key(x: torch.Tensor, weight: Optional[torch.Tensor]) -> tuple:
    w = weight
    wkey = None if w is None else (w.shape, w.stride(), w.dtype, w.get_device())
    return (x.shape, x.stride(), x.storage_offset() % 8, x.dtype, x.get_device(), wkey)


def _run_compiled(compiled, grid: tuple, values: list, device: int) -> None:
    """Launch a compiled kernel as JITFunction.run does (see the module docstring)."""
    knobs = triton.knobs.runtime
    stream = triton.runtime.driver.active.get_current_stream(device)
    enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
    md = compiled.launch_metadata(grid, stream, *values) if enter is not None else None
    compiled.run(grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, md,
                 enter, leave, *values)  # fmt: skip


def _launchable(compiled) -> bool:
    """Whether a compiled kernel has what _run_compiled uses."""
    names = ("run", "function", "packed_metadata", "launch_metadata")
    return all(hasattr(compiled, a) for a in names)


def eager_ok(x, weight, out) -> bool:
    """Whether a call can take the fast path: no out=, and nothing the dispatcher's keys
    above the op would do (rmsnorm_api.bypass_ok: plain CUDA tensors, no gradient, no
    tracing, transform or mode)."""
    return out is None and bypass_ok(x, weight)


def eager_rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps, impl: str) -> torch.Tensor:
    """rms_norm for real CUDA tensors outside tracing (see eager_ok)."""
    key = _key(x, weight)
    p = PLANS.get(key)
    if p is None or not (type(eps) is float and EPS_MIN <= eps <= EPS_MAX):
        check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=impl)
    eps = float(eps)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    if p is None:
        launch = plan(x, weight, eps, y)
        args = launch.args
        # cache only when x and the weight are used in place (no copy made for the launch)
        # and the launch has no workspace of its own
        same = args[0].data_ptr() == x.data_ptr() and (weight is None or args[1] is weight)
        if same and launch.reusable:
            if len(PLANS) >= _MAX_PLANS:  # many shapes (e.g. a varying batch): start over
                PLANS.clear()
            p = PLANS[key] = _Plan(launch.kernel, launch.grid, tuple(args[3:-1]), launch.meta)
        else:
            launch.kernel[launch.grid](*args, **launch.meta)
            return y
    w = x if weight is None else weight  # a dummy pointer when there is no weight
    align = (x.data_ptr() % 16 == 0, w.data_ptr() % 16 == 0, y.data_ptr() % 16 == 0)
    compiled = p.compiled.get(align)
    if not compiled:  # compile (or find in Triton's caches) and launch, generically
        compiled = p.kernel[p.grid](x, w, y, *p.ints, eps, **p.meta)
        if align not in p.compiled:
            compiled = compiled.result() if hasattr(compiled, "result") else compiled
            p.compiled[align] = compiled if p.direct and _launchable(compiled) else False
        return y
    _run_compiled(compiled, p.grid, [x, w, y, *p.ints, eps, *p.consts], x.get_device())
    return y
