"""Masked Triton RMSNorm: ``rms_norm(x, weight=None, eps=1e-6)``, ``RMSNorm``, and the fused
residual add ``fused_add_rms_norm(x, residual, weight, eps) -> (y, residual_out)`` with its
in-place form ``fused_add_rms_norm_``. Both functional ops are differentiable; their
backward ops are public too: ``rms_norm_backward(dy, x, weight, eps) -> (dx, dweight)``
and ``fused_add_rms_norm_backward(dy, d_residual_out, residual_out, weight, eps)``.
The forward with an fp8 output, for inference: ``rms_norm_quant``,
``fused_add_rms_norm_quant`` and ``fused_add_rms_norm_quant_`` (triton_impl.quant).

For kernel work: ``kernel_info(x)`` (the kernel and config a call launches),
``default_config(n, element_size, op)`` (the default rule, triton_impl.configs) and
``rms_norm_with_config(x, weight, eps, cfg)`` and
``fused_add_rms_norm_with_config(x, residual, weight, eps, cfg)`` (a forced ``Config``, what
harness.sweep times; ``search_space(n, element_size, op)`` lists the candidates).
"""

from rmsnorm_api import BACKEND_API, register_autograd
from triton_impl.backward import fused_add_rms_norm_backward, rms_norm_backward
from triton_impl.configs import Config, default_config, search_space
from triton_impl.ops import (
    RMSNorm,
    fused_add_rms_norm,
    fused_add_rms_norm_,
    fused_add_rms_norm_with_config,
    kernel_info,
    rms_norm,
    rms_norm_with_config,
)
from triton_impl.quant import (
    fused_add_rms_norm_quant,
    fused_add_rms_norm_quant_,
    rms_norm_quant,
)

# gradients of both functional ops, once the forward and backward ops are all registered
register_autograd("triton_impl")

__all__ = list(BACKEND_API)
