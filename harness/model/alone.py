"""The norm alone (s): each variant's norm, and its step (the residual add and the norm),
alone at the in-block shape against native's, cold (L2 flushed) and warm (CUDA-graph
replay, L2-resident), in the mode's family (the compile modes against the compiled native
norm); written as timing records. At the train shape a piece is its forward + backward,
profiled forward only and forward + backward (its backward kernels are those the second
launches beyond the first); s is then the norm's forward + backward alone against native's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Optional

import torch

from harness import measure, timing
from harness.measure import kernel_times
from harness.model.block import Variant
from harness.model.config import COMPILED_NORMS, PASS
from harness.model.shares import _total, kernels_beyond
from harness.model.state import Piece, Run, ShapeState, _enter_compile_shape
from harness.model.train import _forward, _step
from harness.ops import FUSED_ADD_RMS_NORM, RMS_NORM
from harness.plan import Planned
from harness.reference import (
    fused_add_rms_norm_grads_ref,
    fused_add_rms_norm_ref,
    grad_close,
    rms_norm_grads_ref,
    rms_norm_ref,
)
from rmsnorm_api.swap import VERIFY_TOL


def _piece_inputs(run: Run, st: ShapeState) -> tuple:
    """The norm's in-block inputs: a stream's rows, the residual, norm1's weight, eps."""
    if st.piece_inputs is not None:
        return st.piece_inputs
    g = torch.Generator(device=run.device).manual_seed(run.seed + 1 + st.shape.rows)
    like = st.inputs.x
    x = torch.randn(like.shape, generator=g, device=run.device).to(like.dtype)
    r = torch.randn(like.shape, generator=g, device=run.device).to(like.dtype)
    st.piece_inputs = (x, r, run.weights.norm1, run.cfg.eps)
    return st.piece_inputs


def _piece_fn(v: Variant, what: str, family: str, inputs: tuple) -> Callable[[], object]:
    x, r, w, eps = inputs
    fn, args = (v.norm, (x, w, eps)) if what == "norm" else (v.add_norm, (x, r, w, eps))
    if family == "compile":
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    return functools.partial(fn, *args)


def _piece_dys(run: Run, st: ShapeState) -> tuple:
    """The pieces' output gradients at the train shape: (dy, d_residual_out) ~ N(0, 1)."""
    if not st.piece_dys:
        g = torch.Generator(device=run.device).manual_seed(run.seed + 2 + st.shape.rows)
        like = st.inputs.x
        st.piece_dys = tuple(
            torch.randn(like.shape, generator=g, device=run.device).to(like.dtype) for _ in range(2)
        )
    return st.piece_dys


def _train_piece_fns(v: Variant, what: str, family: str, inputs: tuple, dys: tuple) -> tuple:
    """(forward, forward + backward) of a piece at the train shape: its x, residual and
    weight as leaves that require grad, the backward autograd's gradients of its outputs
    (dy; and d_residual_out for the step) with respect to them; the compile family's
    compiled (fullgraph), AOTAutograd's backward."""
    x, r, w, eps = inputs
    x, r, w = (t.detach().requires_grad_() for t in (x, r, w))
    if what == "norm":
        fn, args, wrt, grads = v.norm, (x, w, eps), (x, w), dys[:1]
    else:
        fn, args, wrt, grads = v.add_norm, (x, r, w, eps), (x, r, w), dys
    if family == "compile":
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    return functools.partial(_forward, fn, args), functools.partial(_step, fn, args, wrt, grads)


