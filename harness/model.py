"""The whole-model answer (docs METHOD item 11): a Llama-3-8B-shaped decoder block timed
with each RMSNorm variant, and Amdahl's law measured.

    python -m harness.model [--out DIR] [--shapes prefill,decode,train]
                            [--modes eager,graph,compile,compile_graph]
                            [--variants native,eager,triton,cuda,triton_fused,cuda_fused]
                            [--budget-s 360] [--append] [--seed 0] [--no-layer]
                            [--require-gpu]

The block, bf16 with seeded random weights: hidden 4096, 32 query and 8 key/value heads of
128, rotary embeddings, SDPA with GQA, a SwiGLU MLP of 14336, a pre-norm residual stream;
the projections held fused, as inference engines hold them (one QKV and one gate-up
matmul). A block is timed as the residual stream entering it, so both of its norms follow
an add (the next block's first norm would fuse this block's last add):

    h, r = add_norm(prev_out, r, w1); a = attn(h); h, r = add_norm(a, r, w2); out = mlp(h)

``add_norm`` is ``r = x + r; h = norm(r)`` for the plain variants and one kernel for the
fused ones. Shapes: prefill (1 x 4096 tokens, causal), decode (64 sequences x 1 token,
each attending over a preallocated 2048-token KV cache whose last slot the step writes) and
train (4 x 4096 tokens, causal, a training step: see below).
Variants: native (F.rms_norm), eager (the composite transformers' LlamaRMSNorm runs: float,
pow, mean, rsqrt, mul, cast, weight mul), triton and cuda (ours), triton_fused and
cuda_fused (our fused add). Modes: eager; graph (CUDA-graph replay of the eager block);
compile (torch.compile fullgraph, dynamic=False, dynamo reset per shape); compile_graph
(the compiled block captured in a CUDA graph).

Every (shape, mode, variant) is first checked: its outputs against the block computed in
fp32 from the same bf16 weights and inputs, as close to it as native's eager block within
TRUTH_FACTOR; a failure (or a crash, in any step) is recorded with its reason and not
timed, and the run goes on. Each record then carries:
- block time: samples of K back-to-back blocks (K per shape), L2 flushed before each
  sample, variants interleaved in three blocks (harness.timing); a host-bound eager block
  so shows its launch cost, as in a model, instead of a GPU that caught up once;
- the profiler's kernel times of a block, and the norm's share f of them: by name where
  the norm's kernels say what they are (ours contain rms_norm; native's fused kernel is
  PyTorch's layer-norm kernel in RMS mode, and the block has no LayerNorm; Inductor's carry
  rsqrt or mean, which nothing else in the block computes), else twice the kernel time of
  the norm run alone at the in-block shape (the eager composite: its mul, mean and cast
  kernels look like the block's others). The kernels counted are named in the record;
- s, the norm alone at the in-block shape against native's, cold (L2 flushed) and warm
  (CUDA-graph replay, L2-resident), in the mode's family (the compile modes against the
  compiled native norm); the Amdahl bound 1 / ((1 - f) + f / s) with native's f;
- the measured speedup against native (the median of the three interleaved blocks'
  ratios of medians, and their range), flagged when it exceeds the bound by more than that
  range, with the reasons the data give (the add fused, fewer launches, a host-bound
  block, the rest of the block changed);
- the same figures for the step, the residual add and the norm together, which is what a
  fused variant replaces: its bound counts the add.

The training step (shape train): the block's forward, then autograd's gradients of its two
outputs, given fixed random output gradients (N(0, 1), bf16), with respect to its input (x
and residual) and its six weights; no loss reduction, no optimizer. Modes eager and compile
(the forward compiled fullgraph, AOTAutograd's backward); the CUDA-graph modes do not apply.
Checked as above, on the outputs (TRUTH_FACTOR) and on all eight gradients (GRAD_FACTOR of
native's error on the same tensor), against the step in fp32. The norm's share is its
forward kernels' plus its backward kernels' time in the step, each found as the forward's
are (by name, else from the norm alone), the norm alone profiled forward only and forward +
backward (its backward kernels are those the second launches beyond the first); s is the
norm's forward + backward alone against native's. Ours must be differentiable: a backward
that raises "forward-only" is a skip, with its message.

A second client: transformers' LlamaDecoderLayer (the same sizes, attn_implementation
"sdpa", the block's weights copied in) at prefill, with its own LlamaRMSNorm (variant
eager), swapped to torch.nn.RMSNorm (native) and to ours (rmsnorm_api.swap); and at train,
its training step (the same gradients, checked against the fp32 step entered with a zero
residual).

Without a GPU: a tiny config runs each variant that runs on CPU (eager, native, and
triton, triton_fused under the Triton interpreter) through the same check, the training
step's gradients included, and the transformers layer swapped where transformers imports;
then prints the committed H200 table (results/h200/model/).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import importlib
import inspect
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F

# harness.impls first: without a GPU it sets TRITON_INTERPRET=1 before Triton is imported
from harness import impls  # isort: skip
from harness import hardware, measure, records, timing
from harness.measure import kernel_times
from harness.ops import FUSED_ADD_RMS_NORM, RMS_NORM
from harness.plan import Planned, names_arg
from harness.reference import (
    fused_add_rms_norm_grads_ref,
    fused_add_rms_norm_ref,
    grad_close,
    rms_norm_grads_ref,
    rms_norm_ref,
)
from rmsnorm_api.swap import VERIFY_TOL, swap_rms_norm

REPO = Path(__file__).resolve().parent.parent
#: The committed H200 run the no-GPU path prints (python -m harness.model --out this).
COMMITTED = REPO / "results" / "h200" / "model"
RECORDS_NAME, REPORT_NAME = "records.jsonl", "model.md"

VARIANTS = ("native", "eager", "triton", "cuda", "triton_fused", "cuda_fused")
FUSED = ("triton_fused", "cuda_fused")
MODES = ("eager", "graph", "compile", "compile_graph")
SHAPE_NAMES = ("prefill", "decode", "train")
#: The modes of the training step: the CUDA-graph ones are for inference here.
TRAIN_MODES = ("eager", "compile")
#: The variants whose norm torch.compile generates itself; ours are opaque ops to it, so
#: their kernels, and kernel times, are those of the eager launch.
COMPILED_NORMS = ("native", "eager")
BLOCK_OP, LAYER_OP = "decoder_block", "llama_decoder_layer"

#: --budget-s when not given: no new job starts after it, so the run (compiles included)
#: ends well inside one 10-minute device call.
DEFAULT_BUDGET_S = 360.0
#: A variant's block passes when its outputs (relative L2 error, the worse of its two) are
#: as close to the block computed in fp32 as native's bf16 block is, within this factor:
#: correct norms differ in their rounding (the composite rounds twice, the interpreter
#: truncates), which moves the error a little; a wrong norm or wiring misses by far more.
TRUTH_FACTOR = 2.0
#: A gradient of the training step passes within this factor of native's error on the same
#: gradient: a gradient carries the forward's rounding through the chain rule and adds the
#: backward's own casts (the interpreter truncates at each of ours, a biased rounding of
#: twice the size); a backward that drops a term or scales one misses by far more.
GRAD_FACTOR = 3.0
#: The most native's own block may be from the fp32 block (bf16 rounding through a block
#: sits several times under it); also the limit where native's distance is not known.
NATIVE_MAX = 5e-2
#: A block whose kernels fill less of its time than this is host-bound.
HOST_BOUND_BUSY = 0.9


# ---------------------------------------------------------------------------------------
# the block's sizes and shapes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    eps: float = 1e-5  # Llama 3's rms_norm_eps
    rope_theta: float = 500000.0

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


LLAMA3_8B = BlockConfig(hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336)
#: What runs without a GPU: every path of the real block, small enough for the interpreter.
TINY = BlockConfig(hidden=256, heads=4, kv_heads=2, head_dim=64, mlp=512, rope_theta=1e4)


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    tokens: int  # new tokens a sequence
    kv_len: int  # 0: prefill, causal over its own tokens; else the cache the step attends
    calls: int  # blocks back-to-back in one timed sample
    train: bool = False  # a training step: the forward, then the backward

    @property
    def rows(self) -> int:
        return self.batch * self.tokens

    def describe(self) -> str:
        if self.kv_len:
            return f"{self.batch} x {self.tokens} token over a {self.kv_len}-token KV cache"
        step = ", forward + backward" if self.train else ""
        return f"{self.batch} x {self.tokens} tokens, causal{step}"


# decode: one block is a few hundred microseconds, so a sample is 8 of them (see the
# module docstring); a prefill block is milliseconds of matmuls, a training step tens
GPU_SHAPES = {
    "prefill": Shape("prefill", batch=1, tokens=4096, kv_len=0, calls=1),
    "decode": Shape("decode", batch=64, tokens=1, kv_len=2048, calls=8),
    "train": Shape("train", batch=4, tokens=4096, kv_len=0, calls=1, train=True),
}
CPU_SHAPES = {
    "prefill": Shape("prefill", batch=1, tokens=16, kv_len=0, calls=1),
    "decode": Shape("decode", batch=4, tokens=1, kv_len=32, calls=1),
    "train": Shape("train", batch=2, tokens=16, kv_len=0, calls=1, train=True),
}


# ---------------------------------------------------------------------------------------
# the norm variants
# ---------------------------------------------------------------------------------------


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The eager composite, as transformers' LlamaRMSNorm computes it: the variance and the
    scaling in fp32, the result rounded to x's dtype, then times the weight (a second
    rounding): cast, pow, mean, add, rsqrt, mul, cast, mul kernels."""
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)


