"""Invalid input gets a clear exception naming the argument: one test per kind, per kernel.

Argument checks run before any device work, so these run without a GPU as well (the CUDA
kernel's CPU-tensor check included); they need only an importable build.
"""

import math

import pytest
import torch

from conftest import DEVICE, HAS_GPU, fn_or_skip, impl_or_skip
from harness.reference import TOL, rms_norm_ref
from rmsnorm_api import EPS_MAX, EPS_MIN, MAX_N, check_inputs

IMPLS = ["triton", "cuda"]


def x_and_w(n=64, dtype=torch.bfloat16, device=DEVICE):
    x = torch.randn(4, n, device=device).to(dtype)
    return x, torch.randn(n, device=device).to(dtype)


@pytest.fixture(params=IMPLS)
def fn(request):
    return fn_or_skip(request.param)


@pytest.fixture(params=IMPLS)
def fn_here(request):
    """For checks that come after the device check: the kernel must run on DEVICE."""
    return impl_or_skip(request.param).fn


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64, torch.float64])
def test_x_dtype(fn, dtype):
    x = torch.ones(4, 64, device=DEVICE, dtype=dtype)
    with pytest.raises(TypeError, match=r"x has dtype"):
        fn(x)


def test_x_zero_dim(fn):
    with pytest.raises(ValueError, match=r"x is 0-dimensional"):
        fn(torch.tensor(1.0, device=DEVICE))


def test_x_last_dim_zero(fn):
    with pytest.raises(ValueError, match=r"x's last dimension is 0"):
        fn(torch.empty(4, 0, device=DEVICE))


def test_x_too_wide(fn):
    x = torch.randn(1, MAX_N + 1, device=DEVICE)
    with pytest.raises(ValueError, match=rf"supported maximum is N = {MAX_N}"):
        fn(x)


def test_x_last_dim_strided(fn):
    x = torch.randn(8, 128, device=DEVICE)[:, ::2]
    with pytest.raises(ValueError, match=r"x has stride 2 in its last dimension"):
        fn(x)


def test_weight_shape(fn):
    x, _ = x_and_w(64)
    w = torch.ones(63, device=DEVICE, dtype=x.dtype)
    with pytest.raises(ValueError, match=r"weight has shape \(63,\) but x's last dimension"):
        fn(x, w)
    with pytest.raises(ValueError, match=r"weight has shape \(1, 64\)"):
        fn(x, w.new_ones(1, 64))


@pytest.mark.parametrize("wdtype", [torch.float16, torch.float64, torch.int32])
def test_weight_dtype(fn, wdtype):
    x, _ = x_and_w(64, torch.bfloat16)
    with pytest.raises(TypeError, match=r"weight has dtype"):
        fn(x, torch.ones(64, device=DEVICE, dtype=wdtype))


def test_weight_device(fn):
    x, _ = x_and_w(64)
    other = "meta"  # a device x is never on, available everywhere
    with pytest.raises(ValueError, match=r"weight is on device 'meta'"):
        fn(x, torch.ones(64, device=other, dtype=x.dtype))


def test_weight_not_a_tensor(fn):
    x, _ = x_and_w(64)
    with pytest.raises(TypeError, match=r"weight must be a torch.Tensor"):
        fn(x, [1.0] * 64)


@pytest.mark.parametrize("eps", [0.0, -1e-6, math.nan, math.inf])
def test_eps_value(fn, eps):
    x, w = x_and_w()
    with pytest.raises(ValueError, match=r"eps is"):
        fn(x, w, eps)


@pytest.mark.parametrize("eps", ["1e-6", None, True])
def test_eps_type(fn, eps):
    x, w = x_and_w()
    with pytest.raises(TypeError, match=r"eps must be a real number"):
        fn(x, w, eps)


