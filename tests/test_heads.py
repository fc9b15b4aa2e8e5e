"""rms_norm on head views (QK-norm): q = qkv[:, :H*D].view(T, H, D) of a packed projection,
strides (3HD, D, 1), rows that share no one stride. Triton's forward reads them where they
lie (the heads kernel), never copying x first; both backends match the reference, forward
and gradients, at head widths 64, 128, 256 and odd ones, in all three dtypes. Fresh random
inputs, outputs poisoned before each run."""

import importlib

import pytest
import torch

from conftest import DEVICE, HAS_GPU, impl_or_skip
from harness.reference import TOL, grad_close, grad_scale, rms_norm_grads_ref, rms_norm_ref

BACKENDS = ["triton", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-6
#: (T, H, D): head widths models use and odd ones; T = 1 is one row of heads, one stride
SHAPES = [(3, 8, 64), (5, 4, 128), (2, 2, 256), (4, 3, 100), (7, 5, 7), (1, 16, 128)]
if HAS_GPU:  # many tokens (CUDA's narrow backward over several rounds), many heads, one token
    SHAPES += [(2049, 8, 64), (333, 40, 128), (1, 64, 256), (130, 32, 512)]


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
    from rmsnorm_api import head_rows
    from triton_impl.launch import plan

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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_head_view_is_one_kernel(name, dtype):
    """A head view with a weight of x's dtype, a row or a row a head (Gemma's offset too;
    CUDA's fp32 x reads the host's weight + offset), and contiguous heads with a row a
    head, are normalised by one kernel launch, the heads kernel: no copy of x into rows
    before it, no launch a head, at the head widths models use, decode and prefill sized."""
    mod = backend(name)
    from harness.measure import kernel_times

    want = "_rms_norm_fwd_heads" if name == "triton" else "rms_norm_kernel"
    for t, h, d in [(4, 32, 128), (2048, 8, 128), (64, 16, 256), (512, 8, 64)]:
        q = heads_of(t, h, d, dtype)
        # a row for all heads, a row a head (on the view, and on contiguous heads)
        for x, w in (
            (q, weight_of(d, dtype, "dtype")),
            (q, torch.randn(h, d, device=DEVICE).to(dtype)),
            (q.contiguous(), torch.randn(h, d, device=DEVICE).to(dtype)),
        ):
            for offset in (0.0, 1.0) if name == "triton" or dtype != torch.float32 else (0.0,):
                mod.rms_norm(x, w, EPS, weight_offset=offset)  # compiled before the profile
                ran = kernel_times(
                    lambda x=x, w=w, o=offset: mod.rms_norm(x, w, EPS, weight_offset=o)
                )
                assert len(ran) == 1 and want in next(iter(ran)), (t, h, d, w.shape, offset, ran)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_backward_of_heads_is_one_pass(name, dtype):
    """The backward of a head view (a weight row, or a row a head) and of contiguous heads
    with a row a head is the backward kernel once over every head's rows, where they lie,
    and dweight's reduction: no copy of x into rows, no launch a head. CUDA's weight is fp32
    here, which its kernels read as it is (another dtype is converted first: a kernel more)."""
    mod = backend(name)
    from harness.measure import kernel_times

    wdtype = dtype if name == "triton" else torch.float32
    for t, h, d in [(4, 32, 128), (2048, 8, 128), (64, 16, 256), (512, 8, 64), (96, 40, 100)]:
        q = heads_of(t, h, d, dtype)
        dy = torch.randn(t, h, d, device=DEVICE).to(dtype)
        for x, w in (
            (q, weight_of(d, wdtype, "dtype")),
            (q, torch.randn(h, d, device=DEVICE).to(wdtype)),
            (q.contiguous(), torch.randn(h, d, device=DEVICE).to(wdtype)),
        ):
            mod.rms_norm_backward(dy, x, w, EPS)  # compiled before the profile
            ran = kernel_times(lambda x=x, w=w, dy=dy: mod.rms_norm_backward(dy, x, w, EPS))
            kinds = sorted(
                (
                    "dw_reduce" if "dw_reduce" in k else "bwd" if "rms_norm_bwd" in k else k,
                    v["count"],
                )
                for k, v in ran.items()
            )
            assert kinds == [("bwd", 1), ("dw_reduce", 1)], (t, h, d, w.shape, ran)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_in_place_on_heads(name, dtype):
    """out=q normalises a head view in place: q's elements become the reference's and the
    rest of the packed projection (k, v) is left as it was; rows wider than the heads
    kernels take are normalised into a new tensor and copied in."""
    mod = backend(name)
    for t, h, d in SHAPES + [(3, 2, 1000), (2, 2, 20000)]:
        qkv = torch.randn(t, 3 * h * d, device=DEVICE).to(dtype)
        kept = qkv.clone()
        q = qkv[:, h * d : 2 * h * d].view(t, h, d)
        w = weight_of(d, dtype, "dtype")
        want = rms_norm_ref(q, w, EPS, 1.0)
        assert mod.rms_norm(q, w, EPS, out=q, weight_offset=1.0) is q
        torch.testing.assert_close(q, want, **TOL[dtype], msg=f"{(t, h, d)}")
        assert torch.equal(qkv[:, : h * d], kept[:, : h * d])
        assert torch.equal(qkv[:, 2 * h * d :], kept[:, 2 * h * d :])


@pytest.mark.parametrize("name", BACKENDS)
def test_in_place_refusals(name):
    """out= on a head view other than x itself is refused (out must be contiguous, or x),
    as are x's own layouts the kernels cannot write where they lie, and views whose
    elements share memory (rows, or heads, overlapping their neighbours)."""
    mod = backend(name)
    qkv = torch.randn(4, 3 * 8 * 64, device=DEVICE)
    q, k = (qkv[:, i * 512 : (i + 1) * 512].view(4, 8, 64) for i in (0, 1))
    with pytest.raises(ValueError, match="out must be contiguous"):
        mod.rms_norm(q, None, EPS, out=k)
    x = torch.randn(3, 2, 4, 64, device=DEVICE).transpose(0, 1)  # batch and tokens apart
    with pytest.raises(ValueError, match="cannot be viewed as rows in place"):
        mod.rms_norm(x, None, EPS, out=x)
    base = torch.randn(1024, device=DEVICE)
    for shape, strides in (((4, 2, 64), (64, 32, 1)), ((4, 2, 64), (192, 32, 1))):
        shared = base.as_strided(shape, strides)
        with pytest.raises(ValueError, match="share memory"):
            mod.rms_norm(shared, None, EPS, out=shared)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_compiled(name):
    """Inside torch.compile(fullgraph=True): a head view of a packed projection normalised
    out of place and in place (out=q), between ordinary ops, as eagerly."""
    mod = backend(name)
    torch._dynamo.reset()
    t, h, d = 16, 8, 128

    def block(qkv, w):
        qkv = qkv * 2.0
        q = qkv[:, : h * d].view(t, h, d)
        k = qkv[:, h * d : 2 * h * d].view(t, h, d)
        mod.rms_norm(k, w, EPS, out=k)
        return mod.rms_norm(q, w, EPS) + 1.0, qkv

    f = torch.compile(block, fullgraph=True, dynamic=False)
    qkv = torch.randn(t, 3 * h * d, device=DEVICE, dtype=torch.bfloat16)
    w = weight_of(d, torch.bfloat16, "dtype")
    got, want = f(qkv, w), block(qkv, w)
    tol = TOL[torch.bfloat16]
    atol = tol["atol"] + torch.finfo(torch.bfloat16).eps
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=tol["rtol"], atol=atol)


