"""The GPU run: the (shape, mode) jobs in order (the compile modes last, so a spent time
budget drops them first), each job's failure recorded and the next one run; then model.md
rendered from the run's records.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from harness import measure, records
from harness.model.block import make_weights, variants
from harness.model.config import (
    BLOCK_OP,
    FAMILIES,
    FP8_SCALINGS,
    GPU_SHAPES,
    LAYER_OP,
    LLAMA3_8B,
    RECORDS_NAME,
    REPORT_NAME,
    TRAIN_MODES,
    family_op,
    fp8_op,
)
from harness.model.families import run_family_job
from harness.model.fp8 import run_fp8_job
from harness.model.job import run_job, run_layer_job
from harness.model.state import Run, _write_block
from harness.model.tables import render

#: The jobs of the transformers layer, each with the shape it runs at.
LAYER_JOBS = {"layer": "prefill", "layer_train": "train"}
#: The jobs of the family layers (Qwen3's, Gemma 3's: harness.model.families), at prefill,
#: in eager and compile modes.
FAMILY_JOBS = dict.fromkeys(FAMILIES, "prefill")
#: The FP8 block's jobs (harness.model.fp8), a scaling each, at prefill, in eager and
#: compile modes.
FP8_JOBS = {f"fp8_{s}": "prefill" for s in FP8_SCALINGS}


def _op_at(job: str) -> tuple[str, str]:
    """(records' op, shape name) of a job: the block's shapes, the Llama layer's jobs and
    the family layers'."""
    if job in LAYER_JOBS:
        return LAYER_OP, LAYER_JOBS[job]
    if job in FAMILY_JOBS:
        return family_op(job), FAMILY_JOBS[job]
    if job in FP8_JOBS:
        return fp8_op(job.removeprefix("fp8_")), FP8_JOBS[job]
    return BLOCK_OP, job


def applies(shape: str, mode: str) -> bool:
    """Whether a mode applies to a shape: the training step has no CUDA-graph modes."""
    return mode in TRAIN_MODES or not GPU_SHAPES[shape].train


def plan_jobs(shapes: list[str], modes: list[str], layer: bool) -> list[tuple[str, str]]:
    """(shape, mode) in the order they run: each shape's eager and graph modes (those that
    apply), the transformers layer (at prefill, and its training step at train, in eager
    mode), then the compile modes, whose compiles are the slow part: a spent budget drops
    them first."""
    jobs = [(s, m) for s in shapes for m in ("eager", "graph") if m in modes and applies(s, m)]
    if layer and "eager" in modes:
        jobs += [(job, "eager") for job, at in LAYER_JOBS.items() if at in shapes]
        jobs += [(job, "eager") for job, at in FAMILY_JOBS.items() if at in shapes]
    if "eager" in modes:
        jobs += [(job, "eager") for job, at in FP8_JOBS.items() if at in shapes]
    jobs += [
        (s, m) for s in shapes for m in ("compile", "compile_graph") if m in modes and applies(s, m)
    ]
    if layer and "compile" in modes:
        jobs += [(job, "compile") for job, at in FAMILY_JOBS.items() if at in shapes]
    if "compile" in modes:
        jobs += [(job, "compile") for job, at in FP8_JOBS.items() if at in shapes]
    return jobs


def not_applicable(shapes: list[str], modes: list[str]) -> list[str]:
    """The asked (shape, mode) pairs that do not apply, as shape/mode."""
    return [f"{s}/{m}" for s in shapes for m in modes if not applies(s, m)]


def run_gpu(args, out: Path) -> int:
    import traceback

    t0 = time.perf_counter()
    path = out / RECORDS_NAME
    b = measure.start(path, append=args.append, seed=args.seed)
    vs = variants()
    run = Run(
        b,
        LLAMA3_8B,
        make_weights(LLAMA3_8B, "cuda", args.seed),
        {n: vs[n] for n in args.variants},
        t0,
        args.budget_s,
        args.seed,
    )
    jobs = plan_jobs(args.shapes, args.modes, not args.no_layer)
    run.say(
        f"{len(jobs)} jobs ({', '.join(f'{s}/{m}' for s, m in jobs)}) x "
        f"{len(args.variants)} variants -> {path}"
    )
    if skipped := not_applicable(args.shapes, args.modes):
        run.say(f"not applicable (the training step has no CUDA-graph modes): {', '.join(skipped)}")
    with torch.no_grad():  # the training step's calls turn autograd on for themselves
        for i, (shape, mode) in enumerate(jobs):
            block, at = _op_at(shape)
            where = GPU_SHAPES[at]
            if run.over_budget():
                run.say(f"time budget of {args.budget_s:.0f} s spent: {len(jobs) - i} jobs not run")
                for s, m in jobs[i:]:
                    op, s_at = _op_at(s)
                    _write_block(
                        run,
                        GPU_SHAPES[s_at],
                        m,
                        "all",
                        status="SKIP",
                        block=op,
                        notes=["not run: time budget spent"],
                    )
                break
            run.say(f"{block} {where.name} ({where.describe()}), {mode} ...")
            try:
                if shape in LAYER_JOBS:
                    run_layer_job(run, args.variants, LAYER_JOBS[shape])
                elif shape in FAMILY_JOBS:
                    run_family_job(run, shape, where, mode, args.variants)
                elif shape in FP8_JOBS:
                    run_fp8_job(run, shape.removeprefix("fp8_"), where, mode, args.variants)
                else:
                    run_job(run, where, mode, args.variants)
            except Exception as e:  # one job's failure, recorded; the next job runs
                run.failed += 1
                traceback.print_exc()
                err = {"passed": False, "error": measure.first_line(e)}
                _write_block(
                    run,
                    where,
                    mode,
                    "all",
                    status="FAIL",
                    block=block,
                    correct=err,
                    notes=["the job raised; its variants' records may be missing"],
                )
                run.say(f"{block} {where.name} {mode}: FAILED: {err['error']}")
            torch.cuda.empty_cache()
    b.writer.close()
    recs = records.read_records(path)
    text = render(recs)
    (out / REPORT_NAME).write_text(text + "\n", encoding="utf-8")
    print(text)
    from harness.model import figure  # here: `python -m harness.model.figure` runs it alone

    drawn = figure.draw(recs, out)
    if drawn is not None:
        run.say(f"figure -> {drawn}")
    run.say(f"{b.writer.count} records -> {path}; report -> {out / REPORT_NAME}")
    return 1 if run.failed else 0
