"""Fused RMSNorm forward in Triton: y = x / sqrt(mean(x^2) + eps) * weight.

Parallelisation
- Fused path (next_pow2(N) <= FUSED_MAX_N): one program owns a BLOCK_M x BLOCK_N tile,
  BLOCK_M whole rows (several rows for small N, one for large N). The tile is loaded
  once, kept in registers, reduced along the row, scaled and stored: x is read from
  memory exactly once.
- Chunked path (wider rows): one program per row walks it in BLOCK_N chunks twice: the
  first sweep accumulates sum(x^2), the second re-reads the chunks (from L2: one row is
  at most 1 MiB and only ~one row per SM is in flight), normalises and stores.
- Split path (for now only through rms_norm_with_config, a sweep candidate): one program
  per row, the row split at x's 16-byte boundaries into a scalar head, an aligned body
  and a scalar tail, so odd N can still use 16-byte accesses.
Lanes >= N are masked: they load 0, so they add nothing to the sum, and the sum is
divided by the true N, never by BLOCK_N. Row offsets are int64 so tensors above 2^31
elements index correctly.

Precision policy (that of native F.rms_norm's fused CUDA path, see rmsnorm_api):
x is upcast to fp32, squares accumulate in fp32, rstd and the weight multiply are fp32,
and the result is cast once to x's dtype at the store. weight may be x's dtype or fp32.

Learned from: the Triton tutorial on layer norm (row-per-program, masked tails), Liger
Kernel's rms_norm (block size and warps from N), QuACK's rmsnorm (several rows per CTA for
small N, bytes in flight as the figure of merit).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from rmsnorm_api import (
    DEFAULT_EPS,
    RMSNormModule,
    as_rows,
    call_op,
    check_inputs,
    check_out,
)

#: Widest power-of-two row the fused path keeps in registers, per element size in bytes.
FUSED_MAX_N = {4: 32768, 2: 65536}
#: Chunk width of the two-sweep path for rows wider than that.
CHUNK_N = 8192

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


# fmt: off
@triton.jit
def _rms_norm_fwd_fused(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    stride_x, stride_y,  # elements between consecutive rows
    M, N, eps,  # rows, true row width, eps (fp32)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    # fmt: on
    # one program per BLOCK_M rows; the whole tile lives in registers
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows < M)[:, None] & col_ok[None, :]
    # load: masked lanes read 0 and add nothing to the sum
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    # accumulate in fp32, divide by the true width
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y * w[None, :]
    # one cast, at the store
    tl.store(
        y_ptr + rows[:, None] * stride_y + cols[None, :],
        y.to(y_ptr.dtype.element_ty),
        mask=mask,
    )


# fmt: off
@triton.jit
def _rms_norm_fwd_chunked(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    stride_x, stride_y,  # elements between consecutive rows
    N, eps,  # true row width, eps (fp32)
    BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    # fmt: on
    # one program per row, too wide for registers: two sweeps over BLOCK_N chunks
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    cols = tl.arange(0, BLOCK_N)
    # sweep 1: per-lane fp32 partial sums, reduced once at the end
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    # sweep 2: re-read (L2-resident), scale, cast, store
    for start in range(0, N, BLOCK_N):
        c = start + cols
        ok = c < N
        x = tl.load(x_row + c, mask=ok, other=0.0).to(tl.float32)
        y = x * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_row + c, y.to(y_ptr.dtype.element_ty), mask=ok)


# fmt: off
@triton.jit
def _rms_norm_fwd_split(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    stride_x, stride_y,  # elements between rows; stride_x = stride_y (mod VEC)
    N, eps,  # true row width, eps (fp32)
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    # fmt: on
    # one program per row, split at x's 16-byte boundaries (VEC elements): a scalar head,
    # an aligned body the compiler can load with 16-byte vectors, a scalar tail. For odd N
    # the masked fused kernel cannot prove alignment and loads every element alone.
    row = tl.program_id(0).to(tl.int64)
    head = tl.minimum((VEC - (row * stride_x) % VEC) % VEC, N).to(tl.int32)
    nbody = tl.multiple_of((N - head) // VEC * VEC, VEC)
    xb_start = tl.multiple_of(row * stride_x + head, VEC)
    yb_start = tl.multiple_of(row * stride_y + head, VEC)
    cols = tl.arange(0, BLOCK_N)
    body = cols < nbody
    # edges: lanes [0, VEC) are the head, [VEC, 2 VEC) the tail
    e = tl.arange(0, 2 * VEC)
    is_head = e < VEC
    e_col = tl.where(is_head, e, head + nbody + e - VEC)
    e_ok = tl.where(is_head, e < head, e - VEC < N - head - nbody)
    # load body and edges; masked lanes read 0
    xb = tl.load(x_ptr + xb_start + cols, mask=body, other=0.0).to(tl.float32)
    xe = tl.load(x_ptr + row * stride_x + e_col, mask=e_ok, other=0.0).to(tl.float32)
    # accumulate in fp32, divide by the true width
    rstd = tl.rsqrt((tl.sum(xb * xb, axis=0) + tl.sum(xe * xe, axis=0)) / N + eps)
    yb = xb * rstd
    ye = xe * rstd
    if HAS_WEIGHT:
        yb = yb * tl.load(w_ptr + head + cols, mask=body, other=0.0).to(tl.float32)
        ye = ye * tl.load(w_ptr + e_col, mask=e_ok, other=0.0).to(tl.float32)
    # one cast, at the store
    tl.store(y_ptr + yb_start + cols, yb.to(y_ptr.dtype.element_ty), mask=body)
    tl.store(y_ptr + row * stride_y + e_col, ye.to(y_ptr.dtype.element_ty), mask=e_ok)


def launch_config(n: int, element_size: int) -> dict:
    """Block shape and warps for a row of n elements: which kernel, BLOCK_M, BLOCK_N, warps.

    Aims at 16-byte accesses with a few of them in flight per thread, and at least ~8 KiB
    per program so small rows still give each program enough bytes to hide latency.
    """
    block_n = triton.next_power_of_2(n)
    if block_n > FUSED_MAX_N[element_size]:
        return dict(kernel="chunked", BLOCK_M=1, BLOCK_N=CHUNK_N, num_warps=16)
    row_bytes = block_n * element_size
    block_m = max(1, min(64, 8192 // row_bytes))
    tile_bytes = block_m * row_bytes
    num_warps = max(1, min(32, tile_bytes // 2048))
    return dict(kernel="fused", BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)


def _plan(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    y: torch.Tensor,
    cfg: Optional[dict] = None,
) -> tuple:
    """(kernel, grid, args, meta) for rms_norm(x, weight, eps) into the contiguous y, with
    launch_config's choice or a forced ``cfg`` of the same form."""
    x2, y2 = as_rows(x), y.view(-1, x.shape[-1])
    m, n = x2.shape
    # Block shape and warps are compile-time choices: under dynamic-shape tracing this
    # specialises on the row width (a guard), while M may stay symbolic.
    n = int(n)
    has_weight = weight is not None
    w = weight.contiguous() if has_weight else x2  # dummy pointer, never read
    cfg = cfg or launch_config(n, x.element_size())
    meta = dict(BLOCK_N=cfg["BLOCK_N"], HAS_WEIGHT=has_weight, num_warps=cfg["num_warps"])
    strides = (x2.stride(0), y2.stride(0))
    if cfg["kernel"] == "fused":
        grid = (triton.cdiv(m, cfg["BLOCK_M"]),)
        args = (x2, w, y2, *strides, m, n, eps)
        return _rms_norm_fwd_fused, grid, args, dict(meta, BLOCK_M=cfg["BLOCK_M"])
    args = (x2, w, y2, *strides, n, eps)
    if cfg["kernel"] == "split":
        vec = 16 // x.element_size()
        if (strides[0] - strides[1]) % vec or x2.data_ptr() % 16 or y2.data_ptr() % 16:
            raise ValueError("cfg: the split kernel needs x and y rows of equal alignment")
        return _rms_norm_fwd_split, (m,), args, dict(meta, VEC=vec)
    return _rms_norm_fwd_chunked, (m,), args, meta


