"""The benchmark: validate, then time, every implementation; write records, plots, report.

    python -m harness.bench [--quick] [--dtypes bf16,fp16] [--shapes 4096x4096,1x8192]
                            [--impls triton,cuda,compile] [--out DIR] [--append]
                            [--profile] [--require-gpu] [--budget-s 540] [--seed 0]

Shapes (the default grid; --quick takes a handful of them, --shapes replaces them):
- grid: N in LARGE_NS with M = 2**27 // N (128 Mi elements: far beyond L2), per dtype;
- msweep: M = 1, 2, 4, ..., 32768 at N = 4096 in bf16 (bandwidth against the work);
- decode: M in {1, 8, 32, 128} x N in {4096, 8192} in bf16 (graph and host time).
A shape in several sections is measured once. Each shape, in order:
1. fresh seeded inputs (x ~ randn, weight ~ 1 + randn/2, x's dtype; eps 1e-6) and the
   reference on them;
2. per implementation: prepare (compile's fresh per-shape compile, timed apart), check
   against harness.reference with TOL on those very inputs; a failure is written as FAIL
   and never timed; one profiled call per implementation and shape class records the
   kernels that ran;
3. warm-up, then three cold-timing blocks with the implementations interleaved;
4. for small shapes also CUDA-graph device time and host time per call.
Each record is written as soon as it is measured. The run stops starting new shapes after
--budget-s seconds (recorded as skipped), so it fits one 10-minute device call.

Without a GPU it says so, checks the Triton kernel under the interpreter (on --shapes with
M capped as harness.cases caps the CPU cases, else on three small shapes; in --dtypes),
and redraws the committed results/h200 plots and report into --out (NO_GPU_OUT by
default); --require-gpu makes it exit 1 instead. Every argument is checked on any machine;
the flags that only mean something on a GPU are named as ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from harness import hardware, records, report, timing
from harness.cases import CPU_MAX_ELEMENTS, Case
from harness.impls import BASELINES, OURS, Impl, registry, runnable
from harness.reference import rms_norm_ref
from harness.validate import check
from rmsnorm_api import MAX_N

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "results" / "h200" / "records.jsonl"
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
    "--budget-s": "the interpreter check is not budgeted",
}

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
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
)
MSWEEP_N = 4096
MSWEEP_MS = tuple(2**k for k in range(16))  # 1 .. 32768
DECODE = tuple((m, n) for n in (4096, 8192) for m in (1, 8, 32, 128))

#: bf16 shapes measured independently of this harness, to check it against (the figures:
#: docs/PERF_NOTES.md).
REFERENCE = ((8192, 8192),)

QUICK_NS = (4096, 4097, 8192)
QUICK_MSWEEP = (1, 64, 1024, 32768)  # 32768 x 4096 is also a grid shape
QUICK_DECODE = ((8, 4096),)

#: --budget-s when not given: leaves a 10-minute device call time to write the plots.
DEFAULT_BUDGET_S = 540.0

#: The shape --profile traces when --shapes does not name one.
PROFILE_SHAPE = (4096, 4096)


@dataclass
class Planned:
    dtype: str
    m: int
    n: int
    sections: list[str] = field(default_factory=list)


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
    wanted: list[tuple[str, int, int, str]] = []
    if shapes:
        wanted += [(d, m, n, "custom") for d in dtypes for m, n in shapes]
    else:
        ns = QUICK_NS if quick else LARGE_NS
        ms = QUICK_MSWEEP if quick else MSWEEP_MS
        decode = QUICK_DECODE if quick else DECODE
        grid = {d: [(d, GRID_ELEMENTS // n, n, "grid") for n in ns] for d in dtypes}
        # bf16 first (the headline), then the M sweep and decode shapes, then fp16, fp32
        wanted += grid.pop("bf16", [])
        if "bf16" in dtypes:
            wanted += [("bf16", m, MSWEEP_N, "msweep") for m in ms]
            wanted += [("bf16", m, n, "decode") for m, n in decode]
            if not quick:
                wanted += [("bf16", m, n, "reference") for m, n in REFERENCE]
        for d in ("fp16", "fp32"):
            wanted += grid.pop(d, [])
    out: dict[tuple[str, int, int], Planned] = {}
    for d, m, n, section in wanted:
        p = out.setdefault((d, m, n), Planned(d, m, n))
        if section not in p.sections:
            p.sections.append(section)
    return list(out.values())


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


# ---------------------------------------------------------------------------------------
# what ran: profiler and Triton register counts
# ---------------------------------------------------------------------------------------


def kernels_of(call, name: str) -> dict:
    """The device kernels one call launches: {names, count, path}.

    ``path`` says what the names prove: for native, fused (one kernel) or composite;
    for compile, whether Inductor's generated triton_* kernels ran.
    """
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [
        e.name
        for e in prof.events()
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
    ]
    path = None
    if name == "native":
        path = "fused" if len(names) == 1 else "composite"
    elif name == "compile":
        path = "inductor" if any(n.startswith("triton_") for n in names) else "NOT-COMPILED"
    return {"names": sorted(set(names)), "count": len(names), "path": path}


def _resources(impl: Impl, x, w) -> Optional[list[dict]]:
    """What the kernel an implementation of ours launches for x uses (None for peers)."""
    if impl.resources is None:
        return None
    try:
        return [impl.resources(x, w)]
    except Exception as e:  # recorded, never fatal: the timing does not depend on it
        return [{"error": _first_line(e)}]


# ---------------------------------------------------------------------------------------
# one shape
# ---------------------------------------------------------------------------------------


@dataclass
class Bench:
    """What every shape's measurement shares."""

    run_id: str
    env: dict
    writer: records.RecordWriter
    flush: timing.L2Flush
    small_bytes: float
    seed: int
    kernels: dict = field(default_factory=dict)  # (impl, class) -> kernels_of(...)
    ours_failed: int = 0

    def write(self, impl: str, kind: str = "timing", **fields) -> dict:
        rec = records.make_record(run_id=self.run_id, env=self.env, kind=kind, impl=impl, **fields)
        self.writer.write(rec)
        return rec


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {records.plain_text(text[0]) if text else ''}"


