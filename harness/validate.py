"""Run every numerical case of each op against every runnable implementation of ours and
print a table.

    python -m harness.validate [--ops rms_norm,fused_add_rms_norm] [--impls triton,cuda]
                               [--seed 0] [--cases SUBSTR]

The ops are harness.bench's, with the same default: the forward ops (rms_norm and the
fused residual add + RMSNorm, its in-place form included); --ops also takes the gradient
ops by name (rms_norm_fwd_bwd, rms_norm_bwd, fused_add_rms_norm_fwd_bwd). Each op has its
own cases (harness.ops.Op.cases). Inputs are fresh per case (seeded: seed + the case's
index in its op's list, printed); our kernels' second form is checked too (rms_norm's
out= into an output poisoned with NaN, so an unwritten element fails; the fused add in
place; the gradient ops with every allocation NaN-filled). Without a GPU, cases run on CPU
through the Triton interpreter with M capped (cases.CPU_MAX_ELEMENTS).

Exit status, the rule harness.bench follows too: 1 if any case fails. An implementation
that cannot run here (the CUDA kernels without a GPU) is named as skipped, with the reason,
and is not a failure; but a run in which nothing at all could be checked exits 1, since a
clean exit would claim checks that did not happen.
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from typing import Optional

import torch

from harness.cases import Case
from harness.impls import Impl, registry, runnable
from harness.ops import FORWARD_OPS, OPS, RMS_NORM, Op
from harness.plan import names_arg
from harness.reference import TOL


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
    if impl.reference is not None:  # a peer checked against its own documented rounding
        ref = impl.reference(*inputs)
    outputs = [impl.fn(*inputs)]
    if impl.ours and op.second_form is not None:
        outputs.append(op.second_form(impl, tuple(inputs), ref))
    refs = ref if isinstance(ref, tuple) else (ref,)
    compare = op.compare
    if impl.rounds_in_dtype:
        compare = functools.partial(compare, rel=TOL[inputs[0].dtype]["rtol"])
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
            if y.shape != want.shape or (op.exact_dtypes and y.dtype != want.dtype):
                return nan, nan, False, f"{what}: got {y.dtype}{tuple(y.shape)}"
            a, r = errors(y, want)
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
            try:
                compare(y, want, what)
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


def cases_for(device: str, op: Op = RMS_NORM) -> list[Case]:
    """op's cases, with M capped on CPU."""
    cases = op.cases()
    return [c.cpu_cap() for c in cases] if device == "cpu" else cases


#: The ops a run checks when --ops names none: harness.bench's default.
DEFAULT_OPS = tuple(FORWARD_OPS)

#: What a run that checked nothing says, on stderr, before it exits 1 (harness.bench too).
NOTHING_CHECKED = "nothing was checked: no implementation named can run here"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--ops",
        default=None,
        help=f"comma-separated from {', '.join(OPS)} (default: {', '.join(DEFAULT_OPS)}, "
        "as harness.bench)",
    )
    p.add_argument(
        "--impls",
        default=None,
        help=f"comma-separated from {','.join(registry())} (default: all; those that cannot "
        "run here are named as skipped, not failed)",
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
    ops = [
        OPS[n] for n in (names_arg(p, "--ops", args.ops, tuple(OPS)) if args.ops else DEFAULT_OPS)
    ]
    names = parse_impls(p, args.impls, list(registry()))
    # (index, case) an op: the index is the case's place in the op's full list, so its seed
    # does not depend on the filter
    work = {
        op.name: [(i, c) for i, c in enumerate(cases_for(device, op)) if args.cases in c.id]
        for op in ops
    }
    if not any(work.values()):
        some = ", ".join(c.id for op in ops for c in op.cases()[:2])
        p.error(
            f"--cases: no case id of {', '.join(work)} contains {args.cases!r}; ids look "
            f"like {some}, ... (ops are chosen with --ops)"
        )
    print(f"device={device} seed={args.seed} (case i of an op uses seed {args.seed}+i)")
    chosen: dict[str, list[Impl]] = {}
    for op in ops:
        impls = op.registry()
        chosen[op.name] = []
        for n in names:
            why = runnable(impls[n], device) if n in impls else f"{op.name} has none"
            if why:
                print(f"skip {n} ({op.name}): {why}")
            else:
                chosen[op.name].append(impls[n])
    results = []
    print(f"{'op':<26} {'case':<28} {'impl':<8} {'max abs err':>12} {'max rel err':>12}  result")
    for op in ops:
        for i, case in work[op.name]:
            for impl in chosen[op.name]:
                r = run_case(case, impl, device, args.seed + i, op=op)
                results.append(r)
                tail = "PASS" if r.ok else f"FAIL  {r.error}"
                print(
                    f"{op.name:<26} {r.case:<28} {r.impl:<8} {r.max_abs:>12.3e} "
                    f"{r.max_rel:>12.3e}  {tail}"
                )
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if not results:
        print(f"{NOTHING_CHECKED} ({', '.join(names)} skipped)", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