def unfused(norm: Callable) -> Callable:
    """add_norm for a plain norm: the residual add (fp32, rounded once to the residual's
    dtype, as the fused kernels round residual_out), then the norm of the sum."""

    def add_norm(x, residual, weight, eps):
        residual = x + residual
        return norm(residual, weight, eps), residual

    return add_norm


@dataclass(frozen=True)
class Variant:
    name: str
    add_norm: Optional[Callable]  # (x, residual, weight, eps) -> (y, residual_out)
    norm: Optional[Callable]  # (x, weight, eps) -> y; None for a fused variant
    cpu: bool = False  # runs on CPU tensors
    unavailable: Optional[str] = None
    module: Optional[type] = None  # its nn.Module, what the transformers layer swaps in

    @property
    def fused(self) -> bool:
        return self.name in FUSED


def _import(package: str) -> tuple[Optional[Any], Optional[str]]:
    """(module, None), or (None, why): any exception counts, since a CUDA build older than
    its Python side fails at import with a RuntimeError, not an ImportError."""
    try:
        return importlib.import_module(package), None
    except Exception as e:
        return None, f"{package} not importable ({measure.first_line(e)})"


def variants() -> dict[str, Variant]:
    """Every variant, available or not (then with the reason), in VARIANTS order."""
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    out = {
        "native": Variant(
            "native",
            unfused(impls.native_rms_norm),
            impls.native_rms_norm,
            True,
            None,
            torch.nn.RMSNorm,
        ),
        "eager": Variant("eager", unfused(llama_rms_norm), llama_rms_norm, True),
    }
    for name, package in (("triton", "triton_impl"), ("cuda", "cuda_impl")):
        mod, why = _import(package)
        cpu = name == "triton" and interp
        if mod is None:
            out[name] = Variant(name, None, None, unavailable=why)
            out[f"{name}_fused"] = Variant(f"{name}_fused", None, None, unavailable=why)
            continue
        out[name] = Variant(name, unfused(mod.rms_norm), mod.rms_norm, cpu, None, mod.RMSNorm)
        fused = getattr(mod, "fused_add_rms_norm", None)
        missing = None if fused else f"{package} has no fused_add_rms_norm (a build before it)"
        out[f"{name}_fused"] = Variant(f"{name}_fused", fused, None, cpu, missing)
    return out