def _launch(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    y: torch.Tensor,
    cfg: Optional[dict] = None,
) -> None:
    """Write rms_norm(x, weight, eps) into the contiguous y (checked by the caller)."""
    if x.numel() == 0:
        return
    kernel, grid, args, meta = _plan(x, weight, eps, y, cfg)
    wrap_triton(kernel)[grid](*args, **meta)


def kernel_info(x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> dict:
    """The compiled kernel rms_norm runs for x (GPU only): its name, launch config,
    registers and spills a thread, warps and shared memory, from Triton's metadata."""
    check_inputs(x, weight, DEFAULT_EPS, impl=_IMPL)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    kernel, grid, args, meta = _plan(x, weight, DEFAULT_EPS, y)
    compiled = kernel.warmup(*args, grid=grid, **meta)
    init = getattr(compiled, "_init_handles", None)
    if init is not None:  # registers and spills are read when the binary is loaded
        init()
    md = compiled.metadata
    return dict(
        name=getattr(md, "name", kernel.__name__),
        config=dict(launch_config(x.shape[-1], x.element_size())),
        n_regs=getattr(compiled, "n_regs", None),
        n_spills=getattr(compiled, "n_spills", None),
        num_warps=getattr(md, "num_warps", None),
        shared_bytes=getattr(md, "shared", None),
    )


_IMPL = "triton_impl.rms_norm"


@triton_op("triton_impl::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=_IMPL)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, weight, eps, y)
    return y


@triton_op("triton_impl::rms_norm_out", mutates_args={"out"})
def _rms_norm_out_op(
    out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float
) -> None:
    check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=_IMPL)
    check_out(out, x, impl=_IMPL)
    _launch(x, weight, eps, out)


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """RMSNorm over x's last dim with the Triton kernel; see the module docstring.

    Returns a new contiguous tensor of x's shape and dtype, or writes into ``out`` (a
    contiguous tensor of x's shape, dtype and device) and returns it. Raises
    TypeError/ValueError naming the argument for unsupported input.
    """
    ops = torch.ops.triton_impl
    return call_op(
        ops.rms_norm, ops.rms_norm_out, x, weight, eps, out, impl=_IMPL, allow_cpu=INTERPRET
    )


def rms_norm_with_config(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, cfg: dict
) -> torch.Tensor:
    """rms_norm with a forced launch config (launch_config's form), for sweeps; same result.

    cfg: kernel "fused" (BLOCK_M rows of BLOCK_N >= N lanes a program), "split" (one row a
    program, BLOCK_N >= N, aligned body with scalar head and tail; needs x and y rows of
    equal 16-byte alignment) or "chunked" (one row a program, BLOCK_N-wide chunks), and
    num_warps.
    """
    check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=_IMPL)
    n = x.shape[-1]
    if cfg["kernel"] in ("fused", "split") and cfg["BLOCK_N"] < n:
        raise ValueError(f"cfg: BLOCK_N = {cfg['BLOCK_N']} is narrower than the row (N = {n})")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, weight, float(eps), y, cfg)
    return y


class RMSNorm(RMSNormModule):
    """torch.nn.RMSNorm drop-in (1-D normalized_shape) running the Triton kernel."""

    _fn = staticmethod(rms_norm)
