"""Time every candidate launch config of our kernels, per shape: the data for heuristics.

    python -m harness.sweep [--kernels triton,cuda] [--dtypes bf16,fp16,fp32]
                            [--shapes 32768x4096,...] [--out sweep.jsonl] [--budget-s 420]

For each shape (default: the benchmark's large grid, M = 2^27 / N) the candidates are
checked against the reference, then timed cold (L2 flushed, three interleaved blocks, the
same method as harness.bench), and one JSON line per candidate is written with its config,
median/p20/p80 microseconds, GB/s and % of the copy ceiling, and whether it is the config
the kernel picks today. The table printed last gives, per shape, today's config and the
best one. CUDA only; the configs come from triton_impl.launch_config's space and
cuda_impl.ops.configs().
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
#: Triton candidates: per-thread bytes of the tile kept in this range (16-byte loads, no
#: spills; below it only with one warp, for tiny rows), warps and rows per program from
#: these sets.
TRITON_WARPS = (1, 2, 4, 8, 16, 32)
TRITON_ROWS = (1, 2, 4, 8, 16, 32, 64)
TRITON_THREAD_BYTES = (16, 256)
TRITON_CHUNKS = (4096, 8192, 16384, 32768)
TRITON_CHUNK_WARPS = (8, 16, 32)
TRITON_PROGRAMS_PER_SM = (1, 2, 0)  # 0: one program a row
TRITON_PERSISTENT_PER_SM = (1, 2, 4)
TRITON_STAGES = (2, 3)
TRITON_CHUNK_STAGES = (1, 2, 3)  # 1: one chunk at a time (no "stages" key in the config)
#: Short chunks, as torch.compile's looped reductions cut a row (512 threads, 4-8 elements
#: a thread, one row a program): from rows of two such chunks up, one program a row.
TRITON_SHORT_CHUNKS = (1024, 2048)
TRITON_SHORT_CHUNK_WARPS = (4, 8, 16)
TRITON_STAGED_BYTES = 160 * 1024  # rows in flight in shared memory, at most


def triton_candidates(n: int, elem: int) -> list[dict]:
    """Fused tiles whose bytes per thread fit TRITON_THREAD_BYTES, the split kernel (its
    tile sized to the aligned body) for rows that are not whole 16-byte vectors, the
    persistent kernel (whole rows, the next ones' loads pipelined through shared memory)
    where a row fits shared memory, and the chunked kernel for rows of two or more chunks
    from 8192 elements up (its chunk loads pipelined 1-3 deep), and with short chunks for
    rows of two or more of them."""
    import triton

    from triton_impl.rms_norm_op import FUSED_MAX_N

    out = []
    lo, hi = TRITON_THREAD_BYTES
    block_n = triton.next_power_of_2(n)
    vec = 16 // elem
    body = triton.next_power_of_2(max(vec, n // vec * vec))
    if block_n <= FUSED_MAX_N[elem]:
        for rows in TRITON_ROWS:
            for warps in TRITON_WARPS:
                per_thread = rows * block_n * elem // (32 * warps)
                fits = per_thread <= hi and rows * block_n * elem <= 128 * 1024
                if fits and (per_thread >= lo or warps == 1):  # tiny rows: one warp
                    out.append(dict(kernel="fused", BLOCK_M=rows, BLOCK_N=block_n, num_warps=warps))
        if n >= vec and n % 16:  # as launch_config: n not a multiple of 16 elements
            for warps in TRITON_WARPS:
                if body * elem // (32 * warps) >= lo or warps == 1:
                    out.append(dict(kernel="split", BLOCK_M=1, BLOCK_N=body, num_warps=warps))
    if 1024 <= n and block_n * elem <= TRITON_STAGED_BYTES:
        for warps in TRITON_WARPS:
            per_thread = block_n * elem // (32 * warps)
            for per_sm in TRITON_PERSISTENT_PER_SM:
                for stages in TRITON_STAGES:
                    staged = (stages - 1) * block_n * elem * per_sm
                    if 32 <= per_thread <= hi and staged <= TRITON_STAGED_BYTES:
                        out.append(
                            dict(kernel="persistent", BLOCK_M=1, BLOCK_N=block_n,
                                 num_warps=warps, programs_per_sm=per_sm, stages=stages)
                        )  # fmt: skip
    if n >= 8192:  # the chunked kernel also where the fused tile would be padded (12288)
        for chunk in TRITON_CHUNKS:
            for warps in TRITON_CHUNK_WARPS:
                for per_sm in TRITON_PROGRAMS_PER_SM:
                    if not (chunk < n and lo <= chunk * elem // (32 * warps) <= hi):
                        continue
                    base = dict(kernel="chunked", BLOCK_M=1, BLOCK_N=chunk, num_warps=warps,
                                programs_per_sm=per_sm)  # fmt: skip
                    for stages in TRITON_CHUNK_STAGES:
                        # shared memory: stages - 1 chunks in flight in each of two sweeps;
                        # pipelined only with one program an SM or one a row (sweep time)
                        staged = 2 * (stages - 1) * chunk * elem
                        if stages == 1 or (per_sm < 2 and staged <= TRITON_STAGED_BYTES):
                            out.append(dict(base, stages=stages) if stages > 1 else base)
    for chunk in TRITON_SHORT_CHUNKS:
        for warps in TRITON_SHORT_CHUNK_WARPS:
            if 2 * chunk <= n and 4 <= chunk * elem // (32 * warps):
                out.append(dict(kernel="chunked", BLOCK_M=1, BLOCK_N=chunk, num_warps=warps,
                                programs_per_sm=0))  # fmt: skip
    return out


def cuda_candidates(n: int, elem: int) -> list[dict]:
    """Compiled configs that hold the row with at most 4x spare capacity (clusters: the
    fewest CTAs that hold it, and twice that), the sweep-only kernel variants included."""
    import cuda_impl.ops as ops

    vecs = max(1, n * elem // 16)
    out = []
    for c in ops.configs():
        per_cta = c["row_threads"] * c["vpt"]
        base = {k: c[k] for k in ("row_threads", "vpt", "variant")}
        if c["cluster"]:
            ranks = 2
            while ranks * per_cta < vecs and ranks < 8:
                ranks *= 2
            for r in sorted({ranks, min(8, 2 * ranks)}):
                if r * per_cta >= vecs:
                    out.append(dict(base, cluster=r))
        elif vecs <= per_cta <= 4 * max(vecs, 8):
            out.append(dict(base, cluster=1))
    return out


def runner(kernel: str, cfg: dict) -> Callable:
    """(x, w) -> y with the config forced."""
    if kernel == "triton":
        from triton_impl.rms_norm_op import rms_norm_with_config

        return lambda x, w: rms_norm_with_config(x, w, EPS, cfg)
    import cuda_impl.ops as ops

    return lambda x, w: ops.rms_norm_with_config(x, w, EPS, **cfg)


def default_config(kernel: str, n: int, elem: int) -> Optional[dict]:
    """The config the kernel picks today, in the candidates' form (None if not one of them)."""
    if kernel == "triton":
        from triton_impl import launch_config

        return launch_config(n, elem)
    import cuda_impl.ops as ops

    return ops.default_config(n, elem)


def sweep_shape(kernel: str, dtype: str, m: int, n: int, flush, copy_gbps: float) -> list[dict]:
    """Check and time every candidate at one shape; one result dict per candidate."""
    tdtype, elem = DTYPES[dtype], DTYPE_BYTES[dtype]
    g = torch.Generator(device="cuda").manual_seed(m * 100003 + n)
    x = torch.randn(m, n, device="cuda", generator=g).to(tdtype)
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=g)).to(tdtype)
    ref = rms_norm_ref(x, w, EPS)
    cands = triton_candidates(n, elem) if kernel == "triton" else cuda_candidates(n, elem)
    default = default_config(kernel, n, elem)
    results, fns = [], {}
    for i, cfg in enumerate(cands):
        res = dict(kernel=kernel, dtype=dtype, shape=[m, n], cfg=cfg, default=cfg == default)
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
