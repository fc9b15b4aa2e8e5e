"""Plots and report drawn only from records, so any machine can redraw a GPU run.

    python -m harness.plot RECORDS [--out DIR]

(a) bandwidth_vs_n.png  GB/s against N, one panel per dtype, a line per implementation
    with its p20-p80 band, dashed lines at the theoretical peak and the copy ceiling, and
    each shape's ceiling where the run timed it (harness.ceiling);
(b) bandwidth_vs_m.png  GB/s against M at N = 4096, bf16: how bandwidth grows with the
    work, up to saturation;
(c) speedup.png         triton's and cuda's speedup over each baseline on the grid shapes,
    bars at the geometric mean per dtype, one dot per shape;
(d) small_shapes.png    small/decode shapes: device time per call under CUDA graphs and
    host time per call, side by side;
(e) best_peer.png       every implementation against the best peer at each grid width (the
    best peer's time / its time), one panel per dtype, on a linear axis around 1, so a 2%
    lead or loss reads as one (against eager, whose 10x flattens it, the speedup plot);
(f) triton_vs_cuda.png  once for the file: CUDA's time over Triton's at each grid width, a
    panel an op, a line a dtype;
(g) odd_widths.png      once for the file: every implementation's % of copy at 1000 beside
    1024 and 4095 and 4097 beside 4096, bf16, a panel an op (analysis.STUDY_PLOTS).
(h) gpus.png            of two runs on two GPUs, by python -m harness.gpus: Triton, CUDA and
    the best peer as % of each GPU's copy ceiling at the widths both timed, a panel an op.
Then report.md (harness.report) beside them. When a file holds several runs, the last
record of each measurement wins (harness.records.latest). The numbers come from
harness.analysis. Each op in the records gets its five plots (the first op's under the
names above, another's prefixed with its name: analysis.plot_names).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator  # noqa: E402

from harness import analysis, report  # noqa: E402
from harness.analysis import DTYPE_ORDER  # noqa: E402
from harness.ops import OPS, RMS_NORM, Op  # noqa: E402

COLORS = {
    "triton": "tab:blue",
    "cuda": "tab:red",
    "eager": "tab:gray",
    "compile": "tab:green",
    "native": "tab:orange",
    "liger": "tab:purple",
    "quack": "tab:brown",
    "flashinfer": "tab:olive",
    "flashinfer_cuda": "tab:cyan",
}
#: The two-GPU figure's file (plot_gpus), and its best peer's colour: no implementation's,
#: as the best peer may be a different one at each width.
GPUS_PLOT = "gpus.png"
BEST_PEER_COLOR = "black"
OURS_MARK, PEER_MARK = dict(marker="o", ms=4), dict(marker="s", ms=3.5)
#: Labelled speedups on the log axis; those inside the data's range are drawn.
SPEEDUP_TICKS = (0.25, 0.5, 0.7, 1, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 50, 100)


def _style(name: str, op: Op) -> dict:
    ours = name in op.ours
    return dict(
        color=COLORS.get(name),
        lw=2.2 if ours else 1.3,
        marker="o" if ours else ".",
        ms=4,
        ls="-" if ours else "--",
        label=name,
    )


def subtitle(env: dict, recs: Sequence[dict] = ()) -> str:
    """GPU and versions, for every figure's title; the commits of the figure's records
    (its points), each with the implementations measured there (analysis.commits_text),
    else the run's."""
    parts = [
        env.get("gpu") or "no GPU",
        f"torch {env.get('torch')}",
        f"triton {env.get('triton')}",
        f"CUDA {env.get('cuda')}",
    ]
    git = analysis.commits_text(recs) or analysis.commits_text([{"impl": "", "env": env}])
    if git:
        parts.append(git)
    text = " · ".join(parts)
    return f"SYNTHETIC RECORDS (test data) · {text}" if env.get("synthetic") else text


