"""report.md from benchmark records: environment, tables, failures, kernels, caveats.

    python -m harness.report RECORDS [--out DIR]

A pure function of the records (like the plots): the analysis helpers here (lookup of a
measurement, best baseline per shape, speedups and their geometric mean, the smallest M
that saturates bandwidth) are shared with harness.plot.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional

from harness import records
from harness.impls import BASELINES, OURS
from harness.records import plain_text

ORDER = OURS + BASELINES
SATURATION = 0.9  # "saturated" = this fraction of the measured copy ceiling


#: The plots harness.plot draws; the report links those present in its directory.
PLOT_NAMES = ("bandwidth_vs_n.png", "bandwidth_vs_m.png", "speedup.png", "small_shapes.png")


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


def impl_order(names: Iterable[str]) -> list[str]:
    """Names in the registry's order (ours first), unknown names last, alphabetically."""
    names = set(names)
    return [n for n in ORDER if n in names] + sorted(names - set(ORDER))


def env_of(recs: Sequence[dict]) -> dict:
    """The environment of the run: that of the last record."""
    return recs[-1]["env"] if recs else {}


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


def median_us(rec: dict) -> float:
    return rec["stats"]["median_us"]


def best_baseline(impls: dict[str, dict]) -> Optional[tuple[str, float]]:
    """(name, median us) of the fastest baseline that passed at a shape, or None."""
    cands = [(median_us(r), name) for name, r in impls.items() if name in BASELINES]
    if not cands:
        return None
    t, name = min(cands)
    return name, t


def geomean(values: Sequence[float]) -> Optional[float]:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def speedups(recs: Iterable[dict], section: str = "grid") -> dict[tuple[str, str, str], list]:
    """{(ours, baseline, dtype): [(N, baseline time / our time), ...]} over cold shapes."""
    out: dict[tuple[str, str, str], list] = defaultdict(list)
    for (dtype, _m, n), impls in sorted(by_shape(passed(recs, "cold", section)).items()):
        for ours in OURS:
            if ours not in impls:
                continue
            for base in BASELINES:
                if base in impls:
                    out[(ours, base, dtype)].append(
                        (n, median_us(impls[base]) / median_us(impls[ours]))
                    )
    return dict(out)


def saturation_m(recs: Iterable[dict], copy_gbps: Optional[float]) -> dict[str, Optional[int]]:
    """Per impl, the smallest M of the M sweep whose cold GB/s reaches 0.9x copy."""
    out: dict[str, Optional[int]] = {}
    if not copy_gbps:
        return out
    sweep = passed(recs, "cold", "msweep")
    for name in impl_order(r["impl"] for r in sweep):
        ms = sorted(
            r["shape"][0]
            for r in sweep
            if r["impl"] == name and (r["gbps"] or 0) >= SATURATION * copy_gbps
        )
        out[name] = ms[0] if ms else None
    return out


def _fmt(v: Optional[float], spec: str = ".0f") -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def summary(recs: Sequence[dict], section: str = "grid") -> list[dict]:
    """Per (our impl, dtype) over a section's cold shapes: geometric mean and minimum of %
    of copy and of the ratio to the best baseline (its time / ours), with the shapes of
    the minima and how many shapes reach 0.9x copy."""
    shapes = by_shape(passed(recs, "cold", section))
    out = []
    for ours in OURS:
        for dtype in ("bf16", "fp16", "fp32"):
            pct, ratio = [], []
            for (dt, m, n), impls in sorted(shapes.items(), key=lambda kv: kv[0][2]):
                if dt != dtype or ours not in impls or impls[ours]["pct_copy"] is None:
                    continue
                pct.append((impls[ours]["pct_copy"] / 100, f"{m}x{n}"))
                best = best_baseline(impls)
                if best:
                    ratio.append((best[1] / median_us(impls[ours]), f"{m}x{n}"))
            if not pct:
                continue
            row = dict(impl=ours, dtype=dtype, shapes=len(pct))
            row["geo_copy"] = geomean([v for v, _ in pct])
            row["min_copy"], row["min_copy_at"] = min(pct)
            row["at_09"] = sum(v >= SATURATION for v, _ in pct)
            row["geo_ratio"] = geomean([v for v, _ in ratio])
            row["min_ratio"], row["min_ratio_at"] = min(ratio) if ratio else (None, "")
            out.append(row)
    return out


