"""The kernels are real PyTorch ops: opcheck, torch.compile(fullgraph=True), CUDA graphs."""

import importlib
import itertools

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import DEVICE, HAS_GPU, impl_or_skip
from harness.reference import TOL, rms_norm_ref

OPS = {"triton": "triton_impl", "cuda": "cuda_impl"}
GPU_IMPLS = ["triton", pytest.param("cuda", marks=pytest.mark.gpu)]


def inputs(dtype=torch.bfloat16, n=4097, m=8):
    x = torch.randn(m, n, device=DEVICE).to(dtype)
    w = torch.randn(n, device=DEVICE).to(dtype)
    return x, w


@pytest.mark.parametrize("name", GPU_IMPLS)
def test_opcheck(name):
    impl_or_skip(name)
    ns = getattr(torch.ops, OPS[name])
    # The Triton interpreter computes on host copies, which fake tensors cannot follow:
    # on CPU only the schema and autograd-registration checks apply; on a GPU, all.
    utils = None if HAS_GPU else ("test_schema", "test_autograd_registration")
    for dtype in (torch.float32, torch.bfloat16):
        x, w = inputs(dtype)
        kw = {} if utils is None else {"test_utils": utils}
        torch.library.opcheck(ns.rms_norm.default, (x, w, 1e-6), **kw)
        torch.library.opcheck(ns.rms_norm.default, (x, None, 1e-5), **kw)
        out = torch.empty_like(x)
        torch.library.opcheck(ns.rms_norm_out.default, (out, x, w, 1e-6), **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_compile_fullgraph(name):
    impl = impl_or_skip(name)

    def block(x, w):  # the op between ordinary ops, as in a model
        return impl.fn(x * 2.0, w, 1e-6) + 1.0

    # (n, m): the split kernel's rows, and rows of the looped kernel (its width a constexpr
    # the launch passes as a keyword), for few rows and for many; a fresh compile a shape
    # (dynamo's recompile limit is 8)
    shapes = ((4097, 8), (16384, 8), (4096, 512))
    for (n, m), dtype in itertools.product(shapes, (torch.float32, torch.float16, torch.bfloat16)):
        if dtype == torch.float32:
            torch._dynamo.reset()
            compiled = torch.compile(block, fullgraph=True, dynamic=False)
        x, w = inputs(dtype, n=n, m=m)
        got = compiled(x, w)
        # Against eager and the reference: y's 1-ulp tolerance, plus 1 ulp of the + 1.0 (a
        # rounding flip of y near -1 is a large relative error of y + 1). Not bit-equal to
        # eager: inductor recompiles the kernel with its own specialisation, which can
        # change the vector width and so the order of the fp32 sum (measured on the H200:
        # differences of 1e-6 in fp32).
        tol = TOL[dtype]
        atol = tol["atol"] + torch.finfo(dtype).eps
        want = rms_norm_ref(x * 2.0, w, 1e-6) + 1.0
        torch.testing.assert_close(got, block(x, w), rtol=tol["rtol"], atol=atol)
        torch.testing.assert_close(got, want, rtol=tol["rtol"], atol=atol)


#: Every public function and form, called on (x, r, w, dy) through a backend (_Backend):
#: what it returns, and (the forms that write) the tensors it writes.
PUBLIC_FORMS = {
    "rms_norm": lambda b, x, r, w, dy: b.mod.rms_norm(x, w, 1e-6),
    "rms_norm out=": lambda b, x, r, w, dy: b.mod.rms_norm(x, w, 1e-6, out=dy),
    "rms_norm out=x": lambda b, x, r, w, dy: b.mod.rms_norm(x, w, 1e-6, out=x),
    "fused_add_rms_norm": lambda b, x, r, w, dy: b.mod.fused_add_rms_norm(x, r, w, 1e-6),
    "fused_add_rms_norm_": lambda b, x, r, w, dy: b.mod.fused_add_rms_norm_(x, r, w, 1e-6),
    "rms_norm_backward": lambda b, x, r, w, dy: b.mod.rms_norm_backward(dy, x, w, 1e-6),
    "fused_add_rms_norm_backward": lambda b, x, r, w, dy: b.mod.fused_add_rms_norm_backward(
        dy, x, r, w, 1e-6
    ),
    "RMSNorm": lambda b, x, r, w, dy: b.norm(x),
    "RMSNorm fused": lambda b, x, r, w, dy: b.norm(x, r),
}


class _Backend:
    """A backend's module and an RMSNorm module of it (built outside the compiled code)."""

    def __init__(self, mod, n: int, dtype):
        self.mod = mod
        self.norm = mod.RMSNorm(n, eps=1e-6, device=DEVICE, dtype=dtype)


#: The forms autograd differentiates: what a training step compiles.
GRAD_FORMS = ["rms_norm", "fused_add_rms_norm", "RMSNorm", "RMSNorm fused"]
#: Backends: on a GPU Inductor itself; on CPU (the Triton interpreter) aot_eager, which
#: traces the ops' fakes and functionalises the forms that write as Inductor does.
COMPILE_BACKEND = "inductor" if HAS_GPU else "aot_eager"


@pytest.mark.parametrize("form", PUBLIC_FORMS)
@pytest.mark.parametrize("name", GPU_IMPLS)
def test_every_public_form_compiles_fullgraph(name, form):
    """Each public function, each form (plain, out=, fused, in place, the backward ops, the
    module; with gradients through autograd where it has them) compiles without a graph
    break and computes what it computes in eager, the tensors it writes included."""
    impl_or_skip(name)
    call = PUBLIC_FORMS[form]
    dtype = torch.bfloat16 if HAS_GPU else torch.float32
    m, n = 6, 1000
    backend = _Backend(importlib.import_module(OPS[name]), n, dtype)
    fresh = [torch.randn(m, n, device=DEVICE).to(dtype) for _ in range(2)]
    fresh += [(1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype), torch.randn(m, n).to(fresh[0])]
    grad = form in GRAD_FORMS

    def run(fn):
        args = [t.clone().requires_grad_(grad and i < 3) for i, t in enumerate(fresh)]
        got = fn(backend, *args)
        got = got if isinstance(got, tuple) else (got,)
        if grad:
            outs = [g for g in got if g is not None]
            torch.autograd.backward(outs, [torch.ones_like(g) for g in outs])
            got += tuple(a.grad for a in args[: 2 if form.startswith("rms") else 3])
        return [g for g in got if g is not None] + args  # the inputs: what a form writes

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, dynamic=False, backend=COMPILE_BACKEND)
    want = run(call)
    for got, ref in zip(run(compiled), want, strict=True):
        if ref is not None:
            torch.testing.assert_close(got, ref, **TOL[dtype])