def _validate(impl: Impl, x, w, ref) -> tuple[Optional[object], Optional[float], dict]:
    """Prepare and check one implementation on these inputs: (fn or None, compile_s, correct).

    compile_s is the wall time of the first call at this shape, kept out of the timing:
    torch.compile's trace and codegen (its ``prepare``), or for the others whatever JIT
    compilation a new shape triggers (Triton kernels, QuACK's CuTe DSL), plus one run."""
    compile_s = None
    try:
        fn = impl.fn
        if impl.prepare is not None:
            fn, compile_s = impl.prepare(x, w, EPS)
        else:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(x, w, EPS)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
        a, r, ok, err = check(dataclasses.replace(impl, fn=fn), x, w, EPS, ref)
        torch.cuda.synchronize()
    except Exception as e:  # a crash or a refusal is this shape's failure, reported
        a, r, ok, err = math.nan, math.nan, False, _first_line(e)
    correct = {"max_abs": a, "max_rel": r, "passed": ok, "error": err}
    return (fn if ok else None), compile_s, correct


def measure_shape(b: Bench, p: Planned, impls: list[Impl]) -> None:
    """Check, profile and time every implementation at one shape; write its records."""
    dtype = DTYPES[p.dtype]
    g = torch.Generator(device="cuda").manual_seed(b.seed + p.m * 131 + p.n)
    x = torch.randn(p.m, p.n, generator=g, device="cuda").to(dtype)
    w = (1.0 + 0.5 * torch.randn(p.n, generator=g, device="cuda")).to(dtype)
    nbytes = records.bytes_moved(p.m, p.n, x.element_size(), w.element_size())
    small = nbytes < b.small_bytes
    base = dict(
        dtype=p.dtype,
        shape=[p.m, p.n],
        sections=p.sections,
        shape_class=shape_class(p.dtype, p.n, small),
        bytes=nbytes,
        small=small,
    )
    ready = _check_all(b, impls, x, w, base)
    if ready:
        _time_cold(b, ready, base)
    if ready and small:
        _time_small(b, ready, base)


