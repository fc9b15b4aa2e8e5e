"""The Triton RMSNorm op: y = x / sqrt(mean(x^2) + eps) * weight over x's last dimension.

Layers, each importing only those before it: kernels.py (the @triton.jit kernels),
configs.py (typed launch configs, the default rule, the sweep's search space), launch.py
(one launch planned: rows, config, grid, arguments), eager.py (the eager fast path), and
this file: the torch.library registration (``triton_impl::rms_norm``, ``rms_norm_out``),
the public function, ``kernel_info`` and ``rms_norm_with_config`` for kernel work, and the
``RMSNorm`` module. Semantics, precision and accepted input: rmsnorm_api; the kernels'
parallelisation: kernels.py.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from rmsnorm_api import DEFAULT_EPS, RMSNormModule, call_op, check_inputs, check_out
from triton_impl.configs import Config
from triton_impl.eager import eager_ok, eager_rms_norm
from triton_impl.fused_add_rms_norm_op import fused_add_rms_norm
from triton_impl.kernels import INTERPRET
from triton_impl.launch import has_work, launch, op, plan

_IMPL = "triton_impl.rms_norm"


def _run(x, weight, eps, y, cfg: Optional[Config] = None) -> None:
    """rms_norm(x, weight, eps) into the contiguous y (checked by the caller); no launch for
    an empty x."""
    if has_work(x):
        launch(plan(x, weight, eps, y, cfg))


@op("triton_impl::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=_IMPL)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run(x, weight, eps, y)
    return y


@op("triton_impl::rms_norm_out", mutates_args={"out"})
def _rms_norm_out_op(
    out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float
) -> None:
    check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=_IMPL)
    check_out(out, x, weight, impl=_IMPL)
    _run(x, weight, eps, out)


# Nested tensors stop at their autograd key, which the ops above have no kernel for: there
# the checks name x instead of the dispatcher's "could not run" (as on the CUDA side).
_NESTED_KEY = "AutogradNestedTensor"
_NESTED = torch.library.Library("triton_impl", "IMPL")
_NESTED.impl("rms_norm", lambda x, w, eps: check_inputs(x, w, eps, impl=_IMPL), _NESTED_KEY)
_NESTED.impl(
    "rms_norm_out", lambda out, x, w, eps: check_inputs(x, w, eps, impl=_IMPL), _NESTED_KEY
)


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """RMSNorm over x's last dim with the Triton kernel; semantics as in rmsnorm_api.

    Returns a new contiguous tensor of x's shape and dtype, or writes into ``out`` (a
    contiguous tensor of x's shape, dtype and device) and returns it. Raises
    TypeError/ValueError naming the argument for unsupported input.
    """
    if not INTERPRET and eager_ok(x, weight, out):
        return eager_rms_norm(x, weight, eps, _IMPL)
    ops = torch.ops.triton_impl
    return call_op(
        ops.rms_norm, ops.rms_norm_out, x, weight, eps, out, impl=_IMPL, allow_cpu=INTERPRET
    )


_GPU_ONLY = " (kernel_info reads a compiled GPU kernel's metadata; the interpreter compiles none)"


def kernel_info(x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> dict:
    """The compiled kernel rms_norm runs for x (GPU only): its name, the launch config it
    was planned with (the latency rule included), registers and spills a thread, warps and
    shared memory, from Triton's metadata."""
    check_inputs(x, weight, DEFAULT_EPS, impl="triton_impl.kernel_info", device_hint=_GPU_ONLY)
    if x.device.type != "cuda":
        raise ValueError(f"triton_impl.kernel_info: x is on device '{x.device}'; expected a"
                         f" CUDA tensor{_GPU_ONLY}")  # fmt: skip
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    p = plan(x, weight, DEFAULT_EPS, y)
    compiled = p.kernel.warmup(*p.args, grid=p.grid, **p.meta)
    init = getattr(compiled, "_init_handles", None)
    if init is not None:  # registers and spills are read when the binary is loaded
        init()
    md = compiled.metadata
    config = p.cfg.as_dict()
    if "WAIT" in p.meta:  # the sharded kernel's schedule as launched (launch.wait_if_resident)
        config.update(wait=p.meta["WAIT"], reload=p.meta["RELOAD"])
    return dict(
        name=getattr(md, "name", p.kernel.__name__),
        config=config,
        grid=list(p.grid),
        n_regs=getattr(compiled, "n_regs", None),
        n_spills=getattr(compiled, "n_spills", None),
        num_warps=getattr(md, "num_warps", None),
        shared_bytes=getattr(md, "shared", None),
    )


def rms_norm_with_config(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, cfg: Union[Config, dict]
) -> torch.Tensor:
    """rms_norm with a forced launch config (a triton_impl.configs.Config, or its as_dict()
    form), for sweeps; same result. ValueError names a field no kernel can run."""
    check_inputs(x, weight, eps, allow_cpu=INTERPRET, impl=_IMPL)
    cfg = Config.forced(cfg, x.shape[-1], x.element_size(), "rms_norm_with_config")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run(x, weight, float(eps), y, cfg)
    return y


class RMSNorm(RMSNormModule):
    """torch.nn.RMSNorm drop-in (1-D normalized_shape) running the Triton kernel."""

    _fn = staticmethod(rms_norm)
    _fused_fn = staticmethod(fused_add_rms_norm)
