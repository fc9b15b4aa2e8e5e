"""The registries of implementations: one calling convention an op, for all of them.

``registry()`` holds rms_norm's (harness.ops.RMS_NORM): fn(x, weight, eps) -> y;
``fused_add_registry()`` the fused residual add's (harness.ops.FUSED_ADD_RMS_NORM):
fn(x, residual, weight, eps) -> (y, residual_out). ``ours`` marks the kernels under study;
they also have a second form (rms_norm: out=, which validation poisons with NaN before
each run; the fused add: in place, ``in_place(x, residual, weight, eps)``). Without a GPU
only the Triton kernels run, under TRITON_INTERPRET=1, set here before Triton is first
imported.

By default a registry holds our kernels (what tests and ``harness.validate`` run);
``baselines=True`` adds what the benchmark compares them with, CUDA only. The same seven
names for both ops:

- ``eager``: the op's reference itself (harness.reference.rms_norm_ref,
  fused_add_rms_norm_ref), run as plain PyTorch ops (fp32 on upcast inputs, one cast at
  the end): several kernels and fp32 temporaries, the cost of not fusing. The baseline and
  the definition of correct are one function.
- ``compile``: ``torch.compile(reference, dynamic=False, fullgraph=True)``. Its
  ``prepare`` resets dynamo and compiles afresh for each shape (so the recompile limit can
  never make it fall back to eager), and returns the compile time to record apart from
  the timing.
  Proof that it compiled: fullgraph=True raises instead of breaking the graph, and the
  profiled kernels are Inductor's generated ``triton_*`` kernels.
- ``native``: ``torch.nn.functional.rms_norm`` (the fused add: ``x + residual``, then
  it); the profiled kernels tell whether the norm took a fused kernel or the composite
  path.
- ``liger``: Liger-Kernel with ``casting_mode="gemma"``: inputs and weight upcast to fp32,
  one cast at the end, which is our precision policy. ("llama" rounds x * rstd to x's
  dtype before the weight multiply, a second rounding; "none" computes in x's dtype.)
  rms_norm: ``LigerRMSNormFunction``; the fused add: ``LigerFusedAddRMSNormFunction``,
  whose forward writes fresh outputs (its ``in_place`` flag is about the backward's dY),
  residual_out in x's dtype, so an fp32 residual is refused. Liger refuses rows wider
  than 65536; that shows as a failure.
- ``quack``: QuACK's ``rmsnorm_fwd`` (CuTe DSL, compiled per N and dtypes; the fused add
  through its ``residual=`` argument); it may fail to compile for odd N in 16-bit dtypes,
  which shows as a failure for that shape.
- ``flashinfer``: FlashInfer's ``flashinfer.norm.rmsnorm`` / ``fused_add_rmsnorm`` on its
  default path, which on sm_90 is its CuTe DSL kernel (compiled per N and dtype on first
  call); unavailable, saying why, where that path is not the default (nvidia-cutlass-dsl
  does not import, or FLASHINFER_USE_CUDA_NORM=1), and a call whose dispatch chose the
  CUDA kernel on its device is refused, so the row never times the other path.
- ``flashinfer_cuda``: the same functions on FlashInfer's CUDA path (include/flashinfer/
  norm.cuh, built by its JIT with nvcc and ninja at the first call, cached under
  ~/.cache/flashinfer). FlashInfer's switch, FLASHINFER_USE_CUDA_NORM=1, is read once when
  flashinfer.norm is imported, into ``flashinfer.norm._USE_CUDA_NORM``, which its dispatch
  reads at every call: that flag is set for each call alone and restored after it.
  Both: weight (ones where none), and the fused add's residual, in x's dtype only (the
  CUDA kernel reads every tensor as x's type); x as 2-D rows; PDL on, their default on
  sm_90. The fused add works in place (x becomes y, the residual residual_out): ``fn``
  runs it on copies of x and the residual, leaving the caller's as they were (what
  validation and tests call); the bench's ``prepare`` makes those copies once a shape,
  outside the timing, and times the in-place call on them (the callable bound to those
  inputs, as the backward alone's is), so the timed call reads x, residual and weight and
  writes two rows, the op's bytes and no copy. Its values drift over the repeats (the sum
  grows each call); the first call, the one checked, is on the inputs' own values, and a
  memory-bound kernel's time does not depend on the values. The kernels profiled (the
  bench's kernel table) name the path that ran: the DSL's ``kernel_cutlass_*`` or the
  CUDA ``flashinfer::norm::*RMSNormKernel``.

The gradient ops (harness.ops: rms_norm_fwd_bwd, rms_norm_bwd, fused_add_rms_norm_fwd_bwd)
have registries of the same nine names (``rms_norm_fwd_bwd_registry``,
``rms_norm_bwd_registry``, ``fused_add_fwd_bwd_registry``; the two FlashInfer ones
unavailable, its norms having no backward): each implementation's forward,
called on leaves of x, weight (and residual) that require grad, then
``torch.autograd.grad`` of its outputs for the op's output gradients. Forward + backward
is one call (``forward_backward``); the backward alone runs the forward once per shape in
``prepare`` (outside the timing, graph kept) and times ``torch.autograd.grad(...,
retain_graph=True)`` (``bind_backward``). The forwards: ours, the public
triton_impl / cuda_impl functions; eager, the reference's forward with PyTorch's autograd
of its ops; compile, ``torch.compile`` of that forward (fresh per shape, AOTAutograd's
backward compiled on its first call, both kept out of the timing); native, F.rms_norm;
liger, LigerRMSNormFunction / LigerFusedAddRMSNormFunction in gemma mode with
``in_place=False`` (True writes dX over dY, the gradient every implementation is checked
and timed on); quack, ``quack.rmsnorm.rmsnorm`` (its autograd Function, the forward saving
rstd; the fused add through ``residual=`` and ``prenorm=True``).

The optional packages may be installed outside site-packages (e.g. ``pip install
--target DIR``): list such directories in RMSNORM_SITE_DIRS (os.pathsep-separated) and
they are added with ``site.addsitedir``, which also processes their .pth files.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import site
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch._functorch.config  # _retainable's patch; torch does not import it by itself

from harness.reference import (
    fused_add_rms_norm_ref,
    fused_add_rms_norm_ref_of_fp32_sum,
    rms_norm_ref,
)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

for _dir in os.environ.get("RMSNORM_SITE_DIRS", "").split(os.pathsep):
    if _dir:
        site.addsitedir(_dir)

#: Names in the order the benchmark runs and plots them: ours first, then the baselines;
#: every op's (harness.ops.Op), so --impls means the same for all.
OURS = ("triton", "cuda")
BASELINES = ("eager", "compile", "native", "liger", "quack", "flashinfer", "flashinfer_cuda")

Fn = Callable[..., object]


@dataclass
class Impl:
    name: str
    fn: Fn  # the op's inputs -> its output(s): (x, weight, eps) -> y for rms_norm
    ours: bool = False  # a kernel under study: also has the op's second form (out=, in place)
    cpu: bool = False  # runs on CPU tensors (the Triton interpreter)
    unavailable: Optional[str] = None  # why it cannot run here, or None
    notes: list[str] = field(default_factory=list)
    # per-shape setup before validation: (*inputs) -> (callable to check and time,
    # compile seconds or None); None means fn itself is used as is
    prepare: Optional[Callable[..., tuple[Fn, Optional[float]]]] = None
    # the op's tensors, its inputs less eps -> what the kernel it launches uses: config,
    # registers, spills (ours only)
    resources: Optional[Callable[..., dict]] = None
    # ours, for ops with an in-place form (the fused add): fn_(*inputs) writing its inputs
    in_place: Optional[Callable[..., None]] = None
    # gradient ops: the forward whose autograd fn runs (its op's forward signature)
    forward: Optional[Fn] = None
    # a peer that documents another rounding than the op's reference: its own definition
    # of correct, (*inputs) -> the reference's outputs, checked within the same tolerance
    reference: Optional[Fn] = None
    # a quantised form's peer whose y or sum passes through x's dtype before the rounding
    # to fp8 where the reference's does not (or the other way): its fp8 ties and scales
    # judged within that dtype's TOL, not the fp32 one
    rounds_in_dtype: bool = False


#: Our kernels' packages, by implementation name.
_PACKAGES = {"triton": "triton_impl", "cuda": "cuda_impl"}


def not_importable(package: str, e: BaseException) -> str:
    """Why a package cannot run: its import's error, type and first line."""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{package} not importable ({type(e).__name__}: {first})"


