"""The backward of both ops, both kernels: gradients against the float64 reference over a
grid (three dtypes, odd widths, wide rows, strided rows and dy, dy off a 16-byte boundary,
no weight, fp32 weight), the fused add's gradients, determinism of dweight, gradcheck of
the reference, invalid gradients' errors, and the ops (opcheck with gradients,
torch.compile, modules training).

Without a GPU the Triton backward runs under the interpreter (small M), and the CUDA
backward ops' argument checks run on CPU tensors (they come before the device check).
"""

import pytest
import torch

from conftest import DEVICE, HAS_GPU, impl_or_skip
from harness.reference import (
    fused_add_rms_norm_grads_ref,
    grad_close,
    grad_scale,
    norm64,
    rms_norm_grads_ref,
)

BACKENDS = ["triton", "cuda"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: (M, N): odd widths, register-resident widths (on a GPU, fp32 6000 and 8192: CUDA's 512
#: threads of 4 groups, 6000 leaving some of them empty; its odd rows' kernels with head and
#: tail elements at 2049 (fp32 256 threads, 16-bit 128), 4095 / 4097 and 6001 (fp32 512 x
#: 4)), rows wider than a program holds; more
#: rows than the Triton split variant's programs (16 // element size of them without a
#: GPU), so each program walks several rows and the programs start at different 16-byte
#: phases.
SHAPES = [(7, 1), (5, 17), (6, 1000), (13, 1000), (19, 33), (4, 4095), (4, 4096), (3, 4097),
          (2, 40000)]  # fmt: skip
if HAS_GPU:
    SHAPES += [(1031, 4096), (257, 16384), (64, 65536), (9000, 1024), (2000, 4095), (1500, 4097),
               (3000, 8192), (700, 6000), (700, 6001), (800, 2049), (800, 12289),
               (600, 32771),
               # CUDA's narrow kernel: 8-32 lanes a row, one or two groups a lane, many rows a
               # CTA over several rounds, the last part full; 8 columns: one group of 16-bit
               (3001, 64), (2049, 128), (1000, 256), (333, 512), (517, 8), (4100, 32)]  # fmt: skip
#: The fused add's: odd widths, a row wider than a program holds; on a GPU, many rows a CTA
#: (the CUDA staged kernel's ring 3 rows deep at 1024 and 4096, 2 at 4095; with the fp32
#: residual, 3 at 1024 and 2 at 4096; 2 rows with the weight kept in bf16 at 8192 and
#: 16384, where the fp32 residual's rows fit one CTA only so; fp32 6001 in the register
#: kernel's 512 x 4 with head and tail elements)
FUSED_SHAPES = [(5, 17), (19, 33), (4, 4097), (2, 40000)]
if HAS_GPU:
    FUSED_SHAPES += [(9000, 1024), (2000, 4095), (1031, 4096), (700, 6001), (700, 8192),
                     (300, 16384)]  # fmt: skip


def backend(name: str):
    impl_or_skip(name)
    return __import__(f"{name}_impl")


def poison_allocator(nbytes: int) -> None:
    """On a GPU, the next allocations reuse memory just filled with NaN (the caching
    allocator's freed block), so an output the kernel leaves unwritten shows up."""
    if HAS_GPU:
        torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")


def rows(m: int, n: int, dtype, pad: int = 0) -> torch.Tensor:
    """Fresh randn rows, as a view into wider rows when pad > 0 (row stride n + pad)."""
    base = torch.randn(m, n + pad, device=DEVICE).to(dtype)
    return base[:, pad : pad + n] if pad else base


def off_boundary(t: torch.Tensor) -> torch.Tensor:
    """t's values (contiguous) in memory that starts 2 bytes past a 16-byte boundary, which
    no stride or storage offset shows: only the data pointer."""
    nbytes = t.numel() * t.element_size()
    if t.is_cuda:
        raw = torch.empty(nbytes + 16, dtype=torch.uint8, device=t.device)
        at = raw.data_ptr() + (2 - raw.data_ptr()) % 16

        class Raw:  # a zero-copy view from an address (the tensor keeps this object alive)
            keep = raw
            __cuda_array_interface__ = dict(shape=(nbytes,), typestr="|u1", data=(at, False),
                                            version=2)  # fmt: skip

        flat = torch.as_tensor(Raw(), device=t.device)
    else:
        buf = bytearray(nbytes + 16)
        start = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=(2 - start) % 16)
    out = flat.view(t.dtype).view(t.shape).copy_(t)
    assert out.data_ptr() % 16 == 2 and out.storage_offset() == 0
    return out


def weight_of(n: int, dtype, kind: str):
    if kind == "none":
        return None
    return (1 + 0.5 * torch.randn(n, device=DEVICE)).to(torch.float32 if kind == "fp32" else dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_rms_norm_grads_match_reference(name, dtype, shape):
    """dx and dweight through autograd against the float64 reference, poisoned memory
    under the outputs."""
    mod = backend(name)
    m, n = shape
    x = rows(m, n, dtype).requires_grad_()
    w = weight_of(n, dtype, "dtype").requires_grad_()
    assert_grads_match(mod, x, w, torch.randn(m, n, device=DEVICE).to(dtype))


def assert_grads_match(mod, x, w, dy) -> None:
    """dx (and dweight, with a weight) of mod.rms_norm through autograd against the float64
    reference, poisoned memory under the outputs."""
    y = mod.rms_norm(x, w, 1e-6)
    poison_allocator(3 * x.numel() * 4)
    grads = torch.autograd.grad(y, (x,) if w is None else (x, w), dy)
    want_dx, want_dw = rms_norm_grads_ref(x, w, 1e-6, dy)
    grad_close(grads[0], want_dx, "dx", grad_scale(x, w, dy))
    if w is not None:
        grad_close(grads[1], want_dw, "dweight")


@pytest.mark.gpu
@pytest.mark.parametrize("wkind", ["none", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_rms_norm_grads_narrow_rows_strided_and_weights(name, dtype, wkind):
    """Narrow aligned rows (CUDA's narrow kernel) at a row stride of 3 widths (a packed
    projection's q), without a weight and with an fp32 one."""
    mod = backend(name)
    for m, n in ((2051, 64), (999, 128), (260, 512)):
        pad = 2 * n
        x = rows(m, n, dtype, pad).requires_grad_()
        w = weight_of(n, dtype, wkind)
        w = w.requires_grad_() if w is not None else None
        assert_grads_match(mod, x, w, torch.randn(m, n, device=DEVICE).to(dtype))


LAYOUTS = ["strided-rows", "strided-in-phase", "dy-transposed", "dy-expanded", "dy-off-boundary",
           "3d"]  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("wkind", ["none", "fp32", "dtype"])
@pytest.mark.parametrize("shape", [(6, 1000), (18, 33)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", BACKENDS)
def test_rms_norm_grads_layouts(name, shape, wkind, layout):
    """Rows of x at an offset and odd stride, or a stride one 16-byte vector wider than the
    width (each row as far from a boundary as dx's and dy's), dy of any strides (a
    transposed copy, an expanded row: handled, not refused) or 2 bytes off a 16-byte
    boundary that only its address shows, 3-D x; no weight (no dweight) or an fp32 weight
    beside bf16 x (an fp32 dweight). Widths even and odd, more rows than the Triton split
    variant's programs."""
    mod = backend(name)
    dtype = torch.bfloat16
    m, n = shape
    pad = {"strided-rows": 3, "strided-in-phase": 8}.get(layout, 0)
    x = rows(m, n, dtype, pad=pad)
    if layout == "3d":
        x = x.view(2, m // 2, n)
    x.requires_grad_()
    w = weight_of(n, dtype, wkind)
    if w is not None:
        w.requires_grad_()
    if layout == "dy-transposed":
        dy = torch.randn(n, m, device=DEVICE).to(dtype).t()
    elif layout == "dy-expanded":
        dy = torch.randn(n, device=DEVICE).to(dtype).expand(m, n)
    elif layout == "dy-off-boundary":
        dy = off_boundary(torch.randn(x.shape, device=DEVICE).to(dtype))
    else:
        dy = torch.randn(x.shape, device=DEVICE).to(dtype)
    y = mod.rms_norm(x, w, 1e-6)
    wrt = (x,) if w is None else (x, w)
    grads = torch.autograd.grad(y, wrt, dy)
    want_dx, want_dw = rms_norm_grads_ref(x, w, 1e-6, dy)
    grad_close(grads[0], want_dx, "dx", grad_scale(x, w, dy))
    if w is not None:
        assert grads[1].dtype == w.dtype
        grad_close(grads[1], want_dw, "dweight")
    dx, dw = mod.rms_norm_backward(dy, x.detach(), None if w is None else w.detach(), 1e-6)
    grad_close(dx, want_dx, "dx (the backward op)", grad_scale(x, w, dy))
    assert (dw is None) == (w is None)


#: On a GPU, rows that take the CUDA staged kernel's 1024-thread 2-row ring with an fp32
#: weight or none (the kernel without the weight kept in dy's dtype); without one, a few
#: rows as wide, which the interpreter finishes quickly, so the test runs everywhere.
WIDE_WEIGHT_SHAPES = [(257, 16384), (300, 12288)] if HAS_GPU else [(3, 12288)]


@pytest.mark.parametrize("wkind", ["none", "fp32"])
@pytest.mark.parametrize("shape", WIDE_WEIGHT_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", BACKENDS)
def test_rms_norm_grads_wide_rows_other_weights(name, shape, wkind):
    """Wide bf16 rows with an fp32 weight or none (on a GPU many rows a CTA), poisoned
    memory under the outputs."""
    mod = backend(name)
    m, n = shape
    x = rows(m, n, torch.bfloat16).requires_grad_()
    w = weight_of(n, torch.bfloat16, wkind)
    if w is not None:
        w.requires_grad_()
    assert_grads_match(mod, x, w, torch.randn(m, n, device=DEVICE).to(torch.bfloat16))


#: fp32 rows of odd width; on a GPU, CUDA's register kernel with head and tail elements at
#: each of its shapes (256 threads at 2049, 512 at 4095, 512 x 4 at 6001)
ODD_FP32_SHAPES = [(5, 17), (4, 4095)]
if HAS_GPU:
    ODD_FP32_SHAPES += [(800, 2049), (700, 4095), (700, 6001)]


@pytest.mark.parametrize("shape", ODD_FP32_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", BACKENDS)
def test_rms_norm_grads_odd_fp32_without_weight(name, shape):
    """fp32 rows of odd width without a weight (dx alone, no dweight partials), poisoned
    memory under dx."""
    mod = backend(name)
    m, n = shape
    x = rows(m, n, torch.float32).requires_grad_()
    assert_grads_match(mod, x, None, torch.randn(m, n, device=DEVICE))


def fused_forward(mod, m: int, n: int, rdtype: str, dtype=torch.bfloat16) -> tuple:
    """The fused add on leaves x and weight of dtype and a residual leaf of x's dtype
    ("dtype") or fp32, with fresh gradients for its outputs: (x, r, w, y, residual_out, dy,
    dro)."""
    x = rows(m, n, dtype).requires_grad_()
    r = rows(m, n, torch.float32 if rdtype == "fp32" else dtype).requires_grad_()
    w = weight_of(n, dtype, "dtype").requires_grad_()
    y, ro = mod.fused_add_rms_norm(x, r, w, 1e-6)
    return x, r, w, y, ro, torch.randn_like(y), torch.randn_like(ro)


@pytest.mark.parametrize("used", ["both", "y-only", "residual_out-only"])
@pytest.mark.parametrize("rdtype", ["dtype", "fp32"])
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", BACKENDS)
def test_fused_add_grads_match_reference(name, shape, rdtype, used):
    """dx, dresidual, dweight of the fused add, with the gradient reaching y, residual_out
    or both (an fp32 residual stream beside bf16 x included)."""
    x, r, w, y, ro, dy, dro = fused_forward(backend(name), *shape, rdtype)
    outs, grads_in = {"both": ((y, ro), (dy, dro)), "y-only": ((y,), (dy,)),
                      "residual_out-only": ((ro,), (dro,))}[used]  # fmt: skip
    got = torch.autograd.grad(outs, (x, r, w), grads_in, allow_unused=True)
    want = fused_add_rms_norm_grads_ref(
        x, r, w, 1e-6, dy if used != "residual_out-only" else torch.zeros_like(dy),
        dro if used != "y-only" else None,
    )  # fmt: skip
    scale = grad_scale(ro, w, dy) + float(dro.abs().max()) * (used != "y-only")
    for g, exp, what in zip(got, want, ("dx", "dresidual", "dweight"), strict=True):
        if g is None:  # residual_out alone: the weight gets no gradient
            assert what == "dweight" and used == "residual_out-only"
            continue
        grad_close(g, exp, what, None if what == "dweight" else scale)


@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", BACKENDS)
def test_fused_add_grads_fp32(name, shape):
    """The fused add's gradients with fp32 x, residual and weight (on a GPU, CUDA's
    register-resident rows of odd widths, their head and tail elements among them): through
    autograd (dx serving as dresidual) and through the backward op (both stored), poisoned
    memory under the outputs."""
    mod = backend(name)
    ops = getattr(torch.ops, f"{name}_impl")
    x, r, w, y, ro, dy, dro = fused_forward(mod, *shape, "dtype", dtype=torch.float32)
    want = fused_add_rms_norm_grads_ref(x, r, w, 1e-6, dy, dro)
    scale = grad_scale(ro, w, dy) + float(dro.abs().max())
    poison_allocator(4 * x.numel() * 4)
    got = torch.autograd.grad((y, ro), (x, r, w), (dy, dro))
    poison_allocator(4 * x.numel() * 4)
    stored = ops.fused_add_rms_norm_backward(dy, dro, ro.detach(), w.detach(), 1e-6)
    for grads in (got, stored):
        for g, exp, what in zip(grads, want, ("dx", "dresidual", "dweight"), strict=True):
            grad_close(g, exp, what, None if what == "dweight" else scale)


@pytest.mark.parametrize("rdtype", ["dtype", "fp32"])
@pytest.mark.parametrize("name", BACKENDS)
def test_fused_add_dresidual_shares_dx(name, rdtype):
    """Where x and the residual share a dtype, autograd's dresidual is dx itself (the op
    run with dresidual=False stores one tensor): the same bits as the op's two stores, and
    each leaf's .grad its own tensor; with an fp32 residual, two tensors."""
    mod = backend(name)
    ops = getattr(torch.ops, f"{name}_impl")
    x, r, w, y, ro, dy, dro = fused_forward(mod, 257 if HAS_GPU else 5, 1000, rdtype)
    gx, gr, gw = torch.autograd.grad((y, ro), (x, r, w), (dy, dro), retain_graph=True)
    both = ops.fused_add_rms_norm_backward(dy, dro, ro.detach(), w.detach(), 1e-6)
    assert torch.equal(gx, both[0]) and torch.equal(gr, both[1]) and torch.equal(gw, both[2])
    shared = rdtype == "dtype"
    assert (gx.data_ptr() == gr.data_ptr()) == shared
    one = ops.fused_add_rms_norm_backward(dy, dro, ro.detach(), w.detach(), 1e-6, False)
    assert one[1].numel() == 0 and one[1].dtype == r.dtype
    assert torch.equal(one[0], both[0]) and torch.equal(one[2], both[2])
    # .backward(): the leaves' gradients are two tensors even where one was returned
    torch.autograd.backward((y, ro), (dy, dro))
    assert x.grad.data_ptr() != r.grad.data_ptr()
    x.grad.fill_(float("nan"))
    assert torch.equal(r.grad, both[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_fused_add_backward_without_either_residual_gradient(name, dtype):
    """The fused add's backward op with no d_residual_out and no dresidual stored is the
    plain op's backward of residual_out (on a GPU, the CUDA kernel the plain op picks for
    its dtype: fp32's register-resident rows among them), bit for bit."""
    backend(name)
    ops = getattr(torch.ops, f"{name}_impl")
    m, n = (300, 4096) if HAS_GPU else (5, 1000)
    s = rows(m, n, dtype)
    w = weight_of(n, dtype, "dtype")
    dy = torch.randn(m, n, device=DEVICE).to(dtype)
    dx, dres, dw = ops.fused_add_rms_norm_backward(dy, None, s, w, 1e-6, False)
    want = ops.rms_norm_backward(dy, s, w, 1e-6)
    assert dres.numel() == 0 and torch.equal(dx, want[0]) and torch.equal(dw, want[1])


@pytest.mark.parametrize("name", BACKENDS)
def test_dweight_is_deterministic(name):
    """dweight (and dx) bitwise identical from run to run: partial sums in a fixed order,
    no atomics."""
    mod = backend(name)
    m, n = (4099, 4096) if HAS_GPU else (9, 1000)
    x = rows(m, n, torch.bfloat16)
    w = weight_of(n, torch.float32, "fp32")
    dy = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    first = mod.rms_norm_backward(dy, x, w, 1e-6)
    for _ in range(3):
        again = mod.rms_norm_backward(dy, x, w, 1e-6)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


#: Tuning values of the Triton backward (triton_impl.tuning) the defaults do not reach: 16
#: warps at 8192; 32 warps at 16384, with fp32 16384 held whole rather than sharded; tiles
#: wider than their threads hold (2 warps), their weight loaded each row or held
SWITCHES = [dict(BWD_MAX_WARPS_N=4096),
            dict(BWD_MAX_WARPS_N=16384, BWD_SHARD_FROM_BYTES=131072),
            dict(BWD_MAX_WARPS=2, BWD_WIDE_MAX_WARPS=2, BWD_WEIGHT_EACH_ROW=0),
            dict(BWD_MAX_WARPS=2, BWD_WIDE_MAX_WARPS=2, BWD_WEIGHT_EACH_ROW=1)]  # fmt: skip


@pytest.mark.parametrize(
    "switches", SWITCHES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items())
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_backward_switches(monkeypatch, dtype, switches):
    """Triton's backward at tuning values its defaults do not reach: the register-resident
    rows on fewer or more warps, the widest of them held whole rather than sharded, tiles
    wider than their threads hold with the weight loaded each row or held; the plain op's
    and the fused add's."""
    mod = backend("triton")
    from triton_impl import backward

    for name, value in switches.items():
        monkeypatch.setattr(backward, name, value)
    # on a GPU: many rows a program or a group; rows of 32 warps a program (BWD_MAX_WARPS_N)
    more = [(2000, 4095), (600, 40000), (300, 8192), (300, 16384)] if HAS_GPU else []
    for m, n in [(19, 33), (13, 1000), (3, 40000), *more]:
        x = rows(m, n, dtype).requires_grad_()
        w = weight_of(n, dtype, "dtype").requires_grad_()
        assert_grads_match(mod, x, w, torch.randn(m, n, device=DEVICE).to(dtype))
    for m, n in [(13, 1000), (3, 40000), *more]:
        x, r, w, y, ro, dy, dro = fused_forward(mod, m, n, "dtype", dtype=dtype)
        got = torch.autograd.grad((y, ro), (x, r, w), (dy, dro))
        want = fused_add_rms_norm_grads_ref(x, r, w, 1e-6, dy, dro)
        scale = grad_scale(ro, w, dy) + float(dro.abs().max())
        for g, exp, what in zip(got, want, ("dx", "dresidual", "dweight"), strict=True):
            grad_close(g, exp, what, None if what == "dweight" else scale)


@pytest.mark.parametrize("sms", [0, 132], ids=lambda s: f"sms{s}")
@pytest.mark.parametrize("p, n", [(3, 17), (600, 1000), (70, 4096), (20, 6000)], ids=str)
def test_triton_dweight_reduction_column_blocks(p, n, sms):
    """Triton's sum of the dweight partials at each column block it takes: the widest (no
    SMs: the interpreter's), and the narrower ones a GPU's SMs get at narrow rows (132: the
    H200's), reached on a CPU too: each column the sum of its rows, the same bits each run."""
    impl_or_skip("triton")
    from triton_impl import backward

    dwp = torch.randn(p, n, device=DEVICE)
    w = torch.empty(n, device=DEVICE)
    got = backward._reduce_dw(dwp, w, p, sms)
    want = dwp.double().sum(0)
    tol = 1e-6 * p * dwp.abs().max().item()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tol)
    assert torch.equal(got, backward._reduce_dw(dwp, w, p, sms))


def test_reference_gradcheck():
    """The reference's gradients are the formula's: gradcheck in float64."""
    x = torch.randn(3, 17, dtype=torch.float64, requires_grad=True)
    w = torch.randn(17, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: norm64(x, w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda x: norm64(x, None, 1e-6), (x,))


@pytest.mark.parametrize("name", BACKENDS)
def test_backward_errors_name_the_argument(name):
    """Bad gradients reaching the backward ops directly get clear errors naming the
    argument (the CUDA op's C++ checks on CPU tensors, as its Python wrapper's)."""
    ops = getattr(torch.ops, f"{name}_impl")
    try:
        __import__(f"{name}_impl")
    except ImportError as e:
        pytest.skip(str(e))
    x = torch.randn(4, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    dy = torch.randn(4, 64, device=DEVICE)
    bad = [
        ((dy[:, :32], x, w, 1e-6), ValueError, r"x has shape \(4, 64\) but dy has shape \(4, 32\)"),
        ((dy.half(), x, w, 1e-6), TypeError, r"x has dtype torch.float32 but dy has dtype"),
        ((dy.int(), x, w, 1e-6), TypeError, r"dy has dtype torch.int32"),
        ((dy, x, w[:32], 1e-6), ValueError, r"weight has shape \(32,\)"),
        ((dy, x, w, 0.0), ValueError, r"eps is 0.0"),
        ((None, x, w, 1e-6), TypeError, r"dy must be a torch.Tensor"),
    ]
    for args, err, what in bad:
        with pytest.raises(err, match=what):
            ops.rms_norm_backward(*args)
    r = x.clone()
    with pytest.raises(ValueError, match=r"d_residual_out has shape \(4, 32\)"):
        ops.fused_add_rms_norm_backward(dy, dy[:, :32], r, w, 1e-6)
    with pytest.raises(TypeError, match=r"residual_out has dtype torch.float16"):
        ops.fused_add_rms_norm_backward(dy, None, r.half(), w, 1e-6)
    if DEVICE == "cpu" and name == "cuda":
        with pytest.raises(ValueError, match=r"dy is on device 'cpu'; expected a CUDA tensor"):
            ops.rms_norm_backward(dy, x, w, 1e-6)


@pytest.mark.parametrize("name", BACKENDS)
def test_opcheck_with_gradients(name):
    """torch.library.opcheck of both functional ops with inputs that require grad (its
    autograd registration test included) and of the backward ops."""
    backend(name)
    ops = getattr(torch.ops, f"{name}_impl")
    # the interpreter computes on host copies, which fake tensors cannot follow: on CPU only
    # the schema and autograd-registration checks apply; on a GPU, all
    kw = {} if HAS_GPU else {"test_utils": ("test_schema", "test_autograd_registration")}
    x = torch.randn(4, 96, device=DEVICE, requires_grad=True)
    r = torch.randn(4, 96, device=DEVICE, requires_grad=True)
    w = torch.randn(96, device=DEVICE, requires_grad=True)
    dy = torch.randn(4, 96, device=DEVICE)
    torch.library.opcheck(ops.rms_norm.default, (x, w, 1e-6), **kw)
    torch.library.opcheck(ops.fused_add_rms_norm.default, (x, r, w, 1e-6), **kw)
    torch.library.opcheck(ops.rms_norm_backward.default, (dy, x.detach(), w.detach(), 1e-6), **kw)
    for dresidual in (True, False):
        args = (dy, dy.clone(), r.detach(), w.detach(), 1e-6, dresidual)
        torch.library.opcheck(ops.fused_add_rms_norm_backward.default, args, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 1000])
@pytest.mark.parametrize("name", BACKENDS)
def test_compile_fullgraph_backward(name, n):
    """torch.compile(fullgraph=True) of a forward whose loss is backpropagated: the same
    gradients as eager, both ops; a width that is a multiple of 16 and one that is not
    (the Triton backward's split variant, chosen while traced)."""
    mod = backend(name)
    x = torch.randn(64, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step(x, r, w):
        y, ro = mod.fused_add_rms_norm(x, r, w, 1e-6)
        return mod.rms_norm(y, w, 1e-6).float().square().sum() + ro.float().sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    eager = torch.autograd.grad(step(x, r, w), (x, r, w))
    got = torch.autograd.grad(compiled(x, r, w), (x, r, w))
    for g, e in zip(got, eager, strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("name", BACKENDS)
def test_module_trains(name):
    """The module's weight learns: one SGD step moves it as torch.nn.RMSNorm's does."""
    mod = backend(name)
    n = 128
    ours = mod.RMSNorm(n, eps=1e-6, device=DEVICE)
    ref = torch.nn.RMSNorm(n, eps=1e-6, device=DEVICE)
    with torch.no_grad():
        w0 = 1 + 0.5 * torch.randn(n, device=DEVICE)
        ours.weight.copy_(w0)
        ref.weight.copy_(w0)
    x = torch.randn(8, n, device=DEVICE)
    target = torch.randn(8, n, device=DEVICE)
    for m in (ours, ref):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.nn.functional.mse_loss(m(x), target).backward()
        opt.step()
    torch.testing.assert_close(ours.weight, ref.weight, atol=1e-5, rtol=1e-5)
    assert not torch.equal(ours.weight.detach(), w0)


def test_split_judges_alignment_in_elements():
    """The backward's whole-row tile is taken only where Triton can prove 16-byte vectors:
    strides a multiple of 16 elements (Triton's mark), not of 16 bytes; rows at a stride of
    16 bytes but not 16 elements take the split, heads (T, H, N) by every stride."""
    from triton_impl.backward import split_vec

    for dtype, vec in ((torch.bfloat16, 8), (torch.float32, 4)):
        rows = torch.empty(4, 1024 + vec, dtype=dtype)[:, :1024]  # 16 bytes, not 16 elements
        assert split_vec(1024, rows, rows, rows) == vec
        whole = torch.empty(4, 1024 + 16, dtype=dtype)[:, :1024]
        assert split_vec(1024, whole, whole, whole) == 0
        heads = torch.empty(4, 3, 1024 + vec, dtype=dtype)[..., :1024]
        dense = torch.empty(4, 3, 1024, dtype=dtype)
        assert split_vec(1024, dense, dense, dense) == 0
        assert split_vec(1024, heads, heads, heads) == vec
