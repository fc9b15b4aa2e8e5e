"""Benchmark records: one JSON object per line, append-only, the environment in every line.

Every figure and table in a report is drawn from these lines, so any machine can redraw a
GPU run. A line is written (and flushed) as soon as it is measured: an interrupted run
keeps what it measured.

Records are op-generic: ``op`` names the op measured (harness.ops), whose bytes model gave
``bytes``; a line written before the field existed reads as rms_norm.

Schema (version 1). Every line has:
    schema, run_id, time (UTC ISO), kind ("timing" | "sweep" | "copy" | "ceiling" | "skip" |
    "model"),
    env (dict),
    op (str, e.g. "rms_norm"), impl, dtype ("fp32" | "fp16" | "bf16" | None),
    shape ([M, N] | None),
    sections (list: "grid", "msweep", "decode", "reference", "quick", "custom"), shape_class,
    mode ("cold" | "graph" | "host" | None), small (bool: working set under L2 or ~20 us),
    bytes (int | None), status ("PASS" | "FAIL" | "SKIP"),
    correct ({max_abs, max_rel, passed, error} | None),
    samples_us (list), blocks (list of {median_us, p20_us, p80_us, n}),
    stats ({median_us, p20_us, p80_us, min_us, max_us, mean_us, n} | None),
    spread (relative spread of the block medians | None),
    gbps, gbps_lo, gbps_hi (GB/s at the median, p80 and p20 times | None),
    pct_peak, pct_copy (% of theoretical peak / measured copy ceiling | None; None for
    small shapes and for graph/host modes, whose bytes need not come from HBM),
    pct_ceiling (% of the shape's ceiling, the fastest of the ceiling records timed with it
    | None: a shape with no ceiling records, and every kind but timing and sweep),
    kernels ({class, names, count, path} | None), compile_s (float | None),
    resources (list of triton_impl / cuda_impl.ops kernel_info dicts | None),
    clocks (dict | None),
    config ({params, default} | None: a sweep record's forced launch config, and whether
    it is the one the kernel picks itself),
    model ({block, shape, exec, variant, ...} | None: what a model record timed, a whole
    decoder block with one norm variant, and its Amdahl figures; harness.model),
    notes (list of str).
A sweep record is a timing of one forced config (harness.sweep): the same fields, the
same statistics, with ``config`` set. A ceiling record times one of a shape's ceiling
kernels (harness.ceiling: ``impl`` names it) in the same blocks as the implementations,
by the op's bytes model. A model record (harness.model) times a decoder
block, not an op alone: ``op`` names the block, ``shape`` is the norm's in-block [rows, N],
``mode`` is how it was timed (cold: L2 flushed before each sample), ``bytes`` is None, and
``model`` holds the rest.
"""

from __future__ import annotations

import datetime as _dt
import json
import lzma
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

SCHEMA_VERSION = 1
KINDS = ("timing", "sweep", "copy", "ceiling", "skip", "model")
#: What a record written before the "op" field existed measured.
DEFAULT_OP = "rms_norm"
MODES = ("cold", "graph", "host")
STATUSES = ("PASS", "FAIL", "SKIP")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}

# field -> allowed types (None in the tuple means the value may be null)
_FIELDS: dict[str, tuple] = {
    "schema": (int,),
    "run_id": (str,),
    "time": (str,),
    "kind": (str,),
    "env": (dict,),
    "op": (str,),
    "impl": (str,),
    "dtype": (str, None),
    "shape": (list, None),
    "sections": (list,),
    "shape_class": (str, None),
    "mode": (str, None),
    "small": (bool,),
    "bytes": (int, None),
    "status": (str,),
    "correct": (dict, None),
    "samples_us": (list,),
    "blocks": (list,),
    "stats": (dict, None),
    "spread": (float, int, None),
    "gbps": (float, int, None),
    "gbps_lo": (float, int, None),
    "gbps_hi": (float, int, None),
    "pct_peak": (float, int, None),
    "pct_copy": (float, int, None),
    "pct_ceiling": (float, int, None),
    "kernels": (dict, None),
    "compile_s": (float, int, None),
    "resources": (list, None),
    "clocks": (dict, None),
    "config": (dict, None),
    "model": (dict, None),
    "notes": (list,),
}
#: Kinds that are measurements of an op at a shape.
_MEASURED = ("timing", "sweep", "ceiling")
_OP_NAME = re.compile(r"[a-z][a-z0-9_]*")
_STAT_KEYS = ("median_us", "p20_us", "p80_us", "min_us", "max_us", "mean_us", "n")


class RecordError(ValueError):
    """A line that does not follow the schema; the message names the field."""


