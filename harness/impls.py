"""The registry of RMSNorm implementations: one calling convention for all of them.

Each Impl computes rms_norm(x, weight, eps) -> y. ``ours`` marks the kernels under study
(they also have an out= form, which validation poisons with NaN before each run).
Without a GPU only the Triton kernel runs, under TRITON_INTERPRET=1, set here before
Triton is first imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@dataclass
class Impl:
    name: str
    fn: Callable[..., torch.Tensor]  # (x, weight, eps) -> y
    ours: bool = False  # a kernel under study: also callable as fn(x, weight, eps, out=y)
    cpu: bool = False  # runs on CPU tensors (the Triton interpreter)
    unavailable: Optional[str] = None  # why it cannot run here, or None
    notes: list[str] = field(default_factory=list)


def _triton() -> Impl:
    try:
        import triton_impl
    except ImportError as e:  # pragma: no cover - triton is a hard dependency
        return Impl("triton", None, ours=True, unavailable=f"import failed: {e}")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    return Impl("triton", triton_impl.rms_norm, ours=True, cpu=interp)


def _cuda() -> Impl:
    try:
        import cuda_impl
    except ImportError as e:
        return Impl("cuda", None, ours=True, unavailable=str(e))
    return Impl("cuda", cuda_impl.rms_norm, ours=True)


def registry() -> dict[str, Impl]:
    """All implementations, available or not, keyed by name."""
    impls = [_triton(), _cuda()]
    return {i.name: i for i in impls}


def runnable(impl: Impl, device: str) -> Optional[str]:
    """None if impl can run on device, else the reason it is skipped."""
    if impl.unavailable:
        return impl.unavailable
    if device == "cpu" and not impl.cpu:
        return "needs a CUDA GPU"
    return None
