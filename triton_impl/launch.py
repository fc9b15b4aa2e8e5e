"""Planning and launching a Triton RMSNorm: rows as (M, N), the config, grid and arguments.

``plan(op, ins, weight, eps, outs, cfg=None)`` is the one place a launch of either forward
op is decided: the generic launch (``launch(plan(...))``), the eager fast path
(triton_impl.eager) and ``kernel_info`` all take its answer, so what is reported is what
runs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

from rmsnorm_api import DTYPE_NAMES, as_rows, head_rows
from triton_impl.configs import (
    Config,
    default_config,
    fused_tile,
    kernel_for,
    latency_config,
    quant_config,
)
from triton_impl.kernels import INTERPRET, QUANT_OFF, _rms_norm_fwd_heads
from triton_impl.tuning import FUSED_MAX_N


@dataclass(frozen=True)
class Launch:
    """One planned launch: the config, the @triton.jit kernel, its grid, its runtime
    arguments (x, w, y, [workspace,] strides, [M,] N, eps) and its compile-time ones
    (meta)."""

    cfg: Config
    kernel: object
    grid: tuple
    args: tuple
    meta: dict

    @property
    def reusable(self) -> bool:
        """Whether another call may launch with these arguments' shape (the eager plan
        cache): not the sharded kernel's, whose workspace is zeroed for each launch."""
        return self.cfg.kernel != "sharded"


def sharded_workspace(m: int, shards: int, device: torch.device) -> tuple:
    """The sharded kernels' (partial sums (m, shards) fp32, arrival counts (m,) int32), the
    counts zeroed: allocated for each launch, so that launches on different streams (or a
    launch that failed) share no count. Two tensors, not views of one: inductor cannot
    lower a dtype view of a slice."""
    part = torch.empty(m * shards, dtype=torch.float32, device=device)
    return part, torch.zeros(m, dtype=torch.int32, device=device)


def split_ok(x2: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether the split kernel's vector accesses of the other rows (y; the fused add's
    residual and residual_out too) line up with its vector loads of x: each row equally far
    from a 16-byte boundary as x's, in x's elements, judged from strides and storage offsets
    (allocations are 16-byte aligned; no data pointer, so this also holds while tracing). A
    choice of speed only: the kernels are correct for any pointers."""
    vec = 16 // x2.element_size()
    return all(
        (x2.stride(0) - o.stride(0)) % vec == 0
        and (x2.storage_offset() - o.storage_offset()) % vec == 0
        for o in others
    )


@functools.cache
def sm_count(device: Optional[int]) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def wait_if_resident(meta: dict, sms: int) -> dict:
    """The sharded kernel's meta with WAIT kept only where a row's programs can all be
    resident at once: one program an SM always is, so rows of more shards than SMs take the
    last-arrival schedule, which never waits (a waiting row whose last program could not
    start would wait forever). sms = 0: the interpreter (or no GPU), whose programs run one
    after another, none resident beside another. RELOAD, a part of the waiting schedule,
    goes with it."""
    if meta.get("WAIT") and meta["SHARDS"] > sms:
        return {**meta, "WAIT": False, "RELOAD": False}
    return meta


def _sharded_launch(
    cfg: Config, kernel, meta: dict, m: int, x: torch.Tensor, tensors: tuple, rest: tuple
) -> Launch:
    """A sharded kernel's launch: its workspace after the row tensors, a program a shard."""
    meta = wait_if_resident(meta, sm_count(x.device.index) if x.is_cuda and not INTERPRET else 0)
    ws = sharded_workspace(m, meta["SHARDS"], x.device)
    return Launch(cfg, kernel, (m * meta["SHARDS"],), (*tensors, *ws, *rest), meta)


def takes_heads(
    x: torch.Tensor, cfg: Optional[Config] = None, weight: Optional[torch.Tensor] = None
) -> bool:
    """Whether rms_norm's launch for x is the heads kernel's (x head rows, head_rows, or a
    weight row a head): the default config (cfg None) of a width the fused tile holds."""
    per_head = weight is not None and weight.dim() == 2
    return (
        cfg is None
        and int(x.shape[-1]) <= FUSED_MAX_N[x.element_size()]
        and (per_head or head_rows(x) is not None)
    )


