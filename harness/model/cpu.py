"""Without a GPU: a tiny config runs each variant that runs on CPU (eager, native, and
triton, triton_fused under the Triton interpreter) through the same check, the training
step's gradients included, and the transformers layer swapped where transformers imports;
then prints the committed H200 table (results/h200/model/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from harness import measure, records
from harness.model.block import (
    Variant,
    Weights,
    _import,
    agreement,
    block_fn,
    fp32_block,
    make_inputs,
    make_weights,
    variants,
    why_not_on,
)
from harness.model.config import (
    COMMITTED,
    CPU_SHAPES,
    FAMILIES,
    GRAD_FACTOR,
    NATIVE_MAX,
    RECORDS_NAME,
    REPO,
    REPORT_NAME,
    TINY,
    TRUTH_FACTOR,
    BlockConfig,
    Shape,
)
from harness.model.families import check_family
from harness.model.fp8 import check_fp8
from harness.model.hf import layer_calls, layer_checks, layer_steps, layer_train_checks
from harness.model.tables import render
from harness.model.train import (
    fp32_step,
    is_forward_only,
    output_grads,
    train_agreement,
    train_inputs,
    train_step,
    train_weights,
)

#: Flags that only mean something on a GPU; without one they are named as ignored.
GPU_ONLY = {
    "--modes": "only the eager block runs without a GPU",
    "--budget-s": "the CPU check is not budgeted",
    "--out": "nothing is written without a GPU",
    "--append": "nothing is written without a GPU",
}


@torch.no_grad()
def check_blocks(shapes: list[str], names: list[str], seed: int, device: str = "cpu") -> list:
    """The tiny block of each shape with each variant that runs on device, against the fp32
    block (native's within NATIVE_MAX, the others within TRUTH_FACTOR of native's error; at
    train, the step's outputs and gradients: check_train_block):
    [{shape, variant, rel_err, limit, passed, error, skipped}]."""
    vs = variants()
    w = make_weights(TINY, device, seed)
    out = []
    for shape_name in shapes:
        shape = CPU_SHAPES[shape_name]
        if shape.train:
            out += check_train_block(shape, vs, w, names, seed, device)
            continue
        inputs = make_inputs(TINY, shape, device, seed)
        truth = fp32_block(TINY, w, inputs.args())
        native = agreement(block_fn(TINY, w, vs["native"].add_norm)(*inputs.args()), truth)
        for name in names:
            row = {"shape": shape_name, "variant": name, "skipped": why_not_on(vs[name], device)}
            if name == "native":
                row.update(native)
            elif row["skipped"] is None:
                try:
                    got = block_fn(TINY, w, vs[name].add_norm)(*inputs.args())
                    row.update(agreement(got, truth, native["rel_err"]))
                except Exception as e:
                    row.update(rel_err=None, limit=None, passed=False, error=measure.first_line(e))
            out.append(row)
    return out


def check_train_block(
    shape: Shape, vs: dict[str, Variant], w: Weights, names: list[str], seed: int, device: str
) -> list:
    """check_blocks' rows for a training step: each variant's outputs and gradients against
    the fp32 step (train_agreement; rel_err and limit of the tensor nearest its limit,
    worst). A backward refused as forward-only is a skip, with its message."""
    inputs = make_inputs(TINY, shape, device, seed)
    dys = output_grads(TINY, shape, device, seed)
    truth = fp32_step(TINY, w, inputs, dys)
    wt, leaves = train_weights(w), train_inputs(inputs)

    def step(name: str) -> tuple:
        return train_step(block_fn(TINY, wt, vs[name].add_norm), leaves, wt, dys)()

    native = train_agreement(step("native"), truth)
    out = []
    for name in names:
        row = {"shape": shape.name, "variant": name, "skipped": why_not_on(vs[name], device)}
        if name == "native":
            row.update(native)
        elif row["skipped"] is None:
            try:
                row.update(
                    train_agreement(step(name), truth, native=list(native["errors"].values()))
                )
            except Exception as e:
                if is_forward_only(e):
                    row["skipped"] = f"its backward is forward-only ({measure.first_line(e)})"
                else:
                    row.update(rel_err=None, limit=None, passed=False, error=measure.first_line(e))
        out.append(row)
    return out


@torch.no_grad()
def check_layer(
    names: list[str], seed: int, device: str = "cpu", shape: str = "prefill"
) -> tuple[Optional[str], dict]:
    """(why not, {variant: check}) for transformers' layer of the tiny config on device: its
    forward at prefill, its training step at train (layer_train_checks)."""
    tf, why = _import("transformers")
    if tf is None:
        return why, {}
    vs = {n: v for n, v in variants().items() if why_not_on(v, device) is None}
    w = make_weights(TINY, device, seed)
    at = CPU_SHAPES[shape]
    inputs = make_inputs(TINY, at, device, seed)
    hidden = train_inputs(inputs).x if at.train else inputs.x
    calls, skipped = layer_calls(tf, TINY, w, vs, [n for n in names if n in vs], hidden)
    if "native" not in calls:
        return skipped.get("native", "native did not build"), {}
    if at.train:
        dy = output_grads(TINY, at, device, seed)[0]
        return None, layer_train_checks(TINY, w, layer_steps(calls, dy))
    return None, layer_checks(TINY, w, calls)


def committed_text(where: Optional[Path] = None) -> str:
    """The committed H200 table (rendered from its records, else its report; COMMITTED
    unless where says), or a plain statement that there is none yet."""
    where = COMMITTED if where is None else where
    # a committed run's records are kept xz'd (read through lzma); a fresh run's, not yet
    # committed, are plain and shown first
    recs = next((r for r in (where / RECORDS_NAME, where / f"{RECORDS_NAME}.xz") if r.exists()),
                None)  # fmt: skip
    md = where / REPORT_NAME
    shown = where.relative_to(REPO) if where.is_relative_to(REPO) else where
    if recs is not None:
        return f"the committed H200 run ({shown / recs.name}):\n\n" + render(
            records.read_records(recs)
        )
    if md.exists():
        return f"the committed H200 report ({shown / REPORT_NAME}):\n\n" + md.read_text()
    return (
        f"no committed H200 model results yet ({shown / RECORDS_NAME}[.xz] does not exist): run "
        f"python -m harness.model --out {shown} on the H200 and commit it"
    )


#: How to install what the transformers layer's check needs, where it cannot run.
LAYER_EXTRA = "pip install -r requirements-model.txt"


def run_cpu(args) -> int:
    ignored = [f"{flag} ({why})" for flag, why in GPU_ONLY.items() if _given(args, flag)]
    if ignored:
        print(f"without a GPU these do not apply and are ignored: {'; '.join(ignored)}")
    print(
        f"no CUDA GPU: the tiny block ({_describe(TINY)}) with each variant that runs on "
        f"CPU, against the block in fp32 (native within {NATIVE_MAX:g}, the others within "
        f"{TRUTH_FACTOR:g}x native's error; the training step's gradients within "
        f"{GRAD_FACTOR:g}x native's on each, rel err and limit of the one nearest its limit)"
    )
    failed = 0
    with torch.no_grad():
        for row in check_blocks(args.shapes, args.variants, args.seed):
            where = f"block {row['shape']:<8} {row['variant']:<13}"
            if row["skipped"]:
                print(f"{where} skip: {row['skipped']}")
                continue
            failed += not row["passed"]
            print(f"{where} {_verdict(row)}")
        _, no_tf = _import("transformers")
        if args.no_layer:
            print("transformers layer: not checked (--no-layer)")
        elif no_tf:  # said once, not once a shape: no shape can check it
            print(f"transformers layer: not checked: {no_tf} ({LAYER_EXTRA})")
        else:
            for shape in ["prefill"] + [s for s in args.shapes if s == "train"]:
                why, checks = check_layer(args.variants, args.seed, shape=shape)
                if why:
                    print(f"transformers layer {shape}: not checked: {why}")
                for name, c in checks.items():
                    norm = "swapped to " + name if name != "eager" else "own norm"
                    failed += _said(f"layer {shape:<8} {norm:<17}", c, c.get("against"))
            failed += _check_families(args)
        failed += _check_fp8(args)
    print()
    print(committed_text())
    return 1 if failed else 0


def _check_families(args) -> int:
    """Qwen3's and Gemma 3's layers of the tiny sizes (harness.model.families), each norm
    swapped to each variant that runs here, against the fp32 layer of its own norms;
    returns the failures."""
    vs = {n: v for n, v in variants().items() if why_not_on(v, "cpu") is None}
    hidden = make_inputs(TINY, CPU_SHAPES["prefill"], "cpu", args.seed).x
    failed = 0
    for family in FAMILIES:
        why, checks = check_family(family, TINY, vs, [n for n in args.variants if n in vs], hidden)
        if why:
            print(f"{family} layer: not checked: {why}")
        for name, c in checks.items():
            norm = "swapped to " + name if name != "eager" else "own norms"
            failed += _said(f"layer {family:<8} {norm:<17}", c, "the layer in fp32")
    return failed


def _check_fp8(args) -> int:
    """The FP8 block of the tiny sizes (harness.model.fp8) at prefill, each scaling, each
    variant that runs here, against the bf16 block in fp32; returns the failures."""
    failed = 0
    if "prefill" not in args.shapes:
        return failed
    vs = {n: v for n, v in variants().items() if n in args.variants}
    for scaling, checks in check_fp8(TINY, vs, CPU_SHAPES["prefill"], args.seed).items():
        for name, c in checks.items():
            failed += _said(f"fp8 block {scaling:<6} {name:<13}", c, "the bf16 block in fp32")
    return failed


def _said(where: str, c: dict, against: str) -> int:
    """One check's line: its skip, or its verdict against what it was checked against;
    1 where it failed."""
    if "skipped" in c:
        print(f"{where} skip: {c['skipped']}")
        return 0
    print(f"{where} {_verdict(c)} (against {against})")
    return int(not c["passed"])


def _verdict(c: dict) -> str:
    err = "-" if c["rel_err"] is None else f"{c['rel_err']:.2e}"
    limit = "" if c.get("limit") is None else f" (limit {c['limit']:.2e})"
    if c.get("worst") and c.get("limit") is not None:
        limit = f" (limit {c['limit']:.2e}, {c['worst']})"
    return f"rel err {err}{limit} " + ("PASS" if c["passed"] else f"FAIL {c['error']}")


def _describe(cfg: BlockConfig) -> str:
    return (
        f"hidden {cfg.hidden}, {cfg.heads} heads / {cfg.kv_heads} kv heads of {cfg.head_dim}, "
        f"MLP {cfg.mlp}"
    )


def _given(args, flag: str) -> bool:
    if flag == "--modes":
        return args.modes_given
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    return value is not None and value is not False
