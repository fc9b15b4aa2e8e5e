"""The compile fusion pass (rmsnorm_api.enable_compile_fusion): an unchanged block, compiled
with Inductor, runs the backend's fused add + norm where the graph holds a residual add and
the RMSNorm after it, with the unrewritten block's results; what must stay is left.

Without a GPU, Triton's fused op under the interpreter in Inductor's CPU graphs; on a GPU,
both backends."""

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, HAS_GPU, impl_or_skip
from harness.reference import TOL

BACKENDS = ["triton", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def fusion(request):
    """The pass for the test's backend, installed for the test alone; Inductor's caches off,
    so that each graph runs through it (a cached graph skips the passes)."""
    import rmsnorm_api

    name = request.node.callspec.params["name"]
    impl_or_skip(name)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield rmsnorm_api.enable_compile_fusion(name)
    rmsnorm_api.disable_compile_fusion()
    torch._dynamo.reset()


def decoder(x, r, w1, w2):
    """Two residual adds, each followed by F.rms_norm, as a decoder layer's two norms; the
    sums go on (the residual stream)."""
    h = x + r
    y = F.rms_norm(h, (h.shape[-1],), w1, 1e-5)
    h2 = y * 0.5 + h
    return F.rms_norm(h2, (h2.shape[-1],), w2, 1e-6), h2


def llama_composite(x, r, w):
    """transformers' LlamaRMSNorm forward after a residual add; only the norm is used."""
    h = x + r
    hf = h.to(torch.float32)
    var = hf.pow(2).mean(-1, keepdim=True)
    return w * (hf * torch.rsqrt(var + 1e-6)).to(h.dtype)


def module_norm(x, r, norm):
    h = x + r
    return norm(h), h


def compiled_matches(fn, *args, dtype):
    """fn compiled (the pass installed) against fn eagerly: the fused op's one rounding
    against the composite's (an ulp of y apart at most)."""
    with torch.no_grad():
        got = torch.compile(fn, fullgraph=True, dynamic=False)(*args)
        want = fn(*args)
    got, want = (t if isinstance(t, tuple) else (t,) for t in (got, want))
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v, rtol=TOL[dtype]["rtol"], atol=2 * TOL[dtype]["rtol"])


def compiled_as_without_the_pass(fn, *args, dtype):
    """fn compiled with the pass installed against fn compiled without it: a graph the pass
    leaves is Inductor's own (Inductor's numerics are its own: eager's composite rounds its
    intermediates where Inductor may not), within a rounding of y (on a GPU two compiles may
    autotune their reductions apart)."""
    import rmsnorm_api

    config = torch._inductor.config
    installed = (config.post_grad_custom_post_pass, config.pre_grad_custom_pass)
    with torch.no_grad():
        got = torch.compile(fn, fullgraph=True, dynamic=False)(*args)
        rmsnorm_api.disable_compile_fusion()
        torch._dynamo.reset()
        try:
            want = torch.compile(fn, fullgraph=True, dynamic=False)(*args)
        finally:
            config.post_grad_custom_post_pass, config.pre_grad_custom_pass = installed
    got, want = (t if isinstance(t, tuple) else (t,) for t in (got, want))
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v, rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["rtol"])