def _ours(name: str, fn: str, in_place: Optional[str] = None, info: str = "kernel_info") -> Impl:
    """One of our kernels: the function ``fn`` of its package (triton_impl, cuda_impl), its
    in-place form ``in_place`` where the op has one, and its kernel_info ``info`` (looked up
    in the package, then in its ``ops`` module; resources stay None where neither has it).
    Unavailable, with the reason, where the package does not import or lacks the op.
    cuda_impl may also fail with other errors at import: a built library older than its
    Python side (an op's fake registered for a schema the library lacks) is a stale
    build, reported as such, not a crash of every registry."""
    package = _PACKAGES[name]
    failures = Exception if name == "cuda" else ImportError
    try:
        mod = importlib.import_module(package)
    except failures as e:
        return Impl(name, None, ours=True, unavailable=not_importable(package, e))
    missing = [f for f in (fn, in_place) if f is not None and not hasattr(mod, f)]
    if missing:
        why = f"{package} has no {', '.join(missing)}"
        return Impl(name, None, ours=True, unavailable=why)
    resources = getattr(mod, info, None) or getattr(getattr(mod, "ops", None), info, None)
    return Impl(
        name,
        getattr(mod, fn),
        ours=True,
        # the Triton kernels run on CPU tensors exactly when the interpreter is on
        cpu=name == "triton" and os.environ.get("TRITON_INTERPRET") == "1",
        resources=resources,
        in_place=getattr(mod, in_place) if in_place else None,
    )


def native_rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6
) -> torch.Tensor:
    """torch.nn.functional.rms_norm over the last dimension."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def native_fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a PyTorch user writes: ``residual = x + residual``, then F.rms_norm of it.

    The add runs in fp32 and rounds once to the promoted dtype, which is residual's (it is
    x's dtype or fp32). With an fp32 residual the norm runs in fp32 and y is cast to x's
    dtype after it, one rounding as the reference; a 16-bit weight is upcast for it (exact)
    because F.rms_norm takes its fused kernel only when input and weight dtypes match."""
    residual_out = torch.add(x, residual)
    if residual_out.dtype != residual.dtype:  # x is wider than the residual: not this op
        raise ValueError(
            f"native: residual is {residual.dtype} but x is {x.dtype}; expected residual in "
            "x's dtype or float32"
        )
    if weight is not None and weight.element_size() < residual_out.element_size():
        weight = weight.to(residual_out.dtype)
    y = torch.nn.functional.rms_norm(residual_out, (x.shape[-1],), weight, eps)
    return y.to(x.dtype), residual_out


def _input_key(inputs: tuple) -> tuple:
    """What a compiled callable is specialised on: each tensor's shape, strides, dtype and
    device; each other argument's value (eps, or None for a missing weight)."""
    return tuple(
        (tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
        for a in inputs
    )


def compile_fresh(ref: Callable[..., object], *inputs) -> tuple[Fn, float]:
    """Reset dynamo, compile ``ref`` (an op's eager baseline: its reference) for exactly
    these inputs, run it once.

    Returns the compiled callable and the seconds its first call took (trace, Inductor
    codegen, Triton compile and one run), which is kept out of the timing.
    """
    torch._dynamo.reset()
    compiled = torch.compile(ref, dynamic=False, fullgraph=True)
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in inputs)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    compiled(*inputs)
    if cuda:
        torch.cuda.synchronize()
    return compiled, time.perf_counter() - t0


class _LazyCompiled:
    """``compile``'s fn outside the benchmark: compiles ``ref`` afresh whenever the inputs'
    shapes, strides, dtypes, devices or eps change (the benchmark calls ``prepare``
    instead and times the compiled callable itself, without this check)."""

    def __init__(self, ref: Callable[..., object]) -> None:
        self._ref = ref
        self._key: Optional[tuple] = None
        self._fn: Optional[Fn] = None

    def __call__(self, *inputs):
        key = _input_key(inputs)
        if key != self._key:
            self._fn, _ = compile_fresh(self._ref, *inputs)
            self._key = key
        return self._fn(*inputs)


def _eager(ref: Callable[..., object]) -> Impl:
    return Impl("eager", ref, notes=["fp32 temporaries: several kernels"])


