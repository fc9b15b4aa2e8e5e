"""The gradient ops in the benchmark harness, on CPU: rms_norm_fwd_bwd, rms_norm_bwd and
fused_add_rms_norm_fwd_bwd (harness.ops.GRAD_OPS). Their bytes models, the input factory
(the forward op's inputs, then fresh output gradients), the grid, the registries and how
each implementation's backward is called (eager, native and compile run here; Liger and
QuACK through stand-in modules), the check against the float64 gradients (a wrong or
unwritten gradient fails; a failing implementation is a FAIL record, never timed), the
run's schedule, the no-GPU path of ``python -m harness.bench --ops ...``, and their plots
and report sections from SYNTHETIC records (tmp dirs only). Our Triton kernels run under
the interpreter; they are skipped, saying so, while triton_impl's backward raises
"forward-only".
"""

import dataclasses

import pytest
import torch
from test_harness import (
    ENV,
    _fake_liger_function,
    _fake_module,
    _fake_run,
    _measured,
    synthetic_records,
)

from conftest import DEVICE, hide_packages, impl_or_skip, refusal
from harness import analysis, bench, impls, measure, plan, plot, records, timing
from harness.cases import Case
from harness.impls import FUSED_ADD_GRADS, RMS_NORM_GRADS, Impl, runnable
from harness.ops import (
    FUSED_ADD_RMS_NORM,
    FUSED_ADD_RMS_NORM_FWD_BWD,
    GRAD_OPS,
    RMS_NORM,
    RMS_NORM_BWD,
    RMS_NORM_FWD_BWD,
    fused_add_fwd_bwd_bytes,
    rms_norm_bwd_bytes,
    rms_norm_bytes,
    rms_norm_fwd_bwd_bytes,
)
from harness.reference import (
    fused_add_rms_norm_ref,
    grad_close,
    rms_norm_ref,
)
from harness.validate import check, run_case

FWD_BWD_OPS = (RMS_NORM_FWD_BWD, FUSED_ADD_RMS_NORM_FWD_BWD)
#: Each gradient op's forward op: the one whose inputs its own begin with.
FORWARD_OF = {
    RMS_NORM_FWD_BWD.name: RMS_NORM,
    RMS_NORM_BWD.name: RMS_NORM,
    FUSED_ADD_RMS_NORM_FWD_BWD.name: FUSED_ADD_RMS_NORM,
}
#: Cases the gradient ops are checked on here: odd and power-of-two widths, 3-D, strided
#: rows, no weight, an fp32 weight beside 16-bit x.
CASES = [
    Case("n1000", (7, 1000), torch.bfloat16),
    Case("3d-n257", (2, 3, 257), torch.float32),
    Case("strided-n1000", (16, 1000), torch.float16, row_pad=24, offset=3),
    Case("noweight-n300", (5, 300), torch.bfloat16, weight="none"),
    Case("fp32w-n300", (5, 300), torch.float16, weight="fp32"),
]


def _ids(cases):
    return [c.id for c in cases]


# ---------------------------------------------------------------------------------------
# bytes models: one an op, the same charge for every implementation
# ---------------------------------------------------------------------------------------


