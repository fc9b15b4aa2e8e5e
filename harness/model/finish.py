"""A job's figures, one model record a variant. Each record carries, beside its block time:
- the profiler's kernel times of a block, and the norm's share f of them
  (harness.model.shares); the kernels counted are named in the record;
- s, the norm alone against native's (harness.model.alone), and the Amdahl bound
  1 / ((1 - f) + f / s) with native's f;
- the measured speedup against native (the median of the three interleaved blocks'
  ratios of medians, and their range), flagged when it exceeds the bound by more than that
  range, with the reasons the data give (the add fused, fewer launches, a host-bound
  block, the rest of the block changed);
- the same figures for the step, the residual add and the norm together, which is what a
  fused variant replaces: its bound counts the add.
"""

from __future__ import annotations

from typing import Any, Optional

from harness import timing
from harness.model.alone import _piece
from harness.model.config import BLOCK_OP, FUSED, HOST_BOUND_BUSY
from harness.model.shares import _speedup, _total, amdahl_bound, exceeds, norm_share, train_share
from harness.model.state import Piece, Run, ShapeState, _write_block


def _bounds(f: Optional[float], base: Optional[Piece], mine: Optional[Piece]) -> dict:
    """s cold and warm (base's time over mine's) and their Amdahl bounds with share f."""
    out: dict[str, Optional[float]] = {"s_cold": None, "s_warm": None}
    if base is not None and mine is not None:
        for how in ("cold", "warm"):
            a, m = getattr(base, f"{how}_us"), getattr(mine, f"{how}_us")
            out[f"s_{how}"] = a / m if a and m else None
    share = f is not None and 0.0 <= f <= 1.0  # above 1: the block's profile missed kernels
    for how in ("cold", "warm"):
        s = out[f"s_{how}"]
        out[f"bound_{how}"] = amdahl_bound(f, s) if share and s else None
    got = [b for b in (out["bound_cold"], out["bound_warm"]) if b is not None]
    out["bound"] = max(got) if got else None  # the more generous: a flag must survive both
    return out


def _finish(
    run: Run, st: ShapeState, mode: str, rows: dict, ready: dict, clk, block: str = BLOCK_OP
) -> None:
    """Shares, speedups, bounds, flags and reasons; one model record a variant."""
    family = "compile" if mode.startswith("compile") else "eager"
    for name, row in rows.items():
        n, us = _total(row["kernels"])
        row["kernel_us"], row["kernel_count"] = us, n
        row["median_us"] = timing.block_summary(row["blocks"])[1]["median_us"]
        norm_piece = _piece(st, family, "step" if name in FUSED else "norm", name)
        step_piece = _piece(st, family, "step", name)
        for what, p in (("norm", norm_piece), ("step", step_piece)):
            share = None
            if p and st.shape.train:
                share = train_share(row["kernels"], p.fwd_kernels, p.bwd_kernels)
                for part in (share["fwd"], share["bwd"]):
                    part["f"] = part["us"] / us if us else None
            elif p:
                share = norm_share(row["kernels"], p.kernels)
            if share:
                share["f"] = share["us"] / us if us else None
                if share["f"] is not None and share["f"] > 1:
                    share["note"] = "share above 1: the block's profile missed kernels; no bound"
            row[what] = share
    native = rows.get("native")
    for name, row in rows.items():
        m = _amdahl(st, family, name, row, native)
        per_block, stats, spr = timing.block_summary(row["blocks"])
        _write_block(
            run,
            st.shape,
            mode,
            name,
            status="PASS",
            block=block,
            correct=row["correct"],
            samples_us=[v for b in row["blocks"] for v in timing.to_us(b)],
            blocks=per_block,
            stats=stats,
            spread=spr,
            clocks=clk,
            compile_s=ready[name].compile_s,
            kernels={
                "names": sorted(row["kernels"]),
                "count": row["kernel_count"],
                "us": row["kernel_us"],
            },
            notes=[
                "one training step (forward + backward, no optimizer) a sample, L2 flushed "
                "before each"
                if st.shape.train
                else f"{st.shape.calls} back-to-back blocks a sample, L2 flushed before each",
                f"kernels profiled from {row['profiled']}",
            ],
            model=m,
        )
        where = st.shape.name if block == BLOCK_OP else f"{block} {st.shape.name}"
        run.say(_progress_line(where, mode, name, stats["median_us"], m))


