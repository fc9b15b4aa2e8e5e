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

The gradient ops, each implementation's forward and its autograd (harness.impls), checked
against the float64 gradients of harness.reference with grad_close; their grid is
harness.plan.grad_plan. Inputs: the forward op's (the same draws), then the gradient of
each output, fresh randn from the same generator (never zeros), contiguous, in that
output's dtype. e is x's element size, w the weight's; without a weight its terms go.
- rms_norm_fwd_bwd(x, weight, eps, dy) -> (dx, dweight), forward and backward as one call.
  Bytes: the forward reads x + weight, writes y; the backward reads x + dy + weight, writes
  dx + dweight: 5 M N e + 3 N w.
- rms_norm_bwd(x, weight, eps, dy) -> (dx, dweight), the backward alone (the forward runs
  once, untimed, its graph kept). Bytes: read x + dy + weight, write dx + dweight:
  3 M N e + 2 N w.
- fused_add_rms_norm_fwd_bwd(x, residual, weight, eps, dy, d_residual_out) -> (dx,
  dresidual, dweight). Bytes: the forward reads x + residual + weight, writes y +
  residual_out; the backward reads residual_out + dy + d_residual_out + weight, writes dx +
  dresidual + dweight: M N (4 e + 5 r) + 3 N w, r the residual's element size.
What only some implementations move is charged to none: a saved rstd (4 bytes a row),
dweight partials, a zeroed dx buffer; and an implementation that returns one tensor as both
dx and dresidual (equal when their dtypes are: ours, Liger, QuACK) is still charged for
writing both.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from harness import impls
from harness.cases import (
    Case,
    all_cases,
    fused_add_cases,
    fused_add_grad_cases,
    grad_cases,
    qk_cases,
    qk_grad_cases,
)
from harness.plan import QK_HEADS, QK_MORE_HEADS, Planned, grad_plan, qk_plan
from harness.plan import plan as forward_plan
from harness.reference import (
    QUANT_REL,
    TOL,
    fused_add_rms_norm_grads_ref,
    fused_add_rms_norm_quant_ref,
    fused_add_rms_norm_ref,
    grad_close,
    q_close,
    rms_norm_grads_ref,
    rms_norm_quant_ref,
    rms_norm_ref,
)
from rmsnorm_api.spec import OPS as DESCRIBED

#: What inputs are made from: a validation case, or a planned benchmark shape.
Spec = Union[Case, Planned]


def forward_close(y: torch.Tensor, want: torch.Tensor, what: str = "y") -> None:
    """A forward output against the reference's: TOL of its dtype, NaN where it has NaN."""
    torch.testing.assert_close(y, want, equal_nan=True, **TOL[want.dtype])


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
    # the kernels under study, and what they are compared with, in report order
    ours: tuple[str, ...] = impls.OURS
    baselines: tuple[str, ...] = impls.BASELINES
    # (impl, inputs, reference output) -> our kernels' second form's output (rms_norm:
    # out= into a NaN-poisoned tensor; the fused add: in place; the gradient ops: every
    # tensor torch allocates starting as NaN), checked like the first
    second_form: Optional[Callable[..., Any]] = None
    # the names of the outputs, in order, for error messages (the op's description's)
    outputs: tuple[str, ...] = DESCRIBED["rms_norm"].return_names
    # (output, reference output, its name): raise AssertionError where they differ
    compare: Callable[[torch.Tensor, torch.Tensor, str], None] = forward_close
    # (dtypes, quick=, shapes=) -> the planned shapes (harness.plan)
    plan: Callable[..., list[Planned]] = forward_plan
    grads: bool = False  # a gradient op: its outputs are gradients through autograd
    # () -> the numerical cases harness.validate checks it on (harness.cases)
    cases: Callable[[], list[Case]] = all_cases
    grid_text: str = "M = 2^27 / N"  # how its grid's M is chosen, for reports and plots
    # whether each output has its reference's dtype (the quantised ops: y is fp8, its
    # reference the fp32 values before the rounding, which their compare checks)
    exact_dtypes: bool = True
    # the widths it takes are multiples of this (a group's quantisation: whole groups); the
    # bench leaves the others out of its plan, by name, and refuses them in --shapes
    n_multiple: int = 1
    # (name, (M, N)): what harness.bench checks under the interpreter without a GPU when
    # --shapes names none (None: its NO_GPU_SHAPES)
    no_gpu_shapes: Optional[tuple] = None
    # the fraction of the copy ceiling the study holds it to at every width, and whose
    # target that is, drawn on its bandwidth plot (None: no target of its own)
    target: Optional[tuple[float, str]] = None

    @property
    def order(self) -> tuple[str, ...]:
        """Implementation names in the order runs, tables and plots list them."""
        return self.ours + self.baselines