def heads_view(x: torch.Tensor) -> torch.Tensor:
    """x as (T, H, N): its head rows where they lie (head_rows), else its rows (copied only
    where its leading dimensions do not merge)."""
    x3 = head_rows(x)
    return x3 if x3 is not None else x.reshape(-1, x.shape[-2], x.shape[-1])


def _heads_launch(x3: torch.Tensor, weight, eps, y: torch.Tensor, weight_offset: float) -> Launch:
    """The heads kernel's launch: the fused kernel's tile for the width (its latency rule
    where the rows take fewer programs than SMs), y as x's heads (new and contiguous, or x
    itself: out=x)."""
    t, h, n = x3.shape
    m = t * h
    y3 = y.view(t, h, n) if y.is_contiguous() else head_rows(y)
    cfg = fused_tile(n, x3.element_size())
    if x3.is_cuda and triton.cdiv(m, cfg.block_m) < sm_count(x3.device.index):
        cfg = latency_config(cfg, x3.element_size())
    _, meta = kernel_for("rms_norm", cfg, x3.element_size(), weight is not None, n, False,
                         weight_offset)  # fmt: skip
    for k in QUANT_OFF:  # the fused kernel's quantised output, which the heads kernel lacks
        del meta[k]
    meta["W_HEADS"] = weight is not None and weight.dim() == 2
    w = weight.contiguous() if weight is not None else x3
    args = (x3, w, y3, x3.stride(0), x3.stride(1), y3.stride(0), y3.stride(1), m, n, h, eps)
    return Launch(cfg, _rms_norm_fwd_heads, (triton.cdiv(m, cfg.block_m),), args, meta)


@dataclass(frozen=True)
class Quant:
    """A quantised output (the fused and looped kernels' epilogue, kernels._store_y): the
    caller's static scale, or dynamic scales written to `scales` (a row's, group 0, under
    an optional upper bound `bound`; or a group's of `group` columns)."""

    scale: Optional[torch.Tensor]
    group: int
    bound: Optional[torch.Tensor]
    scales: torch.Tensor


def quant_meta(q: Quant, dtype: torch.dtype) -> dict:
    """The kernels' constexprs of a quantised output in fp8 dtype `dtype`: the mode (1
    static, 2 a row's scale, 3 a group's), the group, the dtype's largest value, mantissa
    bits and smallest normal, whether a bound clamps the row's scale, and whether the
    rounding to fp8 is done by hand (the interpreter's cast truncates)."""
    mode = 1 if q.scale is not None else 3 if q.group else 2
    fi = torch.finfo(dtype)
    mant = round(-math.log2(fi.eps))  # eps: 2^-(mantissa bits)
    return dict(QUANT=mode, GROUP=q.group or 1, Q_MAX=float(fi.max), Q_MANT=mant,
                Q_TINY=float(fi.tiny), Q_UB=q.bound is not None, Q_BY_HAND=INTERPRET)  # fmt: skip


