"""The Triton fused residual add + RMSNorm ops.

    fused_add_rms_norm(x, residual, weight=None, eps=1e-6) -> (y, residual_out)
    fused_add_rms_norm_(x, residual, weight=None, eps=1e-6) -> None   (y into x,
                                                                      residual_out into residual)

residual_out = x + residual (an fp32 add rounded once to residual's dtype); y, in x's
dtype, is RMSNorm of residual_out, so the op equals the unfused ``r = x + r; y =
rms_norm(r)`` while reading x and residual once and writing y and residual_out once.
residual may be x's dtype or float32 (an fp32 residual stream beside 16-bit activations).
Registered as ``triton_impl::fused_add_rms_norm`` and the in-place
``triton_impl::fused_add_rms_norm_`` (its mutation declared in the schema, so it captures
in CUDA graphs with no output allocated; the sharded kernel's rows, past FUSED_MAX_N,
allocate a small workspace a launch, from the graph's pool there). Kernels: kernels.py;
config rule: configs.py. The
functional form is differentiable (triton_impl.backward); the in-place one refuses inputs
that require grad.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from rmsnorm_api import DEFAULT_EPS, bypass_ok, check_fused_inputs, check_in_place
from triton_impl.configs import Config
from triton_impl.eager import eager_fused_add
from triton_impl.kernels import INTERPRET
from triton_impl.launch import has_work, launch, op, plan_fused_add

_IMPL = "triton_impl.fused_add_rms_norm"
_IMPL_ = "triton_impl.fused_add_rms_norm_"


def _check(x, residual, weight, eps, impl: str) -> None:
    check_fused_inputs(x, residual, weight, eps, allow_cpu=INTERPRET, impl=impl)


@op("triton_impl::fused_add_rms_norm", mutates_args=())
def _fused_add_op(
    x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, residual, weight, eps, _IMPL)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    if has_work(x):
        launch(plan_fused_add(x, residual, weight, eps, y, residual_out))
    return y, residual_out


@op("triton_impl::fused_add_rms_norm_", mutates_args={"x", "residual"})
def _fused_add_in_place_op(
    x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor], eps: float
) -> None:
    _check(x, residual, weight, eps, _IMPL_)
    check_in_place(x, residual, weight, impl=_IMPL_)
    if has_work(x):
        launch(plan_fused_add(x, residual, weight, eps, x, residual))


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, residual_out) = (RMSNorm(x + residual), x + residual); see the module docstring.
    Raises TypeError/ValueError naming the argument for unsupported input."""
    if not INTERPRET and bypass_ok(x, residual, weight):
        return eager_fused_add(x, residual, weight, eps, _IMPL)
    _check(x, residual, weight, eps, _IMPL)
    return torch.ops.triton_impl.fused_add_rms_norm(x, residual, weight, float(eps))


def fused_add_rms_norm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
) -> None:
    """In place: residual <- x + residual, x <- RMSNorm(residual), as vLLM's op. Raises
    TypeError/ValueError naming the argument for unsupported input (x and residual must
    view as rows in place and not overlap)."""
    _check(x, residual, weight, eps, _IMPL_)
    check_in_place(x, residual, weight, impl=_IMPL_)
    torch.ops.triton_impl.fused_add_rms_norm_(x, residual, weight, float(eps))


def fused_add_rms_norm_with_config(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    cfg: Union[Config, dict],
) -> tuple[torch.Tensor, torch.Tensor]:
    """fused_add_rms_norm with a forced launch config (a triton_impl.configs.Config or its
    as_dict() form), for sweeps; same result. ValueError names a field no kernel can run."""
    _check(x, residual, weight, eps, _IMPL)
    cfg = Config.forced(cfg, x.shape[-1], x.element_size(), "fused_add_rms_norm_with_config")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    if has_work(x):
        launch(plan_fused_add(x, residual, weight, float(eps), y, residual_out, cfg))
    return y, residual_out
