"""The RMSNorm modules are drop-ins for torch.nn.RMSNorm with a 1-D normalized_shape."""

import importlib

import pytest
import torch

from conftest import DEVICE, fn_or_skip, impl_or_skip
from harness.reference import TOL, rms_norm_ref


def module_cls(name, run=True):
    """The module class of a kernel; run=False needs only an importable build."""
    (impl_or_skip if run else fn_or_skip)(name)
    return importlib.import_module(f"{name}_impl").RMSNorm


@pytest.mark.parametrize("name", ["triton", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_nn_rmsnorm(name, dtype):
    cls = module_cls(name)
    ref_mod = torch.nn.RMSNorm(1000, eps=1e-5, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        ref_mod.weight.copy_(torch.randn(1000))
    mod = cls(1000, eps=1e-5, device=DEVICE, dtype=dtype)
    mod.load_state_dict(ref_mod.state_dict())
    x = torch.randn(3, 5, 1000, device=DEVICE).to(dtype)
    torch.testing.assert_close(mod(x), rms_norm_ref(x, ref_mod.weight, 1e-5), **TOL[dtype])


@pytest.mark.parametrize("name", ["triton", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_defaults_follow_nn_rmsnorm(name):
    cls = module_cls(name)
    mod = cls([64], elementwise_affine=False, device=DEVICE)
    assert mod.weight is None and mod.eps is None
    x = torch.randn(4, 64, device=DEVICE).to(torch.bfloat16)
    # eps=None means torch.finfo(x.dtype).eps, as in torch.nn.RMSNorm
    want = rms_norm_ref(x, None, torch.finfo(torch.bfloat16).eps)
    torch.testing.assert_close(mod(x), want, **TOL[torch.bfloat16])
    assert "elementwise_affine=False" in repr(mod)


@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_module_rejects_bad_shapes(name):
    cls = module_cls(name, run=False)
    with pytest.raises(ValueError, match=r"only a 1-D normalized_shape"):
        cls((4, 64))
    mod = cls(64, device="meta")
    with pytest.raises(ValueError, match=r"x has shape \(4, 32\) but normalized_shape is \(64,\)"):
        mod(torch.empty(4, 32, device="meta"))
