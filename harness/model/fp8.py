"""The FP8 client: the block of harness.model.block with its four projections in fp8, as an
FP8 deployment runs them: torch._scaled_mm of e4m3 activations by e4m3 weights (each weight
quantised once by its own largest value, a scale a tensor), bf16 out. The activations are
quantised by a static scale (calibrated once: the largest scale a token takes over the
shape's inputs) or by a scale a token (each row's max|y| / 448, at least 1 / (448 x 512)).
The two norms' outputs are the variants': native (the add, F.rms_norm, y stored in bf16,
then quantised in PyTorch: an unfused model) against ours (triton, cuda:
``fused_add_rms_norm_quant``, y written in fp8 in the norm's pass); the attention's output
and the MLP's product are quantised in PyTorch in every variant. Eager and compiled (the
whole block, fullgraph).

Each block is checked against the bf16 block computed in fp32 (fp32_block): native's fp8
block within FP8_NATIVE_MAX, ours within TRUTH_FACTOR of native's error. The Amdahl bound
comes from the pieces alone (the add, the norm and the quantisation of one norm at the
in-block shape): f, twice native's piece's kernel time over native's block's; s, native's
piece's kernel time over the variant's; both in the mode's form (compiled pieces in the
compile mode).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

from harness import impls, timing
from harness.measure import kernel_times
from harness.model.block import (
    Variant,
    Weights,
    _import,
    agreement,
    attend,
    block_fn,
    fp32_block,
    make_inputs,
    make_weights,
    raised,
    why_not_on,
)
from harness.model.config import FP8_SCALINGS, BlockConfig, Shape, fp8_op
from harness.model.job import Ready, _time_blocks, profiled
from harness.model.shares import _speedup, _total, amdahl_bound, exceeds
from harness.model.state import (
    Run,
    ShapeState,
    _enter_compile_shape,
    _state,
    _sync_time,
    _write_block,
    _write_raised,
    _write_skip,
)
from harness.reference import quantise_ref

E4M3 = torch.float8_e4m3fn
#: The FP8 block's variants, native (the unfused model) first: the baseline.
FP8_VARIANTS = ("native", "triton", "cuda")
#: How far native's fp8 block may be from the bf16 block computed in fp32: fp8's rounding
#: (3 mantissa bits) of four projections' inputs and weights sits well under it; a wrong
#: scale or wiring misses by far more.
FP8_NATIVE_MAX = 0.25
#: The activations quantised in a block, by the name its static scales go under.
ACTIVATIONS = ("norm1", "o", "norm2", "down")


@dataclass
class Fp8Weights:
    """The block's weights for fp8: the norms' in bf16, each projection as (e4m3 weight
    (out, in), its fp32 scale (), the scale as a row (1, out): what a scale a token's
    _scaled_mm takes); and the activations' static scales (None: a scale a token)."""

    norm1: torch.Tensor
    norm2: torch.Tensor
    qkv: tuple
    o: tuple
    gate_up: tuple
    down: tuple
    scales: dict = field(default_factory=lambda: dict.fromkeys(ACTIVATIONS))
    # calibration's: each activation's largest scale seen (fp8_block fills it), else None
    seen: Optional[dict] = None

    def saw(self, name: str, s: torch.Tensor) -> None:
        if self.seen is not None:
            top = s.amax().float().reshape(())
            self.seen[name] = torch.maximum(self.seen[name], top) if name in self.seen else top


def quantise_weights(w: Weights) -> Fp8Weights:
    """w's projections in e4m3, a scale a tensor (its largest |value| at the format's max)."""

    def q(t: torch.Tensor) -> tuple:
        wq, s, _ = quantise_ref(t.float().reshape(1, -1), out_dtype=E4M3)
        s = s.reshape(())
        return wq.reshape(t.shape), s, s.expand(1, t.shape[0]).contiguous()

    return Fp8Weights(w.norm1, w.norm2, q(w.qkv), q(w.o), q(w.gate_up), q(w.down))


