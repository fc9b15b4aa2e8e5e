"""Run every numerical case against every runnable implementation and print a table.

    python -m harness.validate [--impls triton,cuda] [--seed 0] [--cases SUBSTR]

Inputs are fresh per case (seeded: seed + case index, printed); outputs are poisoned
with NaN before each run of an implementation's out= form, so an unwritten element fails.
Without a GPU, cases run on CPU through the Triton interpreter with M capped
(cases.CPU_MAX_ELEMENTS). Exit code 1 if any case fails.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Optional

import torch

from harness.cases import Case, all_cases
from harness.impls import Impl, registry, runnable
from harness.ops import RMS_NORM, Op
from harness.plan import names_arg


@dataclass
class Result:
    case: str
    impl: str
    max_abs: float
    max_rel: float
    ok: bool
    error: Optional[str] = None


def errors(y: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """Max absolute and relative error over positions where the reference is finite."""
    y, ref = y.float(), ref.float()
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0, 0.0
    diff = (y - ref).abs()[finite]
    scale = ref.abs()[finite].clamp_min(torch.finfo(torch.float32).tiny)
    return diff.max().item(), (diff / scale).max().item()


def check(
    impl: Impl, *inputs_and_ref, op: Op = RMS_NORM
) -> tuple[float, float, bool, Optional[str]]:
    """check(impl, *inputs, ref): compare impl's outputs on the op's inputs (for rms_norm
    x, weight, eps) with the reference output (a tensor, or a tuple of them; None where an
    output does not exist, as dweight without a weight) by the op's ``compare`` (forward
    ops: TOL; gradient ops: grad_close); for our kernels also the op's second form
    (rms_norm: out= into a NaN-poisoned tensor; the fused add: in place; the gradient ops:
    with every allocation NaN-filled)."""
    *inputs, ref = inputs_and_ref
    outputs = [impl.fn(*inputs)]
    if impl.ours and op.second_form is not None:
        outputs.append(op.second_form(impl, tuple(inputs), ref))
    refs = ref if isinstance(ref, tuple) else (ref,)
    names = op.outputs
    if len(names) != len(refs):
        names = tuple(f"output {i}" for i in range(len(refs)))
    nan = float("nan")
    worst_abs = worst_rel = 0.0
    for out in outputs:
        got = out if isinstance(out, tuple) else (out,)
        if len(got) != len(refs):
            return nan, nan, False, f"got {len(got)} outputs, not {len(refs)}"
        for y, want, what in zip(got, refs, names, strict=True):
            if want is None or y is None:
                if y is not want:
                    return nan, nan, False, f"{what}: got {_kind(y)}, expected {_kind(want)}"
                continue
            if y.shape != want.shape or y.dtype != want.dtype:
                return nan, nan, False, f"{what}: got {y.dtype}{tuple(y.shape)}"
            a, r = errors(y, want)
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
            try:
                op.compare(y, want, what)
            except AssertionError as e:
                return worst_abs, worst_rel, False, str(e).splitlines()[0]
    return worst_abs, worst_rel, True, None


def _kind(t: Optional[torch.Tensor]) -> str:
    return "None" if t is None else f"{t.dtype}{tuple(t.shape)}"


def run_case(case: Case, impl: Impl, device: str, seed: int, op: Op = RMS_NORM) -> Result:
    """One case, one implementation: fresh inputs from the op's factory, checked against
    the op's reference."""
    inputs = op.make_inputs(case, device, seed)
    ref = op.reference(*inputs)
    try:
        a, r, ok, err = check(impl, *inputs, ref, op=op)
    except Exception as e:  # a crash is a failure of this case, reported, not hidden
        a, r, ok, err = float("nan"), float("nan"), False, f"{type(e).__name__}: {e}"
    return Result(case.id, impl.name, a, r, ok, err)


def cases_for(device: str) -> list[Case]:
    cases = all_cases()
    return [c.cpu_cap() for c in cases] if device == "cpu" else cases


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--impls",
        default=None,
        help=f"comma-separated from {','.join(registry())} (default: all that can run here)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="case i's inputs are drawn from seed + i (default 0)"
    )
    p.add_argument(
        "--cases",
        default="",
        help="only cases whose id contains this text, e.g. n4097 or -bf16 (default: all)",
    )
    return p


def parse_impls(p: argparse.ArgumentParser, text: Optional[str], known: list[str]) -> list[str]:
    """'triton, cuda' -> ['triton', 'cuda']: spaces and repeats dropped; argparse error
    (exit 2) for an unknown name or a list that names nothing."""
    return list(known) if text is None else names_arg(p, "--impls", text, known)


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    impls = registry()
    names = parse_impls(p, args.impls, list(impls))
    # (index, case): the index is the case's place in the full list, so its seed does not
    # depend on the filter
    cases = [(i, c) for i, c in enumerate(cases_for(device)) if args.cases in c.id]
    if not cases:
        p.error(
            f"--cases: no case id contains {args.cases!r}; ids look like "
            f"{', '.join(c.id for c in all_cases()[:3])}, ..."
        )
    print(f"device={device} seed={args.seed} (case i uses seed {args.seed}+i)")
    chosen = []
    for n in names:
        why = runnable(impls[n], device)
        if why:
            print(f"skip {n}: {why}")
        else:
            chosen.append(impls[n])
    if not chosen:
        print(f"no implementation can run here: {', '.join(names)} skipped", file=sys.stderr)
        return 1
    results = []
    print(f"{'case':<28} {'impl':<8} {'max abs err':>12} {'max rel err':>12}  result")
    for i, case in cases:
        for impl in chosen:
            r = run_case(case, impl, device, args.seed + i)
            results.append(r)
            tail = "PASS" if r.ok else f"FAIL  {r.error}"
            print(f"{r.case:<28} {r.impl:<8} {r.max_abs:>12.3e} {r.max_rel:>12.3e}  {tail}")
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