#: Forms that write, with what they write overlapping what they read, and the refusal:
#: compiled, as eagerly (the checks run on the traced tensors, in the op's fake or body).
OVERLAPPING_WRITES = {
    "out partially overlaps x": lambda b, buf, w: b.mod.rms_norm(buf[:-1], w, 1e-6, out=buf[1:]),
    "x and residual overlap": lambda b, buf, w: b.mod.fused_add_rms_norm_(
        buf[:-1], buf[1:], w, 1e-6
    ),
}


@pytest.mark.parametrize("refusal", OVERLAPPING_WRITES)
@pytest.mark.parametrize("name", GPU_IMPLS)
def test_compiled_forms_refuse_overlapping_writes(name, refusal):
    impl_or_skip(name)
    n = 64
    backend = _Backend(importlib.import_module(OPS[name]), n, torch.float32)
    buf, w = torch.randn(5, n, device=DEVICE), torch.randn(n, device=DEVICE)
    call = OVERLAPPING_WRITES[refusal]
    with pytest.raises(ValueError, match=refusal):
        call(backend, buf, w)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, dynamic=False, backend=COMPILE_BACKEND)
    with pytest.raises(Exception, match=refusal):  # dynamo wraps it, the message kept
        compiled(backend, buf, w)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_cuda_graph_capture(name):
    impl = impl_or_skip(name)
    x, w = inputs(torch.bfloat16, n=4096, m=32)
    out = torch.full_like(x, float("nan"))
    impl.fn(x, w, 1e-6, out=out)  # warm up (Triton JIT) outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        impl.fn(x, w, 1e-6, out=out)
    x.copy_(torch.randn_like(x))  # fresh data through the captured pointers
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6), **TOL[torch.bfloat16])


