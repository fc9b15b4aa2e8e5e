"""One profiled call per kernel at one shape, for Nsight Compute (run under ncu).

    ncu --clock-control none --profile-from-start off --metrics ... \
        python3 scripts/ncu_one.py --impls triton,cuda --dtype bf16 --shape 2048x65536
        ... scripts/ncu_one.py --op fused_add_rms_norm --impls triton,cuda,liger,quack ...

The inputs come from the op's factory (harness.ops, seed 0). Each implementation is
warmed up first (JIT compilation, allocator), then called once between
cudaProfilerStart/Stop, so ncu sees exactly one launch of each kernel. Forced configs are
profiled after the implementations, the same way (--triton-fused: rms_norm only):

    --cuda-configs 128x4x1x0/128x4x1x1     row_threads x vpt x cluster x variant, each
    --triton-fused 1x4/4x16                 the fused Triton kernel: BLOCK_M x num_warps
    --triton-like reload=False/num_warps=16,reload=False
                                            today's Triton config with these fields changed
"""

import argparse
import dataclasses
import sys

import torch

from harness.ops import OPS
from harness.plan import DTYPES, Planned, parse_shapes
from harness.sweep import parse_where


def typed(value: str, kind: type, field: str):
    """A --triton-like value as its field's type (ValueError names the field)."""
    if kind is bool:
        if value not in ("True", "False"):
            raise ValueError(f"{field} is {value!r}; expected True or False")
        return value == "True"
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{field} is {value!r}; expected {kind.__name__}") from None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--op", default="rms_norm", choices=sorted(OPS))
    p.add_argument("--impls", default="triton,cuda")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--shape", default="32768x4096")
    p.add_argument("--cuda-configs", default="", help="RTxVPTxCLUSTERxVARIANT/...")
    p.add_argument("--triton-fused", default="", help="BLOCK_MxWARPS/...")
    p.add_argument("--triton-like", default="", help="FIELD=VALUE[,FIELD=VALUE]/...")
    args = p.parse_args()
    m, n = parse_shapes(args.shape)[0]
    op = OPS[args.op]
    impls = op.registry(baselines=True)
    inputs = op.make_inputs(Planned(args.dtype, m, n), "cuda", 0)
    runs = [(name, impls[name].fn) for name in args.impls.split(",") if name]
    for spec in filter(None, args.cuda_configs.split("/")):
        import cuda_impl

        cfg = cuda_impl.Config(*map(int, spec.split("x")))
        forced = (cuda_impl.rms_norm_with_config if op.name == "rms_norm"
                  else cuda_impl.fused_add_rms_norm_with_config)  # fmt: skip
        runs.append((f"cuda[{spec}]", lambda *a, c=cfg, f=forced: f(*a, c)))
    for spec in filter(None, args.triton_fused.split("/")):
        import triton_impl

        block_m, warps = map(int, spec.split("x"))
        cfg = triton_impl.Config("fused", 1 << (n - 1).bit_length(), warps, block_m=block_m)
        runs.append((f"triton[fused {spec}]", lambda x, w, e, c=cfg:
                     triton_impl.rms_norm_with_config(x, w, e, c)))  # fmt: skip
    for spec in filter(None, args.triton_like.split("/")):
        import triton_impl

        base = triton_impl.default_config(n, inputs[0].element_size())
        try:  # the sweep's --where parsing: FIELD=VALUE terms of the Config's own fields
            (terms,) = parse_where([f"triton:{spec}"])["triton"]
            changes = {f: typed(v, type(getattr(base, f)), f) for f, v in terms.items()}
            cfg = dataclasses.replace(base, **changes)
        except ValueError as e:
            p.error(f"--triton-like: {e}")
        runs.append((f"triton[{spec}]", lambda x, w, e, c=cfg:
                     triton_impl.rms_norm_with_config(x, w, e, c)))  # fmt: skip
    if (args.triton_fused or args.triton_like) and op.name != "rms_norm":
        p.error("--triton-fused and --triton-like force configs of rms_norm only")
    for name, fn in runs:
        for _ in range(3):
            fn(*inputs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        fn(*inputs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {name} {op.name} {args.dtype} {m}x{n}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