def _shape_ok(what: str, m: int, n: int) -> None:
    if m < 0 or n < 1:
        raise ValueError(f"{what}: shape ({m}, {n}) must have M >= 0 and N >= 1")


def rms_norm_bytes(m: int, n: int, x_bytes: int, w_bytes: Optional[int] = None) -> int:
    """rms_norm's bytes model: read x + read weight + write y (y has x's element size).

    ``w_bytes`` is the weight's element size, or None when there is no weight.
    """
    _shape_ok("rms_norm_bytes", m, n)
    weight = n * w_bytes if w_bytes else 0
    return 2 * m * n * x_bytes + weight


def rms_norm_fwd_bwd_bytes(m: int, n: int, x_bytes: int, w_bytes: Optional[int] = None) -> int:
    """rms_norm_fwd_bwd's bytes model: read x + weight, write y; then read x + dy + weight,
    write dx + dweight (dy and dx in x's element size, dweight in the weight's)."""
    _shape_ok("rms_norm_fwd_bwd_bytes", m, n)
    weight = 3 * n * w_bytes if w_bytes else 0
    return 5 * m * n * x_bytes + weight


def rms_norm_bwd_bytes(m: int, n: int, x_bytes: int, w_bytes: Optional[int] = None) -> int:
    """rms_norm_bwd's bytes model: read x + dy + weight, write dx + dweight."""
    _shape_ok("rms_norm_bwd_bytes", m, n)
    weight = 2 * n * w_bytes if w_bytes else 0
    return 3 * m * n * x_bytes + weight


def fused_add_fwd_bwd_bytes(
    m: int, n: int, x_bytes: int, r_bytes: int, w_bytes: Optional[int] = None
) -> int:
    """fused_add_rms_norm_fwd_bwd's bytes model: x's size for x, y, dy, dx; the residual's
    (``r_bytes``) for residual, residual_out (written, then read by the backward),
    d_residual_out, dresidual; the weight read twice and dweight written."""
    _shape_ok("fused_add_fwd_bwd_bytes", m, n)
    weight = 3 * n * w_bytes if w_bytes else 0
    return m * n * (4 * x_bytes + 5 * r_bytes) + weight


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
    return _fused_add_draw(case, g, device)


def _fused_add_draw(case: Case, g: torch.Generator, device) -> tuple:
    """fused_add_inputs' draws from the generator g."""
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


def _output_gradient(case: Case, g: torch.Generator, device, dtype: torch.dtype) -> torch.Tensor:
    """The gradient of an output: fresh randn of x's logical shape, contiguous, in dtype."""
    return torch.randn(case.shape, generator=g, device=device).to(dtype)


def rms_norm_grad_inputs(
    spec: Spec, device: Union[str, torch.device], seed: int
) -> tuple[torch.Tensor, Optional[torch.Tensor], float, torch.Tensor]:
    """Fresh inputs (x, weight, eps, dy): rms_norm_inputs' (the same values for the same
    seed), then dy ~ randn in x's dtype, drawn next from the same generator."""
    case = _case(spec)
    g = torch.Generator(device=device).manual_seed(seed)
    x, _ = _rows(case, g, device, case.dtype)
    weight = _weight(case, g, device)
    return x, weight, case.eps, _output_gradient(case, g, device, case.dtype)