FAST_CASES = [
    (1, 4096, torch.bfloat16, torch.bfloat16, 0),  # decode: one row
    (37, 4097, torch.float16, torch.float32, 0),  # odd width, fp32 weight, few rows
    (3000, 1000, torch.bfloat16, None, 0),  # many rows, no weight
    (513, 5120, torch.float32, torch.float32, 8),  # strided rows
    (300, 65536, torch.bfloat16, torch.bfloat16, 0),  # wide rows
]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
@pytest.mark.parametrize("m, n, dtype, wdtype, pad", FAST_CASES)
def test_eager_fast_path_repeats(name, m, n, dtype, wdtype, pad):
    """Eager calls take the fast path (Triton: the cached compiled kernel launched directly;
    CUDA: the op without the Python checks). Fresh inputs each call: the first call
    compiles, the repeats reuse it, and every result is the reference's."""
    impl = impl_or_skip(name)
    if name == "triton":
        from triton_impl import eager, launch

        eager.PLANS.clear()  # what this case caches, not what earlier cases left
    for _ in range(3):
        x = torch.randn(m, n + pad, device=DEVICE).to(dtype)[:, :n]
        w = None if wdtype is None else (1 + torch.randn(n, device=DEVICE)).to(wdtype)
        torch.testing.assert_close(impl.fn(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **TOL[dtype])
    if name == "triton":
        plans = [p for p in eager.PLANS.values() if p.compiled]
        y = torch.empty_like(x)
        if not launch.plan("rms_norm", (x,), w, 1e-6, (y,)).reusable:
            assert not plans, "a launch with a workspace of its own was cached"
            return
        assert plans, "the fast path cached no plan with a compiled kernel"
        assert all(all(p.compiled.values()) for p in plans) == eager.DIRECT


def _fake_compiled(record: list, **launcher_attrs):
    """A compiled kernel whose launcher is the installed Triton's CUDA launcher class, its
    C function replaced by one that records what it is given."""
    from types import SimpleNamespace

    from triton.backends.nvidia.driver import CudaLauncher

    launcher = object.__new__(CudaLauncher)
    attrs = dict(global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                 profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=False,
                 num_ctas=1, gsan_enabled=False, arg_annotations=("annotations",),
                 kernel_signature=b"signature")  # fmt: skip
    attrs.update(launcher_attrs)
    for k, v in attrs.items():
        setattr(launcher, k, v)
    launcher.launch = lambda *args: record.append(args)
    return SimpleNamespace(run=launcher, function=1234, packed_metadata=(4, 1, 0),
                           launch_metadata=lambda *a: None)  # fmt: skip


@pytest.mark.parametrize("scratch", [0, 64], ids=["lean", "scratch"])
def test_direct_launch_passes_what_the_launcher_would(monkeypatch, scratch):
    """The eager path's direct launch gives the launcher's C function exactly what the
    installed Triton's launcher would (the pointers as integers, which the launcher takes
    as they are); a launcher with scratch memory to allocate is called whole."""
    from triton_impl import eager

    if not eager.DIRECT:
        pytest.skip(f"no direct launch with this Triton ({eager.triton.__version__})")
    monkeypatch.setattr(eager, "_cuda_stream", lambda device: 77)
    # the launcher's __call__ reads the active driver (3.8), which a machine without a GPU
    # has not: a stand-in, never used with no scratch to allocate
    monkeypatch.setattr(eager.triton.runtime.driver, "_active", object())
    x, w = torch.ones(2, 8), torch.ones(8)
    y = torch.empty_like(x)
    tensors, ptrs, rest = (x, w, y), [4096, 8192, 12288], (8, 8, 2, 1e-6, 16, 4)
    theirs: list = []
    launcher = _fake_compiled(theirs).run
    launcher(5, 1, 1, 77, 1234, (4, 1, 0), None, None, None, *ptrs, *rest)
    ours: list = []
    d = eager._Direct(_fake_compiled(ours, global_scratch_size=scratch))
    if scratch:  # the launcher whole: it allocates, from the tensors
        monkeypatch.setattr(d.compiled, "run", lambda *args: ours.append(args))
        eager._run_compiled(d, (5,), tensors, ptrs, rest, 0)
        assert d.launch is None
        assert ours == [(5, 1, 1, 77, 1234, (4, 1, 0), None, None, None, *tensors, *rest)]
        return
    eager._run_compiled(d, (5,), tensors, ptrs, rest, 0)
    assert ours == theirs and len(ours) == 1


def test_a_launch_hook_takes_the_launcher_whole(monkeypatch):
    """With a launch hook set (a plain callable, or a chain with calls) a hit launches
    through the compiled kernel's launcher whole, with the tensors and the launch
    metadata, as JITFunction.run does; an empty chain counts as no hook."""
    from triton_impl import eager

    if not eager.DIRECT:
        pytest.skip(f"no direct launch with this Triton ({eager.triton.__version__})")
    monkeypatch.setattr(eager, "_cuda_stream", lambda device: 77)
    x, w = torch.ones(2, 8), torch.ones(8)
    tensors, ptrs, rest = (x, w, torch.empty_like(x)), [4096, 8192, 12288], (8, 8, 2, 1e-6)
    direct: list = []
    d = eager._Direct(_fake_compiled(direct))
    whole: list = []
    monkeypatch.setattr(d.compiled, "run", lambda *args: whole.append(args))
    monkeypatch.setattr(d.compiled, "launch_metadata", lambda *args: "metadata")
    runtime = eager.triton.knobs.runtime
    leave = eager._hook(runtime.launch_exit_hook)

    def hook(*args):
        return None

    monkeypatch.setattr(runtime, "launch_enter_hook", hook)
    eager._run_compiled(d, (5,), tensors, ptrs, rest, 0)
    assert not direct
    assert whole == [(5, 1, 1, 77, 1234, (4, 1, 0), "metadata", hook, leave, *tensors, *rest)]
    monkeypatch.setattr(runtime, "launch_enter_hook", None)
    eager._run_compiled(d, (5,), tensors, ptrs, rest, 0)
    assert len(direct) == (1 if leave is None else 0)


class _Recording:
    """A mode that records the name of every call it sees, then runs it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def _run(self, func, args, kwargs):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class Seen(_Recording, TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._run(func, args, kwargs)


class Passing(_Recording, TorchFunctionMode):  # the base class refuses every call
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self._run(func, args, kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_fast_path_skips_nothing(name):
    """Each backend's eager calls, fast path or not, give the reference's result with
    gradients flowing, and are seen by dispatch modes, torch function modes and
    torch.jit.trace; negative views are normalised as their values, and zero tensors as
    theirs or refused by name."""
    impl = impl_or_skip(name)
    ns = OPS[name]
    fused = importlib.import_module(ns).fused_add_rms_norm
    x, w = inputs(torch.bfloat16, n=4096, m=8)
    tol = TOL[torch.bfloat16]
    r = torch.randn_like(x)
    wg = w.clone().requires_grad_()
    with torch.no_grad():
        y = impl.fn(x, wg, 1e-6)
    assert y.grad_fn is None
    torch.testing.assert_close(y, rms_norm_ref(x, w, 1e-6), **tol)
    y = impl.fn(x, wg, 1e-6)  # through autograd
    y.float().sum().backward()
    assert wg.grad is not None and torch.isfinite(wg.grad).all()
    y2, ro = fused(x, r, wg)
    assert y2.grad_fn is not None and ro.grad_fn is not None

    with Seen() as mode:
        impl.fn(x, w, 1e-6)
        fused(x, r, w)
    assert {f"{ns}.rms_norm.default", f"{ns}.fused_add_rms_norm.default"} <= set(mode.seen)
    with Passing() as mode:
        torch.testing.assert_close(impl.fn(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **tol)
    assert any(f"{ns}.rms_norm" in s for s in mode.seen), mode.seen
    # bits the keys above the kernel resolve: a negative view, a zero tensor (no storage)
    neg = torch._neg_view(x)
    torch.testing.assert_close(impl.fn(neg, w, 1e-6), rms_norm_ref(-x, w, 1e-6), **tol)
    neg_w = torch._neg_view(w)
    torch.testing.assert_close(impl.fn(x, neg_w, 1e-6), rms_norm_ref(x, -w, 1e-6), **tol)
    # a zero tensor (no storage, stride 0): its value, or the stride check's error
    zero = torch._efficientzerotensor(x.shape, dtype=x.dtype, device=x.device)
    try:
        got = impl.fn(zero, w, 1e-6)
    except ValueError as e:
        assert "x has stride 0" in str(e), e
    else:
        assert torch.equal(got, torch.zeros_like(x))
    # torch.jit.trace records the op (a bypass would leave it out of the graph)
    traced = torch.jit.trace(lambda t: impl.fn(t, w, 1e-6), (x,), check_trace=False)
    assert f"{ns}::rms_norm" in str(traced.graph)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_cuda_graph_capture_functional(name):
    """The functional (fast-path) form inside a captured graph, replayed on new data."""
    impl = impl_or_skip(name)
    x, w = inputs(torch.bfloat16, n=4096, m=8)
    impl.fn(x, w, 1e-6)  # warm up outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = impl.fn(x, w, 1e-6)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, rms_norm_ref(x, w, 1e-6), **TOL[torch.bfloat16])


PLAN_CASES = {
    "2d": lambda: torch.randn(37, 4097, device=DEVICE),
    "strided-rows": lambda: torch.randn(33, 1000 + 11, device=DEVICE)[:, 3 : 3 + 1000],
    "3d": lambda: torch.randn(3, 5, 4096, device=DEVICE),
    "3d-transposed": lambda: torch.randn(5, 3, 512, device=DEVICE).transpose(0, 1),
    "4d-transposed": lambda: torch.randn(3, 2, 4, 512, device=DEVICE).transpose(0, 1),
    "one-row": lambda: torch.randn(1, 8192, device=DEVICE),
}


@pytest.mark.parametrize("case", PLAN_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("weight", ["same", "fp32", None])
def test_triton_eager_plan_cache(case, dtype, weight):
    """The Triton eager path's plan cache (on CPU through the interpreter, on a GPU with the
    compiled kernels): the first call plans and checks, repeats reuse the plan with fresh
    tensors, every result is the reference's, and a plan is kept only when x is used in
    place (a 3-D transposed batch is read where it lies, as heads; a 4-D one whose batch
    and tokens do not merge is copied by reshape, so it is planned on every call)."""
    impl_or_skip("triton")
    from triton_impl import eager

    eager.PLANS.clear()
    for _ in range(3):
        x = PLAN_CASES[case]().to(dtype)
        n = x.shape[-1]
        w = None if weight is None else (1 + torch.randn(n, device=DEVICE))
        w = w if weight != "same" or w is None else w.to(dtype)
        got = eager.eager_forward(x, None, w, 1e-6, "triton_impl.rms_norm")
        torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **TOL[dtype])
    assert len(eager.PLANS) == (0 if case == "4d-transposed" else 1)
    for eps in (float("nan"), 1e-50, 1e39):  # a cached plan still checks eps
        with pytest.raises(ValueError, match="eps is"):
            eager.eager_forward(x, None, w, eps, "triton_impl.rms_norm")


@pytest.mark.parametrize("case", [c for c in PLAN_CASES if not c.endswith("-transposed")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("rdtype", ["same", "fp32"])
@pytest.mark.parametrize("weight", ["same", None])
def test_triton_eager_fused_add_plan_cache(case, dtype, rdtype, weight):
    """The functional fused add through the same plan cache: one plan for x's and the
    residual's layout, reused with fresh tensors, every result the reference's; a cached
    plan still checks eps, and a residual of another layout is planned (and checked) anew."""
    impl_or_skip("triton")
    from harness.reference import fused_add_rms_norm_ref
    from triton_impl import eager

    eager.PLANS.clear()
    for _ in range(3):
        x = PLAN_CASES[case]().to(dtype)
        r = torch.randn(x.shape, device=DEVICE).to(dtype if rdtype == "same" else torch.float32)
        n = x.shape[-1]
        w = None if weight is None else (1 + torch.randn(n, device=DEVICE)).to(dtype)
        y, ro = eager.eager_forward(x, r, w, 1e-6, "triton_impl.fused_add_rms_norm")
        want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-6)
        torch.testing.assert_close(y, want_y, **TOL[dtype])
        torch.testing.assert_close(ro, want_r, **TOL[r.dtype])
    assert len(eager.PLANS) == 1
    for eps in (float("nan"), 1e-50, 1e39):
        with pytest.raises(ValueError, match="eps is"):
            eager.eager_forward(x, r, w, eps, "triton_impl.fused_add_rms_norm")
    with pytest.raises(ValueError, match="residual"):  # another layout: checked, not cached
        eager.eager_forward(x, r[..., :-1], w, 1e-6, "triton_impl.fused_add_rms_norm")
    eager.PLANS.clear()


@pytest.mark.parametrize("why", ["switched off", "unverified triton"])
def test_triton_eager_fallback_launch(monkeypatch, why):
    """With the direct launch off (RMSNORM_TRITON_FAST_LAUNCH=0, or a Triton version it
    was not verified with) the fast path launches through Triton's public launcher: same
    results, never a direct launch."""
    impl_or_skip("triton")
    import triton

    from triton_impl import eager

    if why == "switched off":
        monkeypatch.setenv("RMSNORM_TRITON_FAST_LAUNCH", "0")
    else:
        monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert not eager.direct_launch_ok()
    monkeypatch.setattr(eager, "DIRECT", eager.direct_launch_ok())

    def no_direct(*a, **k):
        raise AssertionError("launched directly although the direct launch is off")

    monkeypatch.setattr(eager, "_run_compiled", no_direct)
    eager.PLANS.clear()
    for _ in range(3):  # a miss, then hits
        x = torch.randn(33, 4097, device=DEVICE).to(torch.bfloat16)
        w = (1 + torch.randn(4097, device=DEVICE)).to(x.dtype)
        got = eager.eager_forward(x, None, w, 1e-6, "triton_impl.rms_norm")
        torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **TOL[x.dtype])
    (plan,) = eager.PLANS.values()
    assert not plan.direct and not any(plan.compiled.values())
    eager.PLANS.clear()


def _entry_or_skip():
    from rmsnorm_api import host

    e = host.entry()
    if e is None:
        pytest.skip("no eager entry points: the extension is not built by setup.py")
    return e


@pytest.mark.parametrize("case", ["lean", "no weight", "fused", "cluster", "pdl",
                                  "unaligned out", "fp64 arg", "uncompiled launcher"])  # fmt: skip
def test_keep_hands_cpp_the_launchers_parameters(monkeypatch, case):
    """What Python hands the C++ entry point of a directly launched plan (eager._keep): the
    compiled kernel's parameters as Triton's launcher passes them (the signature's
    non-constexpr arguments in order: a tensor's slot, an int and its width, eps), its
    function, grid, warps and shared memory; nothing where that launch would not be all
    Triton's launcher does (clusters, PDL, an output off the 16-byte grid, an argument
    type it does not pass, a launcher with more to do)."""
    from types import SimpleNamespace

    from triton_impl import eager

    kept = []
    monkeypatch.setattr(eager, "HOST", SimpleNamespace(triton_keep=lambda *a: kept.append(a)))
    fused = case == "fused"
    names = ["x", "r", "w", "y", "ro"] if fused else ["x", "w", "y"]
    signature = {n: "*bf16" for n in names}
    signature.update(M="i32", one="constexpr", stride="i64", eps="fp32", BLOCK="constexpr")
    if case == "fp64 arg":
        signature["eps"] = "fp64"
    md = SimpleNamespace(num_warps=8, num_ctas=2 if case == "cluster" else 1, shared=1024,
                         launch_pdl=case == "pdl", launch_cooperative_grid=False)  # fmt: skip
    compiled = SimpleNamespace(metadata=md, src=SimpleNamespace(signature=signature))
    d = SimpleNamespace(compiled=compiled, function=1234,
                        launch=None if case == "uncompiled launcher" else print)  # fmt: skip
    p = eager._Plan(None, (77,), len(names), (300, 1, 4096), {}, (True,), case != "no weight")
    x, w = torch.ones(2, 8), torch.ones(8)
    tensors = (x, x, w, x, x) if fused else (x, w, x)
    align = (True,) * (len(tensors) - 1) + (case != "unaligned out",)
    eager._keep(p, d, tensors, align)
    if case not in ("lean", "no weight", "fused"):
        assert kept == []
        return
    ((kx, kr, kw, function, grid, warps, shared, args),) = kept
    k = len(names)
    assert (kx, function, grid, warps, shared) == (x, 1234, 77, 8, 1024)
    assert kr is (x if fused else None) and kw is (None if case == "no weight" else w)
    assert args == [(0, i) for i in range(k)] + [(1, 300), (2, 4096), (3, 0)]


@pytest.mark.gpu
def test_bypass_only_where_nothing_is_skipped():
    """The eager fast paths' test, in Python (rmsnorm_api.bypass_ok, which the backends ask
    without the extension's entry points) and in C++ (the entry points of fast_entry.cpp,
    which run the call or return None): it holds only when nothing needs a gradient and
    nothing the dispatcher's keys would do is there: functorch, torch function or dispatch
    modes, jit tracing, negative or zero-tensor bits, nested, sparse or CPU tensors, a
    Parameter as x; the entry points also want eps a Python float. The two agree but on
    forward-mode AD: bypass_ok refuses any open dual level, the entry points only tensors
    with a tangent (a tensor without one gets none either way)."""
    import torch.autograd.forward_ad as fwAD

    import triton_impl
    from rmsnorm_api import bypass_ok, host
    from triton_impl import eager

    e = host.entry()
    x, w = inputs(torch.bfloat16, n=4096, m=8)
    r = torch.randn_like(x)
    triton_impl.rms_norm(x, w, 1e-6)  # a plan kept for the Triton entry point
    tol = TOL[torch.bfloat16]

    def runs(x, w, eps=1e-6, python=True):
        """Whether the call may skip the dispatcher: bypass_ok's answer (python), and each
        entry point's (they agree with it), their results checked."""
        got = [] if e is None else [e.rms_norm(x, w, eps, 0.0)]
        if eager.HOST is not None:
            got.append(eager.HOST.triton_rms_norm(x, w, eps))
        ran = bool(bypass_ok(x, w)) if python else None
        for y in got:
            if ran is None:
                ran = y is not None
            assert (y is not None) == ran, "an entry point and bypass_ok disagree"
            if y is not None:
                torch.testing.assert_close(y, rms_norm_ref(x, w, 1e-6), **tol)
        return ran

    assert runs(x, w) and bypass_ok(x, r, w) and bypass_ok(x, None)
    if e is not None:  # eps not a float: the Python paths convert or refuse it
        assert not runs(x, w, 1, python=False) and not runs(x, w, torch.tensor(1e-6), False)
        assert e.rms_norm(x, w, 1e-6, 1) is None  # nor a weight offset that is not one
    wg = w.clone().requires_grad_()
    assert not runs(x, wg)
    with torch.no_grad():
        assert runs(x, wg)
    r.requires_grad_()
    assert not bypass_ok(x, r, w)
    with torch.no_grad():
        assert bypass_ok(x, r, wg)
    assert not runs(x.cpu(), w) and not runs(x, w.cpu())
    assert not runs(torch.nn.Parameter(x, requires_grad=False), w)
    assert runs(x, torch.nn.Parameter(w, requires_grad=False))
    assert not runs(torch._neg_view(x), w) and not runs(x, torch._neg_view(w))
    zero = torch._efficientzerotensor(x.shape, dtype=x.dtype, device=x.device)
    assert not runs(zero, w)
    assert not runs(torch.nested.nested_tensor([x[0], x[1]]), w)
    assert not runs(x.to_sparse(), w)
    with Seen():
        assert not runs(x, w)
    with Passing():
        assert not runs(x, w)
    flags = []

    def f(t):
        flags.append(runs(t, w))
        return t * 2

    torch.func.vmap(f)(x)
    assert flags == [False]
    traced = []
    torch.jit.trace(lambda t: traced.append(runs(t, w)) or t * 2, (x,), check_trace=False)
    assert traced == [False]
    with fwAD.dual_level():
        assert not runs(fwAD.make_dual(x, torch.randn_like(x)), w)
        assert not bypass_ok(x, w)
        assert e is None or runs(x, w, python=False)
    if e is None:
        return
    # the fused add's entry points: the same test
    r = r.detach()
    assert e.fused_add_rms_norm(x, r, w, 1e-6, 0.0) is not None
    assert e.fused_add_rms_norm(x, r.clone().requires_grad_(), w, 1e-6, 0.0) is None
    with Seen():
        assert e.fused_add_rms_norm(x, r, w, 1e-6, 0.0) is None
        assert not e.fused_add_rms_norm_(x.clone(), r.clone(), w, 1e-6, 0.0)
    xi, ri = x.clone(), r.clone()
    assert e.fused_add_rms_norm_(xi, ri, w, 1e-6, 0.0)
    assert torch.equal(ri, (x.float() + r.float()).to(ri.dtype))


