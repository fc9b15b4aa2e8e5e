"""Masked Triton RMSNorm: ``rms_norm(x, weight=None, eps=1e-6)`` and ``RMSNorm``."""

from triton_impl.rms_norm import RMSNorm, kernel_info, launch_config, rms_norm

__all__ = ["RMSNorm", "kernel_info", "launch_config", "rms_norm"]