def gbps(nbytes: int, seconds: Optional[float]) -> Optional[float]:
    """Decimal GB/s (1e9 bytes per second), the unit of every figure; None if no time."""
    if seconds is None or seconds <= 0 or not math.isfinite(seconds):
        return None
    return nbytes / seconds / 1e9


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain_text(text: str) -> str:
    """text without terminal colour codes (some peers colour their error messages)."""
    return _ANSI.sub("", text)


def new_run_id() -> str:
    """A sortable id for one bench invocation: the UTC start time."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _clean(value: Any) -> Any:
    """NaN and inf are not JSON: store them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def make_record(*, run_id: str, env: dict, kind: str, impl: str, **fields: Any) -> dict:
    """A complete record: the given fields over defaults for everything else."""
    rec: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "run_id": run_id,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "kind": kind,
        "env": env,
        "op": DEFAULT_OP,
        "impl": impl,
        "dtype": None,
        "shape": None,
        "sections": [],
        "shape_class": None,
        "mode": None,
        "small": False,
        "bytes": None,
        "status": "PASS",
        "correct": None,
        "samples_us": [],
        "blocks": [],
        "stats": None,
        "spread": None,
        "gbps": None,
        "gbps_lo": None,
        "gbps_hi": None,
        "pct_peak": None,
        "pct_copy": None,
        "pct_ceiling": None,
        "kernels": None,
        "compile_s": None,
        "resources": None,
        "clocks": None,
        "config": None,
        "model": None,
        "notes": [],
    }
    unknown = set(fields) - set(_FIELDS)
    if unknown:
        raise RecordError(f"make_record: unknown fields {sorted(unknown)}")
    rec.update(fields)
    if rec["shape"] is not None:
        rec["shape"] = [int(v) for v in rec["shape"]]
    rec = _clean(rec)
    validate_record(rec)
    return rec


def validate_record(rec: Any) -> None:
    """Raise RecordError naming the first field that breaks the schema."""
    if not isinstance(rec, dict):
        raise RecordError(f"a record must be a JSON object, got {type(rec).__name__}")
    if rec.get("schema") != SCHEMA_VERSION:
        raise RecordError(f"schema is {rec.get('schema')!r}; this reader knows {SCHEMA_VERSION}")
    for name, types in _FIELDS.items():
        if name not in rec:
            raise RecordError(f"missing field '{name}'")
        value = rec[name]
        if value is None:
            if None not in types:
                raise RecordError(f"field '{name}' is null")
            continue
        ok_types = tuple(t for t in types if t is not None)
        if isinstance(value, bool) and bool not in ok_types:
            raise RecordError(f"field '{name}' is a bool; expected {ok_types}")
        if not isinstance(value, ok_types):
            raise RecordError(f"field '{name}' is {type(value).__name__}; expected {ok_types}")
    if rec["kind"] not in KINDS:
        raise RecordError(f"kind is {rec['kind']!r}; expected one of {KINDS}")
    if rec["status"] not in STATUSES:
        raise RecordError(f"status is {rec['status']!r}; expected one of {STATUSES}")
    if rec["mode"] is not None and rec["mode"] not in MODES:
        raise RecordError(f"mode is {rec['mode']!r}; expected one of {MODES}")
    if not _OP_NAME.fullmatch(rec["op"]):
        raise RecordError(f"op is {rec['op']!r}; expected an op name such as 'rms_norm'")
    if rec["dtype"] is not None and rec["dtype"] not in DTYPE_BYTES:
        raise RecordError(f"dtype is {rec['dtype']!r}; expected one of {tuple(DTYPE_BYTES)}")
    shape = rec["shape"]
    if shape is not None and (len(shape) != 2 or not all(isinstance(v, int) for v in shape)):
        raise RecordError(f"shape is {shape!r}; expected [M, N] integers")
    if rec["kind"] in _MEASURED and rec["status"] != "SKIP":
        for name in ("dtype", "shape", "mode", "bytes"):
            if rec[name] is None:
                raise RecordError(f"a {rec['kind']} record needs '{name}'")
    if rec["kind"] == "sweep" and rec["config"] is None:
        raise RecordError("a sweep record needs 'config' (the launch config it forced)")
    if rec["kind"] == "model" and rec["model"] is None:
        raise RecordError("a model record needs 'model' (the block, shape and mode it timed)")
    if rec["status"] == "PASS" and rec["kind"] in _MEASURED + ("copy", "model"):
        stats = rec["stats"]
        if stats is None:
            raise RecordError("a PASS measurement needs 'stats'")
        missing = [k for k in _STAT_KEYS if k not in stats]
        if missing:
            raise RecordError(f"stats lacks {missing}")
    if rec["status"] == "FAIL" and rec["kind"] in _MEASURED + ("model",) and not rec["correct"]:
        raise RecordError("a FAIL record needs 'correct' (the error it failed with)")