def fused_add_grad_inputs(spec: Spec, device: Union[str, torch.device], seed: int) -> tuple:
    """Fresh inputs (x, residual, weight, eps, dy, d_residual_out): fused_add_inputs' (the
    same values for the same seed), then dy ~ randn in x's dtype and d_residual_out ~ randn
    in the residual's, drawn next from the same generator."""
    case = _case(spec)
    g = torch.Generator(device=device).manual_seed(seed)
    x, residual, weight, eps = _fused_add_draw(case, g, device)
    dy = _output_gradient(case, g, device, x.dtype)
    return x, residual, weight, eps, dy, _output_gradient(case, g, device, residual.dtype)


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


def _grads_poisoned_form(impl: impls.Impl, inputs: tuple, ref: tuple) -> tuple:
    """Our kernels' gradients again, with every tensor torch allocates meanwhile (dx,
    dweight, their partials, the forward's y) filled with NaN first: torch's
    deterministic mode with fill_uninitialized_memory, for this call only. An element the
    kernels never write is NaN and fails the check."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    try:
        torch.utils.deterministic.fill_uninitialized_memory = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        return impl.fn(*inputs)
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def _grads_bytes_of(model: Callable[..., int]) -> Callable[[tuple], int]:
    """The bytes_moved of rms_norm's gradient ops: ``model`` at the inputs' shape, x's
    element size and the weight's."""

    def bytes_of(inputs: tuple) -> int:
        x, weight = inputs[0], inputs[1]
        n = x.shape[-1]
        w_bytes = weight.element_size() if weight is not None else None
        return model(x.numel() // n, n, x.element_size(), w_bytes)

    return bytes_of


def _fused_add_fwd_bwd_bytes_of(inputs: tuple) -> int:
    x, residual, weight = inputs[:3]
    n = x.shape[-1]
    w_bytes = weight.element_size() if weight is not None else None
    return fused_add_fwd_bwd_bytes(
        x.numel() // n, n, x.element_size(), residual.element_size(), w_bytes
    )


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
    second_form=_fused_add_in_place_form,
    outputs=DESCRIBED["fused_add_rms_norm"].return_names,
    cases=fused_add_cases,
)

#: What the gradient ops share: our kernels and the same five baselines, through autograd.
_GRADS = dict(
    second_form=_grads_poisoned_form,
    compare=grad_close,
    plan=grad_plan,
    grads=True,
    grid_text="M = 2^27 / N, fp32 2^26 / N",
    cases=grad_cases,
)

#: rms_norm's two gradient ops compute the same gradients from the same inputs; they
#: differ only in what is timed (forward and backward, or the backward alone).
_RMS_NORM_GRADS = dict(
    make_inputs=rms_norm_grad_inputs,
    reference=rms_norm_grads_ref,
    outputs=DESCRIBED["rms_norm_backward"].return_names,
    **_GRADS,
)

RMS_NORM_FWD_BWD = Op(
    name="rms_norm_fwd_bwd",
    title="RMSNorm forward + backward",
    bytes_moved=_grads_bytes_of(rms_norm_fwd_bwd_bytes),
    bytes_text="read x + weight, write y; read x + dy + weight, write dx + dweight "
    "(5 M N e + 3 N w)",
    registry=impls.rms_norm_fwd_bwd_registry,
    **_RMS_NORM_GRADS,
)

RMS_NORM_BWD = Op(
    name="rms_norm_bwd",
    title="RMSNorm backward",
    bytes_moved=_grads_bytes_of(rms_norm_bwd_bytes),
    bytes_text="read x + dy + weight, write dx + dweight (3 M N e + 2 N w)",
    registry=impls.rms_norm_bwd_registry,
    # the backward alone at 85% of copy at every width (FINDINGS, "Against the targets")
    target=(0.85, "the backward's target"),
    **_RMS_NORM_GRADS,
)

