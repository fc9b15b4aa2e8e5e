"""The Triton forward ops: their torch.library registration, public functions, forced-config
forms for sweeps, ``kernel_info`` and the ``RMSNorm`` module.

    rms_norm(x, weight=None, eps=1e-6, *, out=None, weight_offset=0.0) -> y
    fused_add_rms_norm(x, residual, weight=None, eps=1e-6, *, weight_offset=0.0)
        -> (y, residual_out)
    fused_add_rms_norm_(x, residual, weight=None, eps=1e-6, *, weight_offset=0.0) -> None
        (y into x, residual_out into residual)

y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset) over x's last dimension (the offset
added in fp32; Gemma's norms take 1.0); the fused add normalises
residual_out = x + residual (an fp32 add rounded once to residual's dtype; residual in x's
dtype or float32), reading x and residual once and writing y and residual_out once.
Registered as ``triton_impl::rms_norm``, ``rms_norm_out``, ``fused_add_rms_norm`` and the
in-place ``fused_add_rms_norm_`` (its mutation declared in the schema, so it captures in
CUDA graphs with no output allocated; the sharded kernel's rows, past FUSED_MAX_N, allocate
a small workspace a launch, from the graph's pool there). The functional forms are
differentiable (triton_impl.backward); the in-place one refuses inputs that require grad.

Layers, each importing only those before it: kernels.py (the @triton.jit kernels),
configs.py (typed launch configs and the rules), launch.py (one launch planned for either
op), eager.py (the eager fast path), and this file. Semantics, precision and accepted
input: rmsnorm_api; the kernels' parallelisation: kernels.py.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch._subclasses.fake_tensor import is_fake

from rmsnorm_api import (
    DEFAULT_EPS,
    RMSNormModule,
    bypass_ok,
    call_op,
    check_forced_config_grad,
    check_fused_inputs,
    check_in_place,
    check_inputs,
    check_out,
    head_rows,
)
from triton_impl.configs import Config
from triton_impl.eager import HOST, eager_forward
from triton_impl.kernels import INTERPRET
from triton_impl.launch import Quant, has_work, launch, op, plan, takes_heads

_IMPL = "triton_impl.rms_norm"
_FUSED = "triton_impl.fused_add_rms_norm"
_FUSED_ = "triton_impl.fused_add_rms_norm_"


def _run(
    ins: tuple,
    weight,
    eps,
    outs: tuple,
    cfg: Optional[Config] = None,
    weight_offset: float = 0.0,
    quant: Optional[Quant] = None,
) -> None:
    """The forward op of ins (x, or x and residual) into outs (checked by the caller); no
    launch for an empty x.

    Traced (fake tensors: torch.compile's view of the op's body), outputs that are also
    inputs (the in-place fused add, out=x) are written to new tensors and copied back:
    given one tensor as two arguments of a Triton kernel, Inductor's functional form of the
    kernel can write y into a clone of x and never copy it back (the split kernel, torch
    2.11 on the H200), and a compiled out=x or in-place call would leave x as it was.
    quant: y quantised (triton_impl.quant's ops; y a new fp8 tensor)."""
    if not has_work(ins[0]):
        return
    op_name = "rms_norm" if len(ins) == 1 else "fused_add_rms_norm"
    if op_name == "rms_norm" and weight is not None and weight.dim() == 2:
        if not takes_heads(ins[0], cfg, weight):
            # a weight row a head on rows the heads kernel does not take: each head's rows
            # with its row (H launches)
            for h in range(weight.shape[0]):
                o = outs[0][..., h, :]
                launch(
                    plan(op_name, (ins[0][..., h, :],), weight[h], eps, (o,), cfg, weight_offset)
                )
            return
    if op_name == "rms_norm" and head_rows(outs[0]) is not None and not takes_heads(ins[0], cfg):
        # out=x on head rows the heads kernel does not take (wider than its tile, or a
        # forced config): normalised into a new tensor, then copied into x
        fresh = torch.empty(outs[0].shape, dtype=outs[0].dtype, device=outs[0].device)
        launch(plan(op_name, ins, weight, eps, (fresh,), cfg, weight_offset))
        outs[0].copy_(fresh)
        return
    if any(o is i for o in outs for i in ins) and is_fake(ins[0]):
        fresh = tuple(torch.empty_like(o) for o in outs)
        launch(plan(op_name, ins, weight, eps, fresh, cfg, weight_offset, quant))
        for o, f in zip(outs, fresh, strict=True):
            o.copy_(f)
        return
    launch(plan(op_name, ins, weight, eps, outs, cfg, weight_offset, quant))


def _fused_outputs(x, residual) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return y, torch.empty(x.shape, dtype=residual.dtype, device=x.device)


def _check_fused(x, residual, weight, eps, impl: str, weight_offset=0.0) -> None:
    check_fused_inputs(x, residual, weight, eps, weight_offset, allow_cpu=INTERPRET, impl=impl)


@op("triton_impl::rms_norm", mutates_args=())
def _rms_norm_op(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, weight_offset: float = 0.0
) -> torch.Tensor:
    check_inputs(x, weight, eps, weight_offset, allow_cpu=INTERPRET, impl=_IMPL)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run((x,), weight, eps, (y,), weight_offset=weight_offset)
    return y


@op("triton_impl::rms_norm_out", mutates_args={"out"})
def _rms_norm_out_op(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    weight_offset: float = 0.0,
) -> None:
    check_inputs(x, weight, eps, weight_offset, allow_cpu=INTERPRET, impl=_IMPL)
    check_out(out, x, weight, impl=_IMPL)
    _run((x,), weight, eps, (out,), weight_offset=weight_offset)


@op("triton_impl::fused_add_rms_norm", mutates_args=())
def _fused_add_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_fused(x, residual, weight, eps, _FUSED, weight_offset)
    outs = _fused_outputs(x, residual)
    _run((x, residual), weight, eps, outs, weight_offset=weight_offset)
    return outs


@op("triton_impl::fused_add_rms_norm_", mutates_args={"x", "residual"})
def _fused_add_in_place_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    weight_offset: float = 0.0,
) -> None:
    _check_fused(x, residual, weight, eps, _FUSED_, weight_offset)
    check_in_place(x, residual, weight, impl=_FUSED_)
    _run((x, residual), weight, eps, (x, residual), weight_offset=weight_offset)