def _summary_table(recs: Sequence[dict]) -> list[str]:
    rows = [
        [
            r["impl"],
            r["dtype"],
            f"{_fmt(r['geo_copy'], '.3f')}x",
            f"{_fmt(r['min_copy'], '.3f')}x ({r['min_copy_at']})",
            f"{r['at_09']} / {r['shapes']}",
            f"{_fmt(r['geo_ratio'], '.3f')}x",
            f"{_fmt(r['min_ratio'], '.3f')}x ({r['min_ratio_at']})",
        ]
        for r in summary(recs)
    ]
    if not rows:
        return []
    header = ["impl", "dtype", "geomean of copy", "min of copy", "shapes >= 0.9x copy"]
    header += ["geomean ours vs best baseline", "min vs best baseline"]
    return [
        "## Summary: grid shapes, cold",
        "",
        "Fraction of the measured copy ceiling, and best baseline's time / ours (> 1: ours"
        " faster), over the grid's shapes.",
        "",
    ] + _table(header, rows)


def _cold_table(recs: Sequence[dict], section: str) -> list[str]:
    """One table per dtype: GB/s (% of copy) per impl, best baseline, our ratios, spread."""
    lines: list[str] = []
    shapes = by_shape(passed(recs, "cold", section))
    names = impl_order({i for impls in shapes.values() for i in impls})
    ours = [n for n in OURS if n in names]
    for dtype in ("bf16", "fp16", "fp32"):
        keys = sorted((k for k in shapes if k[0] == dtype), key=lambda k: (k[2], k[1]))
        if not keys:
            continue
        header = ["M x N"] + [f"{n} GB/s (% copy)" for n in names] + ["best baseline"]
        header += [f"{o} / best" for o in ours] + ["block spread"]
        rows = []
        for key in keys:
            impls = shapes[key]
            row = [f"{key[1]} x {key[2]}"]
            for n in names:
                r = impls.get(n)
                if r is None:
                    row.append("–")
                elif r["pct_copy"] is None:
                    row.append(f"{_fmt(r['gbps'])} (small)")
                else:
                    row.append(f"{_fmt(r['gbps'])} ({_fmt(r['pct_copy'])}%)")
            best = best_baseline(impls)
            row.append(f"{best[0]} {best[1]:.1f} us" if best else "–")
            for o in ours:
                ok = best and o in impls
                row.append(f"{best[1] / median_us(impls[o]):.2f}x" if ok else "–")
            worst = max((r["spread"] or 0.0) for r in impls.values())
            row.append(f"{100 * worst:.1f}%")
            rows.append(row)
        lines += [f"**{dtype}**", ""] + _table(header, rows)
    return lines