def _check_all(b: Bench, impls: list[Impl], x, w, base: dict) -> dict[str, dict]:
    """Validate each implementation on (x, w); write FAIL records; profile the first of a
    shape class. Returns {name: {call, compile_s, correct, kernels, resources, notes}}."""
    from tqdm import tqdm

    ref = rms_norm_ref(x, w, EPS)
    cls, (m, n) = base["shape_class"], base["shape"]
    ready: dict[str, dict] = {}
    for impl in impls:
        fn, compile_s, correct = _validate(impl, x, w, ref)
        if fn is None:
            b.ours_failed += impl.ours
            tqdm.write(f"FAIL {impl.name} {base['dtype']} {m}x{n}: {correct['error']}")
            b.write(
                impl.name,
                mode="cold",
                status="FAIL",
                correct=correct,
                compile_s=compile_s,
                notes=list(impl.notes),
                **base,
            )
            continue
        call = functools.partial(fn, x, w, EPS)
        key = (impl.name, cls)
        if key not in b.kernels:
            try:
                found = kernels_of(call, impl.name)
            except Exception as e:
                found = {"names": [], "count": 0, "path": f"profiler failed: {_first_line(e)}"}
            b.kernels[key] = {"class": cls, "profiled_shape": [m, n], **found}
        resources = _resources(impl, x, w)
        ready[impl.name] = dict(
            call=call,
            compile_s=compile_s,
            correct=correct,
            kernels=b.kernels[key],
            resources=resources,
            notes=impl.notes,
        )
    return ready


def _time_cold(b: Bench, ready: dict[str, dict], base: dict) -> None:
    """Warm up, then three interleaved cold blocks; one PASS record per implementation."""
    # warm-up, each implementation on its own so one that breaks now is dropped, not fatal
    for name in list(ready):
        try:
            timing.warm_up([ready[name]["call"]], timing.WARMUP_S / len(ready))
        except Exception as e:
            r = ready.pop(name)
            r["correct"] = {**r["correct"], "passed": False, "error": _first_line(e)}
            b.write(
                name,
                mode="cold",
                status="FAIL",
                correct=r["correct"],
                notes=["raised in warm-up"],
                **base,
            )
    if not ready:
        return
    fns = {name: r["call"] for name, r in ready.items()}
    reps = {name: timing.reps_for(timing.estimate_s(f, b.flush)) for name, f in fns.items()}
    clk0 = hardware.clocks()
    blocks = timing.interleaved(fns, reps, b.flush)
    clk = _merge_clocks(clk0, hardware.clocks())
    nbytes, small = base["bytes"], base["small"]
    for name, r in ready.items():
        per_block, stats, spr = timing.block_summary(blocks[name])
        gb = records.gbps(nbytes, stats["median_us"] * 1e-6)
        b.write(
            name,
            mode="cold",
            status="PASS",
            correct=r["correct"],
            samples_us=[v for blk in blocks[name] for v in timing.to_us(blk)],
            blocks=per_block,
            stats=stats,
            spread=spr,
            gbps=gb,
            gbps_lo=records.gbps(nbytes, stats["p80_us"] * 1e-6),
            gbps_hi=records.gbps(nbytes, stats["p20_us"] * 1e-6),
            pct_peak=_pct(gb, b.env.get("peak_gbps"), small),
            pct_copy=_pct(gb, b.env.get("copy_gbps"), small),
            kernels=r["kernels"],
            compile_s=r["compile_s"],
            resources=r["resources"],
            clocks=clk,
            notes=list(r["notes"]) + ["L2 flushed before each repetition"],
            **base,
        )


