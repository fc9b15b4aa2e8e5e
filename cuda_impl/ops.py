"""Python face of the CUDA C++ RMSNorm: loads the extension, registers fakes, wraps the ops
(rms_norm and the fused residual add, fused_add_rms_norm / fused_add_rms_norm_).

The library is whichever build rmsnorm_api.host finds: ``$CUDA_IMPL_LIBRARY`` if set (e.g.
the CMake build's), else ``cuda_impl/_C*.so`` from ``python setup.py build_ext --inplace``.
Same semantics, checks and error messages as triton_impl (rmsnorm_api); the C++ side applies
the same rules (rmsnorm_api.spec) for direct torch.ops callers.
"""

from __future__ import annotations

from typing import Optional

import torch

from cuda_impl.configs import Config
from rmsnorm_api import (
    DEFAULT_EPS,
    RMSNormModule,
    backward_functions,
    bypass_ok,
    call_op,
    check_call,
    check_forced_config_grad,
    check_fused_inputs,
    check_in_place,
    check_inputs,
    empty_outputs,
    host,
    register_autograd,
)
from rmsnorm_api.quant import quant_functions
from rmsnorm_api.spec import OPS as DESCRIBED
from rmsnorm_api.spec import REQUIRED

_IMPL = "cuda_impl.rms_norm"
_FUSED = "cuda_impl.fused_add_rms_norm"
_FUSED_ = "cuda_impl.fused_add_rms_norm_"

LIBRARY = host.library_path()
torch.ops.load_library(LIBRARY)
_OP = torch.ops.cuda_impl.rms_norm.default
#: the library's eager entry points (rmsnorm_api.host), None for the CMake library
_FAST = host.entry()


_BWD = "cuda_impl.rms_norm_backward"
_FUSED_BWD = "cuda_impl.fused_add_rms_norm_backward"


def _register_fake(op: str, impl: str) -> None:
    """The op's fake (tracing, meta tensors), from its description: the checks the CUDA
    kernel runs, so torch.compile never traces a call the kernel would refuse, then its
    returned tensors as the description gives them."""
    spec = DESCRIBED[op]
    names = tuple(a.name for a in spec.args)
    defaults = {a.name: a.default for a in spec.args if a.default is not REQUIRED}

    def fake(*args, **kwargs):
        values = {**defaults, **dict(zip(names, args, strict=False)), **kwargs}
        check_call(op, impl, values)
        outs = empty_outputs(op, **values)
        return outs[0] if len(outs) == 1 else (outs or None)

    torch.library.register_fake(f"cuda_impl::{op}")(fake)


for _op, _impl in (
    ("rms_norm", _IMPL),
    ("rms_norm_out", _IMPL),
    ("fused_add_rms_norm", _FUSED),
    ("fused_add_rms_norm_", _FUSED_),
    ("rms_norm_backward", _BWD),
    ("fused_add_rms_norm_backward", _FUSED_BWD),
    ("rms_norm_quant", "cuda_impl.rms_norm_quant"),
    ("fused_add_rms_norm_quant", "cuda_impl.fused_add_rms_norm_quant"),
    ("fused_add_rms_norm_quant_", "cuda_impl.fused_add_rms_norm_quant_"),
):
    _register_fake(_op, _impl)

register_autograd("cuda_impl")
rms_norm_quant, fused_add_rms_norm_quant, fused_add_rms_norm_quant_ = quant_functions("cuda_impl")

_FUSED_OP = torch.ops.cuda_impl.fused_add_rms_norm.default
_FUSED_OP_ = torch.ops.cuda_impl.fused_add_rms_norm_.default


def _on_gpu(x, *others) -> bool:
    """Whether a call may go straight to the op's CUDA kernel, whose C++ checks raise the
    same errors as rmsnorm_api's (the Python checks cost host time on small calls): CUDA
    tensors, none with a negative bit outside compiling (the dispatcher resolves the bit
    before the C++ checks see it, and the Python checks refuse a negative view that would be
    written; under torch.compile the op's fake checks what it traces)."""
    if not (
        isinstance(x, torch.Tensor)
        and x.is_cuda
        and all(t is None or (isinstance(t, torch.Tensor) and t.is_cuda) for t in others)
    ):
        return False
    if torch.compiler.is_compiling():
        return True
    return not (x.is_neg() or any(t is not None and t.is_neg() for t in others))


