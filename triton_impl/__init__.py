"""Masked Triton RMSNorm: ``rms_norm(x, weight=None, eps=1e-6)`` and ``RMSNorm``."""

from triton_impl.rms_norm import RMSNorm, launch_config, rms_norm

__all__ = ["RMSNorm", "launch_config", "rms_norm"]
