"""A backend's public functions of the forward with a quantised output (fp8, for inference:
no gradients), over its ops ``<ns>::rms_norm_quant``, ``fused_add_rms_norm_quant`` and
``fused_add_rms_norm_quant_``:

    rms_norm_quant(x, weight=None, eps=1e-6, *, scale=None, group_size=0, scale_ub=None,
                   out_dtype=torch.float8_e4m3fn, weight_offset=0.0) -> (y, scales)
    fused_add_rms_norm_quant(x, residual, weight=None, eps=1e-6, *, ...)
        -> (y, residual_out, scales)
    fused_add_rms_norm_quant_(x, residual, weight=None, eps=1e-6, *, ...) -> (y, scales)
        (residual_out into residual; x is read only)

y = sat(RMSNorm(x) / s) rounded to nearest even in out_dtype (float8_e4m3fn or
float8_e5m2), the norm computed as rms_norm's (fp32; one rounding, the quantisation's) and
written in the same pass, so y is never stored in 16 bits first. s is:
- the caller's static scale (``scale``: one fp32 element, positive and finite; returned as
  ``scales`` as given);
- dynamic, a scale a row (group_size 0): max|y_row| / max(out_dtype), clamped above by
  ``scale_ub`` where given and below by 1 / (max(out_dtype) * 512) (rmsnorm_api.
  fp8_min_scale: a row of zeros); ``scales`` fp32 of x's shape with a last dimension of 1;
- dynamic, a scale a group of ``group_size`` consecutive columns (a power of two in
  GROUP_SIZES dividing N: 128 for DeepSeek-V3's blockwise GEMMs), likewise; ``scales`` fp32
  of x's shape with a last dimension of N / group_size.
The fused add stores residual_out as fused_add_rms_norm does and quantises the norm of it.
The scales' values are read (a GPU tensor: one synchronisation) once for each version of
the tensor, outside tracing and CUDA-graph capture (rmsnorm_api.check_scale_value).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Optional

import torch

from rmsnorm_api import (
    _VALUES_CHECKED,
    DEFAULT_EPS,
    EPS_MAX,
    EPS_MIN,
    bypass_ok,
    check_call,
    check_scale_value,
    tensor_key,
)

#: keys (quant_key) of eager calls whose arguments passed check_call: a later call of the
#: same key needs only its eps's range and its scales' values checked (the rest of the
#: rules read only what the key holds)
_CHECKED: set = set()
_MAX_CHECKED = 4096


def quant_key(op: str, x, residual, weight, scale, group_size, scale_ub, out_dtype,
              weight_offset) -> tuple:  # fmt: skip
    """What a functional quantised call's checks (and Triton's plan) depend on besides the
    tensors' data and eps: the op, each tensor's tensor_key, the group, the fp8 dtype and
    the weight offset."""
    tensors = (x, residual, weight, scale, scale_ub)
    return (op, *map(tensor_key, tensors), group_size, out_dtype, weight_offset)


def quant_values(op: str, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                 weight_offset) -> dict:  # fmt: skip
    """A quantised op's arguments by name, as check_call and empty_outputs take them (the
    fused add's with its residual, None included: the checks name it)."""
    values = dict(x=x, weight=weight, eps=eps, scale=scale, group_size=group_size,
                  scale_ub=scale_ub, out_dtype=out_dtype, weight_offset=weight_offset)  # fmt: skip
    if op != "rms_norm_quant":
        values["residual"] = residual
    return values


def returned(outs: tuple, scale: Optional[torch.Tensor]) -> tuple:
    """An op's outputs as the public functions return them: a static scale as given in
    place of the op's empty scales."""
    return (*outs[:-1], scale if scale is not None else outs[-1])


