"""Hand-written CUDA C++ RMSNorm: ``rms_norm(x, weight=None, eps=1e-6)`` and ``RMSNorm``.

Importing this package loads the compiled extension (``cuda_impl/_C*.so``); if it was
never built, ImportError says how to build it.
"""

from cuda_impl.ops import RMSNorm, rms_norm

__all__ = ["RMSNorm", "rms_norm"]