def rows(*shape, dtype):
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize("name", BACKENDS)
def test_rewrites_f_rms_norm_and_keeps_the_sum(fusion, name):
    """Both add + norm pairs rewritten, the outputs the eager decoder's within what the
    chain lets the first rewrite's rounding reach: y comes out of the fused op up to an ulp
    from the composite's, so y * 0.5 + h (rounded, the second pair's input h2) may move by
    that ulp and its own, and the second norm scales that by w2 * rstd; each output keeps
    compiled_matches' allowance besides (fresh draws each run: the bound, not the draw,
    must hold)."""
    dtype = torch.bfloat16
    rtol = TOL[dtype]["rtol"]
    x, r = rows(2, 5, 64, dtype=dtype), rows(2, 5, 64, dtype=dtype)
    w1, w2 = rows(64, dtype=dtype), rows(64, dtype=dtype)
    with torch.no_grad():
        got = torch.compile(decoder, fullgraph=True, dynamic=False)(x, r, w1, w2)
        out, h2 = (t.float() for t in decoder(x, r, w1, w2))
        y = F.rms_norm(x + r, (x.shape[-1],), w1, 1e-5).float()
    dh2 = rtol * (0.5 * y.abs() + h2.abs())
    rstd2 = torch.rsqrt(h2.square().mean(-1, keepdim=True) + 1e-6)
    bounds = (w2.float().abs() * rstd2 * dh2 + rtol * out.abs(), dh2)
    for g, v, bound, what in zip(got, (out, h2), bounds, ("the second norm", "h2"), strict=True):
        err = (g.float() - v).abs()
        allowed = bound + 2 * rtol
        worst = (err - allowed).argmax()
        off, limit = err.flatten()[worst], allowed.flatten()[worst]
        assert bool((err <= allowed).all()), f"{what}: {off:.4g} off where {limit:.4g} is allowed"
    assert fusion.rewrites == 2


@pytest.mark.parametrize("name", BACKENDS)
def test_rewrites_the_llama_composite_and_rms_norm_module(fusion, name):
    dtype = torch.float32 if not HAS_GPU else torch.float16
    x, r, w = rows(6, 96, dtype=dtype), rows(6, 96, dtype=dtype), rows(96, dtype=dtype)
    compiled_matches(llama_composite, x, r, w, dtype=dtype)
    norm = torch.nn.RMSNorm(96, device=DEVICE, dtype=dtype)  # eps None: finfo's
    torch.nn.init.normal_(norm.weight)
    compiled_matches(module_norm, x, r, norm, dtype=dtype)
    assert fusion.rewrites == 2


LEFT_ALONE = {
    # a weight of another dtype than the sum (the norm's result promotes; the fused op's
    # weight and x share one dtype)
    "weight dtype": lambda x, r, w: F.rms_norm(x + r, (x.shape[-1],), w.float(), 1e-6),
    # a scaled residual (x + alpha * residual)
    "alpha": lambda x, r, w: F.rms_norm(torch.add(x, r, alpha=2), (x.shape[-1],), w, 1e-6),
    # rows the fused op does not read (stride 2 along a row): the graph's own norm
    "strided rows": lambda x, r, w: F.rms_norm(
        x.reshape(x.shape[1], x.shape[0]).t() + r, (x.shape[-1],), w, 1e-6
    ),
    # an eps the fused op refuses
    "eps 0": lambda x, r, w: F.rms_norm(x + r, (x.shape[-1],), w, 0.0),
    # a residual broadcast over rows
    "broadcast": lambda x, r, w: F.rms_norm(x + r[:1], (x.shape[-1],), w, 1e-6),
    # the mean over rows, not the last dimension
    "other dim": lambda x, r, w: (
        (x + r) * torch.rsqrt((x + r).pow(2).mean(0, keepdim=True) + 1e-6) * w
    ),
    # a number added, not a residual tensor (either side; the norm's three forms)
    "x + 1.0": lambda x, r, w: F.rms_norm(x + 1.0, (x.shape[-1],), w, 1e-6),
    "1.0 + x": lambda x, r, w: F.rms_norm(1.0 + x, (x.shape[-1],), w, 1e-6),
    "composite of x + 2": lambda x, r, w: llama_composite(x, 2, w),
}


@pytest.mark.parametrize("case", LEFT_ALONE)
@pytest.mark.parametrize("name", BACKENDS)
def test_leaves_what_the_fused_op_does_not_compute(fusion, name, case):
    # fp32 for the strided rows (the 16-bit graph did not match there without the check)
    dtype = torch.float32 if case == "strided rows" else torch.bfloat16
    x, r, w = rows(6, 64, dtype=dtype), rows(6, 64, dtype=dtype), rows(64, dtype=dtype)
    compiled_as_without_the_pass(LEFT_ALONE[case], x, r, w, dtype=dtype)
    assert fusion.rewrites == 0


