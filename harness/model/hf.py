"""A second client: transformers' LlamaDecoderLayer (the same sizes, attn_implementation
"sdpa", the block's weights copied in) at prefill, with its own LlamaRMSNorm (variant
eager), swapped to torch.nn.RMSNorm (native) and to ours (rmsnorm_api.swap); and at train,
its training step (the same gradients, checked against the fp32 step entered with a zero
residual). Here: the layer built, called, made a training step and checked; its GPU job is
harness.model.job's run_layer_job, its CPU check harness.model.cpu's check_layer.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from harness import measure
from harness.model.block import Inputs, Variant, Weights, agreement, fp32_block, raised
from harness.model.config import BlockConfig
from harness.model.train import fp32_step, is_forward_only, train_agreement
from rmsnorm_api.swap import swap_rms_norm


def layer_config(config_cls, cfg: BlockConfig, max_positions: int):
    """A transformers config of class config_cls at cfg's sizes, one layer, attention
    through SDPA (a config argument, set again where a version ignores it)."""
    config = config_cls(
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
    return config


def hf_layer(tf, cfg: BlockConfig, w: Weights, max_positions: int, device) -> tuple:
    """(LlamaDecoderLayer, LlamaRotaryEmbedding, config) of cfg's sizes, attention through
    SDPA, bf16, the block's weights copied in (so the layer computes the block: q, k, v and
    gate, up are the fused matrices' row blocks). Across versions: head_dim and
    attn_implementation as config arguments, layer_idx where the layer takes it, the
    rotary module built from the config (its older signature took sizes)."""
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    config = layer_config(tf.LlamaConfig, cfg, max_positions)
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


#: The names a layer's forward takes the rotary tables by: Llama's and Qwen3's one pair,
#: older Gemma 3 layers' global and local pairs (given the same tables here).
ROPE_ARGS = ("position_embeddings", "position_embeddings_global", "position_embeddings_local")


def layer_call(layer: torch.nn.Module, rotary, hidden: torch.Tensor) -> LayerCall:
    """A call of a transformers decoder layer (Llama's, Qwen3's, Gemma 3's) on hidden: the
    rotary tables by the rotary module's signature (newer Gemma 3 modules take the layer's
    attention type), passed under each name the layer's forward takes them by."""
    positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
    accepted = inspect.signature(layer.forward).parameters
    kwargs: dict[str, Any] = {"attention_mask": None, "position_ids": positions}
    names = [n for n in ROPE_ARGS if n in accepted]
    if names:
        if "layer_type" in inspect.signature(rotary.forward).parameters:
            kind = getattr(layer, "attention_type", None) or layer.self_attn.config.layer_types[0]
            rope = rotary(hidden, positions, kind)
        else:
            rope = rotary(hidden, positions)
        kwargs.update(dict.fromkeys(names, rope))
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
            c = raised(e)
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
            c = raised(e)
        checks[name] = {**c, "against": against}
    return checks
