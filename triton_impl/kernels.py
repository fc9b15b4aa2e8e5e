"""The Triton kernels of the RMSNorm forward, y = x / sqrt(mean(x^2) + eps) * weight, and
of the fused residual add before it (residual_out = x + residual; y = RMSNorm(residual_out)).

Parallelisation
- fused (next_pow2(N) <= FUSED_MAX_N): one program owns a BLOCK_M x BLOCK_N tile, BLOCK_M
  whole rows (several rows for small N, one for large N). The tile is loaded once, kept in
  registers, reduced along the row, scaled and stored: x is read from memory exactly once.
  Decode-sized calls (W_FIRST) load the weight beside x rather than after the reduction.
- split (N not a multiple of 16 in 16-bit dtypes, of 4 in fp32): one program per row, the
  row split at x's 16-byte boundaries into a scalar head, an aligned body (a power-of-two
  tile of 16-byte vectors, alignment promised to the compiler) and a scalar tail, so odd N
  still gets 16-byte accesses.
- looped (rows of 8-64 KiB: the widths language models use): one program a row (or
  two), the row in BLOCK_N chunks swept twice, x read again in the second sweep (from L1
  or L2, where the first just put it) rather than held through the sum: few registers a
  thread, every warp an SM can hold in flight. The row width is a compile-time constant,
  so the sweeps unroll and whole chunks go unmasked (torch.compile's looped reduction,
  the kernel this form was read from).
- sharded (the widest rows; the fused add's rows past FUSED_MAX_N): a row split over
  consecutive programs of BLOCK_N columns, which share the row's sum through global
  memory, the software counterpart of a thread-block cluster: each loads its shard into
  registers once, stores its partial sum, waits for the row's count of arrivals, and
  normalises its shard, held through the wait or (RELOAD) read again from L2 after it;
  x is read from HBM exactly once. Under the interpreter, and for rows of more shards than
  SMs, the last program to arrive normalises the whole row instead, re-reading it from L2,
  and no program waits.
Lanes >= N are masked: they load 0, so they add nothing to the sum, and the sum is divided
by the true N, never by BLOCK_N. Row offsets are int64 so tensors above 2^31 elements index
correctly.

Precision policy (that of native F.rms_norm's fused CUDA path, see rmsnorm_api): x is
upcast to fp32, squares accumulate in fp32, rstd and the weight multiply are fp32, and the
result is cast once to x's dtype at the store. weight may be x's dtype or fp32.

Learned from: the Triton tutorial on layer norm (row-per-program, masked tails), Liger
Kernel's rms_norm (block size and warps from N), QuACK's rmsnorm (several rows per CTA for
small N, bytes in flight as the figure of merit), torch.compile's generated reduction (the
looped kernel).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

#: Whether Triton runs on CPU tensors through its interpreter (no GPU: tests and CI).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _weight(w, W_OFFSET: tl.constexpr):
    # a weight's elements in fp32, the offset added there (never in the weight's dtype,
    # where 1 + w rounds); a zero offset compiles to nothing
    w = w.to(tl.float32)
    if W_OFFSET != 0.0:
        w = w + W_OFFSET
    return w


# ---- the quantised output (fp8) ---------------------------------------------------------
# The epilogue of the fused and looped kernels, a constant of the compile (QUANT): 0 y in
# its own dtype; 1 quantised by the caller's scale (q_in, fp32); 2 by a scale a row, max|y|
# / Q_MAX, clamped above by the caller's bound where Q_UB (q_in) and below by 1 / (Q_MAX *
# 512) (a row of zeros divides by a finite scale; vLLM's floor); 3 by a scale a group of
# GROUP columns, likewise. Scales are stored fp32 at q_out, stride_q elements between rows;
# y / s is saturated to +-Q_MAX and rounded to nearest even in y's fp8 dtype.


@triton.jit
def _fp8(v, dtype: tl.constexpr, Q_MANT: tl.constexpr, Q_TINY: tl.constexpr,
         BY_HAND: tl.constexpr):  # fmt: skip
    # v (fp32, saturated) to nearest even in the fp8 dtype. The GPU's cast does that;
    # Triton's interpreter does not, so there (BY_HAND) v is first rounded to the format's
    # grid here: normal values by their bits (Q_MANT mantissa bits kept, ties to even),
    # subnormal ones (below Q_TINY, the smallest normal) by an fp32 add whose ulp is the
    # subnormal step; the cast of a value on the grid is exact
    if BY_HAND:
        DROP: tl.constexpr = 23 - Q_MANT
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + ((1 << (DROP - 1)) - 1) + ((bits >> DROP) & 1)) >> DROP << DROP
        BIG: tl.constexpr = Q_TINY * 1.5 * (1 << DROP)
        sub = (v + BIG) - BIG
        v = tl.where(tl.abs(v) < Q_TINY, sub, bits.to(tl.float32, bitcast=True))
        # and NaN as the format's NaN (0x7f in both), which that cast also mistakes
        nan = tl.full(v.shape, 0x7F, tl.uint8).to(dtype, bitcast=True)
        return tl.where(v != v, nan, v.to(dtype))
    return v.to(dtype, fp_downcast_rounding="rtne")


@triton.jit
def _quantised(y, inv, dtype: tl.constexpr, Q_MAX: tl.constexpr, Q_MANT: tl.constexpr,
               Q_TINY: tl.constexpr, BY_HAND: tl.constexpr):  # fmt: skip
    # NaN stays NaN (the fp8 NaN), never a saturated value that would hide it
    v = tl.clamp(y * inv, -Q_MAX, Q_MAX, propagate_nan=tl.PropagateNan.ALL)
    return _fp8(v, dtype, Q_MANT, Q_TINY, BY_HAND)


@triton.jit
def _amax(y, AXIS: tl.constexpr, KEEP: tl.constexpr):
    # max|y| along AXIS, NaN where any element is (the reference's torch.amax): the max
    # reduction itself may drop NaN
    m = tl.max(tl.abs(y), axis=AXIS, keep_dims=KEEP)
    nan = tl.max((y != y).to(tl.int32), axis=AXIS, keep_dims=KEEP)
    return tl.where(nan > 0, float("nan"), m)


@triton.jit
def _scale_of(amax, q_in, Q_MAX: tl.constexpr, Q_UB: tl.constexpr):
    # a dynamic scale from its rows' (groups') max|y|, and its inverse (both rounded once)
    if Q_UB:
        amax = tl.minimum(amax, tl.load(q_in).to(tl.float32), propagate_nan=tl.PropagateNan.ALL)
    least = 1.0 / (Q_MAX * 512.0)
    s = tl.maximum(tl.math.div_rn(amax, Q_MAX), least, propagate_nan=tl.PropagateNan.ALL)
    return s, tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)


@triton.jit
def _store_y(ptrs, y, mask, rows, row_ok, q_in, q_out, stride_q, N,
             QUANT: tl.constexpr, GROUP: tl.constexpr, Q_MAX: tl.constexpr,
             Q_MANT: tl.constexpr, Q_TINY: tl.constexpr, Q_UB: tl.constexpr,
             Q_BY_HAND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             COL0=0):  # fmt: skip
    # a (BLOCK_M, BLOCK_N) tile of y (fp32), of rows `rows` (row_ok: (BLOCK_M, 1)) from
    # column COL0, stored in y's dtype, quantised by QUANT with its scales
    if QUANT == 0:
        tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=mask)
    elif QUANT == 1:
        inv = tl.math.div_rn(tl.full([1, 1], 1.0, tl.float32), tl.load(q_in).to(tl.float32))
        tl.store(
            ptrs,
            _quantised(y, inv, ptrs.dtype.element_ty, Q_MAX, Q_MANT, Q_TINY, Q_BY_HAND),
            mask=mask,
        )
    elif QUANT == 2:
        s, inv = _scale_of(_amax(y, 1, True), q_in, Q_MAX, Q_UB)
        tl.store(q_out + rows[:, None] * stride_q, s, mask=row_ok)
        tl.store(
            ptrs,
            _quantised(y, inv, ptrs.dtype.element_ty, Q_MAX, Q_MANT, Q_TINY, Q_BY_HAND),
            mask=mask,
        )
    else:
        yg = tl.reshape(y, (BLOCK_M, BLOCK_N // GROUP, GROUP))
        s, inv = _scale_of(_amax(yg, 2, False), q_in, Q_MAX, False)
        g = COL0 // GROUP + tl.arange(0, BLOCK_N // GROUP)[None, :]
        tl.store(q_out + rows[:, None] * stride_q + g, s, mask=row_ok & (g < N // GROUP))
        q = _quantised(yg, inv[:, :, None], ptrs.dtype.element_ty, Q_MAX, Q_MANT, Q_TINY, Q_BY_HAND)
        tl.store(ptrs, tl.reshape(q, (BLOCK_M, BLOCK_N)), mask=mask)


# fmt: off
@triton.jit
def _rms_norm_fwd_fused(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    stride_x, stride_y,  # elements between consecutive rows
    M, N, eps,  # rows, true row width, eps (fp32)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    W_OFFSET: tl.constexpr,  # added to each weight element in fp32 (Gemma's 1 + w: 1.0)
    W_FIRST: tl.constexpr,  # the weight loaded beside x, before the reduction

    q_in=None, q_out=None, stride_q=None,  # the quantised output's (QUANT; _store_y)
    QUANT: tl.constexpr = 0, GROUP: tl.constexpr = 1, Q_MAX: tl.constexpr = 1.0,
    Q_MANT: tl.constexpr = 3, Q_TINY: tl.constexpr = 1.0, Q_UB: tl.constexpr = False,
    Q_BY_HAND: tl.constexpr = False,
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
    if HAS_WEIGHT and W_FIRST:  # decode: its L2 round trip overlaps x's, not follows the sum
        w = _weight(tl.load(w_ptr + cols, mask=col_ok, other=0.0), W_OFFSET)
    # accumulate in fp32, divide by the true width. eps is cast here (and in every kernel)
    # because torch.compile passes it as fp64, which would make rstd, and every product
    # with it, fp64
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + tl.cast(eps, tl.float32))
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        if not W_FIRST:  # many rows: the weight's registers stay free through the sum
            w = _weight(tl.load(w_ptr + cols, mask=col_ok, other=0.0), W_OFFSET)
        y = y * w[None, :]
    # one cast (or the quantisation), at the store
    _store_y(y_ptr + rows[:, None] * stride_y + cols[None, :], y, mask, rows, (rows < M)[:, None],
             q_in, q_out, stride_q, N,
             QUANT, GROUP, Q_MAX, Q_MANT, Q_TINY, Q_UB, Q_BY_HAND, BLOCK_M, BLOCK_N)  # fmt: skip


@triton.jit
def _head_weight(w_ptr, head, cols, col_ok, mask, N, W_OFFSET: tl.constexpr, W_HEADS: tl.constexpr):
    # the heads kernel's weight tile: one row for every head, or (W_HEADS) each row's head's
    # (one return: Triton 3.6 compares the shapes of every return, the pruned branch's too)
    if W_HEADS:
        w = tl.load(w_ptr + head[:, None] * N + cols[None, :], mask=mask, other=0.0)
    else:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)[None, :]
    return _weight(w, W_OFFSET)


# fmt: off
@triton.jit
def _rms_norm_fwd_heads(
    x_ptr, w_ptr, y_ptr,  # x (T, H, N), weight (N,) or (H, N) (W_HEADS) or a dummy, y
    stride_x, stride_xh, stride_y, stride_yh,  # elements between tokens, between heads
    M, N, H, eps,  # rows (T x H), true row width, heads, eps (fp32)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    W_OFFSET: tl.constexpr, W_FIRST: tl.constexpr,
    W_HEADS: tl.constexpr,  # a weight row a head: row r scaled by weight[r % H]
):
    # fmt: on
    # the fused kernel on rows that share no one stride: heads of a packed projection (QK
    # norm's q = qkv[:, :H*D].view(T, H, D), strides (3HD, D, 1)), row r at token r // H,
    # head r % H, read where they lie rather than copied into rows first (a copy reads and
    # writes x once more than the norm itself)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // H
    head = rows - tok * H
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows < M)[:, None] & col_ok[None, :]
    x_rows = x_ptr + (tok * stride_x + head * stride_xh)[:, None]
    x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_WEIGHT and W_FIRST:
        w = _head_weight(w_ptr, head, cols, col_ok, mask, N, W_OFFSET, W_HEADS)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + tl.cast(eps, tl.float32))
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        if not W_FIRST:
            w = _head_weight(w_ptr, head, cols, col_ok, mask, N, W_OFFSET, W_HEADS)
        y = y * w
    y_rows = y_ptr + (tok * stride_y + head * stride_yh)[:, None]
    tl.store(y_rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _looped_load(ptrs, mask, MASKED: tl.constexpr, POLICY: tl.constexpr):
    # a chunk of the looped kernels, masked only where the rows or the width need it
    if MASKED:
        return tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
    else:
        return tl.load(ptrs, eviction_policy=POLICY)


@triton.jit
def _looped_store(ptrs, v, mask, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptrs, v, mask=mask)
    else:
        tl.store(ptrs, v)


@triton.jit
def _looped_amax(amx, s, w_ptr, c, HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
                 N: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    # the first sweep's running max|s w| of a scale a row: rstd > 0, so the row's max|y| is
    # it times rstd, and the second sweep stores each chunk with the row's scale known
    if HAS_WEIGHT:
        s = s * _weight(_looped_load(w_ptr + c, c < N, N % BLOCK_N != 0, "evict_last"), W_OFFSET)
    return tl.maximum(amx, tl.abs(s), propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _looped_scale(
    s_rows, w_ptr, y_rows, acc, row_ok, cols, eps,
    N: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
    MASKED: tl.constexpr,
    rows, amx, q_in, q_out, stride_q,
    QUANT: tl.constexpr, GROUP: tl.constexpr, Q_MAX: tl.constexpr, Q_MANT: tl.constexpr,
    Q_TINY: tl.constexpr, Q_UB: tl.constexpr, Q_BY_HAND: tl.constexpr, BLOCK_M: tl.constexpr,
):
    # the looped kernels' second sweep: rstd from the first sweep's per-lane sums, the rows
    # s_rows (x, or the fused add's residual_out) read again, scaled and stored as y (or
    # quantised: a scale a row from the first sweep's max|s w| (amx), a group's chunk by
    # chunk)
    rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + tl.cast(eps, tl.float32))[:, None]
    if QUANT == 2:
        s, inv = _scale_of(_amax(amx, 1, True) * rstd, q_in, Q_MAX, Q_UB)
        tl.store(q_out + rows[:, None] * stride_q, s, mask=row_ok)
    for start in tl.range(0, N, BLOCK_N):
        c = start + cols
        ok = row_ok & (c < N)
        y = _looped_load(s_rows + c, ok, MASKED, "evict_first").to(tl.float32) * rstd
        if HAS_WEIGHT:
            w = _looped_load(w_ptr + c, c < N, N % BLOCK_N != 0, "evict_last")
            y = y * _weight(w, W_OFFSET)
        if QUANT == 0:
            _looped_store(y_rows + c, y.to(y_rows.dtype.element_ty), ok, MASKED)
        elif QUANT == 2:
            q = _quantised(y, inv, y_rows.dtype.element_ty, Q_MAX, Q_MANT, Q_TINY, Q_BY_HAND)
            _looped_store(y_rows + c, q, ok, MASKED)
        else:
            _store_y(y_rows + c, y, ok, rows, row_ok, q_in, q_out, stride_q, N,
                     QUANT, GROUP, Q_MAX, Q_MANT, Q_TINY, Q_UB, Q_BY_HAND,
                     BLOCK_M, BLOCK_N, start)  # fmt: skip


# fmt: off
@triton.jit
def _rms_norm_fwd_looped(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    stride_x, stride_y,  # elements between consecutive rows
    M, eps,  # rows, eps (fp32)
    N: tl.constexpr,  # the row width, a constant: one compile a width
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    W_OFFSET: tl.constexpr,

    q_in=None, q_out=None, stride_q=None,  # the quantised output's (QUANT; _store_y)
    QUANT: tl.constexpr = 0, GROUP: tl.constexpr = 1, Q_MAX: tl.constexpr = 1.0,
    Q_MANT: tl.constexpr = 3, Q_TINY: tl.constexpr = 1.0, Q_UB: tl.constexpr = False,
    Q_BY_HAND: tl.constexpr = False,
):
    # fmt: on
    # BLOCK_M rows a program in BLOCK_N chunks, swept twice: the first sums x^2 and lets x
    # go, the second reads x again (from L1 or L2, where the first sweep just put it,
    # evict_last), scales and stores chunk by chunk. Nothing of the row is held through the
    # sum, so a thread needs few registers and an SM holds as many warps as it can: the
    # form of torch.compile's looped reduction. N is a constant, so the sweeps unroll whole
    # and a width that is a whole number of chunks (with one row a program: the grid is M)
    # needs no mask.
    MASKED: tl.constexpr = BLOCK_M > 1 or N % BLOCK_N != 0
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = (rows < M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    x_rows = x_ptr + rows[:, None] * stride_x
    y_rows = y_ptr + rows[:, None] * stride_y
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    amx = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N):
        c = start + cols
        x = _looped_load(x_rows + c, row_ok & (c < N), MASKED, "evict_last").to(tl.float32)
        acc += x * x
        if QUANT == 2:
            amx = _looped_amax(amx, x, w_ptr, c, HAS_WEIGHT, W_OFFSET, N, BLOCK_N)
    _looped_scale(x_rows, w_ptr, y_rows, acc, row_ok, cols, eps, N, BLOCK_N, HAS_WEIGHT,
                  W_OFFSET, MASKED, rows, amx, q_in, q_out, stride_q,
                  QUANT, GROUP, Q_MAX, Q_MANT, Q_TINY, Q_UB, Q_BY_HAND,
                  BLOCK_M)  # fmt: skip


# fmt: off
@triton.jit
def _rms_norm_fwd_sharded(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    part_ptr, count_ptr,  # fp32 partial sums (M, SHARDS); arrivals a row (M,), zeroed
    stride_x, stride_y,  # elements between consecutive rows
    M, N, eps,  # rows, true row width, eps (fp32)
    BLOCK_N: tl.constexpr, SHARDS: tl.constexpr, SHARDS_P2: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr, STAGES: tl.constexpr,
    STREAM_Y: tl.constexpr,
    WAIT: tl.constexpr, RELOAD: tl.constexpr,
):
    # fmt: on
    # a wide row shared by SHARDS programs of BLOCK_N columns (a thread-block cluster made
    # of global memory): each loads its shard once, stores the sum of its squares and adds
    # one arrival to the row's count. WAIT: every program waits for the row's last arrival
    # and normalises its own shard, from registers or (RELOAD) read again from L2, x read
    # from HBM once; the programs of a row are consecutive, so with blocks started in order
    # the row's last program is resident or next to start, and the wait ends. Else the last
    # program to arrive normalises the whole row, re-reading x from L2, and no program
    # waits: the interpreter, which runs programs one after another, takes this path.
    pid = tl.program_id(0)
    row = (pid // SHARDS).to(tl.int64)  # int64 rows: offsets above 2^31 elements
    shard = pid % SHARDS
    x_row = x_ptr + row * stride_x
    c = shard * BLOCK_N + tl.arange(0, BLOCK_N)
    x = tl.load(x_row + c, mask=c < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(part_ptr + row * SHARDS + shard, tl.sum(x * x, axis=0))
    _sharded_finish(x, c, x_row, w_ptr, y_ptr + row * stride_y, part_ptr + row * SHARDS,
                    count_ptr + row, N, eps, BLOCK_N, SHARDS, SHARDS_P2, HAS_WEIGHT,
                    W_OFFSET, STAGES, STREAM_Y, WAIT, RELOAD)  # fmt: skip


@triton.jit
def _sharded_finish(
    s, c, s_row, w_ptr, y_row, parts, count, N, eps,
    BLOCK_N: tl.constexpr, SHARDS: tl.constexpr, SHARDS_P2: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr, STAGES: tl.constexpr,
    STREAM_Y: tl.constexpr,
    WAIT: tl.constexpr, RELOAD: tl.constexpr,
):
    # The sharded kernels' arrival and normalisation. s: this program's shard (columns c)
    # of the row s_row (x, or the fused add's residual_out), fp32. The barrier orders every
    # thread's stores (the partial sum; residual_out) before the count's release; an
    # acquire of the full count makes every shard's stores visible. Partials are summed in
    # shard order, so rstd has the same bits on every run. RELOAD: the shard is read again
    # after the wait (from L2, where it has just been: the acquire invalidates L1) so that s
    # is dead through the wait and its registers let more programs share the SM.
    tl.debug_barrier()
    arrived = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") + 1
    if WAIT:
        if HAS_WEIGHT:  # in flight while the row's other shards arrive
            w = _weight(tl.load(w_ptr + c, mask=c < N, other=0.0), W_OFFSET)
        while arrived < SHARDS:
            arrived = tl.atomic_add(count, 0, sem="acquire", scope="gpu")
        if RELOAD:
            s = tl.load(s_row + c, mask=c < N, other=0.0, cache_modifier=".ca").to(tl.float32)
        y = s * _sharded_rstd(parts, N, eps, SHARDS, SHARDS_P2)
        if HAS_WEIGHT:
            y = y * w
        _sharded_store(y_row, c, y, N, STREAM_Y)
    elif arrived == SHARDS:
        rstd = _sharded_rstd(parts, N, eps, SHARDS, SHARDS_P2)
        cols = tl.arange(0, BLOCK_N)
        for i in tl.range(0, SHARDS, num_stages=STAGES):
            cc = i * BLOCK_N + cols
            ok = cc < N
            # .cg: from L2, never a stale L1 line of a shard another program stored
            y = tl.load(s_row + cc, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
            y = y * rstd
            if HAS_WEIGHT:
                y = y * _weight(tl.load(w_ptr + cc, mask=ok, other=0.0), W_OFFSET)
            _sharded_store(y_row, cc, y, N, STREAM_Y)


@triton.jit
def _sharded_rstd(parts, N, eps, SHARDS: tl.constexpr, SHARDS_P2: tl.constexpr):
    k = tl.arange(0, SHARDS_P2)
    total = tl.sum(tl.load(parts + k, mask=k < SHARDS, other=0.0, cache_modifier=".cg"), axis=0)
    return tl.rsqrt(total / N + tl.cast(eps, tl.float32))


@triton.jit
def _sharded_store(y_row, c, y, N, STREAM_Y: tl.constexpr):
    # STREAM_Y: y's lines let go of L2 first (the last-arrival schedule re-reads x there)
    if STREAM_Y:
        tl.store(y_row + c, y.to(y_row.dtype.element_ty), mask=c < N, eviction_policy="evict_first")
    else:
        tl.store(y_row + c, y.to(y_row.dtype.element_ty), mask=c < N)


@triton.jit
def _split_at(x_row, N, VEC: tl.constexpr):
    # (head, nbody) of a row split at x's 16-byte boundaries (VEC elements): the scalar
    # head's length, from x's address itself (so any pointer is safe), and the aligned
    # body's, a whole number of vectors
    elem: tl.constexpr = 16 // VEC
    x_off = (x_row.to(tl.int64, bitcast=True) % 16) // elem  # elements past a boundary
    head = tl.minimum((VEC - x_off) % VEC, N).to(tl.int32)
    return head, tl.multiple_of((N - head) // VEC * VEC, VEC)


@triton.jit
def _split_edges(head, nbody, N, VEC: tl.constexpr):
    # (columns, mask) of the row's scalar edges: lanes [0, VEC) the head, [VEC, 2 VEC) the
    # tail
    e = tl.arange(0, 2 * VEC)
    is_head = e < VEC
    e_col = tl.where(is_head, e, head + nbody + e - VEC)
    e_ok = tl.where(is_head, e < head, e - VEC < N - head - nbody)
    return e_col, e_ok


@triton.jit
def _split_scale(
    b, e, w_ptr, head, cols, body, e_col, e_ok, N, eps,
    HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
):
    # the body's and the edges' values (fp32) times the whole row's rstd and the weight
    ss = tl.sum(b * b, axis=0) + tl.sum(e * e, axis=0)
    rstd = tl.rsqrt(ss / N + tl.cast(eps, tl.float32))
    yb = b * rstd
    ye = e * rstd
    if HAS_WEIGHT:
        yb = yb * _weight(tl.load(w_ptr + head + cols, mask=body, other=0.0), W_OFFSET)
        ye = ye * _weight(tl.load(w_ptr + e_col, mask=e_ok, other=0.0), W_OFFSET)
    return yb, ye


# fmt: off
@triton.jit
def _rms_norm_fwd_split(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    stride_x, stride_y,  # elements between rows
    N, eps,  # true row width, eps (fp32)
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
):
    # fmt: on
    # one program per row, split at x's 16-byte boundaries (VEC elements): a scalar head,
    # an aligned body the compiler can load with 16-byte vectors, a scalar tail. For odd N
    # the masked fused kernel cannot prove alignment and loads every element alone. The
    # head comes from x's address itself, so any pointer is safe; y's body is stored with
    # vectors when it shares x's alignment (always, for a contiguous y beside contiguous x).
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    head, nbody = _split_at(x_row, N, VEC)
    y_aligned = (y_row + head).to(tl.int64, bitcast=True) % 16 == 0
    cols = tl.arange(0, BLOCK_N)
    body = cols < nbody
    e_col, e_ok = _split_edges(head, nbody, N, VEC)
    # load body and edges; masked lanes read 0
    xb_ptr = tl.multiple_of(x_row + head, 16)  # bytes: a 16-byte boundary
    xb = tl.load(xb_ptr + cols, mask=body, other=0.0).to(tl.float32)
    xe = tl.load(x_row + e_col, mask=e_ok, other=0.0).to(tl.float32)
    # accumulate in fp32, divide by the true width, scale
    yb, ye = _split_scale(xb, xe, w_ptr, head, cols, body, e_col, e_ok, N, eps, HAS_WEIGHT,
                          W_OFFSET)  # fmt: skip
    # one cast, at the store
    yb = yb.to(y_ptr.dtype.element_ty)
    if y_aligned:
        tl.store(tl.multiple_of(y_row + head, 16) + cols, yb, mask=body)
    else:
        tl.store(y_row + head + cols, yb, mask=body)
    tl.store(y_row + e_col, ye.to(y_ptr.dtype.element_ty), mask=e_ok)


# ---- fused residual add + RMSNorm ------------------------------------------------------
@triton.jit
def _round_to(s, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    # s (fp32) rounded once to dtype, to nearest even. The GPU's cast does that; Triton's
    # interpreter truncates fp32 -> bf16, so there (BY_HAND) the bits are rounded here, as
    # the reference rounds residual_out: add half an ulp (less on an even tie), drop 16 bits.
    if BY_HAND:
        bits = s.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(dtype, bitcast=True)
    else:
        return s.to(dtype)



# s = x + residual in fp32, rounded once to residual's dtype and stored as residual_out;
# y = RMSNorm of that rounded s, so the fused op equals the unfused composition. x and
# residual are read once, y and residual_out written once. The in-place form passes
# y_ptr = x_ptr and ro_ptr = r_ptr: each element is read before it is written, by the
# program that owns its row.


# fmt: off
@triton.jit
def _fused_add_rms_norm_fwd_fused(
    x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr,  # x, residual, weight or a dummy, y, residual_out
    stride_x, stride_r, stride_y, stride_ro,  # elements between consecutive rows
    M, N, eps,  # rows, true row width, eps (fp32)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
    q_in=None, q_out=None, stride_q=None,  # the quantised output's (QUANT; _store_y)
    QUANT: tl.constexpr = 0, GROUP: tl.constexpr = 1, Q_MAX: tl.constexpr = 1.0,
    Q_MANT: tl.constexpr = 3, Q_TINY: tl.constexpr = 1.0, Q_UB: tl.constexpr = False,
    Q_BY_HAND: tl.constexpr = False,
):
    # fmt: on
    # one program per BLOCK_M rows; the tile of sums lives in registers
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows < M)[:, None] & col_ok[None, :]
    # load: masked lanes read 0 and add nothing to the sum
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    r = tl.load(r_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
    # add in fp32, round once to residual's dtype, and normalise what was stored
    s = _round_to(x.to(tl.float32) + r.to(tl.float32), ro_ptr.dtype.element_ty, ROUND_BY_HAND)
    tl.store(ro_ptr + rows[:, None] * stride_ro + cols[None, :], s, mask=mask)
    s = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + tl.cast(eps, tl.float32))
    y = s * rstd[:, None]
    if HAS_WEIGHT:
        w = _weight(tl.load(w_ptr + cols, mask=col_ok, other=0.0), W_OFFSET)
        y = y * w[None, :]
    _store_y(y_ptr + rows[:, None] * stride_y + cols[None, :], y, mask, rows, (rows < M)[:, None],
             q_in, q_out, stride_q, N,
             QUANT, GROUP, Q_MAX, Q_MANT, Q_TINY, Q_UB, Q_BY_HAND, BLOCK_M, BLOCK_N)  # fmt: skip


@triton.jit
def _fused_add_split_row(
    x_row, r_row, w_ptr, y_row, ro_row, head, nbody, N, eps,
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr, ALIGNED: tl.constexpr,
):
    # One row of the fused add, split as _rms_norm_fwd_split splits it: x's body is always
    # 16-byte aligned; ALIGNED: residual's, y's and residual_out's bodies are too (the
    # caller checked their addresses), so all four move in 16-byte vectors.
    cols = tl.arange(0, BLOCK_N)
    body = cols < nbody
    e_col, e_ok = _split_edges(head, nbody, N, VEC)
    if ALIGNED:
        rb_ptr = tl.multiple_of(r_row + head, 16)
        yb_ptr = tl.multiple_of(y_row + head, 16)
        rob_ptr = tl.multiple_of(ro_row + head, 16)
    else:
        rb_ptr = r_row + head
        yb_ptr = y_row + head
        rob_ptr = ro_row + head
    xb = tl.load(tl.multiple_of(x_row + head, 16) + cols, mask=body, other=0.0)
    rb = tl.load(rb_ptr + cols, mask=body, other=0.0)
    xe = tl.load(x_row + e_col, mask=e_ok, other=0.0)
    re = tl.load(r_row + e_col, mask=e_ok, other=0.0)
    sb = _round_to(xb.to(tl.float32) + rb.to(tl.float32), ro_row.dtype.element_ty, ROUND_BY_HAND)
    se = _round_to(xe.to(tl.float32) + re.to(tl.float32), ro_row.dtype.element_ty, ROUND_BY_HAND)
    yb, ye = _split_scale(sb.to(tl.float32), se.to(tl.float32), w_ptr, head, cols, body, e_col,
                          e_ok, N, eps, HAS_WEIGHT, W_OFFSET)  # fmt: skip
    # Every store after the reduction: the edges' few lanes are held by many threads at
    # once, so in the in-place form (residual_out is residual, y is x) a warp storing an
    # edge before another warp has loaded it would hand that warp x + residual for
    # residual; the reduction's barrier orders every warp's loads before any store.
    tl.store(rob_ptr + cols, sb, mask=body)
    tl.store(ro_row + e_col, se, mask=e_ok)
    tl.store(yb_ptr + cols, yb.to(y_row.dtype.element_ty), mask=body)
    tl.store(y_row + e_col, ye.to(y_row.dtype.element_ty), mask=e_ok)


# fmt: off
@triton.jit
def _fused_add_rms_norm_fwd_split(
    x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr,  # x, residual, weight or a dummy, y, residual_out
    stride_x, stride_r, stride_y, stride_ro,  # elements between consecutive rows
    N, eps,  # true row width, eps (fp32)
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
):
    # fmt: on
    # one program a row, split at x's 16-byte boundaries (VEC elements of x) into a scalar
    # head, an aligned body and a scalar tail, as the plain op's split kernel: for odd N the
    # masked tile cannot prove alignment and moves every element alone. The other three
    # rows take vectors when their bodies are aligned too (checked here, from the
    # addresses: any pointers are safe), else scalar accesses.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    r_row = r_ptr + row * stride_r
    y_row = y_ptr + row * stride_y
    ro_row = ro_ptr + row * stride_ro
    head, nbody = _split_at(x_row, N, VEC)
    aligned = ((r_row + head).to(tl.int64, bitcast=True) % 16 == 0) & (
        (y_row + head).to(tl.int64, bitcast=True) % 16 == 0) & (
        (ro_row + head).to(tl.int64, bitcast=True) % 16 == 0)  # fmt: skip
    if aligned:
        _fused_add_split_row(x_row, r_row, w_ptr, y_row, ro_row, head, nbody, N, eps,
                             BLOCK_N, VEC, HAS_WEIGHT, W_OFFSET, ROUND_BY_HAND, True)  # fmt: skip
    else:
        _fused_add_split_row(x_row, r_row, w_ptr, y_row, ro_row, head, nbody, N, eps,
                             BLOCK_N, VEC, HAS_WEIGHT, W_OFFSET, ROUND_BY_HAND, False)  # fmt: skip


# fmt: off
@triton.jit
def _fused_add_rms_norm_fwd_looped(
    x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr,  # x, residual, weight or a dummy, y, residual_out
    stride_x, stride_r, stride_y, stride_ro,  # elements between consecutive rows
    M, eps,  # rows, eps (fp32)
    N: tl.constexpr,  # the row width, a constant: one compile a width
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,

    q_in=None, q_out=None, stride_q=None,  # the quantised output's (QUANT; _store_y)
    QUANT: tl.constexpr = 0, GROUP: tl.constexpr = 1, Q_MAX: tl.constexpr = 1.0,
    Q_MANT: tl.constexpr = 3, Q_TINY: tl.constexpr = 1.0, Q_UB: tl.constexpr = False,
    Q_BY_HAND: tl.constexpr = False,
):
    # fmt: on
    # the plain op's looped form: the first sweep adds, stores residual_out and sums its
    # squares; the second reads residual_out back (the same thread's lanes, just stored),
    # scales and stores y. Each chunk is loaded before it is stored, and residual_out is
    # what the second sweep reads, so the in-place form (y is x, residual_out is residual)
    # is the same computation.
    MASKED: tl.constexpr = BLOCK_M > 1 or N % BLOCK_N != 0
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = (rows < M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    x_rows = x_ptr + rows[:, None] * stride_x
    r_rows = r_ptr + rows[:, None] * stride_r
    y_rows = y_ptr + rows[:, None] * stride_y
    ro_rows = ro_ptr + rows[:, None] * stride_ro
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    amx = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N):
        c = start + cols
        ok = row_ok & (c < N)
        x = _looped_load(x_rows + c, ok, MASKED, "evict_first").to(tl.float32)
        r = _looped_load(r_rows + c, ok, MASKED, "evict_first").to(tl.float32)
        s = _round_to(x + r, ro_ptr.dtype.element_ty, ROUND_BY_HAND)
        _looped_store(ro_rows + c, s, ok, MASKED)
        s = s.to(tl.float32)
        acc += s * s
        if QUANT == 2:
            amx = _looped_amax(amx, s, w_ptr, c, HAS_WEIGHT, W_OFFSET, N, BLOCK_N)
    _looped_scale(ro_rows, w_ptr, y_rows, acc, row_ok, cols, eps, N, BLOCK_N, HAS_WEIGHT,
                  W_OFFSET, MASKED, rows, amx, q_in, q_out, stride_q,
                  QUANT, GROUP, Q_MAX, Q_MANT, Q_TINY, Q_UB, Q_BY_HAND,
                  BLOCK_M)  # fmt: skip


# fmt: off
@triton.jit
def _fused_add_rms_norm_fwd_sharded(
    x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr,  # x, residual, weight or a dummy, y, residual_out
    part_ptr, count_ptr,  # fp32 partial sums (M, SHARDS); arrivals a row (M,), zeroed
    stride_x, stride_r, stride_y, stride_ro,  # elements between consecutive rows
    M, N, eps,  # rows, true row width, eps (fp32)
    BLOCK_N: tl.constexpr, SHARDS: tl.constexpr, SHARDS_P2: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr, ROUND_BY_HAND: tl.constexpr,
    STAGES: tl.constexpr,
    STREAM_Y: tl.constexpr, WAIT: tl.constexpr, RELOAD: tl.constexpr,
):
    # fmt: on
    # the plain op's sharded schedules: each program adds its shard, stores residual_out
    # and sums its squares; then (WAIT) it normalises its shard once the row's sum is
    # complete, or the last to arrive normalises the row from residual_out, in L2
    pid = tl.program_id(0)
    row = (pid // SHARDS).to(tl.int64)  # int64 rows: offsets above 2^31 elements
    shard = pid % SHARDS
    ro_row = ro_ptr + row * stride_ro
    c = shard * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = c < N
    x = tl.load(x_ptr + row * stride_x + c, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + c, mask=ok, other=0.0).to(tl.float32)
    s = _round_to(x + r, ro_ptr.dtype.element_ty, ROUND_BY_HAND)
    sf = s.to(tl.float32)
    part = tl.sum(sf * sf, axis=0)
    # stored after the sum, whose barrier orders every thread's loads first: in the
    # in-place form residual_out is residual
    tl.store(ro_row + c, s, mask=ok, eviction_policy="evict_last")
    tl.store(part_ptr + row * SHARDS + shard, part)
    _sharded_finish(sf, c, ro_row, w_ptr, y_ptr + row * stride_y, part_ptr + row * SHARDS,
                    count_ptr + row, N, eps, BLOCK_N, SHARDS, SHARDS_P2, HAS_WEIGHT,
                    W_OFFSET, STAGES, STREAM_Y, WAIT, RELOAD)  # fmt: skip


#: The fused and looped kernels' quantised-output arguments for y in its own dtype, passed
#: to every launch (torch.compile's wrapper of a user kernel takes no argument's default).
QUANT_OFF = dict(q_in=None, q_out=None, stride_q=None, QUANT=0, GROUP=1, Q_MAX=1.0, Q_MANT=3,
                 Q_TINY=1.0, Q_UB=False, Q_BY_HAND=False)  # fmt: skip

#: Each forward op's kernels, by kind (Config.kernel): the one table the launch reads.
FORWARD_KERNELS = {
    "rms_norm": {
        "fused": _rms_norm_fwd_fused,
        "split": _rms_norm_fwd_split,
        "sharded": _rms_norm_fwd_sharded,
        "looped": _rms_norm_fwd_looped,
    },
    "fused_add_rms_norm": {
        "fused": _fused_add_rms_norm_fwd_fused,
        "split": _fused_add_rms_norm_fwd_split,
        "sharded": _fused_add_rms_norm_fwd_sharded,
        "looped": _fused_add_rms_norm_fwd_looped,
    },
}
#: Every kernel kind a Config may name (rms_norm's are every op's).
KERNEL_KINDS = tuple(FORWARD_KERNELS["rms_norm"])
