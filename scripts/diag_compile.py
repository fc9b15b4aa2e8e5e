"""Diagnose triton_impl under torch.compile: per dtype and backend, where results differ."""

import torch

import triton_impl
from harness.reference import rms_norm_ref


def block(x, w):
    return triton_impl.rms_norm(x * 2.0, w, 1e-6) + 1.0


for backend in ("aot_eager", "inductor"):
    for dtype in (torch.float32, torch.bfloat16):
        for n in (4097, 4096, 1000):
            torch._dynamo.reset()
            f = torch.compile(block, fullgraph=True, dynamic=False, backend=backend)
            x = torch.randn(8, n, device="cuda").to(dtype)
            w = torch.randn(n, device="cuda").to(dtype)
            got, want = f(x, w).float(), (rms_norm_ref(x * 2.0, w, 1e-6) + 1.0).float()
            bad = ((got - want).abs() > 0.02 * want.abs() + 1e-3).nonzero()
            cols = sorted(set(bad[:, 1].tolist()))
            print(
                backend,
                dtype,
                n,
                "bad",
                len(bad),
                "rows",
                sorted(set(bad[:, 0].tolist()))[:8],
                "cols",
                cols[:6],
                cols[-3:],
                flush=True,
            )
