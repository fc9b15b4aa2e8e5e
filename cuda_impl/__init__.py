"""Hand-written CUDA C++ RMSNorm: ``rms_norm(x, weight=None, eps=1e-6)`` and ``RMSNorm``.

Importing this package loads the compiled extension (``cuda_impl/_C*.so``); if it was
never built, ImportError says how to build it. For kernel work: ``kernel_info(x)``,
``compiled_configs()``, ``default_config(n, element_size)``,
``search_space(n, element_size)`` and ``rms_norm_with_config(x, weight, eps, cfg)``, with
``Config`` from cuda_impl.configs.
"""

from cuda_impl.configs import Config, compiled_configs, default_config, search_space
from cuda_impl.ops import RMSNorm, kernel_info, rms_norm, rms_norm_with_config

__all__ = [
    "Config",
    "RMSNorm",
    "compiled_configs",
    "default_config",
    "kernel_info",
    "rms_norm",
    "rms_norm_with_config",
    "search_space",
]
