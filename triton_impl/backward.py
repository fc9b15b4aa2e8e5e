"""The Triton backward of both ops, and their autograd.

For y = s * rstd * w, rstd = 1 / sqrt(mean(s^2) + eps), with s = x (rms_norm) or
s = residual_out (the fused add), and the output gradient dy:

    g      = dy * w                                  (dy without a weight)
    ds     = rstd * (g - s * rstd^2 * mean(g * s))
    dw     = sum over rows of dy * s * rstd

The fused add's s also reaches residual_out, so its gradient (d_residual_out) adds to ds,
and the sum passes it to x and residual alike: dx = ds in x's dtype, dresidual = ds in
residual's.

Parallelisation
- main kernel: a few programs an SM (BWD_WARPS_PER_SM warps of them), each
  walking rows pid, pid + programs, ... A row that fits BWD_MAX_N is held in registers:
  s and dy read once, both row sums (s^2, g*s) taken together, ds stored. rstd is recomputed
  from s, not saved by the forward: s is read anyway, so it costs no bytes, and the forward
  saves nothing but references to its inputs. Each program keeps its rows' dweight
  contributions in registers (a thread holds the same columns for every row) and writes
  them once, as one fp32 row of a partials buffer.
- wider rows: the row in BWD_CHUNK chunks, twice: sweep 1 takes both sums, sweep 2 re-reads
  the chunks (from L2: the rows in flight fit in it), stores ds and adds the row's dweight
  chunk to the program's partials row in memory (its own row: no other program touches it).
- dweight: a second kernel sums the partials rows over programs in a fixed order (tiles of
  rows in flight at once, each column's sum in one order). No atomics, so dweight is
  bitwise identical from run to run.

Precision: all math in fp32 on upcast inputs; each output cast once at its store.
Learned from: the Triton tutorial on layer norm (its backward's partial dweight buffer),
Liger Kernel's rms_norm backward (rows per program, dweight partials per SM), QuACK's
rmsnorm backward (partials per CTA, a fixed-order final reduction).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from rmsnorm_api import as_rows, call_backward, check_backward_inputs
from triton_impl.kernels import INTERPRET
from triton_impl.launch import sm_count

#: Widest power-of-two row a program keeps in registers; wider rows go in BWD_CHUNK chunks.
BWD_MAX_N = 16384
BWD_CHUNK = 4096
#: fp32 elements of s and dy (each) a thread holds for the register-resident rows.
BWD_THREAD_ELEMS = 8
#: Warps of a program the register-resident rows aim at an SM, and the programs that makes.
BWD_WARPS_PER_SM = 32
#: The final reduction's tile: partial rows and dweight columns a program loads at once.
DW_BLOCK_P = 64
DW_BLOCK_N = 64


@triton.jit
def _load_row(s_row, dy_row, cc, ok, POLICY: tl.constexpr):
    # s and dy at columns cc, in fp32 (masked lanes 0)
    s = tl.load(s_row + cc, mask=ok, other=0.0, eviction_policy=POLICY).to(tl.float32)
    dy = tl.load(dy_row + cc, mask=ok, other=0.0, eviction_policy=POLICY).to(tl.float32)
    return s, dy


@triton.jit
def _store_ds(
    ds, row, cc, ok, dro_ptr, stride_dro, ds_row, ds2_ptr, stride_ds2,
    HAS_DRO: tl.constexpr, HAS_DS2: tl.constexpr,
):  # fmt: skip
    # d_residual_out's own gradient added, then ds stored once in each output's dtype
    if HAS_DRO:
        ds += tl.load(dro_ptr + row * stride_dro + cc, mask=ok, other=0.0).to(tl.float32)
    tl.store(ds_row + cc, ds.to(ds_row.dtype.element_ty), mask=ok)
    if HAS_DS2:
        tl.store(ds2_ptr + row * stride_ds2 + cc, ds.to(ds2_ptr.dtype.element_ty), mask=ok)


# fmt: off
@triton.jit
def _rms_norm_bwd(
    s_ptr, dy_ptr, w_ptr, dro_ptr,  # s rows, dy rows, weight or a dummy, d_residual_out or a dummy
    ds_ptr, ds2_ptr, dwp_ptr,  # ds rows, a second copy (the fused add's dresidual) or a dummy,
                               # dweight partials (programs x N, fp32)
    stride_s, stride_dy, stride_dro, stride_ds, stride_ds2,  # elements between rows
    M, N, eps,  # rows, true row width, eps (fp32)
    BLOCK_N: tl.constexpr, CHUNKED: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_DRO: tl.constexpr, HAS_DS2: tl.constexpr,
):
    # fmt: on
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    eps = tl.cast(eps, tl.float32)  # torch.compile passes it as fp64
    dwp_row = dwp_ptr + pid.to(tl.int64) * N
    if not CHUNKED:
        col_ok = cols < N
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for row in range(pid.to(tl.int64), M, tl.num_programs(0)):
        s_row = s_ptr + row * stride_s
        dy_row = dy_ptr + row * stride_dy
        ds_row = ds_ptr + row * stride_ds
        if not CHUNKED:
            # the row in registers: load, both sums, ds, dweight's share
            s, dy = _load_row(s_row, dy_row, cols, col_ok, "")
            g = dy * w if HAS_WEIGHT else dy
            rstd = tl.rsqrt(tl.sum(s * s, axis=0) / N + eps)
            c = tl.sum(g * s, axis=0) / N * rstd * rstd
            _store_ds((g - s * c) * rstd, row, cols, col_ok, dro_ptr, stride_dro, ds_row,
                      ds2_ptr, stride_ds2, HAS_DRO, HAS_DS2)  # fmt: skip
            if HAS_WEIGHT:
                dw += dy * s * rstd
        else:
            # sweep 1: both sums over the row's chunks
            ss = tl.zeros([BLOCK_N], dtype=tl.float32)
            gs = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                cc = start + cols
                ok = cc < N
                s, g = _load_row(s_row, dy_row, cc, ok, "evict_last")
                if HAS_WEIGHT:
                    g = g * tl.load(w_ptr + cc, mask=ok, other=0.0).to(tl.float32)
                ss += s * s
                gs += g * s
            rstd = tl.rsqrt(tl.sum(ss, axis=0) / N + eps)
            c = tl.sum(gs, axis=0) / N * rstd * rstd
            # sweep 2: re-read (L2-resident), ds, dweight's share into the partials row
            for start in range(0, N, BLOCK_N):
                cc = start + cols
                ok = cc < N
                s, dy = _load_row(s_row, dy_row, cc, ok, "evict_first")
                g = dy
                if HAS_WEIGHT:
                    g = dy * tl.load(w_ptr + cc, mask=ok, other=0.0).to(tl.float32)
                _store_ds((g - s * c) * rstd, row, cc, ok, dro_ptr, stride_dro, ds_row,
                          ds2_ptr, stride_ds2, HAS_DRO, HAS_DS2)  # fmt: skip
                if HAS_WEIGHT:
                    # the same thread holds these columns for every row of this program
                    part = tl.load(dwp_row + cc, mask=ok, other=0.0)
                    tl.store(dwp_row + cc, part + dy * s * rstd, mask=ok)
    if HAS_WEIGHT and not CHUNKED:
        tl.store(dwp_row + cols, dw, mask=col_ok)


@triton.jit
def _dw_reduce(
    dwp_ptr, dw_ptr,  # partials (programs x N, fp32), dweight (N,)
    P, N,  # partial rows, row width
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # one program a block of columns: BLOCK_P partial rows loaded at once (many loads in
    # flight, not P dependent ones), each lane summing its rows in order, then the tile's
    # rows summed in a fixed tree: the same order every run, so dweight is deterministic
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    rows = tl.arange(0, BLOCK_P)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + rows
        m = (p < P)[:, None] & ok[None, :]
        acc += tl.load(dwp_ptr + p[:, None].to(tl.int64) * N + cols[None, :], mask=m, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty), mask=ok)


# ---- the launch -----------------------------------------------------------------------
def bwd_config(n: int) -> tuple[int, bool, int]:
    """(block_n, chunked, num_warps) of the main kernel for rows of n elements."""
    block_n = triton.next_power_of_2(n)
    if block_n > BWD_MAX_N:
        return BWD_CHUNK, True, 16
    return block_n, False, max(1, min(16, block_n // (32 * BWD_THREAD_ELEMS)))


def _run_backward(
    dy: torch.Tensor,
    s: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    d_residual_out: Optional[torch.Tensor],
    ds: torch.Tensor,
    ds2: Optional[torch.Tensor],
) -> Optional[torch.Tensor]:
    """ds (and ds2) for the rows of s; returns dweight (None without a weight)."""
    n = int(s.shape[-1])
    s2, dy2, ds_2 = as_rows(s), as_rows(dy), ds.view(-1, n)
    m = s2.shape[0]
    block_n, chunked, warps = bwd_config(n)
    if s.is_cuda:
        per_sm = max(1, BWD_WARPS_PER_SM // warps)
        programs = max(1, min(m, per_sm * sm_count(s.device.index)))
    else:  # the interpreter: two programs, so the partials reduction still sums several
        programs = max(1, min(m, 2))
    has_w = weight is not None
    w = weight.contiguous() if has_w else s2  # dummy pointer, never read
    dro = as_rows(d_residual_out) if d_residual_out is not None else s2
    ds2_2 = ds2.view(-1, n) if ds2 is not None else ds_2
    # chunked rows add into their partials row, so it starts at zero
    alloc = torch.zeros if chunked else torch.empty
    dwp = alloc((programs if has_w else 1, n), dtype=torch.float32, device=s.device)
    if m > 0:
        wrap_triton(_rms_norm_bwd)[(programs,)](
            s2, dy2, w, dro, ds_2, ds2_2, dwp,
            s2.stride(0), dy2.stride(0), dro.stride(0), ds_2.stride(0), ds2_2.stride(0),
            m, n, eps,
            BLOCK_N=block_n, CHUNKED=chunked, HAS_WEIGHT=has_w,
            HAS_DRO=d_residual_out is not None, HAS_DS2=ds2 is not None, num_warps=warps,
        )  # fmt: skip
    if not has_w:
        return None
    dw = torch.empty(n, dtype=weight.dtype, device=s.device)
    if m == 0:
        dw.zero_()
        return dw
    wrap_triton(_dw_reduce)[(triton.cdiv(n, DW_BLOCK_N),)](
        dwp, dw, programs, n, BLOCK_P=DW_BLOCK_P, BLOCK_N=DW_BLOCK_N, num_warps=4
    )
    return dw


def _dy_rows(dy: torch.Tensor) -> torch.Tensor:
    """dy as the kernel reads it: any row stride in place; a last dimension that is not
    contiguous (autograd's expanded gradients, a transposed dy) is copied once."""
    return dy if dy.stride(-1) == 1 or dy.numel() == 0 else dy.contiguous()


_BWD = "triton_impl.rms_norm_backward"
_FUSED_BWD = "triton_impl.fused_add_rms_norm_backward"


@triton_op("triton_impl::rms_norm_backward", mutates_args=())
def _rms_norm_backward_op(
    dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    check_backward_inputs(dy, x, weight, eps, allow_cpu=INTERPRET, impl=_BWD)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = _run_backward(_dy_rows(dy), x, weight, eps, None, dx, None)
    return dx, dw if dw is not None else x.new_empty(0)


@triton_op("triton_impl::fused_add_rms_norm_backward", mutates_args=())
def _fused_add_backward_op(
    dy: torch.Tensor,
    d_residual_out: Optional[torch.Tensor],
    residual_out: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_backward_inputs(dy, residual_out, weight, eps, d_residual_out, fused=True,
                          allow_cpu=INTERPRET, impl=_FUSED_BWD)  # fmt: skip
    s = residual_out
    # dresidual equals dx but for its dtype; both are stored (two tensors that never alias)
    dx = torch.empty(s.shape, dtype=dy.dtype, device=s.device)
    dres = torch.empty(s.shape, dtype=s.dtype, device=s.device)
    dro = _dy_rows(d_residual_out) if d_residual_out is not None else None
    dw = _run_backward(_dy_rows(dy), s, weight, eps, dro, dx, dres)
    return dx, dres, dw if dw is not None else s.new_empty(0)


def rms_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(dx, dweight) of rms_norm(x, weight, eps) for the output gradient dy (any strides);
    dweight in weight's dtype, None without a weight. Deterministic. Raises
    TypeError/ValueError naming the argument for unsupported input."""
    return call_backward("triton_impl", dy, x, weight, eps, impl=_BWD, allow_cpu=INTERPRET)


def fused_add_rms_norm_backward(
    dy: torch.Tensor,
    d_residual_out: Optional[torch.Tensor],
    residual_out: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(dx, dresidual, dweight) of the fused add from the gradients of y (dy, x's dtype) and
    of residual_out (None: zero), given the forward's residual_out. Deterministic."""
    return call_backward("triton_impl", dy, residual_out, weight, eps, d_residual_out,
                         fused=True, impl=_FUSED_BWD, allow_cpu=INTERPRET)  # fmt: skip