@pytest.mark.parametrize("name", BACKENDS)
def test_leaves_a_number_added_before_an_rms_norm_module(fusion, name):
    dtype = torch.bfloat16
    x, norm = rows(6, 64, dtype=dtype), torch.nn.RMSNorm(64, device=DEVICE, dtype=dtype)
    torch.nn.init.normal_(norm.weight)
    compiled_as_without_the_pass(module_norm, x, 1, norm, dtype=dtype)
    assert fusion.rewrites == 0


@pytest.mark.parametrize("n", [0, 262145])
@pytest.mark.parametrize("name", BACKENDS)
def test_leaves_widths_the_fused_op_refuses(fusion, name, n):
    """Rows of no element and rows past MAX_N: the graph's own norm compiles as it would
    without the pass."""
    dtype = torch.float32
    x, r, w = rows(2, n, dtype=dtype), rows(2, n, dtype=dtype), rows(n, dtype=dtype)
    fn = lambda x, r, w: F.rms_norm(x + r, (n,), w, 1e-6)  # noqa: E731
    compiled_as_without_the_pass(fn, x, r, w, dtype=dtype)
    assert fusion.rewrites == 0


def _sum_used_between(x, r, w1, w2):
    """The decoder with the sum read before its norm too (the fused op is placed at the add,
    so that read takes its second output)."""
    h = x + r
    early = h * 3.0
    y = F.rms_norm(h, (h.shape[-1],), w1, 1e-5)
    return y + early * w2, h


