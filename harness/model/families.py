"""The real clients of the variants: transformers' Qwen3 and Gemma 3 decoder layers (random
weights, the block's sizes on the GPU, tiny on CPU), bf16, attention through SDPA, with
every norm of the layer swapped: Qwen3's 4 (q_norm and k_norm on each head's rows among
them), Gemma 3's 6 (its norms scale by 1 + weight: ours take weight_offset 1). Each layer
runs as transformers ships it (variant eager: its own norms), with torch.nn.RMSNorm swapped
in where it can stand for the layer's norms (native; Qwen3's), and with ours (triton,
cuda), in eager mode and compiled (torch.compile of the layer's call, fullgraph). Each is
checked against the layer of its own norms in fp32 (within TRUTH_FACTOR of the eager
layer's error), profiled and timed interleaved; the speedup is over the eager layer's
time, block by block. No Amdahl bound: the block's norm pieces are not this layer's.
"""

from __future__ import annotations

import copy
import importlib
from typing import Optional

import torch

from harness import measure, timing
from harness.model.block import Variant, _import, agreement, raised
from harness.model.config import FAMILIES, BlockConfig, Shape, family_op
from harness.model.hf import LayerCall, layer_call, layer_config
from harness.model.job import Ready, _time_blocks, profiled
from harness.model.shares import _speedup, _total
from harness.model.state import (
    Run,
    _enter_compile_shape,
    _state,
    _sync_time,
    _write_block,
    _write_raised,
    _write_skip,
)

#: The family layers' variants, the layer's own norms (eager) first: the baseline.
FAMILY_VARIANTS = ("eager", "native", "triton", "cuda")


def family_layer(
    tf, family: str, cfg: BlockConfig, max_positions: int, device, dtype=torch.bfloat16, seed=0
) -> tuple:
    """(decoder layer, its rotary module) of transformers' Qwen3 or Gemma 3 at cfg's sizes,
    attention through SDPA, in dtype, its weights transformers' initialisation under seed and
    its norms' weights random (Gemma's near 0, since it scales by 1 + weight; the others'
    near 1)."""
    prefix, config_cls, offset = FAMILIES[family]
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config = layer_config(getattr(tf, config_cls), cfg, max_positions)
    layer_cls, rotary_cls = (
        getattr(mod, f"{prefix}{c}") for c in ("DecoderLayer", "RotaryEmbedding")
    )
    torch.manual_seed(seed)
    with torch.device(device):
        layer = layer_cls(config, layer_idx=0)
        rotary = rotary_cls(config=config)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" in name:
                p.copy_(0.2 * torch.randn_like(p) + (1.0 - offset))
            elif p.dim() == 2:  # the projections: a scale that keeps activations near 1
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    return layer.to(dtype).eval(), rotary.to(device)


def norm_count(layer: torch.nn.Module) -> int:
    """The layer's RMSNorm modules (transformers' own classes)."""
    return sum(type(m).__name__.endswith("RMSNorm") for m in layer.modules())


def family_calls(
    tf, family: str, cfg: BlockConfig, vs: dict[str, Variant], names: list[str], hidden
) -> tuple[dict, dict, LayerCall]:
    """({variant: LayerCall}, {variant: why not}, the fp32 layer's call) for the
    FAMILY_VARIANTS among names (eager always: the baseline). Each swapped layer is a copy
    whose every norm swap_rms_norm replaced (it checks each replacement against the module it
    replaces); one that swaps fewer is not run, saying so."""
    from rmsnorm_api.swap import swap_rms_norm

    base, rotary = family_layer(tf, family, cfg, hidden.shape[1], hidden.device)
    want = norm_count(base)
    calls, skipped = {"eager": layer_call(base, rotary, hidden)}, {}
    for name in (n for n in FAMILY_VARIANTS[1:] if n in names):
        v = vs[name]
        if v.unavailable:
            skipped[name] = v.unavailable
            continue
        layer = copy.deepcopy(base)
        try:
            swapped = swap_rms_norm(layer, v.module)
        except Exception as e:  # a module that cannot stand for the layer's norms
            skipped[name] = f"swap_rms_norm refused: {measure.first_line(e)}"
            continue
        if swapped != want:
            skipped[name] = f"swap_rms_norm swapped {swapped} modules, not the layer's {want}"
            continue
        calls[name] = layer_call(layer, rotary, hidden)
    fp32 = copy.deepcopy(base).float()
    truth = layer_call(fp32, rotary, hidden.float())
    return calls, skipped, truth