def _compile(ref: Callable[..., object]) -> Impl:
    return Impl(
        "compile",
        _LazyCompiled(ref),
        prepare=functools.partial(compile_fresh, ref),
        notes=["torch.compile(eager, dynamic=False, fullgraph=True), reset per shape"],
    )


def _native() -> Impl:
    return Impl("native", native_rms_norm, notes=["torch.nn.functional.rms_norm"])


def _native_fused_add() -> Impl:
    return Impl(
        "native",
        native_fused_add_rms_norm,
        notes=["x + residual, then torch.nn.functional.rms_norm: two launches at least"],
    )


def _ones_if_none(weight: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Liger's kernels always read a weight: ones in x's dtype stand in for none."""
    if weight is not None:
        return weight
    return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)


def _liger(in_place: bool = True, notes: Optional[list] = None, offset: float = 0.0) -> Impl:
    """Liger's RMSNorm; in_place=False for the gradient ops (True writes dX over dY, the
    output gradient every implementation is checked and timed on); offset: its weight
    offset (added in fp32 under casting_mode='gemma')."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as e:  # ImportError, or a broken install failing at import
        return Impl("liger", None, unavailable=f"liger-kernel not importable ({e})")

    def liger_rms_norm(x, weight=None, eps=1e-6):
        # (X, W, eps, offset, casting_mode, in_place): gemma = fp32 math, one final cast
        w = _ones_if_none(weight, x)
        return LigerRMSNormFunction.apply(x, w, eps, offset, "gemma", in_place)

    return Impl(
        "liger",
        liger_rms_norm,
        notes=notes
        or [
            "casting_mode='gemma' (fp32 x and weight, one cast); refuses N > 65536",
            "also writes one fp32 rstd per row (not counted in the bytes model)",
        ],
    )


def _liger_fused_add(offset: float = 0.0) -> Impl:
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except Exception as e:
        return Impl("liger", None, unavailable=f"liger-kernel not importable ({e})")

    def liger_fused_add_rms_norm(x, residual, weight=None, eps=1e-6):
        # its residual_out has x's dtype: an fp32 residual would come back rounded to it
        if residual.dtype != x.dtype:
            raise ValueError(
                f"liger: residual is {residual.dtype} but x is {x.dtype}; "
                "LigerFusedAddRMSNormFunction writes residual_out in x's dtype, so it takes "
                "residual only in x's dtype"
            )
        # (X, R, W, eps, offset, casting_mode, in_place): the forward allocates y and
        # residual_out and leaves X and R as they are; in_place only concerns the backward
        return LigerFusedAddRMSNormFunction.apply(
            x, residual, _ones_if_none(weight, x), eps, offset, "gemma", False
        )

    return Impl(
        "liger",
        liger_fused_add_rms_norm,
        notes=[
            "casting_mode='gemma' (fp32 math on the stored sum, one cast); residual in x's "
            "dtype only; refuses N > 65536",
            "also writes one fp32 rstd per row (not counted in the bytes model)",
        ],
    )


def _quack_fwd() -> tuple[Optional[Callable], Optional[str]]:
    """QuACK's rmsnorm_fwd, or None and why it is not importable."""
    try:
        from quack.rmsnorm import rmsnorm_fwd
    except Exception as e:
        return None, f"quack not importable ({e})"
    return rmsnorm_fwd, None


def _quack_offset(offset: float) -> dict:
    """QuACK's weight_offset argument (a constant of its compile), passed only where one is
    asked for: versions without it still run the plain ops."""
    return {"weight_offset": offset} if offset else {}


def _quack(offset: float = 0.0) -> Impl:
    rmsnorm_fwd, why = _quack_fwd()
    if why:
        return Impl("quack", None, unavailable=why)

    def quack_rms_norm(x, weight=None, eps=1e-6):
        rows = x.reshape(-1, x.shape[-1])  # rmsnorm_fwd takes 2-D (M, N)
        out = rmsnorm_fwd(rows, weight, eps=eps, **_quack_offset(offset))
        if isinstance(out, tuple):  # newer versions return (out, residual_out, rstd)
            out = out[0]
        return out.view(x.shape)

    return Impl(
        "quack",
        quack_rms_norm,
        notes=["compiled per (N, dtype) on first call; may fail for odd N in 16-bit"],
    )


def _quack_fused_add(offset: float = 0.0) -> Impl:
    rmsnorm_fwd, why = _quack_fwd()
    if why:
        return Impl("quack", None, unavailable=why)

    def quack_fused_add_rms_norm(x, residual, weight=None, eps=1e-6):
        n = x.shape[-1]
        # 2-D (M, N) rows; with residual= it writes residual_out in residual's dtype (its
        # residual_dtype default) and y in x's, and returns (y, residual_out, rstd or None)
        out = rmsnorm_fwd(x.reshape(-1, n), weight, residual=residual.reshape(-1, n), eps=eps,
                          **_quack_offset(offset))  # fmt: skip
        if not isinstance(out, tuple) or len(out) < 2:
            raise TypeError(
                "quack: rmsnorm_fwd(residual=...) returned no residual_out; this QuACK "
                "version's fused add is not the one this wrapper was written for"
            )
        return out[0].view(x.shape), out[1].view(x.shape)

    return Impl(
        "quack",
        quack_fused_add_rms_norm,
        notes=[
            "compiled per (N, dtypes) on first call; y from the fp32 sum, not the stored "
            "residual_out (checked against that definition, within the same tolerance)",
        ],
        reference=_offset_ref(fused_add_rms_norm_ref_of_fp32_sum, offset),
    )


def _flashinfer_norm(cuda_path: bool) -> tuple[Optional[object], Optional[str]]:
    """flashinfer.norm, or None and why it cannot run this path: not importable, or (the
    default path) its CuTe DSL kernels not what its dispatch takes here."""
    try:
        import flashinfer.norm as norm
    except Exception as e:  # ImportError, or a broken install failing at import
        return None, not_importable("flashinfer", e)
    if cuda_path or not norm._USE_CUDA_NORM:
        return norm, None
    if os.environ.get("FLASHINFER_USE_CUDA_NORM") == "1":
        why = "FLASHINFER_USE_CUDA_NORM=1"
    else:
        try:
            import cutlass.cute  # noqa: F401  what flashinfer.norm's DSL kernels import

            why = "its CuTe DSL kernels did not import"
        except Exception as e:
            why = not_importable("nvidia-cutlass-dsl", e)
    return None, f"flashinfer's default path is its CUDA kernel here: {why}"