@pytest.mark.parametrize("form", [decoder, _sum_used_between], ids=["decoder", "sum_read_early"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_rewrites_a_training_graph(fusion, name, dtype, form):
    """With gradients, the pre-grad pass rewrites each add and norm (both of the decoder's)
    into the fused op, whose backward then runs: outputs and the gradients of x, residual
    and both weights are the uncompiled block's."""
    if dtype == torch.bfloat16 and not HAS_GPU:
        pytest.skip("bf16 through Inductor's CPU graphs: the GPU tier's")
    shapes = ((6, 64), (6, 64), (64,), (64,))
    x, r, w1, w2 = (rows(*shape, dtype=dtype).requires_grad_() for shape in shapes)
    f = torch.compile(form, fullgraph=True, dynamic=False)
    got = f(x, r, w1, w2)
    want = form(x, r, w1, w2)
    grads = torch.autograd.grad(sum((t * t).sum() for t in got), (x, r, w1, w2))
    wants = torch.autograd.grad(sum((t * t).sum() for t in want), (x, r, w1, w2))
    tol = 4 * TOL[dtype]["rtol"]
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v, rtol=tol, atol=tol)
    # a gradient's absolute allowance at the scale of its largest entry, as grad_close's:
    # the weights' gradients are sums over rows whose terms cancel, and both sides round
    # those terms (the uncompiled block in bf16), so an entry near zero carries the
    # rounding of terms far larger than itself
    for g, v in zip(grads, wants, strict=True):
        scale = max(1.0, float(v.abs().max()))
        torch.testing.assert_close(g, v, rtol=tol, atol=tol * scale)
    assert fusion.rewrites == (2 if form is decoder else 1)


@pytest.mark.parametrize("name", BACKENDS)
def test_training_pass_leaves_what_it_must(fusion, name):
    """In a training graph: eps=None (the dtype's epsilon), mixed dtypes and an inference
    graph are left to the graph (the last to the post-grad pass, which matches it there)."""
    n = 64
    x, r = rows(6, n, dtype=torch.float32), rows(6, n, dtype=torch.float32)
    w = rows(n, dtype=torch.float32).requires_grad_()
    for fn, args in (
        (lambda x, r, w: F.rms_norm(x + r, (n,), w), (x, r, w)),
        (lambda x, r, w: F.rms_norm(x + r, (n,), w, 1e-6), (x, r.double(), w)),
    ):
        torch._dynamo.reset()
        torch.compile(fn, fullgraph=True, dynamic=False)(*args).sum().backward()
    assert fusion.rewrites == 0
    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(lambda x, r, w: F.rms_norm(x + r, (n,), w, 1e-6), fullgraph=True)(x, r, w)
    assert fusion.rewrites == 1  # the post-grad pass's


def test_enable_names_the_backend_and_keeps_another_pass():
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    import rmsnorm_api

    with pytest.raises(
        ValueError, match=r"backend is 'numba'; expected one of \['triton', 'cuda'\]"
    ):
        rmsnorm_api.enable_compile_fusion("numba")

    class Other(CustomGraphPass):
        def __call__(self, graph):
            pass

        def uuid(self):
            return b"other"

    for name in ("post_grad_custom_post_pass", "pre_grad_custom_pass"):
        with config.patch(**{name: Other()}):
            with pytest.raises(ValueError, match=f"{name} is already set"):
                rmsnorm_api.enable_compile_fusion("triton")
            rmsnorm_api.disable_compile_fusion()  # leaves another pass alone
            assert isinstance(getattr(config, name), Other)


@pytest.mark.parametrize("name", BACKENDS)
def test_transformers_llama_compiled_runs_the_fused_op(fusion, name):
    """An unchanged transformers Llama (two layers, random weights), compiled: every add
    followed by a LlamaRMSNorm (each layer's second norm, the second layer's first, the
    final norm) becomes the fused op, and the hidden states are the uncompiled model's."""
    tf = pytest.importorskip("transformers")
    dtype = torch.bfloat16 if HAS_GPU else torch.float32
    cfg = tf.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    torch.manual_seed(0)
    model = tf.LlamaModel(cfg).to(DEVICE, dtype).eval()
    for m in model.modules():
        if type(m).__name__ == "LlamaRMSNorm":
            torch.nn.init.normal_(m.weight, 1.0, 0.1)
    ids = torch.randint(0, 128, (2, 16), device=DEVICE)
    with torch.no_grad():
        want = model(ids).last_hidden_state
        got = torch.compile(model, dynamic=False)(ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=4 * TOL[dtype]["rtol"], atol=4 * TOL[dtype]["rtol"])
    assert fusion.rewrites == 4


def _backend(name):
    import cuda_impl
    import triton_impl

    return {"triton": triton_impl, "cuda": cuda_impl}[name]


def _compiled_like_uncompiled(block, args: tuple, grad: bool, dtype) -> tuple:
    """block compiled (the pass installed) and uncompiled on args, gradients enabled or not:
    (got, want, tol), the outputs already within tol (two ulps: the fused op's one rounding
    against the block's)."""
    with torch.set_grad_enabled(grad):
        got = torch.compile(block, fullgraph=True, dynamic=False)(*args)
        want = block(*args)
    tol = dict(rtol=2 * TOL[dtype]["rtol"], atol=2 * TOL[dtype]["rtol"])
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v, **tol)
    return got, want, tol


