"""The norm variants and the decoder block they run in.

The block, bf16 with seeded random weights: hidden 4096, 32 query and 8 key/value heads of
128, rotary embeddings, SDPA with GQA, a SwiGLU MLP of 14336, a pre-norm residual stream;
the projections held fused, as inference engines hold them (one QKV and one gate-up
matmul). A block is timed as the residual stream entering it, so both of its norms follow
an add (the next block's first norm would fuse this block's last add):

    h, r = add_norm(prev_out, r, w1); a = attn(h); h, r = add_norm(a, r, w2); out = mlp(h)

``add_norm`` is ``r = x + r; h = norm(r)`` for the plain variants and one kernel for the
fused ones. Variants: native (F.rms_norm), eager (the composite transformers' LlamaRMSNorm
runs: float, pow, mean, rsqrt, mul, cast, weight mul), triton and cuda (ours), triton_fused
and cuda_fused (our fused add), triton_pass and cuda_pass (native's block, compiled with
rmsnorm_api.enable_compile_fusion: our fused add put in by Inductor's pattern matcher),
triton_plain_pass and cuda_plain_pass (our plain op's block, compiled with the same pass:
the add and our norm made one fused call before autograd).

Every block is checked on its outputs against the block computed in fp32 from the same
bf16 weights and inputs (fp32_block), as close to it as native's eager block within
TRUTH_FACTOR (agreement).
"""

from __future__ import annotations

import importlib
import math
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

# harness.impls first: without a GPU it sets TRITON_INTERPRET=1 before Triton is imported
from harness import impls  # isort: skip
from harness import measure
from harness.model.config import FUSED, NATIVE_MAX, TRUTH_FACTOR, BlockConfig, Shape
from harness.reference import rms_norm_ref

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
    compile_pass: Optional[str] = None  # the backend enable_compile_fusion installs to compile

    @property
    def fused(self) -> bool:
        return self.name in FUSED


def why_not_on(v: Variant, device: str) -> Optional[str]:
    """None if the variant runs on device ("cpu" or "cuda"), else why not."""
    return v.unavailable or (None if v.cpu or device != "cpu" else "needs a CUDA GPU")


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
    for name in ("triton", "cuda"):  # native's block, our fused op put in by the pass
        why = out[f"{name}_fused"].unavailable
        add_norm = unfused(impls.native_rms_norm)
        out[f"{name}_pass"] = Variant(f"{name}_pass", add_norm, None, unavailable=why,
                                      compile_pass=name)  # fmt: skip
    for name in ("triton", "cuda"):  # our plain op's block, the add fused into it by the pass
        why = out[f"{name}_fused"].unavailable
        out[f"{name}_plain_pass"] = Variant(f"{name}_plain_pass", out[name].add_norm, None,
                                            unavailable=why, compile_pass=name)  # fmt: skip
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
    o = attend(cfg, F.linear(h, w.qkv), cos, sin, k_cache, v_cache)
    return F.linear(o, w.o)


def attend(cfg: BlockConfig, qkv, cos, sin, k_cache=None, v_cache=None) -> torch.Tensor:
    """Attention from the QKV projection's output to the output projection's input:
    (batch, tokens, q_size)."""
    b, s, _ = qkv.shape
    q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
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
    return o.transpose(1, 2).reshape(b, s, cfg.q_size)


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


def block_fn(
    cfg: BlockConfig, w: Weights, add_norm: Callable, name: Optional[str] = None, body=None
) -> Callable:
    """The block as a function of its inputs alone: what torch.compile traces. Named (a
    variant's name), it runs a code object of its own: dynamo keeps its compiled entries
    on the code object and takes any whose guards hold, and a pass variant's block holds
    the same functions as native's or ours (guarded by code and closure, not identity), so
    on a shared code object it would run the graph compiled before the pass was installed.
    One code object a variant also keeps each under dynamo's recompile limit. body: the
    block function (block's signature; default block)."""
    body = body or block

    def run(x, residual, cos, sin, k_cache=None, v_cache=None):
        return body(cfg, w, add_norm, x, residual, cos, sin, k_cache, v_cache)

    if name is None:
        return run
    code = run.__code__.replace(co_name=f"block_{name}")
    return types.FunctionType(code, run.__globals__, code.co_name, run.__defaults__,
                              run.__closure__)  # fmt: skip


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


def raised(e: BaseException) -> dict:
    """agreement's fields for a variant whose call raised e: failed, with its first line."""
    return {"rel_err": None, "limit": None, "passed": False, "error": measure.first_line(e)}


def agreement(
    outs: tuple, truth: tuple, native: Optional[float] = None, most: float = NATIVE_MAX
) -> dict:
    """{rel_err, limit, passed, error}: the worse relative L2 error of outs against the fp32
    block's, within TRUTH_FACTOR of native's error ``native`` (most where None, and at
    most most)."""
    worst = max(rel_err(o, t) for o, t in zip(outs, truth, strict=True))
    limit = most if native is None else min(most, TRUTH_FACTOR * native)
    ok = worst <= limit
    error = None if ok else f"relative L2 error {worst:.3g} from the fp32 block > {limit:.3g}"
    return {"rel_err": worst, "limit": limit, "passed": ok, "error": error}
