"""rms_norm on head views (QK-norm's q = qkv[:, :H*D].view(T, H, D), strides (3HD, D, 1)),
timed cold (L2 flushed, the candidates interleaved, harness.timing) and, for decode-sized
calls, under CUDA-graph replay: Triton's default (the heads kernel, reading the view where
it lies), Triton on a copy (q.contiguous() then the plain op: the path before the heads
kernel), CUDA's default, torch.compile of the eager formula on the view, and FlashInfer's
rmsnorm on the view where it imports and takes one. Each candidate's output is checked
against the reference first. GB/s is of the bytes the op must move: q read, y written,
the weight read.

--backward: the backward functions instead (dx and dweight for the view, dy contiguous):
Triton's and CUDA's on the view, Triton's on a copy into rows (q.contiguous() first), and
torch.compile of the eager gradient formula on the view; GB/s of q and dy read, dx
written, the weight read and dweight written. --per-head: a weight row a head, (H, D).

    python3 scripts/heads_probe.py [--shapes 1x32x128,4096x32x128] [--dtype bf16]
        [--backward] [--per-head]
"""

import argparse

import torch

import harness.impls  # noqa: F401 (puts the peers' RMSNORM_SITE_DIRS on the path)
from harness.plan import DTYPES
from harness.reference import TOL, rms_norm_ref
from harness.timing import L2Flush, estimate_s, graph_interleaved, interleaved, quantile, reps_for

SHAPES = (
    "1x32x128,16x32x128,256x32x128,4096x32x128,16384x32x128,"
    "4096x8x128,4096x64x128,4096x32x64,4096x16x256,16384x8x256,4096x40x100"
)


def candidates(q: torch.Tensor, w: torch.Tensor) -> dict:
    """The calls timed, by name; those that cannot run here are left out, saying why."""
    import triton_impl

    fns = {
        "triton": lambda: triton_impl.rms_norm(q, w, 1e-6),
        "triton_copy": lambda: triton_impl.rms_norm(q.contiguous(), w, 1e-6),
    }
    try:
        import cuda_impl

        fns["cuda"] = lambda: cuda_impl.rms_norm(q, w, 1e-6)
    except ImportError as e:
        print(f"# cuda: {e}")

    def eager(x, weight):
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6) * weight.float()).to(
            x.dtype
        )

    compiled = torch.compile(eager, dynamic=False, fullgraph=True)
    fns["compile"] = lambda: compiled(q, w)
    try:
        from flashinfer.norm import rmsnorm

        rmsnorm(q, w, 1e-6)
        fns["flashinfer"] = lambda: rmsnorm(q, w, 1e-6)
    except Exception as e:  # not importable here, or no 3-D strided input
        print(f"# flashinfer: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return fns


def backward_candidates(dy: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> dict:
    """The backward calls timed, by name, as candidates'; each returns (dx, dweight)."""
    import triton_impl

    fns = {
        "triton": lambda: triton_impl.rms_norm_backward(dy, q, w, 1e-6),
        "triton_copy": lambda: triton_impl.rms_norm_backward(dy, q.contiguous(), w, 1e-6),
    }
    try:
        import cuda_impl

        fns["cuda"] = lambda: cuda_impl.rms_norm_backward(dy, q, w, 1e-6)
    except ImportError as e:
        print(f"# cuda: {e}")

    def eager(dy, x, weight):
        xf, gf = x.float(), dy.float()
        rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6)
        g = gf * weight.float()
        dx = rstd * (g - xf * rstd * rstd * (g * xf).mean(-1, keepdim=True))
        dw = (gf * xf * rstd).sum(0)
        return dx.to(x.dtype), (dw if weight.dim() == 2 else dw.sum(0)).to(weight.dtype)

    compiled = torch.compile(eager, dynamic=False, fullgraph=True)
    fns["compile"] = lambda: compiled(dy, q, w)
    return fns


def _backward_cases(q: torch.Tensor, w: torch.Tensor, dtype) -> tuple[dict, int]:
    """The backward's candidates for q and w, checked against float64; the bytes moved."""
    from harness.reference import grad_close, grad_scale, rms_norm_grads_ref

    dy = torch.randn(q.shape, device="cuda").to(dtype)
    want_dx, want_dw = rms_norm_grads_ref(q, w, 1e-6, dy)
    fns = backward_candidates(dy, q, w)
    for name, fn in fns.items():
        dx, dw = fn()
        grad_close(dx, want_dx, f"{name} dx", grad_scale(q, w, dy))
        grad_close(dw, want_dw, f"{name} dweight")
    moved = 3 * q.numel() * q.element_size() + 2 * w.numel() * w.element_size()
    return fns, moved


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--backward", action="store_true", help="the backward functions")
    p.add_argument("--per-head", action="store_true", help="a weight row a head, (H, D)")
    args = p.parse_args()
    dtype = DTYPES[args.dtype]
    what = "backward" if args.backward else "forward"
    wshape = "(H, D)" if args.per_head else "(D)"
    print(f"# {torch.cuda.get_device_name()}; {what}, weight {wshape};"
          " GB/s cold (graph us for T <= 256)")  # fmt: skip
    flush = L2Flush(torch.cuda.get_device_properties(0).L2_cache_size)
    for spec in args.shapes.split(","):
        t, h, d = (int(v) for v in spec.split("x"))
        torch._dynamo.reset()  # each shape compiles its own graph: past dynamo's recompile limit
        qkv = torch.randn(t, 3 * h * d, device="cuda").to(dtype)
        q = qkv[:, : h * d].view(t, h, d)
        w = (1 + 0.5 * torch.randn(*((h,) if args.per_head else ()), d, device="cuda")).to(dtype)
        if args.backward:
            fns, moved = _backward_cases(q, w, dtype)
        else:
            want = rms_norm_ref(q, w, 1e-6)
            fns = candidates(q, w)
            for name, fn in fns.items():
                torch.testing.assert_close(fn(), want, **TOL[dtype], msg=f"{name} {spec}")
            moved = 2 * q.numel() * q.element_size() + w.numel() * w.element_size()
        if t <= 256:
            got = graph_interleaved(fns)
            cells = [
                f"{n} {quantile([s * 1e6 for s in got[n][0]], 0.5):.2f}us"
                if got[n][0]
                else f"{n} -"
                for n in fns
            ]
        else:
            reps = {n: reps_for(estimate_s(fn, flush)) for n, fn in fns.items()}
            got = interleaved(fns, reps, flush)
            cells = []
            for n, blocks in got.items():
                med = quantile([s for b in blocks for s in b], 0.5)
                cells.append(f"{n} {moved / med / 1e9:.0f}")
        print(f"{spec:>14} " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
