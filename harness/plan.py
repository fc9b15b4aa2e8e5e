"""What a run measures: the dtypes, the shape grid and its sections, and their order.

Shared by harness.bench, harness.sweep and scripts/ncu_one.py, so every tool speaks of
the same shapes:
- grid: N in LARGE_NS with M = GRID_ELEMENTS // N (128 Mi elements: far beyond L2);
- msweep: M = 1, 2, 4, ..., 32768 at N = MSWEEP_N in bf16 (bandwidth against the work);
- decode: M in {1, 8, 32, 128} x N in {4096, 8192} in bf16 (graph and host time);
- reference: bf16 shapes measured independently of this harness
  (docs/notebook/01-why-the-defaults.md, "Harness");
- quick: a handful of the above; custom: the shapes a command line names.
The gradient ops (forward + backward, backward alone: harness.ops) plan their own grid
(``grad_plan``): N in GRAD_NS with M = GRAD_ELEMENTS[dtype] // N, half the elements in fp32,
and neither M sweep nor decode shapes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Optional

from harness.cases import DTYPE_NAMES, Case

#: Name -> torch dtype, in the order the command lines list them.
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
EPS = 1e-6

GRID_ELEMENTS = 2**27
LARGE_NS = (
    128,
    512,
    1000,
    1024,
    2048,
    4095,
    4096,
    4097,
    5120,
    8192,
    12288,
    16384,
    32768,
    65536,
    131072,
    262144,
)
MSWEEP_N = 4096
MSWEEP_MS = tuple(2**k for k in range(16))  # 1 .. 32768
DECODE = tuple((m, n) for n in (4096, 8192) for m in (1, 8, 32, 128))

#: bf16 shapes measured independently of this harness, to check it against (the figures:
#: docs/notebook/01-why-the-defaults.md, "Harness").
REFERENCE = ((8192, 8192),)

QUICK_NS = (4096, 4097, 8192)
QUICK_MSWEEP = (1, 64, 1024, 32768)  # 32768 x 4096 is also a grid shape
QUICK_DECODE = ((8, 4096),)

#: The gradient ops' grid: M = GRAD_ELEMENTS[dtype] // N (fp32: half the elements, so its
#: tensors take the bytes of the 16-bit ones).
GRAD_NS = (1024, 2048, 4095, 4096, 4097, 8192, 16384, 32768, 65536)
GRAD_ELEMENTS = {"bf16": 2**27, "fp16": 2**27, "fp32": 2**26}
QUICK_GRAD_NS = QUICK_NS


@dataclass
class Planned:
    """One shape to measure: dtype name, M rows of N, and the sections it stands in."""

    dtype: str
    m: int
    n: int
    sections: list[str] = field(default_factory=list)

    def case(self) -> Case:
        """The shape as a Case (random x, weight in x's dtype, eps EPS): what the op's
        input factory makes inputs from."""
        return Case(f"{self.m}x{self.n}", (self.m, self.n), DTYPES[self.dtype], eps=EPS)


def grid(ns: tuple[int, ...] = LARGE_NS) -> list[tuple[int, int]]:
    """The grid's (M, N): every N with M = GRID_ELEMENTS // N."""
    return [(GRID_ELEMENTS // n, n) for n in ns]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'4096x4096,1x8192' -> [(4096, 4096), (1, 8192)]; ValueError names a bad item."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"shape '{item.strip()}' is not MxN (e.g. 4096x4096)")
        m, n = int(parts[0]), int(parts[1])
        if m < 1 or n < 1:
            raise ValueError(f"shape '{item.strip()}' needs M >= 1 and N >= 1")
        shapes.append((m, n))
    return shapes


def plan(
    dtypes: list[str], *, quick: bool = False, shapes: Optional[list[tuple[int, int]]] = None
) -> list[Planned]:
    """The shapes to measure, most important first, each (dtype, M, N) once."""
    if shapes:
        return _requested(dtypes, shapes, plan(dtypes))
    wanted: list[tuple[str, int, int, str]] = []
    ns = QUICK_NS if quick else LARGE_NS
    ms = QUICK_MSWEEP if quick else MSWEEP_MS
    decode = QUICK_DECODE if quick else DECODE
    by_dtype = {d: [(d, m, n, "grid") for m, n in grid(ns)] for d in dtypes}
    # bf16 first (the headline), then the M sweep and decode shapes, then fp16, fp32
    wanted += by_dtype.pop("bf16", [])
    if "bf16" in dtypes:
        wanted += [("bf16", m, MSWEEP_N, "msweep") for m in ms]
        wanted += [("bf16", m, n, "decode") for m, n in decode]
        if not quick:
            wanted += [("bf16", m, n, "reference") for m, n in REFERENCE]
    for d in ("fp16", "fp32"):
        wanted += by_dtype.pop(d, [])
    return _merged(wanted)


def _merged(wanted: list[tuple[str, int, int, str]]) -> list[Planned]:
    """(dtype, M, N, section) items as Planned shapes, each (dtype, M, N) once, in order."""
    out: dict[tuple[str, int, int], Planned] = {}
    for d, m, n, section in wanted:
        p = out.setdefault((d, m, n), Planned(d, m, n))
        if section not in p.sections:
            p.sections.append(section)
    return list(out.values())


def _requested(
    dtypes: list[str], shapes: list[tuple[int, int]], full: list[Planned]
) -> list[Planned]:
    """The requested shapes in each dtype, each with the sections the full plan gives it (a
    grid shape is still one of the grid's, so a run of a few shapes appended to the records
    replaces their grid figures instead of hiding them) and "custom"."""
    sections = {(p.dtype, p.m, p.n): p.sections for p in full}
    wanted = [(d, m, n, sec) for d in dtypes for m, n in shapes
              for sec in (*sections.get((d, m, n), []), "custom")]  # fmt: skip
    return _merged(wanted)


def grad_plan(
    dtypes: list[str], *, quick: bool = False, shapes: Optional[list[tuple[int, int]]] = None
) -> list[Planned]:
    """The gradient ops' shapes: the grid of GRAD_NS (QUICK_GRAD_NS with --quick), bf16 first,
    then fp16, fp32; ``shapes`` replaces it as in ``plan``."""
    if shapes:
        return _requested(dtypes, shapes, grad_plan(dtypes))
    ns = QUICK_GRAD_NS if quick else GRAD_NS
    order = [d for d in ("bf16", "fp16", "fp32") if d in dtypes]
    return [Planned(d, GRAD_ELEMENTS[d] // n, n, ["grid"]) for d in order for n in ns]


#: QK-norm's shapes (harness.ops.QK_RMS_NORM): T tokens of QK_HEADS heads of D, as (M, N) =
#: (T x QK_HEADS, D): decode to prefill, the head widths models use.
QK_HEADS = 32
QK_TOKENS = (1, 16, 256, 4096, 16384)
QK_DS = (64, 128, 256)
QUICK_QK = ((4096, 128),)


#: The head counts QK-norm is measured at besides QK_HEADS (an op each: harness.ops)
QK_MORE_HEADS = (8, 64)


def qk_plan(
    dtypes: list[str],
    *,
    quick: bool = False,
    shapes: Optional[list[tuple[int, int]]] = None,
    heads: int = QK_HEADS,
) -> list[Planned]:
    """QK-norm's shapes: every (T, D) of QK_TOKENS x QK_DS (QUICK_QK with --quick) as (T x
    heads, D), bf16 first; ``shapes`` (M = T x heads, N = D) replaces them as in ``plan``."""
    if shapes:
        return _requested(dtypes, shapes, qk_plan(dtypes, heads=heads))
    pairs = QUICK_QK if quick else [(t, d) for d in QK_DS for t in QK_TOKENS]
    order = [d for d in ("bf16", "fp16", "fp32") if d in dtypes]
    return [Planned(d, t * heads, n, ["grid"]) for d in order for t, n in pairs]


def shape_class(dtype: str, n: int, small: bool) -> str:
    """The class a profiled call stands for: dtype, small or large, N range, odd N."""
    width = (
        "N<=1024"
        if n <= 1024
        else "N<=8192"
        if n <= 8192
        else "N<=65536"
        if n <= 65536
        else "N>65536"
    )
    return f"{dtype},{'small' if small else 'large'},{width}{',odd' if n % 8 else ''}"


def parse_names(text: str, known: tuple[str, ...] | list[str]) -> list[str]:
    """'triton, cuda,triton' -> ['triton', 'cuda']: spaces and repeats dropped; ValueError
    for an unknown name or a list that names nothing (the message lists the choices)."""
    names = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {','.join(unknown)}; choose from {','.join(known)}")
    if not names:
        raise ValueError(f"{text!r} names nothing; choose from {','.join(known)}")
    return names


def names_arg(
    p: argparse.ArgumentParser, flag: str, text: str, known: tuple[str, ...] | list[str]
) -> list[str]:
    """parse_names for a command line: a bad list is an argparse error (exit 2) naming flag."""
    try:
        return parse_names(text, known)
    except ValueError as e:
        p.error(f"{flag}: {e}")
