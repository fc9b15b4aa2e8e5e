"""Amdahl's law, the profiler's kernel times and the measured speedup: pure functions of
numbers.

The norm's share f of a block's kernel times: by name where the norm's kernels say what
they are (ours contain rms_norm; native's fused kernel is PyTorch's layer-norm kernel in RMS
mode, and the block has no LayerNorm; Inductor's carry rsqrt or mean, which nothing else in
the block computes), else twice the kernel time of the norm run alone at the in-block shape
(the eager composite: its mul, mean and cast kernels look like the block's others). In a
training step the norm's share is its forward kernels' plus its backward kernels' time in
the step, each found as the forward's are (by name, else from the norm alone). The Amdahl
bound is 1 / ((1 - f) + f / s); the measured speedup against native, the median of the
three interleaved blocks' ratios of medians, and their range.
"""

from __future__ import annotations

import functools
import re
from typing import Optional

from harness import timing


def amdahl_bound(f: float, s: float) -> float:
    """1 / ((1 - f) + f / s): the whole's speedup when a share f of its time speeds up s."""
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"amdahl_bound: f is {f}; expected a share in [0, 1]")
    if not s > 0:
        raise ValueError(f"amdahl_bound: s is {s}; expected a positive speedup")
    return 1.0 / ((1.0 - f) + f / s)


def exceeds(measured: float, lo: float, hi: float, bound: float) -> bool:
    """Whether a measured speedup is above its bound by more than its spread (hi - lo)."""
    return measured - bound > hi - lo


#: Names of a norm's kernels in this block: ours (rms_norm; the dweight reduction of our
#: backward, dw_reduce), PyTorch's fused F.rms_norm (its layer-norm kernels in RMS mode: the
#: vectorized one or the row-moments and forward pair; in the backward the input-gradient
#: kernel and the GammaBeta weight-gradient one, or the internal-gradients pair of older
#: versions; the block has no LayerNorm), and Inductor's
#: generated kernels that compute the norm's rsqrt or mean (nothing else in the block
#: does; such a kernel is counted whole, with whatever Inductor fused into it).
_NORM_NAME = re.compile(
    r"rms_?norm|layer_?norm|RowwiseMoments|GammaBeta|ComputeInternalGradients"
    r"|ComputeGradientFusedParams|dw_reduce",
    re.IGNORECASE,
)
_INDUCTOR_NORM = re.compile(r"^triton_\w*(rsqrt|mean)")
#: Which of a norm's kernels are its backward's: ours say bwd (or are the dweight
#: reduction), PyTorch's say grad or GammaBeta, Inductor's name their origin, the norm's
#: backward op (descriptive names: the ATen op each kernel came from).
_BACKWARD_NAME = re.compile(r"bwd|backward|grad|GammaBeta|dw_reduce", re.IGNORECASE)


def is_norm_kernel(name: str, part: Optional[str] = None) -> bool:
    """Whether a kernel is a norm's by name; part "forward" or "backward" keeps that part's
    (a backward kernel: _BACKWARD_NAME)."""
    if not (_NORM_NAME.search(name) or _INDUCTOR_NORM.search(name)):
        return False
    return part is None or bool(_BACKWARD_NAME.search(name)) == (part == "backward")


def _times(k: dict, per_block: int) -> dict:
    return {"count": per_block * k["count"], "us": per_block * k["us"]}


