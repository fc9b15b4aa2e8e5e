"""The numbers plots and reports are drawn from: pure functions of benchmark records.

Loading (deduplicated, at least one timing record), grouping by op and by shape, the
lookup of PASS measurements, the best baseline per shape, speedups and their geometric
mean, the smallest M that saturates bandwidth, the per-implementation summary, the
tallies the report lists (compile and first-call times, failures, skips, kernels seen,
registers, throttling), and two runs on two GPUs side by side (portability). harness.plot
and harness.report both draw from these; neither computes a number of its own.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional

from harness import records
from harness.ops import OPS, RMS_NORM, Op

#: Implementation names of the first op, in the order runs, tables and plots list them.
ORDER = RMS_NORM.order
SATURATION = 0.9  # "saturated" = this fraction of the measured copy ceiling
#: Two GPUs' % of copy for a kernel at a width "differ" past this many points: a gap that
#: is the GPUs', not the noise of one run's medians (the report's block spread).
GPU_POINTS = 2.0
DTYPE_ORDER = ("bf16", "fp16", "fp32")

#: The plots harness.plot draws across the ops of a records file, a panel an op: our two
#: kernels against each other, and every implementation at the odd widths beside their
#: round neighbours; report.md links them where present.
STUDY_PLOTS = ("triton_vs_cuda.png", "odd_widths.png")
#: The widths the odd-widths plot puts side by side: a width off the 16-byte grid each side
#: of 4096, and 1000 beside 1024.
ODD_NEIGHBOURS = (1000, 1024, 4095, 4096, 4097)

#: The plots harness.plot draws for an op; the report links those present in its folder.
PLOT_NAMES = (
    "bandwidth_vs_n.png",
    "bandwidth_vs_m.png",
    "speedup.png",
    "small_shapes.png",
    "best_peer.png",
)


class NoMeasurements(ValueError):
    """A records file with nothing to draw: a report of it would be a page of None."""


def load(path: str | Path) -> list[dict]:
    """The deduplicated records of a file that holds at least one timing record.

    RecordError names a malformed line; NoMeasurements says what the file lacks."""
    recs = records.latest(records.read_records(path))
    if not recs:
        raise NoMeasurements(f"{path} holds no records")
    if not any(r["kind"] == "timing" for r in recs):
        kinds = ", ".join(sorted({r["kind"] for r in recs}))
        raise NoMeasurements(
            f"{path} holds no timing records (only {kinds}): nothing to plot or report"
        )
    return recs


def by_op(recs: Iterable[dict]) -> dict[Op, list[dict]]:
    """{op: its records}, in the order harness.ops lists the ops; records of an op this
    reader does not know are left out."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        groups[r["op"]].append(r)
    return {op: groups[name] for name, op in OPS.items() if name in groups}


def plot_names(op: Op) -> tuple[str, ...]:
    """The file names of an op's plots: the first op's plain, any other's prefixed."""
    if op is RMS_NORM:
        return PLOT_NAMES
    return tuple(f"{op.name}-{name}" for name in PLOT_NAMES)


def impl_order(names: Iterable[str], op: Op = RMS_NORM) -> list[str]:
    """Names in the op's order (ours first), unknown names last, alphabetically."""
    names = set(names)
    return [n for n in op.order if n in names] + sorted(names - set(op.order))


def env_of(recs: Sequence[dict]) -> dict:
    """The environment of the run: that of the last record."""
    return recs[-1]["env"] if recs else {}


def _commit(rec: dict) -> Optional[str]:
    """A record's commit as the docs write it (7 characters; some runs recorded the full
    id), +dirty where its tree was."""
    env = rec.get("env") or {}
    sha = (env.get("git_sha") or "")[:7]
    return f"{sha}{'+dirty' if env.get('git_dirty') else ''}" if sha else None