def write_report(recs: Sequence[dict], out: str | Path, plots: Sequence[Path] = ()) -> Path:
    """Write out/report.md from records (already deduplicated); return its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = env_of(recs)
    copy = env.get("copy_gbps")
    lines = [f"# RMSNorm forward benchmark: {env.get('gpu') or 'no GPU'}", ""]
    if env.get("synthetic"):
        lines += ["> **SYNTHETIC RECORDS**: made up for a test, not a measurement.", ""]
    lines += ["Drawn from records by `python -m harness.plot`; every number below is in them.", ""]

    lines += ["## Environment", ""]
    keys = [
        "gpu",
        "sm_count",
        "l2_bytes",
        "cc",
        "driver",
        "torch",
        "triton",
        "cuda",
        "python",
        "liger_kernel",
        "quack",
        "git_sha",
        "git_dirty",
    ]
    lines += _table(["", "value"], [[k, str(env.get(k))] for k in keys])
    lines += [
        f"- Theoretical peak: **{_fmt(env.get('peak_gbps'))} GB/s** "
        f"({_fmt(env.get('mem_clock_mhz'))} MHz x {env.get('bus_width_bits')} bit, "
        f"from {env.get('peak_source')})",
        f"- Measured copy ceiling: **{_fmt(copy)} GB/s** (1 GiB device-to-device copy, bytes "
        "read + written, median)",
        "- Bytes model, for every implementation: read x + read weight + write y.",
        "- Cold timing: L2 flushed before each repetition; 3 blocks per shape with the "
        "implementations interleaved; median shown. *Block spread* is the largest relative "
        "difference between block medians at that shape: smaller differences are noise.",
        "",
    ]
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    lines += _summary_table(recs)

    for section, title in (
        ("grid", "Grid shapes (M = 2^27 / N), cold"),
        ("reference", "Reference shapes (independent figures exist), cold"),
        ("custom", "Requested shapes, cold"),
    ):
        table = _cold_table(recs, section)
        if table:
            lines += [
                f"## {title}",
                "",
                "Ratio = best baseline's time / ours (> 1: ours is faster).",
                "",
            ]
            lines += table

    sweep = by_shape(passed(recs, "cold", "msweep"))
    if sweep:
        names = impl_order({i for impls in sweep.values() for i in impls})
        lines += ["## Bandwidth against M at N = 4096, bf16, cold", ""]
        rows = [
            [str(k[1])] + [_fmt(sweep[k][n]["gbps"]) if n in sweep[k] else "–" for n in names]
            for k in sorted(sweep)
        ]
        lines += _table(["M"] + [f"{n} GB/s" for n in names], rows)
        sat = saturation_m(recs, copy)
        lines += [
            f"Smallest M reaching {SATURATION:.1f}x the copy ceiling"
            f" ({_fmt(copy and SATURATION * copy)} GB/s):",
            "",
        ]
        lines += [f"- {n}: {m if m is not None else 'not reached'}" for n, m in sat.items()] + [""]

    graph = by_shape(passed(recs, "graph"))
    host = by_shape(passed(recs, "host"))
    if graph or host:
        keys = sorted(set(graph) | set(host))
        names = impl_order({i for d in (graph, host) for impls in d.values() for i in impls})
        lines += ["## Small shapes: device time under CUDA graphs / host time per call (us)", ""]
        rows = []
        for k in keys:
            row = [f"{k[0]} {k[1]} x {k[2]}"]
            for n in names:
                g, h = graph.get(k, {}).get(n), host.get(k, {}).get(n)
                row.append(f"{_fmt(g and median_us(g), '.2f')} / {_fmt(h and median_us(h), '.1f')}")
            rows.append(row)
        lines += _table(["shape"] + names, rows)
        lines += ["No % of HBM peak is claimed for these: their bytes can come from L2.", ""]

    compiles = [r["compile_s"] for r in passed(recs) if r["impl"] == "compile" and r["compile_s"]]
    if compiles:
        lines += [
            "## torch.compile",
            "",
            f"Compiled afresh for each of {len(compiles)} shapes (dynamo reset, dynamic=False, "
            f"fullgraph=True); compile time median {sorted(compiles)[len(compiles) // 2]:.1f} s, "
            f"max {max(compiles):.1f} s, total {sum(compiles):.0f} s (kept out of the timing).",
            "",
        ]

    first = {}
    for r in passed(recs, "cold"):
        if r["impl"] != "compile" and r["compile_s"] is not None:
            first.setdefault(r["impl"], []).append(r["compile_s"])
    if first:
        lines += [
            "## First call at a new shape (JIT compilation included)",
            "",
            "Wall seconds of the first call at each shape, before any timing: Triton compiles",
            "a kernel per new specialisation (dtype, constexprs, divisibility of N), QuACK",
            "per (N, dtype); the CUDA extension was compiled ahead of time by nvcc.",
            "",
        ]
        rows = [
            [name, f"{max(v):.3f}", f"{sorted(v)[len(v) // 2]:.4f}", f"{sum(v):.1f}"]
            for name, v in ((n, first[n]) for n in impl_order(first))
        ]
        lines += _table(["impl", "max s", "median s", "total s"], rows)

    fails = [r for r in recs if r["status"] == "FAIL"]
    lines += ["## Failures", ""]
    if fails:
        rows = [
            [
                r["impl"],
                r["dtype"] or "–",
                " x ".join(map(str, r["shape"] or [])) or "–",
                plain_text((r["correct"] or {}).get("error") or "; ".join(r["notes"])),
            ]
            for r in sorted(fails, key=lambda r: (r["impl"], r["dtype"] or "", r["shape"] or []))
        ]
        lines += ["Failed the check against the reference (or raised) and were not timed:", ""]
        lines += _table(["impl", "dtype", "M x N", "error"], rows)
    else:
        lines += ["None: every implementation that ran passed the check at every shape.", ""]
    skips = [r for r in recs if r["status"] == "SKIP"]
    if skips:
        lines += ["## Not measured", ""]
        lines += [
            f"- {r['impl']}"
            + (f" {r['dtype']} {' x '.join(map(str, r['shape']))}" if r["shape"] else "")
            + (f" ({r['mode']})" if r["mode"] else "")
            + f": {'; '.join(r['notes'])}"
            for r in skips
        ] + [""]

    lines += ["## Kernels each implementation ran", ""]
    lines += ["One profiled call per implementation and shape class (dtype, size, N range).", ""]
    seen: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in passed(recs):
        if r["kernels"]:
            seen[r["impl"]][r["kernels"].get("class", "?")] = r["kernels"]
    rows = []
    for name in impl_order(seen):
        for cls, k in sorted(seen[name].items()):
            names = ", ".join(f"`{n[:60]}`" for n in k.get("names", []))
            rows.append([name, cls, str(k.get("count")), k.get("path") or "", names])
    lines += _table(["impl", "class", "kernels/call", "path", "names"], rows) if rows else ["–", ""]

    regs = {}
    for r in passed(recs):
        for res in r["resources"] or []:
            key = (r["impl"], r["dtype"], res.get("name") or str(res.get("row_threads")))
            regs[key + (json.dumps(res, sort_keys=True),)] = res
    if regs:
        lines += ["## Registers and spills of our kernels", ""]
        lines += [
            "Triton: from the compiled kernel's metadata; CUDA: cudaFuncGetAttributes "
            "(local bytes = stack and spills).",
            "",
        ]
        rows = []
        for k, v in sorted(regs.items(), key=lambda kv: str(kv[0])):
            cfg = v.get("config") or {
                c: v.get(c) for c in ("row_threads", "vpt", "cluster", "variant") if c in v
            }
            spills = v.get("n_spills", v.get("local_bytes"))
            rows.append(
                [k[0], k[1], str(cfg), str(v.get("n_regs")), str(spills), v.get("error", "")]
            )
        lines += _table(
            ["impl", "dtype", "config", "registers", "spills / local bytes", "error"], rows
        )

    throttled = [r for r in recs if (r["clocks"] or {}).get("throttled")]
    lines += ["## Clocks", ""]
    if throttled:
        reasons = sorted({x for r in throttled for x in r["clocks"].get("reasons", [])})
        lines += [
            f"NVML reported throttling during {len(throttled)} measurements"
            f" ({', '.join(reasons)}).",
            "",
        ]
    else:
        lines += [
            "NVML reported no throttling (or was unavailable). Clocks were never changed.",
            "",
        ]

    lines += [
        "## Caveats",
        "",
        "- A kernel's speedup is not a whole-model speedup: RMSNorm is a few percent of a "
        "transformer step, and a model gains at most that share (Amdahl).",
        "- Cold timing (L2 flushed) is the headline; in a model the input often arrives from "
        "the previous kernel through L2, which favours every implementation at small shapes.",
        "- Liger also writes an fp32 rstd per row and eager moves fp32 temporaries: both are "
        "charged only the common bytes model, so GB/s compares useful work.",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.report",
        description="Write report.md from a records file (no plots; python -m harness.plot "
        "draws both). Plots already in --out are linked from the report.",
    )
    p.add_argument("records", help="a records.jsonl written by python -m harness.bench")
    p.add_argument("--out", default=None, help="directory for report.md (default: beside RECORDS)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    path = Path(args.records)
    if not path.is_file():
        p.error(f"RECORDS: no such file: {path}")
    # the records first (cheap), so a file with nothing to report leaves no empty --out
    try:
        recs = load(path)
    except records.RecordError as e:
        print(f"{p.prog}: invalid records: {e}", file=sys.stderr)
        return 1
    except NoMeasurements as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 1
    out = args.out if args.out is not None else str(path.parent)
    if why := records.out_dir_problem(out):  # the text given: Path("") would be "."
        p.error(f"--out {out} {why}")
    out = Path(out)
    plots = [out / name for name in PLOT_NAMES if (out / name).is_file()]
    print(f"wrote {write_report(recs, out, plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