def _ceilings(ax, env: dict, op: Optional[Op] = None) -> None:
    """The theoretical peak and the copy ceiling as lines, and the op's target (a fraction
    of the copy) where it has one."""
    lines = (
        ("peak_gbps", "--", 1, "black", "theoretical peak"),
        ("copy_gbps", ":", 1.5, "dimgray", "copy ceiling"),
    )
    for key, ls, lw, color, what in lines:
        if env.get(key):
            ax.axhline(env[key], color=color, ls=ls, lw=lw, label=f"{what} {env[key]:.0f} GB/s")
    if op is not None and op.target and env.get("copy_gbps"):
        frac, whose = op.target
        at = frac * env["copy_gbps"]
        label = f"{whose}: {frac:.0%} of copy, {at:.0f} GB/s"
        ax.axhline(at, color="darkgoldenrod", ls="-.", lw=1.4, label=label)


def _shape_ceiling(ax, recs: Sequence[dict], dtype: str) -> None:
    """Each grid shape's ceiling (the fastest of its ceiling kernels), where a run timed
    them: grey crosses joined by a thin line, under the implementations' lines."""
    tops = analysis.ceilings(r for r in recs if "grid" in r["sections"])
    pts = sorted((n, gb) for (dt, _m, n), (_k, gb) in tops.items() if dt == dtype)
    if pts:
        ax.plot(*zip(*pts, strict=True), color="gray", lw=0.8, marker="x", ms=5,
                label="shape's ceiling (best of copy, Triton, Inductor, CUDA copies)")  # fmt: skip


def _lines(ax, recs: Sequence[dict], x_of, op: Op) -> None:
    """One line per implementation with its p20-p80 band (gbps_lo..gbps_hi)."""
    by_impl: dict[str, list[dict]] = {}
    for r in recs:
        by_impl.setdefault(r["impl"], []).append(r)
    for name in analysis.impl_order(by_impl, op):
        rs = sorted(by_impl[name], key=x_of)
        xs = [x_of(r) for r in rs]
        ax.plot(xs, [r["gbps"] for r in rs], **_style(name, op))
        lo = [r["gbps_lo"] or r["gbps"] for r in rs]
        hi = [r["gbps_hi"] or r["gbps"] for r in rs]
        ax.fill_between(xs, lo, hi, color=COLORS.get(name), alpha=0.18, lw=0)


def _n_ticks(ax, ns: list[int], grid_text: str = RMS_NORM.grid_text) -> None:
    """Label the powers of two among the widths; mark the others with unlabelled minor
    ticks, named in the axis label: on a log axis 1000/1024 and 4095/4096/4097 sit too
    close for their labels not to print over each other. ``grid_text``: how M was chosen."""
    pow2 = [n for n in ns if n & (n - 1) == 0] or ns
    others = [n for n in ns if n not in pow2]
    ax.set_xticks(pow2, [str(n) for n in pow2], rotation=45, fontsize=8)
    ax.set_xticks(others, minor=True)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", which="minor", length=7, width=1.2, color="dimgray")
    label = f"N, row width (elements); {grid_text} rows"
    if others:
        label += f"\nunlabelled ticks: N = {', '.join(map(str, others))}"
    ax.set_xlabel(label, fontsize=9)


def _wrapped(label: str, width: int = 46) -> str:
    """An axis label on lines of at most ``width`` characters (a gradient op's bytes model
    is longer than a panel is tall)."""
    return "\n".join(textwrap.wrap(label, width))


