"""A device call's log, cleaned, as a committed record: results/h200/logs/SHA-NAME.log.

    python3 scripts/keep_log.py RUN_LOG SHA NAME "what ran and what it showed"

Kept: every line but pytest-benchmark's warnings (one a test when the timer is off), and
of a line redrawn with carriage returns (progress bars) its last form. The first line is
the header the notebook cites: `# sha: SHA (SUMMARY)`.
"""

import argparse
import pathlib
import re

NOISE = re.compile(r"PytestBenchmarkWarning|warner\(")
LOGS = pathlib.Path(__file__).resolve().parent.parent / "results" / "h200" / "logs"


def clean(text: str) -> list[str]:
    """The log's lines, each at its last carriage-return segment, the noise left out."""
    lines = []
    for line in text.split("\n"):
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
        if not NOISE.search(line):
            lines.append(line.rstrip())
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run_log", type=pathlib.Path)
    p.add_argument("sha", help="the commit that ran (7 hex digits or more)")
    p.add_argument("name", help="what the call ran, for the file name: bwd-tests-probe, ...")
    p.add_argument("summary", help="the header's words: the call, the GPU, the outcome")
    args = p.parse_args()
    if not re.fullmatch(r"[0-9a-f]{7,40}", args.sha):
        raise SystemExit(f"sha: {args.sha!r} is not a commit id")
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", args.name):
        raise SystemExit(f"name: {args.name!r}: lower-case words joined by '-'")
    sha = args.sha[:7]
    out = LOGS / f"{sha}-{args.name}.log"
    if out.exists():
        raise SystemExit(f"{out} exists: a record is not overwritten")
    text = args.run_log.read_bytes().decode(errors="replace")  # carriage returns kept
    lines = [f"# sha: {sha} ({args.summary})", *clean(text)]
    out.write_text("\n".join(lines).rstrip("\n") + "\n")
    print(f"{out}: {len(lines)} lines")


if __name__ == "__main__":
    main()
