"""What an op is: how its inputs are made, what is correct, what it moves, who computes it.

An Op is data that flows through the one path every op shares: validation cases and
planned shapes become inputs through ``make_inputs`` (the one input factory: validation,
benchmark, sweep, profile and tests alike), ``reference`` says what is correct (its one
definition lives in harness.reference), ``bytes_moved`` is the bytes model its GB/s are
computed with, and ``registry`` holds its implementations, ours and the baselines, all
called the same way: ``fn(*inputs)``, and ours also ``fn(*inputs, out=...)``.

Adding an op means adding an Op here, its kernels, and its baselines in harness.impls.

rms_norm(x, weight, eps) -> y. Inputs: x ~ randn (the case's fill, layout and dtype),
weight ~ 1 + randn / 2 (x's dtype, fp32, or None), drawn in fp32 on the generator of the
device they are made on and converted once. Bytes model, for every implementation alike:
read x (M*N) + read weight (N) + write y (M*N), each in its own element size. An
implementation that moves more (Liger's rstd row, eager's fp32 temporaries) is still
charged only this, so GB/s compares work done, not traffic generated.

fused_add_rms_norm(x, residual, weight, eps) -> (y, residual_out). Inputs: x and weight
as above, then the residual laid out as x, in x's dtype or fp32 (the case says; planned
benchmark shapes take x's). Bytes model: read x + residual + weight, write y (x's element
size) + residual_out (residual's), the same charge for every implementation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from harness import impls
from harness.cases import Case
from harness.plan import Planned
from harness.reference import fused_add_rms_norm_ref, rms_norm_ref

#: What inputs are made from: a validation case, or a planned benchmark shape.
Spec = Union[Case, Planned]


@dataclass(frozen=True)
class Op:
    name: str  # the records' "op" field
    title: str  # how reports and plots name it
    # (case or planned shape, device, seed) -> the inputs every implementation is called on
    make_inputs: Callable[[Spec, Union[str, torch.device], int], tuple]
    reference: Callable[..., Any]  # reference(*inputs): the one definition of correct
    bytes_moved: Callable[[tuple], int]  # bytes_moved(inputs): the bytes model
    bytes_text: str  # the bytes model in words, for reports
    registry: Callable[..., dict[str, impls.Impl]]  # registry(baselines=False) -> {name: Impl}
    ours: tuple[str, ...]  # the kernels under study, in report order
    baselines: tuple[str, ...]  # what they are compared with, in report order
    # (impl, inputs, reference output) -> our kernels' second form's output (rms_norm:
    # out= into a NaN-poisoned tensor; the fused add: in place), checked like the first
    second_form: Optional[Callable[..., Any]] = None

    @property
    def order(self) -> tuple[str, ...]:
        """Implementation names in the order runs, tables and plots list them."""
        return self.ours + self.baselines


def rms_norm_bytes(m: int, n: int, x_bytes: int, w_bytes: Optional[int] = None) -> int:
    """rms_norm's bytes model: read x + read weight + write y (y has x's element size).

    ``w_bytes`` is the weight's element size, or None when there is no weight.
    """
    if m < 0 or n < 1:
        raise ValueError(f"rms_norm_bytes: shape ({m}, {n}) must have M >= 0 and N >= 1")
    weight = n * w_bytes if w_bytes else 0
    return 2 * m * n * x_bytes + weight


def _rms_norm_bytes_of(inputs: tuple) -> int:
    x, weight, _eps = inputs
    n = x.shape[-1]
    w_bytes = weight.element_size() if weight is not None else None
    return rms_norm_bytes(x.numel() // n, n, x.element_size(), w_bytes)


def _rows(case: Case, g: torch.Generator, device, dtype: torch.dtype) -> tuple:
    """(x-shaped tensor in dtype laid out as the case says, its fp32 values before the one
    conversion): fresh randn rows with the case's fill."""
    n, m = case.n, case.m
    width = n + case.row_pad
    flat = torch.randn(case.offset + m * width, generator=g, device=device)
    rows = flat[case.offset :].view(m, width)
    if case.fill == "zero_rows":
        rows[::3] = 0.0  # every third row all-zero: must give 0, never NaN
    elif case.fill == "large":
        # x^2 overflows fp16 (> 65504) yet fits fp32: proves fp32 accumulation
        rows *= {torch.float16: 2.0e4}.get(case.dtype, 1.0e15)
    elif case.fill == "tiny":
        rows *= 1.0e-4  # x^2 ~ 1e-8 << eps: eps dominates the denominator
    elif case.fill == "nonfinite":
        _nonfinite(rows, n)
    # one conversion to the target dtype, then the strided / offset view into it
    storage = flat.to(dtype)
    return storage.as_strided((m, n), (width, 1), case.offset).view(case.shape), rows


