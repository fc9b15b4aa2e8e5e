"""Launch configs of the Triton RMSNorm kernels: the rules that read the tuned data.

- ``Config``: one launch, typed and frozen (which kernel, its tile, warps, programs an SM,
  pipeline stages); invalid fields raise ValueError naming the field. ``Width``: the one
  key type of the tuned tables. Both defined in triton_impl.config_types, importable here.
- ``default_config(n, element_size, ...)``: the one rule the launcher, ``kernel_info``,
  the tests and the report use; ``fused_add_config`` / ``fused_add_default_config`` the
  fused add's. They look the widths the sweep measured up in the tuned tables, and use a
  formula for the rest.
- ``search_space(n, element_size, op)``: the candidates ``python -m harness.sweep`` times.
- ``kernel_for(cfg, ...)``: the @triton.jit function and compile-time arguments of a config.

The tuned data (tables and constants, forward, fused add and backward) lives in
triton_impl.tuning, written once; the names the rules read are importable from here too.
Tuning flows one way: the sweep's records (results/h200/sweeps/*.jsonl) -> tuning.py ->
tests (every candidate computes the same function) -> the benchmark. Why each entry is what
it is, with the measurements: docs/notebook/01-why-the-defaults.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import triton

from rmsnorm_api import check_width
from triton_impl.config_types import Config, Width
from triton_impl.config_types import fused_config as _fused
from triton_impl.kernels import FORWARD_KERNELS, QUANT_OFF
from triton_impl.tuning import (
    FUSED_ADD_LATENCY_THREAD_BYTES,
    FUSED_ADD_LATENCY_WARPS,
    FUSED_ADD_SPLIT_THREAD_BYTES,
    FUSED_ADD_TUNED,
    FUSED_ADD_WIDE,
    FUSED_ADD_WIDE_TUNED,
    FUSED_MAX_N,
    FUSED_TUNED,
    LATENCY_FIRST_MAX_BYTES,
    LATENCY_FIRST_MAX_WARPS,
    LATENCY_MAX_WARPS,
    LATENCY_THREAD_BYTES,
    LOOPED_CHUNK_BYTES,
    LOOPED_ROW_BYTES,
    LOOPED_THREAD_BYTES,
    LOOPED_TUNED,
    LOOPED_TWO_ROWS_MAX_BYTES,
    SHARDED,
    THREAD_BYTES,
)


def formula_tile(block_n: int, element_size: int) -> Config:
    """The fused tile for a width no table names: several rows a program up to a 4 KiB
    tile, THREAD_BYTES of it a thread."""
    row_bytes = block_n * element_size
    block_m = max(1, min(64, 4096 // row_bytes))
    warps = max(1, min(32, block_m * row_bytes // (32 * THREAD_BYTES[element_size])))
    return _fused(block_n, block_m, warps)


def split_kernel_wins(n: int, element_size: int) -> bool:
    """Rows whose width is not a multiple of 16 elements (16-bit) or of one 16-byte vector
    (fp32): the masked fused kernel cannot prove 16-byte alignment of such rows and falls
    back to scalar accesses, so the split kernel, which finds the aligned body, takes them."""
    vec = 16 // element_size
    return n >= vec and n % (16 if element_size == 2 else vec) != 0


def split_body(n: int, element_size: int) -> int:
    """The split kernel's tile for rows of n elements: the row's aligned body (its whole
    16-byte vectors), rounded up to a power of two."""
    vec = 16 // element_size
    return triton.next_power_of_2(n // vec * vec)


def _split(n: int, element_size: int, thread_bytes: int) -> Config:
    """The split kernel on rows of n elements, thread_bytes of x's body a thread."""
    body = split_body(n, element_size)
    return Config("split", body, max(1, min(32, body * element_size // (32 * thread_bytes))))


def looped_config(n: int, element_size: int) -> Optional[Config]:
    """rms_norm's looped kernel for rows of n elements whose bytes lie in LOOPED_ROW_BYTES,
    else None: LOOPED_TUNED's entry, else chunks of the row's power of two up to
    LOOPED_CHUNK_BYTES, two rows a program where the row is a power of two of at most
    LOOPED_TWO_ROWS_MAX_BYTES, and LOOPED_THREAD_BYTES of the program's rows a thread (warps
    a power of two, at most 32)."""
    lo, hi = LOOPED_ROW_BYTES
    row_bytes = n * element_size
    if not lo <= row_bytes <= hi:
        return None
    block_n = triton.next_power_of_2(n)
    tuned = LOOPED_TUNED.get(Width(element_size, block_n, n < block_n))
    if tuned:
        return tuned
    rows = 2 if n == block_n and row_bytes <= LOOPED_TWO_ROWS_MAX_BYTES else 1
    warps = min(32, triton.next_power_of_2(triton.cdiv(rows * row_bytes, 32 * LOOPED_THREAD_BYTES)))
    chunk = min(block_n, LOOPED_CHUNK_BYTES // element_size)
    return Config("looped", chunk, warps, block_m=rows)


@functools.cache
def throughput_config(n: int, element_size: int, split_ok: bool = True) -> Config:
    """The config for many rows of n elements of element_size bytes.

    - split_kernel_wins(n), when x's and y's rows share their 16-byte alignment
      (split_ok), for rows up to FUSED_MAX_N: the split kernel, its tile the aligned body;
    - rows of LOOPED_ROW_BYTES: the looped kernel (looped_config);
    - other rows up to FUSED_MAX_N: the fused kernel, tiles tuned per width (FUSED_TUNED),
      else several rows a program up to a 4 KiB tile and THREAD_BYTES of it a thread;
    - wider rows: the sharded kernel (SHARDED).
    """
    n, element_size = check_width(n, element_size, "default_config")
    elem = element_size
    block_n = triton.next_power_of_2(n)
    wide = block_n > FUSED_MAX_N[elem]
    if not wide and split_ok and split_kernel_wins(n, elem):
        return _split(n, elem, THREAD_BYTES[elem])
    return looped_config(n, elem) or (SHARDED[elem] if wide else fused_tile(n, elem))


def fused_tile(n: int, element_size: int) -> Config:
    """The fused kernel's tile for rows of n elements: FUSED_TUNED's, else formula_tile."""
    block_n = triton.next_power_of_2(n)
    key = Width(element_size, block_n, n < block_n)
    return FUSED_TUNED.get(key) or formula_tile(block_n, element_size)


def latency_config(cfg: Config, element_size: int) -> Config:
    """For fewer programs than SMs (decode-sized calls): one row a program and
    LATENCY_THREAD_BYTES of it a thread up to LATENCY_MAX_WARPS warps, so rows spread over
    SMs and each thread's loads and the reduction are short; the fused kernel's rows up to
    LATENCY_FIRST_MAX_BYTES load the weight beside x (weight_first) on at most
    LATENCY_FIRST_MAX_WARPS warps (wider rows would hold the weight through the sum in too
    many registers: fp32 32768 on 8 warps spills). The throughput tiles aim at many rows."""
    row_bytes = cfg.block_n * element_size
    first = cfg.kernel == "fused" and row_bytes <= LATENCY_FIRST_MAX_BYTES
    most = LATENCY_FIRST_MAX_WARPS if first else LATENCY_MAX_WARPS
    warps = max(1, min(most, row_bytes // (32 * LATENCY_THREAD_BYTES)))
    return dataclasses.replace(cfg, block_m=1, num_warps=warps, weight_first=first)


def default_config(
    n: int,
    element_size: int,
    op: str = "rms_norm",
    *,
    split_ok: bool = True,
    dtype: Optional[str] = None,
    rows: Optional[int] = None,
    sms: Optional[int] = None,
) -> Config:
    """The config forward op ``op`` launches for rows of n elements of element_size bytes,
    the one rule the launcher, ``kernel_info``, the sweep and the tests use. split_ok: the
    rows read and written share their 16-byte alignment; dtype: x's (and the residual's)
    name where they are one (the fused add's dtype-keyed entries); rows and sms (both
    given: a real GPU): the latency rule's inputs. The fused add: fused_add_default_config.
    rms_norm: the throughput rule, and for `rows` fewer programs than `sms` the latency
    rule (rows the fused kernel holds start from its tile there, and the looped kernel's
    rows of at most LATENCY_FIRST_MAX_BYTES)."""
    n, element_size = check_width(n, element_size, "default_config")
    if op == "fused_add_rms_norm":
        return fused_add_default_config(n, element_size, split_ok, dtype, rows=rows, sms=sms)
    if op != "rms_norm":
        raise ValueError(
            f"default_config: op is {op!r}; expected one of {', '.join(FORWARD_KERNELS)}"
        )
    cfg = throughput_config(n, element_size, split_ok)
    if rows is None or not sms:
        return cfg
    base = cfg
    # the looped kernel's rows the decode probe measured on the fused tile's latency rule;
    # wider ones keep the looped kernel, one row a program or two already
    if cfg.kernel == "looped" and n * element_size <= LATENCY_FIRST_MAX_BYTES:
        base = fused_tile(n, element_size)
    if base.kernel not in ("looped", "sharded") and triton.cdiv(rows, base.block_m) < sms:
        return latency_config(base, element_size)
    return cfg


def quant_config(cfg: Config, n: int, element_size: int, dynamic: bool = False) -> Config:
    """The config of a forward with a quantised output, from the op's: only the fused and
    looped kernels have the quantising epilogue, so the split kernel's rows (odd widths up
    to FUSED_MAX_N) take the fused tile, and the sharded kernel's (the widest) the looped
    kernel in chunks of LOOPED_CHUNK_BYTES, on 32 warps. A dynamic scale (a row's or a
    group's) takes the fused tile in place of the looped kernel where the row fits it: the
    row's max then comes from the values held, where the looped kernel's first sweep reads
    the weight for it too (notebook 18 v67: the plain op's looped rows trailed the fused
    add's fused ones there)."""
    fits = triton.next_power_of_2(n) <= FUSED_MAX_N[element_size]
    if cfg.kernel == "split" or (dynamic and cfg.kernel == "looped" and fits):
        return fused_tile(n, element_size)
    if cfg.kernel == "sharded":
        return Config("looped", LOOPED_CHUNK_BYTES // element_size, 32)
    return cfg


def shards(cfg: Config, n: int) -> int:
    """Programs a row of n elements takes: its block_n-wide shards (sharded kernel), else 1."""
    return triton.cdiv(n, cfg.block_n) if cfg.kernel == "sharded" else 1


#: Shards a row may take: each program sums the row's partials as one vector of this many.
MAX_SHARDS = 1024


def _sharded_meta(cfg: Config, n: int) -> dict:
    k = shards(cfg, n)
    if k > MAX_SHARDS:
        raise ValueError(
            f"sharded kernel: block_n = {cfg.block_n} splits a row of N = {n} into {k} shards;"
            f" at most {MAX_SHARDS}"
        )
    return dict(SHARDS=k, SHARDS_P2=triton.next_power_of_2(k), STAGES=cfg.stages,
                STREAM_Y=cfg.stream_y, WAIT=cfg.wait, RELOAD=cfg.reload)  # fmt: skip


def kernel_for(
    op: str,
    cfg: Config,
    element_size: int,
    has_weight: bool,
    n: int,
    round_by_hand: bool = False,
    weight_offset: float = 0.0,
    quant: Optional[dict] = None,
) -> tuple:
    """(kernel, meta) of forward op ``op`` for a config and rows of n elements: the
    @triton.jit function (kernels.FORWARD_KERNELS) and its compile-time arguments
    (constexprs and num_warps), shared by the launch and scripts/triton_ptx.py.
    round_by_hand, the fused add's: residual_out is bf16 and the kernel runs in the
    interpreter (kernels._round_to). weight_offset: a constant of the compile (one kernel
    an offset a model uses; 0.0 compiles to the kernel without it). quant: the quantised
    output's constexprs (launch.quant_meta), for the fused and looped kernels."""
    kernels = FORWARD_KERNELS[op]
    if cfg.kernel not in kernels:
        raise ValueError(f"{op}: no {cfg.kernel!r} kernel; expected one of {sorted(kernels)}")
    if quant and (cfg.kernel not in ("fused", "looped") or cfg.block_n % quant["GROUP"]):
        raise ValueError(
            f"{op}: a quantised output with the {cfg.kernel} kernel of block_n {cfg.block_n};"
            f" the fused and looped kernels quantise, in tiles of whole groups"
            f" ({quant['GROUP']} columns)"
        )
    fused_add = op == "fused_add_rms_norm"
    if fused_add and cfg.weight_first:
        raise ValueError("fused add: weight_first is set; only rms_norm's fused kernel has it")
    meta = dict(BLOCK_N=cfg.block_n, HAS_WEIGHT=has_weight, W_OFFSET=float(weight_offset),
                num_warps=cfg.num_warps)  # fmt: skip
    if fused_add:
        meta["ROUND_BY_HAND"] = round_by_hand
    if cfg.kernel == "looped":
        meta.update(N=n, BLOCK_M=cfg.block_m)
    elif cfg.kernel == "fused":
        meta["BLOCK_M"] = cfg.block_m
        if not fused_add:
            meta["W_FIRST"] = cfg.weight_first
    elif cfg.kernel == "split":
        meta["VEC"] = 16 // element_size
    elif cfg.kernel == "sharded":
        meta.update(_sharded_meta(cfg, n))
    if cfg.kernel in ("fused", "looped"):  # every argument given: Inductor's wrapper wants all
        meta.update(quant or QUANT_OFF)
    return kernels[cfg.kernel], meta


# ---- the fused residual add -------------------------------------------------------------
@functools.cache
def fused_add_config(
    n: int, element_size: int, split_ok: bool = True, dtype: Optional[str] = None
) -> Config:
    """The fused add's config for rows of n elements of x's element_size bytes (dtype: x's
    and the residual's, named "bf16", "fp16" or "fp32", where they are one): the split
    kernel where split_kernel_wins and the four rows share x's 16-byte alignment
    (split_ok), FUSED_ADD_SPLIT_THREAD_BYTES of x a thread; the fused tile up to
    FUSED_MAX_N (FUSED_ADD_TUNED's, else several rows a program up to a 4 KiB tile,
    THREAD_BYTES of it a thread, as the plain op's rule for untuned widths); the sharded
    kernel beyond (FUSED_ADD_WIDE, or FUSED_ADD_WIDE_TUNED for the dtype and width, from
    the sweep; the rest a rule, not a table)."""
    n, element_size = check_width(n, element_size, "fused_add_config")
    block_n = triton.next_power_of_2(n)
    if block_n > FUSED_MAX_N[element_size]:
        # the entry for this dtype, else one for every dtype of the element size
        for key in (Width(element_size, block_n, dtype=dtype), Width(element_size, block_n)):
            if key in FUSED_ADD_WIDE_TUNED:
                return FUSED_ADD_WIDE_TUNED[key]
        return FUSED_ADD_WIDE[element_size]
    if split_ok and split_kernel_wins(n, element_size):
        return _split(n, element_size, FUSED_ADD_SPLIT_THREAD_BYTES)
    key = Width(element_size, block_n, n < block_n)
    return FUSED_ADD_TUNED.get(key) or formula_tile(block_n, element_size)


def fused_add_default_config(
    n: int,
    element_size: int,
    split_ok: bool = True,
    dtype: Optional[str] = None,
    *,
    rows: Optional[int] = None,
    sms: Optional[int] = None,
) -> Config:
    """The config the fused add launches: fused_add_config's (the throughput rule), and for
    `rows` fewer programs of its fused kernel than `sms` (both given: a real GPU) one row a
    program on FUSED_ADD_LATENCY_WARPS (or FUSED_ADD_LATENCY_THREAD_BYTES a thread), so a
    decode-sized call's rows spread over SMs and each thread's loads are short. The split
    and sharded kernels keep their configs (one row, or one shard, a program already)."""
    cfg = fused_add_config(n, element_size, split_ok, dtype)
    if rows is None or not sms or cfg.kernel != "fused" or triton.cdiv(rows, cfg.block_m) >= sms:
        return cfg
    row_bytes = cfg.block_n * element_size
    warps = FUSED_ADD_LATENCY_WARPS.get(Width(element_size, cfg.block_n, n < cfg.block_n))
    if warps is None:
        warps = max(1, min(32, row_bytes // (32 * FUSED_ADD_LATENCY_THREAD_BYTES)))
    return dataclasses.replace(cfg, block_m=1, num_warps=warps)


# ---- the sweep's search space ----------------------------------------------------------
#: Per-thread bytes of a fused or split tile kept in this range (16-byte loads, no spills;
#: below it only with one warp, for tiny rows); warps and rows a program from these sets.
SEARCH_WARPS = (1, 2, 4, 8, 16, 32)
SEARCH_ROWS = (1, 2, 4, 8, 16, 32, 64)
SEARCH_THREAD_BYTES = (16, 256)
#: The looped kernel from rows of SEARCH_LOOPED_MIN_N elements: chunks of these widths up to
#: the row's power of two, on these warps, SEARCH_LOOPED_THREAD_BYTES of a chunk's row a
#: thread; two rows a program for rows of at most SEARCH_LOOPED_ROWS2_MAX_N elements.
SEARCH_LOOPED_MIN_N = 2048
SEARCH_LOOPED_CHUNKS = (1024, 2048, 4096, 8192, 16384, 32768)
SEARCH_LOOPED_WARPS = (4, 8, 16, 32)
SEARCH_LOOPED_THREAD_BYTES = (8, 64)
SEARCH_LOOPED_ROWS2_MAX_N = 8192
#: The fused tile also past FUSED_MAX_N, to rows of this width: one row a program on these
#: warps (Liger's shape at 16-bit 32768).
SEARCH_WIDE_TILE_MAX_N = 32768
SEARCH_WIDE_TILE_WARPS = (16, 32)
#: The sharded kernel from rows of this width up, its programs waiting for their row's sum
#: (the last-arrival schedule lost at every wide shape: docs/notebook/06-wide-rows.md, v24):
#: shard widths and warps, the per-thread bytes of a shard in SEARCH_SHARD_THREAD_BYTES.
SEARCH_SHARDED_MIN_N = 16384
SEARCH_SHARDS = (2048, 4096, 8192, 16384)
SEARCH_SHARD_WARPS = (4, 8, 16)
SEARCH_SHARD_THREAD_BYTES = (16, 128)


def sharded_candidates(n: int, element_size: int) -> list[Config]:
    """The sharded kernel's candidates for rows of n elements (two shards or more)."""
    lo, hi = SEARCH_SHARD_THREAD_BYTES
    out = []
    if n < SEARCH_SHARDED_MIN_N:
        return out
    for shard in SEARCH_SHARDS:
        for warps in SEARCH_SHARD_WARPS:
            if shard < n and lo <= shard * element_size // (32 * warps) <= hi:
                for reload in (False, True):
                    cfg = Config("sharded", shard, warps, stream_y=True, wait=True, reload=reload)
                    out.append(cfg)
    return out


def looped_candidates(n: int, element_size: int) -> list[Config]:
    """The looped kernel's candidates for rows of n elements (either op)."""
    lo, hi = SEARCH_LOOPED_THREAD_BYTES
    out: list[Config] = []
    if n < SEARCH_LOOPED_MIN_N:
        return out
    for chunk in SEARCH_LOOPED_CHUNKS:
        for warps in SEARCH_LOOPED_WARPS:
            per_thread = chunk * element_size // (32 * warps)
            if chunk < 2 * n and lo <= per_thread <= hi:
                for rows in (1, 2) if n <= SEARCH_LOOPED_ROWS2_MAX_N else (1,):
                    out.append(Config("looped", chunk, warps, block_m=rows))
    return out


def _register_tiles(n: int, elem: int) -> list[Config]:
    """The fused tiles whose bytes of x a thread fit SEARCH_THREAD_BYTES, and the split
    kernel (its tile the aligned body) for rows that are not whole 16-byte vectors: the
    candidates that hold a row in registers, for rows up to FUSED_MAX_N."""
    lo, hi = SEARCH_THREAD_BYTES
    block_n = triton.next_power_of_2(n)
    out: list[Config] = []
    if block_n > FUSED_MAX_N[elem]:
        return out
    for rows in SEARCH_ROWS:
        for warps in SEARCH_WARPS:
            per_thread = rows * block_n * elem // (32 * warps)
            fits = per_thread <= hi and rows * block_n * elem <= 128 * 1024
            if fits and (per_thread >= lo or warps == 1):  # tiny rows: one warp
                out.append(_fused(block_n, rows, warps))
    if split_kernel_wins(n, elem):
        body = split_body(n, elem)
        for warps in SEARCH_WARPS:
            if body * elem // (32 * warps) >= lo or warps == 1:
                out.append(Config("split", body, warps))
    return out


def search_space(n: int, element_size: int, op: str = "rms_norm") -> list[Config]:
    """The candidates the sweep times for rows of n elements: fused tiles whose bytes a
    thread fit SEARCH_THREAD_BYTES, the split kernel (its tile the aligned body) for rows
    that are not whole 16-byte vectors, the looped kernel (looped_candidates) and the
    sharded kernel (sharded_candidates), and the fused tile on one row past FUSED_MAX_N to
    SEARCH_WIDE_TILE_MAX_N. op "fused_add_rms_norm": the fused add's rule's config first,
    then the same candidates."""
    n, element_size = check_width(n, element_size, "search_space")
    if op not in FORWARD_KERNELS:
        raise ValueError(f"search_space: op is {op!r}; expected 'rms_norm' or 'fused_add_rms_norm'")
    out = []
    block_n = triton.next_power_of_2(n)
    if op == "fused_add_rms_norm":
        out.append(fused_add_config(n, element_size))
    if FUSED_MAX_N[element_size] < block_n <= SEARCH_WIDE_TILE_MAX_N:
        out += [_fused(block_n, 1, w) for w in SEARCH_WIDE_TILE_WARPS]
    for cfg in (*_register_tiles(n, element_size), *looped_candidates(n, element_size),
                *sharded_candidates(n, element_size)):  # fmt: skip
        if cfg not in out:
            out.append(cfg)
    return out
