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
from rmsnorm_api.quant import quant_functions, quant_values, returned
from triton_impl.configs import Config
from triton_impl.eager import eager_quant
from triton_impl.kernels import INTERPRET
from triton_impl.launch import Quant, op
from triton_impl.ops import _run

_IMPL = "triton_impl.rms_norm_quant"
_FUSED = "triton_impl.fused_add_rms_norm_quant"
_FUSED_ = "triton_impl.fused_add_rms_norm_quant_"


def _body(op: str, impl: str, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
          weight_offset, cfg=None) -> tuple:  # fmt: skip
    """Each op's body: its arguments checked, its outputs allocated (the description's) and
    written, y quantised; the in-place form writes residual_out into the residual and
    returns (y, scales). cfg: a forced launch config (the fused or looped kernel, block_n
    whole groups; Config.forced checks its fields, kernel_for the rest), else the rule's."""
    values = quant_values(op, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                          weight_offset)  # fmt: skip
    check_call(op, impl, values, allow_cpu=INTERPRET)
    if cfg is not None:
        cfg = Config.forced(cfg, x.shape[-1], x.element_size(), impl)
    outs = empty_outputs(op, **values)
    ins = (x,) if residual is None else (x, residual)
    # the kernels' outputs: y and residual_out (the residual itself in place); the scales last
    written = (outs[0], residual, outs[1]) if op.endswith("_") else outs
    q = Quant(scale, group_size, scale_ub, written[-1])
    _run(ins, weight, eps, written[:-1], cfg, weight_offset, quant=q)
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


def _with_config(op: str, x, residual, weight, eps, cfg, scale, group_size, scale_ub, out_dtype,
                 weight_offset) -> tuple:  # fmt: skip
    outs = _body(op, f"triton_impl.{op}_with_config", x, residual, weight, float(eps), scale,
                 group_size, scale_ub, out_dtype, float(weight_offset), cfg)  # fmt: skip
    return returned(outs, scale)


def rms_norm_quant_with_config(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    cfg,
    *,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_quant with a forced launch config (a Config of the fused or looped kernel,
    block_n a whole number of groups, or its as_dict() form), for sweeps; the same result
    as rms_norm_quant. ValueError names a field no kernel can run."""
    return _with_config("rms_norm_quant", x, None, weight, eps, cfg, scale, group_size,
                        scale_ub, out_dtype, weight_offset)  # fmt: skip


def fused_add_rms_norm_quant_with_config(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    cfg,
    *,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fused_add_rms_norm_quant with a forced launch config, as rms_norm_quant_with_config."""
    return _with_config("fused_add_rms_norm_quant", x, residual, weight, eps, cfg, scale,
                        group_size, scale_ub, out_dtype, weight_offset)  # fmt: skip