def family_checks(calls: dict[str, LayerCall], truth: LayerCall) -> dict:
    """{variant: agreement}: each layer's output against the fp32 layer of its own norms,
    the eager layer's within NATIVE_MAX, the others within TRUTH_FACTOR of the eager
    layer's error."""
    want = (truth().float(),)
    checks: dict[str, dict] = {}
    for name, call in calls.items():
        limit_from = checks["eager"]["rel_err"] if name != "eager" else None
        try:
            checks[name] = agreement((call(),), want, limit_from)
        except Exception as e:
            checks[name] = raised(e)
    return checks


def _compiled(call: LayerCall) -> tuple[LayerCall, float]:
    """The layer compiled (fullgraph, dynamic=False) in a call of the same arguments, and
    the seconds its first call took."""
    compiled = copy.copy(call)
    compiled.layer = torch.compile(call.layer, fullgraph=True, dynamic=False)
    return compiled, _sync_time(compiled)


def run_family_job(run: Run, family: str, shape: Shape, mode: str, names: list[str]) -> None:
    """A family's layer at shape (prefill) in mode: each variant built, compiled (compile
    mode), checked, profiled and timed interleaved; one record a variant."""
    op = family_op(family)
    tf, why = _import("transformers")
    if tf is None:
        _write_block(run, shape, mode, "all", status="SKIP", block=op, notes=[f"not run: {why}"])
        run.say(f"{op}: skip ({why})")
        return
    st = _state(run, shape)
    calls, skipped, truth = family_calls(tf, family, run.cfg, run.variants, names, st.inputs.x)
    for name, reason in skipped.items():
        _write_skip(run, shape, mode, name, op, reason)
    compile_s: dict[str, Optional[float]] = dict.fromkeys(calls)
    if mode == "compile":
        # Dynamo reset where the shape changes, as the block's compiles are (not a variant:
        # a reset drops the variants compiled before it, which would compile again)
        _enter_compile_shape(run, st)
        for name in list(calls):
            try:
                calls[name], compile_s[name] = _compiled(calls[name])
            except Exception as e:
                _write_raised(run, shape, mode, name, op, e, "did not compile")
                del calls[name]
    checks = family_checks(calls, truth)
    del truth
    ready, rows = {}, {}
    for name, call in calls.items():
        correct = checks[name]
        kernels = profiled(run, shape, mode, name, op, call, correct)
        if kernels is None:
            continue
        ready[name] = Ready(call, call, (), compile_s[name])
        rows[name] = {"correct": correct, "kernels": kernels}
    if not ready:
        return
    blocks, clk = _time_blocks(run, st, mode, ready, op)
    base = blocks.get("eager")
    for name, per in blocks.items():
        n, us = _total(rows[name]["kernels"])
        per_block, stats, spr = timing.block_summary(per)
        m = {
            "calls_per_sample": shape.calls,
            "kernel_us": us,
            "kernel_count": n,
            "device_busy": us / stats["median_us"] if us else None,
            "rel_err": rows[name]["correct"]["rel_err"],
            "compiled": (
                any(k.startswith("triton_") for k in rows[name]["kernels"])
                if mode == "compile"
                else None
            ),
            "speedup": _speedup(base, per) if base else None,
            "speedup_over": "eager",
            "family": family,
        }
        _write_block(
            run,
            shape,
            mode,
            name,
            status="PASS",
            block=op,
            correct=rows[name]["correct"],
            samples_us=[v for b in per for v in timing.to_us(b)],
            blocks=per_block,
            stats=stats,
            spread=spr,
            clocks=clk,
            compile_s=compile_s[name],
            kernels={"names": sorted(rows[name]["kernels"]), "count": n, "us": us},
            notes=[
                f"{shape.calls} back-to-back layers a sample, L2 flushed before each",
                "speedup: the layer with its own norms (eager) over this variant",
            ],
            model=m,
        )
        sp = m["speedup"]
        run.say(
            f"{op} {shape.name} {mode}/{name}: {stats['median_us']:.1f} us"
            + (f", x{sp['median']:.3f} over eager" if sp else "")
        )


@torch.no_grad()
def check_family(
    family: str, cfg: BlockConfig, vs: dict[str, Variant], names: list[str], hidden
) -> tuple[Optional[str], dict]:
    """(why not, {variant: check}) for a family's layer on hidden's device (CPU: the tiny
    config, each variant that runs there), each swapped layer's output against the fp32
    layer of its own norms."""
    tf, why = _import("transformers")
    if tf is None:
        return why, {}
    calls, skipped, truth = family_calls(tf, family, cfg, vs, names, hidden)
    checks: dict[str, dict] = {n: {"skipped": why} for n, why in skipped.items()}
    return None, {**family_checks(calls, truth), **checks}