def _legend_below(fig, axes) -> None:
    """One legend for the figure, under the panels, where it covers no data."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.legend(
        list(entries.values()),
        list(entries),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(len(entries), 9),
        fontsize=8,
        frameon=False,
    )


def plot_bandwidth_vs_n(recs: Sequence[dict], out: Path, op: Op = RMS_NORM) -> Optional[Path]:
    """(a) GB/s against N per dtype, grid shapes."""
    grid = analysis.passed(recs, "cold", "grid")
    dtypes = [d for d in DTYPE_ORDER if any(r["dtype"] == d for r in grid)]
    if not dtypes:
        return None
    env = analysis.env_of(recs)
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes, strict=True):
        rs = [r for r in grid if r["dtype"] == dtype]
        _shape_ceiling(ax, recs, dtype)
        _lines(ax, rs, lambda r: r["shape"][1], op)
        _ceilings(ax, env, op)
        ax.set_xscale("log", base=2)
        _n_ticks(ax, sorted({r["shape"][1] for r in rs}), op.grid_text)
        ax.set_ylabel(_wrapped(f"GB/s ({op.bytes_text})"))
        ax.set_ylim(bottom=0)
        ax.set_title(f"{dtype}")
        ax.grid(alpha=0.3)
        ax.grid(alpha=0.25, which="minor", ls=":")
    _legend_below(fig, axes[0])
    fig.suptitle(
        f"(a) {op.title} bandwidth vs N, cold L2, median and p20-p80\n{subtitle(env, grid)}",
        fontsize=10,
    )
    return save(fig, out / _name(op, "bandwidth_vs_n.png"))


def plot_bandwidth_vs_m(recs: Sequence[dict], out: Path, op: Op = RMS_NORM) -> Optional[Path]:
    """(b) GB/s against M at N = 4096, bf16."""
    sweep = analysis.passed(recs, "cold", "msweep")
    if not sweep:
        return None
    env = analysis.env_of(recs)
    fig, ax = plt.subplots(figsize=(10, 5.5))
    _lines(ax, sweep, lambda r: r["shape"][0], op)
    _ceilings(ax, env)
    if env.get("copy_gbps"):
        ax.axhline(
            analysis.SATURATION * env["copy_gbps"],
            color="dimgray",
            ls="-.",
            lw=0.8,
            label=f"{analysis.SATURATION:.1f}x copy ceiling",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("M, rows (N = 4096, bf16)")
    ax.set_ylabel(_wrapped(f"GB/s ({op.bytes_text}), log scale"))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(
        f"(b) {op.title} bandwidth vs M at N = 4096, bf16, cold L2\n{subtitle(env, sweep)}",
        fontsize=10,
    )
    return save(fig, out / _name(op, "bandwidth_vs_m.png"))


def plot_speedup(recs: Sequence[dict], out: Path, op: Op = RMS_NORM) -> Optional[Path]:
    """(c) speedup of our kernels over each baseline, geometric mean per dtype."""
    sp = analysis.speedups(recs, "grid", op)
    timed = analysis.passed(recs, "cold", "grid")  # what the speedups are drawn from
    ours = [o for o in op.ours if any(k[0] == o for k in sp)]
    if not ours:
        return None
    env = analysis.env_of(recs)
    dtypes = [d for d in DTYPE_ORDER if any(k[2] == d for k in sp)]
    fig, axes = plt.subplots(1, len(ours), figsize=(7 * len(ours), 5.5), squeeze=False)
    width = 0.8 / len(dtypes)
    lo = hi = 1.0
    for ax, o in zip(axes[0], ours, strict=True):
        bases = [b for b in op.baselines if any(k[0] == o and k[1] == b for k in sp)]
        for j, dtype in enumerate(dtypes):
            for i, base in enumerate(bases):
                vals = [s for _, s in sp.get((o, base, dtype), [])]
                gm = analysis.geomean(vals)
                if gm is None:
                    continue
                x = i + (j - (len(dtypes) - 1) / 2) * width
                ax.bar(
                    x, gm, width * 0.9, color=f"C{j}", alpha=0.6, label=dtype if i == 0 else None
                )
                ax.scatter([x] * len(vals), vals, s=8, color="black", zorder=3)
                # above the column's highest mark and upright, so neighbours never touch
                top = max(vals + [gm])
                ax.annotate(
                    f"{gm:.2f}x",
                    (x, top),
                    xytext=(0, 4),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    rotation=90,
                    fontsize=7,
                )
                lo, hi = min(lo, *vals, gm), max(hi, top)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(bases)), bases)
        ax.set_ylabel(f"speedup of {o} (baseline time / {o} time), log scale")
        ax.set_xlabel("baseline")
        ax.set_title(f"{o}: bar = geometric mean over grid shapes, dot = one shape", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    # one scale for both panels; headroom above the tallest column for its upright label
    ylim = (lo / 1.3, hi * 2.2)
    ticks = [v for v in SPEEDUP_TICKS if ylim[0] <= v <= ylim[1]]
    for ax in axes[0]:
        ax.set_yscale("log")
        ax.set_ylim(*ylim)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"(c) {op.title}: speedup over each baseline, cold L2\n{subtitle(env, timed)}",
        fontsize=10,
    )
    return save(fig, out / _name(op, "speedup.png"))


def plot_small(recs: Sequence[dict], out: Path, op: Op = RMS_NORM) -> Optional[Path]:
    """(d) small shapes: graph device time and host time per call, side by side."""
    graph = analysis.passed(recs, "graph")
    host = analysis.passed(recs, "host")
    decode = [r for r in graph + host if "decode" in r["sections"]]
    chosen = decode or graph + host
    if not chosen:
        return None
    shapes = sorted(
        {(r["dtype"], r["shape"][0], r["shape"][1]) for r in chosen}, key=lambda k: (k[2], k[1])
    )
    names = analysis.impl_order({r["impl"] for r in chosen}, op)
    env = analysis.env_of(recs)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / len(names)
    for ax, mode, what in (
        (axes[0], "graph", "device time per call under CUDA-graph replay"),
        (axes[1], "host", "host time per call (loop, no sync)"),
    ):
        idx = analysis.by_shape(r for r in chosen if r["mode"] == mode)
        for j, name in enumerate(names):
            xs, ys = [], []
            for i, key in enumerate(shapes):
                r = idx.get(key, {}).get(name)
                if r is not None:
                    xs.append(i + (j - (len(names) - 1) / 2) * width)
                    ys.append(r["stats"]["median_us"])
            ax.bar(xs, ys, width * 0.9, color=COLORS.get(name), label=name)
        ax.set_xticks(range(len(shapes)), [f"{m}x{n}\n{d}" for d, m, n in shapes], fontsize=7)
        ax.set_xlabel("shape (M x N)")
        ax.set_ylabel("microseconds per call (median)")
        ax.set_title(what, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    _legend_below(fig, axes)
    fig.suptitle(
        f"(d) {op.title}, small shapes: GPU time vs host launch cost\n{subtitle(env, chosen)}",
        fontsize=10,
    )
    return save(fig, out / _name(op, "small_shapes.png"))


def plot_best_peer(recs: Sequence[dict], out: Path, op: Op = RMS_NORM) -> Optional[Path]:
    """(e) each implementation's time against the best peer's at each grid width."""
    ratios = analysis.best_peer_ratios(recs, "grid", op)
    dtypes = [d for d in DTYPE_ORDER if d in ratios]
    if not dtypes:
        return None
    env = analysis.env_of(recs)
    # the panel spans our kernels and the best peer (1), to 1.3x at most: the odd widths'
    # leads of 1.5-2.4x would flatten the 1-2% that decide the ordinary ones; what runs
    # off the panel is named in its title
    ours = [v for d in dtypes for o in op.ours for _, v in ratios[d].get(o, [])]
    lo = min([0.9, *ours]) - 0.03
    hi = min(max([1.1, *ours]) + 0.03, 1.3)
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes, strict=True):
        by_impl = ratios[dtype]
        below, above = [], []
        for name in analysis.impl_order(by_impl, op):
            pts = by_impl[name]  # in N's order
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, **_style(name, op))
            if min(ys) < lo:
                below.append(f"{name} (to {min(ys):.2f}x)")
            top = max(pts, key=lambda p: p[1])
            if top[1] > hi:
                above.append(f"{name} (N = {top[0]}: {top[1]:.2f}x)")
        ax.axhline(1.0, color="black", lw=0.8, label="the best peer at that width")
        ax.set_xscale("log", base=2)
        _n_ticks(ax, sorted({n for pts in by_impl.values() for n, _ in pts}), op.grid_text)
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2f}x"))
        ax.set_ylabel(
            _wrapped("best peer's time / this implementation's time (> 1: ahead of every peer)")
        )
        title = dtype
        for where, names in (("above", above), ("below", below)):
            if names:
                title += f"\n{where} the panel: " + ", ".join(names)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    _legend_below(fig, axes[0])
    fig.suptitle(
        f"(e) {op.title}: against the best peer at each width, cold L2, medians"
        f"\n{subtitle(env, analysis.passed(recs, 'cold', 'grid'))}",
        fontsize=10,
    )
    return save(fig, out / _name(op, "best_peer.png"))


def _op_panels(n: int, height: float) -> tuple:
    """A figure of n panels, three a row at most, and its first n axes (the rest hidden):
    the study plots' a panel an op."""
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _width_slots(ax, ns: list[int], grid_text: str, **tick_style) -> None:
    """The widths ns as evenly spaced ticks (a slot a width, not a log axis: 4095, 4096
    and 4097 side by side), those off a power of two in red."""
    ax.set_xticks(range(len(ns)), [str(n) for n in ns], **tick_style)
    for label, n in zip(ax.get_xticklabels(), ns, strict=True):
        if n & (n - 1):
            label.set_color("C3")
    ax.set_xlabel(f"N, row width (elements; red: not a power of two); {grid_text}", fontsize=8)


