"""The one definition of a correct RMSNorm forward, and of the fused residual add before it.

fp32 math on upcast inputs, one cast at the end:
    y = (x.float() * rsqrt(mean(x.float()**2, -1) + eps)) * weight.float()  ->  x.dtype
Tests, the validation suite and the benchmark all import this; nothing re-implements it.
The benchmark's eager baseline is this very function (harness.impls), and torch.compile's
baseline compiles it.
"""

from __future__ import annotations

from typing import Optional

import torch


def rms_norm_ref(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6
) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, residual_out): residual_out = x + residual, an fp32 add rounded once to
    residual's dtype; y, in x's dtype, is RMSNorm of residual_out (fp32 math, one cast), so
    the fused op equals the unfused ``r = x + r; y = rms_norm(r)``."""
    residual_out = (x.float() + residual.float()).to(residual.dtype)
    rf = residual_out.float()
    y = rf * torch.rsqrt(rf.square().mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype), residual_out


#: Tolerances for comparing an implementation with rms_norm_ref, per output dtype.
#: - float16 / bfloat16: rtol is one ulp of the output format (2^-10, 2^-7). Two correct
#:   implementations hold the same fp32 value up to reduction order, and its final rounding
#:   can land on neighbouring representable values; anything past one ulp is a real error.
#:   atol covers outputs that round to subnormals.
#: - float32: the only difference is the order of the fp32 reduction and rsqrt's last
#:   bits; the error grows like sqrt(N) ulps in the mean, so 1e-5 relative holds up to
#:   N = 262144 with margin, and is two orders tighter than any precision bug.
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-5, rtol=2.0**-10),
    torch.bfloat16: dict(atol=1e-5, rtol=2.0**-7),
}
