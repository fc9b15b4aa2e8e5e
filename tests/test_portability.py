"""What the CUDA build does on a GPU without thread-block clusters (before sm_90: A100,
L40S), run on the H200 with the planner told there are none (cuda_impl._C's
_pretend_no_clusters): every rms_norm row a cluster takes on the H200 runs in one CTA and
matches the reference; the fused add's rows past its widest one-CTA config are refused by
name; a forced cluster config is refused; the backward's rows take its one-CTA kernels.

What such a GPU needs first is a build for it (TORCH_CUDA_ARCH_LIST="8.0", or "8.9"); CI
keeps those targets building.
"""

import pytest
import torch

from conftest import impl_or_skip
from harness.reference import (
    TOL,
    fused_add_rms_norm_ref,
    grad_close,
    grad_scale,
    rms_norm_grads_ref,
    rms_norm_ref,
)

pytestmark = pytest.mark.gpu


@pytest.fixture
def no_clusters():
    """cuda_impl, planning as on a GPU without clusters until the test ends."""
    impl_or_skip("cuda")
    import cuda_impl
    from cuda_impl import ops

    if ops._FAST is None:
        pytest.skip("the CMake library has no Python entry points (build with setup.py)")
    ops._FAST._pretend_no_clusters(True)
    yield cuda_impl
    ops._FAST._pretend_no_clusters(False)


def takes_clusters(n: int, dtype, op: str) -> bool:
    """Whether op's default plan on the H200 shares a row of n elements over a cluster."""
    from cuda_impl.configs import default_config

    return default_config(n, torch.empty((), dtype=dtype).element_size(), op).cluster > 1


def fresh(m: int, n: int, dtype):
    x = torch.randn(m, n, device="cuda").to(dtype)
    w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype)
    torch.full((4 * m * n + 1024,), float("nan"), device="cuda")  # poison what y reuses
    return x, w


#: Widths the H200 runs on clusters: whole vectors past 32768 elements (staged clusters),
#: rows off the 16-byte grid past what a 1024 x 8 CTA holds, the widest row taken.
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
RMS_NORM_WIDTHS = [(40000, BF16), (70001, BF16), (262144, BF16), (131072, FP16), (40000, FP32),
                   (33333, FP32)]  # fmt: skip


@pytest.mark.parametrize("n, dtype", RMS_NORM_WIDTHS, ids=str)
def test_rms_norm_without_clusters_matches_reference(no_clusters, n, dtype):
    assert takes_clusters(n, dtype, "rms_norm")
    x, w = fresh(3, n, dtype)
    for y in (no_clusters.rms_norm(x, w, 1e-6), torch.ops.cuda_impl.rms_norm(x, w, 1e-6)):
        torch.testing.assert_close(y, rms_norm_ref(x, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("rdtype", [None, torch.float32], ids=["residual-of-x", "fp32"])
@pytest.mark.parametrize("n, dtype", [(32768, torch.bfloat16), (16384, torch.float32)], ids=str)
def test_fused_add_without_clusters_widest_one_cta_row(no_clusters, n, dtype, rdtype):
    """The widest row the fused add holds in one CTA: on a cluster at bf16 on the H200."""
    assert dtype != torch.bfloat16 or takes_clusters(n, dtype, "fused_add_rms_norm")
    x, w = fresh(3, n, dtype)
    r = torch.randn(3, n, device="cuda").to(rdtype or dtype)
    want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-6)
    y, r_out = no_clusters.fused_add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(y, want_y, **TOL[dtype])
    torch.testing.assert_close(r_out, want_r, **TOL[r.dtype])
    no_clusters.fused_add_rms_norm_(x, r, w, 1e-6)  # in place: x is y, r is residual_out
    torch.testing.assert_close(x, want_y, **TOL[dtype])
    torch.testing.assert_close(r, want_r, **TOL[r.dtype])


@pytest.mark.parametrize("n, dtype", [(32776, torch.bfloat16), (16388, torch.float32)], ids=str)
def test_fused_add_without_clusters_refuses_wider_rows(no_clusters, n, dtype):
    x, w = fresh(2, n, dtype)
    r = torch.randn_like(x)
    for fn in (no_clusters.fused_add_rms_norm, torch.ops.cuda_impl.fused_add_rms_norm):
        with pytest.raises(ValueError, match=rf"N = {n} needs thread-block clusters .* at most"):
            fn(x, r, w, 1e-6)
    with pytest.raises(ValueError, match=rf"N = {n} needs thread-block clusters"):
        no_clusters.fused_add_rms_norm_(x, r, w, 1e-6)


def test_forced_cluster_config_refused_without_clusters(no_clusters):
    from cuda_impl import Config, compiled_configs

    c = next(c for c in compiled_configs() if c.cluster)
    x, w = fresh(2, c.row_threads * c.vpt * 2 * 8, torch.bfloat16)
    with pytest.raises(ValueError, match="is a cluster config; this GPU has no thread-block"):
        no_clusters.rms_norm_with_config(x, w, 1e-6, Config(c.row_threads, c.vpt, 2, c.variant))


@pytest.mark.parametrize("n", [16384, 65536, 131072])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_backward_without_clusters_matches_reference(no_clusters, n, dtype):
    x = torch.randn(4, n, device="cuda").to(dtype).requires_grad_()
    w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn(4, n, device="cuda").to(dtype)
    y = no_clusters.rms_norm(x, w, 1e-6)
    torch.full((3 * x.numel() + 1024,), float("nan"), device="cuda")
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    want_dx, want_dw = rms_norm_grads_ref(x, w, 1e-6, dy)
    grad_close(dx, want_dx, "dx", grad_scale(x, w, dy))
    grad_close(dw, want_dw, "dweight")
