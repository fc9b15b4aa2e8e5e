"""The eager fast path of triton_impl.rms_norm and of the functional fused add: a plan
cache and a direct kernel launch.

A decode-sized RMSNorm (or fused add) costs less on the GPU than the host spends launching
it through torch.library dispatch and Triton's JITFunction.run (which binds and
specialises every argument on each call). Eager calls therefore go through a plan cache
instead: keyed by everything the launch depends on besides the data (shape, strides,
storage offset mod 16 bytes, dtypes, devices), a plan holds the planned launch's kernel,
grid, integer arguments and constexprs, and the compiled kernels for each combination of
16-byte alignment of the pointers (the only specialisation left to the data). A hit skips
the argument checks (the key implies they passed; eps is checked each time), the planning
and Triton's launcher; a miss, or a new alignment, goes once through the checked, generic
path.

What the direct launch assumes of Triton's internals (none of it public API):
- ``kernel[grid](...)`` returns the CompiledKernel it ran (or a future of it, ``.result()``);
- a CompiledKernel has ``run``, ``function``, ``packed_metadata`` and ``launch_metadata``,
  and ``run(grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata,
  enter_hook, exit_hook, *args)`` takes every kernel argument, constexprs included, in
  signature order (as JITFunction.run calls it);
- ``run`` is the CUDA launcher object, whose Python ``__call__`` only allocates scratch
  memory (none where ``global_scratch_size`` and ``profile_scratch_size`` are 0) and, in
  3.8, instruments (``gsan_enabled``) before calling its C function ``launch``: with
  (grid, stream, function, launch_cooperative_grid, launch_pdl, global_scratch,
  profile_scratch, packed_metadata, launch_metadata, enter_hook, exit_hook, *args) in 3.6,
  (grid, stream, function, launch_cooperative_grid, launch_pdl, packed_metadata,
  launch_metadata, enter_hook, exit_hook, global_scratch, profile_scratch,
  arg_annotations, kernel_signature, args) in 3.8; kernels with neither are launched by
  that function directly, their pointers as integers (an integer skips the launcher's
  ``data_ptr`` call and its driver query of each pointer; the fast path takes plain CUDA
  tensors only, rmsnorm_api.bypass_ok);
- ``triton.knobs.runtime`` holds the launch hooks; the current stream is torch's
  (``torch._C._cuda_getCurrentRawStream``, which Triton's driver takes with torch loaded).
Where the CUDA extension is built (rmsnorm_api.host), each plan launched directly is also
kept there (``_keep``): its compiled function, grid, warps, shared memory and parameters in
the order Triton's launcher passes them (the signature's non-constexpr arguments, then two
null scratch pointers), and the public functions ask its entry point first, which tests
bypass_ok's conditions, looks the call's key up (this module's key and each input's 16-byte
alignment), allocates the outputs and calls cuLaunchKernel: a hit never enters Python past
the public function. A miss, another device, a launch hook set, or any call bypass_ok
would refuse, returns None to the Python paths here.
Checked against Triton 3.6 and 3.8 (VERIFIED_TRITON). On any other version, or with
RMSNORM_TRITON_FAST_LAUNCH=0, a hit launches through the public ``kernel[grid](...)``
instead: slower on the host, never a crash or a wrong launch. With a launch hook set, a
hit launches through ``run`` with the tensors, as JITFunction.run does.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton

from rmsnorm_api import (
    EPS_MAX,
    EPS_MIN,
    check_fused_inputs,
    check_inputs,
    host,
    scales_shape,
)
from rmsnorm_api import tensor_key as _tensor_key
from triton_impl.kernels import INTERPRET
from triton_impl.launch import Quant, plan

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
#: Triton 3.8's launcher takes the kernel's arguments as one tuple after their annotations
_ARGS_AS_TUPLE = _version(triton.__version__) >= (3, 8)
#: the CUDA extension's eager entry points (rmsnorm_api.host), which keep the plans launched
#: directly and launch them in one call from C++; None: every hit goes through Python
HOST = None if INTERPRET or not DIRECT else host.entry()


class _Plans(dict):
    """The plan cache; clearing it forgets the plans kept in C++ too."""

    def clear(self) -> None:
        super().clear()
        if HOST is not None:
            HOST.triton_forget()


PLANS: dict = _Plans()
_MAX_PLANS = 4096


class _Plan:
    __slots__ = ("kernel", "grid", "ints", "meta", "consts", "direct", "compiled", "aligned",
                 "dense", "last", "weighted")  # fmt: skip

    def __init__(
        self,
        kernel,
        grid: tuple,
        tensors: int,
        ints: tuple,
        meta: dict,
        dense: tuple,
        weighted: bool,
    ) -> None:
        self.kernel, self.grid, self.ints, self.meta = kernel, grid, ints, meta
        # constexprs in signature order, after the runtime arguments: the tensors, the
        # ints, eps; a signature of any other shape is launched generically
        names = list(getattr(kernel, "arg_names", ()))
        self.consts = tuple(meta[a] for a in names if a in meta)
        self.direct = DIRECT and len(names) == tensors + len(ints) + 1 + len(self.consts)
        self.compiled: dict = {}  # (each tensor 16-byte aligned) -> _Direct, or False
        self.aligned = (True,) * tensors  # the usual key of compiled: every pointer aligned
        # whether x (and the residual) are contiguous, as the key's strides say: how the
        # outputs are allocated (_empty)
        self.dense = dense
        # whether the call had a weight (without one, x's pointer stands in for it)
        self.weighted = weighted
        self.last: tuple = (None, ())  # the last eps, and the arguments after the pointers

    def rest_for(self, eps: float) -> tuple:
        """The kernel's arguments after its pointers (ints, eps, constexprs), kept for the
        last eps a call gave (a model calls with one eps); one tuple, so that a call never
        takes another's eps with its own arguments."""
        last = self.last
        if last[0] != eps:
            last = self.last = (eps, (*self.ints, eps, *self.consts))
        return last[1]