def commits_text(recs: Iterable[dict]) -> Optional[str]:
    """The commits these records come from, and nothing else: "git A" when they all share
    one; else each set of commits with the implementations whose records it is,
    "git A: cuda, eager; A B: triton" (triton measured at A and at B). None when no record
    names a commit."""
    by_impl: dict[str, set[str]] = {}
    for r in recs:
        if c := _commit(r):
            by_impl.setdefault(r["impl"], set()).add(c)
    groups: dict[tuple[str, ...], list[str]] = {}
    for impl, shas in sorted(by_impl.items()):
        groups.setdefault(tuple(sorted(shas)), []).append(impl)
    if not groups:
        return None
    if len(groups) == 1:
        return "git " + " ".join(next(iter(groups)))
    return "git " + "; ".join(f"{' '.join(s)}: {', '.join(i)}" for s, i in groups.items())


def passed(recs: Iterable[dict], mode: str = "cold", section: Optional[str] = None) -> list[dict]:
    """PASS timing records of one mode, optionally only those of one section."""
    return [
        r
        for r in recs
        if r["kind"] == "timing"
        and r["status"] == "PASS"
        and r["mode"] == mode
        and (section is None or section in r["sections"])
    ]


def by_shape(recs: Iterable[dict]) -> dict[tuple[str, int, int], dict[str, dict]]:
    """{(dtype, M, N): {impl: record}}."""
    out: dict[tuple[str, int, int], dict[str, dict]] = defaultdict(dict)
    for r in recs:
        out[(r["dtype"], r["shape"][0], r["shape"][1])][r["impl"]] = r
    return dict(out)


def ceilings(recs: Iterable[dict]) -> dict[tuple[str, int, int], tuple[str, float]]:
    """{(dtype, M, N): (name, GB/s)} of each shape's fastest ceiling kernel (cold PASS
    ceiling records; harness.ceiling)."""
    out: dict[tuple[str, int, int], tuple[str, float]] = {}
    for r in recs:
        if r["kind"] != "ceiling" or r["status"] != "PASS" or not r["gbps"]:
            continue
        key = (r["dtype"], r["shape"][0], r["shape"][1])
        if key not in out or r["gbps"] > out[key][1]:
            out[key] = (r["impl"], r["gbps"])
    return out


def median_us(rec: dict) -> float:
    return rec["stats"]["median_us"]


def best_baseline(impls: dict[str, dict], op: Op = RMS_NORM) -> Optional[tuple[str, float]]:
    """(name, median us) of the fastest baseline that passed at a shape, or None."""
    cands = [(median_us(r), name) for name, r in impls.items() if name in op.baselines]
    if not cands:
        return None
    t, name = min(cands)
    return name, t


def best_peer_ratios(
    recs: Iterable[dict], section: str = "grid", op: Op = RMS_NORM
) -> dict[str, dict[str, list]]:
    """{dtype: {impl: [(N, the best peer's time / impl's time), ...]}} over the section's
    cold shapes where a peer passed, in N's order: the best peer itself at 1, each
    implementation ahead of every peer above it (speedups' ratio, every implementation
    against the best baseline)."""
    out: dict[str, dict[str, list]] = {}
    cold = by_shape(passed(recs, "cold", section))
    shapes = sorted(cold.items(), key=lambda kv: (kv[0][2], kv[0][1]))
    for (dtype, _m, n), impls in shapes:
        best = best_baseline(impls, op)
        if best is None:
            continue
        for name, r in impls.items():
            out.setdefault(dtype, {}).setdefault(name, []).append((n, best[1] / median_us(r)))
    return out


def ours_ratios(recs: Iterable[dict], section: str = "grid", op: Op = RMS_NORM) -> dict[str, list]:
    """{dtype: [(N, the second of our kernels' time / the first's), ...]} over the section's
    cold shapes where both passed, in N's order: CUDA's time over Triton's, > 1 where
    Triton is faster. Empty for an op with fewer than two kernels of ours."""
    out: dict[str, list] = {}
    if len(op.ours) < 2:
        return out
    first, second = op.ours[:2]
    cold = by_shape(passed(recs, "cold", section))
    for (dtype, _m, n), impls in sorted(cold.items(), key=lambda kv: (kv[0][2], kv[0][1])):
        if first in impls and second in impls:
            out.setdefault(dtype, []).append(
                (n, median_us(impls[second]) / median_us(impls[first]))
            )
    return out