# ---------------------------------------------------------------------------------------
# the block
# ---------------------------------------------------------------------------------------


@dataclass
class Weights:
    norm1: torch.Tensor
    qkv: torch.Tensor  # [(heads + 2 kv_heads) * head_dim, hidden]: q, k, v rows in turn
    o: torch.Tensor
    norm2: torch.Tensor
    gate_up: torch.Tensor  # [2 mlp, hidden]: gate rows, then up rows
    down: torch.Tensor


def make_weights(cfg: BlockConfig, device, seed: int) -> Weights:
    """Seeded random bf16 weights: matmuls ~ N(0, 1 / fan_in), so activations keep unit
    scale through the block; norm weights ~ 1 + N(0, 0.1^2)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def draw(*shape: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
        return (t * scale + offset).to(torch.bfloat16)

    def linear(out_f: int, in_f: int) -> torch.Tensor:
        return draw(out_f, in_f, scale=in_f**-0.5)

    return Weights(
        norm1=draw(cfg.hidden, scale=0.1, offset=1.0),
        qkv=linear(cfg.q_size + 2 * cfg.kv_size, cfg.hidden),
        o=linear(cfg.hidden, cfg.q_size),
        norm2=draw(cfg.hidden, scale=0.1, offset=1.0),
        gate_up=linear(2 * cfg.mlp, cfg.hidden),
        down=linear(cfg.hidden, cfg.mlp),
    )


def rope(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple:
    """(cos, sin) of shape [1, len(positions), head_dim] in transformers' layout (the
    frequencies twice, for rotate_half)."""
    inv = theta ** -(torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[None], emb.sin().to(dtype)[None]


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def attention(cfg: BlockConfig, w: Weights, h, cos, sin, k_cache=None, v_cache=None):
    b, s, _ = h.shape
    q, k, v = F.linear(h, w.qkv).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
    q = q.view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
    k = k.view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
    v = v.view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    if k_cache is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        # the new tokens' keys and values go to the cache's last slots; the step attends
        # over all of it (written in place: the same slots every call, so graph-safe)
        k_cache[:, :, -s:].copy_(k)
        v_cache[:, :, -s:].copy_(v)
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
    return F.linear(o.transpose(1, 2).reshape(b, s, cfg.q_size), w.o)


def mlp(w: Weights, h: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(h, w.gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w.down)


def block(cfg, w, add_norm, x, residual, cos, sin, k_cache=None, v_cache=None) -> tuple:
    """One decoder block entered as the residual stream: (its MLP output, the residual),
    which the next block's first add_norm would take."""
    h, residual = add_norm(x, residual, w.norm1, cfg.eps)
    a = attention(cfg, w, h, cos, sin, k_cache, v_cache)
    h, residual = add_norm(a, residual, w.norm2, cfg.eps)
    return mlp(w, h), residual