@pytest.mark.gpu
def test_triton_hits_launch_from_cpp(monkeypatch):
    """Triton's eager hits launched by the C++ entry point (fast_entry.cpp) from the launch
    Python kept: after one call of a layout, fresh tensors of it are normalised without
    entering the Python launch, every result the reference's: a weight absent, of x's dtype
    or fp32; rows strided, or offset off the 16-byte grid (another specialisation, kept
    apart); the fused add with a residual of x's dtype or fp32. Clearing the plan cache
    forgets what C++ kept."""
    import triton_impl
    from harness.reference import fused_add_rms_norm_ref
    from triton_impl import eager

    _entry_or_skip()
    if eager.HOST is None:
        pytest.skip(f"no direct launch with this Triton ({eager.triton.__version__})")
    eager.PLANS.clear()
    assert eager.HOST.triton_kept() == 0

    def layouts():
        for dtype, wdtype in ((torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                              (torch.float32, None)):  # fmt: skip
            w = None if wdtype is None else (1 + torch.randn(4096, device=DEVICE)).to(wdtype)
            wide = torch.randn(64, 4096 + 16, device=DEVICE, dtype=dtype)
            batch = torch.randn(1, 3, 4097, device=DEVICE, dtype=dtype)
            for x in (torch.randn(8, 4096, device=DEVICE, dtype=dtype), wide[:, :4096],
                      wide[:, 1:4097], batch[..., 1:]):  # fmt: skip
                yield x, w, torch.randn(x.shape, device=DEVICE).to(dtype)
                yield x, w, torch.randn(x.shape, device=DEVICE)

    def check_all():
        for x, w, r in layouts():
            tol = TOL[x.dtype]
            torch.testing.assert_close(
                triton_impl.rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5), **tol
            )
            y, ro = triton_impl.fused_add_rms_norm(x, r, w, 1e-5)
            want_y, want_r = fused_add_rms_norm_ref(x, r, w, 1e-5)
            torch.testing.assert_close(y, want_y, **tol)
            torch.testing.assert_close(ro, want_r, **TOL[r.dtype])

    check_all()  # planned, compiled and kept
    kept = eager.HOST.triton_kept()
    # every plan launched directly is kept (one alignment a key: the key has the offset)
    assert kept == sum(bool(d) for p in eager.PLANS.values() for d in p.compiled.values()) > 0

    def no_python(*args, **kwargs):
        raise AssertionError("a kept plan launched through Python")

    monkeypatch.setattr(eager, "_cached_launch", no_python)
    monkeypatch.setattr(eager, "_planned_launch", no_python)
    check_all()  # fresh tensors, every launch from C++
    assert eager.HOST.triton_kept() == kept
    eager.PLANS.clear()
    assert eager.HOST.triton_kept() == 0


