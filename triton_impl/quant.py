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
from rmsnorm_api.quant import quant_functions, quant_values
from triton_impl.eager import eager_quant
from triton_impl.kernels import INTERPRET
from triton_impl.launch import Quant, op
from triton_impl.ops import _run

_IMPL = "triton_impl.rms_norm_quant"
_FUSED = "triton_impl.fused_add_rms_norm_quant"
_FUSED_ = "triton_impl.fused_add_rms_norm_quant_"


def _body(op: str, impl: str, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
          weight_offset) -> tuple:  # fmt: skip
    """Each op's body: its arguments checked, its outputs allocated (the description's) and
    written, y quantised; the in-place form writes residual_out into the residual and
    returns (y, scales)."""
    values = quant_values(op, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                          weight_offset)  # fmt: skip
    check_call(op, impl, values, allow_cpu=INTERPRET)
    outs = empty_outputs(op, **values)
    ins = (x,) if residual is None else (x, residual)
    # the kernels' outputs: y and residual_out (the residual itself in place); the scales last
    written = (outs[0], residual, outs[1]) if op.endswith("_") else outs
    q = Quant(scale, group_size, scale_ub, written[-1])
    _run(ins, weight, eps, written[:-1], weight_offset=weight_offset, quant=q)
    return outs


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
    return _body("rms_norm_quant", _IMPL, x, None, weight, eps, scale, group_size, scale_ub,
                 out_dtype, weight_offset)  # fmt: skip


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
    return _body("fused_add_rms_norm_quant", _FUSED, x, residual, weight, eps, scale,
                 group_size, scale_ub, out_dtype, weight_offset)  # fmt: skip


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
    return _body("fused_add_rms_norm_quant_", _FUSED_, x, residual, weight, eps, scale,
                 group_size, scale_ub, out_dtype, weight_offset)  # fmt: skip


rms_norm_quant, fused_add_rms_norm_quant, fused_add_rms_norm_quant_ = quant_functions(
    "triton_impl", allow_cpu=INTERPRET, eager=None if INTERPRET else eager_quant
)