def quantise(y: torch.Tensor, scale: Optional[torch.Tensor]) -> tuple:
    """y quantised in PyTorch as the reference quantises (what an unfused model runs):
    (q, the static scale or each row's (..., 1))."""
    q, s, _ = quantise_ref(y.float(), scale=scale, out_dtype=E4M3)
    return q, s


def qlinear(q: torch.Tensor, s: torch.Tensor, weight: tuple) -> torch.Tensor:
    """q (..., in) times the e4m3 weight, scaled: a static scale with the weight's, or a
    scale a row with the weight's as a row; bf16 (..., out)."""
    wq, ws, ws_row = weight
    if not q.is_cuda:  # CPU _scaled_mm takes a scale a tensor only in some versions
        return ((q.float() * s) @ (wq.float() * ws).t()).to(torch.bfloat16)
    a = q.reshape(-1, q.shape[-1])
    row = s.numel() != 1
    out = torch._scaled_mm(a, wq.t(), scale_a=s.reshape(-1, 1) if row else s.reshape(()),
                           scale_b=ws_row if row else ws, out_dtype=torch.bfloat16)  # fmt: skip
    return out.reshape(*q.shape[:-1], -1)


def fp8_block(cfg: BlockConfig, w: Fp8Weights, add_norm_q, x, residual, cos, sin,
              k_cache=None, v_cache=None) -> tuple:  # fmt: skip
    """block's decoder block with its projections in fp8; add_norm_q(x, residual, weight,
    eps, scale) -> ((q, scales), residual_out). (Its MLP output, the residual.)"""
    (hq, hs), residual = add_norm_q(x, residual, w.norm1, cfg.eps, w.scales["norm1"])
    w.saw("norm1", hs)
    o = attend(cfg, qlinear(hq, hs, w.qkv), cos, sin, k_cache, v_cache)
    oq, os_ = quantise(o, w.scales["o"])
    w.saw("o", os_)
    (hq, hs), residual = add_norm_q(qlinear(oq, os_, w.o), residual, w.norm2, cfg.eps,
                                    w.scales["norm2"])  # fmt: skip
    w.saw("norm2", hs)
    gate, up = qlinear(hq, hs, w.gate_up).chunk(2, dim=-1)
    aq, as_ = quantise(torch.nn.functional.silu(gate) * up, w.scales["down"])
    w.saw("down", as_)
    return qlinear(aq, as_, w.down), residual


def native_add_norm_q(x, residual, weight, eps, scale):
    """The unfused model's: the add, F.rms_norm (y stored in bf16), then y quantised."""
    residual = x + residual
    return quantise(impls.native_rms_norm(residual, weight, eps), scale), residual


def ours_add_norm_q(mod) -> Callable:
    """A backend's quantised fused add: y written in fp8 in the norm's pass."""

    def add_norm_q(x, residual, weight, eps, scale):
        q, residual, s = mod.fused_add_rms_norm_quant(x, residual, weight, eps, scale=scale)
        return (q, s), residual

    return add_norm_q


def fp8_variants(
    vs: dict[str, Variant], device: str = "cuda"
) -> dict[str, tuple[Optional[Callable], Optional[str]]]:
    """{name: (add_norm_q, why not)} of FP8_VARIANTS: native's, and each backend whose
    variant runs on device (its package imports, with the quantised op)."""
    out: dict = {"native": (native_add_norm_q, None)}
    for name, package in (("triton", "triton_impl"), ("cuda", "cuda_impl")):
        why = why_not_on(vs[name], device) if name in vs else f"{name} not asked for"
        mod = None if why else _import(package)[0]
        if mod is not None and not hasattr(mod, "fused_add_rms_norm_quant"):
            why = f"{package} has no fused_add_rms_norm_quant (a build before it)"
        out[name] = (None, why) if why else (ours_add_norm_q(mod), None)
    return out


