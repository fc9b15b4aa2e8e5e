"""The report (model.md): a pure function of records, so any machine can redraw a GPU
run's table; its speedups and flags taken again from the records' block medians.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Optional

from harness import records
from harness.model.config import (
    BLOCK_OP,
    COMPILED_NORMS,
    FAMILIES,
    FP8_SCALINGS,
    LAYER_OP,
    MODES,
    PASS,
    SHAPE_NAMES,
    TRAIN_MODES,
    VARIANTS,
    Shape,
    family_op,
    fp8_op,
    pass_left,
    pass_not_applicable,
)
from harness.model.shares import exceeds, speedup_of_medians


def _redrawn_speedups(recs: list[dict]) -> list[dict]:
    """recs with each speedup taken again from the records' block medians (native's record
    of the same run, block, shape and mode beside the variant's), its flags with it: a
    record written when the value was the ratio of pooled medians reads as it would now.
    A flag the run did not raise has no reasons recorded, and says so."""
    native = {
        (r["run_id"], r["op"], tuple(r["shape"]), r["model"]["exec"]): r
        for r in recs
        if r["model"].get("variant") == "native" and r.get("blocks")
    }
    out = []
    for r in recs:
        m = r["model"]
        nat = native.get((r["run_id"], r["op"], tuple(r["shape"]), m.get("exec")))
        if not m.get("speedup") or nat is None or len(nat["blocks"]) != len(r.get("blocks") or []):
            out.append(r)
            continue
        sp = speedup_of_medians(
            [b["median_us"] for b in nat["blocks"]], [b["median_us"] for b in r["blocks"]]
        )
        m = {**m, "speedup": sp}
        for key, bound in (
            ("flag", m.get("bound")),
            ("flag_step", (m.get("step_bounds") or {}).get("bound")),
        ):
            was = m.get(key)
            m[key] = bool(bound and exceeds(sp["median"], sp["lo"], sp["hi"], bound))
            if key == "flag" and m[key] and not was:
                m["why"] = ["raised when redrawn from the records; the run recorded no reasons"]
        out.append({**r, "model": m})
    return out


def _applicable(r: dict) -> dict:
    """r, or for a PASS variant where the pass did not apply (pass_not_applicable: an eager
    mode; pass_left: a compiled record without the fused op's kernels, which timed the
    block without the pass) a SKIP saying so."""
    m = r["model"]
    if m.get("variant") not in PASS or r["status"] == "SKIP":
        return r
    why = pass_not_applicable(m.get("exec", ""))
    if not why:
        why = pass_left(r.get("kernels"), (m.get("config") or {}).get("train", False))
    if not why:
        return r
    return {**r, "status": "SKIP", "notes": [f"not run: {why}"]}


def short_kernel(name: str) -> str:
    """'void at::native::(anon)::vectorized_layer_norm_kernel<...>(...)' ->
    'vectorized_layer_norm_kernel': the function's own name."""
    name = re.sub(r"^void\s+", "", name)
    name = re.split(r"[<(]", name.replace("(anonymous namespace)", "anon"), maxsplit=1)[0]
    return name.split("::")[-1] or name