def norm_share(
    block_k: dict,
    piece_k: dict,
    per_block: int = 2,
    part: Optional[str] = None,
    mixed: bool = False,
) -> dict:
    """A piece's (the norm's, or the step's) device time in one block: {us, method,
    kernels (name -> count, us a block), note}.

    By name ("name") when every kernel the piece launches alone is a norm kernel by name (of
    ``part``, when given) and the block launches as many of them as ``per_block`` pieces
    would: the block's own times of those kernels. Else ("alone") ``per_block`` times the
    piece's kernel time run alone at the in-block shape, since its kernels' names
    (PyTorch's mul, mean, cast, add) are shared with other kernels of the block; then the
    kernels counted are the piece's. With ``mixed`` (the training step's rule), a piece
    whose norm kernels by name are found so, beside others, is counted both ways
    ("name+alone"): those from the block, the others ``per_block`` times alone (marked
    "alone")."""
    named = functools.partial(is_norm_kernel, part=part)
    in_block = {n: k for n, k in block_k.items() if named(n)}
    mine = {n: k for n, k in piece_k.items() if named(n)}
    others = {n: k for n, k in piece_k.items() if n not in mine}
    note = None
    if mine and (mixed or not others):
        want = per_block * sum(k["count"] for k in mine.values())
        got = sum(k["count"] for k in in_block.values())
        if abs(got - want) < 0.5:
            kernels = dict(in_block)
            kernels.update({n: {**_times(k, per_block), "alone": True} for n, k in others.items()})
            us = sum(k["us"] for k in kernels.values())
            method = "name+alone" if others else "name"
            return {"us": us, "method": method, "kernels": kernels, "note": None}
        what = "norm kernels" if part is None else f"norm {part} kernels"
        note = f"{got:g} {what} a block by name, not the {want:g} of {per_block} pieces"
    kernels = {n: _times(k, per_block) for n, k in piece_k.items()}
    us = sum(k["us"] for k in kernels.values())
    return {"us": us, "method": "alone", "kernels": kernels, "note": note}


def kernels_beyond(all_k: dict, fwd_k: dict) -> dict:
    """The kernels all_k launches beyond fwd_k's, by name (launches and device us less
    fwd_k's): a backward's kernels, from the profiles of a forward + backward and of the
    forward alone (a compiled backward cannot be run again on its own)."""
    out = {}
    for n, k in all_k.items():
        f = fwd_k.get(n, {"count": 0.0, "us": 0.0})
        if k["count"] - f["count"] > 0.5:
            out[n] = {"count": k["count"] - f["count"], "us": max(0.0, k["us"] - f["us"])}
    return out


def train_share(block_k: dict, fwd_k: dict, bwd_k: dict, per_block: int = 2) -> dict:
    """A piece's device time in one training step: its forward kernels' (norm_share of
    fwd_k, the forward part, mixed) plus its backward kernels' (of bwd_k, the backward
    part): {us, method ("forward's / backward's"), kernels (both, summed by name), note,
    fwd, bwd (each norm_share's answer)}."""
    fwd = norm_share(block_k, fwd_k, per_block, part="forward", mixed=True)
    bwd = norm_share(block_k, bwd_k, per_block, part="backward", mixed=True)
    kernels: dict[str, dict] = {}
    for n, k in [*fwd["kernels"].items(), *bwd["kernels"].items()]:
        if n in kernels:
            kernels[n] = {
                **k,
                "count": kernels[n]["count"] + k["count"],
                "us": kernels[n]["us"] + k["us"],
            }
        else:
            kernels[n] = dict(k)
    notes = [
        f"{part}: {s['note']}" for part, s in (("forward", fwd), ("backward", bwd)) if s["note"]
    ]
    return {
        "us": fwd["us"] + bwd["us"],
        "method": f"{fwd['method']} / {bwd['method']}",
        "kernels": kernels,
        "note": "; ".join(notes) or None,
        "fwd": fwd,
        "bwd": bwd,
    }


def _total(kernels: dict) -> tuple[float, float]:
    """(launches, device us) of a kernel_times dict."""
    return sum(k["count"] for k in kernels.values()), sum(k["us"] for k in kernels.values())


def _speedup(base: list, mine: list) -> Optional[dict]:
    """native's time over this variant's, block by block (block i of both ran in the same
    rotation): the median of the per-block ratios and their range, so the value lies in
    its range (the ratio of the pooled medians need not)."""
    if not base or not mine:
        return None
    return speedup_of_medians(
        [timing.quantile(b, 0.5) for b in base], [timing.quantile(m, 0.5) for m in mine]
    )


def speedup_of_medians(base: list[float], mine: list[float]) -> dict:
    """{"median", "lo", "hi"} of the per-block ratios base[i] / mine[i] of block medians."""
    per = [a / m for a, m in zip(base, mine, strict=True)]
    return {"median": timing.quantile(per, 0.5), "lo": min(per), "hi": max(per)}
