"""The contract both RMSNorm kernels share: argument checks and the nn.Module.

Semantics, for every implementation in this repo (the precision policy of native
``F.rms_norm``'s fused CUDA path):

    y = x / sqrt(mean(x**2 over the last dim) + eps) * weight

Squares accumulate in fp32, normalisation and the weight multiply are fp32, and the result
is cast once to x's dtype at the end.

Accepted input:
- x: float32, float16 or bfloat16; at least 1-D; last dim N in [1, MAX_N]; stride 1 in the
  last dim (a clear error otherwise: we never copy silently); any row stride, so a slice
  of a wider tensor is read in place.
- weight: None, or shape (N,) with x's dtype or float32, on x's device.
- eps: a finite Python float > 0.

This module imports neither Triton nor the CUDA extension, so both kernels (and callers
that have only one of them) share one vocabulary of errors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Optional, Union

import torch

#: Largest row width either kernel accepts (the CUDA kernel's cluster path holds up to
#: this many fp32 elements on chip; the Triton kernel matches it so they share a contract).
MAX_N = 262144

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEFAULT_EPS = 1e-6


def check_inputs(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    *,
    allow_cpu: bool = False,
    impl: str = "rms_norm",
) -> None:
    """Raise TypeError/ValueError naming the offending argument; return None if valid."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{impl}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(
            f"{impl}: x has dtype {x.dtype}; expected one of float32, float16, bfloat16"
        )
    if x.dim() == 0:
        raise ValueError(f"{impl}: x is 0-dimensional; expected at least 1 dimension")
    n = x.shape[-1]
    if n < 1:
        raise ValueError(f"{impl}: x's last dimension is {n}; expected N >= 1")
    if n > MAX_N:
        raise ValueError(f"{impl}: x's last dimension is {n}; the supported maximum is N = {MAX_N}")
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(
            f"{impl}: x has stride {x.stride(-1)} in its last dimension; expected 1"
            " (call x.contiguous() first; rows may have any stride)"
        )
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(
                f"{impl}: weight must be a torch.Tensor or None, got {type(weight).__name__}"
            )
        if weight.shape != (n,):
            raise ValueError(
                f"{impl}: weight has shape {tuple(weight.shape)} but x's last dimension"
                f" is {n}; expected ({n},)"
            )
        if weight.dtype not in (x.dtype, torch.float32):
            raise TypeError(
                f"{impl}: weight has dtype {weight.dtype}; expected x's dtype ({x.dtype})"
                " or float32"
            )
        if weight.device != x.device:
            raise ValueError(
                f"{impl}: weight is on device '{weight.device}' but x is on '{x.device}'"
            )
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{impl}: eps must be a real number, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{impl}: eps is {eps}; expected a finite number > 0")
    # last, so that every other check also runs on a machine without a GPU
    if not allow_cpu and x.device.type != "cuda":
        hint = " (Triton runs CPU tensors only under TRITON_INTERPRET=1)" * ("triton" in impl)
        raise ValueError(f"{impl}: x is on device '{x.device}'; expected a CUDA tensor{hint}")


def check_out(out: torch.Tensor, x: torch.Tensor, *, impl: str = "rms_norm") -> None:
    """Checks for the out= form: a contiguous tensor of x's shape, dtype and device."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{impl}: out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != x.shape:
        raise ValueError(
            f"{impl}: out has shape {tuple(out.shape)} but x has shape {tuple(x.shape)}"
        )
    if out.dtype != x.dtype:
        raise TypeError(f"{impl}: out has dtype {out.dtype} but x has dtype {x.dtype}")
    if out.device != x.device:
        raise ValueError(f"{impl}: out is on device '{out.device}' but x is on '{x.device}'")
    if not out.is_contiguous():
        raise ValueError(f"{impl}: out must be contiguous")


def call_op(
    op: Callable[..., torch.Tensor],
    op_out: Callable[..., None],
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    out: Optional[torch.Tensor],
    *,
    impl: str,
    allow_cpu: bool = False,
) -> torch.Tensor:
    """The body of both public rms_norm functions: check the arguments, then run the
    functional op, or the out= op into ``out`` and return it."""
    check_inputs(x, weight, eps, allow_cpu=allow_cpu, impl=impl)
    if out is None:
        return op(x, weight, float(eps))
    check_out(out, x, impl=impl)
    op_out(out, x, weight, float(eps))
    return out


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as (M, N) rows sharing one row stride: a view wherever one exists.

    A 2-D slice of a wider tensor (and most 3-D ones) views in place; leading dims that
    cannot be merged into one stride (e.g. a transposed batch) are copied once, which is
    what ``reshape`` decides.
    """
    return x.reshape(-1, x.shape[-1])


class RMSNormModule(torch.nn.Module):
    """Drop-in for ``torch.nn.RMSNorm`` with a 1-D normalized_shape, backed by ``fn``.

    Same constructor and defaults as torch.nn.RMSNorm: eps=None means
    ``torch.finfo(x.dtype).eps`` at call time; elementwise_affine creates a weight of ones.
    Forward only: the kernels have no backward, so autograd raises on backward.
    """

    _fn: Callable[..., torch.Tensor]

    def __init__(
        self,
        normalized_shape: Union[int, Sequence[int], torch.Size],
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1:
            raise ValueError(
                f"normalized_shape is {normalized_shape}; only a 1-D normalized_shape"
                " (the last dimension) is supported"
            )
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.empty(normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(
                f"x has shape {tuple(x.shape)} but normalized_shape is {self.normalized_shape}"
            )
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return type(self)._fn(x, self.weight, eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )
