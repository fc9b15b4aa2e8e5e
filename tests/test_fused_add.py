"""The fused residual add + RMSNorm: the numerics grid, the in-place form, invalid input,
and the ops (opcheck, torch.compile, CUDA graphs).

Inputs come from the op's factory (harness.ops.FUSED_ADD_RMS_NORM); without a GPU the
Triton kernel runs under the interpreter with M capped (harness.cases.CPU_MAX_ELEMENTS).
"""

import math
import warnings

import pytest
import torch

from conftest import DEVICE, HAS_GPU
from harness.cases import fused_add_cases
from harness.impls import runnable
from harness.ops import FUSED_ADD_RMS_NORM as OP
from harness.reference import TOL, fused_add_rms_norm_ref
from harness.validate import run_case

IMPLS = OP.registry()
CASES = [c.cpu_cap() for c in fused_add_cases()] if DEVICE == "cpu" else fused_add_cases()


def impl_here(name: str):
    impl = IMPLS[name]
    why = runnable(impl, DEVICE)
    if why:
        pytest.skip(f"{name}: {why}")
    return impl


def inputs(m=4, n=64, dtype=torch.bfloat16, rdtype=None):
    x = torch.randn(m, n, device=DEVICE).to(dtype)
    r = torch.randn(m, n, device=DEVICE).to(rdtype or dtype)
    w = (1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype)
    return x, r, w


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("name", list(OP.ours))
def test_matches_reference(name, case):
    """Both outputs of the functional and the in-place form against the reference."""
    impl = impl_here(name)
    seed = 2000 + CASES.index(case)
    with warnings.catch_warnings():
        special = case.fill in ("nonfinite", "large") or case.residual_fill != "randn"
        if DEVICE == "cpu" and special:
            # the interpreter computes with numpy, which warns on the NaN, Inf and overflow
            # these cases feed it on purpose; the result is still checked below
            warnings.filterwarnings(
                "ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter"
            )
        r = run_case(case, impl, DEVICE, seed, op=OP)
    assert r.ok, f"{case} seed={seed}: {r.error} (max abs {r.max_abs}, max rel {r.max_rel})"


def test_case_grid_is_complete():
    cases = fused_add_cases()
    assert {c.residual for c in cases} == {"same", "fp32"}
    assert {c.residual_fill for c in cases} >= {"randn", "cancel", "overflow", "nonfinite"}
    assert any(c.row_pad for c in cases) and any(c.weight == "none" for c in cases)
    assert {c.n for c in cases} >= {1, 17, 4095, 4097, 65536, 262144}


def test_inputs_from_the_factory():
    """Seeded and random, never zeros; the residual laid out as x in its own dtype; the
    special fills do what they say."""
    from harness.cases import Case

    case = Case("s", (16, 1000), torch.bfloat16, row_pad=24, offset=3, residual="fp32")
    x, r, w, eps = OP.make_inputs(case, "cpu", 3)
    assert r.dtype == torch.float32 and r.shape == x.shape and r.stride() == x.stride()
    assert (r != 0).float().mean() > 0.99 and not torch.equal(r.to(x.dtype), x)
    x2, r2, _, _ = OP.make_inputs(case, "cpu", 3)
    assert torch.equal(x, x2) and torch.equal(r, r2)
    cancel = Case("c", (8, 64), torch.float16, residual_fill="cancel")
    x, r, _, _ = OP.make_inputs(cancel, "cpu", 0)
    assert torch.equal(x + r, torch.zeros_like(x))
    over = Case("o", (8, 64), torch.float16, residual_fill="overflow")
    x, r, _, _ = OP.make_inputs(over, "cpu", 0)
    y, ro = fused_add_rms_norm_ref(x, r)
    assert torch.isinf(ro).any() and torch.isfinite(x).all() and torch.isfinite(r).all()
    bad = Case("b", (8, 64), torch.float32, residual_fill="nonfinite")
    _, r, _, _ = OP.make_inputs(bad, "cpu", 0)
    assert torch.isnan(r).any() and torch.isinf(r).any()
    assert OP.bytes_moved(OP.make_inputs(case, "cpu", 0)) == 16 * 1000 * (2 + 4) * 2 + 2000