def block_fn(cfg: BlockConfig, w: Weights, add_norm: Callable) -> Callable:
    """The block as a function of its inputs alone: what torch.compile traces (one code
    object for every variant, so dynamo keeps one cache entry a variant)."""

    def run(x, residual, cos, sin, k_cache=None, v_cache=None):
        return block(cfg, w, add_norm, x, residual, cos, sin, k_cache, v_cache)

    return run


@dataclass
class Inputs:
    x: torch.Tensor  # the previous block's MLP output
    residual: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: Optional[torch.Tensor] = None
    v_cache: Optional[torch.Tensor] = None

    def args(self) -> tuple:
        return (self.x, self.residual, self.cos, self.sin, self.k_cache, self.v_cache)


def make_inputs(cfg: BlockConfig, shape: Shape, device, seed: int) -> Inputs:
    """Seeded random inputs of a shape: the stream (x, residual) ~ N(0, 1), a random KV
    cache for decode, the rotary tables of the tokens' positions."""
    g = torch.Generator(device=device).manual_seed(seed + 7919 * shape.rows + shape.kv_len)

    def randn(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g, device=device, dtype=torch.float32).bfloat16()

    stream = (shape.batch, shape.tokens, cfg.hidden)
    if shape.kv_len:
        positions = torch.arange(shape.kv_len - shape.tokens, shape.kv_len, device=device)
        cache = (shape.batch, cfg.kv_heads, shape.kv_len, cfg.head_dim)
        k_cache, v_cache = randn(*cache), randn(*cache)
    else:
        positions = torch.arange(shape.tokens, device=device)
        k_cache = v_cache = None
    cos, sin = rope(positions, cfg.head_dim, cfg.rope_theta, torch.bfloat16)
    return Inputs(randn(*stream), randn(*stream), cos, sin, k_cache, v_cache)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||, in fp32 (inf where got is not finite)."""
    g, w = got.float(), want.float()
    if not torch.isfinite(g).all():
        return math.inf
    return float((g - w).norm() / w.norm().clamp_min(torch.finfo(torch.float32).tiny))


def fp32_block(cfg: BlockConfig, w: Weights, args: tuple) -> tuple:
    """The block in fp32: the bf16 weights and inputs upcast (the KV cache copied, so the
    bf16 one is untouched), the reference norm, no rounding between the steps. What every
    bf16 block is measured against."""
    w32 = Weights(**{k: t.float() for k, t in vars(w).items()})
    args32 = tuple(None if t is None else t.float() for t in args)
    return block_fn(cfg, w32, unfused(rms_norm_ref))(*args32)


def agreement(outs: tuple, truth: tuple, native: Optional[float] = None) -> dict:
    """{rel_err, limit, passed, error}: the worse relative L2 error of outs against the fp32
    block's, within TRUTH_FACTOR of native's error ``native`` (NATIVE_MAX where None)."""
    worst = max(rel_err(o, t) for o, t in zip(outs, truth, strict=True))
    limit = NATIVE_MAX if native is None else min(NATIVE_MAX, TRUTH_FACTOR * native)
    ok = worst <= limit
    error = None if ok else f"relative L2 error {worst:.3g} from the fp32 block > {limit:.3g}"
    return {"rel_err": worst, "limit": limit, "passed": ok, "error": error}


# ---------------------------------------------------------------------------------------
# the training step
# ---------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------
# Amdahl's law and the profiler's kernel times
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# the GPU run: state
# ---------------------------------------------------------------------------------------


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
        fn = torch.compile(block_fn(run.cfg, w, v.add_norm), fullgraph=True, dynamic=False)
        # a training step's first call compiles the forward and AOTAutograd's backward
        first = (
            train_step(fn, st.inputs, w, st.dys)
            if st.shape.train
            else functools.partial(fn, *st.inputs.args())
        )
        st.compiled[v.name] = (fn, _sync_time(first))
    return st.compiled[v.name]


def _enter_compile_shape(run: Run, st: ShapeState) -> None:
    if run.compile_shape != st.shape.name:
        torch._dynamo.reset()
        for other in run.states.values():  # reset invalidates what was compiled before
            other.compiled.clear()
            other.pieces.pop("compile", None)
        run.compile_shape = st.shape.name


# ---------------------------------------------------------------------------------------
# the GPU run: the norm alone (s)
# ---------------------------------------------------------------------------------------


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
        if v.unavailable or (family == "compile" and v.name not in COMPILED_NORMS):
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
    whether eager or compiled code launches it)."""
    if family == "compile" and name not in COMPILED_NORMS:
        family = "eager"
    p = st.pieces.get(family, {}).get((what, name))
    return p if p is not None and p.fn is not None else None


