"""harness.model and rmsnorm_api.swap: the tiny decoder block with each variant against the
block in fp32 (and its training step's gradients against the step in fp32), the swap
helper, Amdahl's bound, the norm-share bookkeeping of the GPU run (run on CPU with the
device parts stood in for; the training step's forward and backward shares apart), the
command line, and the no-GPU path's committed table.
"""

import dataclasses
import json
import time

import pytest
import torch

from conftest import DEVICE, HAS_GPU, refusal
from harness import hardware, measure, model, records, timing
from harness.reference import fused_add_rms_norm_ref, rms_norm_ref
from rmsnorm_api.swap import VERIFY_TOL, is_rms_norm, swap_rms_norm

VARIANTS = model.variants()


def _runnable(name: str):
    why = model.why_not_on(VARIANTS[name], DEVICE)
    if why:
        pytest.skip(f"{name}: {why}")
    return VARIANTS[name]


# ---------------------------------------------------------------------------------------
# the tiny block
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ("prefill", "decode"))
@pytest.mark.parametrize("variant", model.VARIANTS)
def test_tiny_block_is_as_close_to_fp32_as_native(variant, shape):
    _runnable(variant)
    (row,) = model.check_blocks([shape], [variant], seed=3, device=DEVICE)
    assert row["skipped"] is None
    assert row["passed"], row


@pytest.fixture(scope="module")
def train_rows():
    """check_blocks' rows of the training step, every variant (one fp32 step for all)."""
    rows = model.check_blocks(["train"], list(model.VARIANTS), seed=3, device=DEVICE)
    return {row["variant"]: row for row in rows}


@pytest.mark.parametrize("variant", model.VARIANTS)
def test_tiny_training_step_is_as_close_to_fp32_as_native(variant, train_rows):
    """The step's outputs and all eight gradients (of x, residual and the six weights)."""
    _runnable(variant)
    row = train_rows[variant]
    if row["skipped"]:  # only a forward-only backward can be skipped here
        assert "forward-only" in row["skipped"], row
        pytest.skip(row["skipped"])
    assert row["passed"], row
    assert list(row["errors"]) == list(model.STEP_TENSORS)


def _train_rows(norm, seed=0):
    """check_train_block's rows for native and a variant of the given norm."""
    vs = {"native": VARIANTS["native"], "mine": model.Variant("mine", model.unfused(norm), norm)}
    vs["mine"] = dataclasses.replace(vs["mine"], cpu=True)
    w = model.make_weights(model.TINY, DEVICE, seed)
    shape = model.CPU_SHAPES["train"]
    return model.check_train_block(shape, vs, w, ["native", "mine"], seed, DEVICE)


class _ForwardOnly(torch.autograd.Function):
    """The identity, whose backward refuses as a forward-only kernel does: a norm or variant
    built on it has a right forward and a backward that is a skip, not a failure."""

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("ours: the kernels are forward-only for now (no backward yet)")


def test_a_wrong_backward_fails_the_train_check():
    """A norm whose forward is right but whose backward drops the variance's gradient (the
    projection term of dx): the step's outputs pass, its gradients do not."""

    def detached(x, weight, eps):
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True).detach()
        return weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)

    native, mine = _train_rows(detached)
    assert native["passed"] and not mine["passed"]
    assert mine["errors"]["out"] <= 2 * native["errors"]["out"]  # the forward is right
    assert mine["worst"].startswith("d ") and "from the fp32 step" in mine["error"]


def test_a_forward_only_backward_is_a_skip():
    def norm(x, weight, eps):
        return model.llama_rms_norm(_ForwardOnly.apply(x), weight, eps)

    _, mine = _train_rows(norm)
    assert "forward-only" in mine["skipped"] and "passed" not in mine


def test_train_agreement_limits_and_a_missing_gradient():
    names = ("out", "d w")
    truth = (torch.ones(4), torch.ones(4))
    got = (torch.ones(4) * 1.01, torch.ones(4) * 1.025)
    c = model.train_agreement(got, truth, names, native=[0.01, 0.01])
    assert c["passed"] and c["limit"] == pytest.approx(0.03) and c["worst"] == "d w"
    c = model.train_agreement((got[0], torch.ones(4) * 1.04), truth, names, native=[0.01, 0.01])
    assert not c["passed"] and c["error"].startswith("d w: relative L2 error")
    c = model.train_agreement((got[0], None), truth, names)
    assert not c["passed"] and "d w: no gradient" in c["error"]


def test_a_wrong_norm_fails_the_block_check():
    """The check tells a correct norm from a wiring bug (the weight left out)."""
    cfg, shape = model.TINY, model.CPU_SHAPES["prefill"]
    w = model.make_weights(cfg, DEVICE, 0)
    inputs = model.make_inputs(cfg, shape, DEVICE, 0)
    truth = model.fp32_block(cfg, w, inputs.args())
    native = model.block_fn(cfg, w, VARIANTS["native"].add_norm)(*inputs.args())
    native_err = model.agreement(native, truth)["rel_err"]
    no_weight = model.unfused(lambda x, weight, eps: model.llama_rms_norm(x, 1.0, eps))
    broken = model.block_fn(cfg, w, no_weight)(*inputs.args())
    got = model.agreement(broken, truth, native_err)
    assert not got["passed"] and "from the fp32 block" in got["error"]


def test_a_pass_variant_compiles_its_own_block():
    """A pass variant's block holds the same functions as native's (or ours), which the run
    compiles first: compiled under its own name it is traced anew, with the pass, not given
    native's compiled graph by dynamo (whose guards on the block's closures hold)."""
    import rmsnorm_api

    _runnable("triton_fused")  # the op the pass puts in (on CPU: the interpreter's)
    cfg, shape = model.TINY, model.CPU_SHAPES["prefill"]
    w = model.make_weights(cfg, DEVICE, 0)
    args = model.make_inputs(cfg, shape, DEVICE, 0).args()
    torch._dynamo.reset()
    try:
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
            for name in ("native", "triton_pass"):
                if name == "triton_pass":
                    fusion = rmsnorm_api.enable_compile_fusion("triton")
                block = model.block_fn(cfg, w, VARIANTS[name].add_norm, name)
                torch.compile(block, fullgraph=True, dynamic=False)(*args)
    finally:
        rmsnorm_api.disable_compile_fusion()
        torch._dynamo.reset()
    assert fusion.rewrites == 2  # both of the block's add + norm pairs


def test_decode_writes_only_the_cache_slot_of_the_new_token():
    cfg, shape = model.TINY, model.CPU_SHAPES["decode"]
    w = model.make_weights(cfg, "cpu", 0)
    inputs = model.make_inputs(cfg, shape, "cpu", 0)
    before = inputs.k_cache.clone()
    model.block_fn(cfg, w, VARIANTS["native"].add_norm)(*inputs.args())
    assert torch.equal(inputs.k_cache[:, :, :-1], before[:, :, :-1])
    assert not torch.equal(inputs.k_cache[:, :, -1], before[:, :, -1])


