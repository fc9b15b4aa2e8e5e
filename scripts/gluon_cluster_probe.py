"""Can Triton's Gluon dialect split a wide row over a thread-block cluster, as the CUDA
forward does? A probe, not a shipped kernel: the wide-row RMSNorm forward (bf16) with one
row over the C CTAs of a cluster, each CTA holding N / C columns in registers, the C
partial sums of squares exchanged through distributed shared memory.

    python3 scripts/gluon_cluster_probe.py              # compile each variant for sm_90
    python3 scripts/gluon_cluster_probe.py --run        # on a GPU: check and time it

Variants (notebook 12, v42, says which Triton has what):
- asmx: the exchange in inline PTX (gl.inline_asm_elementwise): the CTA's partial stored
  to a .shared word, a release / acquire cluster barrier, every peer's word read with
  mapa + ld.shared::cluster and added in rank order (the same bits on every CTA and run),
  a closing cluster barrier. Compiles on triton 3.6 and 3.8.
- implicit: one gl.sum over a row whose layout spans the cluster; the compiler emits the
  exchange (3.8; 3.6 asserts isReduceWithinCTA).
- explicit: a CTA-local sum of a [C, N / C] view, then convert_layout to a copy on every
  CTA (3.8; 3.6 fails verifying nvvm.mapa's address space).
- stasync: st.async into every peer's shared memory, an mbarrier expecting C * 4 bytes (3.8
  only: hopper.cluster, async_store and allocate_mbarrier are not in 3.6).

--compile (default) needs no GPU: Triton compiles for sm_90 ahead of time and the PTX's
cluster instructions are counted (ptxas: $TRITON_PTXAS_PATH, else CUDA_HOME's). --run
checks each variant that compiles against the fp32 reference and times it cold beside
triton_impl.rms_norm (and cuda_impl's, when built) as a fraction of the copy ceiling.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics

os.environ.setdefault(
    "TRITON_PTXAS_PATH",
    os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ptxas"),
)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

try:  # triton 3.8: hopper.cluster, async_store, allocate_mbarrier
    from triton.experimental.gluon.language.nvidia import hopper
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier
except ImportError:
    hopper = mbarrier = None

#: PTX instructions that show a cluster exchange, counted in each variant's PTX.
CLUSTER_OPS = ("barrier.cluster", "mapa", "ld.shared::cluster", "st.async", "mbarrier")


@gluon.constexpr_function
def split_bases(C, rank, dim):
    """Cluster (CGA) bases that give CTA r the r-th contiguous tile along dim."""
    C = getattr(C, "value", C)
    return [[0] * dim + [1 << i] + [0] * (rank - dim - 1) for i in range(C.bit_length() - 1)]


@gluon.constexpr_function
def copy_bases(C, rank):
    """Cluster bases that put the whole tensor on every CTA."""
    C = getattr(C, "value", C)
    return [[0] * rank for _ in range(C.bit_length() - 1)]


@gluon.constexpr_function
def exchange_sum_ptx(C):
    """Inline PTX: this CTA's partial ($1) to a .shared word, a cluster barrier, the C
    words summed in rank order into $0, a closing barrier (no CTA exits, or reuses the
    word, while a peer may still read it)."""
    C = getattr(C, "value", C)
    lines = [
        "{",
        ".reg .u32 a, p;",
        ".reg .f32 v, acc;",
        ".shared .align 4 .f32 rms_part;",
        "mov.u32 a, rms_part;",
        "st.shared::cta.f32 [a], $1;",
        "barrier.cluster.arrive.release.aligned;",
        "barrier.cluster.wait.acquire.aligned;",
        "mov.f32 acc, 0f00000000;",
    ]
    for k in range(C):
        lines += [f"mapa.shared::cluster.u32 p, a, {k};", "ld.shared::cluster.f32 v, [p];"]
        lines += ["add.f32 acc, acc, v;"]
    lines += ["mov.f32 $0, acc;", "barrier.cluster.arrive.release.aligned;"]
    lines += ["barrier.cluster.wait.acquire.aligned;", "}"]
    return "\n".join(lines)


@gluon.jit
def tile_offsets(C: gl.constexpr, S: gl.constexpr, L: gl.constexpr):
    """A row's offsets as a [C, S] tile in layout L: CTA k's row k of the tile."""
    r_i = gl.arange(0, C, layout=gl.SliceLayout(1, L))
    c_i = gl.arange(0, S, layout=gl.SliceLayout(0, L))
    return r_i[:, None] * S + c_i[None, :]


@gluon.jit
def rms_asmx(X, W, Y, stride, eps, N: gl.constexpr, C: gl.constexpr, VEC: gl.constexpr):
    S: gl.constexpr = N // C
    L: gl.constexpr = gl.BlockedLayout(
        [1, VEC], [1, 32], [1, gl.num_warps()], [1, 0], split_bases(C, 2, 0).value
    )
    row = gl.program_id(0)  # a cluster a row
    offs = tile_offsets(C, S, L)
    x = gl.load(X + row * stride + offs).to(gl.float32)
    part = gl.sum(x * x, axis=1)  # CTA k holds element k: its own partial
    ss = gl.inline_asm_elementwise(
        exchange_sum_ptx(C), "=f,f", [part], dtype=gl.float32, is_pure=False, pack=1
    )
    r = gl.rsqrt(ss / N + eps)
    w = gl.load(W + offs).to(gl.float32)
    gl.store(Y + row * stride + offs, (x * r[:, None] * w).to(gl.bfloat16))


@gluon.jit
def rms_implicit(X, W, Y, stride, eps, N: gl.constexpr, C: gl.constexpr, VEC: gl.constexpr):
    L: gl.constexpr = gl.BlockedLayout(
        [VEC], [32], [gl.num_warps()], [0], split_bases(C, 1, 0).value
    )
    row = gl.program_id(0)
    offs = gl.arange(0, N, layout=L)  # this CTA holds N / C of them
    x = gl.load(X + row * stride + offs).to(gl.float32)
    r = gl.rsqrt(gl.sum(x * x, axis=0) / N + eps)  # the compiler's cluster-wide sum
    w = gl.load(W + offs).to(gl.float32)
    gl.store(Y + row * stride + offs, (x * r * w).to(gl.bfloat16))


@gluon.jit
def rms_explicit(X, W, Y, stride, eps, N: gl.constexpr, C: gl.constexpr, VEC: gl.constexpr):
    S: gl.constexpr = N // C
    L: gl.constexpr = gl.BlockedLayout(
        [1, VEC], [1, 32], [1, gl.num_warps()], [1, 0], split_bases(C, 2, 0).value
    )
    LB: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0], copy_bases(C, 1).value)
    row = gl.program_id(0)
    offs = tile_offsets(C, S, L)
    x = gl.load(X + row * stride + offs).to(gl.float32)
    part = gl.sum(x * x, axis=1)  # local: CTA k owns element k
    ss = gl.sum(gl.convert_layout(part, LB), axis=0)  # the exchange: every partial on every CTA
    r = gl.rsqrt(ss / N + eps)
    w = gl.load(W + offs).to(gl.float32)
    gl.store(Y + row * stride + offs, (x * r * w).to(gl.bfloat16))


@gluon.jit
def rms_stasync(X, W, Y, stride, eps, N: gl.constexpr, C: gl.constexpr, VEC: gl.constexpr):
    S: gl.constexpr = N // C
    L: gl.constexpr = gl.BlockedLayout(
        [1, VEC], [1, 32], [1, gl.num_warps()], [1, 0], split_bases(C, 2, 0).value
    )
    # [destination CTA, source CTA]: values split over sources, shared memory over destinations
    LV: gl.constexpr = gl.BlockedLayout(
        [1, 1], [32, 1], [1, gl.num_warps()], [0, 1], split_bases(C, 2, 1).value
    )
    LD: gl.constexpr = gl.BlockedLayout(
        [1, 1], [1, 32], [gl.num_warps(), 1], [1, 0], split_bases(C, 2, 0).value
    )
    SM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0], split_bases(C, 2, 0).value)
    buf = gl.allocate_shared_memory(gl.float32, [C, C], SM)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, C * 4)  # the bytes this CTA receives
    mbarrier.fence_init_release_cluster()
    hopper.cluster.barrier(relaxed=True)  # every peer's mbarrier ready before any store
    row = gl.program_id(0)
    offs = tile_offsets(C, S, L)
    x = gl.load(X + row * stride + offs).to(gl.float32)
    part = gl.convert_layout(gl.sum(x * x, axis=1), gl.SliceLayout(0, LV))
    hopper.async_store(buf, gl.zeros([C, C], gl.float32, LV) + part[None, :], bar)
    mbarrier.wait(bar, 0, deps=[buf])
    ss = gl.convert_layout(gl.sum(buf.load(LD), axis=1), gl.SliceLayout(1, L))
    r = gl.rsqrt(ss / N + eps)
    w = gl.load(W + offs).to(gl.float32)
    gl.store(Y + row * stride + offs, (x * r[:, None] * w).to(gl.bfloat16))
    mbarrier.invalidate(bar)
    hopper.cluster.barrier()  # no CTA exits while a peer may still store into it


VARIANTS = {"asmx": rms_asmx, "implicit": rms_implicit, "explicit": rms_explicit}
if hopper is not None and hasattr(mbarrier, "allocate_mbarrier"):
    VARIANTS["stasync"] = rms_stasync


def compile_sm90(fn, n: int, c: int, warps: int):
    """fn compiled ahead of time for sm_90 at N = n over clusters of c CTAs."""
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "stride": "i32", "eps": "fp32"}
    sig.update(N="constexpr", C="constexpr", VEC="constexpr")
    src = GluonASTSource(
        fn=fn,
        signature=sig,
        constexprs={"N": n, "C": c, "VEC": 8},
        attrs={(i,): [["tt.divisibility", 16]] for i in range(4)},
    )
    options = {"num_warps": warps, "num_ctas": c}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_all(n: int, clusters: list[int], warps: int) -> None:
    print(f"triton {triton.__version__}, sm_90 ahead of time, bf16 rows of {n}, {warps} warps")
    for name, fn in VARIANTS.items():
        for c in clusters:
            try:
                ptx = compile_sm90(fn, n, c, warps).asm["ptx"]
            except Exception as e:  # a variant this Triton cannot compile: say why, go on
                why = " | ".join(str(e).strip().splitlines()[-3:])[:300]
                print(f"  {name:9} C={c:<2} FAIL {type(e).__name__}: {why}")
                continue
            counts = {op: len(re.findall(re.escape(op), ptx)) for op in CLUSTER_OPS}
            shown = ", ".join(f"{op} {k}" for op, k in counts.items() if k)
            print(f"  {name:9} C={c:<2} OK: {shown}")


def run_all(n: int, clusters: list[int], warps: int, rows: int) -> int:
    """On a GPU: each variant that compiles, checked against the fp32 reference and timed
    cold beside our kernels; returns the count of wrong results."""
    import torch

    import triton_impl
    from harness import hardware, timing

    libs = {"triton": triton_impl.rms_norm}
    try:
        import cuda_impl

        libs["cuda"] = cuda_impl.rms_norm
    except ImportError:
        pass
    ceiling = hardware.copy_ceiling()["gbps"]
    flush = timing.L2Flush(torch.cuda.get_device_properties(0).L2_cache_size)
    x = torch.randn(rows, n, device="cuda").to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(n, device="cuda")).to(torch.bfloat16)
    xf = x.float()
    want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)
    nbytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
    calls = {name: (lambda f=f: f(x, w, 1e-6)) for name, f in libs.items()}
    wrong = 0
    for name, fn in VARIANTS.items():
        for c in clusters:
            y = torch.full_like(x, float("nan"))
            call = lambda fn=fn, c=c, y=y: fn[(rows,)](  # noqa: E731
                x, w, y, x.stride(0), 1e-6, N=n, C=c, VEC=8, num_warps=warps, num_ctas=c
            )
            try:
                call()
                torch.cuda.synchronize()
            except Exception as e:
                print(
                    f"  {name} C={c}: not run: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                )
                continue
            calls[f"{name} C={c}"] = call
            err = (y.float() - want.float()).abs().max().item()
            wrong += not err < 0.05  # NaN (an element never written) is wrong too
            print(f"  {name} C={c}: max abs error {err:.3g}{'' if err < 0.05 else '  WRONG'}")
    print(f"copy ceiling {ceiling:.0f} GB/s; bf16 {rows} x {n}, cold L2")
    for name, call in calls.items():
        us = statistics.median(timing.cold_samples(call, 30, flush)) * 1e6
        print(
            f"  {name:14} {us:8.1f} us  {100 * nbytes / (us * 1e-6) / 1e9 / ceiling:5.1f}% of copy"
        )
    return wrong


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=65536, help="row width (a power of two)")
    p.add_argument("--clusters", default="2,8,16", help="CTAs a cluster, comma-separated")
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--run", action="store_true", help="check and time on a GPU")
    p.add_argument("--rows", type=int, default=2048, help="rows for --run")
    args = p.parse_args()
    clusters = [int(c) for c in args.clusters.split(",")]
    if args.run:
        return 1 if run_all(args.n, clusters, args.warps, args.rows) else 0
    compile_all(args.n, clusters, args.warps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