def _check_train_piece(what: str, out: tuple, inputs: tuple, dys: tuple) -> Optional[str]:
    """None if a piece's forward + backward computed the norm (or the step) and its
    gradients: the outputs as _check_piece, the gradients within harness.reference's
    gradient tolerance of its float64 gradients."""
    x, r, w, eps = inputs
    with torch.enable_grad():  # the references are autograd's, in float64
        if what == "norm":
            error = _check_piece(what, out[0], inputs)
            names, grads = ("dx", "dweight"), out[1:]
            refs = rms_norm_grads_ref(x, w, eps, dys[0])
        else:
            error = _check_piece(what, out[:2], inputs)
            names, grads = ("dx", "dresidual", "dweight"), out[2:]
            refs = fused_add_rms_norm_grads_ref(x, r, w, eps, dys[0], dys[1])
    if error:
        return error
    for name, got, want in zip(names, grads, refs, strict=True):
        if got is None:
            return f"no gradient for {name}"
        try:
            grad_close(got, want, name)
        except AssertionError as e:
            return f"not the norm's gradient: {str(e).splitlines()[0]}"
    return None


def _check_piece(what: str, out, inputs: tuple) -> Optional[str]:
    """None if a piece computed the norm (or the step): within two bf16 ulps of the
    reference (the composite rounds twice, as LlamaRMSNorm does)."""
    x, r, w, eps = inputs
    ref = rms_norm_ref(x, w, eps) if what == "norm" else fused_add_rms_norm_ref(x, r, w, eps)
    outs, refs = (out,) if what == "norm" else out, (ref,) if what == "norm" else ref
    for o, want in zip(outs, refs, strict=True):
        try:
            torch.testing.assert_close(o, want, **VERIFY_TOL[want.dtype])
        except AssertionError as e:
            return f"not the norm's output: {str(e).splitlines()[0]}"
    return None


def pieces(run: Run, st: ShapeState, family: str) -> dict:
    """{(what, variant): Piece}: each variant's norm ("norm"; not for the fused ones) and
    step ("step": the add and the norm) alone at the in-block shape, checked, profiled, then
    timed cold (variants interleaved, L2 flushed) and warm (CUDA-graph replay); written as
    timing records (op rms_norm or fused_add_rms_norm, section "model"). The compile family
    holds the norms torch.compile generates (COMPILED_NORMS); ours come from the eager one.
    At the train shape a piece is its forward + backward (_train_piece_fns), checked with
    its gradients, profiled forward + backward and forward alone (its backward's kernels:
    kernels_beyond), timed forward + backward."""
    if family in st.pieces:
        return st.pieces[family]
    if family == "compile":
        _enter_compile_shape(run, st)
    inputs = _piece_inputs(run, st)
    out: dict[tuple[str, str], Piece] = {}
    for v in run.variants.values():
        ours_compiled = family == "compile" and v.name not in COMPILED_NORMS
        if v.unavailable or v.compile_pass or ours_compiled:
            continue
        for what in ("step",) if v.fused else ("norm", "step"):
            p = out[(what, v.name)] = Piece()
            try:
                if st.shape.train:
                    dys = _piece_dys(run, st)
                    fwd, fn = _train_piece_fns(v, what, family, inputs, dys)
                    p.error = _check_train_piece(what, fn(), inputs, dys)
                else:
                    fn = _piece_fn(v, what, family, inputs)
                    p.error = _check_piece(what, fn(), inputs)
                if p.error is None:
                    p.fn, p.kernels = fn, kernel_times(fn, calls=3)
                    if st.shape.train:
                        p.fwd_kernels = kernel_times(fwd, calls=3)
                        p.bwd_kernels = kernels_beyond(p.kernels, p.fwd_kernels)
            except Exception as e:  # this piece's failure: its s is missing, nothing else
                p.error = measure.first_line(e)
            if p.error:
                run.say(f"{st.shape.name} {family} {what} alone, {v.name}: FAIL {p.error}")
    timed = {k: p for k, p in out.items() if p.fn is not None}
    fns = {f"{what}:{name}": p.fn for (what, name), p in timed.items()}
    try:
        timing.warm_up(list(fns.values()), timing.WARMUP_S)
        blocks, clk = measure.time_blocks(run.b, fns) if fns else ({}, None)
    except Exception as e:  # then no s in this family; the blocks are still timed
        run.say(f"{st.shape.name} {family} pieces: timing failed: {measure.first_line(e)}")
        for p in timed.values():
            p.fn, p.error = None, f"timing failed: {measure.first_line(e)}"
        timed = {}
    for (what, name), p in timed.items():
        p.cold_us = timing.block_summary(blocks[f"{what}:{name}"])[1]["median_us"]
        warm, err = timing.maybe(functools.partial(timing.graph_samples, p.fn))
        p.warm_us = timing.quantile(timing.to_us(warm), 0.5) if warm else None
        _write_piece(run, st, family, what, name, p, blocks[f"{what}:{name}"], warm, err, clk)
    st.pieces[family] = out
    return out