def _amdahl(st: ShapeState, family: str, name: str, row: dict, native: Optional[dict]) -> dict:
    """The model fields of one variant's record: its own shares, s, the bounds with native's
    share, the measured speedup, the flags and the reasons for them."""
    m: dict[str, Any] = {
        "calls_per_sample": st.shape.calls,
        "kernel_us": row["kernel_us"],
        "kernel_count": row["kernel_count"],
        "device_busy": row["kernel_us"] / row["median_us"] if row["kernel_us"] else None,
        "norm": row["norm"],
        "step": row["step"],
        "rel_err": row["correct"]["rel_err"],
        "compiled": None,
    }
    if family == "compile":  # what proves it compiled: Inductor's kernels ran
        m["compiled"] = any(n.startswith("triton_") for n in row["kernels"])
    if native is None:
        m["why"] = ["native did not run in this mode: no speedup or bound"]
        return m
    base = "native"
    f = (native.get("norm") or {}).get("f")
    f_step = (native.get("step") or {}).get("f")
    view = _bounds(
        f,
        _piece(st, family, "norm", base),
        _piece(st, family, "step" if name in FUSED else "norm", name),
    )
    step = _bounds(f_step, _piece(st, family, "step", base), _piece(st, family, "step", name))
    sp = _speedup(native["blocks"], row["blocks"])
    m.update(f_native=f, f_native_step=f_step, **view, speedup=sp)
    m["step_bounds"] = step
    m["flag"] = bool(
        sp and view["bound"] and exceeds(sp["median"], sp["lo"], sp["hi"], view["bound"])
    )
    m["flag_step"] = bool(
        sp and step["bound"] and exceeds(sp["median"], sp["lo"], sp["hi"], step["bound"])
    )
    m["why"] = why_above(name, row, native, sp, step) if m["flag"] else []
    return m


def why_above(name: str, row: dict, native: dict, sp: dict, step: dict) -> list[str]:
    """What the data say about a speedup above its bound: the reasons found, or that none
    was."""
    why = []
    if name in FUSED:
        held = (
            "holds"
            if step["bound"] and sp["median"] - step["bound"] <= sp["hi"] - sp["lo"]
            else "is still exceeded"
        )
        bound = f"{step['bound']:.3f}" if step["bound"] else "unknown"
        why.append(
            "fusion of the add: the residual add runs inside the norm kernel, which the norm's "
            f"bound does not count; the step's bound, which does, is {bound} and {held}"
        )
    if row["kernel_count"] < native["kernel_count"]:
        why.append(
            f"fewer launches: {row['kernel_count']:g} kernels a block against native's "
            f"{native['kernel_count']:g}"
        )
    busy = native["kernel_us"] / native["median_us"] if native["kernel_us"] else 1.0
    if busy < HOST_BOUND_BUSY:
        why.append(
            f"native's block is host-bound (its kernels fill {busy:.0%} of its time): launch "
            "cost, not kernel time, sets it, and Amdahl's kernel-time bound does not see it"
        )
    norm_v = (row.get("norm") or {}).get("us") or 0.0
    norm_n = (native.get("norm") or {}).get("us") or 0.0
    rest_v, rest_n = row["kernel_us"] - norm_v, native["kernel_us"] - norm_n
    spread = sp["hi"] - sp["lo"]
    if rest_n > 0 and rest_v > 0 and (rest_n - rest_v) / rest_n > spread:
        why.append(
            f"the rest of the block's kernels took {1 - rest_v / rest_n:.1%} less device time "
            f"than native's ({rest_v:.0f} against {rest_n:.0f} us a block)"
        )
    if not why:
        why.append(
            "none found in the data (no fused add, no fewer launches, no host-bound native, "
            "the rest of the block unchanged): rerun before reading anything into it"
        )
    return why


def _progress_line(shape: str, mode: str, name: str, median_us: float, m: dict) -> str:
    norm = m.get("norm") or {}
    sp, f = m.get("speedup"), norm.get("f")
    text = f"{shape}/{mode}/{name}: {median_us:9.1f} us a block"
    if "fwd" in norm and f is not None:
        text += f", norm share {norm['fwd']['f']:.1%} fwd + {norm['bwd']['f']:.1%} bwd"
    elif f is not None:
        text += f", norm share {f:.1%}"
    if sp:
        text += f", x{sp['median']:.3f} [{sp['lo']:.3f}, {sp['hi']:.3f}] vs native"
    if m.get("bound"):
        text += f", bound {m['bound']:.3f}"
    return text + (" FLAG" if m.get("flag") else "")
