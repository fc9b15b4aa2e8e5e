"""What Triton generates for the default configs, without a GPU: compile each kernel ahead
of time for sm_90 and report its global memory instructions (vector widths) and, from the
cubin, registers, stack (where spills go) and local memory.

    python scripts/triton_ptx.py [--dtypes bf16,fp32] [--ns 128,1000,4096,4097,65536]
    python scripts/triton_ptx.py --backward   # the backward's main kernel
    python scripts/triton_ptx.py --quant token   # rms_norm_quant's (static, token, group128)

Specialisation as at run time for contiguous rows of a fresh tensor: pointers 16-byte
aligned; row strides and N marked divisible by 16 when they are.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from typing import Optional

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from triton_impl import backward
from triton_impl.configs import Config, default_config, kernel_for, quant_config
from triton_impl.launch import Quant, quant_meta

TYPES = {"bf16": ("bf16", 2), "fp16": ("fp16", 2), "fp32": ("fp32", 4)}
TORCH_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _compile(kernel, sig: dict, consts: dict, div: list, warps: int, **options):
    names = kernel.arg_names
    src = ASTSource(
        fn=kernel,
        signature={**sig, **{k: "constexpr" for k in consts}},
        constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(names.index(a),): [["tt.divisibility", 16]] for a in div},
    )
    target = GPUTarget("cuda", 90, 32)
    return triton.compile(src, target=target, options=dict(num_warps=warps, **options))


def compile_default(dtype: str, n: int, cfg: Optional[Config] = None, quant: str = ""):
    """Compile the kernel default_config picks for many rows of (dtype, n), or cfg; quant
    ("static", "token", "group128"): rms_norm_quant's, y in e4m3 (quant_config's kernel)."""
    ty, elem = TYPES[dtype]
    cfg = cfg or default_config(n, elem)
    q_meta = None
    if quant:
        cfg = quant_config(cfg, n, elem, dynamic=quant != "static")
        group = 128 if quant == "group128" else 0
        q = Quant(torch.ones(1) if quant == "static" else None, group, None, None)
        q_meta = {**quant_meta(q, torch.float8_e4m3fn), "Q_BY_HAND": False}
        q_meta.update(q_in=None, q_out=None, stride_q=None)  # the signature's, below
    kernel, consts = kernel_for("rms_norm", cfg, elem, has_weight=True, n=n, quant=q_meta)
    warps = consts.pop("num_warps")
    sig = {"x_ptr": f"*{ty}", "w_ptr": f"*{ty}", "y_ptr": "*fp8e4nv" if quant else f"*{ty}"}
    if cfg.kernel == "sharded":
        sig.update(part_ptr="*fp32", count_ptr="*i32")
    sig.update(stride_x="i32", stride_y="i32")
    if cfg.kernel != "split":
        sig["M"] = "i32"
    if cfg.kernel != "looped":  # the looped kernel's width is a constexpr (consts)
        sig["N"] = "i32"
    sig["eps"] = "fp32"
    div = ["x_ptr", "w_ptr", "y_ptr"] + ([a for a in ("stride_x", "stride_y", "N") if a in sig]
                                         if n % 16 == 0 else [])  # fmt: skip
    if quant:
        for name in ("q_in", "q_out", "stride_q"):
            del consts[name]
        sig.update(q_in="*fp32", q_out="*fp32", stride_q="i32")
        div += ["q_in", "q_out"]
    return cfg, _compile(kernel, sig, consts, div, warps)


#: The H200's SMs: where shard_plan's rule (a row's shards fit on the SMs) is judged.
H200_SMS = 132


def compile_backward(dtype: str, n: int):
    """Compile the backward's main kernel (rms_norm's, with a weight) as the launcher
    builds it for many contiguous rows of (dtype, n) on the H200: the sharded kernel where
    shard_plan takes them, the split variant where split_vec does."""
    ty, elem = TYPES[dtype]
    ptrs = ["s_ptr", "dy_ptr", "w_ptr", "dro_ptr", "ds_ptr", "ds2_ptr"]
    strides = ["stride_s", "stride_dy", "stride_dro", "stride_ds", "stride_ds2"]
    sharded = backward.shard_plan(n, elem, H200_SMS)
    if sharded:
        shards, block_n, warps = sharded
        consts = backward.shard_meta(sharded, has_weight=True)
        del consts["num_warps"]
        options = dict(maxnreg=consts.pop("maxnreg"))
        sig = {**{p: f"*{ty}" for p in ptrs}, "dwp_ptr": "*fp32", "part_ptr": "*fp32",
               "count_ptr": "*i32", **{s: "i32" for s in strides}}  # fmt: skip
        sig.update(M="i32", N="i32", eps="fp32")
        div = ptrs + ["dwp_ptr"] + (strides + ["N"] if n % 16 == 0 else [])
        cfg = dict(kernel="sharded", block_n=block_n, shards=shards, num_warps=warps, **options)
        return cfg, _compile(backward._rms_norm_bwd_sharded, sig, consts, div, warps, **options)
    rows = torch.empty(2, n, dtype=TORCH_TYPES[dtype], device="meta")
    vec = backward.split_vec(n, rows, rows, rows)
    consts = backward.bwd_meta(n, elem, vec, has_weight=True)
    warps = consts.pop("num_warps")
    options = {k: consts.pop(k) for k in ("maxnreg",) if k in consts}
    sig = {**{p: f"*{ty}" for p in ptrs}, "dwp_ptr": "*fp32", **{s: "i32" for s in strides}}
    sig.update(stride_sh="i32", stride_dyh="i32", stride_dsh="i32", M="i32", N="i32", eps="fp32")
    consts["H"] = 1  # rows, as Triton specialises a head count of 1
    div = ptrs + ["dwp_ptr"] + (strides + ["N"] if n % 16 == 0 else [])
    kind = "chunked" if consts["CHUNKED"] else "split" if consts["SPLIT"] else "whole row"
    cfg = dict(kernel=kind, block_n=consts["BLOCK_N"], num_warps=warps, stages=consts["STAGES"],
               **options)  # fmt: skip
    return cfg, _compile(backward._rms_norm_bwd, sig, consts, div, warps, **options)


def memory_ops(ptx: str) -> dict:
    ops = collections.Counter()
    for line in ptx.splitlines():
        m = re.search(r"\b((?:ld|st)\.global[\w.:]*|cp\.async\.c[ag]\.shared\.global)", line)
        if m:
            ops[re.sub(r"\.L[12]::[\w:]+|\.L2::cache_hint", "", m.group(1))] += 1
    return dict(ops)


def resources(cubin: bytes) -> tuple:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout  # fmt: skip
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?LOCAL:(\d+)", out)
    return tuple(int(v) for v in m.groups()) if m else (None, None, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--ns", default="128,512,1000,4095,4096,4097,5120,8192,12288,32768,65536,131072")
    p.add_argument("--backward", action="store_true", help="the backward's main kernel")
    p.add_argument("--quant", default="", choices=["", "static", "token", "group128"],
                   help="rms_norm_quant's kernel in that form, y in e4m3")  # fmt: skip
    args = p.parse_args()
    cols = ["dtype", "N", "config", "global memory instructions in the PTX", "registers",
            "stack bytes", "local bytes"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for dtype in args.dtypes.split(","):
        for n in map(int, args.ns.split(",")):
            if args.backward:
                short, k = compile_backward(dtype, n)
            else:
                cfg, k = compile_default(dtype, n, quant=args.quant)
                plain = Config(cfg.kernel, cfg.block_n, cfg.num_warps).as_dict()
                short = {k: v for k, v in cfg.as_dict().items() if k in plain and v != plain[k]
                         or k in ("kernel", "block_n", "num_warps")}  # fmt: skip
            regs, stack, local = resources(k.asm["cubin"])
            ops = ", ".join(f"{c} {o}" for o, c in sorted(memory_ops(k.asm["ptx"]).items()))
            print(f"| {dtype} | {n} | {short} | {ops} | {regs} | {stack} | {local} |")


if __name__ == "__main__":
    main()
