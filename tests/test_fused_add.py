"""The fused residual add + RMSNorm, both kernels: the numerics grid, the in-place form,
the modules' residual, invalid input (and the C++ op's words against the Python checks'),
and the ops (opcheck, torch.compile, CUDA graphs).

Inputs come from the op's factory (harness.ops.FUSED_ADD_RMS_NORM); without a GPU the
Triton kernel runs under the interpreter with M capped (harness.cases.CPU_MAX_ELEMENTS),
and the CUDA op's argument checks run on CPU tensors (they come before its device check).
"""

import dataclasses
import math
import warnings

import pytest
import torch

from conftest import DEVICE, HAS_GPU, cluster_widths, impl_or_skip, sharded_to_stress
from harness.cases import fused_add_cases
from harness.ops import FUSED_ADD_RMS_NORM as OP
from harness.reference import (
    TOL,
    fused_add_rms_norm_grads_ref,
    fused_add_rms_norm_ref,
    grad_close,
    rms_norm_ref,
)
from harness.validate import run_case
from rmsnorm_api import check_fused_inputs, check_in_place

IMPLS = OP.registry()
BACKENDS = ["triton", "cuda"]
#: the fused add's name among the Triton forward ops (triton_impl.launch.plan)
FUSED = "fused_add_rms_norm"
CASES = [c.cpu_cap() for c in fused_add_cases()] if DEVICE == "cpu" else fused_add_cases()


def impl_here(name: str):
    return impl_or_skip(name, impls=IMPLS)


def backend(name: str):
    """The package of a backend (triton_impl, cuda_impl), or a skip saying why not here."""
    import importlib

    try:
        return importlib.import_module(f"{name}_impl")
    except ImportError as e:
        pytest.skip(f"{name}: {e}")


def backend_here(name: str):
    """For checks that come after the device check: the kernel must run on DEVICE."""
    impl_here(name)
    return backend(name)


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


def test_a_peer_is_checked_against_its_own_rounding():
    """A peer that normalises the sum before rounding it (QuACK's, FlashInfer's fused add)
    is checked against that definition (the op's differs from it by the sum's rounding,
    past an ulp of y on a few of many millions of rows), within the same tolerance, and a
    peer wrong by its own definition still fails."""
    from harness.impls import Impl
    from harness.reference import fused_add_rms_norm_ref_of_fp32_sum as own
    from harness.validate import check

    x, r, w = (torch.randn(8, 512).bfloat16() for _ in range(3))
    inputs, ref = (x, r, w[0], 1e-6), fused_add_rms_norm_ref(x, r, w[0], 1e-6)
    peer = Impl("peer", own, reference=own)
    assert check(peer, *inputs, ref, op=OP)[2]

    def off(*args):
        y, s = own(*args)
        return y * 1.02, s

    ok, err = check(dataclasses.replace(peer, fn=off), *inputs, ref, op=OP)[2:]
    assert not ok and "not close" in err
    # the peer's own definition is what it is held to: right by the op's, wrong by its own
    held = Impl("held", fused_add_rms_norm_ref, reference=off)
    assert check(dataclasses.replace(held, reference=None), *inputs, ref, op=OP)[2]
    assert not check(held, *inputs, ref, op=OP)[2]


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
@pytest.mark.parametrize("name", BACKENDS)
def test_in_place_form_writes_both(name, n):
    """residual <- x + residual, x <- y, as the functional form computes them; nothing else
    is allocated for the outputs."""
    impl = impl_here(name)
    x, r, w = inputs(3, n, torch.bfloat16, torch.float32)
    y, ro = fused_add_rms_norm_ref(x, r, w, 1e-6)
    assert impl.in_place(x, r, w, 1e-6) is None
    torch.testing.assert_close(x, y, **TOL[torch.bfloat16])
    torch.testing.assert_close(r, ro, **TOL[torch.float32])