@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no_weight"])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", BACKENDS)
def test_rewrites_an_add_before_the_backends_own_norm(fusion, name, grad, weighted):
    """A block whose norm is already the backend's (its rms_norm called after the residual
    add) holds that op as an opaque call: the pre-grad pass makes the add and it one call of
    the fused op, in inference and training graphs, with the uncompiled block's outputs
    (and gradients)."""
    backend = _backend(name)
    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    x, r = rows(6, 64, dtype=dtype), rows(6, 64, dtype=dtype)
    w = rows(64, dtype=dtype) if weighted else None
    ins = [t for t in (x, r, w) if t is not None]
    if grad:
        for t in ins:
            t.requires_grad_()

    def block(x, r, w):
        h = x + r
        return backend.rms_norm(h, w, 1e-6) * 0.5 + h, h

    got, want, tol = _compiled_like_uncompiled(block, (x, r, w), grad, dtype)
    if grad:
        grads = torch.autograd.grad(sum((t * t).sum() for t in got), ins)
        wants = torch.autograd.grad(sum((t * t).sum() for t in want), ins)
        for g, v in zip(grads, wants, strict=True):
            torch.testing.assert_close(g, v, **tol)
    assert fusion.rewrites == 1


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["plain", "gemma"])
@pytest.mark.parametrize("name", BACKENDS)
def test_rewrites_an_add_before_the_backends_module(fusion, name, offset):
    """The backend's RMSNorm module (eps None: the dtype's epsilon, resolved by the module)
    after a residual add, as swap_rms_norm leaves a model: rewritten, a Gemma norm's weight
    offset kept."""
    backend = _backend(name)
    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    norm = backend.RMSNorm(64, device=DEVICE, dtype=dtype, weight_offset=offset)
    torch.nn.init.normal_(norm.weight)
    x, r = rows(6, 64, dtype=dtype), rows(6, 64, dtype=dtype)
    with torch.no_grad():
        got = torch.compile(module_norm, fullgraph=True, dynamic=False)(x, r, norm)
        want = module_norm(x, r, norm)
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v, rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["rtol"])
    assert fusion.rewrites == 1


@pytest.mark.parametrize("name", BACKENDS)
def test_leaves_the_backends_own_norm_it_must(fusion, name):
    """Left to the graph: a promoting add (x and residual of two dtypes: the fused op
    writes y in x's dtype, the norm of the promoted sum in fp32) and a number added."""
    backend = _backend(name)
    n = 64
    x, w = rows(6, n, dtype=torch.float32), rows(n, dtype=torch.float32)
    r16 = rows(6, n, dtype=torch.bfloat16)
    with torch.no_grad():
        for fn, args in (
            (lambda x, r, w: backend.rms_norm(r + x, w, 1e-6), (x, r16, w)),
            (lambda x, r, w: backend.rms_norm(x + 1.0, w, 1e-6), (x, None, w)),
        ):
            torch._dynamo.reset()
            got = torch.compile(fn, fullgraph=True, dynamic=False)(*args)
            torch.testing.assert_close(got, fn(*args), rtol=1e-6, atol=1e-6)
    assert fusion.rewrites == 0


#: how a sum is written between its add and its norm
WRITES = {
    "add_": lambda h: h.add_(1.0),
    "inplace=True": lambda h: F.relu(h, inplace=True),
}


def _written_between(norm, write):
    def block(x, r, w):
        h = x + r
        write(h)  # the sum written between the add and the norm
        return norm(h, w), h

    return block


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("write", WRITES)
@pytest.mark.parametrize("form", ["own", "F.rms_norm"])
@pytest.mark.parametrize("name", BACKENDS)
def test_leaves_a_sum_written_before_its_norm(fusion, name, form, write, grad):
    """A sum written in place between the add and the norm (dynamo's graph is not
    functionalized: the norm's argument is still the add) is left: the fused op at the add
    would normalise the sum before the write, and in training save a sum the write changes
    (a failing compile). Outputs the uncompiled block's; the pass rewrites nothing."""
    if form == "F.rms_norm" and not grad:
        pytest.skip("inference graphs' F.rms_norm: the post-grad pass's, after functionalization")
    backend = _backend(name)
    if form == "own":
        block = _written_between(lambda h, w: backend.rms_norm(h, w, 1e-6), WRITES[write])
    else:
        block = _written_between(lambda h, w: F.rms_norm(h, (h.shape[-1],), w, 1e-6), WRITES[write])
    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    x, r, w = rows(6, 64, dtype=dtype), rows(6, 64, dtype=dtype), rows(64, dtype=dtype)
    if grad:
        w.requires_grad_()
    _compiled_like_uncompiled(block, (x, r, w), grad, dtype)
    assert fusion.rewrites == 0