class _Direct:
    """A compiled kernel as the direct launch takes it: the kernel, and its launcher's C
    function with what the launcher's ``__call__`` would pass it besides the grid, the
    stream and the arguments (launch None: the launcher allocates or instruments, so it
    is called whole)."""

    __slots__ = ("compiled", "function", "launch", "head", "tail")

    def __init__(self, compiled) -> None:
        launcher = compiled.run  # loads the binary on first use
        self.compiled, self.function = compiled, compiled.function
        lean = (
            getattr(launcher, "global_scratch_size", None) == 0
            and getattr(launcher, "profile_scratch_size", None) == 0
            and not getattr(launcher, "gsan_enabled", False)
        )
        self.launch = getattr(launcher, "launch", None) if lean else None
        flags = (launcher.launch_cooperative_grid, launcher.launch_pdl) if lean else ()
        if _ARGS_AS_TUPLE:
            self.head = (*flags, compiled.packed_metadata, None, None, None, None, None)
            self.tail = (launcher.arg_annotations, launcher.kernel_signature) if lean else ()
        else:
            self.head = (*flags, None, None, compiled.packed_metadata, None, None, None)
            self.tail = ()


def _hook(hook):
    """A launch hook as the launcher should get it: None for an empty hook chain (Triton's
    hooks are chains, never None, so JITFunction.run builds the launch metadata and calls
    both chains on every launch even when nothing is hooked)."""
    calls = getattr(hook, "calls", None)
    return None if calls is not None and not calls else hook


def _run_compiled(
    d: _Direct, grid: tuple, tensors: tuple, ptrs: list, rest: tuple, device: int
) -> None:
    """Launch a compiled kernel: its launcher's C function directly, the pointers as
    integers (see the module docstring); through the launcher whole, with the tensors, as
    JITFunction.run does, where a launch hook is set or the launcher has more to do.
    Empty hook chains are passed as no hook."""
    stream = _cuda_stream(device)
    knobs = triton.knobs.runtime
    enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
    # no hook: None, or an empty chain (as _hook says), tested inline (this runs every call)
    e_calls, l_calls = getattr(enter, "calls", None), getattr(leave, "calls", None)
    quiet = (enter is None or (e_calls is not None and not e_calls)) and (
        leave is None or (l_calls is not None and not l_calls)
    )
    if d.launch is not None and quiet:
        if _ARGS_AS_TUPLE:
            d.launch(grid[0], 1, 1, stream, d.function, *d.head, *d.tail, (*ptrs, *rest))
        else:
            d.launch(grid[0], 1, 1, stream, d.function, *d.head, *ptrs, *rest)
        return
    enter, leave = _hook(enter), _hook(leave)
    values = (*tensors, *rest)
    md = d.compiled.launch_metadata(grid, stream, *values) if enter is not None else None
    d.compiled.run(grid[0], 1, 1, stream, d.function, d.compiled.packed_metadata, md,
                   enter, leave, *values)  # fmt: skip


