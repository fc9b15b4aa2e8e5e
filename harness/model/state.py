"""The GPU run's state: the run (bench, config, weights, variants, time budget), each
shape's inputs, truth (the fp32 block or step) and native's distance from it, the blocks
compiled for the shape dynamo holds; and a block's record (_write_block), what every job
writes.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

from harness import measure, records
from harness.model.block import (
    Inputs,
    Variant,
    Weights,
    agreement,
    block_fn,
    fp32_block,
    make_inputs,
)
from harness.model.config import BLOCK_OP, BlockConfig, Shape
from harness.model.train import (
    fp32_step,
    output_grads,
    train_agreement,
    train_inputs,
    train_step,
    train_weights,
)


@dataclass
class Piece:
    """One variant's norm or step alone at the in-block shape, in one family (at the train
    shape: its forward + backward, fn and kernels, and the two parts' kernels apart)."""

    fn: Optional[Callable[[], object]] = None
    kernels: dict = field(default_factory=dict)
    fwd_kernels: dict = field(default_factory=dict)
    bwd_kernels: dict = field(default_factory=dict)
    cold_us: Optional[float] = None
    warm_us: Optional[float] = None
    error: Optional[str] = None


@dataclass
class ShapeState:
    shape: Shape
    inputs: Inputs
    truth: tuple  # the fp32 block's outputs: what every variant and mode is checked on
    native_err: float  # native's eager bf16 block's distance from them
    pieces: dict = field(default_factory=dict)  # family -> {(what, variant): Piece}
    compiled: dict = field(default_factory=dict)  # variant -> (compiled fn, compile_s)
    piece_inputs: Optional[tuple] = None  # (x, residual, weight, eps) of the pieces
    # the train shape: the weights as leaves, the output gradients (of the block, of the
    # pieces) and native's errors on each of STEP_TENSORS
    weights: Optional[Weights] = None
    dys: tuple = ()
    piece_dys: tuple = ()
    native_errs: Optional[list] = None
    fp8: dict = field(default_factory=dict)  # scaling -> the FP8 block's weights (fp8.py)


@dataclass
class Run:
    b: measure.Bench
    cfg: BlockConfig
    weights: Weights
    variants: dict[str, Variant]
    t0: float
    budget_s: float
    seed: int
    states: dict = field(default_factory=dict)  # shape name -> ShapeState
    compile_shape: Optional[str] = None  # the shape dynamo's caches hold now
    failed: int = 0
    device: str = "cuda"  # where inputs are made (tests check the bookkeeping on "cpu")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self) -> bool:
        return self.elapsed() > self.budget_s

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():5.0f} s] {text}", flush=True)


def _sync_time(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def _state(run: Run, shape: Shape) -> ShapeState:
    if shape.name not in run.states:
        inputs = make_inputs(run.cfg, shape, run.device, run.seed)
        if shape.train:
            run.states[shape.name] = _train_state(run, shape, inputs)
            return run.states[shape.name]
        truth = fp32_block(run.cfg, run.weights, inputs.args())
        native = block_fn(run.cfg, run.weights, run.variants["native"].add_norm)
        err = agreement(native(*inputs.args()), truth)["rel_err"]
        run.states[shape.name] = ShapeState(shape, inputs, truth, err)
    return run.states[shape.name]


def _train_state(run: Run, shape: Shape, inputs: Inputs) -> ShapeState:
    """The train shape's state: the stream and weights as leaves, the output gradients, the
    fp32 step (truth) and native's eager step's errors from it."""
    w = train_weights(run.weights)
    dys = output_grads(run.cfg, shape, run.device, run.seed)
    truth = fp32_step(run.cfg, run.weights, inputs, dys)
    leaves = train_inputs(inputs)
    native = train_step(block_fn(run.cfg, w, run.variants["native"].add_norm), leaves, w, dys)
    errs = list(train_agreement(native(), truth)["errors"].values())
    return ShapeState(shape, leaves, truth, max(errs), weights=w, dys=dys, native_errs=errs)


def _compiled(run: Run, st: ShapeState, v: Variant) -> tuple[Callable, float]:
    """The variant's block compiled for this shape (fullgraph, dynamic=False), and the
    seconds its first call took. Dynamo is reset when the shape changes, so the recompile
    limit never silently sends a variant back to eager."""
    _enter_compile_shape(run, st)
    if v.name not in st.compiled:
        w = st.weights or run.weights
        fn = torch.compile(block_fn(run.cfg, w, v.add_norm, v.name), fullgraph=True, dynamic=False)
        # a training step's first call compiles the forward and AOTAutograd's backward
        first = (
            train_step(fn, st.inputs, w, st.dys)
            if st.shape.train
            else functools.partial(fn, *st.inputs.args())
        )
        if v.compile_pass:  # the pass installed while the first call compiles, then gone
            first = _with_pass(first, v.compile_pass)
        st.compiled[v.name] = (fn, _sync_time(first))
    return st.compiled[v.name]


def _with_pass(call: Callable, backend: str) -> Callable:
    """call with rmsnorm_api's compile fusion pass for backend installed while it runs."""
    import rmsnorm_api

    def passed():
        rmsnorm_api.enable_compile_fusion(backend)
        try:
            return call()
        finally:
            rmsnorm_api.disable_compile_fusion()

    return passed


def _enter_compile_shape(run: Run, st: ShapeState) -> None:
    if run.compile_shape != st.shape.name:
        torch._dynamo.reset()
        for other in run.states.values():  # reset invalidates what was compiled before
            other.compiled.clear()
            other.pieces.pop("compile", None)
        run.compile_shape = st.shape.name


def _write_block(
    run: Run,
    shape: Shape,
    mode: str,
    name: str,
    *,
    status: str,
    block: str = BLOCK_OP,
    correct: Optional[dict] = None,
    notes: Optional[list] = None,
    model: Optional[dict] = None,
    **fields,
) -> None:
    kind = "skip" if status == "SKIP" else "model"
    rec = records.make_record(
        run_id=run.b.run_id,
        env=run.b.env,
        kind=kind,
        op=block,
        impl=name,
        status=status,
        correct=correct,
        notes=notes or [],
        model={
            "block": block,
            "shape": shape.name,
            "exec": mode,
            "variant": name,
            "config": {**dataclasses.asdict(run.cfg), **dataclasses.asdict(shape)},
            **(model or {}),
        },
        dtype="bf16",
        shape=[shape.rows, run.cfg.hidden],
        sections=["model"],
        mode="cold",
        **fields,
    )
    run.b.writer.write(rec)


def _write_skip(run: Run, shape: Shape, mode: str, name: str, block: str, why: str) -> None:
    """A variant not run, and why: its SKIP record, said."""
    _write_block(run, shape, mode, name, status="SKIP", block=block, notes=[f"not run: {why}"])
    run.say(f"{block} {mode}/{name}: skip ({why})")


def _write_raised(
    run: Run, shape: Shape, mode: str, name: str, block: str, e: BaseException, note: str
) -> None:
    """A variant whose preparation raised e: counted, its FAIL record (e's first line), said."""
    run.failed += 1
    err = {"rel_err": None, "passed": False, "error": measure.first_line(e)}
    _write_block(run, shape, mode, name, status="FAIL", block=block, correct=err, notes=[note])
    run.say(f"{block} {mode}/{name}: FAIL {err['error']}")