@pytest.mark.parametrize("form", ["own", "F.rms_norm"])
@pytest.mark.parametrize("name", BACKENDS)
def test_leaves_an_add_under_another_grad_mode(fusion, name, form):
    """The add under no_grad, the norm of a weight that trains after it: the fused op at
    the add would run without grad (y needing none, the backward refused): left, the
    outputs and the weight's gradient the uncompiled block's."""
    backend = _backend(name)
    norm = (lambda h, w: backend.rms_norm(h, w, 1e-6)) if form == "own" else (
        lambda h, w: F.rms_norm(h, (h.shape[-1],), w, 1e-6))  # fmt: skip

    def block(x, r, w):
        with torch.no_grad():
            h = x + r
        return norm(h, w), h

    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    x, r, w = rows(6, 64, dtype=dtype), rows(6, 64, dtype=dtype), rows(64, dtype=dtype)
    w.requires_grad_()
    got, want, tol = _compiled_like_uncompiled(block, (x, r, w), True, dtype)
    assert got[0].requires_grad
    (g,), (v,) = (torch.autograd.grad(out[0].float().square().sum(), w) for out in (got, want))
    torch.testing.assert_close(g, v, **tol)
    assert fusion.rewrites == 0


@pytest.mark.parametrize("name", BACKENDS)
def test_leaves_a_sum_of_permuted_rows(fusion, name):
    """x and residual dense but permuted (last stride 1): the add's sum keeps their layout,
    the fused op's is contiguous, so a later view of the sum could differ: left."""
    backend = _backend(name)
    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    x, r = (rows(4, 6, 64, dtype=dtype).transpose(0, 1) for _ in range(2))  # (6, 4, 64)
    w = rows(64, dtype=dtype)
    with torch.no_grad():
        fn = lambda x, r, w: (backend.rms_norm(x + r, w, 1e-6), x + r)  # noqa: E731
        got = torch.compile(fn, fullgraph=True, dynamic=False)(x, r, w)
        want = fn(x, r, w)
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v, rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["rtol"])
    assert fusion.rewrites == 0


def static_fp8(y, scale, dtype=torch.float8_e4m3fn, top=None):
    """A static fp8 quantisation as PyTorch writes it (torchao's and vLLM's references)."""
    top = float(torch.finfo(dtype).max) if top is None else top
    return (y.to(torch.float32) / scale).clamp(-top, top).to(dtype)


def token_fp8(y, floor=True):
    """A scale a row as vLLM's reference writes it (the row's max over the format's, at
    least 1 / (max * 512)); floor=False: without that floor (a row of zeros divides 0 by 0)."""
    top = float(torch.finfo(torch.float8_e4m3fn).max)
    s = y.abs().amax(dim=-1, keepdim=True).to(torch.float32) / top
    s = s.clamp(min=1.0 / (top * 512.0)) if floor else s
    return (y.to(torch.float32) / s).clamp(-top, top).to(torch.float8_e4m3fn), s


def norm_then_token_fp8(x, w):
    return token_fp8(F.rms_norm(x, (x.shape[-1],), w, 1e-6))


def add_norm_then_token_fp8(x, r, w):
    h = x + r
    return (*token_fp8(F.rms_norm(h, (h.shape[-1],), w, 1e-6)), h)


def norm_then_fp8(x, w, s):
    return static_fp8(F.rms_norm(x, (x.shape[-1],), w, 1e-6), s)


def add_norm_then_fp8(x, r, w, s):
    h = x + r
    return static_fp8(F.rms_norm(h, (h.shape[-1],), w, 1e-6), s), h


def composite_then_e5m2(x, r, w, s):
    """LlamaRMSNorm's composite after a residual add, quantised to e5m2; the sum unused."""
    return static_fp8(llama_composite(x, r, w), s, torch.float8_e5m2)


