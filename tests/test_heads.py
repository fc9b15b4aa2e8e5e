"""rms_norm on head views (QK-norm): q = qkv[:, :H*D].view(T, H, D) of a packed projection,
strides (3HD, D, 1), rows that share no one stride. Triton's forward reads them where they
lie (the heads kernel), never copying x first; both backends match the reference, forward
and gradients, at head widths 64, 128, 256 and odd ones, in all three dtypes. Fresh random
inputs, outputs poisoned before each run."""

import importlib

import pytest
import torch

from conftest import DEVICE, impl_or_skip
from harness.reference import TOL, grad_close, grad_scale, rms_norm_grads_ref, rms_norm_ref

BACKENDS = ["triton", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-6
#: (T, H, D): head widths models use and odd ones; T = 1 is one row of heads, one stride
SHAPES = [(3, 8, 64), (5, 4, 128), (2, 2, 256), (4, 3, 100), (7, 5, 7), (1, 16, 128)]


def backend(name: str):
    impl_or_skip(name)
    return importlib.import_module(f"{name}_impl")


def heads_of(t: int, h: int, d: int, dtype, which: int = 1) -> torch.Tensor:
    """Head `which` of q, k, v (0, 1, 2) of a packed (T, 3HD) projection, as (T, H, D)."""
    qkv = torch.randn(t, 3 * h * d, device=DEVICE).to(dtype)
    return qkv[:, which * h * d : (which + 1) * h * d].view(t, h, d)


def weight_of(d: int, dtype, kind: str):
    if kind == "none":
        return None
    w = torch.randn(d, device=DEVICE)
    return w if kind == "fp32" else w.to(dtype)


@pytest.mark.parametrize("wkind", ["none", "dtype", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_forward_matches_reference(name, dtype, wkind):
    """rms_norm and its out= form on head views, with and without Gemma's offset."""
    mod = backend(name)
    for t, h, d in SHAPES:
        for which in (0, 1, 2):
            q = heads_of(t, h, d, dtype, which)
            w = weight_of(d, dtype, wkind)
            for offset in (0.0, 1.0) if w is not None else (0.0,):
                want = rms_norm_ref(q, w, EPS, offset)
                got = mod.rms_norm(q, w, EPS, weight_offset=offset)
                assert got.shape == q.shape and got.is_contiguous()
                torch.testing.assert_close(got, want, **TOL[dtype], msg=f"{(t, h, d)}")
                out = torch.full(q.shape, float("nan"), device=DEVICE, dtype=dtype)
                assert mod.rms_norm(q, w, EPS, out=out, weight_offset=offset) is out
                torch.testing.assert_close(out, want, **TOL[dtype], msg=f"{(t, h, d)}")


def test_triton_reads_heads_in_place():
    """Triton's launch for a head view is the heads kernel on x itself (no copy first),
    and for rows that view as one stride (T = 1; a contiguous x) the plain kernels'."""
    impl_or_skip("triton")
    from triton_impl.launch import head_rows, plan

    q = heads_of(6, 8, 128, torch.bfloat16)
    y = torch.empty(q.shape, device=DEVICE, dtype=q.dtype)
    p = plan("rms_norm", (q,), None, EPS, (y,))
    assert p.kernel.__name__ == "_rms_norm_fwd_heads"
    assert p.args[0].data_ptr() == q.data_ptr() and p.args[0].stride() == (3 * 8 * 128, 128, 1)
    assert head_rows(q.contiguous()) is None
    assert head_rows(heads_of(1, 8, 128, torch.bfloat16)) is None
    # (B, T, H, D) of a packed (B, T, 3HD): batch and tokens merge, the heads stay
    qkv = torch.randn(2, 3, 3 * 4 * 32, device=DEVICE)
    assert head_rows(qkv[..., : 4 * 32].view(2, 3, 4, 32)).shape == (6, 4, 32)
    # leading dimensions that do not merge (a transposed batch): as_rows copies them
    assert head_rows(torch.randn(3, 2, 4, 32, device=DEVICE).transpose(0, 1)) is None


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_forward_of_unmerged_batch(name, dtype):
    """A 4-D head view whose batch and tokens do not merge still matches (through a copy)."""
    mod = backend(name)
    qkv = torch.randn(3, 2, 3 * 4 * 32, device=DEVICE).to(dtype).transpose(0, 1)
    q = qkv[..., 4 * 32 : 8 * 32].unflatten(-1, (4, 32))
    w = weight_of(32, dtype, "dtype")
    torch.testing.assert_close(mod.rms_norm(q, w, EPS), rms_norm_ref(q, w, EPS), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_grads_match_reference(name, dtype):
    """dx (into the head view's layout) and dweight through autograd, against float64."""
    mod = backend(name)
    for t, h, d in SHAPES:
        qkv = torch.randn(t, 3 * h * d, device=DEVICE).to(dtype).requires_grad_()
        q = qkv[:, h * d : 2 * h * d].view(t, h, d)
        w = weight_of(d, dtype, "dtype").requires_grad_()
        dy = torch.randn(t, h, d, device=DEVICE).to(dtype)
        dqkv, dw = torch.autograd.grad(mod.rms_norm(q, w, EPS), (qkv, w), dy)
        want_dx, want_dw = rms_norm_grads_ref(q, w, EPS, dy)
        assert dqkv[:, : h * d].eq(0).all() and dqkv[:, 2 * h * d :].eq(0).all()
        grad_close(
            dqkv[:, h * d : 2 * h * d].view(t, h, d),
            want_dx,
            f"dx {(t, h, d)}",
            grad_scale(q, w, dy),
        )
        grad_close(dw, want_dw, f"dweight {(t, h, d)}")


#: transformers' QK-norm families: (class prefix, config class)
def _qk_layer(tf, family: str):
    """(decoder layer, its rotary module) of transformers' Qwen3 or Gemma 3, tiny, fp32, on
    DEVICE, in training mode: the harness's family layer (random weights, Gemma's norms'
    near zero: it scales by 1 + weight)."""
    from harness.model.config import BlockConfig
    from harness.model.families import family_layer

    cfg = BlockConfig(hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=128, eps=1e-6)
    layer, rotary = family_layer(tf, family, cfg, 8, DEVICE, torch.float32)
    return layer.train(), rotary


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
@pytest.mark.parametrize("name", BACKENDS)
def test_swapped_qk_norm_layers_match_and_train(name, family):
    """transformers' Qwen3 and Gemma 3 decoder layers (tiny, fp32, random weights):
    swap_rms_norm swaps every norm, q_norm and k_norm (on each head's rows) among them,
    Gemma's with weight_offset 1; the swapped layer's output and its gradients (the input's
    and every parameter's) match the layer's own."""
    import copy

    tf = pytest.importorskip("transformers")
    mod = backend(name)
    from harness.model.hf import layer_call
    from rmsnorm_api import swap_rms_norm

    layer, rotary = _qk_layer(tf, family)
    swapped = copy.deepcopy(layer)
    norms = [n for n, m in layer.named_modules() if type(m).__name__.endswith("RMSNorm")]
    assert swap_rms_norm(swapped, mod.RMSNorm) == len(norms) >= 4
    for n in ("self_attn.q_norm", "self_attn.k_norm"):
        new = swapped.get_submodule(n)
        assert isinstance(new, mod.RMSNorm)
        assert new.weight_offset == (1.0 if family == "gemma3" else 0.0)
    hidden = torch.randn(2, 8, 64, device=DEVICE)
    dy = torch.randn(2, 8, 64, device=DEVICE)
    got, want = {}, {}
    for which, m in ((got, swapped), (want, layer)):
        h = hidden.clone().requires_grad_()
        out = layer_call(m, rotary, h)()  # the harness's call, across transformers versions
        params = dict(m.named_parameters())
        grads = torch.autograd.grad(out, (h, *params.values()), dy)
        which.update({"out": out.detach(), "d hidden": grads[0]})
        which.update({f"d {k}": g for k, g in zip(params, grads[1:], strict=True)})
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=2e-4, rtol=2e-4, msg=k)
