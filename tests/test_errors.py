"""Invalid input gets a clear exception naming the argument: one test per kind, per kernel.

Argument checks run before any device work, so these run without a GPU as well (the CUDA
kernel's CPU-tensor check included); they need only an importable build.
"""

import importlib
import math

import pytest
import torch

from conftest import DEVICE, HAS_GPU, fn_or_skip, impl_or_skip
from rmsnorm_api import MAX_N

IMPLS = ["triton", "cuda"]


def x_and_w(n=64, dtype=torch.bfloat16, device=DEVICE):
    x = torch.randn(4, n, device=device).to(dtype)
    return x, torch.randn(n, device=device).to(dtype)


@pytest.fixture(params=IMPLS)
def fn(request):
    return fn_or_skip(request.param)


@pytest.fixture(params=IMPLS)
def fn_here(request):
    """For checks that come after the device check: the kernel must run on DEVICE."""
    return impl_or_skip(request.param).fn


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64, torch.float64])
def test_x_dtype(fn, dtype):
    x = torch.ones(4, 64, device=DEVICE, dtype=dtype)
    with pytest.raises(TypeError, match=r"x has dtype"):
        fn(x)


def test_x_zero_dim(fn):
    with pytest.raises(ValueError, match=r"x is 0-dimensional"):
        fn(torch.tensor(1.0, device=DEVICE))


def test_x_last_dim_zero(fn):
    with pytest.raises(ValueError, match=r"x's last dimension is 0"):
        fn(torch.empty(4, 0, device=DEVICE))


def test_x_too_wide(fn):
    x = torch.randn(1, MAX_N + 1, device=DEVICE)
    with pytest.raises(ValueError, match=rf"supported maximum is N = {MAX_N}"):
        fn(x)


def test_x_last_dim_strided(fn):
    x = torch.randn(8, 128, device=DEVICE)[:, ::2]
    with pytest.raises(ValueError, match=r"x has stride 2 in its last dimension"):
        fn(x)


def test_weight_shape(fn):
    x, _ = x_and_w(64)
    w = torch.ones(63, device=DEVICE, dtype=x.dtype)
    with pytest.raises(ValueError, match=r"weight has shape \(63,\) but x's last dimension"):
        fn(x, w)
    with pytest.raises(ValueError, match=r"weight has shape \(1, 64\)"):
        fn(x, w.new_ones(1, 64))


@pytest.mark.parametrize("wdtype", [torch.float16, torch.float64, torch.int32])
def test_weight_dtype(fn, wdtype):
    x, _ = x_and_w(64, torch.bfloat16)
    with pytest.raises(TypeError, match=r"weight has dtype"):
        fn(x, torch.ones(64, device=DEVICE, dtype=wdtype))


def test_weight_device(fn):
    x, _ = x_and_w(64)
    other = "meta"  # a device x is never on, available everywhere
    with pytest.raises(ValueError, match=r"weight is on device 'meta'"):
        fn(x, torch.ones(64, device=other, dtype=x.dtype))


def test_weight_not_a_tensor(fn):
    x, _ = x_and_w(64)
    with pytest.raises(TypeError, match=r"weight must be a torch.Tensor"):
        fn(x, [1.0] * 64)


@pytest.mark.parametrize("eps", [0.0, -1e-6, math.nan, math.inf])
def test_eps_value(fn, eps):
    x, w = x_and_w()
    with pytest.raises(ValueError, match=r"eps is"):
        fn(x, w, eps)


@pytest.mark.parametrize("eps", ["1e-6", None, True])
def test_eps_type(fn, eps):
    x, w = x_and_w()
    with pytest.raises(TypeError, match=r"eps must be a real number"):
        fn(x, w, eps)


def test_out_mismatch(fn_here):
    fn = fn_here
    x, w = x_and_w()
    with pytest.raises(ValueError, match=r"out has shape"):
        fn(x, w, out=torch.empty(4, 63, device=DEVICE, dtype=x.dtype))
    with pytest.raises(TypeError, match=r"out has dtype"):
        fn(x, w, out=torch.empty_like(x, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"out must be contiguous"):
        fn(x, w, out=torch.empty(64, 4, device=DEVICE, dtype=x.dtype).t())


def test_empty_rows(fn_here):
    fn = fn_here
    """M = 0 returns an empty result of the right shape and dtype without launching."""
    x = torch.empty(0, 4096, device=DEVICE, dtype=torch.bfloat16)
    y = fn(x, torch.ones(4096, device=DEVICE, dtype=x.dtype))
    assert y.shape == (0, 4096) and y.dtype == x.dtype
    y = fn(torch.empty(3, 0, 17, device=DEVICE))
    assert y.shape == (3, 0, 17)


def test_cpu_tensor_for_cuda_kernel():
    """The CUDA kernel refuses CPU tensors with a clear error (this runs without a GPU)."""
    fn = fn_or_skip("cuda")
    with pytest.raises(ValueError, match=r"expected a CUDA tensor"):
        fn(torch.randn(4, 64))


@pytest.mark.gpu
def test_cpu_tensor_for_triton_kernel():
    fn = fn_or_skip("triton")
    assert HAS_GPU
    with pytest.raises(ValueError, match=r"expected a CUDA tensor"):
        fn(torch.randn(4, 64))


def test_empty_rows_launch_nothing(monkeypatch):
    """The Triton launcher returns before touching a kernel when there are no rows."""
    mod = importlib.import_module("triton_impl.rms_norm")

    def boom(*a, **k):
        raise AssertionError("a kernel was launched for an empty input")

    monkeypatch.setattr(mod, "wrap_triton", boom)
    y = mod.rms_norm(torch.empty(0, 64, device=DEVICE))
    assert y.shape == (0, 64)


@pytest.mark.parametrize("op", ["triton_impl", "cuda_impl"])
def test_direct_op_callers_are_checked(op):
    """torch.ops.<ns>.rms_norm repeats the checks, for callers that skip the wrapper."""
    fn_or_skip(op.split("_")[0])
    ops = getattr(torch.ops, op)
    x = torch.ones(4, 64, device=DEVICE, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"x has dtype"):
        ops.rms_norm(x, None, 1e-6)
    xf = torch.randn(4, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight has shape"):
        ops.rms_norm(xf, torch.ones(3, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match=r"eps is"):
        ops.rms_norm(xf, None, -1.0)