# Nested tensors stop at their autograd key, which rms_norm's ops have no kernel for: there
# the checks name x instead of the dispatcher's "could not run" (as on the CUDA side).
_NESTED_KEY = "AutogradNestedTensor"
_NESTED = torch.library.Library("triton_impl", "IMPL")
_NESTED.impl(
    "rms_norm", lambda x, w, eps, offset=0.0: check_inputs(x, w, eps, impl=_IMPL), _NESTED_KEY
)
_NESTED.impl(
    "rms_norm_out",
    lambda out, x, w, eps, offset=0.0: check_inputs(x, w, eps, impl=_IMPL),
    _NESTED_KEY,
)


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    out: Optional[torch.Tensor] = None,
    weight_offset: float = 0.0,
) -> torch.Tensor:
    """RMSNorm over x's last dim with the Triton kernel; semantics as in rmsnorm_api.

    Returns a new contiguous tensor of x's shape and dtype, or writes into ``out`` (a
    contiguous tensor of x's shape, dtype and device) and returns it. weight_offset: added
    to the weight in fp32 (Gemma's 1 + w: 1.0). Raises TypeError/ValueError naming the
    argument for unsupported input.
    """
    # the fast paths: no out=, and nothing the dispatcher's keys above the op would do; a
    # plan kept in C++ first (None: a miss, or not a plain eager call; it keeps plans of no
    # offset). Dynamo folds is_compiling and never traces the entry point.
    if out is None and not INTERPRET and type(weight_offset) is float:
        if HOST is not None and not weight_offset and not torch.compiler.is_compiling():
            y = HOST.triton_rms_norm(x, weight, eps)
            if y is not None:
                return y
        if bypass_ok(x, weight):
            return eager_forward(x, None, weight, eps, _IMPL, weight_offset)
    ops = torch.ops.triton_impl
    return call_op(ops.rms_norm, ops.rms_norm_out, x, weight, eps, out, weight_offset,
                   impl=_IMPL, allow_cpu=INTERPRET)  # fmt: skip


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, residual_out) = (RMSNorm(x + residual), x + residual); see the module docstring.
    Raises TypeError/ValueError naming the argument for unsupported input."""
    # residual=None is refused by the checks (bypass_ok takes None for an absent tensor, and
    # eager_forward would run rms_norm)
    if not INTERPRET and residual is not None and type(weight_offset) is float:
        if HOST is not None and not weight_offset and not torch.compiler.is_compiling():
            outs = HOST.triton_fused_add_rms_norm(x, residual, weight, eps)
            if outs is not None:
                return outs
        if bypass_ok(x, residual, weight):
            return eager_forward(x, residual, weight, eps, _FUSED, weight_offset)
    _check_fused(x, residual, weight, eps, _FUSED, weight_offset)
    return torch.ops.triton_impl.fused_add_rms_norm(x, residual, weight, float(eps),
                                                    float(weight_offset))  # fmt: skip


def fused_add_rms_norm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    weight_offset: float = 0.0,
) -> None:
    """In place: residual <- x + residual, x <- RMSNorm(residual), as vLLM's op. Raises
    TypeError/ValueError naming the argument for unsupported input (x and residual must
    view as rows in place and not overlap)."""
    _check_fused(x, residual, weight, eps, _FUSED_, weight_offset)
    check_in_place(x, residual, weight, impl=_FUSED_)
    torch.ops.triton_impl.fused_add_rms_norm_(x, residual, weight, float(eps),
                                              float(weight_offset))  # fmt: skip


def _forced(cfg: Union[Config, dict], x: torch.Tensor, fn: str) -> Config:
    return Config.forced(cfg, x.shape[-1], x.element_size(), fn)


def rms_norm_with_config(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    cfg: Union[Config, dict],
    *,
    weight_offset: float = 0.0,
) -> torch.Tensor:
    """rms_norm with a forced launch config (a triton_impl.configs.Config, or its as_dict()
    form), for sweeps; same result. ValueError names a field no kernel can run."""
    check_inputs(x, weight, eps, weight_offset, allow_cpu=INTERPRET, impl=_IMPL)
    check_forced_config_grad("triton_impl.rms_norm_with_config", x=x, weight=weight)
    cfg = _forced(cfg, x, "rms_norm_with_config")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run((x,), weight, float(eps), (y,), cfg, float(weight_offset))
    return y


def fused_add_rms_norm_with_config(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    cfg: Union[Config, dict],
    *,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fused_add_rms_norm with a forced launch config, as rms_norm_with_config."""
    _check_fused(x, residual, weight, eps, _FUSED, weight_offset)
    check_forced_config_grad(
        "triton_impl.fused_add_rms_norm_with_config", x=x, residual=residual, weight=weight
    )
    cfg = _forced(cfg, x, "fused_add_rms_norm_with_config")
    outs = _fused_outputs(x, residual)
    _run((x, residual), weight, float(eps), outs, cfg, float(weight_offset))
    return outs