@pytest.mark.parametrize(
    "n, kind, block_n, rows",
    [
        (4096, "sharded", 1024, 1),
        (12289, "sharded", 1024, 1),
        (4096, "looped", 1024, 1),
        (4100, "looped", 2048, 2),
        (32768, "fused", 32768, 1),
    ],
    ids=str,
)
@pytest.mark.parametrize("rdtype", [None, torch.float32])
@pytest.mark.parametrize("in_place", [False, True], ids=["functional", "in_place"])
def test_triton_sharded_and_looped_kernels(n, kind, block_n, rows, rdtype, in_place):
    """The Triton fused add's sharded kernel forced (the last program of a row normalises
    it from the residual_out its peers stored; a partial last shard at 12289) and its
    looped kernel (residual_out stored in the first sweep and read back in the second;
    whole chunks unmasked, a partial last chunk, two rows a program over an odd row
    count) and its fused tile on a 16-bit row past FUSED_MAX_N: both forms."""
    impl_or_skip("triton")
    from triton_impl import Config, fused_add_rms_norm_with_config
    from triton_impl.launch import launch, plan

    x, r, w = inputs(5, n, torch.bfloat16, rdtype)
    want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-6)
    if kind == "sharded":
        cfg = Config("sharded", block_n, 4, stages=2, stream_y=True)
    else:  # looped, or the fused tile past FUSED_MAX_N (the sweep's candidate at 32768)
        cfg = Config(kind, block_n, 4, block_m=rows)
    if in_place:
        launch(plan(FUSED, (x, r), w, 1e-6, (x, r), cfg))
        y, ro = x, r
    else:
        y, ro = fused_add_rms_norm_with_config(x, r, w, 1e-6, cfg)
    torch.testing.assert_close(y, want_y, **TOL[torch.bfloat16])
    torch.testing.assert_close(ro, want_r, **TOL[rdtype or torch.bfloat16])


@pytest.mark.exhaustive
@pytest.mark.parametrize("n", [17, 1000, 1024])
def test_every_triton_fused_add_candidate_matches_reference(n):
    """Every candidate the fused add's sweep times (its fused tiles and split kernels among
    them) computes both outputs of the reference."""
    impl_or_skip("triton")
    from triton_impl import fused_add_rms_norm_with_config, search_space

    x, r, w = inputs(5, n, torch.float32)
    want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-6)
    cands = search_space(n, 4, op="fused_add_rms_norm")
    assert {c.kernel for c in cands} >= ({"fused", "split"} if n % 4 else {"fused"})
    for cfg in cands:
        y, ro = fused_add_rms_norm_with_config(x, r, w, 1e-6, cfg)
        msg = lambda m, cfg=cfg: f"{cfg}: {m}"  # noqa: E731
        torch.testing.assert_close(y, want_y, **TOL[torch.float32], msg=msg)
        torch.testing.assert_close(ro, want_r, **TOL[torch.float32], msg=msg)


@pytest.mark.parametrize("reload", [False, True], ids=["held", "reload"])
@pytest.mark.parametrize("rdtype", [None, torch.float32])
def test_triton_sharded_waiting_schedule(rdtype, reload):
    """The fused add's waiting schedule's arithmetic under the interpreter (as the plain
    op's test: a waiting launch over the workspace a last-arrival launch completed), the
    shard held through the wait or (reload) residual_out read again, in the in-place form
    (residual_out is residual: the reload reads back this program's own stores)."""
    impl_or_skip("triton")
    import dataclasses

    from triton_impl import Config
    from triton_impl.launch import launch, plan

    x, r, w = inputs(5, 12289, torch.bfloat16, rdtype)
    want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-6)
    outs = (torch.empty_like(x), torch.empty_like(r))
    p = plan(FUSED, (x, r), w, 1e-6, outs, Config("sharded", 2048, 4, stream_y=True))
    launch(p)
    xi, ri = x.clone(), r.clone()
    args = (xi, ri, w, xi, ri, *p.args[5:])
    launch(dataclasses.replace(p, args=args, meta={**p.meta, "WAIT": True, "RELOAD": reload}))
    torch.testing.assert_close(xi, want_y, **TOL[torch.bfloat16])
    torch.testing.assert_close(ri, want_r, **TOL[rdtype or torch.bfloat16])
    assert torch.equal(xi, p.args[3])