def test_grad_bytes_models():
    m, n = 4096, 4096
    # forward reads x + weight, writes y; backward reads x, dy, weight, writes dx, dweight
    assert rms_norm_fwd_bwd_bytes(m, n, 2, 2) == 5 * m * n * 2 + 3 * n * 2
    assert rms_norm_fwd_bwd_bytes(m, n, 2, 4) == 5 * m * n * 2 + 3 * n * 4  # fp32 weight
    assert rms_norm_fwd_bwd_bytes(m, n, 4, None) == 5 * m * n * 4  # no weight, no dweight
    # backward alone: read x, dy, weight; write dx, dweight (a saved rstd is not charged)
    assert rms_norm_bwd_bytes(8, 1000, 4, 4) == 3 * 8 * 1000 * 4 + 2 * 1000 * 4
    assert rms_norm_bwd_bytes(8, 1000, 2, None) == 3 * 8 * 1000 * 2
    # forward + backward is the forward op's charge plus the backward alone's
    for w in (2, 4, None):
        assert rms_norm_fwd_bwd_bytes(8, 1000, 2, w) == rms_norm_bytes(
            8, 1000, 2, w
        ) + rms_norm_bwd_bytes(8, 1000, 2, w)
    # fused: x, y, dy, dx in x's size; residual, residual_out (written, read), its
    # gradient, dresidual in the residual's; weight read twice, dweight written
    assert fused_add_fwd_bwd_bytes(8, 1000, 2, 2, 2) == 9 * 8 * 1000 * 2 + 3 * 1000 * 2
    assert fused_add_fwd_bwd_bytes(8, 1000, 2, 4, 2) == 8 * 1000 * (4 * 2 + 5 * 4) + 3000 * 2
    assert fused_add_fwd_bwd_bytes(8, 1000, 4, 4, None) == 9 * 8 * 1000 * 4
    for model in (rms_norm_fwd_bwd_bytes, rms_norm_bwd_bytes):
        with pytest.raises(ValueError, match="N >= 1"):
            model(8, 0, 2, 2)
    with pytest.raises(ValueError, match="N >= 1"):
        fused_add_fwd_bwd_bytes(8, 0, 2, 2, 2)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_grad_ops_bytes_of_their_inputs(case):
    """Each gradient op's bytes_moved counts what its inputs are (shape, element sizes),
    not their layout."""
    m, n, e = case.m, case.n, case.dtype.itemsize
    w = {"none": None, "fp32": 4}.get(case.weight, e)
    want = {
        RMS_NORM_FWD_BWD: rms_norm_fwd_bwd_bytes(m, n, e, w),
        RMS_NORM_BWD: rms_norm_bwd_bytes(m, n, e, w),
        FUSED_ADD_RMS_NORM_FWD_BWD: fused_add_fwd_bwd_bytes(m, n, e, e, w),
    }
    for op, nbytes in want.items():
        assert op.bytes_moved(op.make_inputs(case, "cpu", 0)) == nbytes, op.name
    wide = dataclasses.replace(case, residual="fp32")
    op = FUSED_ADD_RMS_NORM_FWD_BWD
    assert op.bytes_moved(op.make_inputs(wide, "cpu", 0)) == fused_add_fwd_bwd_bytes(m, n, e, 4, w)


