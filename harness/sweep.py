"""Time every candidate launch config of our kernels, per shape: the data for heuristics.

    python -m harness.sweep [--op rms_norm] [--kernels triton,cuda] [--dtypes bf16,fp16,fp32]
                            [--shapes 32768x4096,...] [--out sweep.jsonl] [--budget-s 420]
                            [--where triton:kernel=sharded --where triton:reload=True ...]

For each shape (default: the benchmark's large grid, harness.plan.grid: M = 2^27 / N) the
op's inputs come from its factory (harness.ops), each candidate is checked against the
reference as harness.bench checks an implementation (harness.measure.validate_impl: a
failure is a FAIL record, never timed), then the candidates are timed cold together (L2
flushed, three interleaved blocks, the same method and the same statistics as
harness.bench). Records go to --out through harness.records, in the bench's schema: the
copy record first, then one ``kind="sweep"`` record per candidate, its launch config and
whether it is the one the kernel picks today in ``config``, GB/s by the op's bytes model,
% of the copy ceiling. The table printed last gives, per shape, today's config and the
best one. CUDA only; the candidates are each backend's search_space (triton_impl.configs,
cuda_impl.configs), the default its default_config. --op fused_add_rms_norm sweeps the
fused add's candidates (the CUDA table; Triton's rule and sharded kernel).
--where KERNEL:FIELD=VALUE[,FIELD=VALUE] keeps, of that kernel's candidates, only
those whose config fields have those values (repeated: a candidate matching any one is
kept), and today's config beside them: a probe of a few candidates within a device call.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import torch

from harness import measure, timing
from harness.impls import QUANT_MODES, Impl, quant_kw, quant_split
from harness.ops import FORWARD_OPS, OPS, QUANT_OPS, RMS_NORM
from harness.plan import DTYPES, Planned, grid, names_arg, parse_shapes
from harness.records import DTYPE_BYTES

KERNELS = ("triton", "cuda")


#: The (op, kernel) pairs that have forced configs to sweep: both forward ops in both
#: backends, the quantised forms (harness.ops.QUANT_OPS) in Triton's
SWEEPABLE = {
    ("rms_norm", "triton"),
    ("rms_norm", "cuda"),
    ("fused_add_rms_norm", "triton"),
    ("fused_add_rms_norm", "cuda"),
    *((name, "triton") for name in QUANT_OPS),
}


def quant_form(op: str) -> Optional[tuple[str, str, bool]]:
    """A quantised form's (base op, mode, fused): fp8_fused_add_rms_norm_token ->
    ("fused_add_rms_norm", "token", True); None for another op."""
    if op not in QUANT_OPS:
        return None
    base, mode = op.removeprefix("fp8_").rsplit("_", 1)
    return base, mode, base == "fused_add_rms_norm"


def _backend(kernel: str):
    """The backend package a kernel name names (triton_impl, cuda_impl): both offer the
    same kernel-work API (rmsnorm_api.BACKEND_API)."""
    import importlib

    return importlib.import_module(f"{kernel}_impl")


def candidates(kernel: str, n: int, elem: int, op: str = RMS_NORM.name) -> list:
    """The backend's own search space (triton_impl.configs, cuda_impl.configs); a quantised
    form's: its base op's configs of the kernels that quantise (fused and looped), in tiles
    of whole groups."""
    form = quant_form(op)
    if form is None:
        return _backend(kernel).search_space(n, elem, op=op)
    group = QUANT_MODES[form[1]].get("group_size", 1)
    space = _backend(kernel).search_space(n, elem, op=form[0])
    return [c for c in space if c.kernel in ("fused", "looped") and c.block_n % group == 0]


def parse_where(specs: list[str]) -> dict[str, list[dict[str, str]]]:
    """--where specs -> kernel -> the alternatives, each {field: value} (ValueError: bad)."""
    out: dict[str, list[dict[str, str]]] = {}
    for spec in specs:
        kernel, sep, terms = spec.partition(":")
        if not sep or kernel not in KERNELS:
            raise ValueError(f"{spec!r}: expected KERNEL:FIELD=VALUE, KERNEL one of {KERNELS}")
        alt = {}
        for term in terms.split(","):
            field, eq, value = term.partition("=")
            if not eq or not field:
                raise ValueError(f"{spec!r}: expected FIELD=VALUE, got {term!r}")
            alt[field] = value
        bad = sorted(set(alt) - config_fields(kernel))
        if bad:
            raise ValueError(f"{spec!r}: {kernel} configs have no field {', '.join(bad)}")
        out.setdefault(kernel, []).append(alt)
    return out


def matches(cfg, alternatives: list[dict[str, str]]) -> bool:
    """Whether cfg's fields have the values of any one alternative."""
    return any(all(str(getattr(cfg, f)) == v for f, v in alt.items()) for alt in alternatives)