def quant_functions(
    ns: str, *, allow_cpu: bool = False, eager: Optional[Callable] = None
) -> tuple[Callable, Callable, Callable]:
    """rms_norm_quant, fused_add_rms_norm_quant and fused_add_rms_norm_quant_ over the
    ops of namespace ns: the arguments checked (check_call: the dispatcher would refuse a
    wrong type in its own words), the op run, and a static scale returned as given.
    allow_cpu: the backend runs on CPU tensors (the Triton interpreter).

    An eager call of a functional form on plain CUDA tensors (bypass_ok) whose key
    (quant_key) passed the checks before checks only eps's range and the scales' values,
    and goes to ``eager(key, op, x, residual, weight, eps, scale, group_size, scale_ub,
    out_dtype, weight_offset)`` where the backend has one (Triton's plan cache), else to
    the op; the in-place form, whose memory rules a key cannot imply, is checked whole."""
    ops = getattr(torch.ops, ns)

    def checked_key(op: str, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                    weight_offset) -> Optional[tuple]:  # fmt: skip
        """The call's quant_key where it may take the checked-key path (an eager functional
        call on plain CUDA tensors, its scalars of their own types), else None."""
        if not (
            op != "fused_add_rms_norm_quant_"
            and type(eps) is float
            and type(group_size) is int
            and type(weight_offset) is float
            and bypass_ok(x, residual, weight, scale, scale_ub)
        ):
            return None
        return quant_key(op, x, residual, weight, scale, group_size, scale_ub, out_dtype,
                         weight_offset)  # fmt: skip

    def run(op: str, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
            weight_offset) -> tuple:  # fmt: skip
        impl = f"{ns}.{op}"
        key = checked_key(op, x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                          weight_offset)  # fmt: skip
        if key is not None and key in _CHECKED and EPS_MIN <= eps <= EPS_MAX:
            for name, t in (("scale", scale), ("scale_ub", scale_ub)):
                if t is not None:
                    check_scale_value(t, name, impl)
        else:
            values = quant_values(op, x, residual, weight, eps, scale, group_size, scale_ub,
                                  out_dtype, weight_offset)  # fmt: skip
            check_call(op, impl, values, allow_cpu=allow_cpu)
            if key is not None:
                if len(_CHECKED) >= _MAX_CHECKED:
                    _CHECKED.clear()
                _CHECKED.add(key)
        if key is not None and eager is not None:
            outs = eager(key, op, x, residual, weight, eps, scale, group_size, scale_ub,
                         out_dtype, weight_offset)  # fmt: skip
            return returned(outs, scale)
        head = (x,) if op == "rms_norm_quant" else (x, residual)
        call = functools.partial(getattr(ops, op), *head, weight, float(eps), scale, group_size,
                                 scale_ub, out_dtype, float(weight_offset))  # fmt: skip
        if torch.compiler.is_compiling():  # no value is read there
            return returned(call(), scale)
        checked = _VALUES_CHECKED.set(True)  # the op's own check reads no scale again
        try:
            return returned(call(), scale)
        finally:
            _VALUES_CHECKED.reset(checked)

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
        """(y, scales): RMSNorm of x quantised to out_dtype (rmsnorm_api.quant). Raises
        TypeError/ValueError naming the argument for unsupported input."""
        return run("rms_norm_quant", x, None, weight, eps, scale, group_size, scale_ub,
                   out_dtype, weight_offset)  # fmt: skip

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
        """(y, residual_out, scales): residual_out = x + residual as fused_add_rms_norm's,
        y its RMSNorm quantised as rms_norm_quant's."""
        return run("fused_add_rms_norm_quant", x, residual, weight, eps, scale, group_size,
                   scale_ub, out_dtype, weight_offset)  # fmt: skip

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
        return run("fused_add_rms_norm_quant_", x, residual, weight, eps, scale, group_size,
                   scale_ub, out_dtype, weight_offset)  # fmt: skip

    fns = (rms_norm_quant, fused_add_rms_norm_quant, fused_add_rms_norm_quant_)
    for fn in fns:
        fn.__module__, fn.__qualname__ = ns, fn.__name__
    return fns