# ---------------------------------------------------------------------------------------
# swap_rms_norm
# ---------------------------------------------------------------------------------------


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, as written there (for machines without transformers)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class OnePlusRMSNorm(LlamaRMSNorm):
    """Shaped like LlamaRMSNorm, but scales by 1 + weight under a name swap_rms_norm does not
    know (as Gemma's norm does under its own): must not be swapped as a Llama norm."""

    def forward(self, hidden_states):
        return super().forward(hidden_states) / self.weight * (1.0 + self.weight)


def _llama_norm_classes():
    classes = [pytest.param(LlamaRMSNorm, id="test-defined")]
    tf, why = model._import("transformers")
    marks = [] if tf else [pytest.mark.skip(reason=f"transformers: {why}")]
    real = None
    if tf:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm as real
    classes.append(pytest.param(real, id="transformers", marks=marks))
    return classes


def _ours_module():
    return _runnable("triton").module


def _net(norm: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Sequential(norm))
    with torch.no_grad():
        norm.weight.copy_(1 + torch.randn(64) / 4)
    return net.to(DEVICE, torch.bfloat16)


def _x():
    return torch.randn(5, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16)


@pytest.mark.parametrize(
    "make",
    [pytest.param(lambda: torch.nn.RMSNorm(64, eps=1e-5), id="torch")] + _llama_norm_classes(),
)
def test_swap_replaces_keeps_weight_and_output(make):
    cls = _ours_module()
    norm = make() if not isinstance(make, type) else make(64, eps=1e-5)
    net = _net(norm)
    want = net(_x())
    weight = norm.weight.detach().clone()
    assert is_rms_norm(norm)
    assert swap_rms_norm(net, cls) == 1
    new = net[1][0]
    assert type(new) is cls and new.eps == 1e-5
    assert new.weight.dtype == torch.bfloat16 and new.weight.device.type == DEVICE
    assert torch.equal(new.weight.detach(), weight)
    with torch.no_grad():
        torch.testing.assert_close(net(_x()), want, atol=1e-2, rtol=2.0**-6)
    assert swap_rms_norm(net, cls) == 0  # already ours: left alone


def test_swap_to_native_and_without_weight():
    net = torch.nn.Sequential(LlamaRMSNorm(32), torch.nn.RMSNorm(32, elementwise_affine=False))
    assert swap_rms_norm(net, torch.nn.RMSNorm) == 1  # the nn.RMSNorm is one already
    assert type(net[0]) is torch.nn.RMSNorm and net[0].eps == 1e-6
    cls = _ours_module()
    assert swap_rms_norm(net.to(DEVICE), cls) == 2
    assert net[1].weight is None and net[1].eps is None


def test_swap_keeps_a_shared_norm_shared():
    norm = LlamaRMSNorm(16)
    net = torch.nn.ModuleDict({"a": torch.nn.Sequential(norm), "b": torch.nn.Sequential(norm)})
    assert swap_rms_norm(net, torch.nn.RMSNorm) == 1
    assert net["a"][0] is net["b"][0]


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda n: torch.nn.Sequential(n, torch.nn.Linear(64, 64), n), id="sequential"),
        pytest.param(lambda n: torch.nn.ModuleList([n, n, n]), id="module-list"),
    ],
)
def test_swap_fills_every_slot_of_a_norm_registered_twice(build):
    """A norm in several slots of one parent is swapped in each, for one replacement: the
    tie holds through a training step."""
    norm = LlamaRMSNorm(64)
    net = build(norm)
    assert swap_rms_norm(net, torch.nn.RMSNorm) == 1
    swapped = [m for m in net if not isinstance(m, torch.nn.Linear)]
    assert all(type(m) is torch.nn.RMSNorm for m in swapped)
    assert all(m is swapped[0] for m in swapped)
    assert swapped[0].weight is norm.weight  # the Parameter itself
    if isinstance(net, torch.nn.Sequential):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        net(torch.randn(3, 64)).square().sum().backward()
        opt.step()
        assert net[0] is net[2] and net[0].weight is norm.weight


def test_swap_keeps_the_weight_parameter_for_an_optimizer_built_before():
    norm = LlamaRMSNorm(16)
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), norm)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    swap_rms_norm(net, torch.nn.RMSNorm)
    net(torch.randn(4, 16)).square().sum().backward()
    before = net[1].weight.detach().clone()
    opt.step()
    assert not torch.equal(net[1].weight.detach(), before)  # the optimizer's step reached it