@pytest.mark.parametrize("name", BACKENDS)
def test_rewrites_a_norm_then_a_static_fp8_quantisation(fusion, name):
    """The norm (F.rms_norm; the composite) then y over a static scale, saturated and cast
    to fp8, with and without the residual add before it, rewritten into the backend's
    quantised op: y written in fp8 in the norm's pass (never stored in 16 bits, so it is
    the reference's fp32 norm quantised, bit for bit but at ties)."""
    from harness.reference import fused_add_rms_norm_quant_ref, q_close, rms_norm_quant_ref

    dtype = torch.bfloat16
    x, r, w = rows(4, 64, dtype=dtype), rows(4, 64, dtype=dtype), rows(64, dtype=dtype)
    s = torch.tensor(0.02, device=DEVICE)
    e4m3 = dict(scale=s, out_dtype=torch.float8_e4m3fn)
    with torch.no_grad():
        got = torch.compile(norm_then_fp8, fullgraph=True, dynamic=False)(x, w, s)
        q, _, v = rms_norm_quant_ref(x, w, 1e-6, **e4m3)
        q_close(got, q, v)
        assert fusion.rewrites == 1
        got, h = torch.compile(add_norm_then_fp8, fullgraph=True, dynamic=False)(x, r, w, s)
        q, ro, _, v = fused_add_rms_norm_quant_ref(x, r, w, 1e-6, **e4m3)
        q_close(got, q, v)
        assert torch.equal(h, ro) and fusion.rewrites == 2
        got = torch.compile(composite_then_e5m2, fullgraph=True, dynamic=False)(x, r, w, s)
        assert got.dtype == torch.float8_e5m2 and fusion.rewrites == 3


@pytest.mark.parametrize("name", BACKENDS)
def test_leaves_a_quantisation_the_op_does_not_compute(fusion, name):
    """Bounds other than the format's max (a clamp that does not saturate at it), a scale of
    two elements (per-column), a weight of another dtype: the graph's own kernels stay."""
    dtype = torch.bfloat16
    x, w = rows(4, 64, dtype=dtype), rows(64, dtype=dtype)
    s = torch.tensor(0.02, device=DEVICE)

    def narrower(x, w, s):
        return static_fp8(F.rms_norm(x, (x.shape[-1],), w, 1e-6), s, top=240.0)

    cases = [
        (narrower, (x, w, s)),
        (norm_then_fp8, (x, w, torch.full((64,), 0.02, device=DEVICE))),
        (norm_then_fp8, (x, w.float(), s)),
    ]
    with torch.no_grad():
        for fn, args in cases:
            torch._dynamo.reset()
            torch.compile(fn, fullgraph=True, dynamic=False)(*args)
    assert fusion.rewrites == 0


@pytest.mark.parametrize("name", BACKENDS)
def test_rewrites_a_norm_then_a_scale_a_row(fusion, name):
    """The norm (with and without the add before it) then a scale a row as vLLM writes it,
    rewritten into the backend's quantised op: y and the scales the reference's fp32 norm
    quantised (the unfused graph's max is of 16-bit y: its scales may differ by that
    rounding); without the floor of the op's scales, left."""
    from harness.reference import (
        QUANT_REL,
        fused_add_rms_norm_quant_ref,
        q_close,
        rms_norm_quant_ref,
    )

    dtype = torch.bfloat16
    x, r, w = rows(4, 64, dtype=dtype), rows(4, 64, dtype=dtype), rows(64, dtype=dtype)
    e4m3 = dict(out_dtype=torch.float8_e4m3fn)
    with torch.no_grad():
        q, s = torch.compile(norm_then_token_fp8, fullgraph=True, dynamic=False)(x, w)
        q_ref, s_ref, v = rms_norm_quant_ref(x, w, 1e-6, **e4m3)
        q_close(q, q_ref, v)
        torch.testing.assert_close(s, s_ref, rtol=QUANT_REL, atol=0)
        assert fusion.rewrites == 1
        q, s, h = torch.compile(add_norm_then_token_fp8, fullgraph=True, dynamic=False)(x, r, w)
        q_ref, ro, s_ref, v = fused_add_rms_norm_quant_ref(x, r, w, 1e-6, **e4m3)
        q_close(q, q_ref, v)
        torch.testing.assert_close(s, s_ref, rtol=QUANT_REL, atol=0)
        assert torch.equal(h, ro) and fusion.rewrites == 2
        torch._dynamo.reset()

        def no_floor(x, w):
            return token_fp8(F.rms_norm(x, (x.shape[-1],), w, 1e-6), floor=False)

        torch.compile(no_floor, fullgraph=True, dynamic=False)(x, w)
        assert fusion.rewrites == 2