# ---------------------------------------------------------------------------------------
# the GPU run: one (shape, mode) job
# ---------------------------------------------------------------------------------------


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
        if v.unavailable:
            _write_block(
                run, st.shape, mode, name, status="SKIP", notes=[f"not run: {v.unavailable}"]
            )
            run.say(f"{where}: skip ({v.unavailable})")
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


# ---------------------------------------------------------------------------------------
# the second client: transformers' LlamaDecoderLayer
# ---------------------------------------------------------------------------------------


def hf_layer(tf, cfg: BlockConfig, w: Weights, max_positions: int, device) -> tuple:
    """(LlamaDecoderLayer, LlamaRotaryEmbedding, config) of cfg's sizes, attention through
    SDPA, bf16, the block's weights copied in (so the layer computes the block: q, k, v and
    gate, up are the fused matrices' row blocks). Across versions: head_dim and
    attn_implementation as config arguments, layer_idx where the layer takes it, the
    rotary module built from the config (its older signature took sizes)."""
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    config = tf.LlamaConfig(
        hidden_size=cfg.hidden,
        intermediate_size=cfg.mlp,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        num_hidden_layers=1,
        rms_norm_eps=cfg.eps,
        max_position_embeddings=max_positions,
        attn_implementation="sdpa",
    )
    if getattr(config, "_attn_implementation", "sdpa") != "sdpa":
        config._attn_implementation = "sdpa"
    with torch.device(device):
        try:
            layer = llama.LlamaDecoderLayer(config, layer_idx=0)
        except TypeError:  # versions before layer_idx
            layer = llama.LlamaDecoderLayer(config)
        try:
            rotary = llama.LlamaRotaryEmbedding(config=config)
        except TypeError:  # versions whose rotary module took its sizes
            rotary = llama.LlamaRotaryEmbedding(cfg.head_dim, max_positions)
    layer = layer.to(torch.bfloat16).eval()
    q, kv = cfg.q_size, cfg.kv_size
    copies = {
        "input_layernorm.weight": w.norm1,
        "self_attn.q_proj.weight": w.qkv[:q],
        "self_attn.k_proj.weight": w.qkv[q : q + kv],
        "self_attn.v_proj.weight": w.qkv[q + kv :],
        "self_attn.o_proj.weight": w.o,
        "post_attention_layernorm.weight": w.norm2,
        "mlp.gate_proj.weight": w.gate_up[: cfg.mlp],
        "mlp.up_proj.weight": w.gate_up[cfg.mlp :],
        "mlp.down_proj.weight": w.down,
    }
    assert list(copies) == [n for n, _ in LAYER_WEIGHTS]
    params = dict(layer.named_parameters())
    missing = [n for n in copies if n not in params]
    if missing:
        raise RuntimeError(
            f"transformers {tf.__version__}: LlamaDecoderLayer has no {', '.join(missing)}"
            f" (its parameters: {', '.join(sorted(params))})"
        )
    with torch.no_grad():
        for name, value in copies.items():
            params[name].copy_(value)
    return layer, rotary.to(device), config


@dataclass
class LayerCall:
    """One call of a transformers layer on fixed inputs, across versions: (cos, sin) from
    the rotary module where the layer takes position_embeddings (older layers compute them
    from position_ids), no cache, SDPA's own causal mask (attention_mask None), and the
    hidden states out of the tuple older versions return."""

    layer: torch.nn.Module
    hidden: torch.Tensor
    kwargs: dict

    def __call__(self) -> torch.Tensor:
        out = self.layer(self.hidden, **self.kwargs)
        return out[0] if isinstance(out, tuple) else out


def layer_call(layer: torch.nn.Module, rotary, hidden: torch.Tensor) -> LayerCall:
    positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
    accepted = inspect.signature(layer.forward).parameters
    kwargs: dict[str, Any] = {"attention_mask": None, "position_ids": positions}
    if "position_embeddings" in accepted:
        kwargs["position_embeddings"] = rotary(hidden, positions)
    if "use_cache" in accepted:
        kwargs["use_cache"] = False
    return LayerCall(layer, hidden, kwargs)


#: The layer's weights in hf_layer's order, each with the block weight it is (a row block of
#: it: q, k, v of qkv; gate, up of gate_up).
LAYER_WEIGHTS = (
    ("input_layernorm.weight", "norm1"),
    ("self_attn.q_proj.weight", "qkv"),
    ("self_attn.k_proj.weight", "qkv"),
    ("self_attn.v_proj.weight", "qkv"),
    ("self_attn.o_proj.weight", "o"),
    ("post_attention_layernorm.weight", "norm2"),
    ("mlp.gate_proj.weight", "gate_up"),
    ("mlp.up_proj.weight", "gate_up"),
    ("mlp.down_proj.weight", "down"),
)
#: What a layer's training step is checked on: its output (the block's two summed), the
#: gradients with respect to its input and to the block's weights.
LAYER_STEP_TENSORS = ("out", "d x") + tuple(f"d {f.name}" for f in dataclasses.fields(Weights))


