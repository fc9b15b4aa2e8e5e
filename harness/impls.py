"""The registry of RMSNorm implementations: one calling convention for all of them.

Each Impl computes rms_norm(x, weight, eps) -> y (harness.ops.RMS_NORM describes the op
and points here). ``ours`` marks the kernels under study
(they also have an out= form, which validation poisons with NaN before each run).
Without a GPU only the Triton kernel runs, under TRITON_INTERPRET=1, set here before
Triton is first imported.

``registry()`` holds our kernels (what tests and ``harness.validate`` run);
``registry(baselines=True)`` adds what the benchmark compares them with, CUDA only:

- ``eager``: harness.reference.rms_norm_ref itself, run as plain PyTorch ops (fp32 on
  upcast x, one cast at the end): several kernels and fp32 temporaries, the cost of not
  fusing. The baseline and the definition of correct are one function.
- ``compile``: ``torch.compile(rms_norm_ref, dynamic=False, fullgraph=True)``. Its
  ``prepare`` resets dynamo and compiles afresh for each shape (so the recompile limit can
  never make it fall back to eager), and returns the compile time to record apart from
  the timing.
  Proof that it compiled: fullgraph=True raises instead of breaking the graph, and the
  profiled kernels are Inductor's generated ``triton_*`` kernels.
- ``native``: ``torch.nn.functional.rms_norm``; the profiled kernels tell whether it took
  a fused kernel or the composite path.
- ``liger``: Liger-Kernel's ``LigerRMSNormFunction`` with ``casting_mode="gemma"``: x and
  weight upcast to fp32, one cast at the end, which is our precision policy. ("llama"
  rounds x * rstd to x's dtype before the weight multiply, a second rounding; "none"
  computes in x's dtype.) Liger refuses rows wider than 65536; that shows as a failure.
- ``quack``: QuACK's ``rmsnorm_fwd`` (CuTe DSL, compiled per N and dtype); it may fail to
  compile for odd N in 16-bit dtypes, which shows as a failure for that shape.

The optional packages may be installed outside site-packages (e.g. ``pip install
--target DIR``): list such directories in RMSNORM_SITE_DIRS (os.pathsep-separated) and
they are added with ``site.addsitedir``, which also processes their .pth files.
"""

from __future__ import annotations

import os
import site
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.reference import rms_norm_ref

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

for _dir in os.environ.get("RMSNORM_SITE_DIRS", "").split(os.pathsep):
    if _dir:
        site.addsitedir(_dir)

#: Names in the order the benchmark runs and plots them: ours first, then the baselines.
OURS = ("triton", "cuda")
BASELINES = ("eager", "compile", "native", "liger", "quack")

Fn = Callable[..., torch.Tensor]


@dataclass
class Impl:
    name: str
    fn: Fn  # (x, weight, eps) -> y
    ours: bool = False  # a kernel under study: also callable as fn(x, weight, eps, out=y)
    cpu: bool = False  # runs on CPU tensors (the Triton interpreter)
    unavailable: Optional[str] = None  # why it cannot run here, or None
    notes: list[str] = field(default_factory=list)
    # per-shape setup before validation: (x, weight, eps) -> (callable to check and time,
    # compile seconds or None); None means fn itself is used as is
    prepare: Optional[Callable[..., tuple[Fn, Optional[float]]]] = None
    # (x, weight): the op's tensors, its inputs less eps -> what the kernel it launches
    # uses: config, registers, spills (ours only)
    resources: Optional[Callable[..., dict]] = None
    # ours, for ops with an in-place form (the fused add): fn_(*inputs) writing its inputs
    in_place: Optional[Callable[..., None]] = None


def _triton() -> Impl:
    try:
        import triton_impl
    except ImportError as e:  # pragma: no cover - triton is a hard dependency
        return Impl("triton", None, ours=True, unavailable=f"import failed: {e}")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    return Impl(
        "triton", triton_impl.rms_norm, ours=True, cpu=interp, resources=triton_impl.kernel_info
    )


def _cuda() -> Impl:
    try:
        import cuda_impl
    except ImportError as e:
        return Impl("cuda", None, ours=True, unavailable=str(e))
    return Impl("cuda", cuda_impl.rms_norm, ours=True, resources=cuda_impl.ops.kernel_info)


