"""One job of the GPU run: a (shape, mode) of the block, or the transformers layer's.

Every (shape, mode, variant) is first checked: its outputs against the block computed in
fp32 from the same bf16 weights and inputs, as close to it as native's eager block within
TRUTH_FACTOR; a failure (or a crash, in any step) is recorded with its reason and not
timed, and the run goes on. The block's time: samples of K back-to-back blocks (K per
shape), L2 flushed before each sample, variants interleaved in three blocks
(harness.timing); a host-bound eager block so shows its launch cost, as in a model,
instead of a GPU that caught up once. Modes: eager; graph (CUDA-graph replay of the eager
block); compile (torch.compile fullgraph, dynamic=False, dynamo reset per shape);
compile_graph (the compiled block captured in a CUDA graph).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch

from harness import measure, timing
from harness.measure import kernel_times
from harness.model.alone import pieces
from harness.model.block import Variant, _import, agreement, block_fn
from harness.model.config import BLOCK_OP, GPU_SHAPES, LAYER_OP, Shape, pass_not_applicable
from harness.model.finish import _finish
from harness.model.hf import layer_calls, layer_checks, layer_steps, layer_train_checks
from harness.model.state import Run, ShapeState, _compiled, _state, _write_block
from harness.model.train import STEP_TENSORS, is_forward_only, train_agreement, train_step


@dataclass
class Ready:
    """A variant prepared in a mode: one block's call, its outputs, what it launches."""

    call: Callable[[], object]
    uncaptured: Callable[[], object]  # the same block without a graph (for the profiler)
    outputs: tuple
    compile_s: Optional[float]
    keep: Any = None  # the graph, alive while timed


def _prepare(run: Run, st: ShapeState, v: Variant, mode: str) -> Ready:
    args = st.inputs.args()
    compile_s = None
    if st.shape.train:  # a training step; its outputs are STEP_TENSORS
        if mode == "compile":
            block, compile_s = _compiled(run, st, v)
        else:
            block = block_fn(run.cfg, st.weights, v.add_norm)
        step = train_step(block, st.inputs, st.weights, st.dys)
        return Ready(step, step, step(), compile_s)
    if mode.startswith("compile"):
        compiled, compile_s = _compiled(run, st, v)
        fn = functools.partial(compiled, *args)
    else:
        fn = functools.partial(block_fn(run.cfg, run.weights, v.add_norm), *args)
    if not mode.endswith("graph"):
        return Ready(fn, fn, tuple(t.clone() for t in fn()), compile_s)
    held: dict[str, tuple] = {}

    def body() -> None:
        held["out"] = fn()

    graph = timing.capture(body)
    graph.replay()
    torch.cuda.synchronize()
    return Ready(graph.replay, fn, tuple(t.clone() for t in held["out"]), compile_s, graph)


def _repeat(call: Callable[[], object], k: int) -> Callable[[], None]:
    def calls() -> None:
        for _ in range(k):
            call()

    return calls


def _profile(r: Ready, k: int) -> tuple[dict, str]:
    """A block's kernels (kernel_times per block) and where they were seen: in the graph's
    replay where the profiler sees into graphs, else from the same block uncaptured. A
    profiler that fails leaves no kernels (so no share), never a failed variant."""
    why = None
    try:
        found = kernel_times(r.call, calls=k)
        if found or r.call is r.uncaptured:
            return found, "as timed"
        why = "the profiler saw no kernels in the graph replay"
    except Exception as e:
        why = f"profiling failed: {measure.first_line(e)}"
        if r.call is r.uncaptured:
            return {}, why
    try:
        return kernel_times(r.uncaptured, calls=k), f"uncaptured calls ({why})"
    except Exception as e:
        return {}, f"{why}; uncaptured too: {measure.first_line(e)}"


def run_job(run: Run, shape: Shape, mode: str, names: list[str]) -> None:
    """Prepare, check, profile and time every variant of one (shape, mode); write records.
    At the train shape a variant whose backward is refused as forward-only is a skip."""
    st = _state(run, shape)
    family = "compile" if mode.startswith("compile") else "eager"
    pieces(run, st, family)
    ready: dict[str, Ready] = {}
    rows: dict[str, dict] = {}
    for name in names:
        v = run.variants[name]
        where = f"{shape.name}/{mode}/{name}"
        why = v.unavailable
        if v.compile_pass and not why:
            why = pass_not_applicable(mode)
        if why:
            _write_block(run, st.shape, mode, name, status="SKIP", notes=[f"not run: {why}"])
            run.say(f"{where}: skip ({why})")
            continue
        if run.over_budget():
            _write_block(
                run, st.shape, mode, name, status="SKIP", notes=["not run: time budget spent"]
            )
            continue
        try:
            r = _prepare(run, st, v, mode)
            if shape.train:
                native_errs = None if name == "native" else st.native_errs
                correct = train_agreement(r.outputs, st.truth, STEP_TENSORS, native_errs)
                r.outputs = ()  # a step's gradients: the weights' size again
            else:
                native_err = None if name == "native" else st.native_err
                correct = agreement(r.outputs, st.truth, native_err)
            if correct["passed"]:
                kernels, seen = _profile(r, shape.calls)
        except Exception as e:  # this variant's failure, recorded; the others go on
            if shape.train and is_forward_only(e):
                why = f"not run: its backward is forward-only ({measure.first_line(e)})"
                _write_block(run, st.shape, mode, name, status="SKIP", notes=[why])
                run.say(f"{where}: skip ({why})")
                continue
            correct = {"rel_err": None, "passed": False, "error": measure.first_line(e)}
        if not correct["passed"]:
            run.failed += 1
            _write_block(run, st.shape, mode, name, status="FAIL", correct=correct)
            run.say(f"{where}: FAIL {correct['error']}")
            continue
        ready[name] = r
        rows[name] = {"correct": correct, "kernels": kernels, "profiled": seen}
    if not ready:
        return
    blocks, clk = _time_blocks(run, st, mode, ready)
    for name, per_block in blocks.items():
        rows[name]["blocks"] = per_block
    _finish(run, st, mode, {n: rows[n] for n in blocks}, {n: ready[n] for n in blocks}, clk)
    del ready
    torch.cuda.empty_cache()