@dataclass
class LayerStep:
    """A transformers layer's training step: its forward (the call's hidden state requires
    grad), then the gradients of its output (given dy) with respect to the hidden state and
    the layer's weights (LAYER_WEIGHTS' order); returns the output, then those."""

    call: LayerCall
    wrt: tuple
    dy: torch.Tensor

    def __call__(self) -> tuple:
        with torch.enable_grad():
            out = self.call()
            grads = torch.autograd.grad(out, self.wrt, self.dy, allow_unused=True)
        return (out.detach(), *grads)


def layer_steps(calls: dict[str, LayerCall], dy: torch.Tensor) -> dict[str, LayerStep]:
    """Each layer call as a training step (its hidden state must be a leaf that requires
    grad)."""
    out = {}
    for name, call in calls.items():
        params = dict(call.layer.named_parameters())
        out[name] = LayerStep(call, (call.hidden, *(params[n] for n, _ in LAYER_WEIGHTS)), dy)
    return out


def block_layout(got: tuple) -> tuple:
    """A layer step's tensors in LAYER_STEP_TENSORS' order: the row blocks' gradients of
    each block weight joined (a missing one: None)."""
    grads: dict[str, list] = {}
    for (_, name), g in zip(LAYER_WEIGHTS, got[2:], strict=True):
        grads.setdefault(name, []).append(g)
    joined = [None if any(g is None for g in gs) else torch.cat(gs) for gs in grads.values()]
    return (got[0], got[1], *joined)


def layer_train_checks(cfg: BlockConfig, w: Weights, steps: dict[str, LayerStep]) -> dict:
    """{variant: train_agreement, plus "against", or {"skipped": why} for a forward-only
    backward}: each layer's step against the fp32 step of the block entered with a zero
    residual and the layer's output gradient on both outputs (the layer's output is their
    sum), native's within NATIVE_MAX, the others within the factors of native's errors. A
    layer that computes its own rotary tables is checked against the native layer."""
    native = steps["native"]
    rope_in = native.call.kwargs.get("position_embeddings")
    if rope_in is not None:
        hidden, dy = native.call.hidden, native.dy
        inputs = Inputs(hidden, torch.zeros_like(hidden), *rope_in)
        t = fp32_step(cfg, w, inputs, (dy, dy))
        truth, against = (t[0] + t[1], t[2], *t[4:]), "the step in fp32"
    else:
        truth, against = block_layout(native()), "the native layer"
    checks: dict[str, dict] = {}
    for name in ["native"] + [n for n in steps if n != "native"]:
        from_native = checks["native"].get("errors") if name != "native" else None
        errs = None if from_native is None else list(from_native.values())
        try:
            c = train_agreement(block_layout(steps[name]()), truth, LAYER_STEP_TENSORS, errs)
        except Exception as e:
            if is_forward_only(e):
                checks[name] = {
                    "skipped": f"its backward is forward-only ({measure.first_line(e)})"
                }
                continue
            c = {"rel_err": None, "limit": None, "passed": False, "error": measure.first_line(e)}
        checks[name] = {**c, "against": against}
    return checks


#: The layer's variants: its own LlamaRMSNorm (the eager composite), and the modules
#: swapped in for it (native: torch.nn.RMSNorm; ours). The fused forms have no module.
LAYER_VARIANTS = ("native", "eager", "triton", "cuda")


def layer_calls(
    tf, cfg: BlockConfig, w: Weights, vs: dict[str, Variant], names: list[str], hidden: torch.Tensor
) -> tuple[dict, dict]:
    """({variant: LayerCall}, {variant: why not}) for the LAYER_VARIANTS among names; each
    swapped layer is a copy of the layer with its own norms, swapped by swap_rms_norm
    (which checks each replacement against the module it replaces)."""
    base, rotary, _ = hf_layer(tf, cfg, w, hidden.shape[1], hidden.device)
    calls, skipped = {}, {}
    for name in (n for n in names if n in LAYER_VARIANTS):
        v = vs[name]
        if v.unavailable:
            skipped[name] = v.unavailable
            continue
        layer = base
        if name != "eager":
            layer = copy.deepcopy(base)
            swapped = swap_rms_norm(layer, v.module)
            if swapped != 2:
                skipped[name] = f"swap_rms_norm swapped {swapped} modules, not the layer's 2"
                continue
        calls[name] = layer_call(layer, rotary, hidden)
    return calls, skipped