def native_rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6
) -> torch.Tensor:
    """torch.nn.functional.rms_norm over the last dimension."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def compile_fresh(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> tuple[Fn, float]:
    """Reset dynamo, compile the eager baseline (the reference) for exactly these inputs,
    run it once.

    Returns the compiled callable and the seconds its first call took (trace, Inductor
    codegen, Triton compile and one run), which is kept out of the timing.
    """
    torch._dynamo.reset()
    compiled = torch.compile(rms_norm_ref, dynamic=False, fullgraph=True)
    if x.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    compiled(x, weight, eps)
    if x.is_cuda:
        torch.cuda.synchronize()
    return compiled, time.perf_counter() - t0


class _LazyCompiled:
    """``compile``'s fn outside the benchmark: compiles afresh whenever the inputs' shape,
    strides, dtypes or eps change (the benchmark calls ``prepare`` instead and times the
    compiled callable itself, without this check)."""

    def __init__(self) -> None:
        self._key: Optional[tuple] = None
        self._fn: Optional[Fn] = None

    def __call__(self, x, weight=None, eps=1e-6):
        key = (
            tuple(x.shape),
            x.stride(),
            x.dtype,
            x.device,
            eps,
            None if weight is None else (weight.dtype, tuple(weight.shape)),
        )
        if key != self._key:
            self._fn, _ = compile_fresh(x, weight, eps)
            self._key = key
        return self._fn(x, weight, eps)


def _eager() -> Impl:
    return Impl("eager", rms_norm_ref, notes=["fp32 temporaries: several kernels"])


def _compile() -> Impl:
    return Impl(
        "compile",
        _LazyCompiled(),
        prepare=compile_fresh,
        notes=["torch.compile(eager, dynamic=False, fullgraph=True), reset per shape"],
    )


def _native() -> Impl:
    return Impl("native", native_rms_norm, notes=["torch.nn.functional.rms_norm"])


def _liger() -> Impl:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as e:  # ImportError, or a broken install failing at import
        return Impl("liger", None, unavailable=f"liger-kernel not importable ({e})")

    def liger_rms_norm(x, weight=None, eps=1e-6):
        if weight is None:  # Liger's kernel always reads a weight
            weight = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        # (X, W, eps, offset, casting_mode, in_place): gemma = fp32 math, one final cast
        return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "gemma", True)

    return Impl(
        "liger",
        liger_rms_norm,
        notes=[
            "casting_mode='gemma' (fp32 x and weight, one cast); refuses N > 65536",
            "also writes one fp32 rstd per row (not counted in the bytes model)",
        ],
    )


def _quack() -> Impl:
    try:
        from quack.rmsnorm import rmsnorm_fwd
    except Exception as e:
        return Impl("quack", None, unavailable=f"quack not importable ({e})")

    def quack_rms_norm(x, weight=None, eps=1e-6):
        rows = x.reshape(-1, x.shape[-1])  # rmsnorm_fwd takes 2-D (M, N)
        out = rmsnorm_fwd(rows, weight, eps=eps)
        if isinstance(out, tuple):  # newer versions return (out, residual_out, rstd)
            out = out[0]
        return out.view(x.shape)

    return Impl(
        "quack",
        quack_rms_norm,
        notes=["compiled per (N, dtype) on first call; may fail for odd N in 16-bit"],
    )


#: The fused residual add's kernels under study (its CUDA kernel and baselines come next).
FUSED_ADD_OURS = ("triton",)


def fused_add_registry(baselines: bool = False) -> dict[str, Impl]:
    """The fused add's implementations: fn(x, residual, weight, eps) -> (y, residual_out),
    and for ours the in-place fn_(x, residual, weight, eps). No baselines yet."""
    try:
        import triton_impl
    except ImportError as e:  # pragma: no cover - triton is a hard dependency
        return {"triton": Impl("triton", None, ours=True, unavailable=f"import failed: {e}")}
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    triton = Impl(
        "triton",
        triton_impl.fused_add_rms_norm,
        ours=True,
        cpu=interp,
        in_place=triton_impl.fused_add_rms_norm_,
    )
    return {"triton": triton}


def registry(baselines: bool = False) -> dict[str, Impl]:
    """All implementations, available or not, keyed by name.

    Our kernels only by default; ``baselines=True`` adds eager, compile, native, liger and
    quack (the benchmark's comparison; CUDA only).
    """
    impls = [_triton(), _cuda()]
    if baselines:
        impls += [_eager(), _compile(), _native(), _liger(), _quack()]
    return {i.name: i for i in impls}


def runnable(impl: Impl, device: str) -> Optional[str]:
    """None if impl can run on device, else the reason it is skipped."""
    if impl.unavailable:
        return impl.unavailable
    if device == "cpu" and not impl.cpu:
        return "needs a CUDA GPU"
    return None