FUSED_ADD_RMS_NORM_FWD_BWD = Op(
    name="fused_add_rms_norm_fwd_bwd",
    title="fused residual add + RMSNorm forward + backward",
    make_inputs=fused_add_grad_inputs,
    bytes_moved=_fused_add_fwd_bwd_bytes_of,
    bytes_text="read x + residual + weight, write y + residual_out; read residual_out + dy "
    "+ d_residual_out + weight, write dx + dresidual + dweight (9 M N e + 3 N w)",
    registry=impls.fused_add_fwd_bwd_registry,
    reference=fused_add_rms_norm_grads_ref,
    outputs=DESCRIBED["fused_add_rms_norm_backward"].return_names,
    **{**_GRADS, "cases": fused_add_grad_cases},
)

#: Gemma's norms: both forward ops with weight_offset=1.0 (y = x * rstd * (1 + weight), the 1
#: added in fp32), every implementation adding it (harness.impls' offset; native has none).
#: The same inputs, bytes model and grid as the ops without it.
GEMMA_OFFSET = 1.0


def _gemma(op: Op, registry: Callable[..., dict[str, impls.Impl]]) -> Op:
    """op with the weight offset GEMMA_OFFSET in its reference and every implementation."""
    return dataclasses.replace(
        op,
        name=f"gemma_{op.name}",
        title=f"Gemma {op.title} (1 + weight)",
        reference=functools.partial(op.reference, weight_offset=GEMMA_OFFSET),
        registry=functools.partial(registry, offset=GEMMA_OFFSET),
    )


GEMMA_RMS_NORM = _gemma(RMS_NORM, impls.registry)
GEMMA_FUSED_ADD_RMS_NORM = _gemma(FUSED_ADD_RMS_NORM, impls.fused_add_registry)


def qk_inputs(
    spec: Spec, device: Union[str, torch.device], seed: int, heads: int = QK_HEADS
) -> tuple[torch.Tensor, Optional[torch.Tensor], float]:
    """Fresh inputs (q, weight, eps) for QK-norm: q = qkv[:, :H*D].view(T, H, D) of a packed
    projection (T, 3HD), strides (3HD, D, 1); a case's shape is (T, H, D), a planned one's
    (T x heads, D)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return _qk_draw(_case(spec), g, device, heads)


def qk_grad_inputs(
    spec: Spec, device: Union[str, torch.device], seed: int, heads: int = QK_HEADS
) -> tuple[torch.Tensor, Optional[torch.Tensor], float, torch.Tensor]:
    """Fresh inputs (q, weight, eps, dy) for QK-norm's backward: qk_inputs' (the same values
    for the same seed), then dy ~ randn of q's shape, contiguous (as autograd gives it), in
    q's dtype, drawn next from the same generator."""
    g = torch.Generator(device=device).manual_seed(seed)
    q, weight, eps = _qk_draw(_case(spec), g, device, heads)
    return q, weight, eps, torch.randn(q.shape, generator=g, device=device).to(q.dtype)


def _qk_draw(
    case: Case, g: torch.Generator, device: Union[str, torch.device], heads: int
) -> tuple[torch.Tensor, Optional[torch.Tensor], float]:
    """q (T, H, D), a head view of a fresh packed projection, then the weight, from g."""
    if len(case.shape) == 3:
        t, h, d = case.shape
    else:
        h, d = heads, case.n
        if case.m % h:
            raise ValueError(
                f"qk_rms_norm: M = {case.m} rows are not a whole number of tokens of {h} heads"
            )
        t = case.m // h
    qkv = torch.randn(t, 3 * h * d, generator=g, device=device).to(case.dtype)
    return qkv[:, : h * d].view(t, h, d), _weight(case, g, device), case.eps


def qk_no_gpu_shapes(heads: int) -> tuple:
    """QK-norm's shapes under the interpreter (harness.bench without a GPU): whole tokens of
    `heads` heads, a head width models use, an odd one, one token."""
    return (
        ("t3-d64", (3 * heads, 64)),
        ("t2-d100", (2 * heads, 100)),
        ("t1-d128", (heads, 128)),
    )