def test_triton_fused_add_refuses_weight_first():
    """weight_first is rms_norm's fused kernel's: a forced fused-add config with it is
    refused by name, not run without it."""
    impl_or_skip("triton")
    from triton_impl import Config, fused_add_rms_norm_with_config

    x, r, w = inputs(2, 64)
    with pytest.raises(ValueError, match="weight_first is set; only rms_norm's fused kernel"):
        fused_add_rms_norm_with_config(x, r, w, 1e-6, Config("fused", 64, 1, weight_first=True))


@pytest.mark.gpu
@pytest.mark.parametrize("rdtype", [None, torch.float32])
@pytest.mark.parametrize("shape", [(2048, 65536), (300, 262143)], ids=str)
def test_triton_sharded_in_place_many_times(shape, rdtype):
    """The fused add's sharded kernel (its waiting candidates, a last-arrival one), in
    place, on many wide rows, ten times, the partial sums poisoned with NaN before each
    launch: a program that read a partial sum or residual_out before a peer stored it, or
    a store into x before a peer loaded it, shows as a wrong row in some run."""
    impl_or_skip("triton")
    from triton_impl.launch import launch, plan

    x0, r0, w = inputs(*shape, torch.bfloat16, rdtype)
    want_y, want_r = fused_add_rms_norm_ref(x0, r0, w, 1e-6)
    for cfg in sharded_to_stress(shape[1], 2):
        for _ in range(10):
            x, r = x0.clone(), r0.clone()
            p = plan(FUSED, (x, r), w, 1e-6, (x, r), cfg)
            p.args[5].fill_(float("nan"))  # the partial sums
            launch(p)
            tol = TOL[torch.bfloat16]
            torch.testing.assert_close(x, want_y, **tol, msg=lambda m, c=cfg: f"{c}: {m}")
            torch.testing.assert_close(r, want_r, **TOL[rdtype or torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4095, 4097])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_in_place_odd_rows_many_times(name, dtype, n):
    """The in-place form on odd widths (the split kernels, whose scalar edges many threads
    hold at once), many rows, twenty times: a store that overtakes another warp's load of
    the same element shows as a wrong sum in some rows of some runs (it did, at fp32 4095,
    while the stores came before the reduction)."""
    impl = impl_here(name)
    x0, r0, w = inputs(2048, n, dtype)
    y, ro = fused_add_rms_norm_ref(x0, r0, w, 1e-6)
    for _ in range(20):
        x, r = x0.clone(), r0.clone()
        impl.in_place(x, r, w, 1e-6)
        torch.testing.assert_close(r, ro, **TOL[dtype])
        torch.testing.assert_close(x, y, **TOL[dtype])


@pytest.mark.parametrize("offsets", [(0, 0, 0, 0), (3, 0, 0, 0), (0, 1, 2, 5), (3, 3, 3, 3)])
@pytest.mark.parametrize("rdtype", [None, torch.float32])
@pytest.mark.parametrize("n", [17, 1000, 4097])
def test_triton_split_kernel_any_alignment(n, rdtype, offsets):
    """The Triton fused add's split kernel (odd widths) finds x's 16-byte boundaries from its
    address and moves the other rows in vectors only when they line up too: x, residual, y
    and residual_out each at its own offset and odd row stride stay correct."""
    impl_or_skip("triton")
    from triton_impl import kernels
    from triton_impl.configs import Config, kernel_for
    from triton_impl.launch import Launch, launch

    dtype = torch.bfloat16
    rdtype = rdtype or dtype

    def rows(off, dt, fill=None):
        base = torch.randn(6, n + 5, device=DEVICE).to(dt) if fill is None else torch.full(
            (6, n + 5), fill, device=DEVICE, dtype=dt)  # fmt: skip
        return base[:, off : off + n]

    x, r = rows(offsets[0], dtype), rows(offsets[1], rdtype)
    y, ro = rows(offsets[2], dtype, math.nan), rows(offsets[3], rdtype, math.nan)
    w = (1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype)
    cfg = Config("split", 1 << (n - 1).bit_length(), 2)
    by_hand = kernels.INTERPRET and rdtype == torch.bfloat16
    kernel, meta = kernel_for(FUSED, cfg, 2, True, n, by_hand)
    strides = (x.stride(0), r.stride(0), y.stride(0), ro.stride(0))
    launch(Launch(cfg, kernel, (6,), (x, r, w, y, ro, *strides, n, 1e-6), meta))
    want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-6)
    torch.testing.assert_close(y, want_y, **TOL[dtype])
    torch.testing.assert_close(ro, want_r, **TOL[rdtype])


