"""Time every candidate launch config of our kernels, per shape: the data for heuristics.

    python -m harness.sweep [--kernels triton,cuda] [--dtypes bf16,fp16,fp32]
                            [--shapes 32768x4096,...] [--out sweep.jsonl] [--budget-s 420]

For each shape (default: the benchmark's large grid, M = 2^27 / N) the candidates are
checked against the reference, then timed cold (L2 flushed, three interleaved blocks, the
same method as harness.bench), and one JSON line per candidate is written with its config,
median/p20/p80 microseconds, GB/s and % of the copy ceiling, and whether it is the config
the kernel picks today. The table printed last gives, per shape, today's config and the
best one. CUDA only; the candidates are each backend's search_space (triton_impl.configs,
cuda_impl.configs), the default its default_config.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Optional

import torch

from harness import hardware, timing
from harness.bench import DTYPES, GRID_ELEMENTS, LARGE_NS, parse_shapes
from harness.records import DTYPE_BYTES, bytes_moved
from harness.reference import TOL, rms_norm_ref

EPS = 1e-6


def candidates(kernel: str, n: int, elem: int) -> list:
    """The backend's own search space (triton_impl.configs, cuda_impl.configs)."""
    if kernel == "triton":
        from triton_impl import search_space
    else:
        from cuda_impl import search_space
    return search_space(n, elem)


def runner(kernel: str, cfg) -> Callable:
    """(x, w) -> y with the config forced."""
    if kernel == "triton":
        from triton_impl import rms_norm_with_config
    else:
        from cuda_impl import rms_norm_with_config
    return lambda x, w: rms_norm_with_config(x, w, EPS, cfg)


def default_config(kernel: str, n: int, elem: int):
    """The config the kernel picks today for many rows (the backend's default rule)."""
    if kernel == "triton":
        from triton_impl import default_config as rule
    else:
        from cuda_impl import default_config as rule
    return rule(n, elem)


def sweep_shape(kernel: str, dtype: str, m: int, n: int, flush, copy_gbps: float) -> list[dict]:
    """Check and time every candidate at one shape; one result dict per candidate."""
    tdtype, elem = DTYPES[dtype], DTYPE_BYTES[dtype]
    g = torch.Generator(device="cuda").manual_seed(m * 100003 + n)
    x = torch.randn(m, n, device="cuda", generator=g).to(tdtype)
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=g)).to(tdtype)
    ref = rms_norm_ref(x, w, EPS)
    cands = candidates(kernel, n, elem)
    default = default_config(kernel, n, elem)
    results, fns = [], {}
    for i, cfg in enumerate(cands):
        res = dict(
            kernel=kernel, dtype=dtype, shape=[m, n], cfg=cfg.as_dict(), default=cfg == default
        )
        fn = runner(kernel, cfg)
        try:
            torch.testing.assert_close(fn(x, w), ref, **TOL[tdtype])
            fns[str(i)] = lambda fn=fn: fn(x, w)
        except Exception as e:  # a config that fails is reported, never timed
            res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        results.append(res)
    if not fns:
        return results
    timing.warm_up(list(fns.values()))
    reps = {k: timing.reps_for(timing.estimate_s(f, flush)) for k, f in fns.items()}
    blocks = timing.interleaved(fns, reps, flush)
    nbytes = bytes_moved(m, n, elem, elem)
    for k, per_block in blocks.items():
        _, stats, spread = timing.block_summary(per_block)
        gb = nbytes / (stats["median_us"] * 1e-6) / 1e9
        results[int(k)].update(
            median_us=stats["median_us"],
            p20_us=stats["p20_us"],
            p80_us=stats["p80_us"],
            spread=spread,
            gbps=gb,
            pct_copy=100 * gb / copy_gbps,
        )
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    return p


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    kernels = args.kernels.split(",")
    dtypes = args.dtypes.split(",")
    if bad := [k for k in kernels if k not in ("triton", "cuda")]:
        p.error(f"--kernels: unknown {bad}; choose from triton, cuda")
    if bad := [d for d in dtypes if d not in DTYPES]:
        p.error(f"--dtypes: unknown {bad}; choose from {sorted(DTYPES)}")
    grid = [(GRID_ELEMENTS // n, n) for n in LARGE_NS]
    shapes = parse_shapes(args.shapes) if args.shapes else grid
    if not torch.cuda.is_available():
        print("harness.sweep needs a CUDA GPU")
        return 1

    env = hardware.environment()
    copy = hardware.copy_ceiling()["gbps"]
    flush = timing.L2Flush(torch.cuda.get_device_properties(0).L2_cache_size)
    print(f"{env.get('gpu')}: copy ceiling {copy:.0f} GB/s; writing {args.out}")
    start, rows = time.perf_counter(), []
    with open(args.out, "w") as f:
        for dtype in dtypes:
            for m, n in shapes:
                for kernel in kernels:
                    if time.perf_counter() - start > args.budget_s:
                        print(f"budget spent: skipping {kernel} {dtype} {m}x{n}")
                        continue
                    for r in sweep_shape(kernel, dtype, m, n, flush, copy):
                        r["env"] = {k: env.get(k) for k in ("gpu", "torch", "triton", "git_sha")}
                        f.write(json.dumps(r) + "\n")
                        f.flush()
                        rows.append(r)
    summarize(rows)
    return 0


def summarize(rows: list[dict]) -> None:
    """Per kernel, dtype and shape: today's config and the best one, in % of copy."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["dtype"], tuple(r["shape"])), []).append(r)
    print(f"{'kernel':<7} {'dtype':<5} {'shape':>14}  {'today %':>8}  {'best %':>7}  best config")
    for (kernel, dtype, shape), rs in groups.items():
        timed = [r for r in rs if "median_us" in r]
        if not timed:
            continue
        best = max(timed, key=lambda r: r["gbps"])
        today = next((r for r in timed if r["default"]), None)
        t = f"{today['pct_copy']:.1f}" if today else "-"
        print(
            f"{kernel:<7} {dtype:<5} {shape[0]:>7}x{shape[1]:<6}  {t:>8}  "
            f"{best['pct_copy']:>7.1f}  {best['cfg']}"
        )


if __name__ == "__main__":
    sys.exit(main())
