"""Hand-written CUDA C++ RMSNorm: ``rms_norm(x, weight=None, eps=1e-6)``, ``RMSNorm``, and the
fused residual add ``fused_add_rms_norm(x, residual, weight, eps) -> (y, residual_out)``
with its in-place form ``fused_add_rms_norm_``. Both functional ops are differentiable
(csrc/rms_norm_backward.cu), their backward ops public too: ``rms_norm_backward(dy, x,
weight, eps)`` and ``fused_add_rms_norm_backward(dy, d_residual_out, residual_out, weight,
eps)``. The forward with an fp8 output, for inference: ``rms_norm_quant``,
``fused_add_rms_norm_quant`` and ``fused_add_rms_norm_quant_`` (csrc/forward_quant.cu;
rmsnorm_api.quant).

Importing this package loads the compiled extension (``cuda_impl/_C*.so``); if it was
never built, ImportError says how to build it. For kernel work: ``kernel_info(x)``,
``compiled_configs(op)``, ``default_config(n, element_size, op)``,
``search_space(n, element_size, op)``, ``rms_norm_with_config(x, weight, eps, cfg)`` and
``fused_add_rms_norm_with_config(x, residual, weight, eps, cfg)``, with ``Config`` from
cuda_impl.configs (op: "rms_norm", the default, or "fused_add_rms_norm").
"""

from cuda_impl.configs import Config, compiled_configs, default_config, search_space
from cuda_impl.ops import (
    RMSNorm,
    fused_add_rms_norm,
    fused_add_rms_norm_,
    fused_add_rms_norm_backward,
    fused_add_rms_norm_quant,
    fused_add_rms_norm_quant_,
    fused_add_rms_norm_with_config,
    kernel_info,
    rms_norm,
    rms_norm_backward,
    rms_norm_quant,
    rms_norm_with_config,
)
from rmsnorm_api import BACKEND_API

__all__ = [*BACKEND_API, "compiled_configs"]