class RecordWriter:
    """Appends validated records to a .jsonl file, one flushed line each."""

    def __init__(self, path: str | os.PathLike, *, append: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        committed = self.path.with_name(self.path.name + ".xz")
        if append and not self.path.exists() and committed.exists():
            # a committed run is kept xz'd: an append to it starts from its records
            with lzma.open(committed, "rb") as src, open(self.path, "wb") as dst:
                shutil.copyfileobj(src, dst)
        self._f = open(self.path, "a" if append else "w", encoding="utf-8")
        self.count = 0

    def write(self, rec: dict) -> None:
        validate_record(rec)
        self._f.write(json.dumps(rec, allow_nan=False, separators=(",", ":")) + "\n")
        self._f.flush()
        self.count += 1

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def refuse_bad_run_args(p, args):
    """args, after the argparse errors a run's shared options get (harness.bench,
    harness.model): a --budget-s that is not a positive number, an --out that cannot take
    records."""
    if args.budget_s is not None and not args.budget_s > 0:  # also refuses nan
        p.error(f"--budget-s is {args.budget_s}; expected a positive number of seconds")
    if args.out is not None and (why := out_dir_problem(args.out)):
        p.error(f"--out {args.out} {why}")
    return args


def out_dir_problem(path: str | os.PathLike) -> Optional[str]:
    """None if path is, or can be made, a directory this process can write files in; else
    why not. It creates the directory, so a run can check its output place before any work
    and fail in a second rather than after minutes of measuring."""
    if str(path) == "":
        return "is empty; expected a directory"
    p = Path(path)
    if p.exists() and not p.is_dir():
        return "exists and is not a directory"
    try:
        p.mkdir(parents=True, exist_ok=True)
        # a real write: permission bits alone mislead (root, read-only mounts, /proc)
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        return f"is not a writable directory ({e.strerror or e})"
    return None


def iter_records(path: str | os.PathLike) -> Iterator[dict]:
    """Validated records in file order (a file named *.xz read through lzma: the committed
    sweeps and probes are kept compressed); RecordError names the line that is wrong."""
    opener = lzma.open if os.fspath(path).endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = upgrade(json.loads(line))
                validate_record(rec)
            except (json.JSONDecodeError, RecordError) as e:
                raise RecordError(f"{path}:{lineno}: {e}") from e
            yield rec


#: Fields added to schema 1 since its first lines were written, and what a line written
#: before them means: it measured rms_norm, the only op there was, forced no config, timed
#: no model and no ceiling.
_ADDED = {"op": DEFAULT_OP, "config": None, "model": None, "pct_ceiling": None}


def upgrade(rec: Any) -> Any:
    """A record as this reader knows it: the fields older lines lack, filled in (_ADDED)."""
    if isinstance(rec, dict):
        rec = {**{k: v for k, v in _ADDED.items() if k not in rec}, **rec}
    return rec


def read_records(path: str | os.PathLike) -> list[dict]:
    """All records of a file (see iter_records)."""
    return list(iter_records(path))


def latest(records: Iterable[dict]) -> list[dict]:
    """One record per measurement (kind, op, impl, dtype, shape, mode, config, and a model
    record's block, shape name and exec mode): the last one written.

    A rerun of some shapes appended to a file replaces the earlier lines for those shapes,
    a shape's "not run" SKIP (a spent budget's, its impl "all" or the one named) included
    once a later line measured it there (a run resumed by harness.bench --resume).
    """
    keep: dict[tuple, tuple[int, dict]] = {}
    measured: dict[tuple, int] = {}  # (op, dtype, shape, impl) -> its last measurement's line
    for i, rec in enumerate(records):
        shape = tuple(rec["shape"]) if rec["shape"] else None
        config = json.dumps(rec["config"], sort_keys=True)
        model = rec.get("model") or {}
        where = tuple(model.get(k) for k in ("block", "shape", "exec"))
        key = (rec["kind"], rec["op"], rec["impl"], rec["dtype"], shape, rec["mode"], config)
        keep[key + where] = (i, rec)
        if rec["kind"] in ("timing", "sweep") and shape:
            for impl in (rec["impl"], "all"):
                measured[(rec["op"], rec["dtype"], shape, impl)] = i

    def superseded(i: int, rec: dict) -> bool:
        if rec["kind"] != "skip" or not rec["shape"]:
            return False
        at = (rec["op"], rec["dtype"], tuple(rec["shape"]), rec["impl"])
        return measured.get(at, -1) > i

    return [rec for i, rec in keep.values() if not superseded(i, rec)]