def _time_small(b: Bench, ready: dict[str, dict], base: dict) -> None:
    """Small shapes: CUDA-graph device time and host time per call, a record each."""
    notes = {
        "graph": "CUDA-graph replay of 20 back-to-back calls, L2 warm",
        "host": "host wall time per call, 100 calls without sync",
    }
    clk = hardware.clocks()
    for name, r in ready.items():
        for mode, sampler in (("graph", timing.graph_samples), ("host", timing.host_samples)):
            got, err = timing.maybe(functools.partial(sampler, r["call"]))
            if got is None:
                b.write(
                    name,
                    mode=mode,
                    status="SKIP",
                    kernels=r["kernels"],
                    notes=[f"{mode} timing failed: {err}"],
                    **base,
                )
                continue
            us = timing.to_us(got)
            stats = timing.summarize(us)
            gb = records.gbps(base["bytes"], stats["median_us"] * 1e-6)
            b.write(
                name,
                mode=mode,
                status="PASS",
                correct=r["correct"],
                samples_us=us,
                stats=stats,
                kernels=r["kernels"],
                clocks=clk,
                gbps=gb if mode == "graph" else None,
                notes=[notes[mode]],
                **base,
            )


def _pct(gb: Optional[float], ceiling: Optional[float], small: bool) -> Optional[float]:
    """gb as % of a ceiling; None for small shapes, whose bytes need not come from HBM."""
    return 100 * gb / ceiling if gb and ceiling and not small else None


