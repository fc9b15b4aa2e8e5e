"""The benchmark: validate, then time, every implementation of each op; write records,
plots, report.

    python -m harness.bench [--ops rms_norm,fused_add_rms_norm] [--quick]
                            [--dtypes bf16,fp16] [--shapes 4096x4096,1x8192]
                            [--impls triton,cuda,compile] [--out DIR] [--append]
                            [--profile] [--require-gpu] [--budget-s 540] [--seed 0]

The ops (harness.ops.OPS), into one records.jsonl, each record naming its op: by default
the forward ops (FORWARD_OPS), rms_norm and the fused residual add + RMSNorm; --ops also
takes the gradient ops (GRAD_OPS), asked for by name as they fill a device call of their
own: rms_norm_fwd_bwd (forward + backward as one call), rms_norm_bwd (the backward alone)
and fused_add_rms_norm_fwd_bwd, e.g. --ops rms_norm_fwd_bwd,rms_norm_bwd.
Shapes (each op's plan, harness.plan; --quick takes a handful of them, --shapes replaces
them for every op):
- the forward ops: grid, N in LARGE_NS with M = 2**27 // N (128 Mi elements: far beyond
  L2), per dtype; msweep, M = 1, 2, 4, ..., 32768 at N = 4096 in bf16 (bandwidth against
  the work); decode, M in {1, 8, 32, 128} x N in {4096, 8192} in bf16 (graph and host time);
- the gradient ops: grid, N in GRAD_NS with M = 2**27 // N (fp32: 2**26 // N).
A shape in several sections is measured once an op, by harness.measure: the op's fresh
seeded inputs, every implementation checked against the reference (a failure is written as
FAIL and never timed), then timed cold, interleaved, and for small shapes also under CUDA
graphs and on the host. Each record is written as soon as it is measured. The ops take
turns shape by shape (the i-th shape of every op, then the next), so the shapes most
important first are measured for all and a spent budget cuts every op's tail alike: the
run starts no new measurement after --budget-s seconds (the rest recorded as skipped), so
it fits one 10-minute device call.

Without a GPU it says so, checks each op's Triton kernel under the interpreter (on
--shapes with M capped as harness.cases caps the CPU cases, else on three small shapes; in
--dtypes), and redraws the committed results/h200 plots and report into --out (NO_GPU_OUT
by default); --require-gpu makes it exit 1 instead. Every argument is checked on any machine;
the flags that only mean something on a GPU are named as ignored.

Exit status, the rule harness.validate follows too: 1 if any of our kernels fails its
check. An implementation that cannot run here (without a GPU, all but triton) is named as
skipped, with the reason, and is not a failure; but a run in which nothing at all could be
checked exits 1 (without a GPU, after the redraw), since a clean exit would claim checks
that did not happen.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

import torch

from harness import analysis, hardware, measure, records
from harness.cases import CPU_MAX_ELEMENTS, Case
from harness.impls import Impl, runnable
from harness.ops import FORWARD_OPS, OPS, Op
from harness.plan import DTYPES, Planned, names_arg, parse_shapes
from harness.validate import NOTHING_CHECKED
from rmsnorm_api import MAX_N

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "results" / "h200" / "records.jsonl.xz"  # committed runs are kept xz'd
#: Where a run without a GPU redraws the committed results unless --out says otherwise:
#: one fixed place, overwritten by each run, outside the repository.
NO_GPU_OUT = Path(tempfile.gettempdir()) / "rmsnorm-bench"
#: The shapes the interpreter checks without a GPU when --shapes names none: an odd width
#: under 1024, one just past a power of two, and many narrow rows.
NO_GPU_SHAPES = (("n1000", (7, 1000)), ("n4097", (3, 4097)), ("m64-n128", (64, 128)))
#: Flags that only mean something on a GPU; without one they are named as ignored.
GPU_ONLY = {
    "--quick": "the interpreter check is already small",
    "--profile": "traces device kernels",
    "--append": "no records are written",
    "--resume": "no records are written",
    "--budget-s": "the interpreter check is not budgeted",
}

#: The ops a run measures when --ops names none.
DEFAULT_OPS = tuple(FORWARD_OPS)

#: --budget-s when not given: leaves a 10-minute device call time to write the plots.
DEFAULT_BUDGET_S = 540.0

#: The shape --profile traces when --shapes does not name one.
PROFILE_SHAPE = (4096, 4096)


def impl_names(ops: list[Op]) -> list[str]:
    """The implementation names of these ops, in their order (ours first), each once."""
    return list(dict.fromkeys(name for op in ops for name in op.order))


# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------


def run_gpu(args, names: list[str], out: Path) -> int:
    from tqdm import tqdm

    from harness import plot

    t_start = time.perf_counter()
    path = out / "records.jsonl"
    ops = args.ops
    held: dict[tuple, set[str]] = {}
    if args.resume and path.exists():
        sha, _dirty = hardware.git_info()
        try:
            held = measured(records.iter_records(path), sha, torch.cuda.get_device_name())
        except (ResumeMismatch, records.RecordError) as e:
            print(f"--resume: {e}", file=sys.stderr)
            return 1
    b = measure.start(path, append=args.append or args.resume, seed=args.seed, op=ops[0])
    impls = {op.name: _runnable(b, op, names) for op in ops}
    if not any(impls.values()):  # the skips are recorded; nothing else is to be done
        b.writer.close()
        print(f"{NOTHING_CHECKED} ({', '.join(names)} skipped)", file=sys.stderr)
        return 1
    plans = {op.name: _plan_of(op, args) for op in ops}
    work = schedule(ops, plans)
    if args.resume:
        left = unmeasured(work, impls, held)
        print(
            f"--resume: {len(work) - len(left)} of {len(work)} (op, shape) measurements "
            f"already in {path} at this commit on this GPU; {len(left)} left"
        )
        work = left
    each = ", ".join(
        f"{op.name} {len(plans[op.name])} shapes ({len(impls[op.name])} implementations)"
        for op in ops
    )
    print(f"{len(work)} (op, shape) measurements: {each} -> {path}")
    # a log file (not a terminal) gets a line every 5 s instead of every redraw
    every = 0.1 if sys.stderr.isatty() else 5.0
    bar = tqdm(work, unit="op-shape", dynamic_ncols=True, file=sys.stderr, mininterval=every)
    rest: list[tuple[Op, Planned]] = []
    for i, (op, p) in enumerate(bar):
        if time.perf_counter() - t_start > args.budget_s:
            rest = work[i:]
            tqdm.write(
                f"time budget of {args.budget_s:.0f} s spent: {len(rest)} (op, shape) "
                "measurements not run"
            )
            for op_left, q in rest:
                b.op = op_left
                measure.write_skipped(b, "all", q)
            break
        bar.set_postfix_str(f"{op.name} {p.dtype} {p.m}x{p.n}")
        b.op = op
        measure.measure_shape(b, p, impls[op.name])
        torch.cuda.empty_cache()
    bar.close()
    b.writer.close()
    print(f"{b.writer.count} records in {time.perf_counter() - t_start:.0f} s -> {path}")
    if args.resume:
        print(
            f"--resume: {len(rest)} (op, shape) measurements left; run the same command "
            "again, its records file carried back, to go on"
            if rest
            else "--resume: the run is complete"
        )
    try:
        for f in plot.redraw(path, out):
            print(f"wrote {f}")
    except analysis.NoMeasurements as e:  # every implementation skipped: nothing to draw
        print(f"no plots or report: {e}")
    return 1 if b.ours_failed else 0


class ResumeMismatch(ValueError):
    """The records a --resume would continue were measured at another commit or on another
    GPU: one run of record is one commit on one GPU."""


def measured(recs: Iterable[dict], sha: Optional[str], gpu: str) -> dict[tuple, set[str]]:
    """{(op, dtype, M, N): the implementations measured there} of a records file that
    --resume continues: a cold PASS timing, or a FAIL (written untimed), counts; a shape
    the budget cut (a SKIP) does not. ResumeMismatch where a timing was made at another
    commit or on another GPU than (sha, gpu)."""
    held: dict[tuple, set[str]] = {}
    for r in recs:
        if r["kind"] != "timing":
            continue
        at = (r["env"].get("git_sha"), r["env"].get("gpu"))
        if at != (sha, gpu):
            raise ResumeMismatch(
                f"the records hold a timing at {at[0]} on {at[1]}, this run is {sha} on "
                f"{gpu}: one run of record is one commit on one GPU (start a new records "
                "file, without --resume)"
            )
        if r["status"] == "FAIL" or (r["status"] == "PASS" and r["mode"] == "cold"):
            m, n = r["shape"]
            held.setdefault((r["op"], r["dtype"], m, n), set()).add(r["impl"])
    return held


def unmeasured(
    work: list[tuple[Op, Planned]], impls: dict[str, list[Impl]], held: dict[tuple, set[str]]
) -> list[tuple[Op, Planned]]:
    """The (op, shape)s of work that held (measured's) lacks for any of the op's runnable
    implementations: what a --resume still measures, in work's order."""
    return [
        (op, p)
        for op, p in work
        if not {i.name for i in impls[op.name]} <= held.get((op.name, p.dtype, p.m, p.n), set())
    ]


def schedule(ops: list[Op], plans: dict[str, list[Planned]]) -> list[tuple[Op, Planned]]:
    """The run's order: the first shape of every op, then the second, ...: every op gets its
    headline shapes before the budget can run out, and a spent budget cuts the same tail
    from all (ops with the same plan take each shape in turn)."""
    longest = max((len(v) for v in plans.values()), default=0)
    return [
        (op, plans[op.name][i]) for i in range(longest) for op in ops if i < len(plans[op.name])
    ]


def _plan_of(op: Op, args: argparse.Namespace) -> list[Planned]:
    """op's planned shapes, less those whose N it cannot take (op.n_multiple), which are
    named (--shapes never holds one: parse_args refuses it)."""
    planned = op.plan(args.dtypes, quick=args.quick, shapes=args.shapes)
    left = [q for q in planned if q.n % op.n_multiple]
    if left:
        names = ", ".join(sorted({f"N = {q.n}" for q in left}, key=lambda t: int(t[4:])))
        print(f"{op.name}: {len(left)} planned shapes left out ({names}: not a multiple of "
              f"{op.n_multiple})")  # fmt: skip
    return [q for q in planned if not q.n % op.n_multiple]


def _runnable(b: measure.Bench, op: Op, names: list[str]) -> list[Impl]:
    """The named implementations of op that can run on the GPU; a SKIP record (of op) for
    each that cannot, with the reason."""
    all_impls = op.registry(baselines=True)
    b.op = op
    impls = []
    for name in names:
        why = runnable(all_impls[name], "cuda") if name in all_impls else f"{op.name} has none"
        if why:
            print(f"skip {name} ({op.name}): {why}")
            b.write(name, kind="skip", status="SKIP", notes=[why])
        else:
            impls.append(all_impls[name])
    return impls


def run_profile(args, names: list[str], out: Path) -> int:
    """--profile: one Chrome trace per op and implementation at one shape, into
    out/traces/ (rms_norm's named IMPL-DTYPE-MxN.json, another op's prefixed with its
    name, as its plots are)."""
    traces = out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    for op in args.ops:
        _profile_op(args, op, names, traces)
    return 0


def _profile_op(args, op: Op, names: list[str], traces: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    m, n = args.shapes[0] if args.shapes else PROFILE_SHAPE
    dname = args.dtypes[0]
    inputs = op.make_inputs(Planned(dname, m, n), "cuda", args.seed)
    all_impls = op.registry(baselines=True)
    prefix = "" if op is OPS["rms_norm"] else f"{op.name}-"
    for name in names:
        impl = all_impls.get(name)
        why = runnable(impl, "cuda") if impl else f"{op.name} has none"
        if why:
            print(f"skip {name} ({op.name}): {why}")
            continue
        try:
            fn = impl.prepare(*inputs)[0] if impl.prepare else impl.fn
            for _ in range(3):
                fn(*inputs)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn(*inputs)
                torch.cuda.synchronize()
            f = traces / f"{prefix}{name}-{dname}-{m}x{n}.json"
            prof.export_chrome_trace(str(f))
            print(f"wrote {f}")
        except Exception as e:
            print(f"{name} ({op.name}): profiling failed: {measure.first_line(e)}")


def run_without_gpu(args, out: Path) -> int:
    """No GPU: check each op's Triton kernel under the interpreter, redraw the committed
    H200 results."""
    from harness import plot

    ignored = [f"{flag} ({why})" for flag, why in GPU_ONLY.items() if _given(args, flag)]
    if ignored:
        print(f"without a GPU these do not apply and are ignored: {'; '.join(ignored)}")
    skipped = [n for n in args.impls if n != "triton"]
    if args.impls_given:
        for name in skipped:
            impl = next(op.registry(baselines=True)[name] for op in args.ops if name in op.order)
            why = runnable(impl, "cpu") or "only triton runs under the interpreter"
            print(f"skip {name}: {why}")
    elif skipped:
        print(f"checking triton only: {', '.join(skipped)} need a CUDA GPU")
    failed = 0
    checked = "triton" in args.impls
    if checked:
        for op in args.ops:
            failed += _interpret(args, op)
    if COMMITTED.exists():
        for f in plot.redraw(COMMITTED, out):
            print(f"wrote {f}")
        print(f"redrew the committed H200 run ({COMMITTED.relative_to(REPO)}) into {out}")
    else:
        print(
            f"no committed H200 records yet ({COMMITTED.relative_to(REPO)} does not exist):"
            " nothing to redraw; run python -m harness.bench on a GPU and commit"
            " results/<gpu>/"
        )
    if not checked:
        print(f"{NOTHING_CHECKED} ({', '.join(args.impls)} skipped)", file=sys.stderr)
        return 1
    return 1 if failed else 0


def _interpret(args, op: Op) -> int:
    """op's Triton kernel against its reference under the interpreter, on --shapes (M
    capped) or NO_GPU_SHAPES, in --dtypes; a line a case. Returns how many failed."""
    from harness.validate import run_case

    triton = op.registry()["triton"]
    if why := runnable(triton, "cpu"):
        print(f"triton ({op.name}): {why}")
        return 1
    named = (
        [(f"{m}x{n}", (m, n)) for m, n in args.shapes]
        if args.shapes
        else op.no_gpu_shapes or NO_GPU_SHAPES
    )
    cases = [Case(name, shape, DTYPES[d]) for d in args.dtypes for name, shape in named]
    failed = 0
    for i, full in enumerate(cases):
        case = full.cpu_cap()
        r = run_case(case, triton, "cpu", args.seed + i, op=op)
        failed += not r.ok
        capped = f" (M capped to {case.m} of {full.m})" if case.m != full.m else ""
        print(
            f"interpreter {r.case:<14} {op.name:<26} max rel {r.max_rel:.2e} "
            f"{'PASS' if r.ok else 'FAIL ' + str(r.error)}{capped}"
        )
    return failed


def _given(args, flag: str) -> bool:
    """Whether flag was on the command line (store_true flags and --budget-s alike)."""
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    return value is not None and value is not False


EPILOG = f"""\
without a GPU:
  Each op's Triton kernel (--ops) is checked against its reference under the Triton
  interpreter (CPU): on the --shapes given (M cut so a case keeps at most
  {CPU_MAX_ELEMENTS} elements, N never), else on three small shapes, in each of
  --dtypes. Only triton runs there: the other --impls are named as skipped, with the
  reason. Then the committed H200 results
  (results/h200/records.jsonl.xz) are redrawn, plots and report.md, into --out, by default
  {NO_GPU_OUT} (overwritten by each run).
  Named as ignored (they only apply on a GPU): {", ".join(GPU_ONLY)}.
  --require-gpu exits 1 instead.

exit status (harness.validate's rule too):
  1 if any of our kernels fails its check. An implementation that cannot run here is
  named as skipped, with the reason, and is not a failure; but if nothing at all could be
  checked (e.g. --impls cuda without a GPU) the run exits 1, after the redraw.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.bench",
        description="Validate, time and report every implementation of RMSNorm and of the "
        "fused\nresidual add + RMSNorm. Without a GPU: check the Triton kernels under the "
        "interpreter\nand redraw the committed results (see the end of this help).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--ops",
        default=None,
        help=f"comma-separated from {', '.join(OPS)}, or all (default: "
        f"{', '.join(DEFAULT_OPS)}; one records file for all)",
    )
    p.add_argument(
        "--quick", action="store_true", help="a handful of bf16 shapes (a minute or two; GPU only)"
    )
    p.add_argument(
        "--dtypes",
        default=None,
        help="comma-separated from fp32,fp16,bf16 (default: all three for the "
        "grid; bf16 with --quick or --shapes)",
    )
    p.add_argument(
        "--shapes",
        default=None,
        help=f"MxN list replacing the grid, e.g. 4096x4096,1x8192; N <= {MAX_N}",
    )
    p.add_argument(
        "--impls",
        default=None,
        help=f"comma-separated from {', '.join(impl_names(list(OPS.values())))} (default: all; "
        "the same names for every op; without a GPU only triton runs)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output directory, checked before any work (default: results/<gpu>/ on a "
        f"GPU, {NO_GPU_OUT} without one)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="append to records.jsonl, not replace (GPU only)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="append, measuring only the (op, shape)s that records.jsonl in --out does not "
        "yet hold for every named implementation at this commit on this GPU: the same "
        "command again continues a run its budget cut (GPU only)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="only write a torch.profiler Chrome trace per implementation at one "
        f"shape (the first of --shapes, else {PROFILE_SHAPE[0]}x{PROFILE_SHAPE[1]}; "
        "GPU only)",
    )
    p.add_argument("--require-gpu", action="store_true", help="exit 1 if there is no GPU")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no new measurement (one op at one shape) after this many seconds "
        f"(default {DEFAULT_BUDGET_S:.0f}, for all ops together; GPU only)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the random inputs; a shape's inputs depend on it and on M and N (default 0)",
    )
    return p


def parse_args(
    argv: Optional[list[str]] = None, p: Optional[argparse.ArgumentParser] = None
) -> argparse.Namespace:
    """The checked arguments: the same checks on any machine, GPU or not."""
    p = p or build_parser()
    args = p.parse_args(argv)

    given_ops = args.ops is not None
    if args.ops == "all":  # the study's every op and variant: a run of record
        op_names = list(OPS)
    else:
        op_names = names_arg(p, "--ops", args.ops, tuple(OPS)) if given_ops else list(DEFAULT_OPS)
    args.ops = [OPS[name] for name in op_names]
    known = impl_names(args.ops)
    args.impls_given = args.impls is not None
    args.impls = names_arg(p, "--impls", args.impls, known) if args.impls_given else list(known)
    try:
        args.shapes = parse_shapes(args.shapes) if args.shapes is not None else None
    except ValueError as e:
        p.error(f"--shapes: {e}")
    for op in args.ops:
        ragged = [f"{m}x{n}" for m, n in args.shapes or [] if n % op.n_multiple]
        if ragged:
            p.error(
                f"--shapes: {','.join(ragged)} has N not a multiple of {op.n_multiple}, "
                f"which {op.name} needs (whole groups)"
            )
    wide = [f"{m}x{n}" for m, n in args.shapes or [] if n > MAX_N]
    if wide:
        p.error(
            f"--shapes: {','.join(wide)} has N > {MAX_N}, the widest row the kernels "
            "accept (rmsnorm_api.MAX_N)"
        )
    default_dtypes = "bf16" if (args.quick or args.shapes) else "bf16,fp16,fp32"
    given = args.dtypes if args.dtypes is not None else default_dtypes
    args.dtypes = names_arg(p, "--dtypes", given, tuple(DTYPES))
    if args.quick and args.shapes:
        p.error("--quick and --shapes are exclusive: --shapes replaces the grid")
    return records.refuse_bad_run_args(p, args)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv, p := build_parser())
    if hardware.no_gpu_refused(args):
        return 1
    if not torch.cuda.is_available():
        out = Path(args.out) if args.out is not None else NO_GPU_OUT
        if why := records.out_dir_problem(out):
            p.error(f"--out {out} (the default without a GPU) {why}")
        where = "--out" if args.out is not None else "the default output place without a GPU"
        print(
            f"no CUDA GPU: checking the Triton kernels ({', '.join(op.name for op in args.ops)}) "
            f"under the interpreter and redrawing the committed H200 results into {out} ({where})"
        )
        return run_without_gpu(args, out)
    out = hardware.gpu_out_dir(p, args)
    if args.budget_s is None:
        args.budget_s = DEFAULT_BUDGET_S
    if args.profile:
        return run_profile(args, args.impls, out)
    return run_gpu(args, args.impls, out)


if __name__ == "__main__":
    sys.exit(main())