def test_harness_qk_op():
    """The harness's QK op: its cases and planned shapes are head views of a packed
    projection; our Triton kernel and its second form (out=) match the op's reference on
    every case; a planned M that is not whole tokens is refused, naming it."""
    from harness.ops import OPS
    from harness.plan import QK_HEADS, QK_MORE_HEADS, Planned
    from rmsnorm_api import head_rows

    op = OPS["qk_rms_norm"]
    impl = impl_or_skip("triton", impls=op.registry())
    for case in op.cases():
        inputs = op.make_inputs(case, DEVICE, 0)
        t, h, d = case.shape
        assert inputs[0].shape == (t, h, d) and inputs[0].stride()[1:] == (d, 1)
        assert t == 1 or inputs[0].stride(0) == 3 * h * d
        assert (head_rows(inputs[0]) is not None) == (t > 1)
        ref = op.reference(*inputs)
        for got in (impl.fn(*inputs), op.second_form(impl, inputs, ref)):
            op.compare(got, ref, case.id)
    for heads in (QK_HEADS, *QK_MORE_HEADS):  # an op a head count, forward and backward
        for name in ("qk_rms_norm", "qk_rms_norm_bwd"):
            op = OPS[name if heads == QK_HEADS else f"{name}_h{heads}"]
            x = op.make_inputs(Planned("bf16", 2 * heads, 128), DEVICE, 0)[0]
            assert x.shape == (2, heads, 128) and x.stride(0) == 3 * heads * 128
            assert [(p.m, p.n) for p in op.plan(["bf16"], quick=True)] == [(4096 * heads, 128)]
            assert f"{heads} heads a token" in op.title
            assert all(m % heads == 0 for _, (m, _) in op.no_gpu_shapes)
            with pytest.raises(ValueError, match="not a whole number of tokens"):
                op.make_inputs(Planned("bf16", heads + 1, 128), DEVICE, 0)


