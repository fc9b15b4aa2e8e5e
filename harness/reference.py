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

from rmsnorm_api import fp8_min_scale


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


def quantise_ref(
    y: torch.Tensor,
    out_dtype: torch.dtype,
    scale: Optional[torch.Tensor] = None,
    group_size: int = 0,
    scale_ub: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scales, v) of fp32 y quantised as the quantised ops define it: v = y / s saturated
    to the dtype's max, q = v rounded to nearest even in out_dtype (torch's cast); s the
    static scale, or a row's (group's of group_size columns) max|y| / max, clamped above by
    scale_ub and below by rmsnorm_api.fp8_min_scale; scales as the ops return them (the
    static scale as given; dynamic ones x's shape with a last dimension of 1 or N /
    group_size). v, fp32, is what q_close judges ties by."""
    top = torch.finfo(out_dtype).max
    if scale is not None:
        s = scale.float().reshape(())
        v = (y / s).clamp(-top, top)
        return v.to(out_dtype), scale, v
    g = group_size or y.shape[-1]
    yg = y.unflatten(-1, (-1, g))
    amax = yg.abs().amax(dim=-1, keepdim=True)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub.float().reshape(()))
    s = (amax / top).clamp(min=fp8_min_scale(out_dtype))
    v = (yg / s).clamp(-top, top).flatten(-2)
    return v.to(out_dtype), s.squeeze(-1), v


def rms_norm_quant_ref(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    **quant,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scales, v): the fp32 norm (rms_norm_ref's, before its cast) quantised
    (quantise_ref; quant: its keywords)."""
    y = rms_norm_ref(x.float(), weight, eps, weight_offset)
    return quantise_ref(y, **quant)


def fused_add_rms_norm_quant_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    **quant,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, residual_out, scales, v): residual_out as fused_add_rms_norm_ref's, the fp32 norm
    of it quantised."""
    residual_out = (x.float() + residual.float()).to(residual.dtype)
    q, scales, v = rms_norm_quant_ref(residual_out, weight, eps, weight_offset, **quant)
    return q, residual_out, scales, v


#: How far (relative) a kernel's fp32 y / s may lie from the reference's: y's own TOL in
#: fp32 (the order of the row's sum), the scale's rounding and the product by its inverse
QUANT_REL = 4e-5


def q_close(
    got: torch.Tensor,
    want: torch.Tensor,
    v: torch.Tensor,
    what: str = "y",
    rel: float = QUANT_REL,
) -> None:
    """Assert quantised outputs equal the reference's (quantise_ref's q) bit for bit (NaN
    where it has NaN, a zero's sign as its), except where the reference's fp32 value v
    lies within rel of a tie between two neighbouring fp8 values, where either neighbour
    is correct."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, (
        f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    g, w = got.float(), want.float()
    bad = (g != w) & ~(g.isnan() & w.isnan())
    bad |= (g == 0) & (w == 0) & (g.signbit() != w.signbit())  # -0 is not +0
    if not bad.any():
        return
    vb, gb, wb = v[bad].float(), g[bad], w[bad]
    # a tie: both values equally far from v, up to v's own uncertainty
    near_tie = ((gb - vb).abs() - (wb - vb).abs()).abs() <= 2 * rel * vb.abs() + 1e-30
    # and neighbours: nothing of the format lies strictly between them
    lo, hi = torch.minimum(gb, wb), torch.maximum(gb, wb)
    mid = ((lo + hi) / 2).to(got.dtype).float()
    neighbours = (mid == lo) | (mid == hi)
    ok = near_tie & neighbours
    if not ok.all():
        i = (~ok).nonzero()[0]
        raise AssertionError(
            f"{what}: {int((~ok).sum())} of {got.numel()} elements differ beyond a tie, first"
            f" got {float(gb[i])} want {float(wb[i])} (fp32 value {float(vb[i])})"
        )
