"""report.md from benchmark records: environment, tables, failures, kernels, caveats.

    python -m harness.report RECORDS [--out DIR]

A pure function of the records (like the plots): the numbers come from harness.analysis,
which harness.plot shares; this module only renders them, one function a section. With
one op in the records, report.md holds its sections; with several, report.md is the
short page (environment, each op's summary table with a link) and each op's sections are
a page of their own, report-<op>.md, so each file is short enough to read. A
model/model.md beside it (python -m harness.model's table) is included in report.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from harness import analysis, records
from harness.analysis import by_shape, impl_order, median_us, passed
from harness.ops import Op

#: (section, title) of the cold tables, in page order ({grid}: the op's grid_text).
COLD_SECTIONS = (
    ("grid", "Grid shapes ({grid}), cold"),
    ("reference", "Reference shapes (independent figures exist), cold"),
    ("custom", "Requested shapes, cold"),
)
ENV_KEYS = (
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
)


def _fmt(v: Optional[float], spec: str = ".0f") -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


# ---------------------------------------------------------------------------------------
# the page's head: title and environment
# ---------------------------------------------------------------------------------------


def _head(heading: str, synthetic: bool, tool: str, records: str = "records") -> list[str]:
    """A page's heading, the banner of synthetic (test) records, and what drew it."""
    lines = [f"# {heading}", ""]
    if synthetic:
        lines += ["> **SYNTHETIC RECORDS**: made up for a test, not a measurement.", ""]
    return lines + [
        f"Drawn from {records} by `python -m {tool}`; every number below is in them.",
        "",
    ]


def _title(env: dict, ops: Sequence[Op]) -> list[str]:
    what = f"{ops[0].title} benchmark" if len(ops) == 1 else "Benchmark"
    return _head(
        f"{what}: {env.get('gpu') or 'no GPU'}", bool(env.get("synthetic")), "harness.plot"
    )


#: Versions of a peer's package, each told by the records of that peer: another run's
#: environment may lack the package (or have another version) where the peer did not run.
PEER_VERSION = {"liger_kernel": "liger", "quack": "quack"}


def _env_rows(env: dict, recs: Sequence[dict]) -> list[list[str]]:
    """The environment table's rows: the last run's values, but a peer's version from that
    peer's records (the row left out where none has one), and in place of git_sha and
    git_dirty the commits the records come from (analysis.commits_text)."""
    rows = []
    for k in ENV_KEYS:
        if k in PEER_VERSION and recs:
            got = {
                str(v)
                for r in recs
                if r["impl"] == PEER_VERSION[k] and (v := (r.get("env") or {}).get(k))
            }
            if got:
                rows.append([k, ", ".join(sorted(got))])
        elif k == "git_sha" and recs:
            rows.append(["commits", analysis.commits_text(recs) or "–"])
        elif k == "git_dirty" and recs:
            continue  # in the commits row: +dirty
        else:
            rows.append([k, "–" if env.get(k) is None else str(env.get(k))])
    return rows


def _environment(env: dict, ops: Sequence[Op], recs: Sequence[dict] = ()) -> list[str]:
    lines = ["## Environment", ""]
    lines += _table(["", "value"], _env_rows(env, recs))
    lines += [
        f"- Theoretical peak: **{_fmt(env.get('peak_gbps'))} GB/s** "
        f"({_fmt(env.get('mem_clock_mhz'))} MHz x {env.get('bus_width_bits')} bit, "
        f"from {env.get('peak_source')})",
        f"- Measured copy ceiling: **{_fmt(env.get('copy_gbps'))} GB/s** (1 GiB "
        "device-to-device copy, bytes read + written, median)",
    ]
    for op in ops:
        of = f" of {op.name}" if len(ops) > 1 else ""
        lines.append(f"- Bytes model{of}, for every implementation: {op.bytes_text}.")
    return lines + [
        "- Cold timing: L2 flushed before each repetition; 3 blocks per shape with the "
        "implementations interleaved; median shown. *Block spread* is the largest relative "
        "difference between block medians at that shape: smaller differences are noise.",
        "",
    ]