#: The key a call that needs no gradient dispatches to, below Autograd: the autograd
#: kernel torch.library.register_autograd installs is Python and runs on every call, a
#: gradient or not, at more host time than the rest of a small call
#: (docs/notebook/07-decode-and-host-time.md, v28).
_CUDA_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    out: Optional[torch.Tensor] = None,
    weight_offset: float = 0.0,
) -> torch.Tensor:
    """RMSNorm over x's last dim with the CUDA C++ kernel; semantics as in rmsnorm_api.

    Returns a new contiguous tensor of x's shape and dtype, or writes into ``out`` and
    returns it. weight_offset: added to the weight in fp32 (Gemma's 1 + w: 1.0). Raises
    TypeError/ValueError naming the argument for unsupported input.
    """
    if out is None and type(eps) is float and type(weight_offset) is float:
        # the eager fast path: the entry point tests bypass_ok's conditions itself (None:
        # not a plain eager call); dynamo folds is_compiling and never traces the entry
        if _FAST is not None:
            if not torch.compiler.is_compiling():
                y = _FAST.rms_norm(x, weight, eps, weight_offset)
                if y is not None:
                    return y
        elif bypass_ok(x, weight):
            return _OP.redispatch(_CUDA_KEYS, x, weight, eps, weight_offset)
        if _on_gpu(x, weight):
            return _OP(x, weight, eps, weight_offset)
    ops = torch.ops.cuda_impl
    return call_op(ops.rms_norm, ops.rms_norm_out, x, weight, eps, out, weight_offset,
                   impl=_IMPL)  # fmt: skip


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, residual_out): residual_out = x + residual (an fp32 add rounded once to
    residual's dtype), y = RMSNorm(residual_out) in x's dtype, in one pass; residual in x's
    dtype or float32. Raises TypeError/ValueError naming the argument for unsupported input."""
    # residual=None is refused by the op's checks (bypass_ok takes None for an absent tensor,
    # the entry point refuses it as not a tensor)
    floats = type(eps) is float and type(weight_offset) is float
    if floats and residual is not None:
        if _FAST is not None:
            if not torch.compiler.is_compiling():
                outs = _FAST.fused_add_rms_norm(x, residual, weight, eps, weight_offset)
                if outs is not None:
                    return outs
        elif bypass_ok(x, residual, weight):
            return _FUSED_OP.redispatch(_CUDA_KEYS, x, residual, weight, eps, weight_offset)
    if not floats or not _on_gpu(x, residual, weight):
        check_fused_inputs(x, residual, weight, eps, weight_offset, impl=_FUSED)
    return _FUSED_OP(x, residual, weight, float(eps), float(weight_offset))


def fused_add_rms_norm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    weight_offset: float = 0.0,
) -> None:
    """In place: residual <- x + residual, x <- RMSNorm(residual), as vLLM's op; captures in
    CUDA graphs with no allocation. Raises TypeError/ValueError naming the argument (x and
    residual must view as rows in place and not overlap)."""
    floats = type(eps) is float and type(weight_offset) is float
    fast = floats and _FAST is not None and residual is not None
    if fast and not torch.compiler.is_compiling():
        if _FAST.fused_add_rms_norm_(x, residual, weight, eps, weight_offset):
            return
    if not floats or not _on_gpu(x, residual, weight):
        check_fused_inputs(x, residual, weight, eps, weight_offset, impl=_FUSED_)
        check_in_place(x, residual, weight, impl=_FUSED_)
    _FUSED_OP_(x, residual, weight, float(eps), float(weight_offset))


rms_norm_backward, fused_add_rms_norm_backward = backward_functions("cuda_impl")


def fused_add_rms_norm_with_config(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    cfg: Config,
    *,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fused_add_rms_norm with a forced launch config, for sweeps and profiles; same result.
    cfg: one of cuda_impl.compiled_configs('fused_add_rms_norm'), its cluster the CTAs
    sharing a row."""
    check_fused_inputs(x, residual, weight, eps, weight_offset, impl=_FUSED)
    check_forced_config_grad(
        "cuda_impl.fused_add_rms_norm_with_config", x=x, residual=residual, weight=weight
    )
    _check_cfg(cfg, "fused_add_rms_norm_with_config")
    return torch.ops.cuda_impl.fused_add_rms_norm_with_config(
        x, residual, weight, float(eps), *_cfg_fields(cfg), float(weight_offset)
    )


def kernel_info(x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> dict:
    """The kernel rms_norm launches for x (its rows and this GPU's SMs decide between the
    throughput and the latency ladder): its config, and from cudaFuncGetAttributes the
    registers a thread and local memory (stack and spills) in bytes."""
    check_inputs(x, weight, DEFAULT_EPS, impl=_IMPL)
    rt, vpt, ranks, variant, *attrs = torch.ops.cuda_impl.rms_norm_kernel_info(x, weight)
    keys = ("n_regs", "local_bytes", "shared_bytes", "max_threads")
    return dict(
        config=Config(rt, vpt, ranks, variant).as_dict(), **dict(zip(keys, attrs, strict=True))
    )


def _check_cfg(cfg, fn: str) -> None:
    """A forced config must be a Config (its fields become the C++ op's ints)."""
    if not isinstance(cfg, Config):
        raise ValueError(f"{fn}: cfg must be a cuda_impl.configs.Config, got {type(cfg).__name__}")


def _cfg_fields(cfg: Config) -> tuple[int, int, int, int]:
    """A forced config as the *_with_config ops take it: row_threads, vpt, cluster, variant."""
    return cfg.row_threads, cfg.vpt, cfg.cluster, cfg.variant


def rms_norm_with_config(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    cfg: Config,
    *,
    weight_offset: float = 0.0,
) -> torch.Tensor:
    """rms_norm with a forced launch config, for sweeps; same result. cfg: a compiled one
    (cuda_impl.compiled_configs()), its cluster the CTAs sharing a row."""
    check_inputs(x, weight, eps, weight_offset, impl=_IMPL)
    check_forced_config_grad("cuda_impl.rms_norm_with_config", x=x, weight=weight)
    _check_cfg(cfg, "rms_norm_with_config")
    return torch.ops.cuda_impl.rms_norm_with_config(
        x, weight, float(eps), *_cfg_fields(cfg), float(weight_offset)
    )


class RMSNorm(RMSNormModule):
    """torch.nn.RMSNorm drop-in (1-D normalized_shape) running the CUDA C++ kernel."""

    _fn = staticmethod(rms_norm)
    _fused_fn = staticmethod(fused_add_rms_norm)
