"""Swap a model's RMSNorm modules, in place, for another RMSNorm module class.

    n = swap_rms_norm(model, triton_impl.RMSNorm)   # how many modules were swapped

What is swapped: ``torch.nn.RMSNorm`` with a 1-D normalized_shape, and modules shaped like
transformers' LlamaRMSNorm: a class name ending in ``RMSNorm``, a 1-D ``weight``
Parameter and the eps in an attribute ``variance_epsilon`` or ``eps``. The replacement is
``module_cls(N, eps, elementwise_affine, device=, dtype=)``, the constructor of
torch.nn.RMSNorm (and of triton_impl.RMSNorm, cuda_impl.RMSNorm), with
``weight_offset=1.0`` for the norms that scale by 1 + weight (WEIGHT_OFFSETS: transformers'
Gemma, Gemma 2 and Gemma 3 norms, whose 1 is added in fp32), holding the very weight
Parameter of the module it replaces (so an optimizer built before the swap, and a weight
tied elsewhere, still see it), and the training flag kept. Every slot a module fills is
swapped (a module registered twice, in one parent or two, stays one module).

What is refused, by the module's name, before anything is swapped (ValueError):
- a module with state the replacement would drop: a parameter other than weight, a
  buffer, a submodule (e.g. a parametrization), or a forward or backward hook;
- a module whose eps or width the replacement's constructor refuses;
- with ``verify=True`` (the default), a module the replacement does not agree with. A class
  that merely looks like LlamaRMSNorm may compute something else (Gemma's scales by
  1 + weight; ``x / (rms + eps)`` differs only where eps matters), so each replacement is
  run beside the module it replaces, in the module's dtype and on its device, on rows whose
  rms spans the range where eps matters (well under, at and over sqrt(eps)), one of unit
  rms and one large, and each row's largest difference is compared with its largest value.
  A module that cannot be run there (on the meta device, or in a dtype the replacement
  does not take) is refused too: pass ``verify=False`` to swap it unchecked.
The replacement's output is in x's dtype, where LlamaRMSNorm returns the promoted dtype of
weight and x; with a weight in x's dtype (a model cast with ``.to``) the two agree.

Lives in rmsnorm_api (it imports neither backend): the module class is the caller's.
"""

from __future__ import annotations

import math
import reprlib
from typing import Optional

import torch

#: How far an output may be from a reference computed otherwise, per dtype: two ulps of a
#: 16-bit format (LlamaRMSNorm rounds to x's dtype before its weight multiply, a second
#: rounding), 1e-5 in fp32 (and wider formats); a different formula is off by far more.
VERIFY_TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-3, rtol=2.0**-9),
    torch.bfloat16: dict(atol=1e-2, rtol=2.0**-6),
}
#: The rows a replacement is checked on: their rms, as multiples of sqrt(eps) (where the
#: eps term is 1/64, 1/2 and 64/65 of the sum under the root), then absolute ones.
VERIFY_RMS_OF_SQRT_EPS = (1 / 8, 1.0, 8.0)
VERIFY_RMS = (1.0, 256.0)

_EPS_NAMES = ("variance_epsilon", "eps")
#: The classes (by name) whose forward scales by weight + an offset, and the offset:
#: transformers' Gemma norms compute x * rstd * (1.0 + weight.float()) in fp32, then cast.
WEIGHT_OFFSETS = {"GemmaRMSNorm": 1.0, "Gemma2RMSNorm": 1.0, "Gemma3RMSNorm": 1.0}
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


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


def _width(module: torch.nn.Module) -> int:
    """The row width an RMSNorm module (is_rms_norm) normalises."""
    if isinstance(module, torch.nn.RMSNorm):
        return module.normalized_shape[0]
    return module.weight.shape[0]


def _foreign_state(module: torch.nn.Module) -> list[str]:
    """What module holds beyond its weight and eps, which a replacement would drop."""
    found = [
        f"parameter '{k}'" for k, v in module._parameters.items() if k != "weight" and v is not None
    ]
    found += [f"buffer '{k}'" for k, v in module._buffers.items() if v is not None]
    found += [f"submodule '{k}'" for k, v in module._modules.items() if v is not None]
    found += [f"{h[1:].replace('_', ' ')[:-1]}" for h in _HOOKS if getattr(module, h, None)]
    return found


def _replacement(module: torch.nn.Module, module_cls: type, where: str) -> torch.nn.Module:
    extra = _foreign_state(module)
    if extra:
        raise ValueError(
            f"swap_rms_norm: {where} not swapped for {module_cls.__name__}: it holds"
            f" {', '.join(extra)} beyond weight and eps, which {module_cls.__name__} would drop"
        )
    weight = getattr(module, "weight", None)
    n = _width(module)
    kwargs = {} if weight is None else dict(device=weight.device, dtype=weight.dtype)
    offset = WEIGHT_OFFSETS.get(type(module).__name__)
    if offset is not None:
        kwargs["weight_offset"] = offset
    try:
        new = module_cls(n, _eps_of(module), elementwise_affine=weight is not None, **kwargs)
    except (TypeError, ValueError, OverflowError) as e:
        eps = reprlib.repr(_eps_of(module))
        shown = f"width {n} or eps {eps}"
        if offset is not None:
            shown = f"width {n}, eps {eps} or weight_offset {offset}"
        raise ValueError(
            f"swap_rms_norm: {where} not swapped for {module_cls.__name__}: its constructor"
            f" refuses the module's {shown} ({type(e).__name__}: {str(e).splitlines()[0]})"
        ) from e
    if weight is not None:
        new.weight = weight  # the Parameter itself: optimizers and ties keep seeing it
    new.train(module.training)
    return new


