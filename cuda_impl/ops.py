"""Python face of the CUDA C++ RMSNorm: loads the extension, registers fakes, wraps the op.

The library is whichever build is found: ``$CUDA_IMPL_LIBRARY`` if set (e.g. the CMake
build's ``build/cmake/libcuda_impl_ops.so``), else ``cuda_impl/_C*.so`` from
``python setup.py build_ext --inplace``. Same semantics, checks and error messages as
triton_impl (rmsnorm_api); the C++ side repeats the checks for direct torch.ops callers.
"""

from __future__ import annotations

import glob
import os
from typing import Optional

import torch

from rmsnorm_api import DEFAULT_EPS, RMSNormModule, call_op, check_inputs, check_out

_IMPL = "cuda_impl.rms_norm"
#: Bits of a config's ``variant`` (see configs()): x read with plain loads instead of
#: read-only non-allocating ones, and x's fp32 copies not kept alive through the reduction.
VARIANT_PLAIN_LOADS = 1
VARIANT_LEAN_REGS = 2
#: Sweep-only bits (a sweep build, RMSNORM_SWEEP_CONFIGS=1): x read with
#: `ld.global.L1::no_allocate` or with `ld.global.nc`, each half of the read-only,
#: non-allocating load.
VARIANT_HINT_ONLY_LOADS = 4
VARIANT_NC_ONLY_LOADS = 8
_HERE = os.path.dirname(os.path.abspath(__file__))


def _library_path() -> str:
    env = os.environ.get("CUDA_IMPL_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"CUDA_IMPL_LIBRARY={env} does not exist")
        return env
    found = sorted(glob.glob(os.path.join(_HERE, "_C*.so")))
    if not found:
        raise ImportError(
            "cuda_impl: the CUDA extension is not built. Build it with "
            "`python setup.py build_ext --inplace` "
            "(or `pip install --no-build-isolation -e .`) in the repository root."
        )
    return found[0]


LIBRARY = _library_path()
torch.ops.load_library(LIBRARY)
_OP = torch.ops.cuda_impl.rms_norm.default


# The fakes (tracing, meta tensors) run the checks the CUDA kernel runs, so torch.compile
# never traces a call the kernel would refuse.
@torch.library.register_fake("cuda_impl::rms_norm")
def _rms_norm_fake(x, weight, eps):
    check_inputs(x, weight, eps, impl=_IMPL)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.register_fake("cuda_impl::rms_norm_out")
def _rms_norm_out_fake(out, x, weight, eps):
    check_inputs(x, weight, eps, impl=_IMPL)
    check_out(out, x, weight, impl=_IMPL)
    return None


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """RMSNorm over x's last dim with the CUDA C++ kernel; semantics as in rmsnorm_api.

    Returns a new contiguous tensor of x's shape and dtype, or writes into ``out`` and
    returns it. Raises TypeError/ValueError naming the argument for unsupported input.
    """
    if (
        out is None
        and type(eps) is float
        and isinstance(x, torch.Tensor)
        and x.is_cuda
        and (weight is None or (isinstance(weight, torch.Tensor) and weight.is_cuda))
    ):
        # CUDA tensors reach the op's CUDA kernel, whose C++ checks raise the same errors
        # as rmsnorm_api's: skip the Python ones (host time is the cost of small calls)
        return _OP(x, weight, eps)
    ops = torch.ops.cuda_impl
    return call_op(ops.rms_norm, ops.rms_norm_out, x, weight, eps, out, impl=_IMPL)


def configs() -> list[dict]:
    """The compiled launch configs: row_threads, vpt (16-byte vectors a thread), cluster
    (CTAs share a row), default (shipped: on a ladder the kernel picks from by N; a default
    build compiles only these), variant (kernel variant, bits: VARIANT_PLAIN_LOADS,
    VARIANT_LEAN_REGS, and in a sweep build VARIANT_HINT_ONLY_LOADS, VARIANT_NC_ONLY_LOADS)."""
    flat = torch.ops.cuda_impl.rms_norm_configs()
    keys = ("row_threads", "vpt", "cluster", "default", "variant")
    rows = (flat[i : i + len(keys)] for i in range(0, len(flat), len(keys)))
    flags = ("cluster", "default")
    return [{k: (bool(v) if k in flags else v) for k, v in zip(keys, r, strict=True)} for r in rows]


def sweep_build() -> bool:
    """Whether this library was built with the sweep-only configs (RMSNORM_SWEEP_CONFIGS=1)."""
    return not all(c["default"] for c in configs())


def default_config(n: int, element_size: int) -> dict:
    """The config rms_norm picks for rows of n elements of element_size bytes (the C++
    ladder itself, so sweeps compare against exactly what runs)."""
    rt, vpt, ranks, variant = torch.ops.cuda_impl.rms_norm_default_config(n, element_size)
    return dict(row_threads=rt, vpt=vpt, cluster=ranks, variant=variant)


def kernel_info(x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> dict:
    """The kernel rms_norm launches for x: its config, and from cudaFuncGetAttributes the
    registers a thread and local memory (stack and spills) in bytes."""
    check_inputs(x, weight, DEFAULT_EPS, impl=_IMPL)
    keys = (
        "row_threads",
        "vpt",
        "cluster",
        "variant",
        "n_regs",
        "local_bytes",
        "shared_bytes",
        "max_threads",
    )
    return dict(zip(keys, torch.ops.cuda_impl.rms_norm_kernel_info(x, weight), strict=True))


def rms_norm_with_config(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    row_threads: int,
    vpt: int,
    cluster: int = 1,
    variant: int = 0,
) -> torch.Tensor:
    """rms_norm with a forced launch config (one of configs()), for sweeps; same result."""
    check_inputs(x, weight, eps, impl=_IMPL)
    return torch.ops.cuda_impl.rms_norm_with_config(
        x, weight, float(eps), row_threads, vpt, cluster, variant
    )


class RMSNorm(RMSNormModule):
    """torch.nn.RMSNorm drop-in (1-D normalized_shape) running the CUDA C++ kernel."""

    _fn = staticmethod(rms_norm)
