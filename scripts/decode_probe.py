"""Decode-sized calls under CUDA-graph replay: the Triton forward's default against the
fused kernel with one row a program at each warp count, its weight loaded after the
reduction (the throughput tiles' order) or beside x (``weight_first``), to tell what the
latency rule (triton_impl.configs.latency_config) should pick. --cuda RTxVPT/...: the CUDA
forward's default against those configs of its kernel (cuda_impl.rms_norm_with_config, no
cluster; plain loads, or RTxVPTxVARIANT: those variant bits) instead. --fused-add: the
Triton fused add's default (its latency rule's choice) against its fused kernel with one
row a program at each warp count. --impls a,b,...: the named implementations
(harness.impls, peers included) instead, device and host time, e.g. to compare two builds
of the CUDA extension, run once each (CUDA_IMPL_LIBRARY=...) beside the same peer.
--host-parts: host time of each piece of the two eager fast paths (the bypass check, the
output's allocation, the CUDA op's redispatch, both entry points of the extension, Triton's
direct launch from Python) beside the whole calls and native F.rms_norm, all interleaved.

    python3 scripts/decode_probe.py [--shapes 1x4096,8x8192] [--dtype bf16] [--cuda 512x4]
    python3 scripts/decode_probe.py --fused-add
    python3 scripts/decode_probe.py --impls cuda,triton,liger,native [--tag new]
    python3 scripts/decode_probe.py --host-parts

Device time per call as the benchmark's small-shape table measures it (harness.timing.
graph_interleaved: 20 back-to-back calls a replay, L2 warm, the candidates' replays
interleaved), the median of its replays; host time as harness.timing.host_interleaved;
each candidate's output checked against the reference first.
"""

import argparse
import functools
import sys

import torch

from harness.plan import DTYPES, parse_shapes
from harness.reference import TOL, rms_norm_ref
from harness.timing import graph_interleaved, host_interleaved, quantile

DECODE = "1x4096,8x4096,32x4096,128x4096,1x8192,8x8192,32x8192,128x8192"


def shape_inputs(m: int, n: int, dtype: torch.dtype) -> tuple:
    """x, the weight and the reference output for one decode shape."""
    x = torch.randn(m, n, device="cuda").to(dtype)
    w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype)
    return x, w, rms_norm_ref(x, w, 1e-6)


def median_us(fns: list, want: torch.Tensor, dtype: torch.dtype) -> list[float]:
    """Each call's median device time under graph replay (the calls interleaved), checked
    against want first; a None (a candidate that cannot run the shape) gives NaN."""
    ready = {}
    for i, fn in enumerate(fns):
        if fn is not None:
            torch.testing.assert_close(fn(), want, **TOL[dtype])
            ready[i] = fn
    got = graph_interleaved(ready)
    return [median_of(got[i]) if i in ready else float("nan") for i in range(len(fns))]


def median_of(timed: tuple) -> float:
    """The median in us of an interleaved timing's (samples, error); its error raised."""
    samples, err = timed
    if samples is None:
        raise RuntimeError(err)
    return quantile([s * 1e6 for s in samples], 0.5)