# ---------------------------------------------------------------------------------------
# one op's sections
# ---------------------------------------------------------------------------------------


def _plots(plots: Sequence[Path]) -> list[str]:
    if not plots:
        return []
    return ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]


def _summary_table(recs: Sequence[dict], op: Op) -> list[str]:
    summary = analysis.summary(recs, "grid", op)
    roofs = any(r["geo_ceiling"] for r in summary)  # a run that timed the shapes' ceilings
    rows = []
    for r in summary:
        row = [
            r["impl"],
            r["dtype"],
            f"{_fmt(r['geo_copy'], '.3f')}x",
            f"{_fmt(r['min_copy'], '.3f')}x ({r['min_copy_at']})",
            f"{r['at_09']} / {r['shapes']}",
        ]
        if roofs:
            row += [
                f"{_fmt(r['geo_ceiling'], '.3f')}x",
                f"{_fmt(r['min_ceiling'], '.3f')}x ({r['min_ceiling_at']})",
            ]
        row += [
            f"{_fmt(r['geo_ratio'], '.3f')}x",
            f"{_fmt(r['min_ratio'], '.3f')}x ({r['min_ratio_at']})",
        ]
        rows.append(row)
    if not rows:
        return []
    header = ["impl", "dtype", "geomean of copy", "min of copy", "shapes >= 0.9x copy"]
    header += ["geomean of ceiling", "min of ceiling"] if roofs else []
    header += ["geomean ours vs best baseline", "min vs best baseline"]
    return [
        "## Summary: grid shapes, cold",
        "",
        "Fraction of the measured copy ceiling"
        + (" and of each shape's ceiling (the fastest of its ceiling kernels)" if roofs else "")
        + ", and best baseline's time / ours (> 1: ours faster), over the grid's shapes.",
        "",
    ] + _table(header, rows)


def _cold_table(recs: Sequence[dict], section: str, op: Op) -> list[str]:
    """One table per dtype: GB/s (% of copy) per impl, best baseline, our ratios, spread."""
    lines: list[str] = []
    shapes = by_shape(passed(recs, "cold", section))
    names = impl_order({i for impls in shapes.values() for i in impls}, op)
    ours = [n for n in op.ours if n in names]
    tops = analysis.ceilings(recs)
    for dtype in analysis.DTYPE_ORDER:
        keys = sorted((k for k in shapes if k[0] == dtype), key=lambda k: (k[2], k[1]))
        if not keys:
            continue
        roofs = any(k in tops for k in keys)
        unit = "(% ceiling, % copy)" if roofs else "(% copy)"
        header = ["M x N"] + [f"{n} GB/s {unit}" for n in names]
        header += ["ceiling GB/s (kernel)"] if roofs else []
        header += ["best baseline"] + [f"{o} / best" for o in ours] + ["block spread"]
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
                elif roofs:
                    share = _fmt(r.get("pct_ceiling"), ".1f")
                    row.append(f"{_fmt(r['gbps'])} ({share}%, {_fmt(r['pct_copy'])}%)")
                else:
                    row.append(f"{_fmt(r['gbps'])} ({_fmt(r['pct_copy'])}%)")
            if roofs:
                top = tops.get(key)
                row.append(f"{_fmt(top[1])} ({top[0]})" if top else "–")
            best = analysis.best_baseline(impls, op)
            row.append(f"{best[0]} {best[1]:.1f} us" if best else "–")
            for o in ours:
                ok = best and o in impls
                row.append(f"{best[1] / median_us(impls[o]):.2f}x" if ok else "–")
            row.append(f"{100 * analysis.worst_spread(impls):.1f}%")
            rows.append(row)
        lines += [f"**{dtype}**", ""] + _table(header, rows)
    return lines