def _merge_clocks(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """The clock reading after timing, marked throttled if either reading was."""
    if after is None:
        return before
    merged = dict(after)
    merged["throttled"] = bool(after.get("throttled") or (before or {}).get("throttled"))
    merged["reasons"] = sorted(
        set(after.get("reasons", [])) | set((before or {}).get("reasons", []))
    )
    merged["sm_mhz_before"] = (before or {}).get("sm_mhz")
    return merged


# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------


def run_gpu(args, names: list[str], out: Path) -> int:
    from tqdm import tqdm

    from harness import plot

    t_start = time.perf_counter()
    env = hardware.environment()
    peak = hardware.theoretical_peak()
    print(
        f"{env['gpu']}: peak {peak['gbps'] or float('nan'):.0f} GB/s ({peak['source']}); "
        "measuring the copy ceiling ...",
        flush=True,
    )
    copy = hardware.copy_ceiling()
    env.update(
        peak_gbps=peak["gbps"],
        peak_source=peak["source"],
        mem_clock_mhz=peak["mem_clock_mhz"],
        bus_width_bits=peak["bus_width_bits"],
        copy_gbps=copy["gbps"],
    )
    print(f"copy ceiling {copy['gbps']:.0f} GB/s (1 GiB device-to-device, read + written)")
    run_id = records.new_run_id()
    path = out / "records.jsonl"
    writer = records.RecordWriter(path, append=args.append)
    l2 = env["l2_bytes"] or (50 << 20)
    b = Bench(
        run_id=run_id,
        env=env,
        writer=writer,
        flush=timing.L2Flush(l2),
        small_bytes=max(l2, 20e-6 * copy["gbps"] * 1e9),
        seed=args.seed,
    )
    copy_stats = timing.summarize(copy["samples_us"])
    b.write(
        "copy",
        kind="copy",
        bytes=copy["bytes"],
        samples_us=copy["samples_us"],
        stats=copy_stats,
        gbps=copy["gbps"],
        gbps_lo=records.gbps(copy["bytes"], copy_stats["p80_us"] * 1e-6),
        gbps_hi=records.gbps(copy["bytes"], copy_stats["p20_us"] * 1e-6),
        pct_peak=100 * copy["gbps"] / peak["gbps"] if peak["gbps"] else None,
        clocks=hardware.clocks(),
        notes=["torch copy_ of 1 GiB, bytes read + written"],
    )

    all_impls = registry(baselines=True)
    impls = []
    for name in names:
        why = runnable(all_impls[name], "cuda")
        if why:
            print(f"skip {name}: {why}")
            b.write(name, kind="skip", status="SKIP", notes=[why])
        else:
            impls.append(all_impls[name])
    shapes = plan(args.dtypes, quick=args.quick, shapes=args.shapes)
    print(f"{len(shapes)} shapes x {len(impls)} implementations -> {path}")
    # a log file (not a terminal) gets a line every 5 s instead of every redraw
    every = 0.1 if sys.stderr.isatty() else 5.0
    bar = tqdm(shapes, unit="shape", dynamic_ncols=True, file=sys.stderr, mininterval=every)
    for i, p in enumerate(bar):
        if time.perf_counter() - t_start > args.budget_s:
            rest = shapes[i:]
            tqdm.write(f"time budget of {args.budget_s:.0f} s spent: {len(rest)} shapes not run")
            for q in rest:
                b.write(
                    "all",
                    kind="skip",
                    status="SKIP",
                    dtype=q.dtype,
                    shape=[q.m, q.n],
                    sections=q.sections,
                    notes=["not run: time budget spent"],
                )
            break
        bar.set_postfix_str(f"{p.dtype} {p.m}x{p.n}")
        measure_shape(b, p, impls)
        torch.cuda.empty_cache()
    bar.close()
    writer.close()
    print(f"{writer.count} records in {time.perf_counter() - t_start:.0f} s -> {path}")
    try:
        for f in plot.redraw(path, out):
            print(f"wrote {f}")
    except report.NoMeasurements as e:  # every implementation skipped: nothing to draw
        print(f"no plots or report: {e}")
    return 1 if b.ours_failed else 0


def run_profile(args, names: list[str], out: Path) -> int:
    """--profile: one Chrome trace per implementation at one shape, into out/traces/."""
    from torch.profiler import ProfilerActivity, profile

    m, n = args.shapes[0] if args.shapes else PROFILE_SHAPE
    dname = args.dtypes[0]
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    x = torch.randn(m, n, generator=g, device="cuda").to(DTYPES[dname])
    w = (1.0 + 0.5 * torch.randn(n, generator=g, device="cuda")).to(x.dtype)
    traces = out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    all_impls = registry(baselines=True)
    for name in names:
        impl = all_impls[name]
        why = runnable(impl, "cuda")
        if why:
            print(f"skip {name}: {why}")
            continue
        try:
            fn = impl.prepare(x, w, EPS)[0] if impl.prepare else impl.fn
            for _ in range(3):
                fn(x, w, EPS)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn(x, w, EPS)
                torch.cuda.synchronize()
            f = traces / f"{name}-{dname}-{m}x{n}.json"
            prof.export_chrome_trace(str(f))
            print(f"wrote {f}")
        except Exception as e:
            print(f"{name}: profiling failed: {_first_line(e)}")
    return 0


def run_without_gpu(args, out: Path) -> int:
    """No GPU: check Triton under the interpreter, redraw the committed H200 results."""
    from harness import plot
    from harness.validate import run_case

    ignored = [f"{flag} ({why})" for flag, why in GPU_ONLY.items() if _given(args, flag)]
    if ignored:
        print(f"without a GPU these do not apply and are ignored: {'; '.join(ignored)}")
    all_impls = registry(baselines=True)
    skipped = [n for n in args.impls if n != "triton"]
    if args.impls_given:
        for name in skipped:
            why = runnable(all_impls[name], "cpu") or "only triton runs under the interpreter"
            print(f"skip {name}: {why}")
    elif skipped:
        print(f"checking triton only: {', '.join(skipped)} need a CUDA GPU")
    failed = 0
    if "triton" not in args.impls:
        print("no interpreter check: --impls names no implementation that runs without a GPU")
    elif why := runnable(all_impls["triton"], "cpu"):
        print(f"triton: {why}")
        failed = 1
    else:
        named = [(f"{m}x{n}", (m, n)) for m, n in args.shapes] if args.shapes else NO_GPU_SHAPES
        cases = [Case(name, shape, DTYPES[d]) for d in args.dtypes for name, shape in named]
        for i, full in enumerate(cases):
            case = full.cpu_cap()
            r = run_case(case, all_impls["triton"], "cpu", args.seed + i)
            failed += not r.ok
            capped = f" (M capped to {case.m} of {full.m})" if case.m != full.m else ""
            print(
                f"interpreter {r.case:<14} max rel {r.max_rel:.2e} "
                f"{'PASS' if r.ok else 'FAIL ' + str(r.error)}{capped}"
            )
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
    return 1 if failed else 0


def _given(args, flag: str) -> bool:
    """Whether flag was on the command line (store_true flags and --budget-s alike)."""
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    return value is not None and value is not False


EPILOG = f"""\
without a GPU:
  The Triton kernel is checked against the reference under the Triton interpreter (CPU):
  on the --shapes given (M cut so a case keeps at most {CPU_MAX_ELEMENTS} elements, N never),
  else on three small shapes, in each of --dtypes. Only triton runs there: the other
  --impls are named as skipped, with the reason. Then the committed H200 results
  (results/h200/records.jsonl) are redrawn, plots and report.md, into --out, by default
  {NO_GPU_OUT} (overwritten by each run).
  Named as ignored (they only apply on a GPU): {", ".join(GPU_ONLY)}.
  --require-gpu exits 1 instead.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.bench",
        description="Validate, time and report every RMSNorm implementation.\nWithout a "
        "GPU: check the Triton kernel under the interpreter and redraw the committed\n"
        "results (see the end of this help).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="a handful of bf16 shapes (< 1 min; GPU only)"
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
        help=f"comma-separated from {','.join(OURS + BASELINES)} (default: all; without "
        "a GPU only triton runs)",
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
        help=f"start no new shape after this many seconds (default {DEFAULT_BUDGET_S:.0f}; "
        "GPU only)",
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

    known = OURS + BASELINES
    args.impls_given = args.impls is not None
    args.impls = _names(p, "--impls", args.impls, known) if args.impls_given else list(known)
    try:
        args.shapes = parse_shapes(args.shapes) if args.shapes is not None else None
    except ValueError as e:
        p.error(f"--shapes: {e}")
    wide = [f"{m}x{n}" for m, n in args.shapes or [] if n > MAX_N]
    if wide:
        p.error(
            f"--shapes: {','.join(wide)} has N > {MAX_N}, the widest row the kernels "
            "accept (rmsnorm_api.MAX_N)"
        )
    default_dtypes = "bf16" if (args.quick or args.shapes) else "bf16,fp16,fp32"
    given = args.dtypes if args.dtypes is not None else default_dtypes
    args.dtypes = _names(p, "--dtypes", given, tuple(DTYPES))
    if args.quick and args.shapes:
        p.error("--quick and --shapes are exclusive: --shapes replaces the grid")
    if args.budget_s is not None and not args.budget_s > 0:  # also refuses nan
        p.error(f"--budget-s is {args.budget_s}; expected a positive number of seconds")
    if args.out is not None and (why := records.out_dir_problem(args.out)):
        p.error(f"--out {args.out} {why}")
    return args


def _names(p: argparse.ArgumentParser, flag: str, text: str, known: tuple) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in known]
    if unknown:
        p.error(f"{flag}: unknown {','.join(unknown)}; choose from {','.join(known)}")
    if not names:
        p.error(f"{flag}: {text!r} names nothing; choose from {','.join(known)}")
    return list(dict.fromkeys(names))


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = parse_args(argv, p)
    if not torch.cuda.is_available():
        if args.require_gpu:
            print("no CUDA GPU on this machine, and --require-gpu was given", file=sys.stderr)
            return 1
        out = Path(args.out) if args.out is not None else NO_GPU_OUT
        if why := records.out_dir_problem(out):
            p.error(f"--out {out} (the default without a GPU) {why}")
        where = "--out" if args.out is not None else "the default output place without a GPU"
        print(
            f"no CUDA GPU: checking the Triton kernel under the interpreter and redrawing "
            f"the committed H200 results into {out} ({where})"
        )
        return run_without_gpu(args, out)
    out = (
        Path(args.out)
        if args.out is not None
        else REPO / "results" / hardware.gpu_slug(torch.cuda.get_device_name())
    )
    if why := records.out_dir_problem(out):
        p.error(f"--out {out} {why}")
    if args.budget_s is None:
        args.budget_s = DEFAULT_BUDGET_S
    if args.profile:
        return run_profile(args, args.impls, out)
    return run_gpu(args, args.impls, out)


if __name__ == "__main__":
    sys.exit(main())