def _current_stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


#: device -> its current stream (a raw pointer): torch's raw getter itself where this torch
#: has it (one call fewer a launch), else the public one
_cuda_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream)


def _launchable(compiled) -> bool:
    """Whether a compiled kernel has what _Direct and _run_compiled use."""
    names = ("run", "function", "packed_metadata", "launch_metadata")
    return all(hasattr(compiled, a) for a in names)


def _cacheable(launch, tensors: tuple) -> bool:
    """Whether a planned launch may be cached for its key: it uses the tensors in place (no
    copy made for it) and has no workspace of its own."""
    pairs = zip(launch.args[: len(tensors)], tensors, strict=True)
    return launch.reusable and all(a.data_ptr() == t.data_ptr() for a, t in pairs)


def _remember(key: tuple, p):
    """Cache plan p under key (a forward's _Plan or a quantised op's _QuantPlan) and return
    it; past _MAX_PLANS (many shapes, e.g. a varying batch) the cache starts over."""
    if len(PLANS) >= _MAX_PLANS:
        PLANS.clear()
    PLANS[key] = p
    return p


def _planned_launch(key: tuple, tensors: tuple, eps: float, dense: tuple, launch) -> None:
    """A miss: launch what launch.plan planned, and cache its plan under key when the
    launch uses the tensors in place (no copy made for it) and has no workspace of its own;
    tensors the kernel's pointer arguments in signature order (a dummy in place of an
    absent weight), dense as _Plan's."""
    k = len(tensors)
    if not _cacheable(launch, tensors):
        launch.kernel[launch.grid](*launch.args, **launch.meta)
        return
    p = _remember(
        key, _Plan(launch.kernel, launch.grid, k, tuple(launch.args[k:-1]), launch.meta, dense,
                   key[1] is not None)
    )  # fmt: skip
    _cached_launch(p, tensors, eps, key[0][4])


def _cached_launch(p: _Plan, tensors: tuple, eps: float, device: int) -> None:
    """Launch a cached plan on these tensors (as _planned_launch's) on x's device: its
    compiled kernel for the pointers' alignment, directly; the first time an alignment
    comes, through Triton's launcher, which compiles it (or finds it in its caches)."""
    ptrs = [t.data_ptr() for t in tensors]
    low = 0
    for a in ptrs:
        low |= a
    align = p.aligned if not low & 15 else tuple(a % 16 == 0 for a in ptrs)
    d = p.compiled.get(align)
    if not d:
        compiled = p.kernel[p.grid](*tensors, *p.ints, eps, **p.meta)
        if align not in p.compiled:
            compiled = compiled.result() if hasattr(compiled, "result") else compiled
            ok = p.direct and _launchable(compiled)
            d = p.compiled[align] = _Direct(compiled) if ok else False
            # the C++ keys know no weight offset: only plans without one are kept there
            if d and HOST is not None and not p.meta["W_OFFSET"] and not p.meta.get("W_HEADS"):
                _keep(p, d, tensors, align)
        return
    _run_compiled(d, p.grid, tensors, ptrs, p.rest_for(eps), device)


#: The C++ launch's argument codes (fast_entry.cpp's Arg): a tensor's pointer, an int of
#: Triton's signature type, eps
_POINTER, _EPS = 0, 3
_INTS = {"i32": 1, "i64": 2}