def odd_widths(recs: Iterable[dict], dtype: str = "bf16") -> dict[int, dict[str, float]]:
    """{N: {impl: % of the copy ceiling}} at the grid's ODD_NEIGHBOURS widths of one dtype,
    cold, where the implementation passed and the record has the fraction."""
    out: dict[int, dict[str, float]] = {}
    for (dt, _m, n), impls in sorted(by_shape(passed(recs, "cold", "grid")).items()):
        if dt != dtype or n not in ODD_NEIGHBOURS:
            continue
        for name, r in impls.items():
            if r.get("pct_copy") is not None:
                out.setdefault(n, {})[name] = r["pct_copy"]
    return out


def _grid_widths(recs: Iterable[dict]) -> dict[tuple[str, int], dict[str, dict]]:
    """{(dtype, N): {impl: record}} of the grid's cold PASS records; where one width was
    timed at several M, the largest (the grid's M is one a width, so this is a guard)."""
    out: dict[tuple[str, int], dict[str, dict]] = {}
    for (dtype, _m, n), impls in sorted(by_shape(passed(recs, "cold", "grid")).items()):
        out[(dtype, n)] = impls
    return out


def _dtype_width(key: tuple[str, int]) -> tuple:
    dtype, n = key
    rank = DTYPE_ORDER.index(dtype) if dtype in DTYPE_ORDER else len(DTYPE_ORDER)
    return rank, dtype, n


def portability(runs: dict[str, Sequence[dict]]) -> list[dict]:
    """Two runs of record on two GPUs, ``{name: records}``, side by side: a row for each op,
    dtype and grid width both timed (cold, PASS) and each kernel of ours that passed there in
    both, in the op's, the dtypes' and N's order.

    Each row: op (its name), dtype, n, impl; and keyed by run name, in ``runs``' order:
    ``pct`` (% of that GPU's copy ceiling), ``ratio`` (the best peer's time / this kernel's,
    > 1: ahead of every peer), ``peer`` (that best peer's name) and ``peer_pct`` (its % of
    copy); then ``points`` (the second GPU's % of copy less the first's), ``differs`` (more
    than GPU_POINTS apart) and ``flip`` (level with or ahead of the best peer, >= 1.00x, on
    one GPU and behind it on the other: what was tuned on one does not hold on the other).

    The best peer is the fastest of the peers both runs timed at that width, so a peer only
    one run had installed cannot make a flip the kernels did not."""
    if len(runs) != 2:
        raise ValueError(f"runs: expected two runs, {{name: records}}, got {len(runs)}")
    (a, recs_a), (b, recs_b) = runs.items()
    ops_b = by_op(recs_b)
    rows = []
    for op, op_recs in by_op(recs_a).items():
        if op not in ops_b:
            continue
        grids = {a: _grid_widths(op_recs), b: _grid_widths(ops_b[op])}
        for key in sorted(grids[a].keys() & grids[b].keys(), key=_dtype_width):
            at = {name: grid[key] for name, grid in grids.items()}
            both = at[a].keys() & at[b].keys()
            best = {
                name: best_baseline({i: r for i, r in impls.items() if i in both}, op)
                for name, impls in at.items()
            }
            for ours in (o for o in op.ours if o in both):
                pct = {name: at[name][ours]["pct_copy"] for name in at}
                ratio = {
                    name: best[name][1] / median_us(at[name][ours]) if best[name] else None
                    for name in at
                }
                known = None not in pct.values()
                flip = None not in ratio.values() and (ratio[a] >= 1) != (ratio[b] >= 1)
                rows.append(
                    dict(
                        op=op.name,
                        dtype=key[0],
                        n=key[1],
                        impl=ours,
                        pct=pct,
                        ratio=ratio,
                        peer={name: best[name] and best[name][0] for name in at},
                        peer_pct={
                            name: best[name] and at[name][best[name][0]]["pct_copy"] for name in at
                        },
                        points=pct[b] - pct[a] if known else None,
                        differs=known and abs(pct[b] - pct[a]) > GPU_POINTS,
                        flip=flip,
                    )
                )
    return rows


