"""What an op writes, how it differentiates and what it traces: both backends.

Tensors an op writes never overlap themselves or the tensors it reads (exactly: disjoint
slices of one tensor are accepted); negative views are never written; every mode of
autograd gives the reference's derivative or an error that names what is unsupported;
meta tensors give meta outputs; and on a machine without a GPU the Triton ops trace and
compile under the interpreter. CUDA cases run on a GPU, or through the ops' fakes.
"""

import itertools
import random

import pytest
import torch
from torch.autograd import forward_ad as fwAD

from conftest import DEVICE, HAS_GPU, fn_or_skip, impl_or_skip
from rmsnorm_api import _overlaps

BACKENDS = ["triton", "cuda"]


def backend(name: str, device: str = DEVICE):
    """The backend module, where its kernels run on device (a skip naming why not)."""
    impl_or_skip(name, device)
    import cuda_impl
    import triton_impl

    return {"triton": triton_impl, "cuda": cuda_impl}[name]


def ref(x, w, eps=1e-6):
    s = x.double()
    return s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("be", BACKENDS)
def test_backend_exports_the_shared_api(be):
    """Each backend package exports every name of the shared API (rmsnorm_api.BACKEND_API),
    so callers, the harness and the sweep name one API for both."""
    import importlib

    from rmsnorm_api import BACKEND_API

    fn_or_skip(be)  # importable (the CUDA extension built)
    mod = importlib.import_module(f"{be}_impl")
    assert set(BACKEND_API) <= set(mod.__all__)
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not missing, missing


# ---- written tensors that overlap themselves -----------------------------------------------


def _self_overlapping(n: int):
    """x layouts whose rows share memory: an expanded row, rows one element apart."""
    return {
        "expanded": torch.randn(1, n, device=DEVICE).expand(3, n),
        "rows-one-apart": torch.randn(n + 4, device=DEVICE).as_strided((4, n), (1, 1)),
    }


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("layout", ["expanded", "rows-one-apart"])
def test_in_place_refuses_self_overlapping_x_and_residual(be, layout):
    mod = backend(be)
    n = 64
    bad = _self_overlapping(n)[layout]
    good = torch.randn(bad.shape, device=DEVICE)
    before = bad.clone()
    with pytest.raises(ValueError, match=r"x has elements that share memory"):
        mod.fused_add_rms_norm_(bad, good)
    with pytest.raises(ValueError, match=r"residual has elements that share memory"):
        mod.fused_add_rms_norm_(torch.randn(bad.shape, device=DEVICE), bad)
    assert torch.equal(bad, before)  # refused before anything was written


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["expanded", "rows-one-apart"])
def test_raw_cuda_in_place_op_refuses_self_overlap(layout):
    """The C++ checks refuse it too, for direct torch.ops callers."""
    backend("cuda")
    bad = _self_overlapping(64)[layout]
    with pytest.raises(ValueError, match=r"x has elements that share memory"):
        torch.ops.cuda_impl.fused_add_rms_norm_(
            bad, torch.randn(bad.shape, device=DEVICE), None, 1e-6
        )


@pytest.mark.parametrize("be", BACKENDS)
def test_negative_views_are_never_written(be):
    mod = backend(be)
    x, r = torch.randn(3, 64, device=DEVICE), torch.randn(3, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"out is a negative view"):
        mod.rms_norm(x, out=torch._neg_view(torch.empty(3, 64, device=DEVICE)))
    with pytest.raises(ValueError, match=r"x is a negative view"):
        mod.fused_add_rms_norm_(torch._neg_view(x.clone()), r)
    with pytest.raises(ValueError, match=r"residual is a negative view"):
        mod.fused_add_rms_norm_(x.clone(), torch._neg_view(r.clone()))
    # read, a negative view is what it reads as
    out = torch.empty(3, 64, device=DEVICE)
    mod.rms_norm(torch._neg_view(x), out=out)
    torch.testing.assert_close(out, mod.rms_norm(-x))


