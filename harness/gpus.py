"""Two runs of record on two GPUs side by side: gpus.png and gpus.md.

    python -m harness.gpus H200=PATH H100=PATH [--dtype bf16] [--out DIR]

Each NAME=PATH is a records file of harness.bench (results/<gpu>/records.jsonl.xz), NAME
how the figure and the table call that run. The figure (harness.plot.plot_gpus): Triton,
CUDA and the best peer as % of each GPU's own copy ceiling at the grid widths both runs
timed, in one dtype, a panel an op both ran, the first run solid and the second dashed.
The page (harness.report.gpus_page): both environments, the figure, and the rows of
analysis.portability that tell the GPUs apart, every dtype both ran: % of copy more than
analysis.GPU_POINTS apart, or a kernel level with or ahead of the best peer on one GPU and
behind it on the other (tuning made on one GPU that does not hold on the other).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional

from harness import analysis, plot, records, report
from harness.analysis import DTYPE_ORDER

PAGE = "gpus.md"
#: A run's name: what a table header and a legend can carry.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def run_arg(text: str) -> tuple[str, Path]:
    """NAME=PATH as (name, path); argparse's error, naming the argument, where it is not."""
    name, eq, path = text.partition("=")
    if not eq or not NAME.fullmatch(name) or not path:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=PATH (a name of letters, digits, '_.+-', then '=' and a "
            "records file: H200=results/h200/records.jsonl.xz)"
        )
    return name, Path(path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.gpus",
        description=__doc__.split("\n")[0],
    )
    p.add_argument(
        "runs",
        metavar="NAME=PATH",
        nargs=2,
        type=run_arg,
        help="a run's name and its records file (harness.bench's), first the GPU the "
        "kernels were tuned on: drawn solid, the second dashed",
    )
    p.add_argument(
        "--dtype",
        default="bf16",
        choices=DTYPE_ORDER,
        help="the figure's dtype (default: %(default)s); the table has every dtype both ran",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output directory (default: beside the first run's records)",
    )
    return p


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    (a, path_a), (b, path_b) = args.runs
    if a == b:
        p.error(f"NAME=PATH: both runs are named {a}; name each its GPU (H200=..., H100=...)")
    for name, path in args.runs:
        if not path.is_file():
            p.error(f"NAME=PATH: {name}={path}: no such file")
    # the records first (cheap), so a run with nothing to draw leaves no empty --out
    runs = {}
    for name, path in args.runs:
        try:
            runs[name] = analysis.load(path)
        except (records.RecordError, analysis.NoMeasurements) as e:
            what = "invalid records: " if isinstance(e, records.RecordError) else ""
            print(f"{p.prog}: {name}={path}: {what}{e}", file=sys.stderr)
            return 1
    rows = analysis.portability(runs)
    if not any(r["dtype"] == args.dtype for r in rows):
        both = sorted({r["dtype"] for r in rows}) or ["none"]
        print(
            f"{p.prog}: {a} and {b} share no grid width of an op in {args.dtype} (--dtype); "
            f"dtypes both ran at a shared width: {', '.join(both)}",
            file=sys.stderr,
        )
        return 1
    out = args.out if args.out is not None else str(path_a.parent)
    if why := records.out_dir_problem(out):
        p.error(f"--out {out} {why}")
    figure = plot.plot_gpus(runs, Path(out), args.dtype)
    page = Path(out) / PAGE
    page.write_text(report.gpus_page(runs, rows, figure and figure.name), encoding="utf-8")
    for f in (figure, page):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
