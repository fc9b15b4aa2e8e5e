"""The Triton backward of both ops, and their autograd.

For y = s * rstd * w, rstd = 1 / sqrt(mean(s^2) + eps), with s = x (rms_norm) or
s = residual_out (the fused add), w the weight plus its offset (in fp32), and the output
gradient dy:

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
- split rows (a width or row stride not a multiple of 16 elements: the whole-row tile
  cannot be proven 16-byte aligned, so it moves every element alone): as the forward's
  split kernel, a row split at s's 16-byte boundaries into a scalar head, an aligned body
  (16-byte vectors) and a scalar tail. The programs are a multiple of VEC (a vector's
  elements), so all the rows a program walks are equally far from a boundary: one split
  holds for them all, and each lane keeps its column for the dweight sum.
- sharded rows (a power of two of BWD_SHARD_FROM_BYTES or more): a row split over a group
  of programs, BWD_SHARD_N columns each, that exchange the row's two sums through global
  memory (stored, one arrival counted, the full count acquired) as the forward's sharded
  kernels do. A group walks rows group, group + groups, ..., so each program keeps its
  columns' dweight share in registers over all of them and writes one partials row; the
  next row is loaded before the wait. Registers are capped (maxnreg) so that every
  program of the grid is resident at once.
- wider rows (a row of more shards than SMs): the row in BWD_CHUNK chunks, twice: sweep 1
  takes both sums, sweep 2 re-reads the chunks (from L2: the rows in flight fit in it),
  stores ds and adds the row's dweight chunk to the program's partials row in memory (its
  own row: no other program touches it).
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

from rmsnorm_api import (
    as_rows,
    backward_functions,
    check_backward_inputs,
    fused_backward_outputs,
    head_rows,
)
from triton_impl.kernels import INTERPRET, _split_at, _split_edges, _weight
from triton_impl.launch import has_work, heads_view, op, run, sm_count
from triton_impl.tuning import (
    BWD_CHUNK,
    BWD_MAX_N,
    BWD_MAX_WARPS,
    BWD_MAX_WARPS_N,
    BWD_PIPELINED,
    BWD_PIPELINED_MAX_N,
    BWD_SHARD_FROM_BYTES,
    BWD_SHARD_N,
    BWD_SHARD_THREAD_ELEMS,
    BWD_SHARD_WARPS_PER_SM,
    BWD_THREAD_ELEMS,
    BWD_WARPS_PER_SM,
    BWD_WEIGHT_EACH_ROW,
    BWD_WIDE_MAX_WARPS,
    DW_BLOCK_N,
    DW_MIN_BLOCK_N,
    DW_TILE,
)

#: 32-bit registers of an SM (sm_80 and sm_90 alike), shared by the programs resident on it.
SM_REGISTERS = 65536


@triton.jit
def _load_row(s_row, dy_row, cc, ok, POLICY: tl.constexpr):
    # s and dy at columns cc, in fp32 (masked lanes 0)
    s = tl.load(s_row + cc, mask=ok, other=0.0, eviction_policy=POLICY).to(tl.float32)
    dy = tl.load(dy_row + cc, mask=ok, other=0.0, eviction_policy=POLICY).to(tl.float32)
    return s, dy


@triton.jit
def _store_ds(ds, cc, ok, dro_row, ds_row, ds2_row, HAS_DRO: tl.constexpr, HAS_DS2: tl.constexpr):
    # d_residual_out's own gradient added, then ds stored once in each output's dtype
    if HAS_DRO:
        ds += tl.load(dro_row + cc, mask=ok, other=0.0).to(tl.float32)
    tl.store(ds_row + cc, ds.to(ds_row.dtype.element_ty), mask=ok)
    if HAS_DS2:
        tl.store(ds2_row + cc, ds.to(ds2_row.dtype.element_ty), mask=ok)


@triton.jit
def _sum2(a, b):
    # a row's two sums in one reduction, whose exchange between warps is one store of both,
    # one CTA barrier and one load (two tl.sum calls take a barrier pair each)
    return tl.split(tl.sum(tl.join(a, b), axis=0))


@triton.jit
def _body(row, head, ON16: tl.constexpr):
    # where a row's body starts; ON16: promised to the compiler to be a 16-byte boundary
    # (the launcher made sure), so the body's accesses can take 16-byte vectors. The hint
    # goes on the addition made here: one on an argument would not reach the compiler.
    if ON16:
        return tl.multiple_of(row + head, 16)
    else:
        return row + head


# fmt: off
@triton.jit
def _rms_norm_bwd(
    s_ptr, dy_ptr, w_ptr, dro_ptr,  # s rows, dy rows, weight or a dummy, d_residual_out or a dummy
    ds_ptr, ds2_ptr, dwp_ptr,  # ds rows, a second copy (the fused add's dresidual) or a dummy,
                               # dweight partials (programs x N, fp32)
    stride_s, stride_dy, stride_dro, stride_ds, stride_ds2,  # elements between rows (tokens)
    stride_sh, stride_dyh, stride_dsh,  # elements between heads (H > 1: rms_norm's)
    M, N, H, eps,  # rows (of each head), true row width, heads (1: rows), eps (fp32)
    BLOCK_N: tl.constexpr, CHUNKED: tl.constexpr, SPLIT: tl.constexpr, VEC: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr, HAS_DRO: tl.constexpr,
    HAS_DS2: tl.constexpr,
    STAGES: tl.constexpr, W_ROW: tl.constexpr, W_HEADS: tl.constexpr,
):
    # fmt: on
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    eps = tl.cast(eps, tl.float32)  # torch.compile passes it as fp64
    dwp_row = dwp_ptr + pid.to(tl.int64) * N
    # heads (T, H, N): the programs are a multiple of H, so all of a program's rows are of
    # one head, hd, at tokens first, first + step, ...; its partials row is that head's
    # (H = 1, as Triton specialises it, folds this away: rows pid, pid + programs, ...)
    hd = (pid % H).to(tl.int64)  # its products with the head strides pass 2^31
    first = (pid // H).to(tl.int64)
    step = tl.num_programs(0) // H
    s_ptr += hd * stride_sh
    dy_ptr += hd * stride_dyh
    ds_ptr += hd * stride_dsh
    if W_HEADS:
        w_ptr += hd * N  # a weight row a head, (H, N)
    if not CHUNKED:
        # a lane holds the same column on every row of the program (head + lane in the body,
        # e_col in the edges), so the rows' dweight shares add up in registers
        if SPLIT:
            # rows split at s's 16-byte boundaries (VEC elements): a scalar head, an aligned
            # body, a scalar tail (the edges, 2 VEC lanes). The launcher runs a multiple of
            # H x VEC programs (or one a row) and gives every row tensor s's element size and
            # phase, so each row of a program is as far from a boundary as its first, in
            # all of them: one split, from the first row's address, holds for every row.
            head, nbody = _split_at(s_ptr + first * stride_s, N, VEC)
            e_col, e_ok = _split_edges(head, nbody, N, VEC)
            dwe = tl.zeros([2 * VEC], dtype=tl.float32)
            if HAS_WEIGHT:
                we = _weight(tl.load(w_ptr + e_col, mask=e_ok, other=0.0), W_OFFSET)
        else:
            head = 0
            nbody = N
        body = cols < nbody
        if HAS_WEIGHT and not W_ROW:
            wb = _weight(tl.load(w_ptr + head + cols, mask=body, other=0.0), W_OFFSET)
        dwb = tl.zeros([BLOCK_N], dtype=tl.float32)
        # STAGES > 1: Triton's pipeliner issues the next rows' loads while this one is reduced
        for row in tl.range(first, M, step, num_stages=STAGES):
            s_row = s_ptr + row * stride_s
            dy_row = dy_ptr + row * stride_dy
            dro_row = dro_ptr + row * stride_dro
            ds_row = ds_ptr + row * stride_ds
            ds2_row = ds2_ptr + row * stride_ds2
            # the row in registers: load, both sums (s^2, g*s), ds, dweight's share; the edge
            # elements' loads first (CUDA's odd rows: issued after the body's, they held the
            # row's sums back)
            if SPLIT:
                se, dye = _load_row(s_row, dy_row, e_col, e_ok, "")
            sb, dyb = _load_row(_body(s_row, head, SPLIT), _body(dy_row, head, SPLIT), cols,
                                body, "")  # fmt: skip
            if HAS_WEIGHT and W_ROW:
                # W_ROW: the weight loaded (from L1 / L2) for the sum and again for ds, so
                # it holds no registers across the row's reduction (the second load is
                # volatile: the compiler would merge the two and keep the weight live)
                wb = _weight(tl.load(w_ptr + head + cols, mask=body, other=0.0), W_OFFSET)
            gb = dyb * wb if HAS_WEIGHT else dyb
            ss, gs = _sum2(sb * sb, gb * sb)
            if SPLIT:
                ge = dye * we if HAS_WEIGHT else dye
                sse, gse = _sum2(se * se, ge * se)
                ss += sse
                gs += gse
            rstd = tl.rsqrt(ss / N + eps)
            c = gs / N * rstd * rstd
            if HAS_WEIGHT and W_ROW:
                wb = tl.load(w_ptr + head + cols, mask=body, other=0.0, volatile=True)
                gb = dyb * _weight(wb, W_OFFSET)
            _store_ds((gb - sb * c) * rstd, cols, body, _body(dro_row, head, SPLIT),
                      _body(ds_row, head, SPLIT), _body(ds2_row, head, SPLIT), HAS_DRO,
                      HAS_DS2)  # fmt: skip
            if HAS_WEIGHT:
                dwb += dyb * sb * rstd
            if SPLIT:
                _store_ds((ge - se * c) * rstd, e_col, e_ok, dro_row, ds_row, ds2_row, HAS_DRO,
                          HAS_DS2)  # fmt: skip
                if HAS_WEIGHT:
                    dwe += dye * se * rstd
        if HAS_WEIGHT:
            # the program's dweight shares, one fp32 partials row
            tl.store(dwp_row + head + cols, dwb, mask=body)
            if SPLIT:
                tl.store(dwp_row + e_col, dwe, mask=e_ok)
    else:
        for row in range(first, M, step):
            s_row = s_ptr + row * stride_s
            dy_row = dy_ptr + row * stride_dy
            dro_row = dro_ptr + row * stride_dro
            ds_row = ds_ptr + row * stride_ds
            ds2_row = ds2_ptr + row * stride_ds2
            # sweep 1: both sums over the row's chunks
            ss = tl.zeros([BLOCK_N], dtype=tl.float32)
            gs = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                cc = start + cols
                ok = cc < N
                s, g = _load_row(s_row, dy_row, cc, ok, "evict_last")
                if HAS_WEIGHT:
                    g = g * _weight(tl.load(w_ptr + cc, mask=ok, other=0.0), W_OFFSET)
                ss += s * s
                gs += g * s
            ss, gs = _sum2(ss, gs)
            rstd = tl.rsqrt(ss / N + eps)
            c = gs / N * rstd * rstd
            # sweep 2: re-read (L2-resident), ds, dweight's share into the partials row
            for start in range(0, N, BLOCK_N):
                cc = start + cols
                ok = cc < N
                s, dy = _load_row(s_row, dy_row, cc, ok, "evict_first")
                g = dy
                if HAS_WEIGHT:
                    g = dy * _weight(tl.load(w_ptr + cc, mask=ok, other=0.0), W_OFFSET)
                _store_ds((g - s * c) * rstd, cc, ok, dro_row, ds_row, ds2_row, HAS_DRO,
                          HAS_DS2)  # fmt: skip
                if HAS_WEIGHT:
                    # the same thread holds these columns for every row of this program
                    part = tl.load(dwp_row + cc, mask=ok, other=0.0)
                    tl.store(dwp_row + cc, part + dy * s * rstd, mask=ok)


# fmt: off
@triton.jit
def _rms_norm_bwd_sharded(
    s_ptr, dy_ptr, w_ptr, dro_ptr, ds_ptr, ds2_ptr, dwp_ptr,  # as _rms_norm_bwd; dwp: groups x N
    part_ptr, count_ptr,  # fp32 row sums (M, 2, SHARDS); arrivals a row (M,), zeroed
    stride_s, stride_dy, stride_dro, stride_ds, stride_ds2,
    M, N, eps,
    BLOCK_N: tl.constexpr, SHARDS: tl.constexpr, SHARDS_P2: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr, HAS_DRO: tl.constexpr,
    HAS_DS2: tl.constexpr,
):
    # fmt: on
    # A group of SHARDS programs walks rows group, group + groups, ...; each holds BLOCK_N
    # columns of every row it meets, so its dweight share stays in registers over all the
    # group's rows. The row's two sums are exchanged through global memory (the forward's
    # sharded kernels' scheme: shard sums stored, one arrival counted, the full count
    # acquired); the next row's shard is loaded before the wait, so HBM stays busy while
    # the group's other programs arrive.
    pid = tl.program_id(0)
    group = pid // SHARDS
    shard = pid % SHARDS
    groups = tl.num_programs(0) // SHARDS
    eps = tl.cast(eps, tl.float32)  # torch.compile passes it as fp64
    cols = shard * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    k = tl.arange(0, SHARDS_P2)
    if HAS_WEIGHT:
        w = _weight(tl.load(w_ptr + cols, mask=ok, other=0.0), W_OFFSET)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    first = group.to(tl.int64)
    s, dy = _load_row(s_ptr + first * stride_s, dy_ptr + first * stride_dy, cols, ok & (first < M),
                      "")  # fmt: skip
    for row in range(group.to(tl.int64), M, groups):
        g = dy * w if HAS_WEIGHT else dy
        parts = part_ptr + row * 2 * SHARDS
        ss, gs = _sum2(s * s, g * s)
        tl.store(parts + shard, ss)
        tl.store(parts + SHARDS + shard, gs)
        nxt = row + groups
        arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu") + 1
        s_next, dy_next = _load_row(s_ptr + nxt * stride_s, dy_ptr + nxt * stride_dy, cols,
                                    ok & (nxt < M), "")  # fmt: skip
        while arrived < SHARDS:
            arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire", scope="gpu")
        # summed in shard order: the same bits on every run and in every shard
        mine = k < SHARDS
        ss, gs = _sum2(tl.load(parts + k, mask=mine, other=0.0, cache_modifier=".cg"),
                       tl.load(parts + SHARDS + k, mask=mine, other=0.0, cache_modifier=".cg"))
        rstd = tl.rsqrt(ss / N + eps)
        c = gs / N * rstd * rstd
        ds_row = ds_ptr + row * stride_ds
        _store_ds((g - s * c) * rstd, cols, ok, dro_ptr + row * stride_dro, ds_row,
                  ds2_ptr + row * stride_ds2, HAS_DRO, HAS_DS2)  # fmt: skip
        if HAS_WEIGHT:
            dw += dy * s * rstd
        s, dy = s_next, dy_next
    if HAS_WEIGHT:
        tl.store(dwp_ptr + group.to(tl.int64) * N + cols, dw, mask=ok)


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
def bwd_config(n: int, split_vec: int = 0) -> tuple[int, bool, int]:
    """(block_n, chunked, num_warps) of the main kernel for rows of n elements; split_vec:
    the split variant's VEC, its tile the aligned body (whole vectors of VEC elements)."""
    if triton.next_power_of_2(n) > BWD_MAX_N:
        return BWD_CHUNK, True, 16
    block_n = triton.next_power_of_2(n // split_vec * split_vec if split_vec else n)
    most = BWD_MAX_WARPS if block_n <= BWD_MAX_WARPS_N else BWD_WIDE_MAX_WARPS
    return block_n, False, max(1, min(most, block_n // (32 * BWD_THREAD_ELEMS)))


def split_vec(n: int, s2: torch.Tensor, *others: torch.Tensor) -> int:
    """VEC (elements of a 16-byte vector) of the split variant for the rows s2 and the
    kernel's other row tensors (dy, ds; the fused add's d_residual_out and ds2), or 0 for
    the whole-row tile. Rows (M, N), or heads (T, H, N) whose every head and token steps
    alike in them all.

    Split: register-resident rows at least a vector wide that the whole-row tile would move
    one element at a time (Triton proves 16-byte alignment only where the width and the row
    strides are multiples of 16 elements and the rows start on 16-byte boundaries), when
    every tensor has s's element size and each row is as far from a 16-byte boundary in all
    of them. The kernel takes that on trust (its body accesses are 16-byte vectors), so it
    is judged from the data pointers; while traced there are none, and storage offsets
    stand in for them (allocations are 16-byte aligned, as launch.split_ok takes them)."""
    elem = s2.element_size()
    vec = 16 // elem
    if triton.next_power_of_2(n) > BWD_MAX_N or n < vec:
        return 0

    def phase(t: torch.Tensor) -> tuple[int, ...]:
        # bytes past a 16-byte boundary: of the first row, and added by each row (and head)
        traced = type(t) is not torch.Tensor  # FakeTensor, functional wrappers
        first = t.storage_offset() * t.element_size() if traced else t.data_ptr()
        return first % 16, *(st * t.element_size() % 16 for st in t.stride()[:-1])

    rows = (s2, *others)
    # Triton marks a stride aligned where it is a multiple of 16 elements (not bytes)
    if n % 16 == 0 and all(
        phase(t)[0] == 0 and all(st % 16 == 0 for st in t.stride()[:-1]) for t in rows
    ):
        return 0  # the whole-row tile takes 16-byte vectors already
    same = all(t.element_size() == elem and phase(t) == phase(s2) for t in others)
    return vec if same else 0


def bwd_meta(
    n: int,
    element_size: int,
    vec: int,
    has_weight: bool,
    has_dro: bool = False,
    has_ds2: bool = False,
    weight_offset: float = 0.0,
    w_heads: bool = False,
) -> dict:
    """The main kernel's compile-time arguments (constexprs, num_warps, maxnreg) for rows of n
    elements of element_size bytes; vec: split_vec's answer; w_heads: a weight row a head.
    Shared by the launcher and scripts/triton_ptx.py, so what is compiled there is what runs.

    maxnreg: the split variant with BWD_THREAD_ELEMS elements a thread (or fewer) is held
    to the registers that let the programs_per_sm programs an SM is given be resident
    together, which ptxas, left alone, overshoots for the edges' few values; wider tiles
    would spill under that cap, and the whole-row tile stays as ptxas builds it."""
    block_n, chunked, warps = bwd_config(n, vec)
    meta = dict(BLOCK_N=block_n, CHUNKED=chunked, SPLIT=vec > 0, VEC=vec or 16 // element_size,
                HAS_WEIGHT=has_weight, W_OFFSET=float(weight_offset), HAS_DRO=has_dro,
                HAS_DS2=has_ds2, W_HEADS=w_heads, num_warps=warps,
                STAGES=bwd_stages(block_n, chunked, element_size, vec,
                                  has_dro or has_ds2))  # fmt: skip
    # a register-resident tile wider than its threads hold: the weight loaded each row
    wide = not chunked and block_n > 32 * warps * BWD_THREAD_ELEMS
    meta["W_ROW"] = bool(BWD_WEIGHT_EACH_ROW) and wide
    if vec and not wide:
        meta["maxnreg"] = SM_REGISTERS // (32 * warps * programs_per_sm(warps))
    return meta


def bwd_stages(block_n: int, chunked: bool, element_size: int, vec: int, fused: bool) -> int:
    """Pipeline stages of the main kernel's row loop.

    3 for 16-bit register-resident tiles up to BWD_PIPELINED_MAX_N wide: a row of 16-bit
    elements is too short to hide the next one's loads behind its reduction and store, and
    two rows ahead in shared memory keep the bytes in flight that DRAM needs. Not for fp32
    (the row is twice the bytes: 1 stage was as fast or faster), wider tiles (their two
    buffered rows cut the programs an SM holds), the chunked rows (they loop over chunks),
    nor the fused add's split rows (measured with d_residual_out, whose loads already fill
    the gap: 3 stages lost there; without it, unmeasured, the same rule). Figures in
    docs/notebook/05-the-backward.md (v16)."""
    pipelined = element_size == 2 and not chunked and block_n <= BWD_PIPELINED_MAX_N
    return BWD_PIPELINED if pipelined and not (vec and fused) else 1


def programs_per_sm(warps: int) -> int:
    """Programs of the main kernel an SM is given: BWD_WARPS_PER_SM warps of them."""
    return max(1, BWD_WARPS_PER_SM // warps)


def _run_backward(
    dy: torch.Tensor,
    s: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    d_residual_out: Optional[torch.Tensor],
    ds: torch.Tensor,
    ds2: Optional[torch.Tensor],
    weight_offset: float = 0.0,
    heads: bool = False,
) -> Optional[torch.Tensor]:
    """ds (and ds2) for the rows of s; returns dweight (None without a weight). The weight
    offset scales ds (g = dy * (w + offset)); dweight = sum(dy * s * rstd) has none.
    heads (rms_norm's): s, dy and ds as (T, H, N) heads, s's where they lie (heads_view),
    the weight a row or a row a head, dweight of its shape; rows wide enough for the
    sharded kernel go head by head (a weight row a head) or are copied into rows."""
    n = int(s.shape[-1])
    if heads:
        s2 = heads_view(s)
        dy2, ds_2 = dy.reshape(s2.shape), ds.view(s2.shape)
    else:
        s2, dy2, ds_2 = as_rows(s), as_rows(dy), ds.view(-1, n)
    dro = as_rows(d_residual_out) if d_residual_out is not None else None
    ds2_2 = ds2.view(-1, n) if ds2 is not None else None
    m, h = s2.shape[0], s2.shape[1] if heads else 1
    has_w = weight is not None
    w_heads = has_w and weight.dim() == 2
    if not has_work(s2):  # empty, meta or traced under the interpreter: nothing runs
        return torch.zeros(weight.shape, dtype=weight.dtype, device=s.device) if has_w else None
    has_dro, has_ds2 = dro is not None, ds2_2 is not None
    present = [t for t in (dro, ds2_2) if t is not None]
    w = weight.contiguous() if has_w else s2  # dummy pointer, never read
    # dummy pointers where there is no d_residual_out or second ds: never touched
    dro = s2 if dro is None else dro
    ds2_2 = ds_2 if ds2_2 is None else ds2_2
    rows = (s2, dy2, w, dro, ds_2, ds2_2)
    strides = tuple(t.stride(0) for t in (s2, dy2, dro, ds_2, ds2_2))  # the weight's: none
    head_strides = tuple(t.stride(1) if heads else 0 for t in (s2, dy2, ds_2))
    sms = sm_count(s.device.index) if s.is_cuda else 0
    sharded = shard_plan(n, s.element_size(), 0 if INTERPRET else sms)
    if sharded is not None and heads:
        if w_heads:
            return _head_by_head(dy2, s2, weight, eps, ds_2, weight_offset)
        return _run_backward(dy, s, weight, eps, None, ds, None, weight_offset)  # rows, copied
    if sharded is not None:
        return _run_sharded(sharded, sms, rows, strides, weight, eps, has_dro, has_ds2,
                            weight_offset)  # fmt: skip
    vec = split_vec(n, s2, dy2, ds_2, *present)
    meta = bwd_meta(n, s.element_size(), vec, has_w, has_dro, has_ds2, weight_offset, w_heads)
    rows_in_all = m * h
    if s.is_cuda:
        programs = max(1, min(rows_in_all, programs_per_sm(meta["num_warps"]) * sms))
    else:  # the interpreter: two programs a head, so dweight's reduction sums several
        programs = max(1, min(rows_in_all, 2 * h))
    # a multiple of H programs (each program's rows of one head), and with the split, of H x
    # VEC (rounded down, at least that many: the interpreter's become H x VEC), so that each
    # program's rows all share one split
    unit = h * (vec or 1)
    if programs < rows_in_all:
        programs = min(rows_in_all, max(unit, programs // unit * unit))
    # chunked rows add into their partials row, so it starts at zero
    alloc = torch.zeros if meta["CHUNKED"] else torch.empty
    dwp = alloc((programs if has_w else 1, n), dtype=torch.float32, device=s.device)
    run(
        _rms_norm_bwd, (programs,), *rows, dwp, *strides, *head_strides, m, n, h, eps, **meta,
    )  # fmt: skip
    if not has_w:
        return None
    if w_heads:  # program p's partials row is head p % H's: (P / H, H x N) summed over rows
        dw = _reduce_dw(dwp.view(programs // h, h * n), weight, programs // h, sms)
        return dw.view(weight.shape)
    return _reduce_dw(dwp, weight, programs, sms)


def _head_by_head(
    dy3: torch.Tensor,
    s3: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    ds3: torch.Tensor,
    weight_offset: float,
) -> torch.Tensor:
    """The backward of (T, H, N) heads with a weight row a head, one head at a time (each
    head's rows share one stride), for rows the one-launch form does not take (the sharded
    kernel's); dweight (H, N)."""
    parts = [
        _run_backward(dy3[:, h], s3[:, h], weight[h], eps, None, ds3[:, h], None, weight_offset)
        for h in range(s3.shape[1])
    ]
    return torch.stack(parts)


def shard_plan(n: int, element_size: int, sms: int) -> Optional[tuple[int, int, int]]:
    """(shards, block_n, num_warps) of the sharded kernel for rows of n elements of
    element_size bytes, or None: rows whose power of two holds BWD_SHARD_FROM_BYTES, in
    shards of at most BWD_SHARD_N columns (BWD_SHARD_THREAD_ELEMS a thread), when a row's
    shards fit on the GPU's sms at once (a waiting shard whose row's last one could not
    start would wait forever). sms = 0: the interpreter, whose programs run one after
    another: one shard a row, which never waits on another."""
    if triton.next_power_of_2(n) * element_size < BWD_SHARD_FROM_BYTES:
        return None
    shards = triton.cdiv(n, BWD_SHARD_N) if sms else 1
    if sms and shards > sms:
        return None
    block_n = triton.next_power_of_2(triton.cdiv(n, shards))
    return shards, block_n, max(1, min(16, block_n // (32 * BWD_SHARD_THREAD_ELEMS)))


def shard_programs_per_sm(warps: int) -> int:
    """Programs of the sharded kernel an SM is given: BWD_SHARD_WARPS_PER_SM warps of them,
    each held to the registers that let them all be resident (a group whose programs were
    not all resident would wait for the others' rows to finish)."""
    return max(1, BWD_SHARD_WARPS_PER_SM // warps)


def shard_meta(sharded: tuple[int, int, int], has_weight: bool, has_dro: bool = False,
               has_ds2: bool = False, weight_offset: float = 0.0) -> dict:  # fmt: skip
    """The sharded kernel's compile-time arguments for shard_plan's answer; shared by the
    launcher and scripts/triton_ptx.py, as bwd_meta is."""
    shards, block_n, warps = sharded
    return dict(BLOCK_N=block_n, SHARDS=shards, SHARDS_P2=triton.next_power_of_2(shards),
                HAS_WEIGHT=has_weight, W_OFFSET=float(weight_offset), HAS_DRO=has_dro,
                HAS_DS2=has_ds2, num_warps=warps,
                maxnreg=SM_REGISTERS // (32 * warps * shard_programs_per_sm(warps)))  # fmt: skip


def _run_sharded(
    sharded: tuple[int, int, int],
    sms: int,
    rows: tuple[torch.Tensor, ...],
    strides: tuple[int, ...],
    weight: Optional[torch.Tensor],
    eps: float,
    has_dro: bool,
    has_ds2: bool,
    weight_offset: float = 0.0,
) -> Optional[torch.Tensor]:
    """_run_backward's rows (s, dy, the weight, d_residual_out, ds, ds2, absent ones as
    dummy pointers) and their row strides (all but the weight's) through the sharded kernel
    (shard_plan's answer) on a GPU of sms SMs (0: the interpreter); returns dweight."""
    shards, block_n, warps = sharded
    s2 = rows[0]
    m, n = s2.shape
    has_w = weight is not None
    meta = shard_meta(sharded, has_w, has_dro, has_ds2, weight_offset)
    per_sm = shard_programs_per_sm(warps)
    if sms:
        groups = max(1, min(m, sms * per_sm // shards))
    else:
        groups = max(1, min(m, 2))  # the interpreter: dweight still sums several partials
    dwp = torch.empty((groups if has_w else 1, n), dtype=torch.float32, device=s2.device)
    part = torch.empty(m * 2 * shards, dtype=torch.float32, device=s2.device)
    count = torch.zeros(m, dtype=torch.int32, device=s2.device)
    run(
        _rms_norm_bwd_sharded, (groups * shards,), *rows, dwp, part, count, *strides, m, n, eps,
        **meta,
    )  # fmt: skip
    return _reduce_dw(dwp, weight, groups, sms) if has_w else None


def dw_block_n(n: int, sms: int) -> int:
    """The reduction's columns a program (tuning.DW_TILE's note); sms = 0: the widest."""
    block_n = DW_BLOCK_N
    while block_n > DW_MIN_BLOCK_N and triton.cdiv(n, block_n) < sms:
        block_n //= 2
    return block_n


def _reduce_dw(dwp: torch.Tensor, weight: torch.Tensor, programs: int, sms: int) -> torch.Tensor:
    """dweight: the partials rows summed in a fixed order (_dw_reduce)."""
    n = dwp.shape[1]
    dw = torch.empty(n, dtype=weight.dtype, device=dwp.device)
    block_n = dw_block_n(n, sms)
    grid = (triton.cdiv(n, block_n),)
    run(_dw_reduce, grid, dwp, dw, programs, n, BLOCK_P=DW_TILE // block_n, BLOCK_N=block_n,
        num_warps=4)  # fmt: skip
    return dw


def _dy_rows(dy: torch.Tensor) -> torch.Tensor:
    """dy as the kernel reads it: any row stride in place; a last dimension that is not
    contiguous (autograd's expanded gradients, a transposed dy) is copied once."""
    return dy if dy.stride(-1) == 1 or dy.numel() == 0 else dy.contiguous()


_BWD = "triton_impl.rms_norm_backward"
_FUSED_BWD = "triton_impl.fused_add_rms_norm_backward"


@op("triton_impl::rms_norm_backward", mutates_args=())
def _rms_norm_backward_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_backward_inputs(dy, x, weight, eps, None, weight_offset, allow_cpu=INTERPRET,
                          impl=_BWD)  # fmt: skip
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # heads (a weight row a head, or x's head rows where they lie): one launch of H x the
    # programs' rows, each program's of one head
    heads = x.numel() > 0 and (
        (weight is not None and weight.dim() == 2) or head_rows(x) is not None
    )
    dw = _run_backward(_dy_rows(dy), x, weight, eps, None, dx, None, weight_offset, heads)
    return dx, dw if dw is not None else x.new_empty(0)


@op("triton_impl::fused_add_rms_norm_backward", mutates_args=())
def _fused_add_backward_op(
    dy: torch.Tensor,
    d_residual_out: Optional[torch.Tensor],
    residual_out: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    dresidual: bool = True,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_backward_inputs(dy, residual_out, weight, eps, d_residual_out, weight_offset,
                          fused=True, allow_cpu=INTERPRET, impl=_FUSED_BWD)  # fmt: skip
    s = residual_out
    dx, dres = fused_backward_outputs(dy, s, dresidual)
    dro = _dy_rows(d_residual_out) if d_residual_out is not None else None
    dw = _run_backward(_dy_rows(dy), s, weight, eps, dro, dx, dres if dresidual else None,
                       weight_offset)  # fmt: skip
    return dx, dres, dw if dw is not None else s.new_empty(0)


rms_norm_backward, fused_add_rms_norm_backward = backward_functions(
    "triton_impl", allow_cpu=INTERPRET
)