# ---- overlap between tensors: exact for row layouts -----------------------------------------


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("split", ["columns", "rows"])
def test_in_place_accepts_disjoint_views_of_one_tensor(be, split):
    mod = backend(be)
    b = torch.randn(4, 128, device=DEVICE)
    x, r = (b[:, :64], b[:, 64:]) if split == "columns" else (b[0::2], b[1::2])
    want_y, want_r = mod.fused_add_rms_norm(x.clone(), r.clone())
    mod.fused_add_rms_norm_(x, r)
    torch.testing.assert_close(x, want_y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r, want_r)


@pytest.mark.parametrize("be", BACKENDS)
def test_in_place_refuses_interleaved_overlap(be):
    mod = backend(be)
    b = torch.randn(6, 64, device=DEVICE)
    x = b.view(-1)[: 5 * 64 - 32].view(-1)[:256].view(4, 64)  # rows 0-3
    r = b.view(-1)[32:].as_strided((4, 64), (64, 1))  # half a row on
    with pytest.raises(ValueError, match=r"x and residual overlap in memory"):
        mod.fused_add_rms_norm_(x, r)


def _bytes(t: torch.Tensor) -> set:
    e, got = t.element_size(), set()
    for idx in itertools.product(*[range(n) for n in t.shape]):
        off = t.storage_offset() + sum(i * s for i, s in zip(idx, t.stride(), strict=True))
        got.update(range(off * e, off * e + e))
    return got


def _random_rows(storage: torch.Tensor, rng: random.Random) -> torch.Tensor:
    rows, n = rng.randint(1, 5), rng.randint(1, 6)
    return storage.as_strided((rows, n), (rng.randint(0, 9), 1), rng.randint(0, 40))


def test_overlap_is_exact_for_row_layouts():
    """_overlaps against the byte sets, for random row layouts of one storage, in one dtype
    and across two (an fp32 residual beside 16-bit x)."""
    rng = random.Random(0)
    half = torch.zeros(512, dtype=torch.float16)
    for _ in range(1500):
        a, b = _random_rows(half, rng), _random_rows(half, rng)
        assert _overlaps(a, b) == bool(_bytes(a) & _bytes(b)), (a.stride(), b.stride())
        c = _random_rows(half.view(torch.float32), rng)
        assert _overlaps(a, c) == bool(_bytes(a) & _bytes(c)), (a.stride(), c.stride())


@pytest.mark.gpu
def test_cuda_checks_judge_overlap_as_python_does():
    """The C++ in-place check accepts exactly the random layouts the Python check accepts."""
    backend("cuda")
    rng = random.Random(1)
    storage = torch.zeros(512, device="cuda")
    for _ in range(300):
        x, r = _random_rows(storage, rng), _random_rows(storage, rng)
        if x.shape != r.shape:
            continue
        py_ok, cpp_ok = True, True
        try:
            from rmsnorm_api import check_in_place

            check_in_place(x, r, None)
        except ValueError:
            py_ok = False
        try:
            torch.ops.cuda_impl.fused_add_rms_norm_(x.clone() if py_ok else x, r, None, 1e-6)
        except ValueError:
            cpp_ok = False
        if py_ok:  # the raw op on x itself, now that its layout is known to be accepted
            try:
                torch.ops.cuda_impl.fused_add_rms_norm_(x, r, None, 1e-6)
            except ValueError:
                cpp_ok = False
        assert py_ok == cpp_ok, (x.stride(), x.storage_offset(), r.stride(), r.storage_offset())


# ---- autograd in every mode -----------------------------------------------------------------


def _inputs(device=DEVICE, n=64):
    g = torch.Generator().manual_seed(0)
    x, v = (torch.randn(3, n, generator=g).to(device) for _ in range(2))
    w, vw = (torch.randn(n, generator=g).to(device) for _ in range(2))
    return x, w, v, vw


@pytest.mark.parametrize("be", BACKENDS)
def test_forward_mode_tangents_match_the_reference(be):
    mod = backend(be)
    x, w, v, vw = _inputs()
    _, got = torch.func.jvp(lambda x, w: mod.rms_norm(x, w), (x, w), (v, vw))
    _, want = torch.func.jvp(ref, (x.double(), w.double()), (v.double(), vw.double()))
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert want.abs().max() > 1  # a zero tangent could not pass
    want_x = torch.func.jvp(lambda x: ref(x, w), (x.double(),), (v.double(),))[1]
    with fwAD.dual_level():
        y = mod.rms_norm(fwAD.make_dual(x, v), w)
        tangent = fwAD.unpack_dual(y).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent.double(), want_x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("be", BACKENDS)
