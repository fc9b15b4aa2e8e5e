"""The Triton forward ops with a quantised output (fp8, for inference: no gradients),
registered as ``triton_impl::rms_norm_quant``, ``fused_add_rms_norm_quant`` and
``fused_add_rms_norm_quant_`` (residual's mutation declared), and their public functions:
what each computes and accepts, rmsnorm_api.quant. The kernels: the fused and looped
forward kernels with the quantising epilogue (kernels._store_y; configs.quant_config).
"""

from __future__ import annotations

from typing import Optional

import torch

from rmsnorm_api import check_call, empty_outputs
from rmsnorm_api.quant import quant_functions
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
    y, scales = empty_outputs("fused_add_rms_norm_quant_", **values)
    _quantised((x, residual), (y, residual, scales), weight, eps, scale, group_size, scale_ub,
               weight_offset)  # fmt: skip
    return y, scales


rms_norm_quant, fused_add_rms_norm_quant, fused_add_rms_norm_quant_ = quant_functions(
    "triton_impl", allow_cpu=INTERPRET
)
