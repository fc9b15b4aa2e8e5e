"""One profiled call per kernel at one shape, for Nsight Compute (run under ncu).

    ncu --clock-control none --profile-from-start off --metrics ... \
        python3 scripts/ncu_one.py --impls triton,cuda --dtype bf16 --shape 2048x65536

Each implementation is warmed up first (JIT compilation, allocator), then called once
between cudaProfilerStart/Stop, so ncu sees exactly one launch of each kernel.
"""

import argparse
import sys

import torch

from harness.bench import DTYPES, parse_shapes
from harness.impls import registry


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--impls", default="triton,cuda")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--shape", default="32768x4096")
    args = p.parse_args()
    (m, n), dtype = parse_shapes(args.shape)[0], DTYPES[args.dtype]
    impls = registry(baselines=True)
    x = torch.randn(m, n, device="cuda").to(dtype)
    w = torch.randn(n, device="cuda").to(dtype)
    for name in args.impls.split(","):
        fn = impls[name].fn
        for _ in range(3):
            fn(x, w, 1e-6)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        fn(x, w, 1e-6)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {name} {args.dtype} {m}x{n}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