def _keep(p: _Plan, d: _Direct, tensors: tuple, align: tuple) -> None:
    """Hand a plan's direct launch to the C++ entry point (fast_entry.cpp), which launches
    it on the next hit of the same key without entering Python: the compiled function, its
    grid, warps and shared memory, and its parameters (the signature's non-constexpr
    arguments, Triton's launcher's order). Kept only where that launch is all Triton's
    launcher would do: lean (no scratch, no instrumentation), one CTA a program, no PDL or
    cooperative launch, the outputs aligned as the C++ side allocates them (new tensors),
    every argument of a type it passes."""
    md = getattr(d.compiled, "metadata", None)
    signature = getattr(getattr(d.compiled, "src", None), "signature", None)
    outs = 1 if len(tensors) == 3 else 2
    if (
        d.launch is None
        or md is None
        or not isinstance(signature, dict)
        or getattr(md, "num_ctas", 1) != 1
        or getattr(md, "launch_pdl", False)
        or getattr(md, "launch_cooperative_grid", False)
        or not all(align[-outs:])
        or len(p.grid) != 1
    ):
        return
    k, ints = len(tensors), p.ints
    args = []
    for i, ty in enumerate(signature.values()):
        if ty == "constexpr":
            continue
        if i < k and isinstance(ty, str) and ty.startswith("*"):
            args.append((_POINTER, i))
        elif k <= i < k + len(ints) and ty in _INTS:
            args.append((_INTS[ty], int(ints[i - k])))
        elif i == k + len(ints) and ty == "fp32":
            args.append((_EPS, 0))
        else:
            return
    x, w = tensors[0], tensors[-outs - 1]
    residual = tensors[1] if outs == 2 else None
    weight = w if p.weighted else None
    HOST.triton_keep(x, residual, weight, d.function, p.grid[0], md.num_warps, md.shared, args)


