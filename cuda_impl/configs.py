"""Launch configs of the CUDA RMSNorm kernel, as data (mirrored from the C++ table).

The tables themselves are data in csrc/tuning/<op>.inc (one table of ladder rungs an op;
the shipped configs are the ones the rungs name, and a sweep build adds the sweep-only
candidates), compiled by csrc/forward_table.h. Here they are read back, typed:

- ``Config``: one launch (threads a row, 16-byte vectors a thread, CTAs a cluster sharing a
  row, kernel variant bits), frozen;
- ``compiled_configs(op)``: every compiled config of an op (rms_norm, fused_add_rms_norm),
  and whether it ships (is on a ladder);
- ``default_config(n, element_size, op)``: the C++ ladder's own choice for many rows;
- ``search_space(n, element_size, op)``: the candidates ``python -m harness.sweep`` times.
Why each rung is what it is, with the measurements: docs/notebook/01-why-the-defaults.md.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from rmsnorm_api import as_int, check_width


@functools.cache
def variant_bits() -> dict[str, int]:
    """The bits of a config's ``variant`` by name (plain_loads, lean_regs, late_weight,
    row_chunks, whole_vectors, staged_row), read from the library: csrc/forward_table.h is
    their one definition, with what each does."""
    names = torch.ops.cuda_impl.forward_variants()
    return {name: 1 << i for i, name in enumerate(names) if name}


#: CTAs a cluster may hold: the portable 8, and the non-portable 16 of a staged row's.
MAX_CLUSTER = 8
MAX_STAGED_CLUSTER = 16


def max_cluster(variant: int) -> int:
    """The most CTAs a cluster of a config with this variant may have."""
    return MAX_STAGED_CLUSTER if variant & variant_bits()["staged_row"] else MAX_CLUSTER


@dataclass(frozen=True)
class Config:
    """One launch of the CUDA kernel: row_threads threads own a row, each holding vpt
    16-byte vectors of it; cluster CTAs of row_threads threads share the row (1: no
    cluster); variant: variant_bits() bits."""

    row_threads: int
    vpt: int
    cluster: int = 1
    variant: int = 0

    def __post_init__(self) -> None:
        # integers by the contract's rule (a NumPy integer too); whether the library
        # compiled such a config is the op's to say, at the call
        for name, lo in (("row_threads", 1), ("vpt", 1), ("cluster", 1), ("variant", 0)):
            object.__setattr__(
                self, name, as_int(getattr(self, name), name, "cuda_impl Config", lo)
            )

    def as_dict(self) -> dict:
        return asdict(self)

    def holds(self, n: int, element_size: int) -> bool:
        """Whether the config holds a row of n elements' 16-byte vectors (a row-chunk
        config walks a row of any width)."""
        if self.variant & variant_bits()["row_chunks"]:
            return True
        return self.row_threads * self.vpt * self.cluster >= n * element_size // 16


@dataclass(frozen=True)
class Compiled:
    """A config the library was built with: shape (cluster: whether CTAs share the row,
    as many as the row needs), variant, and whether it ships (is on a ladder)."""

    row_threads: int
    vpt: int
    cluster: bool
    variant: int
    shipped: bool


#: The ops with a rung table of their own: the C++ functions listing its configs and
#: giving its default rule's choice.
OPS = {
    "rms_norm": ("rms_norm_configs", "rms_norm_default_config"),
    "fused_add_rms_norm": ("fused_add_configs", "fused_add_default_config"),
}


def _table_fn(op: str, which: int, caller: str):
    if op not in OPS:
        raise ValueError(f"cuda_impl.{caller}: op is {op!r}; expected one of {sorted(OPS)}")
    return getattr(torch.ops.cuda_impl, OPS[op][which])


def compiled_configs(op: str = "rms_norm") -> list[Compiled]:
    """Every compiled config of op, the shipped ones first. The fused add compiles a shipped
    config only for the dtypes whose ladders name it (its with-config entry point says so
    for the others); sweep-only configs are compiled for every dtype."""
    flat = _table_fn(op, 0, "compiled_configs")()
    rows = (flat[i : i + 5] for i in range(0, len(flat), 5))
    return [Compiled(rt, vpt, bool(cl), var, bool(shipped)) for rt, vpt, cl, shipped, var in rows]


def sweep_build() -> bool:
    """Whether this library was built with the sweep-only configs (RMSNORM_SWEEP_CONFIGS=1)."""
    return not all(c.shipped for c in compiled_configs())


def default_config(
    n: int, element_size: int, op: str = "rms_norm", *, dtype: Optional[str] = None
) -> Config:
    """The config op picks for many rows of n elements of element_size bytes, laid out as
    a contiguous, 16-byte aligned tensor has them, on a GPU with thread-block clusters (the
    C++ ladder itself, so sweeps compare against exactly what runs on the H200; a GPU
    without clusters runs one-CTA configs instead; ValueError for a width or element size
    no kernel takes).
    dtype, x's name, as triton_impl's rule takes it: the CUDA ladders key on element size
    alone."""
    n, element_size = check_width(n, element_size, "default_config")
    rt, vpt, ranks, variant = _table_fn(op, 1, "default_config")(n, element_size)
    return Config(rt, vpt, ranks, variant)


def search_space(n: int, element_size: int, op: str = "rms_norm") -> list[Config]:
    """Compiled configs of op that hold the row with at most 4x spare capacity (clusters:
    the fewest CTAs that hold it, and twice that; row-chunk configs: a chunk at most 4x the
    row), the sweep-only ones included when built."""
    n, element_size = check_width(n, element_size, "search_space")
    vecs = max(1, n * element_size // 16)
    out = []
    for c in compiled_configs(op):
        per_cta = c.row_threads * c.vpt
        one = Config(c.row_threads, c.vpt, 1, c.variant)
        if c.cluster:
            most = max_cluster(c.variant)
            ranks = 2
            while ranks * per_cta < vecs and ranks < most:
                ranks *= 2
            for r in sorted({ranks, min(most, 2 * ranks)}):
                if r * per_cta >= vecs:
                    out.append(Config(c.row_threads, c.vpt, r, c.variant))
        elif one.holds(n, element_size) and per_cta <= 4 * max(vecs, 8):
            out.append(one)
    return out