@pytest.mark.parametrize("n", [4097, 40000])
def test_in_place_form_writes_both(n):
    """residual <- x + residual, x <- y, as the functional form computes them; nothing else
    is allocated for the outputs."""
    impl = impl_here("triton")
    x, r, w = inputs(3, n, torch.bfloat16, torch.float32)
    y, ro = fused_add_rms_norm_ref(x, r, w, 1e-6)
    assert impl.in_place(x, r, w, 1e-6) is None
    torch.testing.assert_close(x, y, **TOL[torch.bfloat16])
    torch.testing.assert_close(r, ro, **TOL[torch.float32])


def test_empty_rows():
    impl = impl_here("triton")
    x = torch.empty(0, 4096, device=DEVICE, dtype=torch.bfloat16)
    y, ro = impl.fn(x, torch.empty_like(x), None, 1e-6)
    assert y.shape == ro.shape == (0, 4096)
    impl.in_place(x, torch.empty_like(x), None, 1e-6)


# ---- invalid input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, err, what",
    [
        (lambda x, r: None, TypeError, r"residual must be a torch.Tensor, got None"),
        (lambda x, r: r[:, :63], ValueError, r"residual has shape \(4, 63\) but x has shape"),
        (lambda x, r: r.half(), TypeError, r"residual has dtype torch.float16; expected x's"),
        (lambda x, r: r.to("meta"), ValueError, r"residual is on device 'meta' but x is on"),
        (
            lambda x, r: torch.randn(4, 128).to(r.dtype)[:, ::2],
            ValueError,
            r"residual has stride 2 in its last dimension",
        ),  # fmt: skip
        (lambda x, r: r.cpu().to_sparse(), TypeError, r"residual has layout torch.sparse_coo"),
    ],
)
@pytest.mark.parametrize("form", ["functional", "in-place"])
def test_residual_errors(make, err, what, form):
    import triton_impl

    fn = triton_impl.fused_add_rms_norm if form == "functional" else triton_impl.fused_add_rms_norm_
    x, r, w = inputs(dtype=torch.bfloat16)
    if DEVICE == "cpu" and "device" in what:
        pytest.skip("x is on the CPU here: the device mismatch needs x on a GPU")
    with pytest.raises(err, match=what):
        fn(x, make(x, r), w, 1e-6)


@pytest.mark.parametrize("form", ["functional", "in-place"])
def test_x_weight_eps_errors(form):
    """x, weight and eps get the plain op's checks and words."""
    import triton_impl

    fn = triton_impl.fused_add_rms_norm if form == "functional" else triton_impl.fused_add_rms_norm_
    x, r, w = inputs()
    with pytest.raises(TypeError, match=r"x has dtype torch.int32"):
        fn(x.int(), r, w, 1e-6)
    with pytest.raises(ValueError, match=r"weight has shape \(63,\)"):
        fn(x, r, w[:63], 1e-6)
    for eps in (0.0, math.nan, 1e-50):
        with pytest.raises(ValueError, match=r"eps is"):
            fn(x, r, w, eps)


def test_in_place_errors():
    import triton_impl

    fn = triton_impl.fused_add_rms_norm_
    x, r, w = inputs(4, 64, torch.float32)
    with pytest.raises(ValueError, match=r"x and residual overlap in memory"):
        fn(x, x, w, 1e-6)
    buf = torch.randn(5, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"x and residual overlap in memory"):
        fn(buf[:4], buf[1:], w, 1e-6)
    with pytest.raises(ValueError, match=r"weight overlaps x or residual"):
        fn(x, r, r[0], 1e-6)
    batch = torch.randn(5, 3, 64, device=DEVICE).transpose(0, 1)  # leading dims not a view
    with pytest.raises(ValueError, match=r"x's leading dimensions cannot be viewed as rows"):
        fn(batch, torch.randn(3, 5, 64, device=DEVICE), w, 1e-6)
    w.requires_grad_(True)
    with pytest.raises(ValueError, match=r"does not support autograd, but weight requires"):
        fn(x, r, w, 1e-6)
    with torch.no_grad():
        fn(x, r, w, 1e-6)