@functools.cache
def _flashinfer_dispatches_cuda(norm, device: torch.device) -> bool:
    """Whether flashinfer.norm's dispatch takes the CUDA kernel on this device (an
    architecture its CuTe DSL does not target), asked once a device."""
    return norm._use_cuda_norm(device)


def _flashinfer_call(norm, cuda_path: bool, fn: Callable, *args):
    """fn(*args) on the path asked for: the CUDA one by flashinfer.norm's own flag, set for
    this call alone (FLASHINFER_USE_CUDA_NORM is read once, at import); the default one
    refused where its dispatch would take the CUDA kernel."""
    if not cuda_path:
        if _flashinfer_dispatches_cuda(norm, args[0].device):
            raise RuntimeError(
                f"flashinfer: its dispatch takes the CUDA kernel on {args[0].device}, not "
                "the CuTe DSL one (flashinfer_cuda times that path)"
            )
        return fn(*args)
    was = norm._USE_CUDA_NORM
    norm._USE_CUDA_NORM = True
    try:
        return fn(*args)
    finally:
        norm._USE_CUDA_NORM = was


def _flashinfer_weight(name: str, weight: Optional[torch.Tensor], x: torch.Tensor):
    """The weight FlashInfer's kernels read: ones where none; refused in another dtype than
    x's (the CUDA kernel would read its bytes as x's type)."""
    if weight is not None and weight.dtype != x.dtype:
        raise ValueError(
            f"{name}: weight is {weight.dtype} but x is {x.dtype}; FlashInfer reads the weight "
            "in x's dtype, so it takes the weight only in that dtype"
        )
    return _ones_if_none(weight, x)


_FLASHINFER_NOTES = {
    False: "flashinfer.norm's default path: its CuTe DSL kernel, compiled per (N, dtype) on "
    "first call",
    True: "flashinfer.norm's CUDA path (norm.cuh; its JIT builds it with nvcc on first call): "
    "flashinfer.norm._USE_CUDA_NORM set for each call; fp16 and bf16 only",
}


def _flashinfer_fn(offset: float, plain: str, gemma: str) -> Optional[str]:
    """The name of FlashInfer's function for the op (looked up at each call): the plain one,
    or with offset 1.0 its Gemma one (weight + 1); None for another offset, which it has no
    function for."""
    if not offset:
        return plain
    return gemma if offset == 1.0 else None


def _flashinfer(cuda_path: bool, offset: float = 0.0, heads: bool = False) -> Impl:
    """FlashInfer's rmsnorm on rows (2-D); heads: x as it comes, a 3-D head view taking its
    per-head (QK-norm) kernel."""
    name = "flashinfer_cuda" if cuda_path else "flashinfer"
    norm, why = _flashinfer_norm(cuda_path)
    if why:
        return Impl(name, None, unavailable=why)
    fn = _flashinfer_fn(offset, "rmsnorm", "gemma_rmsnorm")
    if fn is None:
        return Impl(name, None, unavailable=f"no weight offset {offset} (gemma_rmsnorm: 1.0)")

    def flashinfer_rms_norm(x, weight=None, eps=1e-6):
        # 2-D: a 3-D input would take its per-head kernel, which heads asks for
        rows = x if heads else x.reshape(-1, x.shape[-1])
        w = _flashinfer_weight(name, weight, x)
        return _flashinfer_call(norm, cuda_path, getattr(norm, fn), rows, w, eps).view(x.shape)

    return Impl(
        name,
        flashinfer_rms_norm,
        notes=[_FLASHINFER_NOTES[cuda_path], "weight in x's dtype only (none: ones); PDL on"],
    )


def _flashinfer_fused_add(cuda_path: bool, offset: float = 0.0) -> Impl:
    name = "flashinfer_cuda" if cuda_path else "flashinfer"
    norm, why = _flashinfer_norm(cuda_path)
    if why:
        return Impl(name, None, unavailable=why)
    fn = _flashinfer_fn(offset, "fused_add_rmsnorm", "gemma_fused_add_rmsnorm")
    if fn is None:
        why = f"no weight offset {offset} (gemma_fused_add_rmsnorm: 1.0)"
        return Impl(name, None, unavailable=why)

    def copies(x, residual, weight):
        """(copies of x's and the residual's rows, weight) as fused_add_rmsnorm takes them,
        in place (it writes y over its input, residual_out over the residual): 2-D, residual
        and weight in x's dtype."""
        if residual.dtype != x.dtype:
            raise ValueError(
                f"{name}: residual is {residual.dtype} but x is {x.dtype}; FlashInfer's "
                "fused add writes residual_out over the residual in x's dtype, so it takes "
                "the residual only in that dtype"
            )
        n = x.shape[-1]
        w = _flashinfer_weight(name, weight, x)
        return x.reshape(-1, n).clone(), residual.reshape(-1, n).clone(), w

    def in_place(rows, res, w, eps):
        _flashinfer_call(norm, cuda_path, getattr(norm, fn), rows, res, w, eps)

    def fused_add_rms_norm(x, residual, weight=None, eps=1e-6):
        y, out, w = copies(x, residual, weight)
        in_place(y, out, w, eps)
        return y.view(x.shape), out.view(x.shape)

    def prepare(*inputs):
        """The bench's per shape: the first call (the JIT's build or compile and a run),
        timed apart, then copies of x and the residual made once, the timed call running
        in place on them, bound to these inputs."""
        fn, seconds = _first_call(lambda: _run_once(fused_add_rms_norm, inputs), inputs)
        x, residual, weight, eps = inputs
        y, out, w = copies(x, residual, weight)

        def timed(*again):
            if again[0] is not x:
                raise ValueError(f"{name}: called with other inputs than it was prepared for")
            in_place(y, out, w, eps)
            return y.view(x.shape), out.view(x.shape)

        return timed, seconds

    return Impl(
        name,
        fused_add_rms_norm,
        prepare=prepare,
        notes=[
            _FLASHINFER_NOTES[cuda_path],
            "in place (x becomes y, the residual residual_out): checked on copies, timed in "
            "place on copies made once a shape, values drifting over the repeats",
            "residual and weight in x's dtype only; y from the fp32 sum, not the stored "
            "residual_out (checked against that definition, within the same tolerance); "
            "PDL on",
        ],
        reference=_offset_ref(fused_add_rms_norm_ref_of_fp32_sum, offset),
    )