def test_triton_odd_widths_take_the_split_kernel():
    """Odd widths whose rows line up take the split kernel; rows that do not, or aligned
    widths, the fused tile."""
    from triton_impl.configs import fused_add_config

    assert fused_add_config(4097, 2).kernel == "split"
    assert fused_add_config(4097, 2, split_ok=False).kernel == "fused"
    assert fused_add_config(4096, 2).kernel == "fused"
    assert fused_add_config(1001, 4).kernel == "split"
    assert fused_add_config(40000, 2).kernel == "sharded"
    # fp16's wide rows read the shard again where the sweep measured that ahead; bf16 holds it
    for n in (40000, 131072):
        assert fused_add_config(n, 2, dtype="fp16").reload
        assert not fused_add_config(n, 2, dtype="bf16").reload
    assert not fused_add_config(262144, 2, dtype="fp16").reload


def test_triton_fused_add_dtype_keyed_wide_rows():
    """The dtype-keyed wide entries (fp16's reload) apply when x and the residual share
    that dtype, the case the sweep measured; an fp32 residual keeps the element-size rule."""
    impl_or_skip("triton")
    from triton_impl.launch import plan

    x = torch.randn(2, 65536, device=DEVICE).half()
    for r, reload in ((x.clone(), True), (x.float(), False)):
        p = plan(FUSED, (x, r), None, 1e-6, (torch.empty_like(x), torch.empty_like(r)))
        assert p.cfg.kernel == "sharded" and p.cfg.reload == reload, r.dtype


@pytest.mark.parametrize("name", BACKENDS)
def test_empty_rows(name):
    impl = impl_here(name)
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
            lambda x, r: torch.randn(4, 128, device=x.device).to(r.dtype)[:, ::2],
            ValueError,
            r"residual has stride 2 in its last dimension",
        ),  # fmt: skip
        (lambda x, r: r.cpu().to_sparse(), TypeError, r"residual has layout torch.sparse_coo"),
    ],
)
@pytest.mark.parametrize("form", ["functional", "in-place"])
@pytest.mark.parametrize("name", BACKENDS)
def test_residual_errors(name, make, err, what, form):
    pkg = backend(name)
    fn = pkg.fused_add_rms_norm if form == "functional" else pkg.fused_add_rms_norm_
    x, r, w = inputs(dtype=torch.bfloat16)
    if DEVICE == "cpu" and "device" in what:
        pytest.skip("x is on the CPU here: the device mismatch needs x on a GPU")
    with pytest.raises(err, match=what):
        fn(x, make(x, r), w, 1e-6)


@pytest.mark.parametrize("form", ["functional", "in-place"])
@pytest.mark.parametrize("name", BACKENDS)
def test_x_weight_eps_errors(name, form):
    """x, weight and eps get the plain op's checks and words."""
    pkg = backend(name)
    fn = pkg.fused_add_rms_norm if form == "functional" else pkg.fused_add_rms_norm_
    x, r, w = inputs()
    with pytest.raises(TypeError, match=r"x has dtype torch.int32"):
        fn(x.int(), r, w, 1e-6)
    with pytest.raises(ValueError, match=r"weight has shape \(63,\)"):
        fn(x, r, w[:63], 1e-6)
    for eps in (0.0, math.nan, 1e-50):
        with pytest.raises(ValueError, match=r"eps is"):
            fn(x, r, w, eps)


@pytest.mark.parametrize("name", BACKENDS)
def test_in_place_errors(name):
    fn = backend_here(name).fused_add_rms_norm_
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