def group_fp8(y, group, floor=True, dim=-1):
    """A scale a group of `group` columns, written as token_fp8 is over y's last dimension
    split into groups (dim: the max's and the squeeze's; -2 is across the groups)."""
    top = float(torch.finfo(torch.float8_e4m3fn).max)
    yg = y.unflatten(-1, (-1, group))
    s = yg.abs().amax(dim=dim, keepdim=True).to(torch.float32) / top
    s = s.clamp(min=1.0 / (top * 512.0)) if floor else s
    q = (yg.to(torch.float32) / s).clamp(-top, top).to(torch.float8_e4m3fn)
    return q.flatten(-2), s.squeeze(dim)


@pytest.mark.parametrize("name", BACKENDS)
def test_rewrites_a_norm_then_a_scale_a_group(fusion, name):
    """The norm (with and without the add before it; 2-D and 3-D x) then a scale a group
    of columns, rewritten into the backend's quantised op with that group: y and the
    scales the reference's fp32 norm quantised; without the op's floor, a group the op
    does not take (96), or the max across the groups instead of within one, left."""
    from harness.reference import (
        QUANT_REL,
        fused_add_rms_norm_quant_ref,
        q_close,
        rms_norm_quant_ref,
    )

    dtype = torch.bfloat16
    w = rows(512, dtype=dtype)
    e4m3 = dict(out_dtype=torch.float8_e4m3fn)

    def plain(x, w, group):
        return group_fp8(F.rms_norm(x, (x.shape[-1],), w, 1e-6), group)

    def added(x, r, w, group):
        h = x + r
        return (*group_fp8(F.rms_norm(h, (h.shape[-1],), w, 1e-6), group), h)

    with torch.no_grad():
        done = 0
        for shape, group in (((4, 512), 128), ((2, 3, 512), 64)):
            x, r = rows(*shape, dtype=dtype), rows(*shape, dtype=dtype)
            q, s = torch.compile(plain, fullgraph=True, dynamic=False)(x, w, group)
            q_ref, s_ref, v = rms_norm_quant_ref(x, w, 1e-6, group_size=group, **e4m3)
            q_close(q, q_ref, v)
            torch.testing.assert_close(s, s_ref, rtol=QUANT_REL, atol=0)
            q, s, h = torch.compile(added, fullgraph=True, dynamic=False)(x, r, w, group)
            q_ref, ro, s_ref, v = fused_add_rms_norm_quant_ref(
                x, r, w, 1e-6, group_size=group, **e4m3
            )
            q_close(q, q_ref, v)
            torch.testing.assert_close(s, s_ref, rtol=QUANT_REL, atol=0)
            done += 2
            assert torch.equal(h, ro) and fusion.rewrites == done
        x, w3 = rows(4, 384, dtype=dtype), rows(384, dtype=dtype)
        cases = [
            (lambda x, w: group_fp8(F.rms_norm(x, (384,), w, 1e-6), 128, floor=False), (x, w3)),
            (lambda x, w: group_fp8(F.rms_norm(x, (384,), w, 1e-6), 96), (x, w3)),
            (lambda x, w: group_fp8(F.rms_norm(x, (384,), w, 1e-6), 128, dim=-2), (x, w3)),
        ]
        for fn, args in cases:
            torch._dynamo.reset()
            torch.compile(fn, fullgraph=True, dynamic=False)(*args)
        assert fusion.rewrites == done
