"""The autograd of a backend's ops, every mode torch offers, wired once for both backends.

- Reverse mode (``backward()``, ``torch.autograd.grad``, ``torch.func.grad`` / ``vjp`` /
  ``jacrev``): through the backend's backward ops (its kernels). The forward saves
  references to what the backward reads (x; the fused add's residual_out) and the weight,
  no copies: the kernels recompute rstd from them.
- Forward mode (``torch.func.jvp`` / ``jacfwd``, ``torch.autograd.forward_ad``): the
  tangent by formula, in fp32 torch ops on upcast inputs (the forward's precision policy),
  cast once to the output's dtype. For y = s * rstd * w, rstd = (mean(s^2) + eps)^-1/2, w
  the weight plus its offset (in fp32; the offset is a constant, so dw is the weight's):

      dy = (rstd * (ds - s * rstd^2 * mean(s * ds))) * w + s * rstd * dw

  with s = x, or the fused add's residual_out and ds = dx + dresidual (also residual_out's
  tangent).
- ``torch.func.vmap``: a batching rule an op. The forward ops batch over a leading
  dimension in one call where only the rows are batched (the ops take any leading
  dimensions); otherwise (a batched weight, the backward's dweight, which sums over rows)
  one call a batch element.
- Second derivatives (double backward, ``torch.func.hessian``, a jvp of the backward): the
  backward ops have no derivative of their own; they raise an error that says so, never a
  zero tangent.

Each op's Autograd kernel is registered at the backend autograd keys a tensor of this
project can carry (CPU under the interpreter, CUDA, Meta), ahead of any kernel a library
registered at the Autograd alias (torch.library.triton_op installs one that knows no
forward mode). ``torch.autograd.Function`` with ``setup_context`` carries each mode, so
functorch's transforms accept it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._functorch.utils import enable_single_level_autograd_function
from torch.autograd import forward_ad

_C = torch._C
#: The backend autograd keys our ops' tensors dispatch to (a CPU tensor under the Triton
#: interpreter, a CUDA tensor, a meta tensor); nested tensors have a kernel of their own.
AUTOGRAD_KEYS = ("AutogradCPU", "AutogradCUDA", "AutogradMeta")
_LIBS: list = []  # the registrations live as long as the process
#: The autograd.Function of one functorch level: an op's Autograd kernel runs inside a
#: level already (functorch has unwrapped the tensors), where torch.autograd.Function's
#: apply would route through functorch's custom_function_call, which cannot dispatch from
#: there; the level's tensors record the op as any built-in op's autograd does.
_Function = torch.autograd.function._SingleLevelFunction


def _needs_autograd(args) -> bool:
    """Whether a call must go through the op's autograd.Function: a gradient wanted in
    reverse mode, or a forward-mode level open (forward_ad's dual level, which torch.func.jvp
    opens too). Inside a Function's forward both are off, so the op's own call there takes
    the plain path."""
    if forward_ad._current_level >= 0 and _C._is_fwd_grad_enabled():
        return True
    return _C.is_grad_enabled() and _C._any_requires_grad(*args)


def _norm_tangent(
    s, ds, weight, dweight, eps: float, dtype, offset: float = 0.0
) -> Optional[torch.Tensor]:
    """The tangent of y = s * rstd * (weight + offset) for tangents ds of s and dweight of
    the weight (either None: zero), in fp32, cast to dtype."""
    if ds is None and dweight is None:
        return None
    s = s.float()
    rstd = torch.rsqrt(s.square().mean(-1, keepdim=True) + eps)
    w = None if weight is None else weight.float() + offset
    dy = torch.zeros_like(s)
    if ds is not None:
        ds = ds.float()
        dn = rstd * (ds - s * rstd.square() * (s * ds).mean(-1, keepdim=True))
        dy = dy + (dn if w is None else dn * w)
    if dweight is not None:
        dy = dy + s * rstd * dweight.float()
    return dy.to(dtype)


def _second_derivative_error(op: str) -> RuntimeError:
    return RuntimeError(
        f"{op}: second derivatives are not supported (double backward, torch.func.hessian,"
        " a jvp of the backward): the backward has no derivative of its own"
    )


def _functions(ns: str) -> dict:
    """The autograd.Function of each op of a backend."""
    ops = getattr(torch.ops, ns)

    class RMSNorm(_Function):
        @staticmethod
        def forward(x, weight, eps, offset=0.0):
            return ops.rms_norm(x, weight, eps, offset)

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, weight, eps, *offset = inputs
            ctx.eps, ctx.offset = eps, offset[0] if offset else 0.0
            ctx.save_for_backward(x, weight)
            ctx.save_for_forward(x, weight)

        @staticmethod
        def backward(ctx, dy):
            x, weight = ctx.saved_tensors
            dx, dw = ops.rms_norm_backward(dy, x, weight, ctx.eps, ctx.offset)
            return dx, dw if weight is not None else None, None, None

        @staticmethod
        def jvp(ctx, dx, dweight, _deps, _doffset=None):
            x, weight = ctx.saved_tensors
            return _norm_tangent(x, dx, weight, dweight, ctx.eps, x.dtype, ctx.offset)

    class FusedAddRMSNorm(_Function):
        @staticmethod
        def forward(x, residual, weight, eps, offset=0.0):
            return ops.fused_add_rms_norm(x, residual, weight, eps, offset)

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, _residual, weight, eps, *offset = inputs
            ctx.eps, ctx.offset, ctx.x_dtype = eps, offset[0] if offset else 0.0, x.dtype
            ctx.save_for_backward(output[1], weight)  # residual_out: what y normalised
            ctx.save_for_forward(output[1], weight)

        # autograd hands an unused output's gradient in as zeros, so dy and d_residual_out
        # are both tensors here. dx and dresidual are one value, cast to x's and the
        # residual's dtypes: where those are one dtype, dx is returned as both and the
        # kernels skip dresidual's store (one tensor of the backward's five fewer to write).
        # Autograd hands a gradient shared so to each leaf as its own (AccumulateGrad copies
        # one that something else still holds), and torch's nodes never write into a
        # gradient they are given; torch.autograd.grad and torch.func return the one tensor
        # for both, as they do for the composite x + residual then F.rms_norm (torch's add
        # hands its one gradient to both inputs), and so never a second store.
        @staticmethod
        def backward(ctx, dy, d_residual_out):
            residual_out, weight = ctx.saved_tensors
            share = dy.dtype == residual_out.dtype
            dx, dres, dw = ops.fused_add_rms_norm_backward(
                dy, d_residual_out, residual_out, weight, ctx.eps, not share, ctx.offset
            )
            return dx, dx if share else dres, dw if weight is not None else None, None, None

        @staticmethod
        def jvp(ctx, dx, dresidual, dweight, _deps, _doffset=None):
            residual_out, weight = ctx.saved_tensors
            ds = None
            for t in (dx, dresidual):
                if t is not None:
                    ds = t.float() if ds is None else ds + t.float()
            dy = _norm_tangent(residual_out, ds, weight, dweight, ctx.eps, ctx.x_dtype, ctx.offset)
            if ds is None:
                return dy, None
            return dy, ds.to(residual_out.dtype)

    def first_order_only(name: str, op):
        """A Function for a backward op: runs it, and refuses to be differentiated."""

        def forward(*args):
            return op(*args)

        def setup_context(ctx, inputs, output):
            pass

        def refuse(ctx, *_grads):
            raise _second_derivative_error(f"{ns}.{name}")

        members = dict(forward=staticmethod(forward), setup_context=staticmethod(setup_context),
                       backward=staticmethod(refuse), jvp=staticmethod(refuse))  # fmt: skip
        return type(f"{name}_first_order_only", (_Function,), members)

    return {
        "rms_norm": RMSNorm,
        "fused_add_rms_norm": FusedAddRMSNorm,
        "rms_norm_backward": first_order_only("rms_norm_backward", ops.rms_norm_backward),
        "fused_add_rms_norm_backward": first_order_only(
            "fused_add_rms_norm_backward", ops.fused_add_rms_norm_backward
        ),
    }


def _autograd_kernel(op, fn):
    """The op's Autograd kernel: its Function where autograd has work, else straight below
    Autograd (what a call that needs no gradient costs)."""

    def kernel(keyset, *args):
        if _needs_autograd(args):
            if _C._are_functorch_transforms_active():
                with enable_single_level_autograd_function():
                    return fn.apply(*args)
            return fn.apply(*args)
        with _C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & _C._after_autograd_keyset, *args)

    return kernel


#: Where each op's rows are among its arguments (batched together over a leading dim) and
#: whether it reduces over rows into an output (dweight), which a batch cannot share.
_ROW_ARGS = {
    "rms_norm": ((0,), False),
    "fused_add_rms_norm": ((0, 1), False),
    "rms_norm_backward": ((0, 1), True),
    "fused_add_rms_norm_backward": ((0, 1, 2), True),
}


def _as_rows_arg(t: torch.Tensor) -> torch.Tensor:
    """A batched slice as the ops take it: stride 1 in the last dimension (moving a batch
    dimension can leave another there; the copy is the batching's, not the caller's)."""
    return t if t.numel() == 0 or t.stride(-1) == 1 else t.contiguous()


def _vmap_rule(op, row_args: tuple, reduces: bool):
    def rule(info, in_dims, *args):
        batched = [d is not None for d in in_dims]
        rows_only = all(batched[i] or args[i] is None for i in row_args) and not any(
            b for i, b in enumerate(batched) if i not in row_args
        )
        if rows_only and not reduces:
            moved = list(args)
            for i in row_args:
                if args[i] is not None:
                    moved[i] = _as_rows_arg(args[i].movedim(in_dims[i], 0))
            out = op(*moved)
            return out, (0,) * len(out) if isinstance(out, tuple) else 0
        results = []
        for b in range(info.batch_size):
            one = [
                _as_rows_arg(a.select(d, b)) if d is not None else a
                for a, d in zip(args, in_dims, strict=True)
            ]
            results.append(op(*one))
        if isinstance(results[0], tuple):
            out = tuple(torch.stack(r) for r in zip(*results, strict=True))
            return out, (0,) * len(out)
        return torch.stack(results), 0

    return rule


def register_autograd(ns: str) -> None:
    """Every mode of autograd for a backend's four ops (``<ns>::rms_norm``,
    ``fused_add_rms_norm`` and their backward ops), and their batching rules."""
    ops = getattr(torch.ops, ns)
    lib = torch.library.Library(ns, "IMPL")
    _LIBS.append(lib)
    for name, fn in _functions(ns).items():
        op = getattr(ops, name).default
        for key in AUTOGRAD_KEYS:
            lib.impl(name, _autograd_kernel(op, fn), key, with_keyset=True)
        torch.library.register_vmap(f"{ns}::{name}", _vmap_rule(op, *_ROW_ARGS[name]), lib=lib)