def _write_piece(run, st, family, what, name, p: Piece, blocks, warm, warm_err, clk) -> None:
    """A piece's cold and warm timings as the bench's timing records."""
    b = run.b
    b.op = RMS_NORM if what == "norm" else FUSED_ADD_RMS_NORM
    x, r, w, eps = _piece_inputs(run, st)
    op_inputs = (x, w, eps) if what == "norm" else (x, r, w, eps)
    base = measure.shape_fields(
        b, Planned("bf16", st.shape.rows, run.cfg.hidden, ["model"]), op_inputs
    )
    impl = name if family == "eager" else f"{name}@compile"
    n, us = _total(p.kernels)
    kernels = {"names": sorted(p.kernels), "count": n, "us": us}
    how = f"{what} alone at the {st.shape.name} block's rows"
    if st.shape.train:
        impl += "+bwd"
        base["bytes"] = train_bytes(what, op_inputs)
        base["small"] = base["bytes"] < b.small_bytes
        how = f"{what} forward + backward alone at the {st.shape.name} step's rows ({TRAIN_BYTES})"
    b.write(
        impl,
        mode="cold",
        status="PASS",
        correct={"passed": True, "error": None},
        **measure.cold_fields(b, blocks, base),
        kernels=kernels,
        clocks=clk,
        notes=[how, "L2 flushed before each repetition"],
        **base,
    )
    if warm:
        stats = timing.summarize(timing.to_us(warm))
        b.write(
            impl,
            mode="graph",
            status="PASS",
            correct={"passed": True, "error": None},
            samples_us=timing.to_us(warm),
            stats=stats,
            kernels=kernels,
            clocks=clk,
            notes=[how, "CUDA-graph replay of 20 back-to-back calls, L2 warm"],
            **base,
        )
    else:
        b.write(
            impl,
            mode="graph",
            status="SKIP",
            notes=[how, f"graph timing failed: {warm_err}"],
            **base,
        )


#: The bytes model of a piece's forward + backward (METHOD item 2), in words.
TRAIN_BYTES = (
    "bytes: forward + backward, 5 M N e for the norm (the forward reads x, writes y; the "
    "backward reads x and dy, writes dx), 9 M N e for the step (the fused add's 4, then the "
    "backward reads residual_out, dy and d_residual_out, writes dx and dresidual); the "
    "weight read twice and dweight written: 3 N e more"
)


def train_bytes(what: str, inputs: tuple) -> int:
    """A piece's forward + backward bytes (TRAIN_BYTES)."""
    x, w = inputs[0], inputs[-2]
    n = x.shape[-1]
    m_n, e = x.numel(), x.element_size()
    return (5 if what == "norm" else 9) * m_n * e + 3 * n * w.element_size()


def _piece(st: ShapeState, family: str, what: str, name: str) -> Optional[Piece]:
    """A piece in a family; ours are looked up in the eager family (their kernel is the same
    whether eager or compiled code launches it; a pass variant's are its fused variant's)."""
    name = PASS.get(name, name)
    if family == "compile" and name not in COMPILED_NORMS:
        family = "eager"
    p = st.pieces.get(family, {}).get((what, name))
    return p if p is not None and p.fn is not None else None