def runner(kernel: str, cfg, op: str = RMS_NORM.name) -> Callable:
    """The op's inputs -> its outputs with the config forced (the backend's
    <op>_with_config; a quantised form's, its quant module's, with the form's keywords)."""
    form = quant_form(op)
    if form is None:
        forced = getattr(_backend(kernel), f"{op}_with_config")
        return lambda *inputs: forced(*inputs, cfg)
    import importlib

    base, mode, fused = form
    forced = getattr(importlib.import_module(f"{kernel}_impl.quant"), f"{base}_quant_with_config")

    def quantised(*inputs):
        head, scale = quant_split(inputs, fused)
        return forced(*head, cfg, **quant_kw(mode, scale))

    return quantised


def config_fields(kernel: str) -> set[str]:
    """The field names of kernel's Config (what --where may name)."""
    return {f.name for f in dataclasses.fields(_backend(kernel).Config)}


def default_config(kernel: str, n: int, dtype: str, op: str = RMS_NORM.name):
    """The config the kernel picks today for many rows of a dtype (its name, "bf16", ...):
    the backend's default rule (a quantised form's: its base op's, as the quantised launch
    takes it, triton_impl.configs.quant_config)."""
    form = quant_form(op)
    base = op if form is None else form[0]
    cfg = _backend(kernel).default_config(n, DTYPE_BYTES[dtype], base, dtype=dtype)
    if form is None:
        return cfg
    from triton_impl.configs import quant_config

    return quant_config(cfg, n, DTYPE_BYTES[dtype], dynamic=form[1] != "static")