# ---------------------------------------------------------------------------------------
# the input factory: the forward op's inputs, then fresh output gradients
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", list(GRAD_OPS.values()), ids=list(GRAD_OPS))
def test_grad_inputs_extend_the_forward_ops(op):
    """The same x, weight (and residual) as the forward op draws for a seed, then the
    output gradients: randn, never zeros, x's shape, contiguous, in the output's dtype."""
    case = Case("c", (16, 1000), torch.bfloat16, row_pad=24, offset=3)
    forward = FORWARD_OF[op.name]
    inputs = op.make_inputs(case, "cpu", 7)
    head = forward.make_inputs(case, "cpu", 7)
    for got, want in zip(inputs, head, strict=False):
        if isinstance(want, torch.Tensor):
            assert torch.equal(got, want) and got.stride() == want.stride()
        else:
            assert got == want  # eps
    grads = inputs[len(head) :]
    assert len(grads) == (2 if forward is FUSED_ADD_RMS_NORM else 1)
    x = inputs[0]
    for g in grads:
        assert g.shape == x.shape and g.is_contiguous() and g.dtype == x.dtype
        assert g.float().std() > 0.5 and (g != 0).float().mean() > 0.99  # randn, not zeros
        assert not torch.equal(g.float(), x.float())
    again = op.make_inputs(case, "cpu", 7)
    assert all(torch.equal(a, b) for a, b in zip(grads, again[len(head) :], strict=True))
    other = op.make_inputs(case, "cpu", 8)[len(head) :]
    assert not any(torch.equal(a, b) for a, b in zip(grads, other, strict=True))  # fresh
    # a planned shape is the plain case of that shape, as for the forward ops
    p = plan.Planned("fp32", 4, 64)
    planned, cased = op.make_inputs(p, "cpu", 1), op.make_inputs(p.case(), "cpu", 1)
    for a, b in zip(planned, cased, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_fused_grad_inputs_take_each_outputs_dtype():
    case = Case("c", (8, 256), torch.bfloat16, residual="fp32")
    x, residual, weight, eps, dy, d_residual_out = FUSED_ADD_RMS_NORM_FWD_BWD.make_inputs(
        case, "cpu", 0
    )
    assert dy.dtype == x.dtype == torch.bfloat16 and d_residual_out.dtype == torch.float32
    assert residual.dtype == torch.float32 and not torch.equal(dy.float(), d_residual_out)


# ---------------------------------------------------------------------------------------
# the op descriptions and their registries
# ---------------------------------------------------------------------------------------


def test_grad_op_descriptions():
    """What each gradient op's description says holds when it runs: its reference gives one
    gradient a named output, each of x's shape or weight's, and the wiring every gradient
    op shares (compare, plan, implementations in order)."""
    for op in GRAD_OPS.values():
        case = Case("c", (4, 64), torch.float32, residual="fp32" if "fused" in op.name else None)
        ins = op.make_inputs(case, "cpu", 0)
        grads = op.reference(*ins)
        assert len(grads) == len(op.outputs) and op.outputs[0] == "dx", op.name
        x, weight = ins[0], ins[2] if "fused" in op.name else ins[1]
        for name, g in zip(op.outputs, grads, strict=True):
            assert g.shape == (weight.shape if name == "dweight" else x.shape), (op.name, name)
        assert op.grads and op.compare is grad_close and op.plan is plan.grad_plan
        assert op.ours == impls.OURS and op.baselines == impls.BASELINES
        assert op.second_form is not None
        assert set(op.registry()) == set(op.ours)
        full = op.registry(baselines=True)
        assert list(full) == list(op.order)
        for name in op.baselines:
            assert not full[name].ours and runnable(full[name], "cpu")  # CUDA only, said
        for name in op.ours:
            assert full[name].ours and full[name].resources is None  # kernel_info: forward's
    for op in (RMS_NORM, FUSED_ADD_RMS_NORM):
        assert not op.grads and op.plan is plan.plan and op.grid_text == "M = 2^27 / N"


@pytest.mark.parametrize("op", list(GRAD_OPS.values()), ids=list(GRAD_OPS))
def test_grad_baselines_differentiate_the_forward_baselines(op):
    """eager differentiates the reference's forward itself, compile compiles it afresh per
    shape (the backward alone with donated buffers off), native F.rms_norm."""
    fused = op is FUSED_ADD_RMS_NORM_FWD_BWD
    ref = fused_add_rms_norm_ref if fused else rms_norm_ref
    call = FUSED_ADD_GRADS if fused else RMS_NORM_GRADS
    mode = "bwd" if op is RMS_NORM_BWD else "fwd_bwd"
    full = op.registry(baselines=True)
    assert full["eager"].forward is ref
    assert full["compile"].forward is ref
    assert full["compile"].prepare.func is impls.compile_fresh_grads
    assert full["compile"].prepare.args == (ref, call, mode)
    native = impls.native_fused_add_rms_norm if fused else impls.native_rms_norm
    assert full["native"].forward is native
    # the backward alone binds the forward per shape in prepare; forward + backward needs none
    for name in ("eager", "native"):
        assert (full[name].prepare is not None) == (mode == "bwd")


# ---------------------------------------------------------------------------------------
# how each backward is called: eager, native and compile on CPU
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES[:4], ids=_ids(CASES[:4]))
@pytest.mark.parametrize("name", ["eager", "native", "compile"])
@pytest.mark.parametrize("op", list(GRAD_OPS.values()), ids=list(GRAD_OPS))
def test_torch_baselines_match_the_float64_gradients(op, name, case):
    """Each torch baseline's gradients, through its fn and through the bench's prepared
    callable, pass the check against the float64 reference; the caller's tensors are left
    as they were (leaves are made of them, never the tensors themselves)."""
    inputs = op.make_inputs(case, "cpu", 3)
    before = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    ref = op.reference(*inputs)
    impl = op.registry(baselines=True)[name]
    a, r, ok, err = check(impl, *inputs, ref, op=op)
    assert ok, err
    if impl.prepare is not None:
        fn, seconds = impl.prepare(*inputs)
        assert seconds > 0
        for _ in range(2):  # the backward alone, again: retain_graph keeps the graph
            a, r, ok, err = check(dataclasses.replace(impl, fn=fn), *inputs, ref, op=op)
            assert ok, err
    for got, was in zip(inputs, before, strict=True):
        if isinstance(got, torch.Tensor):
            assert torch.equal(got, was) and not got.requires_grad and got.grad is None