def layer_checks(cfg: BlockConfig, w: Weights, calls: dict[str, LayerCall]) -> dict:
    """{variant: agreement, plus "against"}: each layer against the fp32 block entered with a
    zero residual (the layer's output is then the block's MLP output plus its residual), so
    the native layer's check is also the check that the layer computes the block; the
    others within TRUTH_FACTOR of the native layer's error. A layer that computes its own
    rotary tables (no position_embeddings) is checked against the native layer instead."""
    native = calls["native"]
    rope_in = native.kwargs.get("position_embeddings")
    if rope_in is not None:
        zeros = torch.zeros_like(native.hidden)
        out, res = fp32_block(cfg, w, (native.hidden, zeros, *rope_in, None, None))
        truth, against = (out + res,), "the block in fp32"
    else:
        truth, against = (native().float(),), "the native layer"
    checks: dict[str, dict] = {}
    for name in ["native"] + [n for n in calls if n != "native"]:
        try:
            limit_from = checks["native"]["rel_err"] if name != "native" else None
            c = agreement((calls[name](),), truth, limit_from)
        except Exception as e:
            c = {"rel_err": None, "limit": None, "passed": False, "error": measure.first_line(e)}
        checks[name] = {**c, "against": against}
    return checks


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
        if correct["passed"]:
            try:
                kernels = kernel_times(call, calls=2)
            except Exception as e:
                correct = {**correct, "passed": False, "error": measure.first_line(e)}
        if not correct["passed"]:
            run.failed += 1
            _write_block(
                run, st.shape, "eager", name, status="FAIL", block=LAYER_OP, correct=correct
            )
            run.say(f"{LAYER_OP}/{name}: FAIL {correct['error']}")
            continue
        ready[name] = Ready(call, call, (), None)
        rows[name] = {"correct": correct, "kernels": kernels, "profiled": "as timed"}
    if ready:
        blocks, clk = _time_blocks(run, st, "eager", ready, LAYER_OP)
        rows = {n: {**rows[n], "blocks": blocks[n]} for n in blocks}
        _finish(run, st, "eager", rows, ready, clk, LAYER_OP)


# ---------------------------------------------------------------------------------------
# the GPU run
# ---------------------------------------------------------------------------------------


#: The jobs of the transformers layer, each with the shape it runs at.
LAYER_JOBS = {"layer": "prefill", "layer_train": "train"}


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
    jobs += [
        (s, m) for s in shapes for m in ("compile", "compile_graph") if m in modes and applies(s, m)
    ]
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
            block = LAYER_OP if shape in LAYER_JOBS else BLOCK_OP
            where = GPU_SHAPES[LAYER_JOBS.get(shape, shape)]
            if run.over_budget():
                run.say(f"time budget of {args.budget_s:.0f} s spent: {len(jobs) - i} jobs not run")
                for s, m in jobs[i:]:
                    _write_block(
                        run,
                        GPU_SHAPES[LAYER_JOBS.get(s, s)],
                        m,
                        "all",
                        status="SKIP",
                        block=LAYER_OP if s in LAYER_JOBS else BLOCK_OP,
                        notes=["not run: time budget spent"],
                    )
                break
            run.say(f"{block} {where.name} ({where.describe()}), {mode} ...")
            try:
                if shape in LAYER_JOBS:
                    run_layer_job(run, args.variants, LAYER_JOBS[shape])
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
    text = render(records.read_records(path))
    (out / REPORT_NAME).write_text(text + "\n", encoding="utf-8")
    print(text)
    run.say(f"{b.writer.count} records -> {path}; report -> {out / REPORT_NAME}")
    return 1 if run.failed else 0


# ---------------------------------------------------------------------------------------
# without a GPU: the tiny config, then the committed table
# ---------------------------------------------------------------------------------------