@pytest.mark.gpu
def test_triton_kept_plan_is_its_call(monkeypatch):
    """A kept plan is reused only by a call of its own kind: a weight that is x itself is
    kept as a weight (an absent weight's plan has x's pointer in its place), eps is each
    call's own, and an eps out of range or a launch hook set send a call back to Python
    (the checks' error; Triton's launcher, which calls the hook)."""
    import triton_impl
    from triton_impl import eager

    _entry_or_skip()
    if eager.HOST is None:
        pytest.skip(f"no direct launch with this Triton ({eager.triton.__version__})")
    tol = TOL[torch.bfloat16]
    for _ in range(2):
        x = torch.randn(4096, device=DEVICE).to(torch.bfloat16)
        torch.testing.assert_close(
            triton_impl.rms_norm(x, x, 1e-6), rms_norm_ref(x, x, 1e-6), **tol
        )
        torch.testing.assert_close(
            triton_impl.rms_norm(x, None, 1e-6), rms_norm_ref(x, None, 1e-6), **tol
        )
        torch.testing.assert_close(triton_impl.rms_norm(x, x, 0.5), rms_norm_ref(x, x, 0.5), **tol)
    for eps in (float("nan"), 1e-50, 1e39):
        with pytest.raises(ValueError, match="eps is"):
            triton_impl.rms_norm(x, x, eps)
    calls = []
    monkeypatch.setattr(eager.triton.knobs.runtime, "launch_enter_hook", lambda *a: calls.append(a))
    torch.testing.assert_close(triton_impl.rms_norm(x, x, 1e-6), rms_norm_ref(x, x, 1e-6), **tol)
    assert len(calls) == 1