def _probe_rows(n: int, dtype: torch.dtype, device: torch.device, eps: float) -> torch.Tensor:
    """Rows of n elements whose rms are VERIFY_RMS_OF_SQRT_EPS x sqrt(eps) and VERIFY_RMS,
    each kept inside dtype's range, in dtype on device."""
    info = torch.finfo(dtype)
    root = math.sqrt(eps)
    scales = [s * root for s in VERIFY_RMS_OF_SQRT_EPS] + list(VERIFY_RMS)
    scales = [min(max(s, info.tiny), info.max / 64) for s in scales]  # elements in range
    g = torch.Generator().manual_seed(0)
    x = torch.randn(len(scales), n, generator=g, dtype=torch.float64)
    x = (
        x
        / x.square().mean(-1, keepdim=True).sqrt()
        * torch.tensor(scales, dtype=torch.float64)[:, None]
    )
    return x.to(device=device, dtype=dtype)


def _disagreement(
    old: torch.nn.Module, new: torch.nn.Module, device: torch.device
) -> Optional[str]:
    """None if new computes what old does on _probe_rows; else what differs."""
    weight = getattr(old, "weight", None)
    dtype = weight.dtype if weight is not None else torch.get_default_dtype()
    if device.type == "meta":
        return (
            "it is on the meta device, where its output cannot be checked (load its weights first)"
        )
    n = _width(old)
    eps = _eps_of(old)
    eps = torch.finfo(dtype).eps if eps is None else eps
    try:
        x = _probe_rows(n, dtype, device, float(eps))
        with torch.no_grad():
            want, got = old(x), new(x)
    except Exception as e:  # e.g. a CUDA-only class given a CPU model, a dtype it refuses
        return f"could not run it to check ({type(e).__name__}: {str(e).splitlines()[0]})"
    if got.shape != want.shape:
        return f"its output has shape {tuple(got.shape)}, the original's {tuple(want.shape)}"
    # each row's largest difference against its largest value: a row of tiny rms (where a
    # wrong eps shows) is judged as strictly as one of unit rms
    got, want = got.double(), want.double()
    scale = want.abs().amax(-1).clamp_min(torch.finfo(torch.float64).tiny)
    off = ((got - want).abs().amax(-1) / scale).nan_to_num(nan=math.inf)
    tol = VERIFY_TOL.get(dtype, VERIFY_TOL[torch.float32])
    bound = 2 * tol["rtol"] + tol["atol"]
    worst = int(off.argmax())
    if off[worst] > bound:
        rms = x[worst].double().square().mean().sqrt().item()
        return (
            f"its output differs from the original's by {off[worst].item():.3g} of the row's"
            f" largest value (at most {bound:.3g}) on a row of rms {rms:.3g} with eps {eps:.3g}"
        )
    return None


def swap_rms_norm(model: torch.nn.Module, module_cls: type, *, verify: bool = True) -> int:
    """Replace, in place, every RMSNorm module of ``model`` (see ``is_rms_norm``; ``model``
    itself too when it is one, which cannot be replaced in place and raises) by a
    ``module_cls`` with the same size, eps and weight Parameter, in every slot it fills.
    Returns how many modules were swapped (a module in several slots counts once); modules
    already of ``module_cls`` are left alone and not counted.

    Raises TypeError naming the argument when model is not an nn.Module or module_cls
    not an nn.Module subclass; ValueError naming the module, before anything is swapped,
    when a module holds state a replacement would drop, when module_cls cannot be built
    for it, or (verify=True) when a replacement cannot be checked or disagrees with it."""
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
    # where a module without a weight of its own is checked: beside the model's tensors
    first = next(iter(model.parameters()), None)
    first = first if first is not None else next(iter(model.buffers()), None)
    fallback = first.device if first is not None else torch.device("cpu")
    # (parent, slot, new module): every replacement is built and checked before the first
    # one is put in, so a refusal leaves the model as it was. Each parent's slots are walked
    # themselves (named_children() lists a module registered twice once), and one
    # replacement a module fills each of its slots, so ties stay tied.
    planned = []
    made: dict[int, torch.nn.Module] = {}
    for path, parent in model.named_modules():
        for name, child in parent._modules.items():
            if child is None or isinstance(child, module_cls) or not is_rms_norm(child):
                continue
            if id(child) not in made:
                full = f"{path}.{name}" if path else name
                where = f"{full} ({type(child).__name__})"
                new = made[id(child)] = _replacement(child, module_cls, where)
                weight = getattr(child, "weight", None)
                if verify and (weight is not None or type(child) is not torch.nn.RMSNorm):
                    device = weight.device if weight is not None else fallback
                    why = _disagreement(child, new, device)
                    if why:
                        raise ValueError(
                            f"swap_rms_norm: {where} not swapped for {module_cls.__name__}:"
                            f" {why}; pass verify=False to swap unchecked"
                        )
            planned.append((parent, name, made[id(child)]))
    for parent, name, new in planned:
        setattr(parent, name, new)
    return len(made)