def _empty(like: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of x's shape and device in like's dtype (like: x, or the
    residual, whose shape and device the checks, or the plan key that implies they passed,
    made x's): empty_like(like) where like is contiguous, which parses fewer arguments than
    torch.empty on every call."""
    if like.is_contiguous():
        return torch.empty_like(like)
    return torch.empty(x.shape, dtype=like.dtype, device=x.device)


def eager_forward(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    eps,
    impl: str,
    weight_offset=0.0,
):
    """rms_norm (residual None: y) or the functional fused add ((y, residual_out)) for real
    CUDA tensors outside tracing (bypass_ok of every tensor), through the plan cache. The
    weight offset is a constant of the kernel's compile, so a part of the key."""
    key = (_tensor_key(x), _tensor_key(weight), _tensor_key(residual), weight_offset)
    p = PLANS.get(key)
    w = x if weight is None else weight  # a dummy pointer when there is no weight
    hit = p is not None and type(eps) is float and type(weight_offset) is float
    if hit and EPS_MIN <= eps <= EPS_MAX:
        # a hit: the key implies the checks passed and that x has elements, and its
        # strides whether x and the residual are contiguous (p.dense)
        y = torch.empty_like(x) if p.dense[0] else _empty(x, x)
        if residual is None:
            _cached_launch(p, (x, w, y), eps, key[0][4])
            return y
        r = torch.empty_like(residual) if p.dense[1] else _empty(residual, x)
        _cached_launch(p, (x, residual, w, y, r), eps, key[0][4])
        return y, r
    if residual is None:
        check_inputs(x, weight, eps, weight_offset, allow_cpu=INTERPRET, impl=impl)
    else:
        check_fused_inputs(x, residual, weight, eps, weight_offset, allow_cpu=INTERPRET, impl=impl)
    eps = float(eps)
    y = _empty(x, x)
    if residual is None:
        op, ins, outs = "rms_norm", (x,), (y,)
    else:
        op, ins, outs = "fused_add_rms_norm", (x, residual), (y, _empty(residual, x))
    if x.numel() > 0:
        tensors = (*ins, w, *outs)
        dense = tuple(t.is_contiguous() for t in ins)
        if p is not None:  # a cached plan, eps not a float of its range: checked above
            _cached_launch(p, tensors, eps, key[0][4])
        else:
            launch = plan(op, ins, weight, eps, outs, weight_offset=float(weight_offset))
            _planned_launch(key, tensors, eps, dense, launch)
    return y if residual is None else outs


#: the quantised kernels' arguments that are the call's tensors, not the plan's constants
_QUANT_TENSORS = ("q_in", "q_out")
#: an argument neither in the plan's constants nor the call's tensors (a signature this
#: module does not know: the plan launches through Triton's launcher)
_UNKNOWN = object()


class _QuantPlan:
    """A cached launch of a quantised op (eager_quant): as _Plan's, but two of the
    arguments after the constexprs of the norm are the call's own tensors, the scale or
    its bound read (q_in, None where there is neither) and the scales written (q_out):
    each launch puts them in their places of the argument tail."""

    __slots__ = ("kernel", "grid", "ints", "meta", "tail", "at", "direct", "compiled")

    def __init__(self, kernel, grid: tuple, tensors: int, ints: tuple, meta: dict) -> None:
        self.kernel, self.grid, self.ints = kernel, grid, ints
        self.meta = {k: v for k, v in meta.items() if k not in _QUANT_TENSORS}
        names = list(getattr(kernel, "arg_names", ()))
        after = names[tensors + len(ints) + 1 :]  # past the pointers, the ints and eps
        self.tail = [None if a in _QUANT_TENSORS else meta.get(a, _UNKNOWN) for a in after]
        self.at = tuple(after.index(a) for a in _QUANT_TENSORS if a in after)
        self.direct = DIRECT and len(self.at) == len(_QUANT_TENSORS) and _UNKNOWN not in self.tail
        self.compiled: dict = {}  # (each pointer 16-byte aligned) -> _Direct, or False

    def launch(self, tensors: tuple, q_in, q_out: torch.Tensor, eps: float, device: int):
        """Launch on these tensors: directly where this alignment's kernel is compiled
        and launchable, else through Triton's launcher (which compiles it once)."""
        ptrs = [t.data_ptr() for t in tensors]
        q_ptrs = (None if q_in is None else q_in.data_ptr(), q_out.data_ptr())
        align = tuple(a % 16 == 0 for a in ptrs) + tuple(a is None or a % 16 == 0 for a in q_ptrs)
        d = self.compiled.get(align)
        if not d:
            compiled = self.kernel[self.grid](*tensors, *self.ints, eps, q_in=q_in, q_out=q_out,
                                              **self.meta)  # fmt: skip
            if align not in self.compiled:
                compiled = compiled.result() if hasattr(compiled, "result") else compiled
                ok = self.direct and _launchable(compiled)
                self.compiled[align] = _Direct(compiled) if ok else False
            return
        tail = list(self.tail)
        for i, q in zip(self.at, q_ptrs, strict=True):
            tail[i] = q
        _run_compiled(d, self.grid, tensors, ptrs, (*self.ints, eps, *tail), device)


def eager_quant(key: tuple, op: str, x, residual, weight, eps: float, scale, group_size: int,
                scale_ub, out_dtype: torch.dtype, weight_offset: float) -> tuple:  # fmt: skip
    """A functional quantised op (rms_norm_quant, fused_add_rms_norm_quant) for real CUDA
    tensors outside tracing, whose arguments rmsnorm_api.quant checked under ``key`` (the
    plan cache's key too): its outputs allocated (as empty_outputs') and written through a
    cached plan; the scales returned as the op returns them."""
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    shape = scales_shape(x.shape, scale, group_size)
    scales = torch.empty(shape, dtype=torch.float32, device=x.device)
    if residual is None:
        ins, outs = (x,), (y,)
    else:
        ins, outs = (x, residual), (y, _empty(residual, x))
    if x.numel() == 0:
        return (*outs, scales)
    q_in = scale if scale is not None else scale_ub
    tensors = (*ins, x if weight is None else weight, *outs)
    p = PLANS.get(key)
    if p is None:
        name = "rms_norm" if residual is None else "fused_add_rms_norm"
        quant = Quant(scale, group_size, scale_ub, scales)
        launch = plan(name, ins, weight, eps, outs, weight_offset=weight_offset, quant=quant)
        if not _cacheable(launch, tensors):
            launch.kernel[launch.grid](*launch.args, **launch.meta)
            return (*outs, scales)
        k = len(tensors)
        ints = tuple(launch.args[k:-1])
        p = _remember(key, _QuantPlan(launch.kernel, launch.grid, k, ints, launch.meta))
    p.launch(tensors, q_in, scales, eps, x.get_device())
    return (*outs, scales)