def test_backward_alone_runs_the_forward_once_outside_the_timed_call():
    """prepare runs the forward once (graph kept) and returns the backward alone; the
    timed callable never reruns the forward, gives the same gradients each call, and
    refuses inputs it was not bound to. forward + backward runs both at every call."""
    calls = []

    def forward(x, weight, eps):
        calls.append(1)
        return rms_norm_ref(x, weight, eps)

    probe = Impl("probe", forward)
    inputs = RMS_NORM_BWD.make_inputs(Case("c", (8, 128), torch.float32), "cpu", 0)
    bwd = impls._with_grads(probe, RMS_NORM_GRADS, "bwd")
    fn, seconds = bwd.prepare(*inputs)
    assert len(calls) == 1 and seconds > 0  # the forward and the first backward, untimed
    first = fn(*inputs)
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(fn(*inputs), first, strict=True))
    assert len(calls) == 1
    other = RMS_NORM_BWD.make_inputs(Case("c", (8, 128), torch.float32), "cpu", 1)
    with pytest.raises(ValueError, match="other inputs"):
        fn(*other)
    both = impls._with_grads(probe, RMS_NORM_GRADS, "fwd_bwd")
    assert both.prepare is None
    calls.clear()
    both.fn(*inputs)
    both.fn(*inputs)
    assert len(calls) == 2


def test_gradients_are_none_only_without_a_weight():
    op = RMS_NORM_FWD_BWD
    eager = op.registry(baselines=True)["eager"]
    x, w, eps, dy = op.make_inputs(Case("c", (4, 64), torch.float32, weight="none"), "cpu", 0)
    dx, dw = eager.fn(x, w, eps, dy)
    assert dw is None and dx.shape == x.shape
    fused = FUSED_ADD_RMS_NORM_FWD_BWD
    inputs = fused.make_inputs(Case("c", (4, 64), torch.bfloat16), "cpu", 0)
    dx, dres, dw = fused.registry(baselines=True)["eager"].fn(*inputs)
    assert dx.dtype == dres.dtype == torch.bfloat16 and dw.shape == (64,)


# ---------------------------------------------------------------------------------------
# the check: wrong and unwritten gradients fail
# ---------------------------------------------------------------------------------------


def _eager_grads(op):
    return op.registry(baselines=True)["eager"].fn


@pytest.mark.parametrize(
    "broken, message",
    [
        (lambda dx, dw: (dx * 1.05, dw), "dx: "),
        (lambda dx, dw: (dx, dw * 0.9), "dweight: "),
        (lambda dx, dw: (dx, None), "dweight: got None"),
        (lambda dx, dw: (dx.float(), dw), "dx: got torch.float32"),
        (lambda dx, dw: (dx,), "got 1 outputs, not 2"),
    ],
    ids=["dx", "dweight", "no-dweight", "dtype", "count"],
)
def test_check_refuses_wrong_gradients(broken, message):
    op = RMS_NORM_FWD_BWD
    inputs = op.make_inputs(Case("c", (16, 1000), torch.bfloat16), "cpu", 0)
    eager = _eager_grads(op)
    good = Impl("good", eager)
    assert check(good, *inputs, op.reference(*inputs), op=op)[2]
    bad = Impl("bad", lambda *a: broken(*eager(*a)))
    _, _, ok, err = check(bad, *inputs, op.reference(*inputs), op=op)
    assert not ok and message in err, err


def test_check_refuses_a_dweight_where_there_is_no_weight():
    op = RMS_NORM_BWD
    inputs = op.make_inputs(Case("c", (4, 64), torch.float32, weight="none"), "cpu", 0)
    extra = Impl("extra", lambda *a: (_eager_grads(op)(*a)[0], torch.zeros(64)))
    _, _, ok, err = check(extra, *inputs, op.reference(*inputs), op=op)
    assert not ok and "dweight: got torch.float32(64,), expected None" in err


@pytest.mark.parametrize("op", FWD_BWD_OPS, ids=[op.name for op in FWD_BWD_OPS])
def test_our_second_form_poisons_every_allocation(op):
    """Ours are checked a second time with every tensor torch allocates filled with NaN: a
    kernel that leaves a row of dx unwritten fails, however the memory it got was left.
    The global deterministic settings are as they were after it."""
    inputs = op.make_inputs(Case("c", (6, 256), torch.float32), "cpu", 0)
    eager = _eager_grads(op)

    def misses_the_last_row(*args):
        grads = eager(*args)
        dx = torch.empty_like(grads[0])
        dx[:-1] = grads[0][:-1]  # the last row never written
        return (dx,) + tuple(grads[1:])

    ours = Impl("ours", misses_the_last_row, ours=True)
    ref = op.reference(*inputs)
    poisoned = op.second_form(ours, inputs, ref)
    assert poisoned[0][-1].isnan().all() and not poisoned[0][:-1].isnan().any()
    _, _, ok, err = check(ours, *inputs, ref, op=op)
    assert not ok and err.startswith("dx: "), err
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory
    assert check(Impl("ok", eager, ours=True), *inputs, ref, op=op)[2]  # the same, written


