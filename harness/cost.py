"""cost.png: what each language costs, Triton against CUDA C++, in four panels: lines of
code, kernels, the ahead-of-time build and the first call at a new shape.

    python -m harness.cost [--records R] [--build-log L] [--out DIR]

Lines are counted in this tree, comments and blanks included: `triton_impl/`'s Python
against `cuda_impl/`'s sources (csrc/ and its Python), the shared `rmsnorm_api/` left out.
Kernels, not the same unit on both sides, as the panel says: Triton's `@triton.jit`
functions that no Triton code calls (the launched ones, each specialised by the JIT per
signature at first call); CUDA's compiled instantiations, from a device build
log's `kernels:` line (scripts/h200.sh's build step), which gives the build's seconds too.
First calls: the bench records' (analysis.first_calls, rms_norm's: JIT compilation
included for Triton). The title names the tree's commit, the log and the records.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness import analysis  # noqa: E402
from harness.ops import RMS_NORM  # noqa: E402
from harness.plot import save  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NAME = "cost.png"
CUDA_SOURCES = (".cu", ".cuh", ".h", ".cpp", ".inc", ".py")


def lines_of(root: Path, suffixes: tuple[str, ...]) -> int:
    """Lines of the files under root with these suffixes (wc -l: blanks and comments)."""
    return sum(
        len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in suffixes
    )


def triton_kernels(root: Path) -> int:
    """The @triton.jit functions in root's Python that no code there calls: the kernels
    launched (by a grid, from a table); the helpers they call are inlined into them."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py")))
    jitted = re.findall(r"^@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def (\w+)", text, re.M)
    return sum(1 for name in jitted if not re.search(rf"(?<!def )\b{name}\(", text))


def build_of(log: Path) -> tuple[int, float]:
    """(kernels, seconds) of a device build log (h200.sh's `kernels: N` and `build seconds:
    S` lines); ValueError naming the log where either is missing."""
    text = log.read_text(encoding="utf-8")
    kernels = re.search(r"^kernels: (\d+)$", text, re.M)
    seconds = re.search(r"^build seconds: ([0-9.e+-]+)$", text, re.M)
    if not kernels or not seconds:
        raise ValueError(f"build_log: {log} has no 'kernels:' and 'build seconds:' lines")
    return int(kernels.group(1)), float(seconds.group(1))


def commit() -> str:
    """This tree's commit (short), or 'unknown' outside git."""
    got = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return got.stdout.strip() or "unknown"


def draw(records_path: Path, build_log: Path, out: Path) -> Path:
    """cost.png in out from the tree, the build log and the bench records."""
    lines = {
        "triton": lines_of(REPO / "triton_impl", (".py",)),
        "cuda": lines_of(REPO / "cuda_impl", CUDA_SOURCES),
    }
    cuda_kernels, build_s = build_of(build_log)
    kernels = {"triton": triton_kernels(REPO / "triton_impl"), "cuda": cuda_kernels}
    recs = analysis.load(records_path)
    plain = analysis.by_op(recs).get(RMS_NORM, recs)
    first = {f["impl"]: f for f in analysis.first_calls(plain, RMS_NORM)}
    if not {"triton", "cuda"} <= set(first):
        raise ValueError(f"records: {records_path} has no first calls of both kernels")
    colors = {"triton": "C0", "cuda": "C3"}
    names = ["triton", "cuda"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    panels = (
        (axes[0], "lines of code (this tree)", lines, "{:,.0f}", False),
        (
            axes[1],
            "kernels: Triton's in source (each JIT-specialised\n"
            "at first call), CUDA's instantiations built ahead",
            kernels,
            "{:,.0f}",
            True,
        ),
        (
            axes[2],
            "ahead-of-time build, seconds (the log's machine)",
            {"triton": 0.0, "cuda": build_s},
            "{:.0f} s",
            False,
        ),
        (
            axes[3],
            "first call at a new shape, median (max), s",
            {n: first[n]["median_s"] for n in names},
            "{:.2g} s",
            True,
        ),
    )
    for ax, title, values, fmt, log in panels:
        ax.bar(names, [values[n] for n in names], color=[colors[n] for n in names])
        for i, n in enumerate(names):
            text = fmt.format(values[n]) if values[n] else "none (JIT)"
            if ax is axes[3]:
                text += f"\n(max {first[n]['max_s']:.2g} s)"
            ax.annotate(text, (i, values[n] or 0), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
        if log:
            ax.set_yscale("log")
            ax.set_ylim(min(v for v in values.values() if v) / 3, max(values.values()) * 8)
        else:
            ax.set_ylim(0, max(values.values()) * 1.25)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    env = analysis.env_of(recs)
    fig.suptitle(
        "What each language costs: Triton against CUDA C++"
        f"\nlines and Triton's kernels: this tree at {commit()}; CUDA's kernels and build: "
        f"{build_log.name}; first calls: {env.get('gpu')}, {analysis.commits_text(plain)}",
        fontsize=10,
    )
    return save(fig, out / NAME)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.cost", description=__doc__.split("\n")[0])
    p.add_argument("--records", default=str(REPO / "results/h200/records.jsonl.xz"))
    p.add_argument("--build-log", required=True, help="a device call's log with its build step")
    p.add_argument("--out", default=str(REPO / "results/h200"))
    args = p.parse_args(argv)
    try:
        path = draw(Path(args.records), Path(args.build_log), Path(args.out))
    except (OSError, ValueError) as e:
        print(f"harness.cost: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