def calibrated(cfg: BlockConfig, w: Fp8Weights, args: tuple) -> Fp8Weights:
    """w with each activation's static scale: the largest a token takes in native's block
    on these inputs (one call with a scale a token), as the fp32 () tensors the ops take."""
    token = Fp8Weights(**{**vars(w), "scales": dict.fromkeys(ACTIVATIONS), "seen": {}})
    fp8_block(cfg, token, native_add_norm_q, *args)
    return Fp8Weights(**{**vars(w), "scales": token.seen, "seen": None})


def fp8_weights(run: Run, st: ShapeState) -> dict:
    """{scaling: Fp8Weights} of the run's block at a shape: its weights quantised once, the
    static scales calibrated on the shape's inputs (those the block's jobs run on)."""
    if not st.fp8:
        w8 = quantise_weights(run.weights)
        st.fp8 = {"token": w8, "static": calibrated(run.cfg, w8, st.inputs.args())}
    return st.fp8


def fp8_calls(cfg, w: Fp8Weights, fns: dict, args: tuple, compiled: bool) -> dict:
    """{variant: a call of its block on args}, each block on a code object of its own
    (block_fn), compiled fullgraph where asked."""
    calls = {}
    for name, fn in fns.items():
        blk = block_fn(cfg, w, fn, f"fp8_{name}", body=fp8_block)
        if compiled:
            blk = torch.compile(blk, fullgraph=True, dynamic=False)
        calls[name] = functools.partial(blk, *args)
    return calls


def fp8_checks(calls: dict, truth: tuple) -> dict:
    """{variant: agreement}: native's block within FP8_NATIVE_MAX of the fp32 bf16 block,
    the others within TRUTH_FACTOR of native's error."""
    checks: dict = {}
    for name, call in calls.items():
        native = checks.get("native", {}).get("rel_err") if name != "native" else None
        try:
            checks[name] = agreement(call(), truth, native, most=FP8_NATIVE_MAX)
        except Exception as e:
            checks[name] = raised(e)
    return checks


def piece_calls(run: Run, st: ShapeState, w: Fp8Weights, fns: dict, compiled: bool) -> dict:
    """{variant: its add, norm and quantisation of norm1 alone at the in-block shape}."""
    x, residual = st.inputs.x, st.inputs.residual
    out = {}
    for name, fn in fns.items():
        f = torch.compile(fn, fullgraph=True, dynamic=False) if compiled else fn
        out[name] = functools.partial(f, x, residual, w.norm1, run.cfg.eps, w.scales["norm1"])
    return out