def _cold_sections(recs: Sequence[dict], op: Op) -> list[str]:
    lines: list[str] = []
    for section, title in COLD_SECTIONS:
        table = _cold_table(recs, section, op)
        if table:
            lines += [
                f"## {title.format(grid=op.grid_text)}",
                "",
                "Ratio = best baseline's time / ours (> 1: ours is faster).",
                "",
            ]
            lines += table
    return lines


def _msweep(recs: Sequence[dict], copy: Optional[float], op: Op) -> list[str]:
    sweep = by_shape(passed(recs, "cold", "msweep"))
    if not sweep:
        return []
    names = impl_order({i for impls in sweep.values() for i in impls}, op)
    lines = ["## Bandwidth against M at N = 4096, bf16, cold", ""]
    rows = [
        [str(k[1])] + [_fmt(sweep[k][n]["gbps"]) if n in sweep[k] else "–" for n in names]
        for k in sorted(sweep)
    ]
    lines += _table(["M"] + [f"{n} GB/s" for n in names], rows)
    sat = analysis.saturation_m(recs, copy, op)
    lines += [
        f"Smallest M reaching {analysis.SATURATION:.1f}x the copy ceiling"
        f" ({_fmt(copy and analysis.SATURATION * copy)} GB/s):",
        "",
    ]
    lines += [f"- {n}: {m if m is not None else 'not reached'}" for n, m in sat.items()]
    return lines + [""]


def _small(recs: Sequence[dict], op: Op) -> list[str]:
    graph = by_shape(passed(recs, "graph"))
    host = by_shape(passed(recs, "host"))
    if not (graph or host):
        return []
    keys = sorted(set(graph) | set(host))
    names = impl_order({i for d in (graph, host) for impls in d.values() for i in impls}, op)
    lines = ["## Small shapes: device time under CUDA graphs / host time per call (us)", ""]
    rows = []
    for k in keys:
        row = [f"{k[0]} {k[1]} x {k[2]}"]
        for n in names:
            g, h = graph.get(k, {}).get(n), host.get(k, {}).get(n)
            row.append(f"{_fmt(g and median_us(g), '.2f')} / {_fmt(h and median_us(h), '.1f')}")
        rows.append(row)
    lines += _table(["shape"] + names, rows)
    return lines + ["No % of HBM peak is claimed for these: their bytes can come from L2.", ""]


def _compile(recs: Sequence[dict]) -> list[str]:
    c = analysis.compile_summary(recs)
    if c is None:
        return []
    return [
        "## torch.compile",
        "",
        f"Compiled afresh for each of {c['shapes']} shapes (dynamo reset, dynamic=False, "
        f"fullgraph=True); compile time median {c['median_s']:.1f} s, "
        f"max {c['max_s']:.1f} s, total {c['total_s']:.0f} s (kept out of the timing).",
        "",
    ]


def _first_calls(recs: Sequence[dict], op: Op) -> list[str]:
    first = analysis.first_calls(recs, op)
    if not first:
        return []
    lines = [
        "## First call at a new shape (JIT compilation included)",
        "",
        "Wall seconds of the first call at each shape, before any timing: Triton compiles",
        "a kernel per new specialisation (dtype, constexprs, divisibility of N), QuACK",
        "per (N, dtype); the CUDA extension was compiled ahead of time by nvcc.",
        "",
    ]
    rows = [
        [f["impl"], f"{f['max_s']:.3f}", f"{f['median_s']:.4f}", f"{f['total_s']:.1f}"]
        for f in first
    ]
    return lines + _table(["impl", "max s", "median s", "total s"], rows)