# ---------------------------------------------------------------------------------------
# the quantised forward (fp8): each form's implementations
# ---------------------------------------------------------------------------------------
#: The quantised forms the benchmark measures: the caller's static scale (an input), a
#: scale a row, a scale a group of 128 (DeepSeek-V3's blockwise GEMMs).
QUANT_MODES = {"static": {}, "token": {}, "group128": {"group_size": 128}}
#: The fp8 dtype the quantised ops write (e4m3: every serving stack's activations).
QUANT_DTYPE = torch.float8_e4m3fn


def quant_kw(mode: str, scale: Optional[torch.Tensor]) -> dict:
    """The quantised ops' keywords of a form (QUANT_MODES), with its static scale or None."""
    return dict(QUANT_MODES[mode], scale=scale, out_dtype=QUANT_DTYPE)


def quant_split(inputs: tuple, fused: bool) -> tuple[tuple, Optional[torch.Tensor]]:
    """A quantised form's inputs as (the op's own: x, [residual,] weight, eps; the static
    scale, or None for a dynamic form, which has none)."""
    k = 4 if fused else 3
    return inputs[:k], (inputs[k:] or (None,))[0]


def _quant_ours(name: str, mode: str, fused: bool) -> Impl:
    """Our quantised forward: fn(x, [residual,] weight, eps[, scale]) -> (y, [residual_out,]
    scales); the fused add's in-place form in_place(x, residual, weight, eps[, scale]) ->
    (y, scales), residual written."""
    fn, in_place = (
        ("fused_add_rms_norm_quant", "fused_add_rms_norm_quant_")
        if fused
        else ("rms_norm_quant", None)
    )
    impl = _ours(name, fn, in_place, info="")
    if impl.unavailable:
        return impl

    def bound(call):
        def quantised(*inputs):
            head, scale = quant_split(inputs, fused)
            return call(*head, **quant_kw(mode, scale))

        return quantised

    impl.fn = bound(impl.fn)
    if impl.in_place is not None:
        impl.in_place = bound(impl.in_place)
    return impl


def quant_eager(mode: str, fused: bool) -> Fn:
    """The quantised forward as PyTorch writes it (the reference's math, fp8 out): the
    eager baseline, and what compile compiles."""
    from harness.reference import fused_add_rms_norm_quant_ref, rms_norm_quant_ref

    def eager(*inputs):
        head, scale = quant_split(inputs, fused)
        kw = quant_kw(mode, scale)
        if fused:
            q, ro, s, _ = fused_add_rms_norm_quant_ref(*head, **kw)
            return q, ro, (scale if scale is not None else s)
        q, s, _ = rms_norm_quant_ref(*head, **kw)
        return q, (scale if scale is not None else s)

    eager.__name__ = f"{'fused_add_' * fused}rms_norm_quant_{mode}"
    return eager


def _quantised_after(mode: str, fused: bool, plain: Fn, fused_add: Fn, pick: int) -> Fn:
    """A norm's y (plain's, or fused_add's with its residual_out) quantised as the reference
    quantises: (q or v, [residual_out,] scales), pick 0 for q (fp8), 2 for v (fp32)."""
    from harness.reference import quantise_ref

    def fn(*inputs):
        head, scale = quant_split(inputs, fused)
        y, *ro = fused_add(*head) if fused else (plain(*head),)
        out = quantise_ref(y.float(), **quant_kw(mode, scale))
        return (out[pick], *ro, scale if scale is not None else out[1])

    return fn


def _native_quant(mode: str, fused: bool) -> Fn:
    """What an unfused model runs: native's norm (F.rms_norm; the fused add as native's),
    y stored in x's dtype, then quantised in PyTorch as the reference quantises."""
    return _quantised_after(mode, fused, native_rms_norm, native_fused_add_rms_norm, 0)


def _quant_native_reference(mode: str, fused: bool) -> Fn:
    """native's own definition of correct: the reference's norm rounded to x's dtype, then
    quantised (v fp32, as the op's reference gives it)."""
    from harness.reference import fused_add_rms_norm_ref, rms_norm_ref

    return _quantised_after(mode, fused, rms_norm_ref, fused_add_rms_norm_ref, 2)


def _flashinfer_quant(cuda_path: bool, mode: str, fused: bool) -> Impl:
    """FlashInfer's rmsnorm_quant / fused_add_rmsnorm_quant: a static scale only, y into an
    fp8 tensor it is given (the fused add in place, on copies, as its plain fused add)."""
    name = "flashinfer_cuda" if cuda_path else "flashinfer"
    group = QUANT_MODES[mode].get("group_size")
    if group == 128 and fused:
        return _flashinfer_group_quant(cuda_path)
    if mode != "static":
        why = (
            "FlashInfer's norms quantise by a static scale only, its fused add by groups of 128 too"
        )
        return Impl(name, None, unavailable=why)
    norm, why = _flashinfer_norm(cuda_path)
    if why:
        return Impl(name, None, unavailable=why)

    def quantised(*inputs):
        scale = inputs[-1]
        x = inputs[0]
        rows = x.reshape(-1, x.shape[-1])
        y = torch.empty(rows.shape, dtype=QUANT_DTYPE, device=x.device)
        w = _flashinfer_weight(name, inputs[2 if fused else 1], x)
        if fused:
            res = inputs[1].reshape(-1, x.shape[-1]).clone()
            _flashinfer_call(norm, cuda_path, norm.fused_add_rmsnorm_quant, y, rows, res, w, scale,
                             inputs[3])  # fmt: skip
            return y.view(x.shape), res.view(x.shape), scale
        _flashinfer_call(norm, cuda_path, norm.rmsnorm_quant, y, rows, w, scale, inputs[2])
        return y.view(x.shape), scale

    # its fused kernels normalise the fp32 sum and store only residual_out rounded (both
    # paths), where the reference normalises the rounded residual_out
    return Impl(
        name,
        quantised,
        notes=[_FLASHINFER_NOTES[cuda_path], "static scale only"],
        rounds_in_dtype=fused,
    )


