"""The types of the Triton kernels' launch configs: ``Config`` (one launch, typed and frozen)
and ``Width`` (the key of every tuned table). Apart from triton_impl.configs (the rules)
so that triton_impl.tuning (the tuned data, built of these) and the rules both import them
without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Union

from rmsnorm_api import MAX_N, as_int
from triton_impl.kernels import KERNEL_KINDS


def _pow2(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


@dataclass(frozen=True)
class Config:
    """One launch of a Triton kernel.

    kernel: "fused" (block_m rows of block_n >= N lanes a program), "split" (one row a
    program, block_n lanes of aligned body, scalar head and tail), "sharded" (a row's
    block_n-wide shards summed by one program each) or "looped" (block_m rows a program in
    block_n-wide chunks of a constant width, swept twice, nothing held through the sum);
    stages (sharded): the last-arrival schedule's loads in flight through shared memory
    (Triton's pipeliner), 1 for none; stream_y (sharded only): y stored evict_first (so
    y's lines do not take L2 from the x lines a re-read needs); wait (sharded only): each
    program waits for its row's sum and normalises its own shard (held, or with reload
    read again), else the last program of a row to arrive normalises the whole row from L2
    (the only schedule under the interpreter, whose programs run one after another);
    weight_first (rms_norm's fused kernel only): the weight loaded beside x, before the
    reduction, so that a decode-sized call waits on one L2 round trip, not two (the latency
    rule's configs); reload (sharded, waiting only): each program reads its shard again once
    its row's sum is complete (from L2, where it has just been: the wait's acquire
    invalidates L1) instead of holding it in registers through the wait, so that more
    programs share an SM.
    """

    kernel: str
    block_n: int
    num_warps: int
    block_m: int = 1
    stages: int = 1
    stream_y: bool = False
    wait: bool = False
    reload: bool = False
    weight_first: bool = False

    def __post_init__(self) -> None:
        where = "triton_impl Config"
        if self.kernel not in KERNEL_KINDS:
            raise ValueError(
                f"{where}: kernel is {self.kernel!r}; expected one of {sorted(KERNEL_KINDS)}"
            )
        # integers by the contract's rule (a NumPy integer too), kept as ints
        for name, lo in (("block_n", 1), ("num_warps", 1), ("block_m", 1), ("stages", 1)):
            object.__setattr__(self, name, as_int(getattr(self, name), name, where, lo))
        for name, hi in (("block_n", MAX_N), ("num_warps", 32), ("block_m", 1024)):
            v = getattr(self, name)
            if not (_pow2(v) and v <= hi):
                raise ValueError(f"{where}: {name} is {v!r}; expected a power of two in [1, {hi}]")
        if self.kernel not in ("fused", "looped") and self.block_m != 1:
            raise ValueError(
                f"{where}: block_m is {self.block_m}; only the fused and looped kernels have rows"
            )
        if self.stages > 1 and self.kernel != "sharded":
            raise ValueError(
                f"{where}: stages is {self.stages}; only the sharded kernel pipelines (1 for the"
                " others)"
            )
        for name, kernels in (
            ("stream_y", ("sharded",)),
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
        """Whether the tile holds a row of n elements (the looped and sharded kernels hold
        any row)."""
        vec = 16 // element_size
        need = {"fused": n, "split": n // vec * vec}
        return self.block_n >= need.get(self.kernel, 0)


@dataclass(frozen=True)
class Width:
    """The key of every tuned table (triton_impl.tuning): element size in bytes, the row's
    power-of-two tile, whether the row is narrower than it (padded: N < block_n), and, for
    an entry that serves one dtype only, that dtype's name ("bf16", "fp16" or "fp32", as
    rmsnorm_api.DTYPE_NAMES spells it; None: every dtype of the element size). Rows wider
    than the fused kernel's tile are looked up unpadded: one entry serves every width that
    rounds up to block_n."""

    element_size: int
    block_n: int
    padded: bool = False
    dtype: Optional[str] = None


def fused_config(block_n: int, block_m: int, warps: int) -> Config:
    """The fused kernel's config: block_m rows of block_n lanes a program on warps warps."""
    return Config("fused", block_n, warps, block_m=block_m)