def impls_main(args) -> int:
    """The named implementations' graph device time and host time, interleaved."""
    from harness.impls import registry, runnable

    dtype = DTYPES[args.dtype]
    impls = registry(baselines=True)
    names = args.impls.split(",")
    unknown = [n for n in names if n not in impls]
    if unknown:
        sys.exit(f"decode_probe: --impls names unknown implementations {unknown}")
    for name in names:
        why = runnable(impls[name], "cuda")
        if why:
            sys.exit(f"decode_probe: {name} cannot run: {why}")
    cols = " ".join(f"{n:>8}" for n in names)
    print(f"{args.tag} {'shape':>10} graph (us) {cols} | host (us) {cols}")
    for m, n in parse_shapes(args.shapes):
        x, w, want = shape_inputs(m, n, dtype)
        fns = {}
        for name in names:
            fns[name] = lambda fn=impls[name].fn, x=x, w=w: fn(x, w, 1e-6)  # noqa: E731
            torch.testing.assert_close(fns[name](), want, **TOL[dtype])
        cells = []
        for timed in (graph_interleaved(fns), host_interleaved(fns)):
            cells.append(" ".join(f"{median_of(timed[k]):8.2f}" for k in names))
        print(f"{args.tag} {m}x{n:>8} graph (us) {cells[0]} | host (us) {cells[1]}", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default=DECODE)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--cuda", default="", help="RTxVPT[xVARIANT]/...: CUDA configs beside today")
    p.add_argument("--fused-add", action="store_true", help="the Triton fused add's warps")
    p.add_argument("--impls", default="", help="a,b,...: these implementations instead")
    p.add_argument("--tag", default="", help="a label for each line (--impls)")
    p.add_argument("--host-parts", action="store_true", help="host time of the fast paths' parts")
    args = p.parse_args()
    if args.host_parts:
        return host_parts_main(args)
    if args.impls:
        return impls_main(args)
    if args.cuda:
        return cuda_main(args)
    if args.fused_add:
        return fused_add_main(args)
    import triton_impl
    from triton_impl import Config, rms_norm_with_config

    dtype = DTYPES[args.dtype]
    cands = [(w, False) for w in (2, 4, 8, 16, 32)] + [(w, True) for w in (4, 8, 16)]
    head = [f"{w:>3}w {'wfst' if first else 'late'}" for w, first in cands]
    print(f"{'shape':>10} {'today':>22} " + " ".join(head) + "  (us)")
    for m, n in parse_shapes(args.shapes):
        x, w, want = shape_inputs(m, n, dtype)
        info = triton_impl.kernel_info(x, w)["config"]
        fns = [lambda x=x, w=w: triton_impl.rms_norm(x, w, 1e-6)]
        for nw, first in cands:
            cfg = Config("fused", 1 << (n - 1).bit_length(), nw, weight_first=first)
            fns.append(lambda x=x, w=w, cfg=cfg: rms_norm_with_config(x, w, 1e-6, cfg))
        cells = median_us(fns, want, dtype)
        first = "wfst" if info.get("weight_first") else "late"
        today = f"{cells[0]:.2f} ({info['kernel']} {info['num_warps']}w {first})"
        print(f"{m}x{n:>8} {today:>22} " + " ".join(f"{c:9.2f}" for c in cells[1:]), flush=True)
    return 0


def fused_add_main(args) -> int:
    """The Triton fused add's default against its fused kernel, one row a program, at each
    warp count; outputs checked against the reference first."""
    import triton_impl
    from harness.reference import fused_add_rms_norm_ref
    from triton_impl import Config
    from triton_impl.launch import sm_count

    dtype = DTYPES[args.dtype]
    warps = (2, 4, 8, 16, 32)
    print(f"{'shape':>10} {'today':>22} " + " ".join(f"{w:>8}w" for w in warps) + "  (us)")
    for m, n in parse_shapes(args.shapes):
        x, w, _ = shape_inputs(m, n, dtype)
        r = torch.randn_like(x)
        want = fused_add_rms_norm_ref(x, r, w, 1e-6)
        fns = {"today": functools.partial(triton_impl.fused_add_rms_norm, x, r, w, 1e-6)}
        for nw in warps:
            cfg = Config("fused", 1 << (n - 1).bit_length(), nw)
            forced = triton_impl.fused_add_rms_norm_with_config
            fns[nw] = functools.partial(forced, x, r, w, 1e-6, cfg)
        for fn in fns.values():
            y, ro = fn()
            torch.testing.assert_close(y, want[0], **TOL[dtype])
            torch.testing.assert_close(ro, want[1], **TOL[dtype])
        got = graph_interleaved(fns)
        cfg = triton_impl.configs.fused_add_default_config(
            n, x.element_size(), True, args.dtype, rows=m, sms=sm_count(x.device.index)
        )
        today = f"{median_of(got['today']):.2f} ({cfg.kernel} {cfg.num_warps}w)"
        cells = " ".join(f"{median_of(got[nw]):9.2f}" for nw in warps)
        print(f"{m}x{n:>8} {today:>22} {cells}", flush=True)
    return 0