def _nonfinite(rows: torch.Tensor, n: int) -> None:
    """A NaN, an Inf and a -Inf in rows 1-3 (as many as there are) of the first n columns."""
    m = rows.shape[0]
    rows[1 % m, n // 2] = float("nan")
    if m > 2:
        rows[2, 0] = float("inf")
    if m > 3:
        rows[3, n - 1] = float("-inf")


def _weight(case: Case, g: torch.Generator, device) -> Optional[torch.Tensor]:
    if case.weight == "none":
        return None
    wdtype = torch.float32 if case.weight == "fp32" else case.dtype
    return (1.0 + 0.5 * torch.randn(case.n, generator=g, device=device)).to(wdtype)


def _case(spec: Spec) -> Case:
    return spec.case() if isinstance(spec, Planned) else spec


def rms_norm_inputs(
    spec: Spec, device: Union[str, torch.device], seed: int
) -> tuple[torch.Tensor, Optional[torch.Tensor], float]:
    """Fresh inputs (x, weight, eps) for a case or a planned shape, drawn from ``seed``."""
    case = _case(spec)
    g = torch.Generator(device=device).manual_seed(seed)
    x, _ = _rows(case, g, device, case.dtype)
    return x, _weight(case, g, device), case.eps


def fused_add_inputs(
    spec: Spec, device: Union[str, torch.device], seed: int
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], float]:
    """Fresh inputs (x, residual, weight, eps): x and weight as rms_norm_inputs draws them,
    then the residual, laid out as x, in the case's residual dtype and fill."""
    case = _case(spec)
    g = torch.Generator(device=device).manual_seed(seed)
    x, x_rows = _rows(case, g, device, case.dtype)
    weight = _weight(case, g, device)
    rdtype = torch.float32 if case.residual == "fp32" else case.dtype
    residual, rows = _rows(dataclasses.replace(case, fill="randn"), g, device, rdtype)
    n, shape = case.n, case.shape
    if case.residual_fill == "cancel":  # exactly -x: every sum is 0
        residual.copy_(-x.to(rdtype))
    elif case.residual_fill == "overflow":  # both in [3e4, 6e4]: the sum exceeds fp16's 65504
        x.copy_((3.0e4 + 1.0e4 * x_rows[:, :n].abs().clamp(max=3)).reshape(shape).to(case.dtype))
        residual.copy_((3.0e4 + 1.0e4 * rows[:, :n].abs().clamp(max=3)).reshape(shape).to(rdtype))
    elif case.residual_fill == "nonfinite":
        bad = rows[:, :n].clone()
        _nonfinite(bad, n)
        residual.copy_(bad.reshape(shape).to(rdtype))
    return x, residual, weight, case.eps


def _rms_norm_out_form(impl: impls.Impl, inputs: tuple, ref: torch.Tensor) -> torch.Tensor:
    """Our kernels' out= form, into an output poisoned with NaN first."""
    out = torch.full_like(ref, float("nan"), memory_format=torch.contiguous_format)
    impl.fn(*inputs, out=out)
    return out


def _fused_add_in_place_form(impl: impls.Impl, inputs: tuple, ref: tuple) -> tuple:
    """Our kernels' in-place form, on copies of x and residual: (x, residual) after it."""
    x, residual, weight, eps = inputs
    x, residual = x.clone(), residual.clone()
    impl.in_place(x, residual, weight, eps)
    return x, residual


def _fused_add_bytes_of(inputs: tuple) -> int:
    """Read x, residual, weight; write y (x's element size) and residual_out (residual's)."""
    x, residual, weight, _eps = inputs
    m_n = x.numel()
    weight_bytes = weight.numel() * weight.element_size() if weight is not None else 0
    return 2 * m_n * (x.element_size() + residual.element_size()) + weight_bytes


RMS_NORM = Op(
    name="rms_norm",
    title="RMSNorm forward",
    make_inputs=rms_norm_inputs,
    reference=rms_norm_ref,
    bytes_moved=_rms_norm_bytes_of,
    bytes_text="read x + read weight + write y",
    registry=impls.registry,
    ours=impls.OURS,
    baselines=impls.BASELINES,
    second_form=_rms_norm_out_form,
)

FUSED_ADD_RMS_NORM = Op(
    name="fused_add_rms_norm",
    title="fused residual add + RMSNorm forward",
    make_inputs=fused_add_inputs,
    reference=fused_add_rms_norm_ref,
    bytes_moved=_fused_add_bytes_of,
    bytes_text="read x + residual + weight, write y + residual_out",
    registry=impls.fused_add_registry,
    ours=impls.FUSED_ADD_OURS,
    baselines=impls.FUSED_ADD_BASELINES,
    second_form=_fused_add_in_place_form,
)

#: Every op, by the name its records carry.
OPS = {op.name: op for op in (RMS_NORM, FUSED_ADD_RMS_NORM)}