def compared(recs: Iterable[dict], rows: Sequence[dict]) -> list[dict]:
    """The records of one run that portability's rows were drawn from: the grid's cold PASS
    records at the rows' ops, dtypes and widths (their commits are what a title names)."""
    at = {(r["op"], r["dtype"], r["n"]) for r in rows}
    return [r for r in passed(recs, "cold", "grid") if (r["op"], r["dtype"], r["shape"][1]) in at]


def geomean(values: Sequence[float]) -> Optional[float]:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def speedups(
    recs: Iterable[dict], section: str = "grid", op: Op = RMS_NORM
) -> dict[tuple[str, str, str], list]:
    """{(ours, baseline, dtype): [(N, baseline time / our time), ...]} over cold shapes."""
    out: dict[tuple[str, str, str], list] = defaultdict(list)
    for (dtype, _m, n), impls in sorted(by_shape(passed(recs, "cold", section)).items()):
        for ours in op.ours:
            if ours not in impls:
                continue
            for base in op.baselines:
                if base in impls:
                    out[(ours, base, dtype)].append(
                        (n, median_us(impls[base]) / median_us(impls[ours]))
                    )
    return dict(out)


def saturation_m(
    recs: Iterable[dict], copy_gbps: Optional[float], op: Op = RMS_NORM
) -> dict[str, Optional[int]]:
    """Per impl, the smallest M of the M sweep whose cold GB/s reaches 0.9x copy."""
    out: dict[str, Optional[int]] = {}
    if not copy_gbps:
        return out
    sweep = passed(recs, "cold", "msweep")
    for name in impl_order((r["impl"] for r in sweep), op):
        ms = sorted(
            r["shape"][0]
            for r in sweep
            if r["impl"] == name and (r["gbps"] or 0) >= SATURATION * copy_gbps
        )
        out[name] = ms[0] if ms else None
    return out


def summary(recs: Sequence[dict], section: str = "grid", op: Op = RMS_NORM) -> list[dict]:
    """Per (our impl, dtype) over a section's cold shapes: geometric mean and minimum of %
    of copy, of % of the shape's ceiling (where one was timed) and of the ratio to the
    best baseline (its time / ours), with the shapes of the minima and how many shapes
    reach 0.9x copy."""
    shapes = by_shape(passed(recs, "cold", section))
    out = []
    for ours in op.ours:
        for dtype in DTYPE_ORDER:
            pct, roof, ratio = [], [], []
            for (dt, m, n), impls in sorted(shapes.items(), key=lambda kv: kv[0][2]):
                if dt != dtype or ours not in impls or impls[ours]["pct_copy"] is None:
                    continue
                pct.append((impls[ours]["pct_copy"] / 100, f"{m}x{n}"))
                if impls[ours].get("pct_ceiling"):
                    roof.append((impls[ours]["pct_ceiling"] / 100, f"{m}x{n}"))
                best = best_baseline(impls, op)
                if best:
                    ratio.append((best[1] / median_us(impls[ours]), f"{m}x{n}"))
            if not pct:
                continue
            row = dict(impl=ours, dtype=dtype, shapes=len(pct))
            row["geo_copy"] = geomean([v for v, _ in pct])
            row["min_copy"], row["min_copy_at"] = min(pct)
            row["at_09"] = sum(v >= SATURATION for v, _ in pct)
            row["geo_ceiling"] = geomean([v for v, _ in roof])
            row["min_ceiling"], row["min_ceiling_at"] = min(roof) if roof else (None, "")
            row["geo_ratio"] = geomean([v for v, _ in ratio])
            row["min_ratio"], row["min_ratio_at"] = min(ratio) if ratio else (None, "")
            out.append(row)
    return out


