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

from rmsnorm_api import spec as _spec

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
    s, ds, weight, dweight, dtype, eps: float, weight_offset: float = 0.0
) -> Optional[torch.Tensor]:
    """The tangent of y = s * rstd * (weight + weight_offset) for tangents ds of s and
    dweight of the weight (either None: zero), in fp32, cast to dtype."""
    if ds is None and dweight is None:
        return None
    s = s.float()
    rstd = torch.rsqrt(s.square().mean(-1, keepdim=True) + eps)
    w = None if weight is None else weight.float() + weight_offset
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


def _scalars(forward: str, backward: str) -> tuple[tuple[str, object], ...]:
    """The forward op's scalar arguments its backward op also takes, by name, with their
    defaults (spec.OPS): what a Function keeps for its backward and its tangent, so that a
    new scalar of both ops (the weight offset) reaches the backward with no line here."""
    takes = {a.name for a in _spec.OPS[backward].args}
    return tuple(
        (a.name, a.default)
        for a in _spec.OPS[forward].args
        if a.kind != "Tensor" and a.name in takes
    )


def _keep(ctx, forward: str, inputs: tuple, scalars: tuple) -> None:
    """The call's scalars (scalars: _scalars' answer) by name on ctx, an argument the
    dispatcher left out at its default (a trailing one) as its default, and how many
    inputs there were (backward returns a gradient or None for each)."""
    given = dict(zip((a.name for a in _spec.OPS[forward].args), inputs, strict=False))
    ctx.scalars = {name: given.get(name, default) for name, default in scalars}
    ctx.inputs = len(inputs)


def _call(op, name: str, **values):
    """op (the backend's op `name`) called with its arguments by name, in its order, an
    argument not given at its default (spec.OPS)."""
    return op(*(values.get(a.name, a.default) for a in _spec.OPS[name].args))


def _functions(ns: str) -> dict:
    """The autograd.Function of each op of a backend: the two forward ops, whose backward
    calls the backend's backward op with the forward's scalars by name (_scalars)."""
    ops = getattr(torch.ops, ns)
    plain = _scalars("rms_norm", "rms_norm_backward")
    fused = _scalars("fused_add_rms_norm", "fused_add_rms_norm_backward")

    class RMSNorm(_Function):
        @staticmethod
        def forward(*args):
            return ops.rms_norm(*args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, weight = inputs[:2]
            _keep(ctx, "rms_norm", inputs, plain)
            ctx.save_for_backward(x, weight)
            ctx.save_for_forward(x, weight)

        @staticmethod
        def backward(ctx, dy):
            x, weight = ctx.saved_tensors
            dx, dw = _call(ops.rms_norm_backward, "rms_norm_backward", dy=dy, x=x, weight=weight,
                           **ctx.scalars)  # fmt: skip
            return dx, dw if weight is not None else None, *(None,) * (ctx.inputs - 2)

        @staticmethod
        def jvp(ctx, dx, dweight, *_scalar_tangents):
            x, weight = ctx.saved_tensors
            return _norm_tangent(x, dx, weight, dweight, x.dtype, **ctx.scalars)

    class FusedAddRMSNorm(_Function):
        @staticmethod
        def forward(*args):
            return ops.fused_add_rms_norm(*args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, _residual, weight = inputs[:3]
            _keep(ctx, "fused_add_rms_norm", inputs, fused)
            ctx.x_dtype = x.dtype
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
            dx, dres, dw = _call(
                ops.fused_add_rms_norm_backward,
                "fused_add_rms_norm_backward",
                dy=dy,
                d_residual_out=d_residual_out,
                residual_out=residual_out,
                weight=weight,
                dresidual=not share,
                **ctx.scalars,
            )
            grads = (dx, dx if share else dres, dw if weight is not None else None)
            return *grads, *(None,) * (ctx.inputs - 3)

        @staticmethod
        def jvp(ctx, dx, dresidual, dweight, *_scalar_tangents):
            residual_out, weight = ctx.saved_tensors
            ds = None
            for t in (dx, dresidual):
                if t is not None:
                    ds = t.float() if ds is None else ds + t.float()
            dy = _norm_tangent(residual_out, ds, weight, dweight, ctx.x_dtype, **ctx.scalars)
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


def _row_args(name: str) -> tuple[tuple[int, ...], bool]:
    """Where op `name`'s rows are among its arguments (spec.OPS: its rows and the tensors
    shaped as them, batched together over a leading dimension) and whether it reduces over
    rows into an output (a returned dweight), which a batch cannot share."""
    spec = _spec.OPS[name]
    rows = spec.rows.name
    at = tuple(i for i, a in enumerate(spec.args) if a.name == rows or a.shape == rows)
    return at, "dweight" in spec.return_names


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
        torch.library.register_vmap(f"{ns}::{name}", _vmap_rule(op, *_row_args(name)), lib=lib)