def plot_triton_vs_cuda(recs: Sequence[dict], out: Path) -> Optional[Path]:
    """(f) across the ops: CUDA's time over Triton's at each grid width, a panel an op, a
    line a dtype; the question the study asks, each op's answer side by side."""
    panels = [
        (op, ratios)
        for op, op_recs in analysis.by_op(recs).items()
        if (ratios := analysis.ours_ratios(op_recs, "grid", op))
    ]
    if not panels:
        return None
    fig, axes = _op_panels(len(panels), 4.3)
    every = [v for _, ratios in panels for pts in ratios.values() for _, v in pts]
    # one scale for every panel, so an op's gap reads against another's; 1 always inside
    lo, hi = min([0.95, *every]) - 0.02, max([1.05, *every]) + 0.02
    for ax, (op, ratios) in zip(axes, panels, strict=True):
        ns = sorted({n for pts in ratios.values() for n, _ in pts})
        slot = {n: i for i, n in enumerate(ns)}
        for dtype in [d for d in DTYPE_ORDER if d in ratios]:
            xs, ys = zip(*ratios[dtype], strict=True)
            ax.plot([slot[n] for n in xs], ys, marker="o", ms=3.5, lw=1.2, label=dtype)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhspan(1.0, hi, color="C0", alpha=0.05)
        ax.text(0.02, 0.97, "Triton faster", transform=ax.transAxes, va="top", fontsize=7)
        ax.text(0.02, 0.03, "CUDA faster", transform=ax.transAxes, va="bottom", fontsize=7)
        _width_slots(ax, ns, op.grid_text, rotation=45, fontsize=7)
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2f}x"))
        ax.set_ylabel("CUDA's time / Triton's", fontsize=8)
        ax.set_title(op.title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(
        "(f) Triton against CUDA C++: CUDA's time / Triton's at each grid width, cold L2, "
        f"medians\n{subtitle(analysis.env_of(recs), analysis.passed(recs, 'cold', 'grid'))}",
        fontsize=10,
    )
    return save(fig, out / analysis.STUDY_PLOTS[0])


def plot_odd_widths(recs: Sequence[dict], out: Path, dtype: str = "bf16") -> Optional[Path]:
    """(g) across the ops: every implementation's % of copy at 1000 beside 1024 and 4095
    and 4097 beside 4096 (analysis.odd_widths), bars side by side, a panel an op; where
    the peers fall to scalar accesses, read against their own round widths."""
    panels = [
        (op, got)
        for op, op_recs in analysis.by_op(recs).items()
        if (got := analysis.odd_widths(op_recs, dtype))
    ]
    if not panels:
        return None
    fig, axes = _op_panels(len(panels), 4.6)
    for ax, (op, got) in zip(axes, panels, strict=True):
        ns = sorted(got)
        names = analysis.impl_order({name for row in got.values() for name in row}, op)
        width = 0.85 / len(names)
        for j, name in enumerate(names):
            xs = [
                i + (j - (len(names) - 1) / 2) * width for i, n in enumerate(ns) if name in got[n]
            ]
            ys = [got[n][name] for n in ns if name in got[n]]
            ax.bar(xs, ys, width * 0.9, color=COLORS.get(name), label=name)
        ax.axhline(100, color="black", lw=0.8, ls="--")
        _width_slots(ax, ns, op.grid_text)
        ax.set_ylabel("% of the copy ceiling (cold L2, median)", fontsize=8)
        title = op.title
        over = max(v for row in got.values() for v in row.values()) > 100
        if over and "dresidual" in op.bytes_text:
            # the bytes model charges every implementation dx and dresidual both, so one
            # that returns one tensor as both moves less than it is charged
            title += (
                "\nabove 100%: fewer bytes moved than the model charges every implementation"
                "\n(one tensor returned as both dx and dresidual: report.md's bytes model)"
            )
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    _legend_below(fig, axes)
    fig.suptitle(
        f"(g) the odd widths beside their round neighbours, {dtype}: % of the copy ceiling"
        " (no bar: not run there, or it failed: the report's failures)"
        f"\n{subtitle(analysis.env_of(recs), analysis.passed(recs, 'cold', 'grid'))}",
        fontsize=10,
    )
    return save(fig, out / analysis.STUDY_PLOTS[1])


def _gpu_text(name: str, env: dict) -> str:
    """A run's legend entry: its name, GPU, theoretical peak and copy ceiling."""
    peak, copy = env.get("peak_gbps"), env.get("copy_gbps")
    text = f"{name}: {env.get('gpu') or 'no GPU'}"
    text += f", peak {peak:.0f} GB/s" if peak else ""
    return text + (f", copy ceiling {copy:.0f} GB/s" if copy else "")


def plot_gpus(runs: dict[str, Sequence[dict]], out: Path, dtype: str = "bf16") -> Optional[Path]:
    """(h) two runs on two GPUs, ``{name: records}``: at each grid width both timed in
    dtype, Triton, CUDA and the best peer both runs timed (analysis.portability) as % of
    that GPU's own copy ceiling, a panel an op both ran; a colour an implementation, the
    first run solid, the second dashed. % of copy, not GB/s: the GPUs' bandwidths differ,
    and the question is whether each kernel gets as close to its GPU's limit."""
    rows = [r for r in analysis.portability(runs) if r["dtype"] == dtype]
    if not rows:
        return None
    names = list(runs)
    styles = dict(zip(names, ("-", "--"), strict=True))
    ops = [op for op in OPS.values() if any(r["op"] == op.name for r in rows)]
    fig, axes = _op_panels(len(ops), 4.6)
    # one scale for every panel, so an op's gap between the GPUs reads against another's
    every = [v for r in rows for d in (r["pct"], r["peer_pct"]) for v in d.values() if v]
    lo, hi = min(every) - 0.5, max([100.0, *every]) + 0.5
    for ax, op in zip(axes, ops, strict=True):
        mine = [r for r in rows if r["op"] == op.name]
        ns = sorted({r["n"] for r in mine})
        slot = {n: i for i, n in enumerate(ns)}
        for name in names:
            for impl in op.ours:
                pts = [(slot[r["n"]], r["pct"][name]) for r in mine if r["impl"] == impl]
                pts = [p for p in pts if p[1] is not None]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, color=COLORS.get(impl), ls=styles[name], lw=2, **OURS_MARK)
            # the best peer is one a width, the same in each kernel's row
            peer = {slot[r["n"]]: r["peer_pct"][name] for r in mine if r["peer_pct"][name]}
            if peer:
                xs = sorted(peer)
                ys = [peer[x] for x in xs]
                ax.plot(xs, ys, color=BEST_PEER_COLOR, ls=styles[name], lw=1.3, **PEER_MARK)
        ax.axhline(100, color="dimgray", lw=0.8, ls=":")
        _width_slots(ax, ns, op.grid_text)
        ax.set_ylim(lo, hi)
        ax.set_ylabel("% of that GPU's copy ceiling (dotted: 100%)", fontsize=8)
        ax.set_title(op.title, fontsize=9)
        ax.grid(alpha=0.3)
    ours = [i for op in ops for i in op.ours if any(r["impl"] == i for r in rows)]
    handles = [
        Line2D([], [], color=COLORS.get(i), lw=2, label=i, **OURS_MARK) for i in dict.fromkeys(ours)
    ]
    peer_text = "the best peer at that width, of those both runs timed (gpus.md names it)"
    handles.append(Line2D([], [], color=BEST_PEER_COLOR, lw=1.3, label=peer_text, **PEER_MARK))
    handles += [
        Line2D([], [], color="dimgray", ls=styles[n], lw=2, label=_gpu_text(n, analysis.env_of(r)))
        for n, r in runs.items()
    ]
    # two columns, filled down: the colours on the left, the runs' line styles on the right
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=2,
        fontsize=8,
        frameon=False,
    )
    titles = [
        f"{name}: {subtitle(analysis.env_of(recs), analysis.compared(recs, rows))}"
        for name, recs in runs.items()
    ]
    fig.suptitle(
        f"(h) {' against '.join(names)}: % of each GPU's own copy ceiling at the grid widths "
        f"both runs timed, {dtype}, cold L2, medians\n" + "\n".join(titles),
        fontsize=10,
    )
    return save(fig, out / GPUS_PLOT)