def test_a_failing_implementation_is_a_fail_record_never_timed(tmp_path, monkeypatch):
    """measure's check of a shape, on CPU: eager's backward alone passes and is ready to
    time, a wrong one is written as FAIL with the error and left out."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    op = RMS_NORM_BWD
    path = tmp_path / "records.jsonl"
    writer = records.RecordWriter(path, append=False)
    b = measure.Bench("synthetic", ENV, writer, None, 0, 0, op=op, device="cpu")
    p = plan.Planned("bf16", 8, 1000, ["custom"])
    inputs = op.make_inputs(p, "cpu", 0)
    base = measure.shape_fields(b, p, inputs)
    eager = op.registry(baselines=True)["eager"]
    doubled = Impl("wrong", lambda x, w, eps: 2 * rms_norm_ref(x, w, eps))
    wrong = impls._with_grads(doubled, RMS_NORM_GRADS, "bwd")
    ready = measure._check_all(b, [eager, wrong], inputs, base)
    b.writer.close()
    assert list(ready) == ["eager"] and ready["eager"]["correct"]["passed"]
    assert ready["eager"]["compile_s"] > 0  # the forward and first backward, apart
    (failed,) = records.read_records(path)
    assert (failed["impl"], failed["status"], failed["op"]) == ("wrong", "FAIL", "rms_norm_bwd")
    assert failed["correct"]["error"].startswith("dx: ") and failed["stats"] is None
    assert failed["bytes"] == rms_norm_bwd_bytes(8, 1000, 2, 2)


def test_kernel_path_claims_nothing_for_native_gradients():
    names = ["layer_norm_grad_input_kernel", "reduce_kernel<512, sum>"]
    assert measure.kernel_path("native", names, grads=True) is None
    assert measure.kernel_path("native", names) == "composite"  # the forward ops' claim
    assert measure.kernel_path("compile", ["triton_red_fused_0"], grads=True) == "inductor"


# ---------------------------------------------------------------------------------------
# Liger and QuACK: how their backward is called, through stand-in modules
# ---------------------------------------------------------------------------------------


def test_grad_peers_missing_are_unavailable(monkeypatch):
    hide_packages(monkeypatch, "liger_kernel", "quack")
    for op in GRAD_OPS.values():
        full = op.registry(baselines=True)
        assert "liger-kernel not importable" in full["liger"].unavailable
        assert "quack not importable" in full["quack"].unavailable
        assert runnable(full["quack"], "cuda") == full["quack"].unavailable


def test_liger_backward_keeps_dy(monkeypatch):
    """Liger is called in gemma mode with in_place=False (True would write dX over dY, the
    gradient every implementation is checked on), a weight always."""
    calls = _fake_liger_function(
        monkeypatch, "liger_kernel.ops.rms_norm", "LigerRMSNormFunction", rms_norm_ref, 3
    )
    for op in (RMS_NORM_FWD_BWD, RMS_NORM_BWD):
        liger = op.registry(baselines=True)["liger"]
        inputs = op.make_inputs(Case("c", (4, 64), torch.float32), "cpu", 0)
        assert check(liger, *inputs, op.reference(*inputs), op=op)[2]
        assert calls[-1][3:] == (0.0, "gemma", False)
        x, _, eps, dy = op.make_inputs(Case("c", (4, 64), torch.float32, weight="none"), "cpu", 0)
        dx, dw = liger.fn(x, None, eps, dy)
        assert dw is None and torch.equal(calls[-1][1], torch.ones(64))


def test_quack_backward_through_its_autograd_function(monkeypatch):
    """quack.rmsnorm.rmsnorm (differentiable) for rms_norm, with residual= and
    prenorm=True for the fused add; a version without residual_out is an error."""
    seen = []

    def rmsnorm(x, weight=None, bias=None, residual=None, eps=1e-6, prenorm=False):
        seen.append(dict(residual=residual is not None, prenorm=prenorm, eps=eps))
        if residual is None:
            return rms_norm_ref(x, weight, eps)
        y, res = fused_add_rms_norm_ref(x, residual, weight, eps)
        return (y, res) if prenorm else y

    mod = _fake_module(monkeypatch, "quack.rmsnorm", rmsnorm=rmsnorm)
    op = RMS_NORM_FWD_BWD
    inputs = op.make_inputs(Case("c", (2, 3, 64), torch.float32), "cpu", 0)
    assert check(op.registry(baselines=True)["quack"], *inputs, op.reference(*inputs), op=op)[2]
    assert seen[-1] == dict(residual=False, prenorm=False, eps=inputs[2])
    op = FUSED_ADD_RMS_NORM_FWD_BWD
    inputs = op.make_inputs(Case("c", (4, 64), torch.float32), "cpu", 0)
    quack = op.registry(baselines=True)["quack"]
    assert check(quack, *inputs, op.reference(*inputs), op=op)[2]
    assert seen[-1] == dict(residual=True, prenorm=True, eps=inputs[3])
    mod.rmsnorm = lambda x, weight=None, residual=None, eps=1e-6, prenorm=False: x
    with pytest.raises(TypeError, match="no residual_out"):
        op.registry(baselines=True)["quack"].fn(*inputs)


# ---------------------------------------------------------------------------------------
# our Triton kernels under the interpreter
# ---------------------------------------------------------------------------------------


def _triton_backward_or_skip(op=RMS_NORM_FWD_BWD):
    """Our Triton entry of op, or a skip while triton_impl's backward is not there yet."""
    triton = impl_or_skip("triton", DEVICE, op.registry())
    probe = op.make_inputs(Case("probe", (2, 64), torch.float32), DEVICE, 0)
    try:
        triton.fn(*probe)
    except RuntimeError as e:
        if "forward-only" in str(e):
            pytest.skip(f"triton_impl's backward has not landed: {str(e).splitlines()[0]}")
        raise
    return triton