class BiasRMSNorm(LlamaRMSNorm):
    """An RMSNorm with a bias: state a plain RMSNorm would drop."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__(hidden_size, eps)
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size))

    def forward(self, hidden_states):
        return super().forward(hidden_states) + self.bias


def _with_buffer():
    norm = LlamaRMSNorm(8)
    norm.register_buffer("scale", torch.ones(8))
    return norm


def _with_hook():
    norm = LlamaRMSNorm(8)
    norm.register_forward_hook(lambda *args: None)
    return norm


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda: BiasRMSNorm(8), "parameter 'bias'"),
        (_with_buffer, "buffer 'scale'"),
        (_with_hook, "forward hook"),
    ],
)
@pytest.mark.parametrize("verify", [True, False])
def test_swap_refuses_a_norm_with_state_it_would_drop(make, what, verify):
    """The bias is zero at swap time, so outputs agree; it would still be dropped (and a
    later load_state_dict would put it nowhere): refused by the module's name, verify or
    not, before anything is swapped."""
    net = torch.nn.Sequential(LlamaRMSNorm(8), make())
    with pytest.raises(
        ValueError, match=rf"1 \(\w+RMSNorm\) not swapped for RMSNorm: it holds {what}"
    ):
        swap_rms_norm(net, torch.nn.RMSNorm, verify=verify)
    assert type(net[0]) is LlamaRMSNorm


class EpsOutsideRootRMSNorm(LlamaRMSNorm):
    """x / (rms + eps): the same output as LlamaRMSNorm on rows of unit rms, 31% off on
    activations of rms 3e-3 with eps 1e-5."""

    def forward(self, hidden_states):
        h = hidden_states.float()
        rms = h.square().mean(-1, keepdim=True).sqrt()
        return self.weight * (h / (rms + self.variance_epsilon)).to(hidden_states.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_swap_verify_tests_rows_where_eps_matters(dtype):
    """Verification runs rows of tiny, unit and large rms in the module's dtype: a norm
    that agrees at unit rms only is refused; the real LlamaRMSNorm passes beside it."""
    net = torch.nn.Sequential(LlamaRMSNorm(64, eps=1e-5), EpsOutsideRootRMSNorm(64, eps=1e-5))
    net = net.to(DEVICE, dtype)
    with torch.no_grad():  # at unit rms the two agree to the dtype's rounding
        x = torch.randn(4, 64, device=DEVICE).to(dtype)
        torch.testing.assert_close(net[1](x), net[0](x), **VERIFY_TOL[dtype])
    with pytest.raises(
        ValueError, match=r"1 \(EpsOutsideRootRMSNorm\) not swapped .* on a row of rms"
    ):
        swap_rms_norm(net, _ours_module())
    assert type(net[0]) is LlamaRMSNorm and type(net[1]) is EpsOutsideRootRMSNorm
    assert swap_rms_norm(torch.nn.Sequential(net[0]), _ours_module()) == 1


@pytest.mark.parametrize(
    "net, cls, what",
    [
        (
            lambda: torch.nn.Sequential(LlamaRMSNorm(8)).to("meta"),
            torch.nn.RMSNorm,
            r"0 \(LlamaRMSNorm\) .*on the meta device.*; pass verify=False",
        ),
        (
            lambda: torch.nn.Sequential(LlamaRMSNorm(8)).double(),
            None,
            r"0 \(LlamaRMSNorm\) .*could not run it to check \(TypeError: .*float64.*verify=False",
        ),
        (
            lambda: torch.nn.Sequential(LlamaRMSNorm(8, eps=0)),
            None,
            r"0 \(LlamaRMSNorm\) .*refuses the module's width 8 or eps 0 .*eps is 0",
        ),
        (
            lambda: torch.nn.Sequential(LlamaRMSNorm(8, eps=10**400)),
            None,
            r"0 \(LlamaRMSNorm\) .*eps is 1000.*; expected a number in float32's normal range",
        ),
    ],  # fmt: skip
)
def test_swap_errors_name_the_module(net, cls, what):
    """Whatever stops a swap is a ValueError naming the module and what to do."""
    with pytest.raises(ValueError, match=what):
        swap_rms_norm(net(), cls or _ours_module())


def test_swap_checks_a_float64_norm_for_a_class_that_takes_it():
    net = torch.nn.Sequential(LlamaRMSNorm(8)).double()
    assert swap_rms_norm(net, torch.nn.RMSNorm) == 1


def test_swap_without_verify_on_the_meta_device():
    """A model built on the meta device swaps unchecked, its weights loaded after."""
    net = torch.nn.Sequential(LlamaRMSNorm(8)).to("meta")
    assert swap_rms_norm(net, torch.nn.RMSNorm, verify=False) == 1
    assert net[0].weight.is_meta


def test_swap_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="swap_rms_norm: model must be a torch.nn.Module"):
        swap_rms_norm("model", torch.nn.RMSNorm)
    with pytest.raises(TypeError, match="swap_rms_norm: module_cls must be"):
        swap_rms_norm(torch.nn.Linear(2, 2), "RMSNorm")
    with pytest.raises(TypeError, match="module_cls"):
        swap_rms_norm(torch.nn.Linear(2, 2), int)
    with pytest.raises(ValueError, match="model is itself a LlamaRMSNorm"):
        swap_rms_norm(LlamaRMSNorm(8), torch.nn.RMSNorm)


def test_swap_refuses_a_look_alike_that_computes_otherwise():
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), OnePlusRMSNorm(8))
    with torch.no_grad():
        net[1].weight.fill_(0.5)
    with pytest.raises(ValueError, match=r"1 \(OnePlusRMSNorm\) not swapped for RMSNorm"):
        swap_rms_norm(net, torch.nn.RMSNorm)
    assert type(net[1]) is OnePlusRMSNorm  # nothing swapped
    assert swap_rms_norm(net, torch.nn.RMSNorm, verify=False) == 1


def test_swapped_transformers_layer_agrees():
    why, checks = model.check_layer(list(model.LAYER_VARIANTS), seed=0, device=DEVICE)
    if why:
        pytest.skip(f"transformers layer: {why}")
    assert {"native", "eager"} <= set(checks)
    for name, c in checks.items():
        assert c["passed"], (name, c)
    assert checks["native"]["against"] == "the block in fp32"


def test_swapped_transformers_layer_trains():
    """The layer's training step (own norm, swapped to native, to ours) against the block's
    step in fp32: its output and the gradients of its input and of every weight."""
    names = list(model.LAYER_VARIANTS)
    why, checks = model.check_layer(names, seed=0, device=DEVICE, shape="train")
    if why:
        pytest.skip(f"transformers layer: {why}")
    assert {"native", "eager"} <= set(checks)
    for name, c in checks.items():
        if "skipped" in c:
            assert name not in ("native", "eager") and "forward-only" in c["skipped"]
            continue
        assert c["passed"], (name, c)
        assert list(c["errors"]) == list(model.LAYER_STEP_TENSORS)
    assert checks["native"]["against"] == "the step in fp32"


# ---------------------------------------------------------------------------------------
# Amdahl's law and the norm's share
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "f, s, bound",
    [(0.0, 5.0, 1.0), (1.0, 2.0, 2.0), (0.5, 2.0, 4 / 3), (0.1, 1.0, 1.0), (0.2, 0.5, 1 / 1.2)],
)
def test_amdahl_bound_known_values(f, s, bound):
    assert model.amdahl_bound(f, s) == pytest.approx(bound)


@pytest.mark.parametrize("f, s", [(-0.1, 2.0), (1.5, 2.0), (0.5, 0.0), (0.5, float("nan"))])
def test_amdahl_bound_refuses_nonsense(f, s):
    with pytest.raises(ValueError, match="amdahl_bound"):
        model.amdahl_bound(f, s)


def test_exceeds_means_by_more_than_the_spread():
    assert model.exceeds(1.10, 1.09, 1.11, 1.05)  # 0.05 above, spread 0.02
    assert not model.exceeds(1.06, 1.04, 1.08, 1.05)  # 0.01 above, spread 0.04
    assert not model.exceeds(0.99, 0.98, 1.0, 1.01)


def _k(**kernels):
    return {n: {"count": c, "us": us} for n, (c, us) in kernels.items()}


def test_norm_share_by_name_and_alone():
    ln = "void at::native::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int)"
    block = {**_k(gemm=(4, 400.0), add=(2, 8.0)), ln: {"count": 2, "us": 12.0}}
    got = model.norm_share(block, {ln: {"count": 1, "us": 5.0}})
    assert got["method"] == "name" and got["us"] == 12.0 and list(got["kernels"]) == [ln]
    # the composite's kernels are not norm kernels by name: twice the norm alone
    composite = _k(mul=(3, 3.0), mean=(1, 2.0))
    got = model.norm_share(block, composite)
    assert got["method"] == "alone" and got["us"] == 10.0 and got["kernels"]["mul"]["count"] == 6
    # norm kernels by name, but not as many as two norms: said, then alone
    got = model.norm_share({ln: {"count": 3, "us": 9.0}}, {ln: {"count": 1, "us": 5.0}})
    assert got["method"] == "alone" and "3 norm kernels a block" in got["note"]


@pytest.mark.parametrize(
    "name, norm",
    [
        ("_rms_norm_fwd_fused", True),
        ("_fused_add_rms_norm_fwd_fused", True),
        ("void cuda_impl::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16>(float)", True),
        ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", True),
        ("void at::native::RowwiseMomentsCUDAKernel<c10::BFloat16, float, true>(long)", True),
        ("void at::native::LayerNormForwardCUDAKernel<c10::BFloat16, float>(long)", True),
        ("triton_poi_fused_add_cat_mul_3", False),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps>>", False),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", False),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", False),
    ],
)
def test_is_norm_kernel(name, norm):
    assert model.is_norm_kernel(name) is norm


@pytest.mark.parametrize(
    "name, part",
    [
        ("_rms_norm_fwd_fused", "forward"),
        ("_rms_norm_bwd", "backward"),
        ("_dw_reduce", "backward"),
        (
            "void cuda_impl::(anonymous namespace)::rms_norm_bwd_kernel<__nv_bfloat16>(BwdArgs)",
            "backward",
        ),
        (
            "void cuda_impl::(anonymous namespace)::dw_reduce_kernel<__nv_bfloat16>(float const*)",
            "backward",
        ),
        (
            "void at::native::(anon)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>",
            "forward",
        ),
        (
            "void at::native::(anon)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16>",
            "backward",
        ),
        (
            "void at::native::(anon)::GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16, float>",
            "backward",
        ),
        ("triton_red_fused__fused_rms_norm_add_0", "forward"),
        ("triton_red_fused__fused_rms_norm_backward_add_5", "backward"),
        ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "forward"),
    ],
)
def test_norm_kernel_parts(name, part):
    other = "forward" if part == "backward" else "backward"
    assert model.is_norm_kernel(name) and model.is_norm_kernel(name, part)
    assert not model.is_norm_kernel(name, other)


@pytest.mark.parametrize(
    "name",
    [
        "pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, func_wrapper>>",
        "triton_poi_fused_mul_silu_silu_backward_4",
        "triton_red_fused_sum_7",
    ],
)
def test_a_block_backward_kernel_is_no_norm_kernel(name):
    assert not model.is_norm_kernel(name) and not model.is_norm_kernel(name, "backward")


def test_norm_share_of_a_part_mixed():
    block = _k(gemm=(8, 800.0), _rms_norm_fwd_fused=(2, 20.0), _rms_norm_bwd=(2, 30.0))
    block["fill"] = {"count": 3, "us": 3.0}  # shared with the rest of the step
    bwd = _k(_rms_norm_bwd=(1, 14.0), fill=(1, 1.0))
    got = model.norm_share(block, bwd, part="backward", mixed=True)
    assert got["method"] == "name+alone" and got["us"] == 32.0
    assert got["kernels"]["fill"] == {"count": 2, "us": 2.0, "alone": True}
    assert "_rms_norm_fwd_fused" not in got["kernels"]  # the forward part is not counted
    # without mixed (the forward-only blocks' rule) the same piece is counted alone
    assert model.norm_share(block, bwd, part="backward")["method"] == "alone"
    # the forward part, by name
    fwd = model.norm_share(block, _k(_rms_norm_fwd_fused=(1, 10.0)), part="forward", mixed=True)
    assert fwd["method"] == "name" and fwd["us"] == 20.0


def test_kernels_beyond_and_train_share():
    both = _k(_rms_norm_fwd_fused=(1, 10.0), _rms_norm_bwd=(1, 14.0), mul=(3, 6.0))
    fwd_alone = _k(_rms_norm_fwd_fused=(1, 9.0), mul=(1, 2.0))
    bwd = model.kernels_beyond(both, fwd_alone)
    assert bwd == _k(_rms_norm_bwd=(1, 14.0), mul=(2, 4.0))
    block = _k(gemm=(8, 900.0), _rms_norm_fwd_fused=(2, 20.0), _rms_norm_bwd=(2, 30.0))
    block["mul"] = {"count": 9, "us": 20.0}
    got = model.train_share(block, fwd_alone, bwd)
    assert got["fwd"]["method"] == "name+alone" and got["fwd"]["us"] == 24.0  # 20 + 2 x 2
    assert got["bwd"]["method"] == "name+alone" and got["bwd"]["us"] == 38.0  # 30 + 2 x 4
    assert got["us"] == 62.0 and got["method"] == "name+alone / name+alone"
    assert got["kernels"]["mul"]["count"] == 6 and got["kernels"]["mul"]["us"] == 12.0
    # a step whose norm kernels do not add up: the part is counted alone, with a note
    short = {**block, "_rms_norm_bwd": {"count": 1, "us": 15.0}}
    got = model.train_share(short, fwd_alone, bwd)
    assert got["bwd"]["method"] == "alone" and "norm backward kernels" in got["note"]


def test_short_kernel_names():
    ln = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16>(int)"
    assert model.short_kernel(ln) == "vectorized_layer_norm_kernel"
    assert model.short_kernel("_rms_norm_fwd_fused") == "_rms_norm_fwd_fused"


# ---------------------------------------------------------------------------------------
# the GPU run's bookkeeping, on CPU: the device parts stood in for
# ---------------------------------------------------------------------------------------

#: Seconds a block of each variant "takes" in the stand-in timing.
_BLOCK_S = {"native": 1.0e-3, "eager": 1.1e-3, "triton": 0.99e-3, "triton_fused": 0.95e-3}
_NORM = "_rms_norm_fwd_fused"


def _fake_kernels(call, calls=1):
    call()
    if getattr(getattr(call, "func", None), "__name__", "") == "run":  # a block
        return _k(gemm=(4, 400.0), add=(2, 4.0), **{_NORM: (2, 20.0)})
    return _k(**{_NORM: (1, 10.0)})  # a norm or step alone


def _fake_blocks(b, fns):
    def seconds(name):
        return 10e-6 if name.startswith(("norm:", "step:")) else _BLOCK_S.get(name, 1e-3)

    return {n: [[seconds(n)] * 5 for _ in range(3)] for n in fns}, None


@pytest.fixture
def dry_run(tmp_path, monkeypatch):
    """A Run on CPU whose profiler, timing and graph replay are stood in for."""
    monkeypatch.setattr(model.alone, "kernel_times", _fake_kernels)
    monkeypatch.setattr(model.job, "kernel_times", _fake_kernels)
    monkeypatch.setattr(measure, "time_blocks", _fake_blocks)
    monkeypatch.setattr(timing, "warm_up", lambda fns, seconds=0: [f() for f in fns])
    monkeypatch.setattr(timing, "graph_samples", lambda fn, *a, **k: [5e-6] * 10)
    path = tmp_path / "records.jsonl"
    writer = records.RecordWriter(path, append=False)
    b = measure.Bench("t", hardware.environment(), writer, None, 50e6, 0)
    # ours stood in for by the reference (the bookkeeping is under test, not the kernels),
    # so this runs alike with or without the interpreter
    real = model.variants()
    vs = {
        "native": real["native"],
        "eager": real["eager"],
        "triton": model.Variant("triton", model.unfused(rms_norm_ref), rms_norm_ref, cpu=True),
        "triton_fused": model.Variant("triton_fused", fused_add_rms_norm_ref, None, cpu=True),
    }
    w = model.make_weights(model.TINY, "cpu", 0)
    run = model.Run(b, model.TINY, w, vs, time.perf_counter(), 1e9, 0, device="cpu")
    yield run, path
    writer.close()


def test_gpu_run_bookkeeping(dry_run):
    run, path = dry_run
    names = list(run.variants)
    with torch.no_grad():
        for shape in ("prefill", "decode"):
            model.run_job(run, model.CPU_SHAPES[shape], "eager", names)
    run.b.writer.close()
    recs = records.read_records(path)
    blocks = [r for r in recs if r["kind"] == "model"]
    assert len(blocks) == 2 * len(names) and all(r["status"] == "PASS" for r in blocks)
    by = {(r["model"]["shape"], r["impl"]): r["model"] for r in blocks}
    native = by[("prefill", "native")]
    assert native["norm"]["method"] == "name" and native["norm"]["f"] == pytest.approx(20 / 424)
    assert native["bound"] == pytest.approx(1.0) and native["speedup"]["median"] == 1.0
    assert not native["flag"]
    fused = by[("prefill", "triton_fused")]
    assert fused["speedup"]["median"] == pytest.approx(1 / 0.95)
    assert fused["s_cold"] == pytest.approx(1.0) and fused["flag"]  # above a bound of 1
    assert "fusion of the add" in fused["why"][0]
    assert not by[("prefill", "eager")]["flag"]  # slower: never above its bound
    timed = [r for r in recs if r["kind"] == "timing"]
    assert {r["op"] for r in timed} == {"rms_norm", "fused_add_rms_norm"}
    assert {r["mode"] for r in timed} == {"cold", "graph"}
    text = model.render(recs)
    assert "### the block, prefill" in text and "### the block, decode" in text
    assert "Above the bound, and why:" in text and "fusion of the add" in text
    assert f"{_NORM} x2 20.0" in text
    json.dumps(recs)  # what was written is plain JSON


def test_a_variant_that_fails_is_recorded_and_the_rest_run(dry_run, monkeypatch):
    run, path = dry_run

    def broken(x, residual, weight, eps):
        raise RuntimeError("boom")

    run.variants["triton"] = model.Variant("triton", broken, None, cpu=True)
    with torch.no_grad():
        model.run_job(run, model.CPU_SHAPES["decode"], "eager", list(run.variants))
    run.b.writer.close()
    recs = [r for r in records.read_records(path) if r["kind"] == "model"]
    status = {r["impl"]: r["status"] for r in recs}
    assert status.pop("triton") == "FAIL" and set(status.values()) == {"PASS"}
    assert run.failed == 1


_FWD, _BWD = "_rms_norm_fwd_fused", "_rms_norm_bwd"


def _fake_train_kernels(call, calls=1):
    """A training step's kernels: the block's (or the layer's) step, a piece's forward +
    backward, or a piece's forward; fill is a kernel the rest of the step launches too."""
    call()
    name = getattr(getattr(call, "func", None), "__name__", "")
    if isinstance(call, model.LayerStep) or (name == "_step" and call.args[0].__name__ == "run"):
        return _k(
            gemm=(12, 1000.0), add=(4, 8.0), fill=(3, 6.0), **{_FWD: (2, 20.0), _BWD: (2, 30.0)}
        )
    if name == "_step":
        return _k(fill=(1, 1.0), **{_FWD: (1, 10.0), _BWD: (1, 14.0)})
    return _k(**{_FWD: (1, 10.0)})


def test_train_step_bookkeeping(dry_run, monkeypatch):
    """The train shape's records: the step's forward and backward norm shares apart (by
    name, the backward's fill from the norm alone), s of the forward + backward alone, the
    bound and the measured speedup; the transformers layer's step beside them; the table."""
    run, path = dry_run
    monkeypatch.setattr(model.alone, "kernel_times", _fake_train_kernels)
    monkeypatch.setattr(model.job, "kernel_times", _fake_train_kernels)
    del run.variants["eager"]
    names = list(run.variants)
    with torch.no_grad():  # as run_gpu: the step turns autograd on for itself
        model.run_job(run, model.CPU_SHAPES["train"], "eager", names)
    run.b.writer.close()
    recs = records.read_records(path)
    blocks = [r for r in recs if r["kind"] == "model"]
    assert len(blocks) == len(names) and all(r["status"] == "PASS" for r in blocks), blocks
    by = {r["impl"]: r["model"] for r in blocks}
    native = by["native"]["norm"]
    assert native["method"] == "name / name+alone"
    assert native["fwd"]["f"] == pytest.approx(20 / 1064)
    assert native["bwd"]["f"] == pytest.approx((30 + 2) / 1064)
    assert native["f"] == pytest.approx(52 / 1064)
    assert native["bwd"]["kernels"]["fill"]["alone"]
    assert by["triton"]["speedup"]["median"] == pytest.approx(1 / 0.99)
    assert by["triton"]["bound"] == pytest.approx(1.0)  # every piece alone takes 10 us
    assert by["native"]["config"]["train"] is True
    timed = [r for r in recs if r["kind"] == "timing"]
    assert {r["impl"] for r in timed} >= {"native+bwd", "triton_fused+bwd"}
    assert all("forward + backward" in r["notes"][0] for r in timed)
    norm_rec = next(r for r in timed if r["impl"] == "native+bwd" and r["op"] == "rms_norm")
    assert norm_rec["bytes"] == 5 * norm_rec["shape"][0] * norm_rec["shape"][1] * 2 + 3 * 256 * 2
    text = model.render(recs)
    assert "### the block, train (2 x 16 tokens, causal, forward + backward)" in text
    assert "norm f: fwd + bwd = all (how)" in text and "step us (p20-p80)" in text
    assert "| 1.9% + 3.0% = 4.9% (name / name+alone) |" in text
    assert "eager, ours against native: triton x1.010" in text and "no slower" in text
    assert "fwd (name): _rms_norm_fwd_fused x2 20.0; bwd (name+alone): " in text
    assert "fill x2 2.0 (alone)" in text
    json.dumps(recs)


def test_train_step_layer_bookkeeping(dry_run, monkeypatch):
    if model._import("transformers")[0] is None:
        pytest.skip("transformers not importable")
    run, path = dry_run
    monkeypatch.setattr(model.alone, "kernel_times", _fake_train_kernels)
    monkeypatch.setattr(model.job, "kernel_times", _fake_train_kernels)
    monkeypatch.setitem(model.GPU_SHAPES, "train", model.CPU_SHAPES["train"])
    with torch.no_grad():
        model.run_layer_job(run, ["native", "eager"], "train")
    run.b.writer.close()
    recs = [r for r in records.read_records(path) if r["kind"] == "model"]
    assert {r["impl"] for r in recs} == {"native", "eager"}
    assert all(r["status"] == "PASS" and r["op"] == model.LAYER_OP for r in recs), recs
    assert all(r["model"]["shape"] == "train" and r["model"]["norm"]["fwd"] for r in recs)
    assert "### transformers' LlamaDecoderLayer, train" in model.render(recs)


def test_a_forward_only_variant_is_a_skip_in_the_train_job(dry_run, monkeypatch):
    run, path = dry_run
    monkeypatch.setattr(model.alone, "kernel_times", _fake_train_kernels)
    monkeypatch.setattr(model.job, "kernel_times", _fake_train_kernels)

    def forward_only(x, residual, weight, eps):
        return model.fused_add_rms_norm_ref(_ForwardOnly.apply(x), residual, weight, eps)

    run.variants = {
        "native": run.variants["native"],
        "triton_fused": model.Variant("triton_fused", forward_only, None, cpu=True),
    }
    with torch.no_grad():
        model.run_job(run, model.CPU_SHAPES["train"], "eager", list(run.variants))
    run.b.writer.close()
    recs = [r for r in records.read_records(path) if r["op"] == model.BLOCK_OP]
    status = {r["impl"]: r["status"] for r in recs}
    assert status.pop("triton_fused") == "SKIP" and set(status.values()) == {"PASS"}
    skip = next(r for r in recs if r["impl"] == "triton_fused")
    assert "forward-only" in skip["notes"][0] and run.failed == 0


def test_plan_jobs_runs_the_compiles_last():
    """The block's eager and graph modes, then the layers' eager jobs (Llama's, Qwen3's and
    Gemma 3's, at prefill) and the FP8 block's, then the compiles, the family layers' and
    the FP8 block's last."""
    jobs = model.plan_jobs(["prefill", "decode"], list(model.MODES), layer=True)
    assert jobs[:9] == [
        ("prefill", "eager"),
        ("prefill", "graph"),
        ("decode", "eager"),
        ("decode", "graph"),
        ("layer", "eager"),
        ("qwen3", "eager"),
        ("gemma3", "eager"),
        ("fp8_static", "eager"),
        ("fp8_token", "eager"),
    ]
    assert all(m.startswith("compile") for _, m in jobs[9:]) and len(jobs) == 17
    assert jobs[-4:] == [("qwen3", "compile"), ("gemma3", "compile"), ("fp8_static", "compile"),
                         ("fp8_token", "compile")]  # fmt: skip
    assert ("layer", "eager") not in model.plan_jobs(["decode"], ["eager"], layer=True)
    assert ("qwen3", "eager") not in model.plan_jobs(["decode"], ["eager"], layer=True)


def test_plan_jobs_of_the_training_step():
    """train: eager and compile only (its graph modes are named as not applicable), its
    layer job after the eager jobs, its compile among the compiles."""
    jobs = model.plan_jobs(["prefill", "train"], list(model.MODES), layer=True)
    assert jobs == [
        ("prefill", "eager"),
        ("prefill", "graph"),
        ("train", "eager"),
        ("layer", "eager"),
        ("layer_train", "eager"),
        ("qwen3", "eager"),
        ("gemma3", "eager"),
        ("fp8_static", "eager"),
        ("fp8_token", "eager"),
        ("prefill", "compile"),
        ("prefill", "compile_graph"),
        ("train", "compile"),
        ("qwen3", "compile"),
        ("gemma3", "compile"),
        ("fp8_static", "compile"),
        ("fp8_token", "compile"),
    ]
    assert model.plan_jobs(["train"], ["eager", "compile"], layer=False) == [
        ("train", "eager"),
        ("train", "compile"),
    ]
    assert model.not_applicable(["train"], list(model.MODES)) == [
        "train/graph",
        "train/compile_graph",
    ]
    assert model.not_applicable(["prefill", "decode"], list(model.MODES)) == []


# ---------------------------------------------------------------------------------------
# the command line and the no-GPU path
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shapes", "prefill,bogus"], "--shapes: unknown bogus; choose from prefill,decode"),
        (["--shapes", ","], "--shapes: ',' names nothing"),
        (["--modes", "eager,fast"], "--modes: unknown fast; choose from eager,graph"),
        (["--modes", ""], "--modes: '' names nothing"),
        (["--variants", "triton,liger"], "--variants: unknown liger; choose from native"),
        (["--budget-s", "0"], "--budget-s is 0.0"),
        (["--budget-s", "nan"], "--budget-s is nan"),
        (["--budget-s", "x"], "--budget-s"),
        (["--seed", "1.5"], "--seed"),
    ],
)
def test_cli_refuses_bad_flags(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(model.cli, "run_cpu", lambda args: pytest.fail("work started"))
    monkeypatch.setattr(model.cli, "run_gpu", lambda args, out: pytest.fail("work started"))
    assert message in refusal(model.main, argv, capsys)


def test_cli_refuses_a_bad_out(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert "--out" in refusal(model.main, ["--out", str(a_file)], capsys)


def test_native_always_runs():
    assert model.parse_args(["--variants", "triton_fused, triton"]).variants == [
        "native",
        "triton",
        "triton_fused",
    ]


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_cpu_path_says_the_committed_table_is_absent(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(model.cpu, "COMMITTED", tmp_path / "none")
    argv = ["--shapes", "decode", "--variants", "triton", "--no-layer", "--modes", "graph"]
    assert model.main(argv + ["--append"]) == 0
    out = capsys.readouterr().out
    assert "ignored: --modes" in out and "--append" in out and "--budget-s" not in out
    assert "block decode   triton" in out and "PASS" in out
    assert "no committed H200 model results yet" in out


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_cpu_path_checks_the_training_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(model.cpu, "COMMITTED", tmp_path / "none")
    assert model.main(["--shapes", "train", "--variants", "eager", "--no-layer"]) == 0
    out = capsys.readouterr().out
    assert "the training step's gradients within 3x native's" in out
    assert "block train    native" in out and "block train    eager" in out
    assert "block prefill" not in out and "FAIL" not in out


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_cpu_path_prints_the_committed_table(dry_run, tmp_path, monkeypatch, capsys):
    run, path = dry_run
    with torch.no_grad():
        model.run_job(run, model.CPU_SHAPES["decode"], "eager", list(run.variants))
    run.b.writer.close()
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / model.RECORDS_NAME).write_text(path.read_text())
    monkeypatch.setattr(model.cpu, "COMMITTED", committed)
    monkeypatch.setattr(model.cpu, "check_blocks", lambda *a, **k: [])
    assert model.main(["--no-layer"]) == 0
    out = capsys.readouterr().out
    assert f"the committed H200 run ({committed / model.RECORDS_NAME})" in out
    assert "| eager | triton_fused |" in out


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
@pytest.mark.parametrize("shapes", ["prefill", "train", "prefill,decode,train"])
def test_cpu_path_says_once_the_layer_is_not_checked(shapes, tmp_path, monkeypatch, capsys):
    """Without transformers the layer's check is said to be skipped once, whatever the
    shapes, with the extra that installs it; nothing per shape."""
    monkeypatch.setattr(model.cpu, "COMMITTED", tmp_path / "none")
    monkeypatch.setattr(model.cpu, "check_blocks", lambda *a, **k: [])
    real = model._import
    monkeypatch.setattr(
        model.cpu,
        "_import",
        lambda p: (None, f"{p} not importable (stand-in)") if p == "transformers" else real(p),
    )
    monkeypatch.setattr(model.cpu, "check_layer", lambda *a, **k: pytest.fail("layer checked"))
    assert model.main(["--shapes", shapes]) == 0
    out = capsys.readouterr().out
    assert out.count("transformers layer") == 1, out
    assert "transformers layer: not checked: transformers not importable" in out
    assert "pip install -r requirements-model.txt" in out


def test_requirements_model_is_the_base_plus_transformers():
    """The optional extra README names for harness.model's transformers check."""
    from pathlib import Path

    repo = Path(model.__file__).resolve().parents[2]
    lines = [
        ln.split("#")[0].strip()
        for ln in (repo / "requirements-model.txt").read_text().splitlines()
    ]
    assert [ln for ln in lines if ln] == ["-r requirements.txt", "transformers"]
    assert "pip install -r requirements-model.txt" in (repo / "README.md").read_text()


def test_speedup_lies_in_its_range_of_blocks():
    """The speedup is the median of the per-block ratios, so it lies in their range (the
    ratio of the pooled medians need not, as the committed eager cuda row showed)."""
    base = [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    mine = [[0.99] * 3, [0.99] * 3, [2.5] * 3]
    sp = model._speedup(base, mine)
    assert sp["lo"] <= sp["median"] <= sp["hi"]
    assert sp["median"] == pytest.approx(1.0 / 0.99)
    # the committed table, redrawn from its records: every value within its range
    import re

    path = model.COMMITTED_RECORDS
    text = model.render(records.read_records(path))
    got = re.findall(r"(\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\]", text)
    assert got and all(float(lo) <= float(v) <= float(hi) for v, lo, hi in got)
    assert "[range of blocks]" in text


def test_the_pass_runs_at_the_training_step_and_old_records_stay_skipped():
    """The pass rewrites training graphs, so the job runs it there (pass_not_applicable
    names eager modes only); a training record an earlier run wrote, whose pass left the
    graph (none of the fused op's kernels ran), is drawn as not applicable, not as a
    speedup of the pass; one whose kernels show the fused op is drawn."""
    from harness.model.config import pass_left, pass_not_applicable

    assert pass_not_applicable("compile") is None
    assert "compiled graphs" in pass_not_applicable("eager")
    assert "left the training graph" in pass_left({"names": ["triton_red_fused_add"]}, True)
    assert "left the graph" in pass_left({"names": ["triton_red_fused_add"]})
    assert pass_left({"names": ["_fused_add_rms_norm_fwd_looped"]}) is None
    # CUDA: the fused add's forward kernel (a residual type), not the plain op's (void),
    # which a plain_pass block runs when the pass left it
    cuda = "void cuda_impl::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16, __nv_bfloat16, "
    assert pass_left({"names": [cuda + "__nv_bfloat16, 128, 4, false, 3>(...)"]}) is None
    plain = {"names": [cuda + "void, 256, 2, false, 32>(...)", "_rms_norm_fwd_looped"]}
    assert "left the training graph" in pass_left(plain, True)
    committed = model.COMMITTED_RECORDS
    recs = records.read_records(committed)
    timed = [r for r in recs if (r.get("model") or {}).get("variant") == "triton_pass"
             and r["model"]["shape"] == "train" and r["status"] == "PASS"]  # fmt: skip
    if not timed:
        pytest.skip("no training record of the pass in the committed records")
    train = [r for r in recs if (r.get("model") or {}).get("shape") == "train"]
    text = model.render(train)
    rows = [line for line in text.splitlines() if "| compile | triton_pass |" in line]
    assert rows and all("SKIP: not run: not applicable: this record's pass left" in r for r in rows)
    assert "triton_pass x" not in text


def test_compiled_pass_records_without_the_fused_op_are_not_the_pass():
    """A compiled pass record whose block ran none of the fused op's kernels timed the
    block without the pass (the committed H200 run's prefill and decode rows: dynamo gave
    the pass variants native's compiled graph) and is drawn as not applicable."""
    committed = model.COMMITTED_RECORDS
    recs = [r for r in records.read_records(committed)
            if (r.get("model") or {}).get("shape") in ("prefill", "decode")]  # fmt: skip
    text = model.render(recs)
    heads = ("| compile | triton_pass |", "| compile | cuda_pass |")
    rows = [line for line in text.splitlines() if line.startswith(heads)]
    assert rows and all("pass left the graph" in r for r in rows)


def test_family_layer_bookkeeping(dry_run):
    """A family layer's job (Qwen3's, Gemma 3's) on the dry run: a record a variant, the
    eager layer's speedup 1 over itself, native a skip for Gemma 3 (its offset) with the
    reason, and each family's table in the report."""
    if model._import("transformers")[0] is None:
        pytest.skip("transformers not importable")
    run, path = dry_run
    triton = model.variants()["triton"]  # the layers swap its module: the real one
    if triton.unavailable or not triton.cpu:
        pytest.skip(f"triton does not run on CPU here ({triton.unavailable or 'no interpreter'})")
    run.variants["triton"] = triton
    with torch.no_grad():
        for family in model.FAMILIES:
            model.run_family_job(run, family, model.CPU_SHAPES["prefill"], "eager",
                                 ["native", "eager", "triton"])  # fmt: skip
    run.b.writer.close()
    recs = [r for r in records.read_records(path) if r["kind"] in ("model", "skip")]
    by = {(r["op"], r["impl"]): r for r in recs}
    for family in model.FAMILIES:
        eager = by[(model.family_op(family), "eager")]
        assert eager["status"] == "PASS" and eager["model"]["speedup"]["median"] == 1.0
        assert by[(model.family_op(family), "triton")]["status"] == "PASS"
    assert by[(model.family_op("qwen3"), "native")]["status"] == "PASS"
    gemma_native = by[(model.family_op("gemma3"), "native")]
    assert gemma_native["status"] == "SKIP" and "weight_offset" in gemma_native["notes"][0]
    text = model.render(records.read_records(path))
    assert "### transformers' Qwen3DecoderLayer, every norm swapped, prefill" in text
    assert "### transformers' Gemma3DecoderLayer, every norm swapped, prefill" in text
    assert "speedup is over the layer with its own norms" in text


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fp8_block_checks_its_wiring(device):
    """The FP8 block of the tiny sizes (on a GPU: torch._scaled_mm itself, both scalings):
    native's (the unfused model) and our quantised fused add pass against the bf16 block
    in fp32, with each scaling; the static scales are at least every token's; a norm whose
    output is twice the norm's (its scale a token's absorbs nothing downstream) fails."""
    from harness.model import fp8

    cfg, shape = model.TINY, model.CPU_SHAPES["prefill"]
    checks = model.check_fp8(cfg, model.variants(), shape, 0, device=device)
    for scaling in model.FP8_SCALINGS:
        for name in ("native", "triton", "cuda"):
            if "skipped" not in checks[scaling][name]:
                assert checks[scaling][name]["passed"], (scaling, name, checks[scaling][name])
        assert "skipped" not in checks[scaling]["native"]
    weights = model.make_weights(cfg, device, 0)
    args = model.make_inputs(cfg, shape, device, 0).args()
    w8 = fp8.quantise_weights(weights)
    static = fp8.calibrated(cfg, w8, args)
    tokens = fp8.Fp8Weights(**{**vars(w8), "seen": {}})
    fp8.fp8_block(cfg, tokens, fp8.native_add_norm_q, *args)
    assert set(static.scales) == set(fp8.ACTIVATIONS)
    assert all(static.scales[k] >= tokens.seen[k] for k in fp8.ACTIVATIONS)

    def doubled(x, residual, weight, eps, scale):
        return fp8.native_add_norm_q(x, residual, 2 * weight, eps, scale)

    calls = fp8.fp8_calls(cfg, w8, {"native": fp8.native_add_norm_q, "doubled": doubled},
                          args, compiled=False)  # fmt: skip
    truth = model.fp32_block(cfg, weights, args)
    got = fp8.fp8_checks(calls, truth)
    assert got["native"]["passed"] and not got["doubled"]["passed"]


def test_fp8_block_bookkeeping(dry_run, monkeypatch):
    """The FP8 block's jobs (a static scale, a scale a token) on the dry run: a record a
    variant, native's speedup 1 over itself, f and s from the pieces' kernel times, the
    bound, CUDA a skip with its reason, and each scaling's table in the report."""
    from harness.model import fp8

    run, path = dry_run
    triton = model.variants()["triton"]
    if triton.unavailable or not triton.cpu:
        pytest.skip(f"triton does not run on CPU here ({triton.unavailable or 'no interpreter'})")
    run.variants["triton"] = triton
    run.variants["cuda"] = model.Variant("cuda", None, None, unavailable="no CUDA build here")

    def block_kernels(call, calls=1):
        call()
        return _k(gemm=(4, 400.0), **{_NORM: (2, 20.0)})

    def piece_kernels(call, calls=1):
        call()
        return _k(**{_NORM: (1, 10.0)})

    monkeypatch.setattr(model.job, "kernel_times", block_kernels)
    monkeypatch.setattr(fp8, "kernel_times", piece_kernels)
    with torch.no_grad():
        for scaling in model.FP8_SCALINGS:
            model.run_fp8_job(run, scaling, model.CPU_SHAPES["prefill"], "eager",
                              ["native", "triton", "cuda"])  # fmt: skip
    run.b.writer.close()
    recs = [r for r in records.read_records(path) if r["kind"] in ("model", "skip")]
    by = {(r["op"], r["impl"]): r for r in recs}
    for scaling in model.FP8_SCALINGS:
        op = model.fp8_op(scaling)
        native = by[(op, "native")]
        assert native["status"] == "PASS" and native["model"]["speedup"]["median"] == 1.0
        assert native["model"]["norm"]["f"] == pytest.approx(2 * 10 / 420)
        assert native["model"]["s_cold"] == pytest.approx(1.0)
        assert native["model"]["bound"] == pytest.approx(1.0)
        assert by[(op, "triton")]["status"] == "PASS"
        cuda = by[(op, "cuda")]
        assert cuda["status"] == "SKIP" and "no CUDA build" in cuda["notes"][0]
    text = model.render(records.read_records(path))
    assert "### the block in fp8, static activation scales, prefill" in text
    assert "### the block in fp8, token activation scales, prefill" in text
    assert "The FP8 block (the block's four projections" in text


def test_model_figure_draws_the_reports_speedups(tmp_path):
    """model_speedups.png from the committed run: a bar for each of our variants' passed
    block records, its value the report's (tables.prepared), drawn and written; nothing
    drawn from records without one of ours."""
    from harness.model import figure

    recs = records.read_records(model.COMMITTED_RECORDS)
    got = figure.speedups(recs)
    assert {"prefill", "decode"} <= set(got)
    text = " ".join(model.render(recs).split())
    for by_mode in got.values():
        for by_variant in by_mode.values():
            for variant, m in by_variant.items():
                sp = m["speedup"]
                assert variant in figure.OURS and sp["lo"] <= sp["median"] <= sp["hi"]
                assert f"{sp['median']:.3f} [{sp['lo']:.3f}, {sp['hi']:.3f}]" in text
    path = figure.draw(recs, tmp_path)
    assert path == tmp_path / figure.NAME and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    natives = [r for r in recs if (r.get("model") or {}).get("variant") == "native"]
    assert figure.draw(natives, tmp_path / "none") is None
    assert figure.main([str(model.COMMITTED_RECORDS), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / figure.NAME).is_file()


def test_readme_model_figure_words_are_the_records():
    """README's words under model_speedups.png, read back from the committed run."""
    from harness.model import figure

    got = figure.speedups(records.read_records(model.COMMITTED_RECORDS))

    def span(keep):
        vals = [
            m["speedup"]["median"]
            for shape, by_mode in got.items()
            for mode, by_variant in by_mode.items()
            for m in by_variant.values()
            if keep(shape, mode)
        ]
        return f"{min(vals):.2f}-{max(vals):.2f}x"

    from pathlib import Path

    repo = Path(model.__file__).resolve().parents[2]
    words = " ".join((repo / "README.md").read_text().split())
    eager_decode = span(lambda s, m: s == "decode" and not m.startswith("compile"))
    assert f"at decode, eagerly and under graphs, {eager_decode}" in words
    assert f"ours sit at {span(lambda s, m: m.startswith('compile'))}" in words