@pytest.mark.parametrize("name", BACKENDS)
def test_backward_gives_every_gradient(name):
    """The fused op trains: x, residual and the weight get the reference's
    gradients, residual_out's own gradient included."""
    impl = impl_here(name)
    x, r, w = inputs(4, 64, torch.float32)
    for t in (x, r, w):
        t.requires_grad_(True)
    y, ro = impl.fn(x, r, w, 1e-6)
    torch.testing.assert_close(
        y, fused_add_rms_norm_ref(x.detach(), r.detach(), w.detach(), 1e-6)[0]
    )
    dy, dro = torch.randn_like(y), torch.randn_like(ro)
    torch.autograd.backward((y, ro), (dy, dro))
    want = fused_add_rms_norm_grads_ref(x.detach(), r.detach(), w.detach(), 1e-6, dy, dro)
    for got, exp, what in zip(
        (x.grad, r.grad, w.grad), want, ("dx", "dresidual", "dweight"), strict=True
    ):
        grad_close(got, exp, what)


@pytest.mark.parametrize("how", ["grad", "grad-and-weight", "func.grad", "backward"])
@pytest.mark.parametrize("name", BACKENDS)
def test_gradients_alias_as_the_native_composites_do(name, how):
    """dx and dresidual are one value. Where autograd hands them to the caller as they are
    (torch.autograd.grad, torch.func), ours are one tensor exactly where the native composite
    x + residual then F.rms_norm gives one (torch's add hands its one gradient to both
    inputs); each leaf's .grad after backward() is its own, in both."""
    impl = impl_here(name)
    x, r, w = inputs(4, 64, torch.bfloat16)
    w.requires_grad_(True)

    def native(x, r, w, eps):
        h = x + r
        return torch.nn.functional.rms_norm(h, (h.shape[-1],), w, eps), h

    def grads(fn):
        def loss(x, r):
            y, ro = fn(x, r, w, 1e-6)
            return y.float().sum() + ro.float().square().sum()

        if how == "func.grad":
            return torch.func.grad(loss, argnums=(0, 1))(x, r)
        a, b = x.clone().requires_grad_(True), r.clone().requires_grad_(True)
        if how == "backward":
            loss(a, b).backward()
            return a.grad, b.grad
        wanted = (a, b, w) if how == "grad-and-weight" else (a, b)
        return torch.autograd.grad(loss(a, b), wanted)[:2]

    (gx, gr), (nx, nr) = grads(impl.fn), grads(native)
    assert (gx.data_ptr() == gr.data_ptr()) == (nx.data_ptr() == nr.data_ptr())
    if how == "backward":
        assert gx.data_ptr() != gr.data_ptr()


@pytest.mark.parametrize("name", BACKENDS)
def test_direct_op_callers_are_checked(name):
    backend(name)
    ops = getattr(torch.ops, f"{name}_impl")
    x, r, w = inputs()
    with pytest.raises(ValueError, match=r"residual has shape"):
        ops.fused_add_rms_norm(x, r[:, :32], w, 1e-6)
    with pytest.raises(TypeError, match=r"x has dtype torch.int32"):
        ops.fused_add_rms_norm(torch.ones(4, 64, dtype=torch.int32, device="meta"), r, w, 1e-6)
    if name == "cuda" and DEVICE == "cpu":
        return  # the in-place checks come after the device check
    with pytest.raises(ValueError, match=r"x and residual overlap"):
        ops.fused_add_rms_norm_(x, x, w, 1e-6)


# bad inputs on CPU tensors: the Python checks and the C++ op's must say the same thing
def _cpu(n=64, dtype=torch.float32, rdtype=None):
    return torch.ones(4, n, dtype=dtype), torch.ones(4, n, dtype=rdtype or dtype)


FUSED_WORDING_CASES = {
    "residual-none": lambda: (_cpu()[0], None, None, 1e-6),
    "residual-shape": lambda: (_cpu()[0], torch.ones(4, 63), None, 1e-6),
    "residual-dtype": lambda: (*_cpu(dtype=torch.bfloat16, rdtype=torch.float16), None, 1e-6),
    "residual-int": lambda: (_cpu()[0], torch.ones(4, 64, dtype=torch.int32), None, 1e-6),
    "residual-device": lambda: (_cpu()[0], torch.ones(4, 64, device="meta"), None, 1e-6),
    "residual-strided": lambda: (_cpu()[0], torch.ones(4, 128)[:, ::2], None, 1e-6),
    "residual-sparse": lambda: (_cpu()[0], torch.ones(4, 64).to_sparse(), None, 1e-6),
    "x-int32": lambda: (torch.ones(4, 64, dtype=torch.int32), _cpu()[1], None, 1e-6),
    "x-strided": lambda: (torch.ones(4, 128)[:, ::2], _cpu()[1], None, 1e-6),
    "x-none": lambda: (None, _cpu()[1], None, 1e-6),
    "w-shape": lambda: (*_cpu(), torch.ones(63), 1e-6),
    "w-dtype": lambda: (*_cpu(dtype=torch.bfloat16), torch.ones(64).half(), 1e-6),
    "eps-0": lambda: (*_cpu(), None, 0.0),
    "eps-nan": lambda: (*_cpu(), None, math.nan),
    "x-cpu": lambda: (*_cpu(dtype=torch.bfloat16, rdtype=torch.float32), None, 1e-6),
}