def test_out_mismatch(fn_here):
    fn = fn_here
    x, w = x_and_w()
    with pytest.raises(ValueError, match=r"out has shape"):
        fn(x, w, out=torch.empty(4, 63, device=DEVICE, dtype=x.dtype))
    with pytest.raises(TypeError, match=r"out has dtype"):
        fn(x, w, out=torch.empty_like(x, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"out must be contiguous"):
        fn(x, w, out=torch.empty(64, 4, device=DEVICE, dtype=x.dtype).t())


def test_empty_rows(fn_here):
    fn = fn_here
    """M = 0 returns an empty result of the right shape and dtype without launching."""
    x = torch.empty(0, 4096, device=DEVICE, dtype=torch.bfloat16)
    y = fn(x, torch.ones(4096, device=DEVICE, dtype=x.dtype))
    assert y.shape == (0, 4096) and y.dtype == x.dtype
    y = fn(torch.empty(3, 0, 17, device=DEVICE))
    assert y.shape == (3, 0, 17)


def test_cpu_tensor_for_cuda_kernel():
    """The CUDA kernel refuses CPU tensors with a clear error (this runs without a GPU)."""
    fn = fn_or_skip("cuda")
    with pytest.raises(ValueError, match=r"expected a CUDA tensor"):
        fn(torch.randn(4, 64))


@pytest.mark.gpu
def test_cpu_tensor_for_triton_kernel():
    fn = fn_or_skip("triton")
    assert HAS_GPU
    with pytest.raises(ValueError, match=r"expected a CUDA tensor"):
        fn(torch.randn(4, 64))


def test_empty_rows_launch_nothing(monkeypatch):
    """The Triton launcher returns before touching a kernel when there are no rows."""
    import triton_impl
    from triton_impl import launch

    def boom(*a, **k):
        raise AssertionError("a kernel was launched for an empty input")

    monkeypatch.setattr(launch, "run", boom)
    y = triton_impl.rms_norm(torch.empty(0, 64, device=DEVICE))
    assert y.shape == (0, 64)


@pytest.mark.parametrize("op", ["triton_impl", "cuda_impl"])
def test_direct_op_callers_are_checked(op):
    """torch.ops.<ns>.rms_norm repeats the checks, for callers that skip the wrapper."""
    fn_or_skip(op.split("_")[0])
    ops = getattr(torch.ops, op)
    x = torch.ones(4, 64, device=DEVICE, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"x has dtype"):
        ops.rms_norm(x, None, 1e-6)
    xf = torch.randn(4, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight has shape"):
        ops.rms_norm(xf, torch.ones(3, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match=r"eps is"):
        ops.rms_norm(xf, None, -1.0)


# ---- out= that overlaps its inputs, and out= with autograd --------------------------------

OVERLAP_CASES = [
    (n, dtype) for n in (4097, 12288, 40000) for dtype in (torch.float32, torch.bfloat16)
]


@pytest.mark.parametrize("n, dtype", OVERLAP_CASES, ids=str)
@pytest.mark.parametrize("shift", [1, -1])
def test_out_partially_overlapping_x(fn_here, n, dtype, shift):
    """out a view of x's storage shifted by one row, either way: refused, never wrong rows."""
    m = 3
    base = torch.randn(m + 1, n, device=DEVICE).to(dtype)
    x, out = (base[:m], base[1:]) if shift == 1 else (base[1:], base[:m])
    with pytest.raises(ValueError, match=r"out partially overlaps x in memory"):
        fn_here(x, None, 1e-6, out=out)


@pytest.mark.parametrize("n", [4097, 12288])
def test_out_is_x_normalises_in_place(fn_here, n):
    x = torch.randn(3, n, device=DEVICE).to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(n, device=DEVICE)).to(x.dtype)
    want = rms_norm_ref(x, w, 1e-6)
    assert fn_here(x, w, 1e-6, out=x) is x
    torch.testing.assert_close(x, want, **TOL[torch.bfloat16])


def test_out_overlapping_weight(fn_here):
    n = 4096
    buf = torch.randn(4 * n, device=DEVICE)
    w = buf[:n]
    x = torch.randn(2, n, device=DEVICE)
    with pytest.raises(ValueError, match=r"out overlaps weight in memory"):
        fn_here(x, w, 1e-6, out=buf[n // 2 : n // 2 + 2 * n].view(2, n))


@pytest.mark.parametrize("which", ["x", "weight"])
def test_out_with_grad_refused(fn_here, which):
    x, w = x_and_w(64, torch.float32)
    (x if which == "x" else w).requires_grad_(True)
    out = torch.empty_like(x)
    with pytest.raises(ValueError, match=rf"out= does not support autograd, but {which} requires"):
        fn_here(x, w, 1e-6, out=out)
    with torch.no_grad():  # what the message suggests works
        fn_here(x, w, 1e-6, out=out)
    torch.testing.assert_close(out, rms_norm_ref(x.detach(), w.detach(), 1e-6), **TOL[x.dtype])


# ---- eps outside float32's normal range ---------------------------------------------------


@pytest.mark.parametrize("eps", [1e39, 1e-50, 1e-39, 3.5e38])
def test_eps_outside_float32_normal_range(fn, eps):
    x, w = x_and_w()
    with pytest.raises(ValueError, match=r"eps is .*; expected a number in float32's normal range"):
        fn(x, w, eps)


@pytest.mark.parametrize("eps", [EPS_MIN, EPS_MAX])
def test_eps_at_float32_normal_range_ends(fn_here, eps):
    """The range's ends are accepted; zero rows stay 0 (never NaN) down to the smallest."""
    x, w = x_and_w(4096, torch.float32)
    x[1] = 0.0
    y = fn_here(x, w, eps)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, rms_norm_ref(x, w, eps), **TOL[torch.float32])


# ---- layouts and devices the kernels cannot address ---------------------------------------


def test_x_sparse(fn):
    x = torch.randn(4, 64).to_sparse()
    with pytest.raises(TypeError, match=r"x has layout torch.sparse_coo; expected torch.strided"):
        fn(x)


def test_x_nested(fn):
    x = torch.nested.nested_tensor([torch.randn(2, 64), torch.randn(3, 64)], layout=torch.jagged)
    with pytest.raises(TypeError, match=r"x is a nested tensor; expected a dense"):
        fn(x)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@pytest.mark.parametrize("op", ["triton_impl", "cuda_impl"])
def test_raw_ops_refuse_nested(op):
    """A (strided) nested x reaches the ops' own check, not the dispatcher's message."""
    fn_or_skip(op.split("_")[0])
    ops = getattr(torch.ops, op)
    x = torch.nested.nested_tensor([torch.randn(2, 64), torch.randn(3, 64)])
    with pytest.raises(TypeError, match=r"x is a nested tensor"):
        ops.rms_norm(x, None, 1e-6)
    with pytest.raises(TypeError, match=r"x is a nested tensor"):
        ops.rms_norm_out(torch.empty(2, 64), x, None, 1e-6)


def test_weight_sparse(fn):
    x, _ = x_and_w(64, torch.float32, device="cpu")
    with pytest.raises(TypeError, match=r"weight has layout torch.sparse_coo"):
        fn(x, torch.ones(64).to_sparse())


def test_x_on_meta(fn):
    """Meta x (no data): shape inference in every backend, the interpreter included."""
    y = fn(torch.randn(4, 64, device="meta"))
    assert (y.device.type, y.shape) == ("meta", (4, 64))


def test_x_none_and_lists(fn):
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got None"):
        fn(None)
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        fn([[1.0] * 64])


# ---- the registered ops: fakes check, the raw CUDA op words errors as Python does ---------


@pytest.mark.parametrize("op", ["triton_impl", "cuda_impl"])
def test_fake_and_meta_calls_are_checked(op):
    """The fakes (meta tensors, torch.compile's tracing) refuse what the kernels refuse."""
    fn_or_skip(op.split("_")[0])
    ops = getattr(torch.ops, op)
    with pytest.raises(TypeError, match=r"x has dtype torch.int32"):
        ops.rms_norm(torch.ones(4, 64, device="meta", dtype=torch.int32), None, 1e-6)
    with pytest.raises(ValueError, match=r"x's last dimension is 0"):
        ops.rms_norm(torch.ones(4, 0, device="meta"), None, 1e-6)
    assert ops.rms_norm(torch.ones(4, 64, device="meta"), None, 1e-6).device.type == "meta"


def test_cuda_fake_under_tracing():
    """Under FakeTensorMode (what torch.compile traces with) the CUDA op's fakes check the
    arguments, out='s overlap included, with no GPU needed."""
    fn_or_skip("cuda")
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = torch.ops.cuda_impl
    with FakeTensorMode():
        try:
            x = torch.empty(5, 64, device="cuda")
        except (RuntimeError, AssertionError) as e:  # a torch without CUDA at all
            pytest.skip(f"cannot make fake CUDA tensors here: {e}")
        y = ops.rms_norm(x[:4], None, 1e-6)
        assert y.shape == (4, 64) and y.device.type == "cuda"
        with pytest.raises(TypeError, match=r"x has dtype torch.int32"):
            ops.rms_norm(x.int(), None, 1e-6)
        with pytest.raises(ValueError, match=r"out partially overlaps x"):
            ops.rms_norm_out(x[1:], x[:4], None, 1e-6)
        with pytest.raises(ValueError, match=r"eps is 1e-50"):
            ops.rms_norm(x, None, 1e-50)


# bad inputs on CPU tensors: the Python checks and the C++ op's must say the same thing
WORDING_CASES = {
    "x-none": lambda: (None, None, 1e-6),
    "x-int32": lambda: (torch.ones(4, 64, dtype=torch.int32), None, 1e-6),
    "x-0d": lambda: (torch.tensor(1.0), None, 1e-6),
    "x-n0": lambda: (torch.ones(4, 0), None, 1e-6),
    "x-too-wide": lambda: (torch.ones(1, MAX_N + 1), None, 1e-6),
    "x-strided": lambda: (torch.ones(8, 128)[:, ::2], None, 1e-6),
    "x-sparse": lambda: (torch.ones(4, 64).to_sparse(), None, 1e-6),
    "w-shape": lambda: (torch.ones(4, 64), torch.ones(63), 1e-6),
    "w-shape-2d": lambda: (torch.ones(4, 64), torch.ones(1, 64), 1e-6),
    "w-dtype": lambda: (torch.ones(4, 64, dtype=torch.bfloat16), torch.ones(64).half(), 1e-6),
    "w-device": lambda: (torch.ones(4, 64), torch.ones(64, device="meta"), 1e-6),
    "eps-0": lambda: (torch.ones(4, 64), None, 0.0),
    "eps-neg": lambda: (torch.ones(4, 64), None, -1e-6),
    "eps-nan": lambda: (torch.ones(4, 64), None, math.nan),
    "eps-inf": lambda: (torch.ones(4, 64), None, math.inf),
    "eps-1e39": lambda: (torch.ones(4, 64), None, 1e39),
    "eps-1e-50": lambda: (torch.ones(4, 64), None, 1e-50),
    "eps-neg-1e-4": lambda: (torch.ones(4, 64), None, -1e-4),
    "x-cpu": lambda: (torch.ones(4, 64), None, 1e-6),
}


@pytest.mark.parametrize("case", WORDING_CASES)
def test_one_wording_for_both_sides(case):
    fn_or_skip("cuda")
    args = WORDING_CASES[case]()
    with pytest.raises((TypeError, ValueError)) as py_err:
        check_inputs(*args, impl="cuda_impl.rms_norm")
    with pytest.raises((TypeError, ValueError)) as cpp_err:
        torch.ops.cuda_impl.rms_norm(*args)
    assert type(cpp_err.value) is type(py_err.value)
    assert str(cpp_err.value).splitlines()[0] == str(py_err.value)


# ---- kernel-work entry points -------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg, what",
    [
        (dict(kernel="tiled", block_n=64, num_warps=1), r"kernel is 'tiled'"),
        (dict(kernel="fused", block_n=1000, num_warps=1), r"block_n is 1000"),
        (dict(kernel="fused", block_m=3, block_n=64, num_warps=1), r"block_m is 3"),
        (dict(kernel="fused", block_n=64, num_warps=3), r"num_warps is 3"),
        (dict(kernel="split", block_m=2, block_n=64, num_warps=1), r"only the fused and looped"),
        (dict(kernel="fused", block_n=64), r"cfg: .*missing .*'num_warps'"),
        (dict(kernel="fused", block_n=64, num_warps=1, BLOCK_M=2), r"unknown fields \['BLOCK_M'\]"),
        (dict(kernel="looped", block_n=64, num_warps=1, stages=0), r"stages is 0"),
        (dict(kernel="looped", block_n=64, num_warps=1, programs_per_sm=1), r"unknown fields"),
        (
            dict(kernel="sharded", block_n=64, num_warps=1, reload=1),
            r"reload is 1; expected a bool",
        ),
        (
            dict(kernel="looped", block_n=64, num_warps=1, stages=2),
            r"stages is 2; only the sharded kernel pipelines",
        ),
        (
            dict(kernel="looped", block_n=64, num_warps=1, stream_y=True),
            r"stream_y is set; only the sharded kernel has it",
        ),
        (
            dict(kernel="looped", block_n=64, num_warps=1, wait=True),
            r"wait is set; only the sharded kernel has it",
        ),
        (
            dict(kernel="looped", block_n=64, num_warps=1, reload=True),
            r"reload is set; only the sharded kernel has it",
        ),
        (
            dict(kernel="sharded", block_n=64, num_warps=1, reload=True),
            r"reload is set without wait",
        ),
        (
            dict(kernel="split", block_n=64, num_warps=1, weight_first=True),
            r"weight_first is set; only the fused kernel has it",
        ),
        (dict(kernel="fused", block_n=32, num_warps=1), r"block_n = 32 is narrower than the row"),
        ("fused", r"cfg must be a Config or a dict"),
    ],
)
def test_triton_forced_config_errors(cfg, what):
    fn_or_skip("triton")
    from triton_impl import rms_norm_with_config

    x, w = x_and_w(64, torch.float32)
    with pytest.raises(ValueError, match=what):
        rms_norm_with_config(x, w, 1e-6, cfg)


@pytest.mark.parametrize(
    "n, elem",
    [
        (0, 2),
        (-5, 2),
        (10**12, 2),
        (MAX_N + 1, 4),
        (64, 3),
        (64, 8),
        (True, 2),
        (64.0, 2),
        (64, 2.0),
        ("64", 2),
    ],  # fmt: skip
)
@pytest.mark.parametrize("backend", IMPLS)
def test_config_helpers_refuse_what_no_kernel_takes(backend, n, elem):
    """Both backends' config helpers, one rule (rmsnorm_api.check_width): widths and element
    sizes no kernel takes, and what is not an integer, refused by name."""
    fn_or_skip(backend)
    pkg = __import__(f"{backend}_impl")
    for helper in ("default_config", "search_space"):
        with pytest.raises(ValueError, match=rf"{helper}: (n|element_size) is"):
            getattr(pkg, helper)(n, elem)


@pytest.mark.parametrize("backend", IMPLS)
def test_config_helpers_take_numpy_integers(backend):
    """An integer is an integer by operator.index, a NumPy one too; the answer is the one
    for the Python int."""
    np = pytest.importorskip("numpy")
    fn_or_skip(backend)
    pkg = __import__(f"{backend}_impl")
    for n in (np.int64(4096), np.int32(4097)):
        for helper in ("default_config", "search_space"):
            fn = getattr(pkg, helper)
            assert fn(n, np.int64(2)) == fn(int(n), 2)
    assert pkg.Config(*pkg.default_config(4096, 2).as_dict().values()) == pkg.default_config(
        np.int64(4096), 2
    )


@pytest.mark.parametrize(
    "fields, what",
    [
        ((-1, 0), "row_threads is -1"),
        ((256, 0), "vpt is 0"),
        ((256, 2, 0), "cluster is 0"),
        ((256, 2, 1, -1), "variant is -1"),
        ((True, 2), "row_threads is True"),
        ((256.0, 2), "row_threads is 256.0"),
    ],  # fmt: skip
)
def test_cuda_config_fields_are_integers(fields, what):
    fn_or_skip("cuda")
    from cuda_impl import Config

    with pytest.raises(ValueError, match=rf"cuda_impl Config: {what}; expected an int >="):
        Config(*fields)


@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm"])
@pytest.mark.parametrize("backend", IMPLS)
def test_forced_config_functions_refuse_autograd(backend, op):
    """The forced-config functions (sweeps, profiles) have no backward: an input that
    requires grad is refused by the function's name, never given an output that silently
    has no gradient; under no_grad they run."""
    impl_or_skip(backend)
    pkg = __import__(f"{backend}_impl")
    fn = getattr(pkg, f"{op}_with_config")
    x, w = x_and_w(64, torch.float32)
    args = (x, torch.randn_like(x)) if op != "rms_norm" else (x,)
    cfg = pkg.default_config(64, 4, op)
    for t in (*args, w):
        t.requires_grad_(True)
        with pytest.raises(ValueError, match=rf"{backend}_impl.{op}_with_config: .* requires grad"):
            fn(*args, w, 1e-6, cfg)
        with torch.no_grad():
            fn(*args, w, 1e-6, cfg)
        t.requires_grad_(False)
