"""Decode-sized calls of the Triton forward under CUDA-graph replay: today's config against
the fused kernel with one row a program at each warp count, and against a copy of it that
issues the weight's load beside x's (here only: the shipped kernel reads the weight after
the reduction), to tell what the latency rule (triton_impl.configs.latency_config) should
pick. --cuda RTxVPT/...: the CUDA forward's default against those configs of its kernel
(cuda_impl.rms_norm_with_config, no cluster, plain loads) instead.

    python3 scripts/decode_probe.py [--shapes 1x4096,8x8192] [--dtype bf16] [--cuda 512x4]

Device time per call as the benchmark's small-shape table measures it (harness.timing.
graph_samples: 20 back-to-back calls a replay, L2 warm), the median of its replays; each
candidate's output checked against the reference first.
"""

import argparse
import sys

import torch
import triton
import triton.language as tl

from harness.plan import DTYPES, parse_shapes
from harness.reference import TOL, rms_norm_ref
from harness.timing import graph_samples, quantile

DECODE = "1x4096,8x4096,32x4096,128x4096,1x8192,8x8192,32x8192,128x8192"


@triton.jit
def _weight_first(x_ptr, w_ptr, y_ptr, stride_x, stride_y, N, eps, BLOCK_N: tl.constexpr):
    # the fused kernel with one row a program, its weight load issued before the reduction
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + tl.cast(eps, tl.float32))
    tl.store(y_ptr + row * stride_y + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=ok)


def weight_first(x, w, warps):
    y = torch.empty_like(x)
    n = x.shape[1]
    _weight_first[(x.shape[0],)](x, w, y, x.stride(0), y.stride(0), n, 1e-6,
                                 BLOCK_N=triton.next_power_of_2(n), num_warps=warps)  # fmt: skip
    return y


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default=DECODE)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--cuda", default="", help="RTxVPT/...: CUDA configs beside its default")
    args = p.parse_args()
    if args.cuda:
        return cuda_main(args)
    import triton_impl
    from triton_impl import Config, rms_norm_with_config

    dtype = DTYPES[args.dtype]
    warps = (2, 4, 8, 16, 32)
    early = (4, 8, 16)
    head = [f"{w:>3}w x1" for w in warps] + [f"{w:>2}w wfst" for w in early]
    print(f"{'shape':>10} {'today':>14} " + " ".join(head) + "  (us)")
    for m, n in parse_shapes(args.shapes):
        x = torch.randn(m, n, device="cuda").to(dtype)
        w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype)
        want = rms_norm_ref(x, w, 1e-6)
        info = triton_impl.kernel_info(x, w)["config"]
        fns = {"today": lambda x=x, w=w: triton_impl.rms_norm(x, w, 1e-6)}
        for nw in warps:
            cfg = Config("fused", 1 << (n - 1).bit_length(), nw)
            fns[nw] = lambda x=x, w=w, cfg=cfg: rms_norm_with_config(x, w, 1e-6, cfg)
        for nw in early:
            fns[f"w{nw}"] = lambda x=x, w=w, nw=nw: weight_first(x, w, nw)
        cells = []
        for fn in fns.values():
            torch.testing.assert_close(fn(), want, **TOL[dtype])
            cells.append(quantile([s * 1e6 for s in graph_samples(fn)], 0.5))
        today = f"{cells[0]:.2f} ({info['num_warps']}w x{info['block_m']})"
        print(f"{m}x{n:>8} {today:>14} " + " ".join(f"{c:7.2f}" for c in cells[1:]), flush=True)
    return 0


def cuda_main(args) -> int:
    import cuda_impl
    from cuda_impl import Config

    dtype = DTYPES[args.dtype]
    cfgs = [Config(*map(int, c.split("x")), 1, 1) for c in args.cuda.split("/")]
    head = [f"{c.row_threads}x{c.vpt}" for c in cfgs]
    print(f"{'shape':>10} {'today':>16} " + " ".join(f"{h:>8}" for h in head) + "  (us)")
    for m, n in parse_shapes(args.shapes):
        x = torch.randn(m, n, device="cuda").to(dtype)
        w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype)
        want = rms_norm_ref(x, w, 1e-6)
        info = cuda_impl.kernel_info(x, w)["config"]
        fns = [lambda x=x, w=w: cuda_impl.rms_norm(x, w, 1e-6)]
        for c in cfgs:  # a config that cannot hold the row: a blank cell
            ok = c.holds(n, x.element_size())
            fns.append(ok and (lambda x=x, w=w, c=c: cuda_impl.rms_norm_with_config(x, w, 1e-6, c)))
        cells = []
        for fn in fns:
            if not fn:
                cells.append(float("nan"))
                continue
            torch.testing.assert_close(fn(), want, **TOL[dtype])
            cells.append(quantile([s * 1e6 for s in graph_samples(fn)], 0.5))
        today = f"{cells[0]:.2f} ({info['row_threads']}x{info['vpt']})"
        print(f"{m}x{n:>8} {today:>16} " + " ".join(f"{c:8.2f}" for c in cells[1:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