def _name(op: Op, plain: str) -> str:
    """The file name of one of an op's plots (analysis.plot_names)."""
    return analysis.plot_names(op)[analysis.PLOT_NAMES.index(plain)]


def save(fig, path: Path) -> Path:
    """fig laid out, written to path (its folder made) and closed: every figure the
    harness draws, this module's and harness.cost's and harness.model.figure's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # "tight" keeps a figure legend placed under the panels inside the image
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def redraw(records_path: str | Path, out: str | Path) -> list[Path]:
    """Draw the five plots and the report (report.md, and a page an op with several) from a
    records file; return the files written.

    RecordError for a malformed file; analysis.NoMeasurements for one without timings."""
    return draw(analysis.load(records_path), out)


def draw(recs: Sequence[dict], out: str | Path) -> list[Path]:
    """Each op's five plots and the report from records already loaded (analysis.load)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = []
    for op, op_recs in analysis.by_op(recs).items():
        for draw_one in (
            plot_bandwidth_vs_n,
            plot_bandwidth_vs_m,
            plot_speedup,
            plot_small,
            plot_best_peer,
        ):
            p = draw_one(op_recs, out, op)
            if p is not None:
                plots.append(p)
    for draw_study in (plot_triton_vs_cuda, plot_odd_widths):
        p = draw_study(recs, out)
        if p is not None:
            plots.append(p)
    return plots + report.write_report(recs, out, plots)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.plot",
        description=__doc__.split("\n")[0] + " Writes the five plots and report.md.",
    )
    p.add_argument("records", help="a records.jsonl written by python -m harness.bench")
    p.add_argument("--out", default=None, help="output directory (default: beside RECORDS)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    got = report.records_and_out(build_parser(), argv)
    if got is None:
        return 1
    recs, out = got
    for f in draw(recs, out):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
