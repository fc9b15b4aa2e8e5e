"""Hand-written CUDA C++ RMSNorm: ``rms_norm(x, weight=None, eps=1e-6)`` and ``RMSNorm``.

Importing this package loads the compiled extension (``cuda_impl/_C*.so``); if it was
never built, ImportError says how to build it. For kernel work: ``kernel_info(x)``,
``configs()``, ``default_config(n, element_size)`` and ``rms_norm_with_config(...)``.
"""

from cuda_impl.ops import (
    RMSNorm,
    configs,
    default_config,
    kernel_info,
    rms_norm,
    rms_norm_with_config,
)

__all__ = [
    "RMSNorm",
    "configs",
    "default_config",
    "kernel_info",
    "rms_norm",
    "rms_norm_with_config",
]