def _qk(op: Op, what: str, make_inputs: Callable, heads: int = QK_HEADS, **fields) -> Op:
    """op on QK-norm's head views of `heads` heads a token: their inputs, grid and
    interpreter shapes (named qk_<op>, or qk_<op>_h<heads> past QK_HEADS)."""
    return dataclasses.replace(
        op,
        name=f"qk_{op.name}" + ("" if heads == QK_HEADS else f"_h{heads}"),
        title=f"RMSNorm {what}of head views (QK-norm, {heads} heads a token)",
        make_inputs=functools.partial(make_inputs, heads=heads),
        plan=functools.partial(qk_plan, heads=heads),
        grid_text=f"M = T x {heads} heads, N = D",
        no_gpu_shapes=qk_no_gpu_shapes(heads),
        **fields,
    )


#: QK-norm (Qwen3's, Gemma 3's q and k norms): rms_norm of the heads of a packed projection,
#: rows that share no one stride, read where they lie or copied into rows first, as each
#: implementation does; the bytes model is rms_norm's (q read, y written, the weight read).
QK_RMS_NORM = _qk(RMS_NORM, "", qk_inputs, registry=impls.qk_registry, cases=qk_cases)
#: Its backward (dx into the head view's layout, dweight), alone, as rms_norm_bwd times it:
#: the implementations that take rows at one stride copy the view into rows first, in the
#: graph, so the copy's backward is theirs too.
QK_RMS_NORM_BWD = _qk(
    RMS_NORM_BWD, "backward ", qk_grad_inputs, registry=impls.qk_bwd_registry, cases=qk_grad_cases
)
#: Both at the other head counts models run (QK_MORE_HEADS: Llama-sized 8 to 64 a token),
#: where a token's heads are fewer or more rows between the projection's gaps.
QK_MORE = tuple(
    _qk(op, what, inputs, heads, registry=registry, cases=cases)
    for heads in QK_MORE_HEADS
    for op, what, inputs, registry, cases in (
        (RMS_NORM, "", qk_inputs, impls.qk_registry, qk_cases),
        (RMS_NORM_BWD, "backward ", qk_grad_inputs, impls.qk_bwd_registry, qk_grad_cases),
    )
)

#: The static scale the quantised ops' static form is given: |y| of the grid's inputs
#: (x ~ randn, weight ~ 1 + randn / 2) stays below 448 times it but for rare outliers
QUANT_STATIC_SCALE = 2.0**-5


def _quant_inputs(mode: str, fused: bool) -> Callable:
    """The quantised forms' inputs: the plain op's (or the fused add's), then the static
    scale (fp32 (1,)) for the static form."""
    base = fused_add_inputs if fused else rms_norm_inputs

    def make(spec: Spec, device: Union[str, torch.device], seed: int) -> tuple:
        inputs = base(spec, device, seed)
        if mode == "static":
            return (*inputs, torch.tensor([QUANT_STATIC_SCALE], device=device))
        return inputs

    return make


def _quant_reference(mode: str, fused: bool) -> Callable:
    """The quantised forms' reference: (v, [residual_out,] scales), v the fp32 values before
    the rounding to fp8 (q_close judges ties by them), a static scale as given."""

    def reference(*inputs):
        head, scale = impls.quant_split(inputs, fused)
        kw = impls.quant_kw(mode, scale)
        if fused:
            _, ro, s, v = fused_add_rms_norm_quant_ref(*head, **kw)
            return v, ro, s
        _, s, v = rms_norm_quant_ref(*head, **kw)
        return v, s

    return reference


