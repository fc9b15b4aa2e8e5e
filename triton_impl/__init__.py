"""Masked Triton RMSNorm: ``rms_norm(x, weight=None, eps=1e-6)`` and ``RMSNorm``.

For kernel work: ``kernel_info(x)`` (the kernel a call launches), ``launch_config(n,
element_size)`` (the default rule) and ``rms_norm_with_config(x, weight, eps, cfg)`` (a
forced config, what harness.sweep times). The op lives in ``triton_impl.rms_norm_op``.
"""

from triton_impl.rms_norm_op import (
    RMSNorm,
    kernel_info,
    launch_config,
    rms_norm,
    rms_norm_with_config,
)

__all__ = ["RMSNorm", "kernel_info", "launch_config", "rms_norm", "rms_norm_with_config"]