def host_parts_main(args) -> int:
    """Host time (us a call, median of interleaved repeats) of the eager calls and of each
    part of their fast paths, to tell where a call's host time goes."""
    import torch.nn.functional as F

    import cuda_impl
    import triton_impl
    from cuda_impl.ops import _CUDA_KEYS, _FAST, _OP
    from rmsnorm_api import bypass_ok
    from triton_impl import eager

    dtype = DTYPES[args.dtype]
    names = None
    for m, n in parse_shapes(args.shapes):
        x, w, _ = shape_inputs(m, n, dtype)
        y = triton_impl.rms_norm(x, w, 1e-6)  # plans and compiles: the cache's entry exists
        key = (eager._tensor_key(x), eager._tensor_key(w), None)
        p = eager.PLANS[key]
        direct = p.compiled[(True, True, True)]
        tensors, rest = (x, w, y), (*p.ints, 1e-6, *p.consts)
        ptrs = [t.data_ptr() for t in tensors]
        fns = {
            "native": lambda x=x, w=w, n=n: F.rms_norm(x, (n,), w, 1e-6),
            "cuda": lambda x=x, w=w: cuda_impl.rms_norm(x, w, 1e-6),
            "triton": lambda x=x, w=w: triton_impl.rms_norm(x, w, 1e-6),
            "bypass_ok": lambda x=x, w=w: bypass_ok(x, w),
            "empty": lambda x=x: torch.empty(x.shape, dtype=x.dtype, device=x.device),
            "empty_like": lambda x=x: torch.empty_like(x),
            "redispatch": lambda x=x, w=w: _OP.redispatch(_CUDA_KEYS, x, w, 1e-6),
            "cuda_op": lambda x=x, w=w: _OP(x, w, 1e-6),
            "plan_key": lambda x=x, w=w: eager.PLANS.get(
                (eager._tensor_key(x), eager._tensor_key(w), None)
            ),
            "tri_launch": functools.partial(
                eager._run_compiled, direct, p.grid, tensors, ptrs, rest, 0
            ),
        }
        if _FAST is not None:  # setup.py's build: the entry points, bypass test included
            fns["cuda_entry"] = lambda x=x, w=w: _FAST.rms_norm(x, w, 1e-6, 0.0)
            fns["tri_entry"] = lambda x=x, w=w: _FAST.triton_rms_norm(x, w, 1e-6)
        got = host_interleaved(fns, calls=200, repeats=9)
        if names is None:
            names = list(fns)
            print(f"{'shape':>10} host (us) " + " ".join(f"{k:>10}" for k in names))
        cells = " ".join(f"{median_of(got[k]):10.2f}" for k in names)
        print(f"{m}x{n:>8} host (us) {cells}", flush=True)
    return 0


def cuda_main(args) -> int:
    import cuda_impl
    from cuda_impl import Config

    dtype = DTYPES[args.dtype]
    # RTxVPT: plain loads, no cluster; RTxVPTxVARIANT: those variant bits
    cfgs = []
    for c in args.cuda.split("/"):
        rt, vpt, *variant = map(int, c.split("x"))
        cfgs.append(Config(rt, vpt, 1, variant[0] if variant else 1))
    head = [f"{c.row_threads}x{c.vpt}x{c.variant}" for c in cfgs]
    print(f"{'shape':>10} {'today':>16} " + " ".join(f"{h:>8}" for h in head) + "  (us)")
    for m, n in parse_shapes(args.shapes):
        x, w, want = shape_inputs(m, n, dtype)
        info = cuda_impl.kernel_info(x, w)["config"]
        fns = [lambda x=x, w=w: cuda_impl.rms_norm(x, w, 1e-6)]
        for c in cfgs:  # a config that cannot hold the row: a blank cell
            run = lambda x=x, w=w, c=c: cuda_impl.rms_norm_with_config(x, w, 1e-6, c)  # noqa: E731
            fns.append(run if c.holds(n, x.element_size()) else None)
        cells = median_us(fns, want, dtype)
        today = f"{cells[0]:.2f} ({info['row_threads']}x{info['vpt']})"
        print(f"{m}x{n:>8} {today:>16} " + " ".join(f"{c:8.2f}" for c in cells[1:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
