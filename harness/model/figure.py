"""model_speedups.png: the block's speedup over native for each of our variants, a bar a
variant in each mode, with its range over the blocks and the Amdahl bound drawn over it;
a panel a shape of the Llama-3-8B-shaped block. Drawn from records (tables.prepared), so
any machine can redraw a GPU run.

    python -m harness.model.figure RECORDS [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness import analysis, records  # noqa: E402
from harness.model.config import BLOCK_OP, MODES, VARIANTS  # noqa: E402
from harness.model.tables import prepared  # noqa: E402
from harness.plot import save, subtitle  # noqa: E402

NAME = "model_speedups.png"
#: Our variants, in the report's order (native is the 1 they are drawn against; the eager
#: formula, at 0.5-0.9x, would flatten the 1-4% that separate ours).
OURS = tuple(v for v in VARIANTS if v not in ("native", "eager"))


def speedups(recs: list[dict]) -> dict[str, dict[str, dict[str, dict]]]:
    """{shape: {mode: {variant: model}}} of the block's passed records with a speedup."""
    out: dict[str, dict[str, dict[str, dict]]] = {}
    for r in prepared(recs):
        m = r["model"]
        if r["op"] != BLOCK_OP or r["status"] != "PASS" or not m.get("speedup"):
            continue
        if m.get("variant") in OURS:
            out.setdefault(m["shape"], {}).setdefault(m["exec"], {})[m["variant"]] = m
    return out


def draw(recs: list[dict], out: Path) -> Optional[Path]:
    """The figure in out (NAME), or None where no record of ours has a speedup."""
    got = speedups(recs)
    if not got:
        return None
    shapes = list(got)
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 5), squeeze=False)
    every = [
        v
        for by_mode in got.values()
        for by_var in by_mode.values()
        for m in by_var.values()
        for v in (m["speedup"]["lo"], m["speedup"]["hi"], m.get("bound") or 1.0)
    ]
    lo, hi = min([0.97, *every]) - 0.01, max([1.03, *every]) + 0.01
    for ax, shape in zip(axes[0], shapes, strict=True):
        modes = [mode for mode in MODES if mode in got[shape]]
        names = [v for v in OURS if any(v in got[shape][mode] for mode in modes)]
        width = 0.85 / len(names)
        for j, name in enumerate(names):
            labelled = False
            for i, mode in enumerate(modes):
                m = got[shape][mode].get(name)
                if m is None:
                    continue
                x = i + (j - (len(names) - 1) / 2) * width
                sp = m["speedup"]
                ax.bar(
                    x,
                    sp["median"] - 1,
                    width * 0.9,
                    bottom=1,
                    color=f"C{j}",
                    label=None if labelled else name,
                )
                labelled = True
                ax.errorbar(
                    x,
                    sp["median"],
                    yerr=[[sp["median"] - sp["lo"]], [sp["hi"] - sp["median"]]],
                    fmt="none",
                    ecolor="black",
                    lw=0.8,
                    capsize=2,
                )
                if m.get("bound"):
                    ax.hlines(m["bound"], x - width * 0.45, x + width * 0.45, colors="black", lw=2)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(modes)), modes)
        ax.set_ylim(lo, hi)
        ax.set_ylabel("block speedup over native (native's time / the variant's)", fontsize=8)
        ax.set_title(
            f"{shape}: bar = median, whisker = range over the blocks, black dash = the bound",
            fontsize=8,
        )
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="upper left")
    blocks = [r for r in recs if r.get("model")]
    fig.suptitle(
        "The whole model: RMSNorm in a Llama-3-8B-shaped decoder block, our variants over native "
        f"(Amdahl bound: 1 / ((1 - f) + f / s))\n{subtitle(analysis.env_of(recs), blocks)}",
        fontsize=10,
    )
    return save(fig, out / NAME)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.model.figure", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "records", help="a model records.jsonl (or .xz) written by python -m harness.model"
    )
    p.add_argument("--out", default=None, help="output directory (default: beside RECORDS)")
    args = p.parse_args(argv)
    path = Path(args.records)
    got = draw(records.read_records(path), Path(args.out) if args.out else path.parent)
    if got is None:
        print(f"{path}: no block record of ours with a speedup; nothing drawn")
        return 1
    print(f"wrote {got}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
