"""The weight offset, y = x * rstd * (weight + weight_offset) with the offset added in fp32
(Gemma's norms: 1 + w), in every op and form of both backends: the forward (every kernel
kind and config), the fused add (functional and in place), the backward ops and autograd,
the module, swap_rms_norm of Gemma's norm, and the refusals. Fresh random inputs, outputs
poisoned before each run, odd widths, all three dtypes."""

import importlib

import pytest
import torch

from conftest import DEVICE, HAS_GPU, fn_or_skip, impl_or_skip
from harness.reference import (
    TOL,
    fused_add_rms_norm_grads_ref,
    fused_add_rms_norm_ref,
    grad_close,
    grad_scale,
    rms_norm_grads_ref,
    rms_norm_ref,
)

BACKENDS = ["triton", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: Gemma's, and one whose fp32 add is inexact in every 16-bit weight
OFFSETS = [1.0, -0.3]
EPS = 1e-6
WIDTHS = [1, 7, 1000, 4097] + ([8192, 12288, 20480, 65536, 131073] if HAS_GPU else [])


def backend(name: str):
    impl_or_skip(name)
    return importlib.import_module(f"{name}_impl")


def weight_of(n: int, dtype, kind: str) -> torch.Tensor:
    """A zero-centred weight, as Gemma's (the offset brings it near one): x's dtype or fp32."""
    w = 0.5 * torch.randn(n, device=DEVICE)
    return w if kind == "fp32" else w.to(dtype)


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("wkind", ["dtype", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_forward_forms_match_reference(name, dtype, wkind, offset):
    """rms_norm, its out= form, the fused add and its in-place form, each against the
    reference with the same offset, at odd and wide widths."""
    mod = backend(name)
    for n in WIDTHS:
        m = 3 if n > 8192 else 5
        x = torch.randn(m, n, device=DEVICE).to(dtype)
        r = torch.randn(m, n, device=DEVICE).to(dtype)
        w = weight_of(n, dtype, wkind)
        want = rms_norm_ref(x, w, EPS, offset)
        got = mod.rms_norm(x, w, EPS, weight_offset=offset)
        torch.testing.assert_close(got, want, **TOL[dtype], msg=lambda s, n=n: f"N={n}: {s}")
        out = poisoned((m, n), dtype)
        assert mod.rms_norm(x, w, EPS, out=out, weight_offset=offset) is out
        torch.testing.assert_close(out, want, **TOL[dtype])
        want_y, want_r = fused_add_rms_norm_ref(x, r, w, EPS, offset)
        y, ro = mod.fused_add_rms_norm(x, r, w, EPS, weight_offset=offset)
        torch.testing.assert_close(y, want_y, **TOL[dtype], msg=lambda s, n=n: f"N={n}: {s}")
        torch.testing.assert_close(ro, want_r, rtol=0, atol=0)
        xi, ri = x.clone(), r.clone()
        mod.fused_add_rms_norm_(xi, ri, w, EPS, weight_offset=offset)
        torch.testing.assert_close(xi, want_y, **TOL[dtype])
        torch.testing.assert_close(ri, want_r, rtol=0, atol=0)


@pytest.mark.parametrize("name", BACKENDS)
def test_zero_offset_is_no_offset(name):
    """weight_offset=0.0 is the op without one, bit for bit, a -0.0 weight element included
    (whose product keeps its sign: an added +0.0 would flip it)."""
    mod = backend(name)
    for dtype in DTYPES:
        x = torch.randn(4, 1000, device=DEVICE).to(dtype)
        w = torch.randn(1000, device=DEVICE).to(dtype)
        w[3] = -0.0
        y = mod.rms_norm(x, w, EPS, weight_offset=0.0)
        assert torch.equal(y, mod.rms_norm(x, w, EPS))
        assert torch.equal(torch.signbit(y[:, 3]), ~torch.signbit(x[:, 3]))
        r = torch.randn(4, 1000, device=DEVICE).to(dtype)
        got = mod.fused_add_rms_norm(x, r, w, EPS, weight_offset=0.0)
        for a, b in zip(got, mod.fused_add_rms_norm(x, r, w, EPS), strict=True):
            assert torch.equal(a, b)


def _triton_configs(n: int, element_size: int, op: str) -> list:
    """One candidate of each kernel kind the search space has at n."""
    from triton_impl import search_space

    picked: dict = {}
    for cfg in search_space(n, element_size, op):
        picked.setdefault(cfg.kernel, cfg)
    return list(picked.values())


@pytest.mark.parametrize("n", [17, 1000, 4097, 70001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_triton_kernel_kind(n, dtype):
    """Each Triton kernel kind (fused, split, looped, sharded) of both forward ops adds the
    offset, the fp32 weight's and x's dtype's."""
    impl_or_skip("triton")
    from triton_impl import fused_add_rms_norm_with_config, rms_norm_with_config

    x = torch.randn(3, n, device=DEVICE).to(dtype)
    r = torch.randn(3, n, device=DEVICE).to(dtype)
    size = x.element_size()
    for w in (weight_of(n, dtype, "dtype"), weight_of(n, dtype, "fp32")):
        want = rms_norm_ref(x, w, EPS, 1.0)
        kinds = set()
        for cfg in _triton_configs(n, size, "rms_norm"):
            got = rms_norm_with_config(x, w, EPS, cfg, weight_offset=1.0)
            torch.testing.assert_close(got, want, **TOL[dtype], msg=lambda s, c=cfg: f"{c}: {s}")
            kinds.add(cfg.kernel)
        want_y, want_r = fused_add_rms_norm_ref(x, r, w, EPS, 1.0)
        for cfg in _triton_configs(n, size, "fused_add_rms_norm"):
            y, ro = fused_add_rms_norm_with_config(x, r, w, EPS, cfg, weight_offset=1.0)
            torch.testing.assert_close(y, want_y, **TOL[dtype], msg=lambda s, c=cfg: f"{c}: {s}")
            torch.testing.assert_close(ro, want_r, rtol=0, atol=0)
        assert kinds, n


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_cuda_config(op, dtype):
    """Every compiled CUDA config of both forward ops (each body: the general one, the row
    chunks, the staged clusters) adds the offset, at its full width and an odd one below;
    offset 1 with a weight of x's dtype (a plus-one kernel, where the build has the config's)
    gives the bits of the same config reading the fp32 weight + 1 the launcher makes for an
    fp32 weight."""
    impl_or_skip("cuda")
    from cuda_impl import (
        Config,
        compiled_configs,
        fused_add_rms_norm_with_config,
        rms_norm_with_config,
    )

    vec = 16 // torch.empty(0, dtype=dtype).element_size()
    for c in compiled_configs(op):
        cfg = Config(c.row_threads, c.vpt, 2 if c.cluster else 1, c.variant)
        cap = c.row_threads * c.vpt * cfg.cluster * vec
        for n in (cap, cap - 3):
            x = torch.randn(5, n, device=DEVICE).to(dtype)
            w = weight_of(n, dtype, "dtype")
            try:
                if op == "rms_norm":
                    got = rms_norm_with_config(x, w, EPS, cfg, weight_offset=1.0)
                    folded = rms_norm_with_config(x, w.float(), EPS, cfg, weight_offset=1.0)
                    want = rms_norm_ref(x, w, EPS, 1.0)
                else:
                    r = torch.randn(5, n, device=DEVICE).to(dtype)
                    got, _ = fused_add_rms_norm_with_config(x, r, w, EPS, cfg, weight_offset=1.0)
                    folded, _ = fused_add_rms_norm_with_config(
                        x, r, w.float(), EPS, cfg, weight_offset=1.0
                    )
                    want = fused_add_rms_norm_ref(x, r, w, EPS, 1.0)[0]
            except ValueError as e:  # a fused config compiled only for the other dtypes
                assert "compiled only for the dtypes" in str(e), (cfg, n, str(e))
                continue
            torch.testing.assert_close(got, want, **TOL[dtype], msg=lambda s, c=cfg: f"{c}: {s}")
            torch.testing.assert_close(
                got, folded, rtol=0, atol=0, msg=lambda s, c=cfg: f"{c}: {s}"
            )


GRAD_WIDTHS = [33, 1000, 4097] + ([8192, 16384, 65536] if HAS_GPU else [])


@pytest.mark.parametrize("wkind", ["dtype", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_grads_match_reference(name, dtype, wkind):
    """dx, dresidual and dweight through autograd (both ops) and through the public backward
    functions, against the float64 reference with the offset; dweight carries none."""
    mod = backend(name)
    for n in GRAD_WIDTHS:
        m = 6
        x = torch.randn(m, n, device=DEVICE).to(dtype).requires_grad_()
        r = torch.randn(m, n, device=DEVICE).to(dtype).requires_grad_()
        w = weight_of(n, dtype, wkind).requires_grad_()
        dy = torch.randn(m, n, device=DEVICE).to(dtype)
        w1 = (w.detach().double() + 1.0).to(torch.float64)
        dx, dw = torch.autograd.grad(mod.rms_norm(x, w, EPS, weight_offset=1.0), (x, w), dy)
        want_dx, want_dw = rms_norm_grads_ref(x, w, EPS, dy, 1.0)
        grad_close(dx, want_dx, f"dx N={n}", grad_scale(x, w1, dy))
        grad_close(dw, want_dw, f"dweight N={n}")
        dx2, dw2 = mod.rms_norm_backward(dy, x.detach(), w.detach(), EPS, weight_offset=1.0)
        grad_close(dx2, want_dx, f"backward dx N={n}", grad_scale(x, w1, dy))
        grad_close(dw2, want_dw, f"backward dweight N={n}")
        y, ro = mod.fused_add_rms_norm(x, r, w, EPS, weight_offset=1.0)
        dro = torch.randn(m, n, device=DEVICE).to(dtype)
        got = torch.autograd.grad((y, ro), (x, r, w), (dy, dro))
        want = fused_add_rms_norm_grads_ref(x, r, w, EPS, dy, dro, 1.0)
        s = ro.detach()
        for g, wt, what in zip(got, want, ("dx", "dresidual", "dweight"), strict=True):
            scale = grad_scale(s, w1, dy) if what != "dweight" else None
            grad_close(g, wt, f"fused {what} N={n}", scale)
        bwd = mod.fused_add_rms_norm_backward(dy, dro, s, w.detach(), EPS, weight_offset=1.0)
        for g, wt, what in zip(bwd, want, ("dx", "dresidual", "dweight"), strict=True):
            scale = grad_scale(s, w1, dy) if what != "dweight" else None
            grad_close(g, wt, f"fused backward {what} N={n}", scale)


@pytest.mark.parametrize("name", BACKENDS)
def test_forward_mode(name):
    """torch.func.jvp through rms_norm with the offset: the tangent of x * rstd * (w + 1)."""
    mod = backend(name)
    x = torch.randn(4, 96, device=DEVICE)
    w = weight_of(96, torch.float32, "fp32")
    tx, tw = torch.randn_like(x), torch.randn_like(w)
    _, got = torch.func.jvp(lambda a, b: mod.rms_norm(a, b, EPS, weight_offset=1.0), (x, w),
                            (tx, tw))  # fmt: skip
    from harness.reference import norm64

    _, want = torch.func.jvp(lambda a, b: norm64(a, b, EPS, 1.0), (x.double(), w.double()),
                             (tx.double(), tw.double()))  # fmt: skip
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", BACKENDS)
def test_module(name):
    """RMSNorm(n, weight_offset=1.0): a weight of zeros (1 - offset) that scales by one, the
    offset in its repr, and a gradient for the weight; without a weight it is refused."""
    mod = backend(name)
    norm = mod.RMSNorm(64, eps=EPS, weight_offset=1.0, device=DEVICE)
    assert torch.equal(norm.weight.detach(), torch.zeros(64, device=DEVICE))
    assert "weight_offset=1.0" in repr(norm)
    x = torch.randn(3, 64, device=DEVICE)
    torch.testing.assert_close(norm(x), rms_norm_ref(x, None, EPS), **TOL[torch.float32])
    with torch.no_grad():
        norm.weight.normal_()
    y, ro = norm(x, x.clone())
    want_y, _ = fused_add_rms_norm_ref(x, x, norm.weight, EPS, 1.0)
    torch.testing.assert_close(y, want_y, **TOL[torch.float32])
    norm(x).sum().backward()
    assert norm.weight.grad is not None
    with pytest.raises(ValueError, match=r"weight_offset is 1\.0 but weight is None"):
        mod.RMSNorm(64, elementwise_affine=False, weight_offset=1.0)
    with pytest.raises(ValueError, match=r"weight_offset is inf; expected a finite number"):
        mod.RMSNorm(64, weight_offset=float("inf"))


class GemmaRMSNorm(torch.nn.Module):
    """transformers' GemmaRMSNorm (Gemma 2's and 3's are the same): fp32 math, the weight a
    zero-centred Parameter scaled by as 1 + weight, the 1 added in fp32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


@pytest.mark.parametrize("name", BACKENDS)
def test_swap_gemma(name):
    """swap_rms_norm puts a module with weight_offset=1.0 in place of Gemma's norm (its
    check runs both side by side), which then computes what Gemma's did."""
    from rmsnorm_api import swap_rms_norm

    mod = backend(name)
    for dtype in DTYPES:
        model = torch.nn.Sequential(GemmaRMSNorm(256), torch.nn.Linear(256, 256), GemmaRMSNorm(256))
        model = model.to(device=DEVICE, dtype=dtype)
        with torch.no_grad():
            model[2].weight.normal_()
        x = torch.randn(5, 256, device=DEVICE).to(dtype)
        old = model[0], model[2]
        assert swap_rms_norm(model, mod.RMSNorm) == 2
        assert isinstance(model[2], mod.RMSNorm) and model[2].weight is old[1].weight
        assert model[2].weight_offset == 1.0
        for new, gemma in zip((model[0], model[2]), old, strict=True):
            torch.testing.assert_close(new(x), gemma(x), **TOL[dtype])
    with pytest.raises(ValueError, match=r"weight_offset 1\.0"):
        swap_rms_norm(torch.nn.Sequential(GemmaRMSNorm(8)), torch.nn.RMSNorm)


#: Every public function of a backend taking the offset, called with one (x, r, w: CPU or
#: GPU tensors; the checks run before any device work)
CALLS = {
    "rms_norm": lambda m, x, r, w, o: m.rms_norm(x, w, EPS, weight_offset=o),
    "rms_norm out=": lambda m, x, r, w, o: m.rms_norm(x, w, EPS, out=r, weight_offset=o),
    "fused_add_rms_norm": lambda m, x, r, w, o: m.fused_add_rms_norm(x, r, w, EPS, weight_offset=o),
    "fused_add_rms_norm_": lambda m, x, r, w, o: m.fused_add_rms_norm_(
        x, r, w, EPS, weight_offset=o
    ),
    "rms_norm_backward": lambda m, x, r, w, o: m.rms_norm_backward(r, x, w, EPS, weight_offset=o),
    "fused_add_rms_norm_backward": lambda m, x, r, w, o: m.fused_add_rms_norm_backward(
        r, None, x, w, EPS, weight_offset=o
    ),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_bad_offsets_refused(name, call):
    """An offset that is not a finite real number, or one without a weight, is refused by
    every function, naming weight_offset, in both backends (the CUDA one's C++ checks too,
    on any machine: they run before the device)."""
    fn_or_skip(name)
    mod = importlib.import_module(f"{name}_impl")
    x = torch.randn(3, 16, device=DEVICE)
    r = torch.randn(3, 16, device=DEVICE)
    w = torch.randn(16, device=DEVICE)
    f = CALLS[call]
    for bad in (float("nan"), float("inf"), -1e39):
        with pytest.raises(ValueError, match=r"weight_offset is .*; expected a finite number"):
            f(mod, x, r, w, bad)
    for bad in ("1.0", None, torch.tensor([1.0, 2.0])):
        with pytest.raises((TypeError, ValueError), match=r"weight_offset"):
            f(mod, x, r, w, bad)
    with pytest.raises(ValueError, match=r"weight_offset is 1\.0 but weight is None"):
        f(mod, x, r, None, 1.0)


@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_cpp_op_refuses_bad_offsets(name):
    """The registered ops themselves (torch.ops, as a direct caller would) refuse an offset
    out of range or without a weight, naming it."""
    fn_or_skip(name)
    importlib.import_module(f"{name}_impl")
    ops = getattr(torch.ops, f"{name}_impl")
    x = torch.randn(3, 16, device=DEVICE)
    w = torch.randn(16, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight_offset is nan; expected a finite number"):
        ops.rms_norm(x, w, EPS, float("nan"))
    with pytest.raises(ValueError, match=r"weight_offset is 2\.0 but weight is None"):
        ops.rms_norm(x, None, EPS, 2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_eager_paths_keep_offsets_apart(name):
    """The eager fast paths (kept plans, the C++ entry) never hand one offset's launch to a
    call with another: the same shapes with 0, 1, 0.5 and 0 again."""
    mod = backend(name)
    x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)
    w = weight_of(2048, torch.bfloat16, "dtype")
    for _ in range(2):
        for offset in (0.0, 1.0, 0.5, 0.0):
            got = mod.rms_norm(x, w, EPS, weight_offset=offset)
            torch.testing.assert_close(got, rms_norm_ref(x, w, EPS, offset), **TOL[torch.bfloat16])
    with pytest.raises(TypeError, match=r"weight_offset must be a real number"):
        mod.rms_norm(x, w, EPS, weight_offset=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_compiled(name):
    """Inside torch.compile(fullgraph=True), the offset a constant of the graph: the op with
    it between ordinary ops, forward and backward."""
    mod = backend(name)
    torch._dynamo.reset()

    def block(x, w):
        return mod.rms_norm(x * 2.0, w, EPS, weight_offset=1.0) + 1.0

    f = torch.compile(block, fullgraph=True, dynamic=False)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = weight_of(4096, torch.bfloat16, "dtype").requires_grad_()
    got = f(x, w)
    tol = TOL[torch.bfloat16]
    atol = tol["atol"] + torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(got, block(x, w), rtol=tol["rtol"], atol=atol)
    got.sum().backward()
    want = rms_norm_grads_ref(x * 2.0, w, EPS, torch.ones_like(x), 1.0)[1]
    grad_close(w.grad, want, "dweight")


@pytest.mark.parametrize("op_name", ["gemma_rms_norm", "gemma_fused_add_rms_norm"])
def test_harness_gemma_ops(op_name):
    """The harness's Gemma ops: our kernels with the offset against the op's reference
    (which adds it), and the second form too; the baselines' registry adds it or says why
    not (native has none)."""
    from harness.cases import Case
    from harness.ops import OPS

    op = OPS[op_name]
    impl = impl_or_skip("triton", impls=op.registry())
    case = Case("gemma", (5, 1000), torch.bfloat16)
    inputs = op.make_inputs(case, DEVICE, 0)
    ref = op.reference(*inputs)

    def outputs(t):
        return t if isinstance(t, tuple) else (t,)

    for got in (impl.fn(*inputs), op.second_form(impl, inputs, ref)):
        for g, want, name in zip(outputs(got), outputs(ref), op.outputs, strict=True):
            op.compare(g, want, name)
    # the offset is really added: the plain op's y differs
    plain = outputs(OPS[op_name.removeprefix("gemma_")].reference(*inputs))[0]
    assert not torch.allclose(plain.float(), outputs(ref)[0].float())
    assert "no weight offset" in op.registry(baselines=True)["native"].unavailable
