"""Swap a model's RMSNorm modules, in place, for another RMSNorm module class.

    n = swap_rms_norm(model, triton_impl.RMSNorm)   # how many were swapped

What is swapped: ``torch.nn.RMSNorm`` with a 1-D normalized_shape, and modules shaped like
transformers' LlamaRMSNorm: a class name ending in ``RMSNorm``, a 1-D ``weight``
Parameter and the eps in an attribute ``variance_epsilon`` or ``eps``. The replacement is
``module_cls(N, eps, elementwise_affine, device=, dtype=)``, the constructor of
torch.nn.RMSNorm (and of triton_impl.RMSNorm, cuda_impl.RMSNorm), with the weight copied
in, its dtype, device and requires_grad kept, and the training flag kept.

A class that merely looks like LlamaRMSNorm may compute something else (Gemma's scales by
1 + weight): with ``verify=True`` (the default) each replacement is run beside the module
it replaces on a few random rows, and a disagreement raises ValueError naming the module
before anything is swapped. Its output is in x's dtype, where LlamaRMSNorm returns the
promoted dtype of weight and x; with a weight in x's dtype (a model cast with ``.to``)
the two agree.

Lives in rmsnorm_api (it imports neither backend): the module class is the caller's.
"""

from __future__ import annotations

from typing import Optional

import torch

#: Rows of the random input a replacement is checked on (verify=True).
VERIFY_ROWS = 4
#: How far a replacement may be from the module it replaces, per weight dtype: two
#: ulps of a 16-bit format (LlamaRMSNorm rounds to x's dtype before its weight multiply,
#: a second rounding), 1e-5 in fp32; a different formula is off by far more.
VERIFY_TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-3, rtol=2.0**-9),
    torch.bfloat16: dict(atol=1e-2, rtol=2.0**-6),
}

_EPS_NAMES = ("variance_epsilon", "eps")


def _eps_of(module: torch.nn.Module) -> Optional[float]:
    for name in _EPS_NAMES:
        if hasattr(module, name):
            return getattr(module, name)
    return None


def is_rms_norm(module: object) -> bool:
    """Whether ``module`` is one swap_rms_norm would replace: a torch.nn.RMSNorm over one
    dimension, or a module shaped like LlamaRMSNorm (class name ending in RMSNorm, a 1-D
    weight Parameter, an eps attribute named variance_epsilon or eps)."""
    if isinstance(module, torch.nn.RMSNorm):
        return len(module.normalized_shape) == 1
    if not isinstance(module, torch.nn.Module) or not type(module).__name__.endswith("RMSNorm"):
        return False
    weight = getattr(module, "weight", None)
    has_eps = any(hasattr(module, name) for name in _EPS_NAMES)
    return isinstance(weight, torch.nn.Parameter) and weight.dim() == 1 and has_eps


def _replacement(module: torch.nn.Module, module_cls: type) -> torch.nn.Module:
    weight = getattr(module, "weight", None)
    if isinstance(module, torch.nn.RMSNorm):
        n = module.normalized_shape[0]
    else:
        n = weight.shape[0]
    kwargs = {} if weight is None else dict(device=weight.device, dtype=weight.dtype)
    new = module_cls(n, _eps_of(module), elementwise_affine=weight is not None, **kwargs)
    if weight is not None:
        with torch.no_grad():
            new.weight.copy_(weight)
        new.weight.requires_grad_(weight.requires_grad)
    new.train(module.training)
    return new


def _disagreement(old: torch.nn.Module, new: torch.nn.Module) -> Optional[str]:
    """None if new computes what old does on a few random rows; else what differs."""
    weight = old.weight
    g = torch.Generator(device=weight.device).manual_seed(0)
    x = torch.randn(
        VERIFY_ROWS, weight.shape[0], generator=g, device=weight.device, dtype=weight.dtype
    )
    try:
        with torch.no_grad():
            want, got = old(x), new(x)
    except Exception as e:  # e.g. a CUDA-only class given a CPU model
        return f"could not run it to check ({type(e).__name__}: {str(e).splitlines()[0]})"
    try:
        torch.testing.assert_close(got.float(), want.float(), **VERIFY_TOL[weight.dtype])
    except AssertionError as e:
        return f"its output differs from the original's ({str(e).splitlines()[0]})"
    return None


def swap_rms_norm(model: torch.nn.Module, module_cls: type, *, verify: bool = True) -> int:
    """Replace, in place, every RMSNorm module of ``model`` (see ``is_rms_norm``; ``model``
    itself too when it is one, which cannot be replaced in place and raises) by a
    ``module_cls`` with the same size, eps and weight. Returns how many were swapped;
    modules already of ``module_cls`` are left alone and not counted.

    Raises TypeError naming the argument when model is not an nn.Module or module_cls
    not an nn.Module subclass; ValueError, before anything is swapped, when a replacement
    cannot be checked or disagrees with the module it replaces (verify=True)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"swap_rms_norm: model must be a torch.nn.Module, got {type(model).__name__}"
        )
    if not (isinstance(module_cls, type) and issubclass(module_cls, torch.nn.Module)):
        raise TypeError(
            "swap_rms_norm: module_cls must be a torch.nn.Module subclass (e.g."
            f" triton_impl.RMSNorm), got {module_cls!r}"
        )
    if is_rms_norm(model) and not isinstance(model, module_cls):
        raise ValueError(
            f"swap_rms_norm: model is itself a {type(model).__name__}; it cannot be replaced"
            f" in place (build a {module_cls.__name__} for it instead)"
        )
    # (parent, child name, path, new module): every replacement is built and checked
    # before the first one is put in, so a refusal leaves the model as it was
    planned = []
    made: dict[int, torch.nn.Module] = {}  # a norm shared by two parents stays shared
    for path, parent in model.named_modules():
        for name, child in parent.named_children():
            if isinstance(child, module_cls) or not is_rms_norm(child):
                continue
            full = f"{path}.{name}" if path else name
            if id(child) in made:
                planned.append((parent, name, made[id(child)]))
                continue
            new = made[id(child)] = _replacement(child, module_cls)
            if verify and getattr(child, "weight", None) is not None:
                why = _disagreement(child, new)
                if why:
                    raise ValueError(
                        f"swap_rms_norm: {full} ({type(child).__name__}) not swapped for"
                        f" {module_cls.__name__}: {why}; pass verify=False to swap unchecked"
                    )
            planned.append((parent, name, new))
    for parent, name, new in planned:
        setattr(parent, name, new)
    return len(made)