def test_harness_qk_backward_op():
    """The harness's QK backward op: head views (the forward's inputs for the same seed)
    and a contiguous dy of their shape; our Triton kernel's gradients, the backward alone
    and through its poisoned second form, match the op's reference on every case."""
    from harness.ops import OPS
    from harness.validate import check
    from rmsnorm_api import head_rows

    op, fwd = OPS["qk_rms_norm_bwd"], OPS["qk_rms_norm"]
    impl = impl_or_skip("triton", impls=op.registry())
    for case in op.cases():
        inputs = op.make_inputs(case, DEVICE, 0)
        q, dy = inputs[0], inputs[3]
        assert torch.equal(q, fwd.make_inputs(case, DEVICE, 0)[0])
        assert head_rows(q) is not None or case.shape[0] == 1
        assert dy.shape == q.shape and dy.is_contiguous()
        _, _, ok, why = check(impl, *inputs, op.reference(*inputs), op=op)
        assert ok, (case.id, why)
    inputs = op.make_inputs(op.cases()[0], DEVICE, 0)  # a weight of x's dtype
    q, w = inputs[0], inputs[1]
    assert op.bytes_moved(inputs) == 3 * q.nbytes + 2 * w.nbytes  # q, dy, dx; weight, dweight


@pytest.mark.parametrize("wkind", ["dtype", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_per_head_weight(name, dtype, wkind):
    """A weight row a head, (H, D): on head views, contiguous heads and in place (out=q),
    with and without Gemma's offset, and its gradients (dweight (H, D)) against float64,
    through autograd and the public backward function."""
    mod = backend(name)
    for t, h, d in SHAPES:
        q = heads_of(t, h, d, dtype)
        w = torch.randn(h, d, device=DEVICE)
        w = w if wkind == "fp32" else w.to(dtype)
        for x in (q, q.contiguous()):
            for offset in (0.0, 1.0):
                want = rms_norm_ref(x, w, EPS, offset)
                got = mod.rms_norm(x, w, EPS, weight_offset=offset)
                torch.testing.assert_close(got, want, **TOL[dtype], msg=f"{(t, h, d)}")
        q_in = q.clone()
        mod.rms_norm(q_in, w, EPS, out=q_in)
        torch.testing.assert_close(q_in, rms_norm_ref(q, w, EPS), **TOL[dtype])
        x = q.contiguous().requires_grad_()
        wg = w.clone().requires_grad_()
        dy = torch.randn(t, h, d, device=DEVICE).to(dtype)
        dx, dw = torch.autograd.grad(mod.rms_norm(x, wg, EPS, weight_offset=1.0), (x, wg), dy)
        want_dx, want_dw = rms_norm_grads_ref(x, wg, EPS, dy, 1.0)
        assert dw.shape == (h, d)
        scale = grad_scale(x, wg.detach() + 1.0, dy)
        grad_close(dx, want_dx, f"dx {(t, h, d)}", scale)
        grad_close(dw, want_dw, f"dweight {(t, h, d)}")
        dx2, dw2 = mod.rms_norm_backward(dy, q, w, EPS, weight_offset=1.0)
        grad_close(dx2, want_dx, f"backward dx {(t, h, d)}", scale)
        grad_close(dw2, want_dw, f"backward dweight {(t, h, d)}")


@pytest.mark.parametrize("name", BACKENDS)
def test_per_head_weight_refusals(name):
    """A weight that is neither a row nor a row a head is refused, naming it and x's shape;
    the fused add takes a row only."""
    mod = backend(name)
    x = torch.randn(3, 4, 8, device=DEVICE)
    for shape in ((5, 8), (4, 7), (1, 4, 8), (2, 8)):
        with pytest.raises(
            ValueError,
            match=r"weight has shape .* but x's last dimension is 8; expected \(8,\), or a row"
            r" a head: \(4, 8\)",
        ):
            mod.rms_norm(x, torch.randn(shape, device=DEVICE), EPS)
    with pytest.raises(ValueError, match="a row a head: none, x is 1-D"):
        mod.rms_norm(torch.randn(8, device=DEVICE), torch.randn(1, 8, device=DEVICE), EPS)
    with pytest.raises(ValueError, match=r"weight has shape \(4, 8\) but x's last dimension"):
        mod.fused_add_rms_norm(x, torch.randn_like(x), torch.randn(4, 8, device=DEVICE), EPS)


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
