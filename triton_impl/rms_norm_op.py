"""Fused RMSNorm forward in Triton: y = x / sqrt(mean(x^2) + eps) * weight.

Parallelisation
- Fused path (next_pow2(N) <= FUSED_MAX_N): one program owns a BLOCK_M x BLOCK_N tile,
  BLOCK_M whole rows (several rows for small N, one for large N). The tile is loaded
  once, kept in registers, reduced along the row, scaled and stored: x is read from
  memory exactly once.
- Split path (N not a multiple of 16 in 16-bit dtypes, of 4 in fp32): one program per
  row, the row split at x's 16-byte boundaries into a scalar head, an aligned body (a
  power-of-two tile of 16-byte vectors, alignment promised to the compiler) and a scalar
  tail, so odd N still gets 16-byte accesses.
- Persistent path (a sweep candidate for now): a few programs per SM walk whole rows;
  Triton's pipeliner loads the next rows into shared memory while one is reduced.
- Chunked path (wider rows): a few programs per SM, each walking its rows in BLOCK_N
  chunks twice: the first sweep accumulates sum(x^2), the second re-reads the chunks
  (from L2: the rows in flight fit in it), normalises and stores.
Launch configs (tile shape, warps) come from a sweep on the H200 (launch_config).
Eager calls skip the torch.library dispatch and Triton's generic launcher: a plan per
shape, strides and dtypes, and the compiled kernel per pointer alignment, are cached and
launched directly (_eager_launch).
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

import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from rmsnorm_api import (
    DEFAULT_EPS,
    EPS_MAX,
    EPS_MIN,
    MAX_N,
    RMSNormModule,
    as_rows,
    call_op,
    check_inputs,
    check_out,
)

#: Widest power-of-two row the fused path keeps in registers, per element size in bytes.
FUSED_MAX_N = {4: 32768, 2: 16384}

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
    M, N, eps,  # rows, true row width, eps (fp32)
    BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, STAGES: tl.constexpr,
):
    # fmt: on
    # rows too wide for registers: a program walks its rows (row, row + programs, ...) in
    # BLOCK_N chunks, twice each. With few programs in flight the rows being normalised
    # fit in L2, so the second sweep re-reads x from L2, not HBM; the hints keep x's lines
    # there for it (evict_last) and let them go after (evict_first). STAGES > 1: Triton's
    # pipeliner keeps the next STAGES - 1 chunks' loads in flight (through shared memory)
    # while one is summed or scaled; 1: one chunk at a time.
    cols = tl.arange(0, BLOCK_N)
    first = tl.program_id(0).to(tl.int64)  # int64 rows: offsets above 2^31 elements
    for row in range(first, M, tl.num_programs(0)):
        x_row = x_ptr + row * stride_x
        y_row = y_ptr + row * stride_y
        # sweep 1: per-lane fp32 partial sums, reduced once at the end
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            c = start + cols
            x = tl.load(x_row + c, mask=c < N, other=0.0, eviction_policy="evict_last")
            x = x.to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
        # sweep 2: re-read (L2-resident), scale, cast, store
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            c = start + cols
            ok = c < N
            x = tl.load(x_row + c, mask=ok, other=0.0, eviction_policy="evict_first")
            y = x.to(tl.float32) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
            tl.store(y_row + c, y.to(y_ptr.dtype.element_ty), mask=ok)


# fmt: off
@triton.jit
def _rms_norm_fwd_persistent(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    stride_x, stride_y,  # elements between consecutive rows
    M, N, eps,  # rows, true row width, eps (fp32)
    BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, STAGES: tl.constexpr,
):
    # fmt: on
    # a few programs per SM, each walking rows pid, pid + programs, ...: Triton's software
    # pipeliner issues the next rows' loads (into shared memory) while this one is reduced
    # and stored; the weight is loaded once per program, not once per row
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    first = tl.program_id(0).to(tl.int64)  # int64 rows: offsets above 2^31 elements
    for row in tl.range(first, M, tl.num_programs(0), num_stages=STAGES):
        x = tl.load(x_ptr + row * stride_x + cols, mask=col_ok, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        y = x * rstd
        if HAS_WEIGHT:
            y = y * w
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_ok)


# fmt: off
@triton.jit
def _rms_norm_fwd_split(
    x_ptr, w_ptr, y_ptr,  # x rows, weight (N,) or a dummy, y rows
    stride_x, stride_y,  # elements between rows
    N, eps,  # true row width, eps (fp32)
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, HAS_WEIGHT: tl.constexpr,
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
    elem: tl.constexpr = 16 // VEC
    x_off = (x_row.to(tl.int64, bitcast=True) % 16) // elem  # elements past a boundary
    head = tl.minimum((VEC - x_off) % VEC, N).to(tl.int32)
    nbody = tl.multiple_of((N - head) // VEC * VEC, VEC)
    y_aligned = (y_row + head).to(tl.int64, bitcast=True) % 16 == 0
    cols = tl.arange(0, BLOCK_N)
    body = cols < nbody
    # edges: lanes [0, VEC) are the head, [VEC, 2 VEC) the tail
    e = tl.arange(0, 2 * VEC)
    is_head = e < VEC
    e_col = tl.where(is_head, e, head + nbody + e - VEC)
    e_ok = tl.where(is_head, e < head, e - VEC < N - head - nbody)
    # load body and edges; masked lanes read 0
    xb_ptr = tl.multiple_of(x_row + head, 16)  # bytes: a 16-byte boundary
    xb = tl.load(xb_ptr + cols, mask=body, other=0.0).to(tl.float32)
    xe = tl.load(x_row + e_col, mask=e_ok, other=0.0).to(tl.float32)
    # accumulate in fp32, divide by the true width
    rstd = tl.rsqrt((tl.sum(xb * xb, axis=0) + tl.sum(xe * xe, axis=0)) / N + eps)
    yb = xb * rstd
    ye = xe * rstd
    if HAS_WEIGHT:
        yb = yb * tl.load(w_ptr + head + cols, mask=body, other=0.0).to(tl.float32)
        ye = ye * tl.load(w_ptr + e_col, mask=e_ok, other=0.0).to(tl.float32)
    # one cast, at the store
    yb = yb.to(y_ptr.dtype.element_ty)
    if y_aligned:
        tl.store(tl.multiple_of(y_row + head, 16) + cols, yb, mask=body)
    else:
        tl.store(y_row + head + cols, yb, mask=body)
    tl.store(y_row + e_col, ye.to(y_ptr.dtype.element_ty), mask=e_ok)


#: Tuned by harness.sweep on the H200 (results/h200/sweep-*.jsonl): (BLOCK_M, num_warps) of
#: the fused kernel per (element size, BLOCK_N, whether N < BLOCK_N), for the widths the
#: sweep measured; other widths take the rule in launch_config.
FUSED_TUNED = {
    # 16-bit, N = BLOCK_N
    (2, 128, False): (16, 8), (2, 512, False): (4, 4), (2, 1024, False): (2, 2),
    (2, 2048, False): (1, 4), (2, 4096, False): (4, 16), (2, 8192, False): (2, 4),
    (2, 16384, False): (1, 8),
    # 16-bit, padded tiles (N = 5120, 12288)
    (2, 8192, True): (1, 4), (2, 16384, True): (1, 8),
    # fp32, N = BLOCK_N
    (4, 128, False): (8, 4), (4, 512, False): (2, 4), (4, 1024, False): (1, 4),
    (4, 2048, False): (1, 4), (4, 4096, False): (2, 32), (4, 8192, False): (1, 32),
    (4, 16384, False): (2, 32), (4, 32768, False): (1, 16),
    # fp32, padded tiles (N = 1000, 5120, 12288)
    (4, 1024, True): (1, 1), (4, 8192, True): (4, 32), (4, 16384, True): (2, 32),
}  # fmt: skip
#: Bytes of the tile a thread holds, for widths not in FUSED_TUNED and for the split kernel.
THREAD_BYTES = {2: 64, 4: 32}
#: Chunked path, from the sweep: (chunk width, warps, programs an SM or 0 for one a row)
#: per (element size, BLOCK_N); wider rows take the last. Entries at or below FUSED_MAX_N
#: replace the fused kernel for N = BLOCK_N only, where the sweep measured them faster
#: (fp32 16384: 99.1% of copy against 96.6%, sweep-f21bc13.jsonl).
CHUNKED_TUNED = {
    (2, 32768): (8192, 16, 0), (2, 65536): (16384, 32, 0), (2, 131072): (32768, 16, 1),
    (4, 16384): (4096, 32, 0), (4, 65536): (32768, 32, 2), (4, 131072): (32768, 32, 0),
}  # fmt: skip
CHUNKED_WIDE = (32768, 32, 0)
#: Persistent path (the next rows' loads in flight while one is reduced), where the sweep
#: measured it ahead of the fused kernel: (warps, programs an SM, stages) per FUSED_TUNED's
#: key. 16-bit 12288: 89.9% of copy against 88.3% (sweep-f21bc13.jsonl); at the other
#: widths it measured 2-6 points behind the fused kernel.
PERSISTENT_TUNED = {(2, 16384, True): (16, 1, 3)}


@functools.cache
def launch_config(n: int, element_size: int, split_ok: bool = True) -> dict:
    """Which kernel, BLOCK_M, BLOCK_N and warps for rows of n elements of element_size bytes.

    - n % 16 != 0 in 16-bit (n % 4 != 0 in fp32), when x's and y's rows share their 16-byte
      alignment (split_ok): the split kernel, since the masked fused kernel cannot prove
      16-byte alignment of such rows and falls back to scalar accesses.
    - rows up to FUSED_MAX_N: the fused kernel, tiles tuned per width (FUSED_TUNED), else
      several rows a program up to a 4 KiB tile and THREAD_BYTES of it a thread; the
      persistent kernel where PERSISTENT_TUNED names the width.
    - wider rows, and the widths CHUNKED_TUNED names: the chunked two-sweep kernel.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise ValueError(f"launch_config: n is {n!r}; expected an int in [1, {MAX_N}]")
    if element_size not in (2, 4):
        raise ValueError(f"launch_config: element_size is {element_size!r}; expected 2 or 4")
    elem = element_size
    vec = 16 // elem
    block_n = triton.next_power_of_2(n)
    chunked = CHUNKED_TUNED.get((elem, block_n))
    if block_n > FUSED_MAX_N[elem] or (chunked and n == block_n):
        chunk, warps, per_sm = chunked or CHUNKED_WIDE
        return dict(kernel="chunked", BLOCK_M=1, BLOCK_N=chunk, num_warps=warps,
                    programs_per_sm=per_sm)  # fmt: skip
    if split_ok and n >= vec and n % (16 if elem == 2 else vec):
        body = triton.next_power_of_2(n // vec * vec)
        warps = max(1, min(32, body * elem // (32 * THREAD_BYTES[elem])))
        return dict(kernel="split", BLOCK_M=1, BLOCK_N=body, num_warps=warps)
    key = (elem, block_n, n < block_n)
    if key in PERSISTENT_TUNED:
        warps, per_sm, stages = PERSISTENT_TUNED[key]
        return dict(kernel="persistent", BLOCK_M=1, BLOCK_N=block_n, num_warps=warps,
                    programs_per_sm=per_sm, stages=stages)  # fmt: skip
    tuned = FUSED_TUNED.get(key)
    if tuned is None:
        row_bytes = block_n * elem
        block_m = max(1, min(64, 4096 // row_bytes))
        warps = max(1, min(32, block_m * row_bytes // (32 * THREAD_BYTES[elem])))
        tuned = (block_m, warps)
    return dict(kernel="fused", BLOCK_M=tuned[0], BLOCK_N=block_n, num_warps=tuned[1])


def latency_config(cfg: dict, element_size: int) -> dict:
    """For fewer programs than SMs (decode-sized calls): one row a program and 32 bytes of
    it a thread, so rows spread over SMs and each thread's loads and the reduction are
    short; launch_config's tiles aim at throughput, which needs many rows."""
    warps = max(1, min(16, cfg["BLOCK_N"] * element_size // (32 * 32)))
    return dict(cfg, BLOCK_M=1, num_warps=warps)


def _split_ok(x2: torch.Tensor, y2: torch.Tensor) -> bool:
    """Whether the split kernel's vector stores of y line up with its vector loads of x:
    x's and y's rows equally far from a 16-byte boundary, judged from strides and storage
    offsets (allocations are 16-byte aligned; no data pointer, so this also holds while
    tracing). A choice of speed only: the kernel is correct for any pointers."""
    vec = 16 // x2.element_size()
    return (x2.stride(0) - y2.stride(0)) % vec == 0 and (
        x2.storage_offset() - y2.storage_offset()
    ) % vec == 0


KERNELS = {
    "fused": _rms_norm_fwd_fused,
    "split": _rms_norm_fwd_split,
    "chunked": _rms_norm_fwd_chunked,
    "persistent": _rms_norm_fwd_persistent,
}


def kernel_for(cfg: dict, element_size: int, has_weight: bool) -> tuple:
    """(kernel, meta) for a launch config: the @triton.jit function and its compile-time
    arguments (constexprs and num_warps), shared by the launch and scripts/triton_ptx.py."""
    meta = dict(BLOCK_N=cfg["BLOCK_N"], HAS_WEIGHT=has_weight, num_warps=cfg["num_warps"])
    if cfg["kernel"] == "fused":
        meta["BLOCK_M"] = cfg["BLOCK_M"]
    elif cfg["kernel"] == "split":
        meta["VEC"] = 16 // element_size
    else:  # chunked, persistent
        meta["STAGES"] = cfg.get("stages", 1)
    return KERNELS[cfg["kernel"]], meta


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
    split_ok = _split_ok(x2, y2)
    if cfg is None:
        cfg = launch_config(n, x.element_size(), split_ok)
        if x.is_cuda and cfg["kernel"] != "chunked":
            if triton.cdiv(m, cfg["BLOCK_M"]) < _sm_count(x.device.index):
                cfg = latency_config(cfg, x.element_size())
    kernel, meta = kernel_for(cfg, x.element_size(), has_weight)
    strides = (x2.stride(0), y2.stride(0))
    if cfg["kernel"] == "split":
        return kernel, (m,), (x2, w, y2, *strides, n, eps), meta
    args = (x2, w, y2, *strides, m, n, eps)
    if cfg["kernel"] == "fused":
        return kernel, (triton.cdiv(m, cfg["BLOCK_M"]),), args, meta
    programs = m
    if cfg.get("programs_per_sm"):  # the interpreter (CPU) pretends to have 2 SMs
        sms = _sm_count(x.device.index) if x.is_cuda else 2
        programs = min(m, cfg["programs_per_sm"] * sms)
    return kernel, (max(programs, 1),), args, meta


@functools.cache
def _sm_count(device: Optional[int]) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


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


# ---- eager fast path -------------------------------------------------------------------
# A decode-sized RMSNorm costs less on the GPU than the host spends launching it through
# torch.library dispatch and Triton's JITFunction.run (which binds and specialises every
# argument on each call). Eager calls therefore go through a plan cache instead: keyed by
# everything the launch depends on besides the data (shape, strides, storage offset mod
# 16 bytes, dtypes, devices), a plan holds the kernel, grid, integer arguments and
# constexprs, and the compiled kernels for each combination of 16-byte alignment of the
# three pointers (the only specialisation left to the data). A hit skips the argument
# checks (the key implies they passed; eps is checked each time), the planning and Triton's
# launcher; a miss, or a new alignment, goes once through the checked, generic path.

_PLANS: dict = {}
_MAX_PLANS = 4096


class _Plan:
    __slots__ = ("kernel", "grid", "ints", "meta", "consts", "compiled")

    def __init__(self, kernel, grid: tuple, ints: tuple, meta: dict) -> None:
        self.kernel, self.grid, self.ints, self.meta = kernel, grid, ints, meta
        self.consts = tuple(meta[name] for name in kernel.arg_names[3 + len(ints) + 1 :])
        self.compiled: dict = {}  # (x, w, y 16-byte aligned) -> compiled kernel, or False


def _plan_key(x: torch.Tensor, weight: Optional[torch.Tensor]) -> tuple:
    w = weight
    wkey = None if w is None else (w.shape, w.stride(), w.dtype, w.get_device())
    return (x.shape, x.stride(), x.storage_offset() % 8, x.dtype, x.get_device(), wkey)


def _run_compiled(compiled, grid: tuple, values: list, device: int) -> None:
    """Launch a compiled kernel as JITFunction.run does (Triton >= 3.3: every argument,
    constexprs included, in signature order)."""
    knobs = triton.knobs.runtime
    stream = triton.runtime.driver.active.get_current_stream(device)
    enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
    md = compiled.launch_metadata(grid, stream, *values) if enter is not None else None
    compiled.run(grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, md,
                 enter, leave, *values)  # fmt: skip


def _launchable(compiled) -> bool:
    """Whether this Triton's compiled kernel has what _run_compiled uses."""
    names = ("run", "function", "packed_metadata", "launch_metadata")
    return hasattr(triton, "knobs") and all(hasattr(compiled, a) for a in names)


def _eager_launch(x: torch.Tensor, weight: Optional[torch.Tensor], eps) -> torch.Tensor:
    """rms_norm for real CUDA tensors outside tracing (see _eager_ok)."""
    key = _plan_key(x, weight)
    plan = _PLANS.get(key)
    if plan is None or not (type(eps) is float and EPS_MIN <= eps <= EPS_MAX):
        check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=_IMPL)
    eps = float(eps)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    if plan is None:
        kernel, grid, args, meta = _plan(x, weight, eps, y)
        # cache only when x and the weight are used in place (no copy made for the launch)
        if args[0].data_ptr() == x.data_ptr() and (weight is None or args[1] is weight):
            if len(_PLANS) >= _MAX_PLANS:  # many shapes (e.g. a varying batch): start over
                _PLANS.clear()
            plan = _PLANS[key] = _Plan(kernel, grid, tuple(args[3:-1]), meta)
        else:
            kernel[grid](*args, **meta)
            return y
    w = x if weight is None else weight  # a dummy pointer when there is no weight
    align = (x.data_ptr() % 16 == 0, w.data_ptr() % 16 == 0, y.data_ptr() % 16 == 0)
    compiled = plan.compiled.get(align)
    if not compiled:  # compile (or find in Triton's caches) and launch, generically
        compiled = plan.kernel[plan.grid](x, w, y, *plan.ints, eps, **plan.meta)
        if align not in plan.compiled:
            compiled = compiled.result() if hasattr(compiled, "result") else compiled
            plan.compiled[align] = compiled if _launchable(compiled) else False
        return y
    _run_compiled(compiled, plan.grid, [x, w, y, *plan.ints, eps, *plan.consts], x.get_device())
    return y


def _eager_ok(x, weight, eps, out) -> bool:
    """Whether a call can take the fast path: plain CUDA tensors, no out=, no autograd,
    not being traced (torch.compile, FakeTensor, functorch wrap tensors in subclasses)."""
    return (
        out is None
        and type(x) is torch.Tensor
        and x.is_cuda
        and (weight is None or type(weight) in (torch.Tensor, torch.nn.Parameter))
        and not torch.compiler.is_compiling()
        and not (
            torch.is_grad_enabled()
            and (x.requires_grad or (weight is not None and weight.requires_grad))
        )
    )


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
    check_out(out, x, weight, impl=_IMPL)
    _launch(x, weight, eps, out)


def _forward_only(ctx, grad):
    raise RuntimeError(
        f"{_IMPL}: the kernels are forward-only for now (no backward yet); train with"
        " torch.nn.RMSNorm"
    )


# Forward only, for now: with inputs that require grad the forward runs and the result's
# backward raises, in the CUDA op's words.
torch.library.register_autograd(
    "triton_impl::rms_norm", _forward_only, setup_context=lambda ctx, inputs, output: None
)

# Nested tensors stop at their autograd key, which the ops above have no kernel for: there
# the checks name x instead of the dispatcher's "could not run" (as on the CUDA side).
_NESTED_KEY = "AutogradNestedTensor"
_NESTED = torch.library.Library("triton_impl", "IMPL")
_NESTED.impl("rms_norm", lambda x, w, eps: check_inputs(x, w, eps, impl=_IMPL), _NESTED_KEY)
_NESTED.impl(
    "rms_norm_out", lambda out, x, w, eps: check_inputs(x, w, eps, impl=_IMPL), _NESTED_KEY
)


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
    if not INTERPRET and _eager_ok(x, weight, eps, out):
        return _eager_launch(x, weight, eps)
    ops = torch.ops.triton_impl
    return call_op(
        ops.rms_norm, ops.rms_norm_out, x, weight, eps, out, impl=_IMPL, allow_cpu=INTERPRET
    )


def rms_norm_with_config(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, cfg: dict
) -> torch.Tensor:
    """rms_norm with a forced launch config (launch_config's form), for sweeps; same result.

    cfg: kernel "fused" (BLOCK_M rows of BLOCK_N >= N lanes a program), "split" (one row a
    program, BLOCK_N >= N // VEC * VEC lanes of aligned body, scalar head and tail),
    "chunked" (rows in BLOCK_N-wide chunks, programs_per_sm programs an SM or, if 0, one
    a row; optional `stages`, the chunks' loads in flight, default 1) or "persistent"
    (programs_per_sm programs an SM walking whole rows, the next `stages` - 1 rows' loads
    in flight), and num_warps.
    """
    check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=_IMPL)
    _check_config(cfg, x.shape[-1], x.element_size())
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, weight, float(eps), y, cfg)
    return y


def _check_config(cfg: dict, n: int, element_size: int) -> None:
    """ValueError naming the field of a forced config that no kernel can compile or run."""
    where = "rms_norm_with_config: cfg"
    if not isinstance(cfg, dict):
        raise ValueError(f"{where} must be a dict (launch_config's form), got {type(cfg).__name__}")
    kind = cfg.get("kernel")
    if kind not in KERNELS:
        raise ValueError(f"{where}['kernel'] is {kind!r}; expected one of {sorted(KERNELS)}")
    ranges = dict(BLOCK_M=(1, 1024), BLOCK_N=(1, MAX_N), num_warps=(1, 32))
    for key, (lo, hi) in ranges.items():
        v = cfg.get(key, 1 if key == "BLOCK_M" else None)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi or v & (v - 1):
            raise ValueError(f"{where}[{key!r}] is {v!r}; expected a power of two in [{lo}, {hi}]")
    for key, lo in (("programs_per_sm", 0), ("stages", 1)):
        v = cfg.get(key, lo)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{where}[{key!r}] is {v!r}; expected an int >= {lo}")
    # the split kernel's tile holds the aligned body only, at most n // VEC * VEC lanes
    vec = 16 // element_size
    need = {"fused": n, "persistent": n, "split": n // vec * vec}
    if cfg["BLOCK_N"] < need.get(kind, 0):
        raise ValueError(f"{where}: BLOCK_N = {cfg['BLOCK_N']} is narrower than the row (N = {n})")


class RMSNorm(RMSNormModule):
    """torch.nn.RMSNorm drop-in (1-D normalized_shape) running the Triton kernel."""

    _fn = staticmethod(rms_norm)