def why_not_on(v: Variant, device: str) -> Optional[str]:
    """None if the variant runs on device ("cpu" or "cuda"), else why not."""
    return v.unavailable or (None if v.cpu or device != "cpu" else "needs a CUDA GPU")


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
    recs, md = where / RECORDS_NAME, where / REPORT_NAME
    shown = where.relative_to(REPO) if where.is_relative_to(REPO) else where
    if recs.exists():
        return f"the committed H200 run ({shown / RECORDS_NAME}):\n\n" + render(
            records.read_records(recs)
        )
    if md.exists():
        return f"the committed H200 report ({shown / REPORT_NAME}):\n\n" + md.read_text()
    return (
        f"no committed H200 model results yet ({shown / RECORDS_NAME} does not exist): run "
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
                    where = f"layer {shape:<8} {norm:<17}"
                    if "skipped" in c:
                        print(f"{where} skip: {c['skipped']}")
                        continue
                    failed += not c["passed"]
                    print(f"{where} {_verdict(c)} (against {c['against']})")
    print()
    print(committed_text())
    return 1 if failed else 0


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


# ---------------------------------------------------------------------------------------
# the report: a pure function of records
# ---------------------------------------------------------------------------------------


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


def render(recs: list[dict]) -> str:
    """The model section as markdown, from a run's records (any machine can redraw it)."""
    recs = _redrawn_speedups([r for r in records.latest(recs) if r.get("model")])
    if not recs:
        return "no model records in this file"
    env = recs[0]["env"]
    sha = (env.get("git_sha") or "unknown")[:10] + ("-dirty" if env.get("git_dirty") else "")
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
    for block, title in ((BLOCK_OP, "the block"), (LAYER_OP, "transformers' LlamaDecoderLayer")):
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


# ---------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------

#: Flags that only mean something on a GPU; without one they are named as ignored.
GPU_ONLY = {
    "--modes": "only the eager block runs without a GPU",
    "--budget-s": "the CPU check is not budgeted",
    "--out": "nothing is written without a GPU",
    "--append": "nothing is written without a GPU",
}

EPILOG = f"""\
native always runs: it is the baseline every speedup and bound is against.
train is a training step (forward + backward) in the modes {", ".join(TRAIN_MODES)}; the
others are named as not applicable to it. --shapes train --append runs it on its own (a
device call of its own, its records added to a run's).

without a GPU:
  A tiny block ({_describe(TINY)};
  prefill {CPU_SHAPES["prefill"].tokens} tokens, decode {CPU_SHAPES["decode"].batch} x 1 over \
{CPU_SHAPES["decode"].kv_len}, train {CPU_SHAPES["train"].batch} x \
{CPU_SHAPES["train"].tokens}) runs each of --variants that runs
  on CPU (native, eager, and triton, triton_fused under the Triton interpreter) in each of
  --shapes, its outputs (at train: and gradients) checked against the block in fp32;
  transformers' LlamaDecoderLayer of the same sizes is checked swapped (at prefill, and
  at train when asked; when transformers imports; not with --no-layer). Then the
  committed H200 table ({COMMITTED.relative_to(REPO)})
  is printed. Named as ignored (they only apply on a GPU): {", ".join(GPU_ONLY)}.
  --require-gpu exits 1 instead.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.model",
        description="Time a Llama-3-8B-shaped decoder block with each RMSNorm variant and "
        "measure Amdahl's law:\nthe norm's share, its speedup alone, the bound, the "
        "block's measured speedup.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--shapes",
        default=None,
        help=f"comma-separated from {','.join(SHAPE_NAMES)} (default: all)",
    )
    p.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated from {','.join(MODES)} (default: all; GPU only)",
    )
    p.add_argument(
        "--variants", default=None, help=f"comma-separated from {','.join(VARIANTS)} (default: all)"
    )
    p.add_argument(
        "--out",
        default=None,
        help=f"output directory for {RECORDS_NAME} and {REPORT_NAME}, checked before any "
        "work (default: results/<gpu>/model; GPU only)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"start no new job after this many seconds (default {DEFAULT_BUDGET_S:.0f}; GPU only)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help=f"append to --out's {RECORDS_NAME}, not replace it (a run split over several "
        "calls, e.g. the compile modes in a second one; the report keeps the last record of "
        "each shape, mode and variant; GPU only)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    p.add_argument(
        "--no-layer", action="store_true", help="leave out transformers' LlamaDecoderLayer"
    )
    p.add_argument("--require-gpu", action="store_true", help="exit 1 if there is no GPU")
    return p


def parse_args(
    argv: Optional[list[str]] = None, p: Optional[argparse.ArgumentParser] = None
) -> argparse.Namespace:
    """The checked arguments: the same checks on any machine, GPU or not."""
    p = p or build_parser()
    args = p.parse_args(argv)
    args.modes_given = args.modes is not None
    args.shapes = names_arg(p, "--shapes", args.shapes or ",".join(SHAPE_NAMES), SHAPE_NAMES)
    args.modes = names_arg(p, "--modes", args.modes if args.modes_given else ",".join(MODES), MODES)
    given = args.variants if args.variants is not None else ",".join(VARIANTS)
    chosen = set(names_arg(p, "--variants", given, VARIANTS)) | {"native"}
    args.variants = [v for v in VARIANTS if v in chosen]
    if args.budget_s is not None and not args.budget_s > 0:  # also refuses nan
        p.error(f"--budget-s is {args.budget_s}; expected a positive number of seconds")
    if args.out is not None and (why := records.out_dir_problem(args.out)):
        p.error(f"--out {args.out} {why}")
    return args


def _given(args, flag: str) -> bool:
    if flag == "--modes":
        return args.modes_given
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    return value is not None and value is not False


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = parse_args(argv, p)
    if not torch.cuda.is_available():
        if args.require_gpu:
            print("no CUDA GPU on this machine, and --require-gpu was given", file=sys.stderr)
            return 1
        return run_cpu(args)
    out = (
        Path(args.out)
        if args.out is not None
        else REPO / "results" / hardware.gpu_slug(torch.cuda.get_device_name()) / "model"
    )
    if why := records.out_dir_problem(out):
        p.error(f"--out {out} {why}")
    if args.budget_s is None:
        args.budget_s = DEFAULT_BUDGET_S
    return run_gpu(args, out)


if __name__ == "__main__":
    sys.exit(main())