def _quant_args(q: Quant, n: int) -> dict:
    """The kernels' runtime arguments of a quantised output: the scale or the bound read
    (q_in), the scales written (q_out) and their row stride."""
    q_in = q.scale if q.scale is not None else q.bound
    stride = (n // q.group if q.group else 1) if q.scale is None else 0
    return dict(q_in=q_in, q_out=q.scales, stride_q=stride)


def plan(
    op: str,
    ins: tuple,
    weight: Optional[torch.Tensor],
    eps: float,
    outs: tuple,
    cfg: Optional[Config] = None,
    weight_offset: float = 0.0,
    quant: Optional[Quant] = None,
) -> Launch:
    """The launch of forward op ``op`` (kernels.FORWARD_KERNELS' name) reading the row
    tensors ins (x, and the fused add's residual) and writing outs (y, and the fused add's
    residual_out; any row strides: the in-place form passes ins themselves): the op's
    default rule (the latency rule included, on a GPU), or a forced ``cfg``. The kernels
    of both ops take (ins, weight, outs, [workspace,] their row strides, [M,] N, eps), and
    the weight offset as a constant of the compile (meta). quant: y quantised (y an fp8
    tensor), by the fused or looped kernel (configs.quant_config)."""
    x = ins[0]
    n = int(x.shape[-1])
    if op == "rms_norm" and quant is None and takes_heads(x, cfg, weight):
        return _heads_launch(heads_view(x), weight, eps, outs[0], weight_offset)
    # Block shape and warps are compile-time choices: under dynamic-shape tracing this
    # specialises on the row width (a guard), while M may stay symbolic.
    in2 = tuple(as_rows(t) for t in ins)
    out2 = tuple(t.view(-1, n) for t in outs)
    rows = (*in2, *out2)
    m = in2[0].shape[0]
    has_weight = weight is not None
    w = weight.contiguous() if has_weight else in2[0]  # dummy pointer, never read
    if cfg is None:
        # the dtype-keyed entries were measured with every input row in x's dtype
        same = all(t.dtype == x.dtype for t in ins)
        dtype = DTYPE_NAMES.get(x.dtype) if same else None
        rows_at, sms = (m, sm_count(x.device.index)) if x.is_cuda else (None, None)
        cfg = default_config(
            n, x.element_size(), op, split_ok=split_ok(*rows), dtype=dtype, rows=rows_at, sms=sms
        )
        if quant is not None:  # a forced config is taken as it is (kernel_for checks it)
            cfg = quant_config(cfg, n, x.element_size(), dynamic=quant.scale is None)
    q_meta = None
    if quant is not None:
        q_meta = {**quant_meta(quant, outs[0].dtype), **_quant_args(quant, n)}
    by_hand = INTERPRET and outs[-1].dtype == torch.bfloat16
    kernel, meta = kernel_for(op, cfg, x.element_size(), has_weight, n, by_hand, weight_offset,
                              q_meta)  # fmt: skip
    tensors = (*in2, w, *out2)
    strides = tuple(t.stride(0) for t in rows)
    if cfg.kernel == "split":
        return Launch(cfg, kernel, (m,), (*tensors, *strides, n, eps), meta)
    if cfg.kernel == "sharded":
        return _sharded_launch(cfg, kernel, meta, m, x, tensors, (*strides, m, n, eps))
    if cfg.kernel == "looped":  # the width a constexpr (meta), not an argument
        args = (*tensors, *strides, m, eps)
    else:  # fused
        args = (*tensors, *strides, m, n, eps)
    return Launch(cfg, kernel, (triton.cdiv(m, cfg.block_m),), args, meta)


def has_work(x: torch.Tensor) -> bool:
    """Whether a call on x launches anything: not for an empty x, nor for a meta one (shape
    inference: the outputs are allocated on meta, and nothing runs), nor under the
    interpreter for a fake one (the op's fake, see op: the interpreter would read the fake
    tensor's data)."""
    if x.numel() == 0 or x.device.type == "meta":
        return False
    return not (INTERPRET and is_fake(x))


def op(name: str, mutates_args):
    """Register a Triton op: torch.library.triton_op on a GPU (torch.compile sees its
    kernels through wrap_triton); under the interpreter an opaque torch.library.custom_op,
    its function its own fake (nothing launches on fake tensors: has_work), since tracing
    into a triton_op there would keep no kernel: wrap_triton stands aside for the
    interpreter's kernels, and the graph would return its outputs unwritten."""
    if not INTERPRET:
        return triton_op(name, mutates_args=mutates_args)

    def register(fn):
        opdef = torch.library.custom_op(name, fn, mutates_args=mutates_args)
        opdef.register_fake(fn)
        return opdef

    return register


def run(kernel, grid: tuple, *args, **meta) -> None:
    """Launch a @triton.jit kernel: through wrap_triton on a GPU (traceable), directly under
    the interpreter (see op)."""
    if INTERPRET:
        kernel[grid](*args, **meta)
    else:
        wrap_triton(kernel)[grid](*args, **meta)


def launch(p: Launch) -> None:
    """Run a planned launch (see run)."""
    run(p.kernel, p.grid, *p.args, **p.meta)