@pytest.mark.parametrize("form", ["functional", "in-place"])
@pytest.mark.parametrize("case", FUSED_WORDING_CASES)
def test_one_wording_for_both_sides(case, form):
    backend("cuda")
    args = FUSED_WORDING_CASES[case]()
    impl = "cuda_impl.fused_add_rms_norm" + "_" * (form == "in-place")
    op = torch.ops.cuda_impl.fused_add_rms_norm_ if form == "in-place" else None
    op = op or torch.ops.cuda_impl.fused_add_rms_norm
    with pytest.raises((TypeError, ValueError)) as py_err:
        check_fused_inputs(*args, impl=impl)
    with pytest.raises((TypeError, ValueError)) as cpp_err:
        op(*args)
    assert type(cpp_err.value) is type(py_err.value)
    assert str(cpp_err.value).splitlines()[0] == str(py_err.value)


IN_PLACE_CASES = {
    "same": lambda x, r, w: (x, x, w),
    "overlap": lambda x, r, w: (lambda b: (b[:4], b[1:], w))(torch.randn(5, 64, device=x.device)),
    "weight-overlap": lambda x, r, w: (x, r, r[0]),
    "not-rows": lambda x, r, w: (
        torch.randn(5, 3, 64, device=x.device).transpose(0, 1),
        torch.randn(3, 5, 64, device=x.device),
        w,
    ),
    "grad": lambda x, r, w: (x, r, w.clone().requires_grad_(True)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", IN_PLACE_CASES)
def test_in_place_wording_for_both_sides(case):
    """The in-place form's own refusals (after the device check, so on a GPU), C++ against
    Python."""
    backend("cuda")
    x, r, w = IN_PLACE_CASES[case](*inputs(4, 64, torch.float32))
    impl = "cuda_impl.fused_add_rms_norm_"
    with pytest.raises(ValueError) as py_err:
        check_fused_inputs(x, r, w, 1e-6, impl=impl)
        check_in_place(x, r, w, impl=impl)
    with pytest.raises(ValueError) as cpp_err:
        torch.ops.cuda_impl.fused_add_rms_norm_(x, r, w, 1e-6)
    assert str(cpp_err.value).splitlines()[0] == str(py_err.value)


def test_cuda_fakes_under_tracing():
    """Under FakeTensorMode (what torch.compile traces with) the CUDA fused ops' fakes check
    the arguments and give outputs of the right dtypes, with no GPU needed."""
    backend("cuda")
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = torch.ops.cuda_impl
    with FakeTensorMode():
        try:
            x = torch.empty(4, 64, device="cuda", dtype=torch.bfloat16)
        except (RuntimeError, AssertionError) as e:  # a torch without CUDA at all
            pytest.skip(f"cannot make fake CUDA tensors here: {e}")
        r = torch.empty(4, 64, device="cuda", dtype=torch.float32)
        y, ro = ops.fused_add_rms_norm(x, r, None, 1e-6)
        assert (y.dtype, ro.dtype, y.shape, ro.shape) == (x.dtype, r.dtype, x.shape, x.shape)
        with pytest.raises(ValueError, match=r"residual has shape"):
            ops.fused_add_rms_norm(x, r[:, :8], None, 1e-6)
        with pytest.raises(ValueError, match=r"x and residual overlap"):
            ops.fused_add_rms_norm_(r, r, None, 1e-6)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("rdtype", [None, torch.float32])
def test_module_takes_a_residual(name, rdtype):
    """RMSNorm(n)(x, residual) is the fused add: (y, residual_out); without it, the plain
    op; eps=None is x's dtype's eps, as torch.nn.RMSNorm's."""
    pkg = backend_here(name)
    x, r, w = inputs(3, 1000, torch.bfloat16, rdtype)
    m = pkg.RMSNorm(1000, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(w)
    y, ro = m(x, r)
    want_y, want_r = fused_add_rms_norm_ref(x, r, w, torch.finfo(torch.bfloat16).eps)
    torch.testing.assert_close(y, want_y, **TOL[torch.bfloat16])
    torch.testing.assert_close(ro, want_r, **TOL[ro.dtype])
    eps = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(m(x), rms_norm_ref(x, w, eps), **TOL[torch.bfloat16])
    with pytest.raises(ValueError, match=r"residual has shape"):
        m(x, r[:, :10])


# ---- the ops -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BACKENDS)
def test_opcheck(name):
    impl_here(name)
    ops = getattr(torch.ops, f"{name}_impl")
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
@pytest.mark.parametrize("name", BACKENDS)
def test_compile_fullgraph(name):
    pkg = backend_here(name)

    def block(x, r, w):  # the op between ordinary ops, as in a pre-norm layer
        y, r = pkg.fused_add_rms_norm(x * 2.0, r, w, 1e-6)
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
@pytest.mark.parametrize("name", BACKENDS)
def test_cuda_graph_in_place_allocates_no_output(name):
    """The in-place form captured in a CUDA graph (as vLLM runs it), replayed on new data;
    capturing it allocates no output (what the capture does allocate is far below one
    output's bytes: docs/notebook/04-the-fused-add.md, v10)."""
    pkg = backend_here(name)
    x, r, w = inputs(32, 4096, torch.bfloat16)
    pkg.fused_add_rms_norm_(x, r, w, 1e-6)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    before = torch.cuda.memory_allocated()
    with torch.cuda.graph(g):
        pkg.fused_add_rms_norm_(x, r, w, 1e-6)
    assert torch.cuda.memory_allocated() - before < x.nbytes // 8
    x0, r0 = torch.randn_like(x), torch.randn_like(r)
    x.copy_(x0)
    r.copy_(r0)
    g.replay()
    torch.cuda.synchronize()
    want_y, want_r = fused_add_rms_norm_ref(x0, r0, w, 1e-6)
    torch.testing.assert_close(x, want_y, **TOL[torch.bfloat16])
    torch.testing.assert_close(r, want_r, **TOL[torch.bfloat16])


@pytest.mark.gpu
def test_cuda_ops_that_write_bump_versions():
    """The CUDA ops that write their arguments bump those tensors' versions, so autograd
    refuses a tensor it saved and that was overwritten since (no stale gradients)."""
    import cuda_impl

    x, r, w = inputs(4, 64, torch.float32)
    v = (x._version, r._version)
    cuda_impl.fused_add_rms_norm_(x, r, w, 1e-6)
    assert x._version > v[0] and r._version > v[1]
    out = torch.empty_like(x)
    v = out._version
    cuda_impl.rms_norm(x, w, 1e-6, out=out)
    assert out._version > v
    a = torch.randn(4, 64, device=DEVICE, requires_grad=True)
    loss = (a * x).sum()  # saves x for a's gradient
    cuda_impl.fused_add_rms_norm_(x, r, w, 1e-6)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
        loss.backward()


# ---- the CUDA fused add's configs ---------------------------------------------------------


def test_cuda_fused_configs_listed():
    """The fused add's own rung table read back: its shipped configs, the default rule's
    choice among them, and a clear error for an op without a table."""
    backend("cuda")
    from cuda_impl import configs as C

    table = C.compiled_configs("fused_add_rms_norm")
    shipped = {(c.row_threads, c.vpt, c.cluster, c.variant) for c in table if c.shipped}
    assert len(shipped) == len(table) - sum(not c.shipped for c in table) >= 10
    for n, elem in ((128, 2), (4096, 2), (5120, 4), (32768, 2), (262144, 4)):
        cfg = C.default_config(n, elem, op="fused_add_rms_norm")
        assert (cfg.row_threads, cfg.vpt, cfg.cluster > 1, cfg.variant) in shipped
        assert cfg.holds(n, elem)
    assert C.search_space(4096, 2, op="fused_add_rms_norm")
    # 16-bit rows of whole vectors from 20480 elements: two staged CTAs a row (fp32, and
    # rms_norm, from 32768)
    whole = C.variant_bits()["whole_vectors"]
    for n in (20480, 24576, 32768):
        cfg = C.default_config(n, 2, op="fused_add_rms_norm")
        assert cfg.variant & whole and cfg.cluster == 2, (n, cfg)
    for n, elem, op in ((16384, 2, "fused_add_rms_norm"), (24576, 4, "fused_add_rms_norm"),
                        (24576, 2, "rms_norm")):  # fmt: skip
        assert not C.default_config(n, elem, op=op).variant & whole, (n, elem, op)
    with pytest.raises(ValueError, match=r"op is 'backward'"):
        C.compiled_configs("backward")
    with pytest.raises(ValueError, match=r"default_config: op is 'backward'"):
        C.default_config(4096, 2, op="backward")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["aligned", "fp32-residual", "fp32-weight", "offset-residual"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_cuda_fused_staged_any_row(dtype, layout):
    """The fused add's staged whole-vector clusters: on 2 and 16 CTAs, at their full width
    (at most MAX_N), at uneven slices and (16 CTAs) at 9 vectors, with the residual of x's
    dtype or fp32, a weight of x's dtype or fp32, and a residual one element off its 16-byte
    alignment (the general body); both outputs against the reference."""
    impl_or_skip("cuda")
    import cuda_impl
    from cuda_impl import configs as C

    staged = [
        c
        for c in C.compiled_configs("fused_add_rms_norm")
        if c.variant & C.variant_bits()["whole_vectors"]
    ]
    assert staged
    vec = 16 // torch.empty(0, dtype=dtype).element_size()
    rdtype = torch.float32 if layout == "fp32-residual" else dtype
    for c in staged:
        most = C.max_cluster(c.variant)
        for ranks in (2, most):
            cfg = C.Config(c.row_threads, c.vpt, ranks, c.variant)
            for n in cluster_widths(c.row_threads, c.vpt, ranks, most, vec):
                x, r, w = inputs(3, n, dtype, rdtype)
                if layout == "fp32-weight":
                    w = w.float()
                if layout == "offset-residual":
                    r = torch.randn(3, n + 1, device=DEVICE).to(rdtype)[:, 1:]
                y, ro = cuda_impl.fused_add_rms_norm_with_config(x, r, w, 1e-6, cfg)
                want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-6)
                torch.testing.assert_close(y, want_y, **TOL[dtype], msg=f"{cfg} N={n}")
                torch.testing.assert_close(ro, want_r, **TOL[rdtype], msg=f"{cfg} N={n}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_fused_every_config_matches_reference(dtype):
    """Every compiled fused config, forced, at an odd width it holds: both outputs against
    the reference; a shipped config not compiled for x's dtype is refused by name."""
    import cuda_impl
    from cuda_impl import configs as C

    elem = torch.finfo(dtype).bits // 8
    for c in C.compiled_configs("fused_add_rms_norm"):
        ranks = 2 if c.cluster else 1
        cfg = C.Config(c.row_threads, c.vpt, ranks, c.variant)
        n = max(1, c.row_threads * c.vpt * ranks * 16 // elem - 3)
        x, r, w = inputs(6, n, dtype)
        try:
            y, ro = cuda_impl.fused_add_rms_norm_with_config(x, r, w, 1e-6, cfg)
        except ValueError as e:
            assert c.shipped and "compiled only for the dtypes" in str(e), (cfg, e)
            continue
        want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-6)
        torch.testing.assert_close(y, want_y, **TOL[dtype], msg=lambda m, cfg=cfg: f"{cfg}: {m}")
        torch.testing.assert_close(ro, want_r, **TOL[dtype])
    with pytest.raises(ValueError, match=r"no compiled config \(3, 1"):
        cuda_impl.fused_add_rms_norm_with_config(x, r, w, 1e-6, C.Config(3, 1))
