"""The Triton forward ops with a quantised output (fp8, for inference: no gradients):

    rms_norm_quant(x, weight=None, eps=1e-6, *, scale=None, group_size=0, scale_ub=None,
                   out_dtype=torch.float8_e4m3fn, weight_offset=0.0) -> (y, scales)
    fused_add_rms_norm_quant(x, residual, weight=None, eps=1e-6, *, ...)
        -> (y, residual_out, scales)
    fused_add_rms_norm_quant_(x, residual, weight=None, eps=1e-6, *, ...) -> (y, scales)
        (residual_out into residual)

y = sat(RMSNorm(x) / s) rounded to nearest even in out_dtype (float8_e4m3fn or
float8_e5m2), the norm computed as rms_norm's (fp32, one rounding at the end: the
quantisation's) and written in the same pass, so y is never stored in 16 bits first. s is:
- the caller's static scale (``scale``: one fp32 element; returned as ``scales`` as given);
- dynamic, a scale a row (group_size 0): max|y_row| / max(out_dtype), clamped above by
  ``scale_ub`` where given and below by 1 / (max(out_dtype) * 512); ``scales`` fp32 of x's
  shape with a last dimension of 1;
- dynamic, a scale a group of ``group_size`` consecutive columns (a power of two in [16,
  1024] dividing N: 128 for DeepSeek-V3's blockwise GEMMs), likewise; ``scales`` fp32 of
  x's shape with a last dimension of N / group_size.
The fused add stores residual_out as fused_add_rms_norm does and quantises the norm of it.
Registered as ``triton_impl::rms_norm_quant``, ``fused_add_rms_norm_quant`` and
``fused_add_rms_norm_quant_`` (residual's mutation declared). Arguments: rmsnorm_api's
rules and its quantised ops' (spec.OPS), the scales' values read once a version of them.
"""

from __future__ import annotations

from typing import Optional

import torch

from rmsnorm_api import DEFAULT_EPS, check_call, check_in_place, empty_outputs
from triton_impl.kernels import INTERPRET
from triton_impl.launch import Quant, op
from triton_impl.ops import _run

_IMPL = "triton_impl.rms_norm_quant"
_FUSED = "triton_impl.fused_add_rms_norm_quant"
_FUSED_ = "triton_impl.fused_add_rms_norm_quant_"


def _quantised(ins: tuple, outs: tuple, weight, eps, scale, group_size, scale_ub,
               weight_offset) -> None:  # fmt: skip
    """Run the forward of ins into outs (y first; the scales last), y quantised."""
    q = Quant(scale, group_size, scale_ub, outs[-1])
    _run(ins, weight, eps, outs[:-1], weight_offset=weight_offset, quant=q)


def _values(x, residual, weight, eps, scale, group_size, scale_ub, out_dtype, weight_offset):
    values = dict(x=x, weight=weight, eps=eps, scale=scale, group_size=group_size,
                  scale_ub=scale_ub, out_dtype=out_dtype, weight_offset=weight_offset)  # fmt: skip
    if residual is not None:
        values["residual"] = residual
    return values


@op("triton_impl::rms_norm_quant", mutates_args=())
def _rms_norm_quant_op(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    values = _values(x, None, weight, eps, scale, group_size, scale_ub, out_dtype, weight_offset)
    check_call("rms_norm_quant", _IMPL, values, allow_cpu=INTERPRET)
    y, scales = empty_outputs("rms_norm_quant", **values)
    _quantised((x,), (y, scales), weight, eps, scale, group_size, scale_ub, weight_offset)
    return y, scales


@op("triton_impl::fused_add_rms_norm_quant", mutates_args=())
def _fused_add_quant_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values = _values(x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset)  # fmt: skip
    check_call("fused_add_rms_norm_quant", _FUSED, values, allow_cpu=INTERPRET)
    outs = empty_outputs("fused_add_rms_norm_quant", **values)
    _quantised((x, residual), outs, weight, eps, scale, group_size, scale_ub, weight_offset)
    return outs


@op("triton_impl::fused_add_rms_norm_quant_", mutates_args={"residual"})
def _fused_add_quant_in_place_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    values = _values(x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset)  # fmt: skip
    check_call("fused_add_rms_norm_quant_", _FUSED_, values, allow_cpu=INTERPRET)
    check_in_place(x, residual, weight, impl=_FUSED_, x_written=False)
    y, scales = empty_outputs("fused_add_rms_norm_quant_", **values)
    _quantised((x, residual), (y, residual, scales), weight, eps, scale, group_size, scale_ub,
               weight_offset)  # fmt: skip
    return y, scales


def _checked(op, impl, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
             weight_offset) -> tuple:  # fmt: skip
    """A public function's arguments, checked (the dispatcher would refuse a wrong type in
    its own words) and in the op's order, the scalars as its schema types them."""
    values = _values(x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset)  # fmt: skip
    check_call(op, impl, values, allow_cpu=INTERPRET)
    head = (x,) if residual is None else (x, residual)
    return (*head, weight, float(eps), scale, group_size, scale_ub, out_dtype,
            float(weight_offset))  # fmt: skip


def _given(scale: Optional[torch.Tensor], scales: torch.Tensor) -> torch.Tensor:
    """The scales a public function returns: the caller's static scale itself, else the
    op's."""
    return scale if scale is not None else scales


def rms_norm_quant(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, scales): RMSNorm of x quantised to out_dtype; see the module docstring. Raises
    TypeError/ValueError naming the argument for unsupported input."""
    y, scales = torch.ops.triton_impl.rms_norm_quant(
        *_checked(
            "rms_norm_quant",
            _IMPL,
            x,
            None,
            weight,
            eps,
            scale,
            group_size,
            scale_ub,
            out_dtype,
            weight_offset,
        )
    )
    return y, _given(scale, scales)


def fused_add_rms_norm_quant(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, residual_out, scales): residual_out = x + residual as fused_add_rms_norm's, y its
    RMSNorm quantised as rms_norm_quant's."""
    y, ro, scales = torch.ops.triton_impl.fused_add_rms_norm_quant(
        *_checked(
            "fused_add_rms_norm_quant",
            _FUSED,
            x,
            residual,
            weight,
            eps,
            scale,
            group_size,
            scale_ub,
            out_dtype,
            weight_offset,
        )
    )
    return y, ro, _given(scale, scales)


def fused_add_rms_norm_quant_(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, scales), residual <- x + residual (vLLM's fused_add_rms_norm with a quantised
    output): x is read only, y a new fp8 tensor."""
    y, scales = torch.ops.triton_impl.fused_add_rms_norm_quant_(
        *_checked(
            "fused_add_rms_norm_quant_",
            _FUSED_,
            x,
            residual,
            weight,
            eps,
            scale,
            group_size,
            scale_ub,
            out_dtype,
            weight_offset,
        )
    )
    return y, _given(scale, scales)
