"""The numerical cases every implementation must pass.

A Case is a recipe, data only: harness.ops's input factory draws fresh random inputs for
it from a seed (never zeros, except the rows a special case zeroes on purpose). Its shape
is the full size used on a GPU; ``cpu_cap`` shrinks M (never N) so the Triton interpreter
finishes in minutes on CPU.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from rmsnorm_api import DTYPE_NAMES, DTYPES  # noqa: F401  (this module's names for them)

#: On CPU (Triton interpreter) a case keeps at most this many elements, by cutting rows.
CPU_MAX_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]  # logical shape of x; the last dim is N
    dtype: torch.dtype
    weight: str = "same"  # "same" (x's dtype), "fp32", or "none"
    row_pad: int = 0  # x is a slice of rows N + row_pad wide (a strided view)
    offset: int = 0  # storage offset of x in elements (a misaligned start)
    fill: str = "randn"  # randn | zero_rows | large | tiny | nonfinite (x's values)
    eps: float = 1e-6
    # the fused add's residual: "same" (x's dtype) or "fp32", laid out as x; its values:
    # randn | cancel (exactly -x) | overflow (x + residual overflows fp16) | nonfinite
    residual: str = "same"
    residual_fill: str = "randn"

    @property
    def n(self) -> int:
        return self.shape[-1]

    @property
    def m(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def id(self) -> str:
        return f"{self.name}-{DTYPE_NAMES[self.dtype]}"

    def cpu_cap(self) -> Case:
        """The same case with leading dims cut so it has at most CPU_MAX_ELEMENTS."""
        if self.m * self.n <= CPU_MAX_ELEMENTS:
            return self
        rows = max(1, CPU_MAX_ELEMENTS // self.n)
        return dataclasses.replace(self, shape=(rows, self.n))


#: (name, shape): the N widths the study covers, odd and power-of-two, with M in {1, 7, 256}.
_BASE_SHAPES = [
    ("n1", (7, 1)),
    ("n3", (256, 3)),
    ("n17", (256, 17)),
    ("n127", (256, 127)),
    ("n128", (256, 128)),
    ("n1000", (7, 1000)),
    ("n1023", (256, 1023)),
    ("n1024", (1, 1024)),
    ("n4095", (256, 4095)),
    ("n4096", (256, 4096)),
    ("n4097", (7, 4097)),
    ("n5120", (256, 5120)),
    ("n8191", (7, 8191)),
    ("n12288", (256, 12288)),
    ("n16384", (7, 16384)),
    ("n65536", (7, 65536)),
    ("n131072", (3, 131072)),
    ("n262144", (2, 262144)),
    ("m4099-n128", (4099, 128)),  # many small rows: the grid's last program is partial
    ("3d-n1024", (4, 33, 1024)),
    ("4d-n4097", (2, 3, 5, 4097)),
]

#: Layout and weight variants: strided rows, misaligned starts, no weight, fp32 weight.
_VARIANTS = [
    dict(name="strided-n4095", shape=(256, 4095), row_pad=9, offset=3),
    dict(name="strided-n1000", shape=(64, 1000), row_pad=24),
    dict(name="offset-n4096", shape=(64, 4096), offset=1),
    dict(name="strided3d-n8192", shape=(3, 5, 8192), row_pad=8),
    dict(name="noweight-n4096", shape=(256, 4096), weight="none"),
    dict(name="noweight-n1023", shape=(7, 1023), weight="none"),
]

#: Special inputs, each at an aligned and an odd width.
_SPECIALS = [
    dict(name=f"{fill}-n{n}", shape=(16, n), fill=fill)
    for fill in ("zero_rows", "large", "tiny", "nonfinite")
    for n in (4096, 4097)
]


#: QK-norm's cases (harness.ops.QK_RMS_NORM): (T, H, D) head views, the head widths models
#: use, an odd one, one token (rows of one stride), with each weight kind.
_QK_SHAPES = [(4, 32, 128), (3, 8, 64), (2, 4, 256), (5, 6, 100), (1, 16, 128)]


def qk_cases() -> list[Case]:
    """QK-norm's cases in each dtype: every head shape with a weight of x's dtype, and the
    first with an fp32 weight and with none."""
    cases = []
    for dtype in DTYPES:
        cases += [Case(f"qk-{t}x{h}x{d}", (t, h, d), dtype) for t, h, d in _QK_SHAPES]
        t, h, d = _QK_SHAPES[0]
        cases += [
            Case(f"qk-{t}x{h}x{d}-w{w}", (t, h, d), dtype, weight=w) for w in ("fp32", "none")
        ]
    return cases


def qk_grad_cases() -> list[Case]:
    """QK-norm's backward's cases: its forward's (their inputs are finite)."""
    return [c for c in qk_cases() if _finite(c)]


def all_cases() -> list[Case]:
    """Every numerical case, each in float32, float16 and bfloat16, plus fp32 weights."""
    cases = []
    for dtype in DTYPES:
        cases += [Case(name, shape, dtype) for name, shape in _BASE_SHAPES]
        cases += [Case(dtype=dtype, **v) for v in _VARIANTS + _SPECIALS]
    for dtype in (torch.float16, torch.bfloat16):
        for name, shape in [("fp32w-n4096", (256, 4096)), ("fp32w-n4097", (7, 4097))]:
            cases.append(Case(name, shape, dtype, weight="fp32"))
    cases.append(Case("eps1e-2-n1000", (7, 1000), torch.bfloat16, eps=1e-2))
    return cases


#: The fused add's own cases, beyond the plain op's grid: an fp32 residual stream beside
#: 16-bit x, a residual cancelling x (zero rows: 0, never NaN), an add that overflows fp16,
#: NaN / Inf in the residual.
_FUSED_ADD_SPECIALS = [
    dict(name=f"{fill}-res-n{n}", shape=(16, n), residual_fill=fill)
    for fill in ("cancel", "overflow", "nonfinite")
    for n in (4096, 4097)
]


def fused_add_cases() -> list[Case]:
    """Every fused-add case: the plain op's cases (residual in x's dtype, laid out as x),
    the same widths with an fp32 residual in 16-bit dtypes, and the specials."""
    cases = all_cases()
    for dtype in (torch.float16, torch.bfloat16):
        for name, shape in _BASE_SHAPES:
            cases.append(Case(f"fp32res-{name}", shape, dtype, residual="fp32"))
    for dtype in DTYPES:
        cases += [Case(dtype=dtype, **v) for v in _FUSED_ADD_SPECIALS]
    return cases


def _finite(case: Case) -> bool:
    """Whether a case's inputs, and the fused add's sum, are all finite: not so for the
    non-finite fills, nor for fp16's "large" (its x holds Inf wherever randn * 2e4 passes
    fp16's 65504: a probe of the forward's fp32 sum), nor for an fp16 sum that overflows."""
    fp16_large = case.fill == "large" and case.dtype == torch.float16
    bad_sum = case.residual_fill in ("nonfinite", "overflow")
    return case.fill != "nonfinite" and not fp16_large and not bad_sum


def grad_cases() -> list[Case]:
    """The rms_norm gradient ops' cases: the plain op's whose inputs are finite
    (grad_close compares finite gradients; a non-finite x makes its row's gradient NaN in
    the reference too, and the forward's cases check what a non-finite row gives)."""
    return [c for c in all_cases() if _finite(c)]


def fused_add_grad_cases() -> list[Case]:
    """The fused add's gradient op's cases: the fused add's, less those whose inputs or
    sum are not finite (an fp16 sum past 65504 is Inf in residual_out)."""
    return [c for c in fused_add_cases() if _finite(c)]