def _failures(recs: Sequence[dict]) -> list[str]:
    fails = analysis.failures(recs)
    lines = ["## Failures", ""]
    if not fails:
        return lines + ["None: every implementation that ran passed the check at every shape.", ""]
    rows = [
        [
            r["impl"],
            r["dtype"] or "–",
            " x ".join(map(str, r["shape"] or [])) or "–",
            analysis.error_of(r),
        ]
        for r in fails
    ]
    lines += ["Failed the check against the reference (or raised) and were not timed:", ""]
    return lines + _table(["impl", "dtype", "M x N", "error"], rows)


def _not_measured(recs: Sequence[dict]) -> list[str]:
    skips = analysis.skipped(recs)
    if not skips:
        return []
    return (
        ["## Not measured", ""]
        + [
            f"- {r['impl']}"
            + (f" {r['dtype']} {' x '.join(map(str, r['shape']))}" if r["shape"] else "")
            + (f" ({r['mode']})" if r["mode"] else "")
            + f": {'; '.join(r['notes'])}"
            for r in skips
        ]
        + [""]
    )


def _kernels(recs: Sequence[dict], op: Op) -> list[str]:
    lines = ["## Kernels each implementation ran", ""]
    lines += ["One profiled call per implementation and shape class (dtype, size, N range).", ""]
    rows = [
        [
            name,
            cls,
            str(k.get("count")),
            k.get("path") or "",
            ", ".join(f"`{n[:60]}`" for n in k.get("names", [])),
        ]
        for name, cls, k in analysis.kernels_seen(recs, op)
    ]
    if not rows:
        return lines + ["–", ""]
    return lines + _table(["impl", "class", "kernels/call", "path", "names"], rows)


def _registers(recs: Sequence[dict]) -> list[str]:
    regs = analysis.registers(recs)
    if not regs:
        return []
    lines = ["## Registers and spills of our kernels", ""]
    lines += [
        "Triton: from the compiled kernel's metadata; CUDA: cudaFuncGetAttributes "
        "(local bytes = stack and spills).",
        "",
    ]
    rows = [
        [r["impl"], r["dtype"], str(r["config"]), str(r["n_regs"]), str(r["spills"]), r["error"]]
        for r in regs
    ]
    header = ["impl", "dtype", "config", "registers", "spills / local bytes", "error"]
    return lines + _table(header, rows)


def _op_sections(recs: Sequence[dict], op: Op, env: dict, plots: Sequence[Path]) -> list[str]:
    return (
        _plots(plots)
        + _summary_table(recs, op)
        + _cold_sections(recs, op)
        + _msweep(recs, env.get("copy_gbps"), op)
        + _small(recs, op)
        + _compile(recs)
        + _first_calls(recs, op)
        + _failures(recs)
        + _not_measured(recs)
        + _kernels(recs, op)
        + _registers(recs)
    )


# ---------------------------------------------------------------------------------------
# the page's tail: clocks and caveats
# ---------------------------------------------------------------------------------------


def _clocks(recs: Sequence[dict]) -> list[str]:
    count, reasons = analysis.throttling(recs)
    lines = ["## Clocks", ""]
    if count:
        return lines + [
            f"NVML reported throttling during {count} measurements ({', '.join(reasons)}).",
            "",
        ]
    return lines + [
        "NVML reported no throttling (or was unavailable). Clocks were never changed.",
        "",
    ]


def _caveats(ops: Sequence[Op] = ()) -> list[str]:
    lines = [
        "## Caveats",
        "",
        "- A kernel's speedup is not a whole-model speedup: RMSNorm is a few percent of a "
        "transformer step, and a model gains at most that share (Amdahl).",
        "- Cold timing (L2 flushed) is the headline; in a model the input often arrives from "
        "the previous kernel through L2, which favours every implementation at small shapes.",
        "- Liger also writes an fp32 rstd per row and eager moves fp32 temporaries: both are "
        "charged only the common bytes model, so GB/s compares useful work.",
    ]
    if any(op.grads for op in ops):
        lines.append(
            "- Gradient ops: each implementation's forward and torch.autograd.grad, checked "
            "against float64 gradients; the backward alone is timed with the forward's graph "
            "kept (retain_graph), the forward outside the timing. A saved rstd, dweight "
            "partials and zeroed buffers are charged to none; in the fused add ours, Liger "
            "and QuACK return one tensor as both dx and dresidual where their dtypes match, "
            "still charged for both (figures above 100% of copy there)."
        )
    return lines + [""]