def test_fused_add_forward_mode(be):
    mod = backend(be)
    x, w, v, vw = _inputs()
    r, vr = torch.randn_like(x), torch.randn_like(x)
    (ty, tro) = torch.func.jvp(lambda x, r: mod.fused_add_rms_norm(x, r, w), (x, r), (v, vr))[1]
    want = torch.func.jvp(lambda s: ref(s, w), ((x + r).double(),), ((v + vr).double(),))[1]
    torch.testing.assert_close(ty.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tro, v + vr)


@pytest.mark.parametrize("be", BACKENDS)
def test_functorch_reverse_modes_and_vmap(be):
    mod = backend(be)
    x, w, v, _ = _inputs()
    grad = torch.func.grad(lambda x: (mod.rms_norm(x, w) * v).sum())(x)
    want = torch.func.grad(lambda x: (ref(x, w) * v.double()).sum())(x.double())
    torch.testing.assert_close(grad.double(), want, atol=1e-5, rtol=1e-5)
    for argnum, args in ((0, (x[:1], w)), (1, (x[:1], w))):
        got = torch.func.jacrev(mod.rms_norm, argnums=argnum)(*args)
        exp = torch.func.jacrev(ref, argnums=argnum)(*(a.double() for a in args))
        torch.testing.assert_close(got.double(), exp, atol=1e-5, rtol=1e-5)
    got = torch.func.jacfwd(lambda x: mod.rms_norm(x, w))(x[:1])
    exp = torch.func.jacfwd(lambda x: ref(x, w))(x[:1].double())
    torch.testing.assert_close(got.double(), exp, atol=1e-5, rtol=1e-5)
    ws = torch.stack([w, v[0]])
    got = torch.func.vmap(lambda w: mod.rms_norm(x, w))(ws)
    torch.testing.assert_close(
        got.double(), torch.stack([ref(x, u) for u in ws]), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("be", BACKENDS)
def test_second_derivatives_are_refused_by_name(be):
    mod = backend(be)
    x, w, _, _ = _inputs()
    with pytest.raises(RuntimeError, match=r"rms_norm_backward: second derivatives are not"):
        torch.func.hessian(lambda x: mod.rms_norm(x, w).sum())(x[:1])
    xg = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(mod.rms_norm(xg, w).square().sum(), xg, create_graph=True)
    with pytest.raises(RuntimeError, match=r"second derivatives are not supported"):
        g.sum().backward()


@pytest.mark.parametrize("be", BACKENDS)
def test_in_place_and_out_refuse_tangents(be):
    mod = backend(be)
    x, w, v, _ = _inputs()
    with fwAD.dual_level():
        with pytest.raises(ValueError, match=r"does not support forward-mode AD, but x"):
            mod.fused_add_rms_norm_(fwAD.make_dual(x.clone(), v), torch.randn_like(x))
        with pytest.raises(ValueError, match=r"does not support forward-mode AD, but x"):
            mod.rms_norm(fwAD.make_dual(x, v), out=torch.empty_like(x))


# ---- meta tensors: shape inference for every op -------------------------------------------


@pytest.mark.parametrize("be", BACKENDS)
def test_meta_in_meta_out(be):
    mod = backend(be, "cpu") if be == "triton" else None
    if be == "cuda":
        fn_or_skip("cuda")
        import cuda_impl as mod
    x, r = torch.randn(4, 64, device="meta"), torch.randn(4, 64, device="meta")
    w = torch.randn(64, device="meta")
    assert mod.rms_norm(x, w).device.type == "meta"
    y, ro = mod.fused_add_rms_norm(x, r.float(), w)
    assert (y.device.type, ro.dtype) == ("meta", torch.float32)
    mod.fused_add_rms_norm_(x, r, w)
    mod.rms_norm(x, w, out=torch.empty(4, 64, device="meta"))
    dx, dw = mod.rms_norm_backward(r, x, w)
    assert (dx.shape, dw.shape, dx.device.type) == ((4, 64), (64,), "meta")
    assert mod.fused_add_rms_norm_backward(r, r, x, w)[1].device.type == "meta"
    ns = getattr(torch.ops, mod.__name__)
    assert ns.rms_norm(x, None, 1e-6).device.type == "meta"
    with pytest.raises(TypeError, match=r"x has dtype torch.int32"):  # the same checks
        ns.rms_norm(x.int(), None, 1e-6)
    with pytest.raises(ValueError, match=r"x has elements that share memory"):
        mod.fused_add_rms_norm_(x[:1].expand(4, 64), r)


# ---- tracing and compiling on the CPU, under the interpreter -------------------------------


needs_interpreter = pytest.mark.skipif(HAS_GPU, reason="the interpreter's paths (no GPU here)")


@needs_interpreter
@pytest.mark.parametrize("compiler", ["eager", "aot_eager", "inductor"])
def test_triton_compiles_under_the_interpreter(compiler):
    import triton_impl

    x, w, _, _ = _inputs("cpu")
    r = torch.randn_like(x)
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: triton_impl.rms_norm(a, b), fullgraph=True, backend=compiler)
    torch.testing.assert_close(f(x, w), triton_impl.rms_norm(x, w))
    xg, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xg, w).sum().backward()
    triton_impl.rms_norm(xe, w).sum().backward()
    torch.testing.assert_close(xg.grad, xe.grad)
    g = torch.compile(
        lambda *a: triton_impl.fused_add_rms_norm(*a), fullgraph=True, backend=compiler
    )
    for got, want in zip(g(x, r, w), triton_impl.fused_add_rms_norm(x, r, w), strict=True):
        torch.testing.assert_close(got, want)


