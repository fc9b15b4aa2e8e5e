"""The RMSNorm modules are drop-ins for torch.nn.RMSNorm with a 1-D normalized_shape."""

import importlib

import pytest
import torch

from conftest import DEVICE, fn_or_skip, impl_or_skip
from harness.reference import TOL, grad_close, rms_norm_grads_ref, rms_norm_ref
from rmsnorm_api import MAX_N


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


@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_module_rejects_bad_x(name):
    """The modules check x as the functions do, in the same words (no finfo/AttributeError)."""
    mod = module_cls(name, run=False)(64, device="meta")
    prefix = f"{name}_impl.RMSNorm: "
    with pytest.raises(TypeError, match=prefix + r"x has dtype torch.int32"):
        mod(torch.ones(4, 64, dtype=torch.int32, device="meta"))
    with pytest.raises(TypeError, match=prefix + r"x must be a torch.Tensor, got list"):
        mod([[1.0] * 64])
    with pytest.raises(TypeError, match=prefix + r"x must be a torch.Tensor, got None"):
        mod(None)
    with pytest.raises(ValueError, match=prefix + r"x is 0-dimensional"):
        mod(torch.tensor(1.0, device="meta"))


@pytest.mark.parametrize("name", ["triton", "cuda"])
@pytest.mark.parametrize(
    "args, kwargs, err, what",
    [
        (("64",), {}, TypeError, r"normalized_shape must be an int or a sequence of ints, got str"),
        ((["64"],), {}, TypeError, r"normalized_shape is \('64',\); expected a sequence of ints"),
        (
            (True,),
            {},
            TypeError,
            r"normalized_shape must be an int or a sequence of ints, got bool",
        ),
        ((None,), {}, TypeError, r"normalized_shape must be an int or a sequence of ints"),
        ((0,), {}, ValueError, r"normalized_shape is \(0,\); expected N in \[1, 262144\]"),
        ((MAX_N + 1,), {}, ValueError, r"normalized_shape is \(262145,\); expected N in"),
        ((64,), dict(eps=-1.0), ValueError, r"eps is -1.0"),
        ((64,), dict(eps=1e-50), ValueError, r"eps is 1e-50; expected a number in float32"),
        ((64,), dict(eps="1e-6"), TypeError, r"eps must be a real number, got str"),
    ],
)
def test_module_rejects_bad_constructor_args(name, args, kwargs, err, what):
    cls = module_cls(name, run=False)
    with pytest.raises(err, match=f"{name}_impl.RMSNorm: " + what):
        cls(*args, device="meta", **kwargs)


@pytest.mark.parametrize("name", ["triton", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_module_forward_with_parameter_weight(name):
    """With a weight that requires grad (a Parameter, grad mode on) the forward matches the
    reference and backward gives the weight and x their gradients (the reference's)."""
    cls = module_cls(name)
    mod = cls(256, eps=1e-6, device=DEVICE)
    assert mod.weight.requires_grad and torch.is_grad_enabled()
    with torch.no_grad():
        mod.weight.copy_(1 + 0.5 * torch.randn(256))
    x = torch.randn(3, 256, device=DEVICE, requires_grad=True)
    y = mod(x)
    torch.testing.assert_close(
        y, rms_norm_ref(x.detach(), mod.weight.detach(), 1e-6), **TOL[x.dtype]
    )
    dy = torch.randn_like(y)
    y.backward(dy)
    want_dx, want_dw = rms_norm_grads_ref(x.detach(), mod.weight.detach(), 1e-6, dy)
    grad_close(x.grad, want_dx, "dx")
    grad_close(mod.weight.grad, want_dw, "dweight")
