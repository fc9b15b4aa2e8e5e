"""The one definition of a correct RMSNorm forward, of the fused residual add before it, and
of both ops' gradients.

fp32 math on upcast inputs, one cast at the end:
    y = (x.float() * rsqrt(mean(x.float()**2, -1) + eps)) * w  ->  x.dtype
w the weight in fp32 plus weight_offset (added in fp32, as Gemma's 1 + w).
Gradients: the forward's autograd in float64 (rms_norm_grads_ref,
fused_add_rms_norm_grads_ref), each cast once to its input's dtype.
Tests, the validation suite and the benchmark all import this; nothing re-implements it.
The benchmark's eager baseline is this very function (harness.impls), and torch.compile's
baseline compiles it.
"""

from __future__ import annotations

from typing import Optional

import torch


def _weight(weight: torch.Tensor, offset: float) -> torch.Tensor:
    """The weight as the forward scales by it: fp32, the offset added there (none added for
    0.0, which would turn a -0.0 weight into +0.0)."""
    w = weight.float()
    return w + offset if offset else w


def rms_norm_ref(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * _weight(weight, weight_offset)
    return y.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, residual_out): residual_out = x + residual, an fp32 add rounded once to
    residual's dtype; y, in x's dtype, is RMSNorm of residual_out (fp32 math, one cast), so
    the fused op equals the unfused ``r = x + r; y = rms_norm(r)``."""
    residual_out = (x.float() + residual.float()).to(residual.dtype)
    # rms_norm_ref rounds to residual_out's dtype, which is x's or fp32 (exact): one rounding
    y = rms_norm_ref(residual_out, weight, eps, weight_offset)
    return y.to(x.dtype), residual_out


def fused_add_rms_norm_ref_of_fp32_sum(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, residual_out) as kernels that normalise the sum before rounding it compute them
    (QuACK's and FlashInfer's fused add): residual_out as fused_add_rms_norm_ref's, y the
    RMSNorm of the fp32 sum itself, one cast. The two references' y differ by the sum's
    rounding, up to an ulp of it besides y's own, past TOL where rows are many: such a peer
    is checked against its own definition, within the same TOL."""
    s = x.float() + residual.float()
    return rms_norm_ref(s, weight, eps, weight_offset).to(x.dtype), s.to(residual.dtype)


def norm64(
    s: torch.Tensor, weight: Optional[torch.Tensor], eps: float, weight_offset: float = 0.0
) -> torch.Tensor:
    """The forward in the inputs' own dtype (float64 for the gradient references and
    gradcheck): no casts, so autograd differentiates exactly the formula."""
    y = s * torch.rsqrt(s.square().mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * (weight + weight_offset)


def rms_norm_grads_ref(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    dy: torch.Tensor,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(dx, dweight) of rms_norm at (x, weight) for the output gradient dy: autograd of the
    forward in float64, dx cast to x's dtype, dweight to weight's (None without a weight)."""
    x64 = x.detach().double().requires_grad_()
    w64 = None if weight is None else weight.detach().double().requires_grad_()
    wrt = (x64,) if w64 is None else (x64, w64)
    grads = torch.autograd.grad(norm64(x64, w64, eps, weight_offset), wrt, dy.double())
    dw = None if weight is None else grads[1].to(weight.dtype)
    return grads[0].to(x.dtype), dw


def fused_add_rms_norm_grads_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    dy: torch.Tensor,
    d_residual_out: Optional[torch.Tensor] = None,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(dx, dresidual, dweight) of the fused add for the gradients of y (dy) and of
    residual_out (None: zero). y is RMSNorm of the stored residual_out, so the gradient
    reaching the sum is the norm's plus residual_out's own, and it reaches x and residual
    alike (the add's rounding passes it straight through); float64, each cast to its
    input's dtype."""
    s = (x.float() + residual.float()).to(residual.dtype)
    s64 = s.detach().double().requires_grad_()
    w64 = None if weight is None else weight.detach().double().requires_grad_()
    wrt = (s64,) if w64 is None else (s64, w64)
    grads = torch.autograd.grad(norm64(s64, w64, eps, weight_offset), wrt, dy.double())
    g = grads[0] if d_residual_out is None else grads[0] + d_residual_out.double()
    dw = None if weight is None else grads[1].to(weight.dtype)
    return g.to(x.dtype), g.to(residual.dtype), dw


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

#: Tolerances for gradients against the float64 reference, per gradient dtype: rtol as
#: TOL's (one ulp of the format; fp32: the order of the fp32 row reductions, and for dweight
#: of the sum over rows), atol relative to the largest reference gradient
#: (grad_close), since dx's terms cancel and its small entries carry the fp32 error of
#: the large ones.
GRAD_TOL = {
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float16: dict(rtol=2.0**-10, atol=2.0**-11),
    torch.bfloat16: dict(rtol=2.0**-7, atol=2.0**-8),
}


def grad_close(
    got: torch.Tensor, want: torch.Tensor, what: str = "gradient", scale: Optional[float] = None
) -> None:
    """Assert a gradient matches the reference's within GRAD_TOL, atol scaled by ``scale``
    (default: the reference's largest entry); same dtype and shape first. dx's scale is
    that of its terms (grad_scale): where they cancel (rows of a few elements) the result
    is far smaller than the fp32 error of the terms."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    tol = GRAD_TOL[want.dtype]
    if scale is None:
        scale = float(want.detach().abs().max()) if want.numel() else 1.0
    torch.testing.assert_close(
        got.float(), want.float(), rtol=tol["rtol"], atol=tol["atol"] * max(scale, 1e-30),
        msg=lambda m: f"{what}: {m}",
    )  # fmt: skip


def grad_scale(s: torch.Tensor, weight: Optional[torch.Tensor], dy: torch.Tensor) -> float:
    """The size of ds's terms, max |dy * weight| * max rstd, for grad_close's atol."""
    s64 = s.detach().double()
    rstd = torch.rsqrt(s64.square().mean(dim=-1) + 1e-6).max() if s.numel() else 1.0
    g = dy.detach().double() * (1.0 if weight is None else weight.detach().double())
    return float(g.abs().max() * rstd) if g.numel() else 1.0