def _time_blocks(
    run: Run, st: ShapeState, mode: str, ready: dict[str, Ready], block: str = BLOCK_OP
):
    """Warm up each variant (one that raises now is a failure), then the interleaved cold
    blocks of K back-to-back blocks a sample: {variant: blocks of seconds a block}."""
    k = st.shape.calls
    fns = {}
    for name, r in ready.items():
        try:
            timing.warm_up([_repeat(r.call, k)], timing.WARMUP_S / len(ready))
            fns[name] = _repeat(r.call, k)
        except Exception as e:
            run.failed += 1
            err = {"rel_err": None, "passed": False, "error": measure.first_line(e)}
            _write_block(
                run,
                st.shape,
                mode,
                name,
                status="FAIL",
                block=block,
                correct=err,
                notes=["raised in warm-up"],
            )
    if not fns:
        return {}, None
    blocks, clk = measure.time_blocks(run.b, fns)
    return {n: [[s / k for s in blk] for blk in bl] for n, bl in blocks.items()}, clk


def profiled(
    run: Run, shape: Shape, mode: str, name: str, op: str, call: Callable, correct: dict
) -> Optional[dict]:
    """A checked layer call's kernels (the profiler's, two calls), or None where its check
    failed or the profiled calls raised: then its FAIL record is written."""
    if correct["passed"]:
        try:
            return kernel_times(call, calls=2)
        except Exception as e:
            correct = {**correct, "passed": False, "error": measure.first_line(e)}
    run.failed += 1
    _write_block(run, shape, mode, name, status="FAIL", block=op, correct=correct)
    run.say(f"{op} {shape.name} {mode}/{name}: FAIL {correct['error']}")
    return None


def run_layer_job(run: Run, names: list[str], shape: str = "prefill") -> None:
    """transformers' LlamaDecoderLayer at prefill (or its training step at train), each
    variant checked (against the native-swapped layer, which is checked against the block),
    profiled and timed interleaved; shares and bounds as the block's, from the block's
    pieces."""
    st = _state(run, GPU_SHAPES[shape])
    tf, why = _import("transformers")
    if tf is None:
        _write_block(
            run, st.shape, "eager", "all", status="SKIP", block=LAYER_OP, notes=[f"not run: {why}"]
        )
        run.say(f"{LAYER_OP}: skip ({why})")
        return
    pieces(run, st, "eager")
    calls, skipped = layer_calls(tf, run.cfg, run.weights, run.variants, names, st.inputs.x)
    for name, reason in skipped.items():
        _write_block(
            run,
            st.shape,
            "eager",
            name,
            status="SKIP",
            block=LAYER_OP,
            notes=[f"not run: {reason}"],
        )
    if "native" not in calls:
        return
    if st.shape.train:
        calls = layer_steps(calls, st.dys[0])
        checks = layer_train_checks(run.cfg, run.weights, calls)
    else:
        checks = layer_checks(run.cfg, run.weights, calls)
    ready, rows = {}, {}
    for name, call in calls.items():
        correct = checks[name]
        if "skipped" in correct:
            why = f"not run: {correct['skipped']}"
            _write_block(run, st.shape, "eager", name, status="SKIP", block=LAYER_OP, notes=[why])
            run.say(f"{LAYER_OP} {st.shape.name}/{name}: skip ({why})")
            continue
        kernels = profiled(run, st.shape, "eager", name, LAYER_OP, call, correct)
        if kernels is None:
            continue
        ready[name] = Ready(call, call, (), None)
        rows[name] = {"correct": correct, "kernels": kernels, "profiled": "as timed"}
    if ready:
        blocks, clk = _time_blocks(run, st, "eager", ready, LAYER_OP)
        rows = {n: {**rows[n], "blocks": blocks[n]} for n in blocks}
        _finish(run, st, "eager", rows, ready, clk, LAYER_OP)