def run_fp8_job(run: Run, scaling: str, shape: Shape, mode: str, names: list[str]) -> None:
    """The FP8 block with a scaling at shape in mode: each variant built (compiled in the
    compile mode), checked, profiled and timed interleaved; its pieces alone profiled for f
    and s; one record a variant."""
    op = fp8_op(scaling)
    st = _state(run, shape)  # the block's inputs and its fp32 truth at the shape
    w = fp8_weights(run, st)[scaling]
    fns = {}
    for name, (fn, why) in fp8_variants(run.variants).items():
        if name not in names:
            continue
        if why:
            _write_skip(run, shape, mode, name, op, why)
            continue
        fns[name] = fn
    compiled = mode == "compile"
    if compiled:
        _enter_compile_shape(run, st)
    calls = fp8_calls(run.cfg, w, fns, st.inputs.args(), compiled)
    pieces = piece_calls(run, st, w, fns, compiled)
    compile_s: dict = dict.fromkeys(calls)
    for name in list(calls):
        try:
            if compiled:  # the first call compiles: its seconds, kept out of the timing
                compile_s[name] = _sync_time(calls[name])
            pieces[name]()  # compiled (and tuned) before it is profiled
        except Exception as e:
            why = "did not compile, or its piece alone raised"
            _write_raised(run, shape, mode, name, op, e, why)
            del calls[name]
    checks = fp8_checks(calls, st.truth)
    ready, rows = {}, {}
    for name, call in calls.items():
        kernels = profiled(run, shape, mode, name, op, call, checks[name])
        if kernels is None:
            continue
        ready[name] = Ready(call, call, (), compile_s[name])
        alone = kernel_times(pieces[name], calls=2)
        rows[name] = {"kernels": kernels, "alone": alone, "piece": _total(alone)[1]}
    if not ready:
        return
    blocks, clk = _time_blocks(run, st, mode, ready, op)
    base = blocks.get("native")
    nat = rows.get("native")
    for name, per in blocks.items():
        n, us = _total(rows[name]["kernels"])
        per_block, stats, spr = timing.block_summary(per)
        block_us = _total(nat["kernels"])[1] if nat else 0.0
        f = 2 * nat["piece"] / block_us if nat and block_us else None
        s = nat["piece"] / rows[name]["piece"] if nat and rows[name]["piece"] else None
        sp = _speedup(base, per) if base else None
        # no bound where the pieces' times make no share (a piece alone's kernels longer
        # than its half of the block's)
        bound = amdahl_bound(f, s) if f is not None and 0.0 <= f <= 1.0 and s else None
        flag = bool(sp and bound and exceeds(sp["median"], sp["lo"], sp["hi"], bound))
        m = {
            "calls_per_sample": shape.calls,
            "kernel_us": us,
            "kernel_count": n,
            "device_busy": us / stats["median_us"] if us else None,
            "rel_err": checks[name]["rel_err"],
            "compiled": any(k.startswith("triton_") for k in rows[name]["kernels"])
            if compiled
            else None,
            "norm": {
                "f": f,
                "method": "alone",
                "kernels": {k: {**v, "alone": True} for k, v in rows[name]["alone"].items()},
            },
            "step": {"f": f},
            "s_cold": s,
            "bound": bound,
            "speedup": sp,
            "speedup_over": "native",
            "flag": flag,
            "scaling": scaling,
        }
        if flag:
            m["why"] = [
                "s is of the pieces alone: what the fused quantisation changes beyond its "
                "own kernels (the bytes and launches the block no longer has around it) is "
                "not in it"
            ]
        _write_block(
            run, shape, mode, name, status="PASS", block=op, correct=checks[name],
            samples_us=[v for b in per for v in timing.to_us(b)], blocks=per_block,
            stats=stats, spread=spr, clocks=clk, compile_s=compile_s[name],
            kernels={"names": sorted(rows[name]["kernels"]), "count": n, "us": us},
            notes=[
                f"{shape.calls} back-to-back blocks a sample, L2 flushed before each",
                "projections in fp8 (torch._scaled_mm); f and s from the pieces' kernel "
                "times alone (the add, the norm and the quantisation of norm1)",
            ],
            model=m,
        )  # fmt: skip
        run.say(
            f"{op} {shape.name} {mode}/{name}: {stats['median_us']:.1f} us"
            + (f", x{sp['median']:.3f} over native (bound {bound:.3f})" if sp and bound else "")
        )


@torch.no_grad()
def check_fp8(cfg: BlockConfig, vs: dict[str, Variant], shape: Shape, seed: int, device="cpu"):
    """{scaling: {variant: check}} of the FP8 block at cfg's sizes on device (CPU: the tiny
    config, the variants that run there), each against the bf16 block in fp32."""
    weights = make_weights(cfg, device, seed)
    args = make_inputs(cfg, shape, device, seed).args()
    truth = fp32_block(cfg, weights, args)
    w8 = quantise_weights(weights)
    variants_here = fp8_variants(vs, device)
    fns = {n: fn for n, (fn, why) in variants_here.items() if not why}
    skipped = {n: {"skipped": why} for n, (_, why) in variants_here.items() if why}
    out = {}
    for scaling in FP8_SCALINGS:
        w = w8 if scaling == "token" else calibrated(cfg, w8, args)
        out[scaling] = {
            **fp8_checks(fp8_calls(cfg, w, fns, args, compiled=False), truth),
            **skipped,
        }
    return out