def _model(out: Path) -> list[str]:
    """The whole-model answer, when python -m harness.model wrote its table beside the
    benchmark's (out/model/model.md): included as it is, its records named."""
    table = out / "model" / "model.md"
    if not table.is_file():
        return []
    return [
        "# The whole model (python -m harness.model)",
        "",
        "Records: model/records.jsonl; the table as harness.model wrote it:",
        "",
        table.read_text(encoding="utf-8").rstrip(),
        "",
    ]


# ---------------------------------------------------------------------------------------
# two runs on two GPUs (python -m harness.gpus)
# ---------------------------------------------------------------------------------------


#: The versions gpus.md sets side by side, under each run's GPU, commits, peak and copy.
GPUS_ENV_KEYS = ("driver", "torch", "triton", "cuda")


def _ratio_cell(row: dict, name: str) -> str:
    ratio = row["ratio"][name]
    return "–" if ratio is None else f"{ratio:.3f}x ({row['peer'][name]})"


def portability(rows: Sequence[dict], names: Sequence[str]) -> list[str]:
    """The section of analysis.portability's rows that tell the GPUs apart: those whose %
    of copy differs by more than GPU_POINTS, or which flip against the best peer; a line
    first with the counts. ``names``: the two runs', in the rows' order."""
    a, b = names
    listed = [r for r in rows if r["differs"] or r["flip"]]
    lines = [
        f"## {a} against {b}: grid shapes, cold",
        "",
        f"Rows listed: {len(listed)} of {len(rows)} (an op, dtype, width and kernel both runs "
        f"timed); % of copy more than {analysis.GPU_POINTS:g} points apart: "
        f"{sum(r['differs'] for r in rows)}; a flip against the best peer: "
        f"{sum(r['flip'] for r in rows)}.",
        "",
        "% of copy: of that GPU's own copy ceiling. vs best peer: the best peer's time / the "
        "kernel's (> 1: ahead of every peer), the best of the peers both runs timed at that "
        "width. Flip: level with or ahead of the best peer on one GPU, behind it on the other.",
        "",
    ]
    if not listed:
        return lines + [f"None: within {analysis.GPU_POINTS:g} points and no flip.", ""]
    header = ["op", "dtype", "N", "impl", f"{a} % copy", f"{b} % copy", f"{b} - {a} points"]
    header += [f"{a} vs best peer", f"{b} vs best peer", "flip"]
    table = [
        [
            r["op"],
            r["dtype"],
            str(r["n"]),
            r["impl"],
            _fmt(r["pct"][a], ".1f"),
            _fmt(r["pct"][b], ".1f"),
            _fmt(r["points"], "+.1f"),
            _ratio_cell(r, a),
            _ratio_cell(r, b),
            "**flip**" if r["flip"] else "",
        ]
        for r in listed
    ]
    return lines + _table(header, table)


def gpus_page(runs: dict[str, Sequence[dict]], rows: Sequence[dict], plot: Optional[str]) -> str:
    """gpus.md: each run's environment side by side, the figure (``plot``, a file name
    beside the page) and the portability section."""
    names = list(runs)
    envs = {name: analysis.env_of(recs) for name, recs in runs.items()}
    lines = _head(
        f"{' against '.join(names)}: the same kernels on two GPUs",
        any(env.get("synthetic") for env in envs.values()),
        "harness.gpus",
        "two runs' records",
    )
    env_rows = [
        ["gpu"] + [envs[n].get("gpu") or "no GPU" for n in names],
        ["commits"]
        + [analysis.commits_text(analysis.compared(runs[n], rows)) or "–" for n in names],
        ["theoretical peak GB/s"] + [_fmt(envs[n].get("peak_gbps")) for n in names],
        ["copy ceiling GB/s"] + [_fmt(envs[n].get("copy_gbps")) for n in names],
    ]
    env_rows += [[k] + [str(envs[n].get(k) or "–") for n in names] for k in GPUS_ENV_KEYS]
    lines += _table([""] + names, env_rows)
    if plot:
        lines += [f"![{Path(plot).stem}]({plot})", ""]
    return "\n".join(lines + portability(rows, names))