@needs_interpreter
def test_triton_fake_tensors_and_opcheck_under_the_interpreter():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import triton_impl  # noqa: F401

    with FakeTensorMode():
        assert torch.ops.triton_impl.rms_norm(torch.empty(4, 64), None, 1e-6).shape == (4, 64)
    x, w, v, _ = _inputs("cpu")
    ops = torch.ops.triton_impl
    for op, args in [
        (ops.rms_norm.default, (x, w, 1e-6)),
        (ops.rms_norm_out.default, (torch.empty_like(x), x, w, 1e-6)),
        (ops.fused_add_rms_norm.default, (x, v, w, 1e-6)),
        (ops.fused_add_rms_norm_.default, (x.clone(), v.clone(), w, 1e-6)),
        (ops.rms_norm_backward.default, (v, x, w, 1e-6)),
        (ops.fused_add_rms_norm_backward.default, (v, v, x, w, 1e-6)),
    ]:
        torch.library.opcheck(op, args)


# ---- wording --------------------------------------------------------------------------------


@pytest.mark.parametrize("be", BACKENDS)
def test_wording_of_dtype_and_backward_errors(be):
    fn_or_skip(be)
    mod = __import__(f"{be}_impl")
    x = torch.randn(4, 64)
    with pytest.raises(
        TypeError, match=r"residual has dtype torch.bfloat16; expected x's dtype, torch.float32$"
    ):
        mod.fused_add_rms_norm(x, x.bfloat16())
    dy = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(
        TypeError,
        match=r"residual_out has dtype torch.float16; expected dy's dtype \(torch.bfloat16\) or"
        r" float32",
    ):
        mod.fused_add_rms_norm_backward(dy, None, dy.half())


def test_triton_config_and_kernel_info_wording():
    fn_or_skip("triton")
    import triton_impl

    x = torch.randn(4, 64, device=DEVICE)
    with pytest.raises(
        ValueError,
        match=r"rms_norm_with_config: cfg has unknown fields \['BLOCK_N'\]; a Config's fields"
        r" are \['kernel'",
    ):
        triton_impl.rms_norm_with_config(x, None, 1e-6, dict(kernel="fused", BLOCK_N=64))
    with pytest.raises(
        ValueError,
        match=r"triton_impl.kernel_info: x is on device '(cpu|meta)'.*reads a compiled GPU kernel",
    ):
        triton_impl.kernel_info(x.cpu() if HAS_GPU else x)
