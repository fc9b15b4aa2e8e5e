"""A quick look at the CUDA forward's wide rows while trying the staged wide-row kernel:
cold median device time of cuda_impl.rms_norm under each RMSNORM_CUDA_WIDE setting (0: the
ladders' register kernel, the default; 1 and 2: the staged kernel's two slice sizes), and
Triton's, as a fraction of the copy ceiling by the forward's bytes model (read x and the
weight, write y). Each result is checked against the fp32 reference before it is timed.
Figures of record come from ``python -m harness.bench``; this prints only.

    python3 scripts/wide_probe.py [--shapes 2048x65536,...] [--dtypes bf16,fp32] [--modes 0,1,2]
"""

import argparse
import functools
import os
import statistics

import torch

from harness import hardware, timing
from harness.plan import DTYPES
from harness.reference import TOL, rms_norm_ref

WIDE_N = (32768, 65536, 131072, 262144)


def cold_us(fn, flush, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    return statistics.median(timing.cold_samples(fn, reps, flush)) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--shapes", default="")
    p.add_argument("--modes", default="0,1,2")
    args = p.parse_args()
    import cuda_impl
    import triton_impl

    ceiling = hardware.copy_ceiling()["gbps"]
    flush = timing.L2Flush(torch.cuda.get_device_properties(0).L2_cache_size)
    wrong = 0
    print(f"copy ceiling {ceiling:.0f} GB/s")
    print(f"{'dtype':6} {'shape':>13} {'impl':>8} {'us':>9} {'% copy':>7}")
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        elem = torch.finfo(dtype).bits // 8
        if args.shapes:
            shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        else:
            shapes = [(2**27 // n, n) for n in WIDE_N]
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda").to(dtype)
            w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype)
            want = rms_norm_ref(x, w, 1e-6)
            runs = [(f"cuda:{mode}", mode, cuda_impl.rms_norm) for mode in args.modes.split(",")]
            runs.append(("triton", "0", triton_impl.rms_norm))
            for name, mode, op in runs:
                os.environ["RMSNORM_CUDA_WIDE"] = mode
                fn = functools.partial(op, x, w, 1e-6)
                try:
                    torch.testing.assert_close(fn(), want, **TOL[dtype])
                    flag = ""
                except AssertionError as e:
                    flag = "  WRONG " + str(e).splitlines()[0]
                wrong += bool(flag)
                nbytes = 2 * m * n * elem + n * elem
                us = cold_us(fn, flush)
                pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceiling
                print(f"{dname:6} {m:>6}x{n:<6} {name:>8} {us:9.1f} {pct:7.1f}{flag}", flush=True)
    os.environ.pop("RMSNORM_CUDA_WIDE", None)
    if wrong:
        print(f"{wrong} results differ from the reference: the probe fails")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
