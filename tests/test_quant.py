"""The forward with a quantised output (fp8): rms_norm_quant, the fused add and its in-place
form, each scale form (static, a scale a row with and without its upper bound, a scale a
group), both fp8 dtypes, all three input dtypes, odd and wide widths (every kernel kind the
quantised launch takes), the weight's offset and an fp32 weight beside 16-bit x, against
the fp32 norm quantised (harness.reference.quantise_ref): bit for bit but at ties. And
the refusals: every bad argument named."""

import importlib
import math

import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE, HAS_GPU, impl_or_skip
from harness.reference import (
    QUANT_REL,
    fused_add_rms_norm_quant_ref,
    q_close,
    quantise_ref,
    rms_norm_quant_ref,
)
from triton_impl.kernels import INTERPRET, _fp8

BACKENDS = ["triton", pytest.param("cuda", marks=pytest.mark.gpu)]
#: the refusals run before any device work: both backends on any machine
CHECKED = ["triton", "cuda"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
EPS = 1e-6
#: the fused tile (1, 128, 1000: odd ones the split kernel would take), the looped kernel
#: (4096 16-bit, 8192 fp32) and the widest rows, past the sharded kernel's bound; CUDA's
#: last rows in registers and the first it loops over (16384 and 16388 fp32, 32768 and
#: 32776 16-bit)
WIDTHS = [1, 128, 1000, 4096, 8192] + (
    [12288, 16384, 16388, 20480, 32768, 32776, 40960, 65536, 131072] if HAS_GPU else []
)
MODES = {
    "static": dict(scale=0.02),
    "token": dict(),
    "bounded": dict(scale_ub=0.004),
    "group128": dict(group_size=128),
    "group64": dict(group_size=64),
    "group16": dict(group_size=16),
    # past a warp of CUDA's slots (16-bit: 512 and more; fp32: 256 and more)
    "group512": dict(group_size=512),
    "group1024": dict(group_size=1024),
}


def backend(name: str):
    impl_or_skip(name)
    return importlib.import_module(f"{name}_impl")


def quant_kw(mode: str, out_dtype, n: int) -> dict:
    """The quantised ops' keywords of a mode at width n (None: the mode does not apply)."""
    kw = dict(MODES[mode], out_dtype=out_dtype)
    if kw.get("group_size") and n % kw["group_size"]:
        return None
    for k in ("scale", "scale_ub"):
        if k in kw:
            kw[k] = torch.tensor(kw[k], device=DEVICE)
    return kw


def inputs(m: int, n: int, dtype, wkind: str = "dtype") -> tuple:
    x = torch.randn(m, n, device=DEVICE).to(dtype)
    r = torch.randn(m, n, device=DEVICE).to(dtype)
    w = torch.randn(n, device=DEVICE)
    return x, r, (w if wkind == "fp32" else w.to(dtype))


def scales_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=QUANT_REL, atol=0, equal_nan=True)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("out_dtype", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_forms_match_reference(name, dtype, out_dtype, mode):
    """Each form against the reference at every width: y bit for bit but at ties, the
    scales to fp32 rounding, residual_out exactly, the in-place form's residual too."""
    mod = backend(name)
    for n in WIDTHS:
        kw = quant_kw(mode, out_dtype, n)
        if kw is None:
            continue
        m = 3 if n > 8192 else 5
        x, r, w = inputs(m, n, dtype)
        say = f"N={n}"
        q, s = mod.rms_norm_quant(x, w, EPS, **kw)
        q_ref, s_ref, v = rms_norm_quant_ref(x, w, EPS, **kw)
        q_close(q, q_ref, v, say)
        scales_close(s, s_ref)
        q, ro, s = mod.fused_add_rms_norm_quant(x, r, w, EPS, **kw)
        q_ref, ro_ref, s_ref, v = fused_add_rms_norm_quant_ref(x, r, w, EPS, **kw)
        q_close(q, q_ref, v, say)
        torch.testing.assert_close(ro, ro_ref, rtol=0, atol=0)
        scales_close(s, s_ref)
        xi, ri = x.clone(), r.clone()
        q, s = mod.fused_add_rms_norm_quant_(xi, ri, w, EPS, **kw)
        q_close(q, q_ref, v, say)
        torch.testing.assert_close(ri, ro_ref, rtol=0, atol=0)
        assert torch.equal(xi, x), "the in-place form wrote x"
        scales_close(s, s_ref)


@pytest.mark.parametrize("name", BACKENDS)
def test_scales_shapes_and_static_scale_returned(name):
    """Scales a row: x's shape with a last dimension of 1 (any leading dimensions); a group's:
    of N / group_size; a static scale comes back as the caller's own tensor."""
    mod = backend(name)
    x = torch.randn(2, 3, 256, device=DEVICE).to(torch.bfloat16)
    assert mod.rms_norm_quant(x)[1].shape == (2, 3, 1)
    assert mod.rms_norm_quant(x, group_size=64)[1].shape == (2, 3, 4)
    scale = torch.tensor([0.5], device=DEVICE)
    y, s = mod.rms_norm_quant(x, scale=scale)
    assert s is scale and y.dtype == torch.float8_e4m3fn and y.shape == x.shape


@pytest.mark.parametrize("name", BACKENDS)
def test_offset_mixed_weight_and_no_weight(name):
    """Gemma's offset, an fp32 weight beside bf16 x, and no weight, in each scale form."""
    mod = backend(name)
    for n in (1000, 4096):
        x, r, w = inputs(4, n, torch.bfloat16, "fp32")
        for mode in ("static", "token", "group128"):
            kw = quant_kw(mode, torch.float8_e4m3fn, n)
            if kw is None:
                continue
            for weight, offset in ((w, 1.0), (None, 0.0)):
                q, s = mod.rms_norm_quant(x, weight, EPS, weight_offset=offset, **kw)
                q_ref, s_ref, v = rms_norm_quant_ref(x, weight, EPS, offset, **kw)
                q_close(q, q_ref, v, f"N={n} {mode} offset {offset}")
                scales_close(s, s_ref)
                q, ro, s = mod.fused_add_rms_norm_quant(x, r, weight, EPS, weight_offset=offset,
                                                        **kw)  # fmt: skip
                q_ref, _, s_ref, v = fused_add_rms_norm_quant_ref(x, r, weight, EPS, offset, **kw)
                q_close(q, q_ref, v, f"fused add N={n} {mode} offset {offset}")


@pytest.mark.parametrize("name", BACKENDS)
def test_zero_rows_saturation_and_bound(name):
    """A row of zeros divides by the least scale (its y is 0, its scale the floor); a static
    scale far too small saturates every element to +-max; a bound below the rows' scales
    clamps them to it, the largest elements saturating."""
    from rmsnorm_api import fp8_min_scale

    mod = backend(name)
    dt = torch.float8_e4m3fn
    x = torch.randn(4, 512, device=DEVICE).to(torch.bfloat16)
    x[1] = 0
    q, s = mod.rms_norm_quant(x)
    assert float(s[1, 0]) == pytest.approx(fp8_min_scale(dt), rel=1e-6)
    assert not q[1].float().any()
    q, _ = mod.rms_norm_quant(x[[0]], scale=torch.tensor(1e-6, device=DEVICE))
    assert q.float().abs().eq(torch.finfo(dt).max).sum() >= 500  # all but zeros and ties
    ub = torch.tensor(0.5, device=DEVICE)
    q, s = mod.rms_norm_quant(x, scale_ub=ub)
    assert torch.equal(s[[0, 2, 3]], torch.full_like(s[[0, 2, 3]], 0.5 / 448))
    assert q[0].float().abs().max() == 448


def test_reference_rounds_to_nearest_even():
    """quantise_ref's rounding is torch's cast after the clamp: a tie between two e4m3
    values goes to the even one (subnormals too), past the max saturates."""
    y = torch.tensor([[1.0625, 1.1875, 500.0, -1e9, 2.0**-10, 3 * 2.0**-11]])
    q, _, _ = quantise_ref(y, torch.float8_e4m3fn, scale=torch.tensor(1.0))
    assert q.float().tolist() == [[1.0, 1.25, 448.0, -448.0, 0.0, 2.0**-9]]


@triton.jit
def _cast(v_ptr, q_ptr, n, MANT: tl.constexpr, TINY: tl.constexpr, BY_HAND: tl.constexpr):
    # kernels._fp8 alone, on 1024 values a program
    c = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    v = tl.load(v_ptr + c, mask=c < n, other=0.0)
    tl.store(q_ptr + c, _fp8(v, q_ptr.dtype.element_ty, MANT, TINY, BY_HAND), mask=c < n)


@pytest.mark.parametrize("out_dtype", FP8, ids=str)
def test_triton_fp8_rounding_is_torchs(out_dtype):
    """The Triton kernels' fp8 rounding (kernels._fp8: by hand under the interpreter, whose
    cast does not round to nearest even; the GPU's cvt.rn otherwise) is torch's cast, on
    every midpoint between neighbouring values of the format (ties: to even), a value just
    either side of each, and random values, normal and subnormal."""
    impl_or_skip("triton")
    fi = torch.finfo(out_dtype)
    grid = torch.arange(256, dtype=torch.uint8).view(out_dtype).float()
    grid = grid[grid.isfinite() & (grid >= 0)].unique()
    mids = (grid[1:] + grid[:-1]) / 2  # exact in fp32
    near = torch.cat([mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(grid[-1:] * 2)])
    rand = torch.cat([torch.randn(4096) * 100, torch.randn(4096) * fi.tiny]).clamp(-fi.max, fi.max)
    v = torch.cat([near, -near, grid, rand]).to(DEVICE)
    q = torch.empty(v.shape, dtype=out_dtype, device=DEVICE)
    mant = round(-math.log2(fi.eps))
    _cast[(triton.cdiv(v.numel(), 1024),)](v, q, v.numel(), mant, float(fi.tiny), INTERPRET)
    want = v.to(out_dtype)
    bad = q.float() != want.float()
    assert not bad.any(), (v[bad][:5].tolist(), q[bad][:5].float().tolist())


def _bad_calls(mod, memory: bool = True):
    """(call, exception, words the message must hold) for each refused argument; memory:
    the in-place form's memory checks too, which run after the device's (so not for CPU
    tensors of a GPU backend)."""
    x = torch.randn(4, 256, device=DEVICE).to(torch.bfloat16)
    r = torch.randn(4, 256, device=DEVICE).to(torch.bfloat16)
    x3 = torch.randn(2, 2, 256, device=DEVICE).to(torch.bfloat16)
    apart = torch.randn(2, 3, 256, device=DEVICE).to(torch.bfloat16)[:, :2]  # not one stride
    one = torch.tensor(0.5, device=DEVICE)
    q = mod.rms_norm_quant
    in_place = mod.fused_add_rms_norm_quant_
    memory_calls = [
        (lambda: in_place(x, x), ValueError, "x and residual overlap in memory; residual is"),
        (lambda: in_place(x3, apart), ValueError, "residual's leading dimensions cannot"),
        (lambda: in_place(x, r.clone().requires_grad_()), ValueError, "residual requires grad"),
    ]
    return (
        [
            (lambda: q(x, out_dtype=torch.bfloat16), TypeError, "out_dtype"),
            (lambda: q(x, out_dtype=torch.int8), TypeError, "out_dtype"),
            (lambda: q(x, group_size=100), ValueError, "group_size is 100"),
            (lambda: q(x, group_size=512), ValueError, "does not divide"),
            (lambda: q(x, group_size=2048), ValueError, "power of two"),
            (lambda: q(x, group_size=64.0), TypeError, "group_size must be an int"),
            (lambda: q(x, group_size=True), TypeError, "group_size must be an int"),
            (lambda: q(x, scale=one, group_size=64), ValueError, "group_size is given with scale"),
            (lambda: q(x, scale=one, scale_ub=one), ValueError, "scale_ub is given with scale"),
            (lambda: q(x, group_size=64, scale_ub=one), ValueError, "scale_ub is given with group"),
            (lambda: q(x, scale=one.double()), TypeError, "scale has dtype torch.float64"),
            (lambda: q(x, scale=one.repeat(2)), ValueError, "scale has shape (2,)"),
            (lambda: q(x, scale=0.5), TypeError, "scale must be a torch.Tensor or None"),
            (lambda: q(x, scale=torch.tensor(0.0, device=DEVICE)), ValueError, "scale is 0.0"),
            (lambda: q(x, scale=torch.tensor(-1.0, device=DEVICE)), ValueError, "scale is -1.0"),
            (lambda: q(x, scale=torch.tensor(float("nan"), device=DEVICE)), ValueError, "normal"),
            # its inverse overflows fp32: 0 x inf would turn a zero of y into NaN
            (lambda: q(x, scale=torch.tensor(1e-39, device=DEVICE)), ValueError, "normal range"),
            (lambda: q(x, scale_ub=torch.tensor(-1.0, device=DEVICE)), ValueError, "scale_ub is"),
            (lambda: q(x, weight_offset=1.0), ValueError, "weight_offset"),
            (lambda: q(x, torch.randn(255, device=DEVICE)), ValueError, "weight has shape"),
            (
                lambda: q(x.view(4, 2, 128), torch.randn(2, 128, device=DEVICE)),
                ValueError,
                "weight has shape",
            ),  # fmt: skip
            (lambda: mod.fused_add_rms_norm_quant(x, r[:, :128]), ValueError, "residual has shape"),
        ]
        + memory_calls * memory
    )


def checked(name: str):
    """A backend for its refusals: importable is enough (the CUDA extension's checks run on
    a machine without a GPU)."""
    try:
        return importlib.import_module(f"{name}_impl")
    except ImportError as e:
        pytest.skip(f"{name}: {e}")


@pytest.mark.parametrize("name", CHECKED)
def test_bad_arguments_refused(name):
    mod = checked(name)
    memory = name == "triton" or HAS_GPU
    for i, (call, error, words) in enumerate(_bad_calls(mod, memory)):
        with pytest.raises(error) as e:
            call()
        assert words in str(e.value), (i, str(e.value))


@pytest.mark.parametrize("name", BACKENDS)
def test_scale_read_again_when_written(name):
    """A scale is read once a version: one written in place to an invalid value after a
    good call is refused on the next."""
    mod = backend(name)
    x = torch.randn(2, 64, device=DEVICE)
    scale = torch.tensor(0.5, device=DEVICE)
    mod.rms_norm_quant(x, scale=scale)
    scale.fill_(0.0)
    with pytest.raises(ValueError, match="scale is 0.0"):
        mod.rms_norm_quant(x, scale=scale)


@pytest.mark.gpu
@pytest.mark.parametrize("name", BACKENDS)
def test_compiled_matches_eager(name):
    """Under torch.compile (fullgraph) each form gives the eager call's bits."""
    mod = backend(name)
    x, r, w = inputs(8, 4096, torch.bfloat16)
    for kw in (dict(), dict(group_size=128), dict(scale=torch.tensor(0.02, device=DEVICE))):
        for fn, args in ((mod.rms_norm_quant, (x, w)), (mod.fused_add_rms_norm_quant, (x, r, w))):
            want = fn(*args, **kw)
            got = torch.compile(lambda *a, fn=fn, kw=kw: fn(*a, **kw), fullgraph=True)(*args)
            for g, e in zip(got, want, strict=True):
                assert torch.equal(g.view(torch.uint8) if g.element_size() == 1 else g,
                                   e.view(torch.uint8) if e.element_size() == 1 else e)  # fmt: skip
        torch._dynamo.reset()


def test_cpp_op_refuses_in_the_contracts_words():
    """The CUDA op called directly (torch.ops, no Python checks) refuses the quantised
    forms' own rules as the contract does, in the same words after the function's name."""
    import rmsnorm_api as api

    checked("cuda")
    x = torch.randn(4, 256).to(torch.bfloat16)
    one = torch.tensor(0.5)
    base = dict(x=x, weight=None, eps=EPS, scale=None, group_size=0, scale_ub=None,
                out_dtype=torch.float8_e4m3fn, weight_offset=0.0)  # fmt: skip
    for bad in (
        dict(out_dtype=torch.bfloat16),
        dict(group_size=100),
        dict(group_size=512),
        dict(group_size=2048),
        dict(scale=one, group_size=64),
        dict(scale=one, scale_ub=one),
        dict(group_size=64, scale_ub=one),
        dict(scale=one.double()),
        dict(scale_ub=one.repeat(3)),
    ):
        values = {**base, **bad}
        with pytest.raises((TypeError, ValueError)) as e:
            api.check_call("rms_norm_quant", "x", values, allow_cpu=True)
        with pytest.raises((TypeError, ValueError)) as c:
            torch.ops.cuda_impl.rms_norm_quant(*values.values())
        assert type(c.value) is type(e.value), bad
        got = str(c.value).splitlines()[0].split(": ", 1)[1]
        assert got == str(e.value).split(": ", 1)[1], bad


# the interpreter's numpy warns of the NaN it computes with
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mode", ["static", "token", "bounded", "group64"])
@pytest.mark.parametrize("name", BACKENDS)
def test_nonfinite_rows_stay_nan(name, mode):
    """A NaN in a row makes its norm NaN (its sum is), and the quantised row and its scales
    NaN, as the reference's: never a saturated value that hides it; an inf, as the
    reference says too. Rows beside them are as without them. The fused add's too (a NaN
    in the residual)."""
    mod = backend(name)
    for n in (256, 4096):
        kw = quant_kw(mode, torch.float8_e4m3fn, n)
        x, r, w = inputs(4, n, torch.bfloat16)
        x[1, 7], x[2, n - 1] = float("nan"), float("inf")
        r[3, 0] = float("nan")
        q, s = mod.rms_norm_quant(x, w, EPS, **kw)
        q_ref, s_ref, v = rms_norm_quant_ref(x, w, EPS, **kw)
        assert q[1].float().isnan().all()  # (an inf row: its inf NaN, 0 / inf elsewhere)
        q_close(q, q_ref, v, f"N={n}")
        scales_close(s, s_ref)
        q, ro, s = mod.fused_add_rms_norm_quant(x, r, w, EPS, **kw)
        q_ref, ro_ref, s_ref, v = fused_add_rms_norm_quant_ref(x, r, w, EPS, **kw)
        assert q[3].float().isnan().all()
        q_close(q, q_ref, v, f"fused add N={n}")
        scales_close(s, s_ref)
        torch.testing.assert_close(ro, ro_ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", BACKENDS)
def test_inference_mode_fp32_residual_and_rows_off_the_grid(name):
    """Inside torch.inference_mode (a scale made there keeps no version: read each call);
    an fp32 residual beside bf16 x; rows at an odd offset and row stride (no 16-byte
    vector: the scalar path), with groups past a warp of slots too."""
    mod = backend(name)
    n = 2048
    x, r, w = inputs(3, n, torch.bfloat16)
    with torch.inference_mode():
        scale = torch.tensor(0.02, device=DEVICE)
        q, _ = mod.rms_norm_quant(x, w, EPS, scale=scale)
        q_ref, _, v = rms_norm_quant_ref(x, w, EPS, scale=scale, out_dtype=torch.float8_e4m3fn)
        q_close(q, q_ref, v, "inference mode")
    for mode in ("token", "group512"):
        kw = quant_kw(mode, torch.float8_e4m3fn, n)
        q, ro, s = mod.fused_add_rms_norm_quant(x, r.float(), w, EPS, **kw)
        q_ref, ro_ref, s_ref, v = fused_add_rms_norm_quant_ref(x, r.float(), w, EPS, **kw)
        q_close(q, q_ref, v, f"fp32 residual {mode}")
        assert ro.dtype == torch.float32 and torch.equal(ro, ro_ref)
        scales_close(s, s_ref)
        wide = torch.randn(3, n + 9, device=DEVICE).to(torch.bfloat16)
        xs = wide[:, 1 : n + 1]  # offset 1, stride n + 9: no row on the 16-byte grid
        q, s = mod.rms_norm_quant(xs, w, EPS, **kw)
        q_ref, s_ref, v = rms_norm_quant_ref(xs, w, EPS, **kw)
        q_close(q, q_ref, v, f"rows off the grid {mode}")
        scales_close(s, s_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_many_narrow_rows(name, dtype):
    """Narrow rows in numbers (several a CTA in CUDA's rows kernel, over several CTAs, the
    last one part full): each form, groups of 16 and 64 too, against the reference."""
    mod = backend(name)
    for n, m in ((8, 300), (24, 300), (64, 261), (256, 131), (1000, 67)):
        x, r, w = inputs(m, n, dtype)
        for mode in ("static", "token", "group16", "group64"):
            kw = quant_kw(mode, torch.float8_e4m3fn, n)
            if kw is None or kw.get("group_size", 1) > n:
                continue
            say = f"N={n} M={m} {mode}"
            q, s = mod.rms_norm_quant(x, w, EPS, **kw)
            q_ref, s_ref, v = rms_norm_quant_ref(x, w, EPS, **kw)
            q_close(q, q_ref, v, say)
            if "scale" not in kw:
                scales_close(s, s_ref)
            q, ro, s = mod.fused_add_rms_norm_quant(x, r, w, EPS, **kw)
            q_ref, ro_ref, s_ref, v = fused_add_rms_norm_quant_ref(x, r, w, EPS, **kw)
            q_close(q, q_ref, v, say)
            torch.testing.assert_close(ro, ro_ref, rtol=0, atol=0)
            if "scale" not in kw:
                scales_close(s, s_ref)


def test_quantised_kernel_choice():
    """The quantised forward's kernel from the op's: a dynamic scale takes the fused tile
    where the op would loop over a row the tile holds, a static one keeps the looped
    kernel; the split kernel's odd widths take the fused tile, the sharded kernel's the
    looped one, in whole groups."""
    from triton_impl.configs import Config, fused_tile, quant_config
    from triton_impl.tuning import FUSED_MAX_N

    for elem in (2, 4):
        for n in (4096, FUSED_MAX_N[elem]):
            looped = Config("looped", min(n, 8192), 32, block_m=1)
            assert quant_config(looped, n, elem) == looped
            assert quant_config(looped, n, elem, dynamic=True) == fused_tile(n, elem)
        wider = 2 * FUSED_MAX_N[elem]
        looped = Config("looped", 8192, 32, block_m=1)
        assert quant_config(looped, wider, elem, dynamic=True) == looped
        split = Config("split", 4096, 16)
        assert quant_config(split, 4095, elem) == fused_tile(4095, elem)
        sharded = quant_config(Config("sharded", 8192, 32), 131072, elem, dynamic=True)
        assert sharded.kernel == "looped" and sharded.block_n % 1024 == 0


@pytest.mark.parametrize("name", BACKENDS)
def test_scale_read_once_a_call_in_inference_mode(name, monkeypatch):
    """A static scale made under torch.inference_mode keeps no version, so each call reads
    it (a GPU tensor: a synchronisation): once a call, not again in the op's own check; a
    bad value is still refused, and the op called directly still reads it."""
    import rmsnorm_api

    mod = backend(name)
    reads = []
    real = rmsnorm_api._scale_value
    monkeypatch.setattr(rmsnorm_api, "_scale_value", lambda t: reads.append(1) or real(t))
    x, _, w = inputs(3, 256, torch.bfloat16)
    with torch.inference_mode():
        scale = torch.tensor(0.02, device=DEVICE)
        for _ in range(2):
            mod.rms_norm_quant(x, w, EPS, scale=scale)
        assert len(reads) == 2
        with pytest.raises(ValueError, match="scale"):
            mod.rms_norm_quant(x, w, EPS, scale=torch.tensor(0.0, device=DEVICE))
        if name == "triton":  # the C++ op checks no value: the public function does
            ops = getattr(torch.ops, f"{name}_impl")
            ops.rms_norm_quant(x, w, EPS, scale, 0, None, torch.float8_e4m3fn, 0.0)
            assert len(reads) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("name", BACKENDS)
def test_eager_path_repeats_the_op(name):
    """The public functions' eager path (rmsnorm_api.quant: a key whose checks passed;
    Triton's plan cache and direct launch) gives the op's bits on each call of a key (the
    miss, the first launch of an alignment, the direct hits), for each form and mode,
    misaligned rows (a new alignment of a cached plan) and x given as its own residual;
    a bad eps or scale on a hit is still refused by name."""
    from rmsnorm_api import quant as api_quant

    mod = backend(name)
    ops = getattr(torch.ops, f"{name}_impl")
    q8 = torch.float8_e4m3fn
    x, r, w = inputs(48, 4097, torch.bfloat16)
    x, r, w = x[:, 1:], r[:, 1:], w[1:]  # rows of 4096 at an odd offset: scalar loads
    rows = [inputs(64, 4096, torch.bfloat16), (x, r, w)]
    api_quant._CHECKED.clear()
    for x, r, w in rows:
        for mode in ("static", "token", "bounded", "group128"):
            kw = quant_kw(mode, q8, 4096)
            args = (kw.get("scale"), kw.get("group_size", 0), kw.get("scale_ub"), q8, 0.0)
            want = ops.rms_norm_quant(x, w, EPS, *args)
            want_fused = ops.fused_add_rms_norm_quant(x, r, w, EPS, *args)
            want_self = ops.fused_add_rms_norm_quant(x, x, w, EPS, *args)
            for _ in range(3):
                got = mod.rms_norm_quant(x, w, EPS, **kw)
                got_fused = mod.fused_add_rms_norm_quant(x, r, w, EPS, **kw)
                got_self = mod.fused_add_rms_norm_quant(x, x, w, EPS, **kw)
                for g, e in zip((*got, *got_fused, *got_self), (*want, *want_fused, *want_self),
                                strict=True):  # fmt: skip
                    if e.numel() == 0:  # the static scale, returned as given
                        assert g is kw["scale"]
                        continue
                    bits = (
                        (g.view(torch.uint8), e.view(torch.uint8))
                        if g.element_size() == 1
                        else (g, e)
                    )
                    assert torch.equal(*bits), mode
    assert api_quant._CHECKED
    with pytest.raises(ValueError, match="eps"):
        mod.rms_norm_quant(x, w, 0.0)
    scale = torch.tensor(0.5, device=DEVICE)
    mod.rms_norm_quant(x, w, EPS, scale=scale)
    scale.fill_(-1.0)
    with pytest.raises(ValueError, match="scale is -1.0"):
        mod.rms_norm_quant(x, w, EPS, scale=scale)


@pytest.mark.gpu
def test_triton_eager_quant_plans_launch_directly():
    """A functional quantised call's plan is cached under its key, its compiled kernel kept
    for the direct launch (the host path past Triton's launcher), one a pointer alignment."""
    from triton_impl import eager

    mod = backend("triton")
    x, r, w = inputs(64, 4096, torch.bfloat16)
    eager.PLANS.clear()
    for _ in range(3):
        mod.rms_norm_quant(x, w, EPS, group_size=128)
    (p,) = eager.PLANS.values()
    assert isinstance(p, eager._QuantPlan) and p.direct == eager.DIRECT
    assert len(p.compiled) == 1 and all(p.compiled.values()) == eager.DIRECT
    mod.rms_norm_quant(x[:, :-128], w[:-128], EPS, group_size=128)  # another key
    assert len(eager.PLANS) == 2
    eager.PLANS.clear()
