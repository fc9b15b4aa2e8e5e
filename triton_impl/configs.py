"""Launch configs of the Triton RMSNorm kernels, as data.

- ``Config``: one launch, typed and frozen (which kernel, its tile, warps, programs an SM,
  pipeline stages); invalid fields raise ValueError naming the field.
- ``default_config(n, element_size, ...)``: the one rule the launcher, ``kernel_info``,
  the tests and the report use. Tuned tables below, keyed by named fields (``Width``), for
  the widths the sweep measured; a formula for the rest.
- ``search_space(n, element_size, op)``: the candidates ``python -m harness.sweep`` times.
- ``kernel_for(cfg, ...)``: the @triton.jit function and compile-time arguments of a config.

Tuning flows one way: the sweep's records (results/h200/sweep-*.jsonl) -> these tables ->
tests (every candidate computes the same function) -> the benchmark. Why each entry is what
it is, with the measurements: docs/PERF_NOTES.md.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass
from typing import Optional, Union

import triton

from rmsnorm_api import MAX_N
from triton_impl.kernels import FUSED_ADD_KERNELS, KERNELS

#: Widest power-of-two row the fused kernel keeps in registers, per element size in bytes.
FUSED_MAX_N = {4: 32768, 2: 16384}


def _pow2(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


@dataclass(frozen=True)
class Config:
    """One launch of a Triton kernel.

    kernel: "fused" (block_m rows of block_n >= N lanes a program), "split" (one row a
    program, block_n lanes of aligned body, scalar head and tail), "chunked" (rows walked in
    block_n-wide chunks, twice), "persistent" (programs walking whole rows, the next rows'
    loads in flight) or "sharded" (a row's block_n-wide shards summed by one program
    each); programs_per_sm: chunked and persistent programs an SM, 0 for one a row;
    stages: loads in flight through shared memory (Triton's pipeliner), 1 for none;
    reverse (chunked only): the second sweep from the row's end; stream_y (chunked,
    sharded): y stored evict_first (so y's lines do not take L2 from the x lines a second
    sweep re-reads); wait (sharded only): each program waits for its row's sum and
    normalises its own shard (held, or with reload read again), else the last program of a
    row to arrive normalises the whole row from L2 (the only schedule under the interpreter,
    whose programs run one after another); weight_first (rms_norm's fused kernel only): the
    weight loaded beside x, before the reduction, so that a decode-sized call waits on one
    L2 round trip, not two (the latency rule's configs); reload (sharded, waiting only):
    each program reads its shard again once its row's sum is complete (from L2, where it has
    just been: the wait's acquire invalidates L1) instead of holding it in registers through
    the wait, so that more programs share an SM.
    """

    kernel: str
    block_n: int
    num_warps: int
    block_m: int = 1
    programs_per_sm: int = 0
    stages: int = 1
    reverse: bool = False
    stream_y: bool = False
    wait: bool = False
    reload: bool = False
    weight_first: bool = False

    def __post_init__(self) -> None:
        where = "triton_impl Config"
        if self.kernel not in KERNELS:
            raise ValueError(
                f"{where}: kernel is {self.kernel!r}; expected one of {sorted(KERNELS)}"
            )
        for name, hi in (("block_n", MAX_N), ("num_warps", 32), ("block_m", 1024)):
            v = getattr(self, name)
            if not (_pow2(v) and v <= hi):
                raise ValueError(f"{where}: {name} is {v!r}; expected a power of two in [1, {hi}]")
        if self.kernel != "fused" and self.block_m != 1:
            raise ValueError(f"{where}: block_m is {self.block_m}; only the fused kernel has rows")
        if self.kernel == "sharded" and self.programs_per_sm:
            raise ValueError(
                f"{where}: programs_per_sm is {self.programs_per_sm}; the sharded kernel runs"
                " one program a shard (0)"
            )
        for name, lo in (("programs_per_sm", 0), ("stages", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{where}: {name} is {v!r}; expected an int >= {lo}")
        for name, kernels in (
            ("reverse", ("chunked",)),
            ("stream_y", ("chunked", "sharded")),
            ("wait", ("sharded",)),
            ("reload", ("sharded",)),
            ("weight_first", ("fused",)),
        ):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ValueError(f"{where}: {name} is {v!r}; expected a bool")
            if v and self.kernel not in kernels:
                have = " and ".join(kernels) + (" kernels have" if kernels[1:] else " kernel has")
                raise ValueError(f"{where}: {name} is set; only the {have} it")
        if self.reload and not self.wait:
            raise ValueError(
                f"{where}: reload is set without wait; only the waiting schedule has it"
            )

    def as_dict(self) -> dict:
        """The config as records and the sweep write it."""
        return asdict(self)

    @classmethod
    def of(cls, cfg: Union[Config, dict], where: str = "Config.of") -> Config:
        """A Config, from a Config or its as_dict() form (ValueError naming the function,
        what is off and the fields a Config has)."""
        if isinstance(cfg, cls):
            return cfg
        if not isinstance(cfg, dict):
            raise ValueError(f"{where}: cfg must be a Config or a dict, got {type(cfg).__name__}")
        fields = list(cls.__dataclass_fields__)
        unknown = set(cfg) - set(fields)
        if unknown:
            raise ValueError(
                f"{where}: cfg has unknown fields {sorted(unknown)}; a Config's fields are {fields}"
            )
        try:
            return cls(**cfg)
        except TypeError as e:  # a missing required field
            raise ValueError(f"{where}: cfg: {e}; a Config's fields are {fields}") from None

    @classmethod
    def forced(cls, cfg: Union[Config, dict], n: int, element_size: int, where: str) -> Config:
        """A forced config (Config.of) that holds a row of n elements, else ValueError."""
        cfg = cls.of(cfg, where)
        if not cfg.holds(n, element_size):
            raise ValueError(
                f"{where}: cfg's block_n = {cfg.block_n} is narrower than the row (N = {n}) for"
                f" the {cfg.kernel} kernel"
            )
        return cfg

    def holds(self, n: int, element_size: int) -> bool:
        """Whether the tile holds a row of n elements (the chunked and sharded kernels hold
        any row)."""
        vec = 16 // element_size
        need = {"fused": n, "persistent": n, "split": n // vec * vec}
        return self.block_n >= need.get(self.kernel, 0)


@dataclass(frozen=True)
class Width:
    """A tuned table's key: element size in bytes, the row's power-of-two tile, and whether
    the row is narrower than it (padded: N < block_n)."""

    element_size: int
    block_n: int
    padded: bool = False


def _fused(block_n: int, block_m: int, warps: int) -> Config:
    return Config("fused", block_n, warps, block_m=block_m)


#: The fused kernel's tile and warps per width the sweep measured (docs/PERF_NOTES.md).
FUSED_TUNED = {
    Width(2, 128): _fused(128, 16, 8),
    Width(2, 512): _fused(512, 4, 4),
    Width(2, 1024): _fused(1024, 2, 2),
    Width(2, 2048): _fused(2048, 1, 4),
    Width(2, 4096): _fused(4096, 4, 16),
    Width(2, 8192): _fused(8192, 2, 4),
    Width(2, 16384): _fused(16384, 1, 8),
    Width(2, 8192, padded=True): _fused(8192, 1, 4),
    Width(2, 16384, padded=True): _fused(16384, 1, 8),
    Width(4, 128): _fused(128, 8, 4),
    Width(4, 512): _fused(512, 2, 4),
    Width(4, 1024): _fused(1024, 1, 4),
    Width(4, 2048): _fused(2048, 1, 4),
    Width(4, 4096): _fused(4096, 2, 32),
    Width(4, 8192): _fused(8192, 1, 32),
    Width(4, 16384): _fused(16384, 2, 32),
    Width(4, 32768): _fused(32768, 1, 16),
    Width(4, 1024, padded=True): _fused(1024, 1, 1),
    Width(4, 8192, padded=True): _fused(8192, 4, 32),
    Width(4, 16384, padded=True): _fused(16384, 2, 32),
}
#: The sharded kernel's shipped configs per element size: each program waits for its row's
#: sum, then reads its shard again rather than holding it through the wait (PERF_NOTES v24,
#: v26).
SHARDED = {
    2: Config("sharded", 16384, 8, stream_y=True, wait=True, reload=True),
    4: Config("sharded", 8192, 16, stream_y=True, wait=True, reload=True),
}
#: Rows wider than FUSED_MAX_N per width (and widths up to it where the sweep measured these
#: ahead of the fused kernel): the chunked kernel where it still leads (16-bit 32768, fp32
#: 16384), with short chunks cut as torch.compile's looped reduction at fp32 2048 and 4096,
#: the sharded one from 65536; rows wider than the table's take SHARDED.
WIDE_TUNED = {
    Width(2, 32768): Config("chunked", 8192, 16),
    Width(2, 65536): SHARDED[2],
    Width(2, 131072): SHARDED[2],
    Width(4, 2048): Config("chunked", 1024, 8),
    Width(4, 4096): Config("chunked", 2048, 16),
    Width(4, 16384): Config("chunked", 4096, 32),
    Width(4, 65536): SHARDED[4],
    Width(4, 131072): SHARDED[4],
}
#: The persistent kernel where the sweep measured it ahead of the fused kernel.
PERSISTENT_TUNED = {
    Width(2, 16384, padded=True): Config("persistent", 16384, 16, programs_per_sm=1, stages=3),
}
#: Bytes of the tile a thread holds, for widths not in FUSED_TUNED and for the split kernel.
THREAD_BYTES = {2: 64, 4: 32}
#: Bytes of a row a thread holds for decode-sized calls (latency_config), and the most warps
#: a row takes there; rows of the fused kernel up to LATENCY_FIRST_MAX_BYTES (the widths
#: the decode probe measured: bf16 4096 and 8192) load the weight first, on at most
#: LATENCY_FIRST_MAX_WARPS warps.
LATENCY_THREAD_BYTES = 32
LATENCY_MAX_WARPS = 16
LATENCY_FIRST_MAX_BYTES = 16384
LATENCY_FIRST_MAX_WARPS = 8


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


@functools.cache
def throughput_config(n: int, element_size: int, split_ok: bool = True) -> Config:
    """The config for many rows of n elements of element_size bytes.

    - split_kernel_wins(n), when x's and y's rows share their 16-byte alignment
      (split_ok): the split kernel, its tile the aligned body;
    - rows up to FUSED_MAX_N: the fused kernel, tiles tuned per width (FUSED_TUNED), else
      several rows a program up to a 4 KiB tile and THREAD_BYTES of it a thread; the
      persistent kernel where PERSISTENT_TUNED names the width;
    - wider rows, and the widths WIDE_TUNED names: the chunked two-sweep kernel or the
      sharded one (WIDE_TUNED, else SHARDED).
    """
    check_width(n, element_size, "default_config")
    elem = element_size
    block_n = triton.next_power_of_2(n)
    if block_n > FUSED_MAX_N[elem]:
        return WIDE_TUNED.get(Width(elem, block_n)) or SHARDED[elem]
    if split_ok and split_kernel_wins(n, elem):
        return _split(n, elem, THREAD_BYTES[elem])
    key = Width(elem, block_n, n < block_n)
    for table in (WIDE_TUNED, PERSISTENT_TUNED):
        if key in table:
            return table[key]
    return fused_tile(n, elem)


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
    *,
    split_ok: bool = True,
    rows: Optional[int] = None,
    sms: Optional[int] = None,
) -> Config:
    """The config rms_norm launches for rows of n elements of element_size bytes: the
    throughput rule, and for `rows` fewer programs than `sms` (both given: a real GPU) the
    latency rule (rows the fused kernel holds start from its tile there, the chunked
    kernel's widths up to FUSED_MAX_N included). split_ok: x's and y's rows share their
    16-byte alignment."""
    cfg = throughput_config(n, element_size, split_ok)
    if rows is None or not sms:
        return cfg
    base = cfg
    if cfg.kernel == "chunked" and triton.next_power_of_2(n) <= FUSED_MAX_N[element_size]:
        base = fused_tile(n, element_size)
    if base.kernel not in ("chunked", "sharded") and triton.cdiv(rows, base.block_m) < sms:
        return latency_config(base, element_size)
    return cfg


def check_width(n: int, element_size: int, where: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n is {n!r}; expected an int in [1, {MAX_N}]")
    if element_size not in (2, 4):
        raise ValueError(f"{where}: element_size is {element_size!r}; expected 2 or 4")


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


def kernel_for(cfg: Config, element_size: int, has_weight: bool, n: int) -> tuple:
    """(kernel, meta) for a config and rows of n elements: the @triton.jit function and its
    compile-time arguments (constexprs and num_warps), shared by the launch and
    scripts/triton_ptx.py."""
    meta = dict(BLOCK_N=cfg.block_n, HAS_WEIGHT=has_weight, num_warps=cfg.num_warps)
    if cfg.kernel == "fused":
        meta.update(BLOCK_M=cfg.block_m, W_FIRST=cfg.weight_first)
    elif cfg.kernel == "split":
        meta["VEC"] = 16 // element_size
    elif cfg.kernel == "sharded":
        meta.update(_sharded_meta(cfg, n))
    else:  # chunked, persistent
        meta["STAGES"] = cfg.stages
        if cfg.kernel == "chunked":
            meta.update(REVERSE=cfg.reverse, STREAM_Y=cfg.stream_y)
    return KERNELS[cfg.kernel], meta


# ---- the fused residual add -------------------------------------------------------------
#: The fused add's rows wider than FUSED_MAX_N: the sharded kernel, its programs waiting for
#: their row's sum (PERF_NOTES v24).
FUSED_ADD_WIDE = {
    2: Config("sharded", 8192, 4, stream_y=True, wait=True),
    4: Config("sharded", 4096, 4, stream_y=True, wait=True),
}
#: Widths where one dtype's wide rows take another config, by (dtype name, power-of-two
#: width), for x and residual of that dtype: fp16 reads its shard again after the wait at
#: 65536 and 131072, where the held shard's registers leave it fewer programs an SM than
#: bf16 (PERF_NOTES v29).
FUSED_ADD_WIDE_TUNED = {
    ("fp16", 65536): dataclasses.replace(FUSED_ADD_WIDE[2], reload=True),
    ("fp16", 131072): dataclasses.replace(FUSED_ADD_WIDE[2], reload=True),
}


#: The fused add's fused tiles where its sweep measured one ahead of the formula's
#: (PERF_NOTES v36): fp32 12288 on 8 warps, more bytes a thread in flight than 32 warps hold.
FUSED_ADD_TUNED = {Width(4, 16384, padded=True): _fused(16384, 1, 8)}
#: Bytes of x's row a thread holds in the fused add's split kernel: the sweep's best at
#: 4095 / 4097 in every dtype (PERF_NOTES v36); twice the warps left loads waiting.
FUSED_ADD_SPLIT_THREAD_BYTES = 64


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
    check_width(n, element_size, "fused_add_config")
    block_n = triton.next_power_of_2(n)
    if block_n > FUSED_MAX_N[element_size]:
        return FUSED_ADD_WIDE_TUNED.get((dtype, block_n), FUSED_ADD_WIDE[element_size])
    if split_ok and split_kernel_wins(n, element_size):
        return _split(n, element_size, FUSED_ADD_SPLIT_THREAD_BYTES)
    key = Width(element_size, block_n, n < block_n)
    return FUSED_ADD_TUNED.get(key) or formula_tile(block_n, element_size)


#: The fused add's decode-sized calls (fewer programs than SMs): one row a program on these
#: warps for the widths the decode probe measured (bf16 4096 and 8192, PERF_NOTES v36), else
#: FUSED_ADD_LATENCY_THREAD_BYTES of x's row a thread (x's and the residual's both in
#: flight: half rms_norm's LATENCY_THREAD_BYTES), up to 32 warps.
FUSED_ADD_LATENCY_WARPS = {Width(2, 4096): 8, Width(2, 8192): 32}
FUSED_ADD_LATENCY_THREAD_BYTES = 16


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


def fused_add_kernel_for(
    cfg: Config, element_size: int, has_weight: bool, n: int, round_by_hand: bool = False
) -> tuple:
    """(kernel, meta) of the fused add for a config (fused, split or sharded
    kernel) and rows of n elements; round_by_hand: residual_out is bf16 and the kernel runs
    in the interpreter (kernels._round_to)."""
    if cfg.kernel not in FUSED_ADD_KERNELS:
        raise ValueError(
            f"fused add: no {cfg.kernel!r} kernel; expected one of {sorted(FUSED_ADD_KERNELS)}"
        )
    if cfg.weight_first:
        raise ValueError("fused add: weight_first is set; only rms_norm's fused kernel has it")
    meta = dict(BLOCK_N=cfg.block_n, HAS_WEIGHT=has_weight, num_warps=cfg.num_warps,
                ROUND_BY_HAND=round_by_hand)  # fmt: skip
    if cfg.kernel == "fused":
        meta["BLOCK_M"] = cfg.block_m
    elif cfg.kernel == "split":
        meta["VEC"] = 16 // element_size
    elif cfg.kernel == "sharded":
        meta.update(_sharded_meta(cfg, n))
    return FUSED_ADD_KERNELS[cfg.kernel], meta


# ---- the sweep's search space ----------------------------------------------------------
#: Per-thread bytes of a fused or split tile kept in this range (16-byte loads, no spills;
#: below it only with one warp, for tiny rows); warps and rows a program from these sets.
SEARCH_WARPS = (1, 2, 4, 8, 16, 32)
SEARCH_ROWS = (1, 2, 4, 8, 16, 32, 64)
SEARCH_THREAD_BYTES = (16, 256)
SEARCH_CHUNKS = (4096, 8192, 16384, 32768)
SEARCH_CHUNK_WARPS = (8, 16, 32)
SEARCH_PROGRAMS_PER_SM = (1, 2, 0)  # 0: one program a row
SEARCH_PERSISTENT_PER_SM = (1, 2, 4)
SEARCH_STAGES = (2, 3)
SEARCH_CHUNK_STAGES = (1, 2, 3)  # 1: one chunk at a time
#: Short chunks, as torch.compile's looped reductions cut a row (512 threads, 4-8 elements a
#: thread, one row a program): from rows of two such chunks up, one program a row.
SEARCH_SHORT_CHUNKS = (1024, 2048)
SEARCH_SHORT_CHUNK_WARPS = (4, 8, 16)
SEARCH_STAGED_BYTES = 160 * 1024  # rows in flight in shared memory, at most
#: The sharded kernel from rows of this width up, its programs waiting for their row's sum
#: (the last-arrival schedule lost at every wide shape: PERF_NOTES v24): shard widths and
#: warps, the per-thread bytes of a shard in SEARCH_SHARD_THREAD_BYTES.
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
    that are not whole 16-byte vectors, the persistent kernel where a row fits shared
    memory, the chunked kernel for rows of two or more chunks from 8192 elements up (its
    chunk loads pipelined 1-3 deep), and with short chunks for rows of two or more, and the
    sharded kernel (sharded_candidates). op "fused_add_rms_norm": the fused add's rule's
    config, the same fused tiles and split kernels, and the sharded kernel's candidates."""
    check_width(n, element_size, "search_space")
    if op == "fused_add_rms_norm":
        out = [fused_add_config(n, element_size)]
        out += [c for c in _register_tiles(n, element_size) if c not in out]
        return out + [c for c in sharded_candidates(n, element_size) if c not in out]
    if op != "rms_norm":
        raise ValueError(f"search_space: op is {op!r}; expected 'rms_norm' or 'fused_add_rms_norm'")
    elem = element_size
    lo, hi = SEARCH_THREAD_BYTES
    block_n = triton.next_power_of_2(n)
    out: list[Config] = _register_tiles(n, elem)
    if 1024 <= n and block_n * elem <= SEARCH_STAGED_BYTES:
        for warps in SEARCH_WARPS:
            per_thread = block_n * elem // (32 * warps)
            for per_sm in SEARCH_PERSISTENT_PER_SM:
                for stages in SEARCH_STAGES:
                    staged = (stages - 1) * block_n * elem * per_sm
                    if 32 <= per_thread <= hi and staged <= SEARCH_STAGED_BYTES:
                        out.append(Config("persistent", block_n, warps, programs_per_sm=per_sm,
                                          stages=stages))  # fmt: skip
    if n >= 8192:  # the chunked kernel also where the fused tile would be padded (12288)
        for chunk in SEARCH_CHUNKS:
            for warps in SEARCH_CHUNK_WARPS:
                for per_sm in SEARCH_PROGRAMS_PER_SM:
                    if not (chunk < n and lo <= chunk * elem // (32 * warps) <= hi):
                        continue
                    for stages in SEARCH_CHUNK_STAGES:
                        # shared memory: stages - 1 chunks in flight in each of two sweeps;
                        # pipelined only with one program an SM or one a row (sweep time)
                        staged = 2 * (stages - 1) * chunk * elem
                        if stages == 1 or (per_sm < 2 and staged <= SEARCH_STAGED_BYTES):
                            out.append(Config("chunked", chunk, warps, programs_per_sm=per_sm,
                                              stages=stages))  # fmt: skip
    for chunk in SEARCH_SHORT_CHUNKS:
        for warps in SEARCH_SHORT_CHUNK_WARPS:
            if 2 * chunk <= n and 4 <= chunk * elem // (32 * warps):
                out.append(Config("chunked", chunk, warps))
    out += [c for c in sharded_candidates(n, elem) if c not in out]
    # the shipped chunked config with each order of the second sweep and store of y
    shipped = throughput_config(n, elem, True)
    if shipped.kernel == "chunked":
        for reverse in (False, True):
            for stream_y in (False, True):
                cfg = dataclasses.replace(shipped, reverse=reverse, stream_y=stream_y)
                if cfg not in out:
                    out.append(cfg)
    return out