GRAD_CASES = CASES + [Case("n4097", (3, 4097), torch.bfloat16)]


@pytest.mark.parametrize("case", GRAD_CASES, ids=_ids(GRAD_CASES))
@pytest.mark.parametrize("op", list(GRAD_OPS.values()), ids=list(GRAD_OPS))
def test_triton_gradients(op, case):
    """Our Triton kernels' gradients against the float64 reference, both forms (the second
    with every allocation NaN-poisoned), through the harness's own check."""
    triton = _triton_backward_or_skip(op)
    r = run_case(case.cpu_cap() if DEVICE == "cpu" else case, triton, DEVICE, 11, op=op)
    assert r.ok, r.error
    if op is FUSED_ADD_RMS_NORM_FWD_BWD:
        wide = dataclasses.replace(case, residual="fp32")
        r = run_case(wide.cpu_cap() if DEVICE == "cpu" else wide, triton, DEVICE, 12, op=op)
        assert r.ok, r.error


# ---------------------------------------------------------------------------------------
# the bench: plans, arguments, schedule, the no-GPU path
# ---------------------------------------------------------------------------------------


def test_grad_plan():
    full = plan.grad_plan(["fp32", "bf16", "fp16"])
    assert [p.dtype for p in full] == ["bf16"] * 9 + ["fp16"] * 9 + ["fp32"] * 9  # bf16 first
    assert [p.n for p in full[:9]] == [1024, 2048, 4095, 4096, 4097, 8192, 16384, 32768, 65536]
    for p in full:
        want = (2**26 if p.dtype == "fp32" else 2**27) // p.n
        assert p.m == want and p.sections == ["grid"]
    quick = plan.grad_plan(["bf16"], quick=True)
    assert [(p.m, p.n) for p in quick] == [(2**27 // n, n) for n in plan.QUICK_NS]
    custom = plan.grad_plan(["fp16"], shapes=[(64, 4096)])
    assert [(p.dtype, p.m, p.n, p.sections) for p in custom] == [("fp16", 64, 4096, ["custom"])]
    # a gradient grid shape asked for by name is still the grid's (fp32's M is half of the
    # forward grid's): appended to the records, it replaces the grid figure
    asked = plan.grad_plan(["fp32"], shapes=[(2048, 32768)])
    assert [p.sections for p in asked] == [["grid", "custom"]]


def test_bench_takes_the_gradient_ops_by_name(capsys):
    assert [op.name for op in bench.parse_args([]).ops] == list(bench.DEFAULT_OPS)
    assert bench.DEFAULT_OPS == ("rms_norm", "fused_add_rms_norm")  # the default is unchanged
    args = bench.parse_args(["--ops", "rms_norm_fwd_bwd,rms_norm_bwd", "--impls", "triton,liger"])
    assert args.ops == [RMS_NORM_FWD_BWD, RMS_NORM_BWD] and args.impls == ["triton", "liger"]
    args = bench.parse_args(["--ops", "fused_add_rms_norm_fwd_bwd"])
    assert args.impls == list(FUSED_ADD_RMS_NORM_FWD_BWD.order)
    err = refusal(bench.main, ["--ops", "rms_norm_backward"], capsys)
    assert "--ops: unknown rms_norm_backward" in err and "rms_norm_fwd_bwd" in err


def test_run_takes_each_ops_plan_in_turn(tmp_path, monkeypatch):
    """Ops with plans of their own take turns shape by shape: the i-th shape of each, then
    the next; every shape of the longer plan is measured too."""
    measured = _fake_run(monkeypatch, tmp_path, 0.0)
    argv = ["--quick", "--ops", "rms_norm,rms_norm_bwd", "--impls", "eager", "--out", str(tmp_path)]
    args = bench.parse_args(argv)
    args.budget_s = 100.0
    assert bench.run_gpu(args, args.impls, tmp_path) == 0
    fwd, bwd = plan.plan(["bf16"], quick=True), plan.grad_plan(["bf16"], quick=True)
    want = []
    for i in range(max(len(fwd), len(bwd))):
        want += [("rms_norm", fwd[i].m, fwd[i].n)] if i < len(fwd) else []
        want += [("rms_norm_bwd", bwd[i].m, bwd[i].n)] if i < len(bwd) else []
    assert [(op, m, n) for op, m, n, _ in measured] == want
    assert {tuple(i) for *_, i in measured} == {("eager",)}


def test_the_run_measures_a_gradient_op_through_its_timed_callable(tmp_path, monkeypatch):
    """measure_shape for the backward alone on CPU, timing faked: the callable timed is
    the prepared backward (it never reruns the forward), one PASS record per
    implementation with the op's bytes and GB/s from them."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    fake = [[20e-6, 21e-6], [20e-6, 22e-6], [19e-6, 20e-6]]
    timed = {}

    def time_blocks(b, fns):
        timed.update(fns)
        return {k: fake for k in fns}, None

    monkeypatch.setattr(measure, "time_blocks", time_blocks)
    monkeypatch.setattr(timing, "warm_up", lambda fns, *a: None)
    calls = []

    def forward(x, weight, eps):
        calls.append(1)
        return rms_norm_ref(x, weight, eps)

    probe = impls._with_grads(Impl("eager", forward), RMS_NORM_GRADS, "bwd")
    path = tmp_path / "records.jsonl"
    writer = records.RecordWriter(path, append=False)
    b = measure.Bench("synthetic", ENV, writer, None, 0, 0, op=RMS_NORM_BWD, device="cpu")
    measure.measure_shape(b, plan.Planned("fp32", 16, 512, ["custom"]), [probe])
    b.writer.close()
    assert len(calls) == 1
    timed["eager"]()
    assert len(calls) == 1  # the timed call is the backward alone
    (rec,) = [r for r in records.read_records(path) if r["mode"] == "cold"]
    assert rec["status"] == "PASS" and rec["op"] == "rms_norm_bwd"
    assert rec["bytes"] == rms_norm_bwd_bytes(16, 512, 4, 4)
    assert rec["gbps"] == pytest.approx(
        records.gbps(rec["bytes"], rec["stats"]["median_us"] * 1e-6)
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the path taken without a GPU")
def test_bench_without_gpu_checks_the_gradient_ops(tmp_path, monkeypatch, capsys):
    """python -m harness.bench --ops <the gradient ops> without a GPU: each op's Triton
    gradients under the interpreter on the three small shapes in every dtype, a line a
    case, then the committed records redrawn."""
    _triton_backward_or_skip()
    committed = tmp_path / "committed.jsonl"
    synthetic_records(committed)
    monkeypatch.setattr(bench, "COMMITTED", committed)
    monkeypatch.setattr(bench, "REPO", tmp_path)
    names = ",".join(GRAD_OPS)
    assert bench.main(["--ops", names, "--quick", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert f"({', '.join(GRAD_OPS)})" in out.splitlines()[0] and "ignored: --quick" in out
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("interpreter ")]
    shapes = [name for name, _ in bench.NO_GPU_SHAPES]
    assert [ln[1:3] for ln in lines] == [
        [f"{s}-bf16", op] for op in GRAD_OPS for s in shapes
    ]  # --quick: bf16 only, as the forward ops
    assert all("PASS" in ln for ln in lines)
    assert (tmp_path / "o" / "report.md").exists()


# ---------------------------------------------------------------------------------------
# records, plots, report of the gradient ops
# ---------------------------------------------------------------------------------------

#: made-up median times relative to ours, per implementation
GRAD_SPEED = {
    "triton": 1.0,
    "cuda": 1.05,
    "eager": 5.0,
    "compile": 1.4,
    "native": 2.0,
    "liger": 1.2,
    "quack": 1.1,
}


def _grad_timing(op, impl, dtype, n, f):
    """A SYNTHETIC cold grid record of a gradient op."""
    m = plan.GRAD_ELEMENTS[dtype] // n
    size = records.DTYPE_BYTES[dtype]
    nbytes = {
        RMS_NORM_FWD_BWD: rms_norm_fwd_bwd_bytes(m, n, size, size),
        RMS_NORM_BWD: rms_norm_bwd_bytes(m, n, size, size),
        FUSED_ADD_RMS_NORM_FWD_BWD: fused_add_fwd_bwd_bytes(m, n, size, size, size),
    }[op]
    us = nbytes / 3.9e12 * 1e6 * f
    samples = [us * g for g in (0.98, 1.0, 1.0, 1.02, 1.05, 0.99)]
    stats = timing.summarize(samples)
    gb = records.gbps(nbytes, stats["median_us"] * 1e-6)
    return _measured(
        op,
        impl,
        dtype,
        m,
        n,
        ["grid"],
        "cold",
        shape_class=plan.shape_class(dtype, n, False),
        bytes=nbytes,
        samples_us=samples,
        stats=stats,
        spread=0.01,
        blocks=[{"median_us": us, "p20_us": us, "p80_us": us, "n": 2}] * 3,
        gbps=gb,
        gbps_lo=records.gbps(nbytes, stats["p80_us"] * 1e-6),
        gbps_hi=records.gbps(nbytes, stats["p20_us"] * 1e-6),
        pct_copy=100 * gb / ENV["copy_gbps"],
        correct={"max_abs": 0.0, "max_rel": 0.0, "passed": True, "error": None},
        kernels={"class": "c", "names": [f"{impl}_bwd_kernel"], "count": 2, "path": None},
        compile_s=9.0 if impl == "compile" else 0.5,
    )


def test_report_and_plots_have_a_section_per_gradient_op(tmp_path):
    path = tmp_path / "both.jsonl"
    recs = synthetic_records(path)  # the forward op's records first
    for op in GRAD_OPS.values():
        for dtype, n in (("bf16", 1024), ("bf16", 4097), ("fp32", 4096)):
            recs += [_grad_timing(op, i, dtype, n, f) for i, f in GRAD_SPEED.items()]
    failed = {"max_abs": None, "max_rel": None, "passed": False, "error": "dx: not close"}
    recs.append(
        _measured(
            RMS_NORM_BWD,
            "liger",
            "bf16",
            2**27 // 65536,
            65536,
            ["grid"],
            "cold",
            bytes=1,
            status="FAIL",
            correct=failed,
        )
    )
    with records.RecordWriter(path, append=False) as w:
        for r in recs:
            w.write(r)
    out = tmp_path / "drawn"
    written = {p.name for p in plot.redraw(path, out)}
    for op in GRAD_OPS.values():
        # grid only: bandwidth against N and speedups, no M sweep or small shapes
        assert {f"{op.name}-bandwidth_vs_n.png", f"{op.name}-speedup.png"} <= written
        assert f"{op.name}-small_shapes.png" not in written
    text = (out / "report.md").read_text()
    for op in GRAD_OPS.values():
        assert text.count(f"# {op.title} ({op.name})") == 1, op.name
        assert f"Bytes model of {op.name}, for every implementation: {op.bytes_text}." in text
        page = (out / f"report-{op.name}.md").read_text()  # the op's own page
        assert f"({op.name}-speedup.png)" in page and f"[report-{op.name}.md]" in text
    bwd = (out / "report-rms_norm_bwd.md").read_text()
    assert "## Grid shapes (M = 2^27 / N, fp32 2^26 / N), cold" in bwd
    assert "dx: not close" in bwd and "## Summary: grid shapes, cold" in bwd
    assert "**fp32**" in bwd and "quack GB/s" in bwd
    assert "- Gradient ops:" in text
    groups = analysis.by_op(analysis.load(path))
    rows = analysis.summary(groups[RMS_NORM_BWD], "grid", RMS_NORM_BWD)
    assert [(r["impl"], r["dtype"]) for r in rows][:2] == [("triton", "bf16"), ("triton", "fp32")]
    assert rows[0]["geo_ratio"] == pytest.approx(1.1)  # quack, the fastest peer
    alone = tmp_path / "plain.jsonl"
    synthetic_records(alone)
    plot.redraw(alone, tmp_path / "plain")
    assert "Gradient ops" not in (tmp_path / "plain" / "report.md").read_text()