def worst_spread(impls: dict[str, dict]) -> float:
    """The largest block spread among the records of one shape (0 if none has one)."""
    return max((r["spread"] or 0.0) for r in impls.values())


def compile_summary(recs: Sequence[dict]) -> Optional[dict]:
    """torch.compile's fresh compiles: {shapes, median_s, max_s, total_s}, or None."""
    times = [r["compile_s"] for r in passed(recs) if r["impl"] == "compile" and r["compile_s"]]
    if not times:
        return None
    return dict(
        shapes=len(times),
        median_s=sorted(times)[len(times) // 2],
        max_s=max(times),
        total_s=sum(times),
    )


def first_calls(recs: Sequence[dict], op: Op = RMS_NORM) -> list[dict]:
    """Per implementation but compile: the wall seconds of its first call at each shape
    (JIT compilation included): {impl, max_s, median_s, total_s}, in the op's order."""
    seen: dict[str, list[float]] = {}
    for r in passed(recs, "cold"):
        if r["impl"] != "compile" and r["compile_s"] is not None:
            seen.setdefault(r["impl"], []).append(r["compile_s"])
    return [
        dict(impl=name, max_s=max(v), median_s=sorted(v)[len(v) // 2], total_s=sum(v))
        for name, v in ((n, seen[n]) for n in impl_order(seen, op))
    ]


def failures(recs: Iterable[dict]) -> list[dict]:
    """FAIL records, by implementation, dtype and shape."""
    fails = [r for r in recs if r["status"] == "FAIL"]
    return sorted(fails, key=lambda r: (r["impl"], r["dtype"] or "", r["shape"] or []))


def error_of(rec: dict) -> str:
    """What a FAIL record failed with: its check's error, else its notes."""
    return records.plain_text((rec["correct"] or {}).get("error") or "; ".join(rec["notes"]))


def skipped(recs: Iterable[dict]) -> list[dict]:
    """SKIP records, in file order."""
    return [r for r in recs if r["status"] == "SKIP"]


def kernels_seen(recs: Sequence[dict], op: Op = RMS_NORM) -> list[tuple[str, str, dict]]:
    """(impl, shape class, kernels) of every profiled call, in the op's order, then by
    class."""
    seen: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in passed(recs):
        if r["kernels"]:
            seen[r["impl"]][r["kernels"].get("class", "?")] = r["kernels"]
    order = impl_order(seen, op)
    return [(name, cls, k) for name in order for cls, k in sorted(seen[name].items())]


def registers(recs: Sequence[dict]) -> list[dict]:
    """What our kernels used, one row a distinct kernel_info dict: {impl, dtype, config,
    n_regs, spills, error}, sorted."""
    regs = {}
    for r in passed(recs):
        for res in r["resources"] or []:
            key = (r["impl"], r["dtype"], res.get("name") or str(res.get("row_threads")))
            regs[key + (json.dumps(res, sort_keys=True),)] = res
    rows = []
    for k, v in sorted(regs.items(), key=lambda kv: str(kv[0])):
        cfg = v.get("config") or {
            c: v.get(c) for c in ("row_threads", "vpt", "cluster", "variant") if c in v
        }
        spills = v.get("n_spills", v.get("local_bytes"))
        rows.append(
            dict(
                impl=k[0],
                dtype=k[1],
                config=cfg,
                n_regs=v.get("n_regs"),
                spills=spills,
                error=v.get("error", ""),
            )
        )
    return rows


def throttling(recs: Iterable[dict]) -> tuple[int, list[str]]:
    """How many measurements NVML saw throttled, and the reasons it gave."""
    throttled = [r for r in recs if (r["clocks"] or {}).get("throttled")]
    reasons = sorted({x for r in throttled for x in r["clocks"].get("reasons", [])})
    return len(throttled), reasons