def test_triton_verified_versions():
    from triton_impl import eager

    assert eager._version("3.6.0") == (3, 6) and eager._version("3.8.0+git1234") == (3, 8)
    assert eager._version("4") == (4, 0)
    assert (3, 6) in eager.VERIFIED_TRITON and (3, 8) in eager.VERIFIED_TRITON


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_sharded_kernel_as_an_op(dtype):
    """Rows the sharded kernel takes (its workspace allocated and zeroed for each launch):
    eager calls (never cached by the fast path, whose plans would share one workspace),
    torch.compile(fullgraph=True), and CUDA graphs of the plain op and the fused add's
    in-place form, replayed on new data."""
    import triton_impl
    from harness.reference import fused_add_rms_norm_ref
    from triton_impl import eager
    from triton_impl.configs import default_config, fused_add_config

    n = 262144 if dtype == torch.bfloat16 else 131072
    assert default_config(n, dtype.itemsize).kernel == "sharded"
    assert fused_add_config(n, dtype.itemsize).kernel == "sharded"
    tol = TOL[dtype]
    x, w = inputs(dtype, n=n, m=24)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        got = triton_impl.rms_norm(x, w, 1e-6)
        torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **tol)
    assert (eager._tensor_key(x), eager._tensor_key(w), None) not in eager.PLANS
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: triton_impl.rms_norm(x * 2.0, w, 1e-6), fullgraph=True)
    torch.testing.assert_close(compiled(x, w), rms_norm_ref(x * 2.0, w, 1e-6), **tol)
    r = torch.randn_like(x)
    out = torch.empty_like(x)
    triton_impl.rms_norm(x, w, 1e-6, out=out)  # warm up (JIT) outside the capture
    triton_impl.fused_add_rms_norm_(x.clone(), r.clone(), w, 1e-6)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        triton_impl.rms_norm(x, w, 1e-6, out=out)
        triton_impl.fused_add_rms_norm_(x, r, w, 1e-6)
    x0, r0 = torch.randn_like(x), torch.randn_like(r)
    x.copy_(x0)
    r.copy_(r0)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, rms_norm_ref(x0, w, 1e-6), **tol)
    want_y, want_r = fused_add_rms_norm_ref(x0, r0, w, 1e-6)
    torch.testing.assert_close(x, want_y, **tol)
    torch.testing.assert_close(r, want_r, **tol)