def _fmt(v: Optional[float], spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _norm_cell(norm: dict) -> str:
    return f"{_fmt(norm.get('f'), '.1%')} ({norm.get('method', '-')})"


def _row(r: dict, norm_cell: Callable[[dict], str] = _norm_cell) -> str:
    m = r["model"]
    if r["status"] != "PASS":
        why = (r.get("correct") or {}).get("error") or "; ".join(r["notes"]) or r["status"]
        return f"| {m['exec']} | {m['variant']} | {r['status']}: {why} |" + " |" * 8
    st = r["stats"]
    norm, step, sp = m.get("norm") or {}, m.get("step") or {}, m.get("speedup")
    speed = f"{sp['median']:.3f} [{sp['lo']:.3f}, {sp['hi']:.3f}]" if sp else "-"
    s = f"{_fmt(m.get('s_cold'))} / {_fmt(m.get('s_warm'))}"
    # compile's results mean something only where Inductor's kernels ran (METHOD 7)
    flag = " ".join(
        t
        for t, on in (("ABOVE", m.get("flag")), ("NOT-COMPILED", m.get("compiled") is False))
        if on
    )
    return (
        f"| {m['exec']} | {m['variant']} | {st['median_us']:.1f} ({st['p20_us']:.1f}-"
        f"{st['p80_us']:.1f}) | {100 * (r['spread'] or 0):.1f}% | {m['kernel_count']:g} | "
        f"{_fmt(m.get('device_busy'), '.0%')} | {norm_cell(norm)} | "
        f"{_fmt(step.get('f'), '.1%')} | {s} | "
        f"{_fmt(m.get('bound'))} | {speed} | {flag} |"
    )


_HEADER = (
    "| mode | variant | block us (p20-p80) | spread | kernels | busy | norm f (how) | "
    "step f | s cold / warm | bound | speedup vs native [range of blocks] | flag |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)
_TRAIN_HEADER = _HEADER.replace("block us", "step us").replace(
    "norm f (how)", "norm f: fwd + bwd = all (how)"
)


def _train_share(norm: dict) -> str:
    """A training step's norm f: forward's + backward's = all (forward's / backward's
    method)."""
    if "fwd" not in norm:
        return "-"
    fwd, bwd = norm["fwd"], norm["bwd"]
    return (
        f"{_fmt(fwd.get('f'), '.1%')} + {_fmt(bwd.get('f'), '.1%')} = "
        f"{_fmt(norm.get('f'), '.1%')} ({norm['method']})"
    )


def _train_row(r: dict) -> str:
    """A training step's row: the block's, its norm f split into forward and backward."""
    return _row(r, _train_share)


def _against_native(rows: list[dict], mode: str) -> Optional[str]:
    """The training step's target in one mode: each of ours against native, no slower
    where 1 is within its range or below it."""
    said = []
    for r in rows:
        m = r["model"]
        if m["exec"] != mode or r["status"] != "PASS" or m["variant"] in COMPILED_NORMS:
            continue
        sp = m.get("speedup")
        if not sp:
            continue
        verdict = "no slower" if sp["hi"] >= 1.0 else f"slower ({1 - sp['hi']:.1%} at best)"
        said.append(
            f"{m['variant']} x{sp['median']:.3f} [{sp['lo']:.3f}, {sp['hi']:.3f}]: {verdict}"
        )
    return f"{mode}, ours against native: " + "; ".join(said) + "." if said else None


def prepared(recs: list[dict]) -> list[dict]:
    """A run's model records as the report reads them: the latest of each, a pass variant
    that did not apply a SKIP, each speedup and flag taken again from the block medians."""
    return _redrawn_speedups([_applicable(r) for r in records.latest(recs) if r.get("model")])


def render(recs: list[dict]) -> str:
    """The model section as markdown, from a run's records (any machine can redraw it)."""
    recs = prepared(recs)
    if not recs:
        return "no model records in this file"
    env = recs[0]["env"]

    def sha_of(e: dict) -> str:
        return (e.get("git_sha") or "unknown")[:10] + ("-dirty" if e.get("git_dirty") else "")

    # a run split over calls (--append) may span commits: each is named
    sha = ", ".join(dict.fromkeys(sha_of(r["env"]) for r in recs))
    out = [
        "## The whole model: RMSNorm in a Llama-3-8B-shaped decoder block",
        "",
        f"{env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}, "
        f"transformers {env.get('transformers')}, git {sha}, "
        f"run {', '.join(sorted({r['run_id'] for r in recs}))}.",
        "",
        "Block time: the median (p20-p80) of samples of back-to-back blocks, L2 flushed "
        "before each sample, variants interleaved in three blocks; spread: of the block "
        "medians. busy: the profiler's kernel time over the block time (under 90%: "
        "host-bound). norm f: the norm's share of the block's kernel time (name: its "
        "kernels found by name in the block; alone: twice the norm run alone); step f: the "
        "same for the residual add and the norm. s: native's norm alone over this "
        "variant's at the in-block shape (a fused variant: its fused kernel), cold and "
        "warm. bound: 1 / ((1 - f) + f / s) with native's f and the better s. ABOVE: the "
        "speedup exceeds the bound by more than its range (the reasons below); speedup: "
        "native's block median over this variant's in each of the three interleaved "
        "blocks, their median [lowest, highest]; NOT-COMPILED: "
        "a compile mode's block ran none of Inductor's kernels.",
    ]
    if any(r["model"]["shape"] == "train" for r in recs):
        out += [
            "",
            "The training step (train): forward, then autograd's gradients of both outputs "
            "(fixed random output gradients) to the input and the weights, no optimizer; one "
            "step a sample. norm f: fwd + bwd = all, the norm's forward kernels' and "
            "backward kernels' share of the step's kernel time, each found by name in the "
            "step where the norm alone's are (name), else twice the norm alone's (alone); "
            "name+alone: the named ones from the step, the others the norm alone launches "
            "twice their time alone; the norm alone's backward kernels are those its forward "
            "+ backward launches beyond its forward. s: the norm's forward + backward alone.",
        ]
    layers = {
        family_op(f): f"transformers' {FAMILIES[f][0]}DecoderLayer, every norm swapped"
        for f in FAMILIES
    }
    if any(r["op"] in layers for r in recs):
        out += [
            "",
            "The family layers (Qwen3's and Gemma 3's, random weights at the block's sizes, "
            "every norm swapped: Qwen3's 4 and Gemma 3's 6, q_norm and k_norm on each head's "
            "rows among them): speedup is over the layer with its own norms (eager), block by "
            "block, not over native; no norm share or bound (the block's norm pieces are not "
            "this layer's).",
        ]
    fp8 = {fp8_op(s): f"the block in fp8, {s} activation scales" for s in FP8_SCALINGS}
    if any(r["op"] in fp8 for r in recs):
        out += [
            "",
            "The FP8 block (the block's four projections by torch._scaled_mm on e4m3 "
            "activations and weights, bf16 out; the activations quantised by a static scale "
            "calibrated once, or by a scale a token): native is the unfused model (the add, "
            "F.rms_norm, y in bf16, then quantised in PyTorch), ours the quantised fused add "
            "(y written in fp8 in the norm's pass). f and s from the pieces' kernel times "
            "alone (the add, the norm and the quantisation of norm1), in the mode's form. "
            "Eager native quantises in several PyTorch kernels (abs, max, divides, clamps, "
            "the cast) where a deployment runs one: the compiled rows are the fair baseline.",
        ]
    for block, title in (
        (BLOCK_OP, "the block"),
        (LAYER_OP, "transformers' LlamaDecoderLayer"),
        *layers.items(),
        *fp8.items(),
    ):
        for shape in SHAPE_NAMES:
            rows = [r for r in recs if r["op"] == block and r["model"]["shape"] == shape]
            if not rows:
                continue
            cfg = rows[0]["model"]["config"]
            dims = Shape(
                **{k: cfg[k] for k in ("name", "batch", "tokens", "kv_len", "calls")},
                train=cfg.get("train", False),
            )
            header, row = (_TRAIN_HEADER, _train_row) if dims.train else (_HEADER, _row)
            out += ["", f"### {title}, {shape} ({dims.describe()})", "", header]
            order = {v: i for i, v in enumerate(VARIANTS + ("all",))}
            mode_order = {m: i for i, m in enumerate(MODES)}
            rows.sort(
                key=lambda r: (
                    mode_order.get(r["model"]["exec"], 9),
                    order.get(r["model"]["variant"], 9),
                )
            )
            out += [row(r) for r in rows]
            said = [t for t in (_against_native(rows, m) for m in TRAIN_MODES) if t]
            if dims.train and said:
                out += ["", *said]
    flagged = [r for r in recs if r["status"] == "PASS" and r["model"].get("flag")]
    if flagged:
        out += ["", "Above the bound, and why:", ""]
        for r in flagged:
            m = r["model"]
            out.append(
                f"- {m['block']} {m['shape']} {m['exec']} {m['variant']}: "
                f"{m['speedup']['median']:.3f} against a bound of {m['bound']:.3f}: "
                + "; ".join(m.get("why") or [])
            )
    counted = [r for r in recs if r["status"] == "PASS" and (r["model"].get("norm") or {})]
    if counted:
        train = any("fwd" in r["model"]["norm"] for r in counted)
        apart = "; a training step's forward and backward apart, (alone): from the norm alone"
        out += [
            "",
            f"Norm kernels counted (a block: launches x, device us{apart if train else ''}):",
            "",
        ]
        for r in counted:
            m, norm = r["model"], r["model"]["norm"]
            where = f"{m['block']} {m['shape']} {m['exec']} {m['variant']}"
            if "fwd" in norm:
                parts = [
                    f"{p} ({norm[p]['method']}): {_kernel_list(norm[p])}" for p in ("fwd", "bwd")
                ]
                out.append(f"- {where}: " + "; ".join(parts))
            else:
                out.append(f"- {where} ({norm['method']}): {_kernel_list(norm)}")
    return "\n".join(out)


def _kernel_list(share: dict) -> str:
    return (
        ", ".join(
            f"{short_kernel(n)} x{k['count']:g} {k['us']:.1f}"
            + (" (alone)" if k.get("alone") else "")
            for n, k in sorted(share["kernels"].items())
        )
        or "none"
    )