def test_backward_raises():
    """Forward only, for now: the forward runs with inputs that require grad, backward
    raises a clear error rather than giving no gradient."""
    impl = impl_here("triton")
    x, r, w = inputs(4, 64, torch.float32)
    x.requires_grad_(True)
    y, ro = impl.fn(x, r, w, 1e-6)
    torch.testing.assert_close(y, fused_add_rms_norm_ref(x.detach(), r, w, 1e-6)[0])
    with pytest.raises(RuntimeError, match=r"forward-only for now"):
        y.sum().backward()


def test_direct_op_callers_are_checked():
    ops = torch.ops.triton_impl
    x, r, w = inputs()
    with pytest.raises(ValueError, match=r"residual has shape"):
        ops.fused_add_rms_norm(x, r[:, :32], w, 1e-6)
    with pytest.raises(ValueError, match=r"x and residual overlap"):
        ops.fused_add_rms_norm_(x, x, w, 1e-6)
    with pytest.raises(TypeError, match=r"x has dtype torch.int32"):
        ops.fused_add_rms_norm(torch.ones(4, 64, dtype=torch.int32, device="meta"), r, w, 1e-6)


# ---- the ops -------------------------------------------------------------------------------


def test_opcheck():
    impl_here("triton")
    ops = torch.ops.triton_impl
    # The interpreter computes on host copies, which fake tensors cannot follow: on CPU only
    # the schema and autograd-registration checks apply; on a GPU, all.
    kw = {} if HAS_GPU else {"test_utils": ("test_schema", "test_autograd_registration")}
    for dtype, rdtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32)):
        x, r, w = inputs(8, 4097, dtype, rdtype)
        torch.library.opcheck(ops.fused_add_rms_norm.default, (x, r, w, 1e-6), **kw)
        torch.library.opcheck(ops.fused_add_rms_norm.default, (x, r, None, 1e-5), **kw)
        torch.library.opcheck(
            ops.fused_add_rms_norm_.default, (x.clone(), r.clone(), w, 1e-6), **kw
        )


@pytest.mark.gpu
def test_compile_fullgraph():
    import triton_impl

    def block(x, r, w):  # the op between ordinary ops, as in a pre-norm layer
        y, r = triton_impl.fused_add_rms_norm(x * 2.0, r, w, 1e-6)
        return y + 1.0, r

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    for dtype, rdtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                          (torch.float16, torch.float16)):  # fmt: skip
        x, r, w = inputs(8, 4097, dtype, rdtype)
        y, ro = compiled(x, r, w)
        want_y, want_r = fused_add_rms_norm_ref(x * 2.0, r, w, 1e-6)
        tol = TOL[dtype]
        torch.testing.assert_close(y, want_y + 1.0, rtol=tol["rtol"], atol=tol["atol"] +
                                   torch.finfo(dtype).eps)  # fmt: skip
        torch.testing.assert_close(ro, want_r, **TOL[rdtype])


@pytest.mark.gpu
def test_cuda_graph_in_place_allocates_no_output():
    """The in-place form captured in a CUDA graph (as vLLM runs it), replayed on new data;
    capturing it allocates no output (the H200 showed 1 KiB allocated during the capture,
    far below one output's bytes, its source not yet identified: docs/PERF_NOTES.md)."""
    import triton_impl

    x, r, w = inputs(32, 4096, torch.bfloat16)
    triton_impl.fused_add_rms_norm_(x, r, w, 1e-6)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    before = torch.cuda.memory_allocated()
    with torch.cuda.graph(g):
        triton_impl.fused_add_rms_norm_(x, r, w, 1e-6)
    assert torch.cuda.memory_allocated() - before < x.nbytes // 8
    x0, r0 = torch.randn_like(x), torch.randn_like(r)
    x.copy_(x0)
    r.copy_(r0)
    g.replay()
    torch.cuda.synchronize()
    want_y, want_r = fused_add_rms_norm_ref(x0, r0, w, 1e-6)
    torch.testing.assert_close(x, want_y, **TOL[torch.bfloat16])
    torch.testing.assert_close(r, want_r, **TOL[torch.bfloat16])