def _flashinfer_group_quant(cuda_path: bool) -> Impl:
    """FlashInfer's fused add with groups of 128 (fused_add_rmsnorm_fp8_block_quant, its
    CUDA kernel alone): the residual in place (on a copy), y in e4m3, the scales
    column-major (N / 128, M rounded up to 4), returned as (M, N / 128) views, and a bf16
    normed_out written as well, which its time includes."""
    name = "flashinfer_cuda" if cuda_path else "flashinfer"
    if not cuda_path:
        return Impl(name, None, unavailable="FlashInfer's group quantisation is a CUDA kernel only")
    norm, why = _flashinfer_norm(cuda_path)
    if why:
        return Impl(name, None, unavailable=why)

    def quantised(x, residual, weight, eps):
        n = x.shape[-1]
        rows = x.reshape(-1, n)
        m = rows.shape[0]
        y = torch.empty(rows.shape, dtype=QUANT_DTYPE, device=x.device)
        scales = torch.empty((n // 128, (m + 3) // 4 * 4), dtype=torch.float32, device=x.device)
        normed = torch.empty_like(rows)
        res = residual.reshape(-1, n).clone()
        w = _flashinfer_weight(name, weight, x)
        norm.fused_add_rmsnorm_fp8_block_quant(y, scales, normed, rows, res, w, eps)
        per_row = scales.t()[:m].reshape(*x.shape[:-1], n // 128)
        return y.view(x.shape), res.view(x.shape), per_row

    return Impl(
        name,
        quantised,
        notes=[
            _FLASHINFER_NOTES[True],
            "fused_add_rmsnorm_fp8_block_quant: writes a bf16 normed_out too (2 bytes an "
            "element more than the op's bytes); N a multiple of 256 to 8192, of 512 to 16384",
        ],
        # y of the fp32 sum, rounded to x's dtype before the group's max and the rounding
        rounds_in_dtype=True,
    )


def quant_registry(
    baselines: bool = False, mode: str = "token", fused: bool = False
) -> dict[str, Impl]:
    """The quantised forward's implementations in one form (QUANT_MODES' mode; fused: the
    fused add), keyed by name: fn(x, [residual,] weight, eps[, scale]) -> (y, [residual_out,]
    scales). Our kernels only by default; ``baselines=True`` adds eager (the reference's
    math), compile (of it), native (F.rms_norm, y stored, then quantised: an unfused
    model) and FlashInfer's static-scale kernels on both paths."""
    impls = [_quant_ours(name, mode, fused) for name in OURS]
    if baselines:
        ref = quant_eager(mode, fused)
        native = Impl(
            "native",
            _native_quant(mode, fused),
            notes=["F.rms_norm (the fused add: x + residual first), then quantised: two passes"],
            reference=_quant_native_reference(mode, fused),
            rounds_in_dtype=True,  # its 16-bit y an ulp from the reference's at times
        )
        # Inductor may drop a round trip through x's dtype (torch 2.11 drops the sum's)
        compiled = dataclasses.replace(_compile(ref), rounds_in_dtype=True)
        impls += [_eager(ref), compiled, native]
        impls += [_flashinfer_quant(False, mode, fused), _flashinfer_quant(True, mode, fused)]
    return {i.name: i for i in impls}


# ---------------------------------------------------------------------------------------
# the gradient ops: each forward, then torch.autograd.grad of its outputs
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradCall:
    """How a gradient op's inputs split: the forward's ``n_forward`` arguments first (those
    at positions ``wrt`` differentiated, where not None), then the gradients of its
    outputs, one an output."""

    n_forward: int
    wrt: tuple[int, ...]


#: rms_norm's: (x, weight, eps, dy) -> (dx, dweight)
RMS_NORM_GRADS = GradCall(3, (0, 1))
#: the fused add's: (x, residual, weight, eps, dy, d_residual_out) -> (dx, dresidual, dweight)
FUSED_ADD_GRADS = GradCall(4, (0, 1, 2))


def _leaves(call: GradCall, inputs: tuple) -> tuple[list, list[torch.Tensor]]:
    """(the forward's arguments, the tensors differentiated): x, weight (and residual) as
    fresh leaves that require grad, views of the inputs' storage, never copies."""
    args = list(inputs[: call.n_forward])
    wrt = []
    for i in call.wrt:
        if args[i] is not None:
            args[i] = args[i].detach().requires_grad_()
            wrt.append(args[i])
    return args, wrt


def _grads(call: GradCall, inputs: tuple, outputs, wrt: list, retain: bool) -> tuple:
    """torch.autograd.grad of the outputs for the inputs' output gradients, one gradient a
    position in ``call.wrt`` (None for an input that is None: no weight)."""
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    got = iter(torch.autograd.grad(outs, wrt, inputs[call.n_forward :], retain_graph=retain))
    return tuple(None if inputs[i] is None else next(got) for i in call.wrt)


def forward_backward(forward: Fn, call: GradCall) -> Fn:
    """fn(*inputs) -> gradients: forward on leaves of the inputs, then autograd of its
    outputs, as one call (what the fwd_bwd ops time)."""

    def fn(*inputs):
        args, wrt = _leaves(call, inputs)
        return _grads(call, inputs, forward(*args), wrt, retain=False)

    return fn


def bind_backward(forward: Fn, call: GradCall, *inputs) -> Fn:
    """Run forward once on leaves of these inputs, keeping its graph; return the backward
    alone, fn(*inputs) -> gradients through ``retain_graph=True`` (what rms_norm_bwd times),
    for these very inputs (others are refused: the graph is of these)."""
    args, wrt = _leaves(call, inputs)
    outputs = forward(*args)

    def backward(*again):
        if again[0] is not inputs[0]:
            raise ValueError("bind_backward: called with other inputs than it was bound to")
        return _grads(call, again, outputs, wrt, retain=True)

    return backward


def _first_call(make: Callable[[], Fn], inputs: tuple) -> tuple[Fn, float]:
    """(make(), the seconds make took, synchronised where the inputs are on CUDA)."""
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in inputs)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn = make()
    if cuda:
        torch.cuda.synchronize()
    return fn, time.perf_counter() - t0


def _bound_and_run(forward: Fn, call: GradCall, inputs: tuple) -> Fn:
    """bind_backward to these inputs, and its first call."""
    fn = bind_backward(forward, call, *inputs)
    fn(*inputs)
    return fn


def _run_once(fn: Fn, inputs: tuple) -> Fn:
    fn(*inputs)
    return fn


def _bwd_prepare(forward: Fn, call: GradCall, *inputs) -> tuple[Fn, float]:
    """The backward alone's per-shape setup: the forward once (graph kept) and the first
    backward, timed together as the first call (JIT compilation included)."""
    return _first_call(lambda: _bound_and_run(forward, call, inputs), inputs)


def compile_fresh_grads(
    ref: Callable[..., object], call: GradCall, mode: str, *inputs
) -> tuple[Fn, float]:
    """compile_fresh for a gradient op: reset dynamo, ``torch.compile(ref, dynamic=False,
    fullgraph=True)`` (the forward), then the first forward and backward through it at these
    inputs (AOTAutograd compiles the backward at its first call). Returns the callable to
    time (``mode`` "fwd_bwd": forward + backward; "bwd": the backward alone, bound to these
    inputs) and the seconds of the compiles and that first run."""
    torch._dynamo.reset()
    compiled = torch.compile(ref, dynamic=False, fullgraph=True)
    if mode == "fwd_bwd":
        fn = forward_backward(compiled, call)
        return _first_call(lambda: _run_once(fn, inputs), inputs)
    return _first_call(lambda: _bound_and_run(_retainable(compiled), call, inputs), inputs)


def _retainable(compiled: Fn) -> Fn:
    """A compiled forward whose first call compiles with AOTAutograd's donated buffers off:
    a backward that may write into its saved tensors refuses ``retain_graph=True``, which
    the backward alone is timed with. Decided at that compile; the calls after it (the
    timed backward) run as compiled, with no patch."""

    def fn(*args):
        with torch._functorch.config.patch(donated_buffer=False):
            return compiled(*args)

    return fn


def _with_grads(impl: Impl, call: GradCall, mode: str, notes: tuple[str, ...] = ()) -> Impl:
    """A forward implementation (fn: the op's forward) as its gradient op's: fn computes
    the gradients (``mode`` "fwd_bwd": with the forward; "bwd": the forward run, then the
    backward), ``prepare`` binds the backward alone to a shape's inputs. Unavailable stays
    unavailable. Our kernels' kernel_info describes their forward: not recorded here."""
    if impl.fn is None:
        return dataclasses.replace(impl, resources=None, in_place=None)
    forward = impl.fn
    if mode == "fwd_bwd":
        fn, prepare = forward_backward(forward, call), None
    else:
        fn = lambda *inputs: bind_backward(forward, call, *inputs)(*inputs)
        prepare = functools.partial(_bwd_prepare, forward, call)
    return dataclasses.replace(
        impl,
        fn=fn,
        prepare=prepare,
        resources=None,
        in_place=None,
        forward=forward,
        notes=list(impl.notes) + list(notes),
    )


def _compile_grads(ref: Callable[..., object], call: GradCall, mode: str) -> Impl:
    lazy = _LazyCompiled(ref)
    notes = [
        "torch.compile(eager, dynamic=False, fullgraph=True), reset per shape; its backward "
        "is AOTAutograd's, compiled at the first backward"
    ]
    if mode == "fwd_bwd":
        fn = forward_backward(lazy, call)
    else:
        retainable = _retainable(lazy)
        fn = lambda *inputs: bind_backward(retainable, call, *inputs)(*inputs)
        notes.append("compiled with donated_buffer=False, as retain_graph=True requires")
    return Impl(
        "compile",
        fn,
        prepare=functools.partial(compile_fresh_grads, ref, call, mode),
        forward=ref,
        notes=notes,
    )


def _liger_grads(fused: bool) -> Impl:
    if fused:
        return dataclasses.replace(
            _liger_fused_add(),
            notes=[
                "casting_mode='gemma', in_place=False; residual in x's dtype only; refuses "
                "N > 65536",
                "saves one fp32 rstd per row and returns dX as dR (one tensor: M N elements "
                "fewer written than charged); dweight partials per SM in fp32",
            ],
        )
    return _liger(
        in_place=False,
        notes=[
            "casting_mode='gemma', in_place=False (dX zero-filled, then written); refuses "
            "N > 65536",
            "saves one fp32 rstd per row; dweight partials per SM in fp32 (not charged)",
        ],
    )


def _quack_grads(fused: bool) -> Impl:
    try:
        from quack.rmsnorm import rmsnorm
    except Exception as e:
        return Impl("quack", None, unavailable=f"quack not importable ({e})")
    if not fused:

        def quack_rms_norm(x, weight=None, eps=1e-6):
            return rmsnorm(x, weight, eps=eps)

        return Impl(
            "quack",
            quack_rms_norm,
            notes=[
                "quack.rmsnorm.rmsnorm (its autograd Function; the forward saves rstd, "
                "4 bytes a row, not charged); compiled per (N, dtype) on first call",
            ],
        )

    def quack_fused_add_rms_norm(x, residual, weight=None, eps=1e-6):
        # prenorm=True: (y, residual_out), both differentiable
        out = rmsnorm(x, weight, residual=residual, eps=eps, prenorm=True)
        if not isinstance(out, tuple) or len(out) < 2:
            raise TypeError(
                "quack: rmsnorm(residual=..., prenorm=True) returned no residual_out; this "
                "QuACK version's fused add is not the one this wrapper was written for"
            )
        return out[0], out[1]

    return Impl(
        "quack",
        quack_fused_add_rms_norm,
        notes=[
            "quack.rmsnorm.rmsnorm(residual=, prenorm=True); saves rstd; returns dx as "
            "dresidual when their dtypes match (M N elements fewer written than charged)",
        ],
    )


def _grad_registry(
    fused: bool, mode: str, baselines: bool, rows_first: bool = False
) -> dict[str, Impl]:
    call = FUSED_ADD_GRADS if fused else RMS_NORM_GRADS
    forward = "fused_add_rms_norm" if fused else "rms_norm"
    ref = fused_add_rms_norm_ref if fused else rms_norm_ref
    shared = ("returns dx as dresidual where x and the residual share a dtype (M N elements "
              "fewer written than charged)",) if fused else ()  # fmt: skip
    impls = [_with_grads(_ours(name, forward), call, mode, shared) for name in OURS]
    if baselines:
        native = _native_fused_add() if fused else _native()
        # rows_first (head views): Liger takes rows at one stride, so x is copied first
        liger = _rows_first(_liger_grads(fused)) if rows_first else _liger_grads(fused)
        impls += [
            _with_grads(_eager(ref), call, mode, ("PyTorch's autograd of the forward's ops",)),
            _compile_grads(ref, call, mode),
            _with_grads(native, call, mode, ("with PyTorch's autograd",)),
            _with_grads(liger, call, mode),
            _with_grads(_quack_grads(fused), call, mode),
        ]
        why = "FlashInfer's norms are forward only (no backward)"
        impls += [Impl(name, None, unavailable=why) for name in ("flashinfer", "flashinfer_cuda")]
    return {i.name: i for i in impls}


def rms_norm_fwd_bwd_registry(baselines: bool = False) -> dict[str, Impl]:
    """rms_norm_fwd_bwd's implementations: fn(x, weight, eps, dy) -> (dx, dweight), the
    forward and the backward in one call. Ours only by default; ``baselines=True`` adds
    eager, compile, native, liger and quack (CUDA only), and the two FlashInfer names,
    unavailable."""
    return _grad_registry(False, "fwd_bwd", baselines)


def rms_norm_bwd_registry(baselines: bool = False) -> dict[str, Impl]:
    """rms_norm_bwd's implementations: fn(x, weight, eps, dy) -> (dx, dweight) (the forward
    run, then the backward); ``prepare`` runs the forward once and returns the backward
    alone, the callable timed."""
    return _grad_registry(False, "bwd", baselines)


def qk_bwd_registry(baselines: bool = False) -> dict[str, Impl]:
    """rms_norm_bwd's implementations on head views (harness.ops.QK_RMS_NORM_BWD), as
    qk_registry's forward: Liger, which takes rows at one stride, gets x copied into rows
    first, in the graph (the copy's backward timed with it)."""
    return _grad_registry(False, "bwd", baselines, rows_first=True)


def fused_add_fwd_bwd_registry(baselines: bool = False) -> dict[str, Impl]:
    """fused_add_rms_norm_fwd_bwd's implementations: fn(x, residual, weight, eps, dy,
    d_residual_out) -> (dx, dresidual, dweight), the forward and the backward in one call."""
    return _grad_registry(True, "fwd_bwd", baselines)


def _offset_ours(impl: Impl, offset: float) -> Impl:
    """One of our kernels with the weight offset passed to its function and in-place form."""
    if offset and not impl.unavailable:
        impl.fn = functools.partial(impl.fn, weight_offset=offset)
        if impl.in_place is not None:
            impl.in_place = functools.partial(impl.in_place, weight_offset=offset)
    return impl


def _offset_ref(ref: Callable[..., object], offset: float) -> Callable[..., object]:
    """An op's reference with the weight offset (the eager baseline, and what compile
    compiles: a plain function, which dynamo traces as it traces the reference)."""
    if not offset:
        return ref

    def with_offset(*inputs):
        return ref(*inputs, weight_offset=offset)

    with_offset.__name__ = f"{ref.__name__}_offset"
    return with_offset


def _no_offset_native(offset: float, native: Callable[[], Impl]) -> Impl:
    if offset:
        why = (
            "torch.nn.functional.rms_norm has no weight offset (a Gemma model runs eager's formula)"
        )
        return Impl("native", None, unavailable=why)
    return native()


def fused_add_registry(baselines: bool = False, offset: float = 0.0) -> dict[str, Impl]:
    """The fused add's implementations, available or not, keyed by name:
    fn(x, residual, weight, eps) -> (y, residual_out), and for ours also the in-place
    in_place(x, residual, weight, eps); offset: the weight offset every one of them adds
    (Gemma's 1.0; native, which has none, is then unavailable).

    Our kernels only by default; ``baselines=True`` adds eager, compile, native, liger,
    quack, flashinfer and flashinfer_cuda (the benchmark's comparison; CUDA only)."""
    impls = [
        _offset_ours(
            _ours(name, "fused_add_rms_norm", "fused_add_rms_norm_", "fused_add_kernel_info"),
            offset,
        )
        for name in OURS
    ]
    if baselines:
        ref = _offset_ref(fused_add_rms_norm_ref, offset)
        impls += [
            _eager(ref),
            _compile(ref),
            _no_offset_native(offset, _native_fused_add),
            _liger_fused_add(offset),
            _quack_fused_add(offset),
            _flashinfer_fused_add(cuda_path=False, offset=offset),
            _flashinfer_fused_add(cuda_path=True, offset=offset),
        ]
    return {i.name: i for i in impls}


def registry(baselines: bool = False, offset: float = 0.0) -> dict[str, Impl]:
    """rms_norm's implementations, available or not, keyed by name; offset as
    fused_add_registry's.

    Our kernels only by default; ``baselines=True`` adds eager, compile, native, liger,
    quack, flashinfer and flashinfer_cuda (the benchmark's comparison; CUDA only).
    """
    impls = [_offset_ours(_ours(name, "rms_norm"), offset) for name in OURS]
    if baselines:
        ref = _offset_ref(rms_norm_ref, offset)
        impls += [_eager(ref), _compile(ref), _no_offset_native(offset, _native)]
        impls += [_liger(offset=offset), _quack(offset)]
        impls += [_flashinfer(False, offset), _flashinfer(True, offset)]
    return {i.name: i for i in impls}


def qk_registry(baselines: bool = False) -> dict[str, Impl]:
    """rms_norm's implementations on head views (harness.ops.QK_RMS_NORM): registry's, with
    FlashInfer given the 3-D view (its per-head kernel); the peers that take 2-D rows
    (Liger, QuACK) get the copy into rows a caller would make, timed with them."""
    impls = registry(baselines)
    if baselines:
        impls["liger"] = _rows_first(impls["liger"])
        impls["flashinfer"] = _flashinfer(False, heads=True)
        impls["flashinfer_cuda"] = _flashinfer(True, heads=True)
    return impls


def _rows_first(impl: Impl) -> Impl:
    """impl called on x copied into rows (x.reshape(-1, N), a copy for a head view), as a
    caller of a kernel that takes rows at one stride must."""
    if impl.fn is None:
        return impl

    def fn(x, weight=None, eps=1e-6):
        return impl.fn(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)

    return dataclasses.replace(impl, fn=fn, notes=[*impl.notes, "x copied into rows first"])


def runnable(impl: Impl, device: str) -> Optional[str]:
    """None if impl can run on device, else the reason it is skipped."""
    if impl.unavailable:
        return impl.unavailable
    if device == "cpu" and not impl.cpu:
        return "needs a CUDA GPU"
    return None