def quant_compare(
    got: torch.Tensor, want: torch.Tensor, what: str = "y", rel: float = QUANT_REL
) -> None:
    """A quantised form's output against its reference's: y (fp8) bit for bit but at ties
    (q_close within rel, against the fp32 values the reference gives), the scales to rel,
    residual_out exactly; NaN where the reference has NaN."""
    if what == "y":
        assert got.dtype == impls.QUANT_DTYPE, f"y: dtype {got.dtype}, expected {impls.QUANT_DTYPE}"
        q_close(got, want.to(got.dtype), want, what, rel)
    elif what == "scales":
        torch.testing.assert_close(got, want, rtol=rel, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _quant_bytes_of(mode: str, fused: bool) -> Callable[[tuple], int]:
    """Read x (+ residual) + weight, write y in fp8 (+ residual_out) + the scales (4 bytes
    a row, a group, or none for the static scale)."""
    group = impls.QUANT_MODES[mode].get("group_size")

    def bytes_of(inputs: tuple) -> int:
        x = inputs[0]
        weight = inputs[2 if fused else 1]
        m_n = x.numel()
        total = m_n * (x.element_size() + 1)
        if fused:
            total += 2 * m_n * inputs[1].element_size()
        if weight is not None:
            total += weight.numel() * weight.element_size()
        if mode != "static":
            total += 4 * (m_n // group if group else m_n // x.shape[-1])
        return total

    return bytes_of


def _quant_in_place_form(impl: impls.Impl, inputs: tuple, ref: tuple) -> tuple:
    """Our fused add's quantised in-place form, on a copy of the residual: (y, residual
    after it, scales)."""
    residual = inputs[1].clone()
    y, scales = impl.in_place(inputs[0], residual, *inputs[2:])
    return y, residual, scales


def _quant_op(mode: str, fused: bool) -> Op:
    """The quantised forward in one form (impls.QUANT_MODES), of rms_norm or the fused add."""
    base = FUSED_ADD_RMS_NORM if fused else RMS_NORM
    group = impls.QUANT_MODES[mode].get("group_size")
    cases, no_gpu = base.cases, None
    if group:

        def cases():
            return [c for c in base.cases() if c.n % group == 0]

        # whole groups: rows of one group, of 32, and decode's one row
        no_gpu = (("m7-n128", (7, 128)), ("m3-n4096", (3, 4096)), ("m1-n1024", (1, 1024)))

    scales = {"static": "the static scale", "token": "a scale a row"}.get(
        mode, f"a scale a group of {group}"
    )
    return dataclasses.replace(
        base,
        name=f"fp8_{base.name}_{mode}",
        title=f"{base.title}, y in fp8 (e4m3) by {scales}",
        make_inputs=_quant_inputs(mode, fused),
        reference=_quant_reference(mode, fused),
        bytes_moved=_quant_bytes_of(mode, fused),
        bytes_text=f"{base.bytes_text.replace('write y', 'write y (1 byte)')}"
        + (" + the scales (4 bytes each)" if mode != "static" else ""),
        registry=functools.partial(impls.quant_registry, mode=mode, fused=fused),
        ours=impls.OURS,
        baselines=("eager", "compile", "native", "flashinfer", "flashinfer_cuda"),
        second_form=_quant_in_place_form if fused else None,
        outputs=DESCRIBED[f"{'fused_add_' * fused}rms_norm_quant"].return_names,
        compare=quant_compare,
        cases=cases,
        no_gpu_shapes=no_gpu,
        exact_dtypes=False,
        n_multiple=group or 1,
    )


#: The quantised forward (fp8 out), each form of both ops, measured when asked for.
QUANT_OPS = {
    op.name: op for op in (_quant_op(m, f) for f in (False, True) for m in impls.QUANT_MODES)
}

#: The forward ops: what a bench run measures when --ops names none.
FORWARD_OPS = {op.name: op for op in (RMS_NORM, FUSED_ADD_RMS_NORM)}
#: The variants' ops, measured when asked for (harness.bench --ops).
VARIANT_OPS = {
    op.name: op
    for op in (GEMMA_RMS_NORM, GEMMA_FUSED_ADD_RMS_NORM, QK_RMS_NORM, QK_RMS_NORM_BWD, *QK_MORE)
}
#: The gradient ops, measured when asked for (harness.bench --ops).
GRAD_OPS = {op.name: op for op in (RMS_NORM_FWD_BWD, RMS_NORM_BWD, FUSED_ADD_RMS_NORM_FWD_BWD)}
#: Every op, by the name its records carry, in the order reports list them.
OPS = {**FORWARD_OPS, **VARIANT_OPS, **GRAD_OPS, **QUANT_OPS}