def sweep_shape(
    b: measure.Bench, kernel: str, p: Planned, where: Optional[list[dict[str, str]]] = None
) -> list[dict]:
    """Check and time every candidate config of kernel at one shape (those matching one of
    where's alternatives, and today's config, when where is given); write a record each
    (FAIL for a config that fails the check, PASS with its timing) and return them."""
    op = b.op
    inputs = op.make_inputs(p, b.device, b.seed + p.m * 100003 + p.n)
    base = measure.shape_fields(b, p, inputs)
    ref = op.reference(*inputs)
    elem = DTYPE_BYTES[p.dtype]
    default = default_config(kernel, p.n, p.dtype, op.name)
    # candidate index -> (the fields its record shares, whatever its status; its call)
    ready: dict[str, tuple[dict, Callable]] = {}
    written = []
    for i, cfg in enumerate(candidates(kernel, p.n, elem, op.name)):
        if where and cfg != default and not matches(cfg, where):
            continue
        impl = Impl(kernel, runner(kernel, cfg, op.name))
        fn, compile_s, correct = measure.validate_impl(impl, inputs, ref, op)
        fields = dict(
            kind="sweep",
            mode="cold",
            config={"params": cfg.as_dict(), "default": cfg == default},
            correct=correct,
            compile_s=compile_s,
            **base,
        )
        if fn is None:  # a config that fails is reported, never timed
            written.append(b.write(kernel, status="FAIL", **fields))
        else:
            ready[str(i)] = (fields, lambda fn=fn: fn(*inputs))
    if not ready:
        return written
    calls = {k: call for k, (_, call) in ready.items()}
    timing.warm_up(list(calls.values()))
    blocks, clk = measure.time_blocks(b, calls)
    for k, (fields, _) in ready.items():
        timed = measure.cold_fields(b, blocks[k], fields)
        notes = ["L2 flushed before each repetition"]
        written.append(b.write(kernel, status="PASS", clocks=clk, notes=notes, **timed, **fields))
    return written


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--op",
        default=RMS_NORM.name,
        choices=sorted(FORWARD_OPS) + sorted(QUANT_OPS),
        help="the op whose configs are swept (default rms_norm; the fp8 forms: Triton's)",
    )
    p.add_argument(
        "--kernels", default="triton,cuda", help="comma-separated from triton,cuda (default: both)"
    )
    p.add_argument(
        "--dtypes",
        default="bf16,fp16,fp32",
        help="comma-separated from bf16,fp16,fp32 (default: all three)",
    )
    p.add_argument("--shapes", default=None, help="MxN,... (default: the large grid)")
    p.add_argument(
        "--out", default="sweep.jsonl", help="JSON-lines file to write (default: sweep.jsonl)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="skip the shapes not started after this many seconds (default 420)",
    )
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KERNEL:FIELD=VALUE[,FIELD=VALUE]",
        help="of KERNEL's candidates only those with these config values, and today's "
        "(repeatable: any one matching; e.g. triton:reload=True)",
    )
    return p


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    kernels = names_arg(p, "--kernels", args.kernels, KERNELS)
    dtypes = names_arg(p, "--dtypes", args.dtypes, tuple(DTYPES))
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else grid()
    except ValueError as e:
        p.error(f"--shapes: {e}")
    try:
        where = parse_where(args.where)
    except ValueError as e:
        p.error(f"--where: {e}")
    multiple = OPS[args.op].n_multiple  # a group's form: whole groups only
    ragged = [f"{m}x{n}" for m, n in shapes if n % multiple]
    if ragged and args.shapes:
        p.error(f"--shapes: {','.join(ragged)} has N not a multiple of {multiple} ({args.op})")
    if ragged:
        print(
            f"{args.op}: grid shapes {','.join(ragged)} left out (N not a multiple of {multiple})"
        )
        shapes = [(m, n) for m, n in shapes if not n % multiple]
    section = "custom" if args.shapes else "grid"
    if not torch.cuda.is_available():
        print("harness.sweep needs a CUDA GPU")
        return 1

    skipped = [k for k in kernels if (args.op, k) not in SWEEPABLE]
    for k in skipped:
        print(f"skip {k}: no forced configs of {args.op} to sweep")
    kernels = [k for k in kernels if k not in skipped]
    b = measure.start(Path(args.out), append=False, seed=0, op=OPS[args.op])
    print(f"writing {args.out}")
    start, recs = time.perf_counter(), []
    for dtype in dtypes:
        for m, n in shapes:
            planned = Planned(dtype, m, n, [section])
            for kernel in kernels:
                if time.perf_counter() - start > args.budget_s:
                    print(f"budget spent: skipping {kernel} {dtype} {m}x{n}")
                    measure.write_skipped(b, kernel, planned)
                    continue
                recs += sweep_shape(b, kernel, planned, where.get(kernel))
                torch.cuda.empty_cache()
    b.writer.close()
    summarize(recs)
    return 0


def summarize(recs: list[dict]) -> None:
    """Per kernel, dtype and shape: today's config and the best one, in % of copy."""
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        if r["kind"] == "sweep" and r["status"] == "PASS":
            groups.setdefault((r["impl"], r["dtype"], tuple(r["shape"])), []).append(r)
    print(f"{'kernel':<7} {'dtype':<5} {'shape':>14}  {'today %':>8}  {'best %':>7}  best config")
    for (kernel, dtype, shape), timed in groups.items():
        best = max(timed, key=lambda r: r["gbps"] or 0.0)
        today = next((r for r in timed if r["config"]["default"]), None)
        t = _pct(today["pct_copy"]) if today else "-"
        print(
            f"{kernel:<7} {dtype:<5} {shape[0]:>7}x{shape[1]:<6}  {t:>8}  "
            f"{_pct(best['pct_copy']):>7}  {best['config']['params']}"
        )


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    sys.exit(main())