def op_page(op: Op) -> str:
    """The file name of op's own page when the records hold several ops."""
    return f"report-{op.name}.md"


def write_report(recs: Sequence[dict], out: str | Path, plots: Sequence[Path] = ()) -> list[Path]:
    """Write out/report.md from records (already deduplicated), and with several ops a page
    each (op_page); return the paths written, report.md first. Each op's sections come with
    the plots of its names (analysis.plot_names); the study's plot across the ops
    (analysis.STUDY_PLOTS), where drawn, come before them."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = analysis.env_of(recs)
    groups = analysis.by_op(recs)
    ops = list(groups)
    lines = _title(env, ops) + _environment(env, ops, recs)
    study = [p for p in plots if p.name in analysis.STUDY_PLOTS]
    if study:  # the study's question first: every op side by side
        lines += ["## Across the ops", ""]
        lines += [f"![{p.stem}]({p.name})" for p in study] + [""]
    pages = []
    for op, op_recs in groups.items():
        mine = [p for p in plots if p.name in analysis.plot_names(op)]
        sections = _op_sections(op_recs, op, env, mine)
        if len(ops) == 1:
            lines += sections
            continue
        page = out / op_page(op)
        head = [f"# {op.title} ({op.name})", ""]
        page.write_text("\n".join(head + sections), encoding="utf-8")
        pages.append(page)
        lines += head + _summary_table(op_recs, op)
        lines += [f"Every table of this op, its plots and kernels: [{page.name}]({page.name}).", ""]
    lines += _model(out) + _clocks(recs) + _caveats(ops)
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return [path] + pages


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.report",
        description="Write report.md from a records file (no plots; python -m harness.plot "
        "draws both). Plots already in --out are linked from the report.",
    )
    p.add_argument("records", help="a records.jsonl written by python -m harness.bench")
    p.add_argument("--out", default=None, help="directory for report.md (default: beside RECORDS)")
    return p


def records_and_out(
    p: argparse.ArgumentParser, argv: Optional[list[str]]
) -> Optional[tuple[list[dict], Path]]:
    """RECORDS and --out of a drawing command (plot, report): the loaded records and the
    checked output folder, or None after saying on stderr why there is nothing to draw.
    A missing file or a bad --out is an argparse error (exit 2)."""
    args = p.parse_args(argv)
    path = Path(args.records)
    if not path.is_file():
        p.error(f"RECORDS: no such file: {path}")
    # the records first (cheap), so a file with nothing to draw leaves no empty --out
    try:
        recs = analysis.load(path)
    except (records.RecordError, analysis.NoMeasurements) as e:
        what = "invalid records: " if isinstance(e, records.RecordError) else ""
        print(f"{p.prog}: {what}{e}", file=sys.stderr)
        return None
    out = args.out if args.out is not None else str(path.parent)
    if why := records.out_dir_problem(out):  # the text given: Path("") would be "."
        p.error(f"--out {out} {why}")
    return recs, Path(out)


def main(argv: Optional[list[str]] = None) -> int:
    got = records_and_out(build_parser(), argv)
    if got is None:
        return 1
    recs, out = got
    names = [name for op in analysis.by_op(recs) for name in analysis.plot_names(op)]
    plots = [out / name for name in names if (out / name).is_file()]
    for path in write_report(recs, out, plots):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
