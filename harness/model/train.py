"""The training step (shape train): the block's forward, then autograd's gradients of its
two outputs, given fixed random output gradients (N(0, 1), bf16), with respect to its input
(x and residual) and its six weights; no loss reduction, no optimizer. Modes eager and
compile (the forward compiled fullgraph, AOTAutograd's backward); the CUDA-graph modes do
not apply. Checked as the block is, on the outputs (TRUTH_FACTOR) and on all eight
gradients (GRAD_FACTOR of native's error on the same tensor), against the step in fp32.
Ours must be differentiable: a backward that raises "forward-only" is a skip, with its
message.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Optional

import torch

from harness.model.block import Inputs, Weights, block_fn, rel_err, unfused
from harness.model.config import GRAD_FACTOR, NATIVE_MAX, TRUTH_FACTOR, BlockConfig, Shape
from harness.reference import rms_norm_ref

#: What a training step of the block returns: its two outputs, then the gradients with
#: respect to its input and its weights (in Weights' order).
STEP_TENSORS = ("out", "residual", "d x", "d residual") + tuple(
    f"d {f.name}" for f in dataclasses.fields(Weights)
)


def train_weights(w: Weights) -> Weights:
    """The weights as leaves that require grad (sharing w's storage)."""
    return Weights(**{k: t.detach().requires_grad_() for k, t in vars(w).items()})


def train_inputs(inputs: Inputs) -> Inputs:
    """The inputs with the stream (x, residual) as leaves that require grad."""
    x, r = (t.detach().requires_grad_() for t in (inputs.x, inputs.residual))
    return Inputs(x, r, inputs.cos, inputs.sin)


def output_grads(cfg: BlockConfig, shape: Shape, device, seed: int) -> tuple:
    """The fixed gradients of a step's two outputs (out, residual): N(0, 1), bf16, seeded
    apart from the inputs. The same step as the backward of the loss sum(out * d_out +
    residual * d_residual)."""
    g = torch.Generator(device=device).manual_seed(seed + 104729 + shape.rows)
    size = (shape.batch, shape.tokens, cfg.hidden)
    return tuple(
        torch.randn(size, generator=g, device=device, dtype=torch.float32).bfloat16()
        for _ in range(2)
    )


def _forward(fn: Callable, args: tuple):
    """fn's forward with autograd recording (what a training step's forward launches)."""
    with torch.enable_grad():
        return fn(*args)


def _step(fn: Callable, args: tuple, wrt: tuple, dys: tuple) -> tuple:
    """One training step without the optimizer: fn's forward, then autograd's gradients of
    its outputs (given dys) with respect to wrt; returns the outputs, then the gradients
    (None for one the outputs do not depend on)."""
    with torch.enable_grad():
        outs = fn(*args)
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        grads = torch.autograd.grad(outs, wrt, dys, allow_unused=True)
    return (*(o.detach() for o in outs), *grads)


def train_step(fn: Callable, inputs: Inputs, w: Weights, dys: tuple) -> Callable[[], tuple]:
    """The block's training step as a call: fn (the block, eager or compiled) on inputs
    whose stream requires grad, the gradients with respect to (x, residual, the weights of
    w); returns STEP_TENSORS."""
    args = (inputs.x, inputs.residual, inputs.cos, inputs.sin)
    return functools.partial(_step, fn, args, (inputs.x, inputs.residual, *vars(w).values()), dys)


def fp32_step(cfg: BlockConfig, w: Weights, inputs: Inputs, dys: tuple) -> tuple:
    """The training step in fp32 (the bf16 weights, inputs and output gradients upcast, the
    reference norm): what every bf16 step is measured against."""
    w32 = train_weights(Weights(**{k: t.float() for k, t in vars(w).items()}))
    up = Inputs(*(t.float() for t in (inputs.x, inputs.residual, inputs.cos, inputs.sin)))
    fn = block_fn(cfg, w32, unfused(rms_norm_ref))
    return train_step(fn, train_inputs(up), w32, tuple(d.float() for d in dys))()


def train_agreement(
    got: tuple, truth: tuple, names: tuple = STEP_TENSORS, native: Optional[list] = None
) -> dict:
    """{rel_err, limit, worst, errors, passed, error}: each tensor's relative L2 error from
    the fp32 step's (errors, in names' order), within its limit: NATIVE_MAX where native
    (native's errors on the same tensors) is None, else TRUTH_FACTOR (the outputs) or
    GRAD_FACTOR (the gradients) times native's; rel_err and limit are those of the tensor
    nearest its limit (worst). A missing gradient fails."""
    errs, limits = [], []
    for i, (name, g, t) in enumerate(zip(names, got, truth, strict=True)):
        errs.append(math.inf if g is None else rel_err(g, t))
        factor = GRAD_FACTOR if name.startswith("d ") else TRUTH_FACTOR
        limits.append(NATIVE_MAX if native is None else min(NATIVE_MAX, factor * native[i]))
    i = max(range(len(names)), key=lambda j: errs[j] / limits[j] if limits[j] else math.inf)
    ok = all(e <= lim for e, lim in zip(errs, limits, strict=True))
    error = None
    if not ok:
        what = "no gradient" if got[i] is None else f"relative L2 error {errs[i]:.3g}"
        error = f"{names[i]}: {what} from the fp32 step > {limits[i]:.3g}"
    return {
        "rel_err": errs[i],
        "limit": limits[i],
        "worst": names[i],
        "errors": dict(zip(names, errs, strict=True)),
        "passed": ok,
        "error": error,
    }


def is_forward_only(e: BaseException) -> bool:
    """Whether e is a forward-only kernel's refusal of the backward (a skip, not a bug)."""
    return isinstance(e, RuntimeError) and "forward-only" in str(e)