_GPU_ONLY = " (kernel_info reads a compiled GPU kernel's metadata; the interpreter compiles none)"


def kernel_info(x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> dict:
    """The compiled kernel rms_norm runs for x (GPU only): its name, the launch config it
    was planned with (the latency rule included), registers and spills a thread, warps and
    shared memory, from Triton's metadata."""
    check_inputs(x, weight, DEFAULT_EPS, impl="triton_impl.kernel_info", device_hint=_GPU_ONLY)
    if x.device.type != "cuda":
        raise ValueError(f"triton_impl.kernel_info: x is on device '{x.device}'; expected a"
                         f" CUDA tensor{_GPU_ONLY}")  # fmt: skip
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    p = plan("rms_norm", (x,), weight, DEFAULT_EPS, (y,))
    compiled = p.kernel.warmup(*p.args, grid=p.grid, **p.meta)
    init = getattr(compiled, "_init_handles", None)
    if init is not None:  # registers and spills are read when the binary is loaded
        init()
    md = compiled.metadata
    config = p.cfg.as_dict()
    if "WAIT" in p.meta:  # the sharded kernel's schedule as launched (launch.wait_if_resident)
        config.update(wait=p.meta["WAIT"], reload=p.meta["RELOAD"])
    return dict(
        name=getattr(md, "name", p.kernel.__name__),
        config=config,
        grid=list(p.grid),
        n_regs=getattr(compiled, "n_regs", None),
        n_spills=getattr(compiled, "n_spills", None),
        num_warps=getattr(md, "num_warps", None),
        shared_bytes=getattr(md, "shared", None),
    )


class RMSNorm(RMSNormModule):
    """torch.nn.RMSNorm drop-in (1-D normalized_shape) running the Triton kernel."""

    _fn = staticmethod(rms_norm)
    _fused_fn = staticmethod(fused_add_rms_norm)
