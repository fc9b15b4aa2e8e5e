"""The contract both RMSNorm kernels share: argument checks and the nn.Module.

Semantics, for every implementation in this repo (the precision policy of native
``F.rms_norm``'s fused CUDA path):

    y = x / sqrt(mean(x**2 over the last dim) + eps) * (weight + weight_offset)

Squares accumulate in fp32, normalisation and the weight multiply are fp32, and the result
is cast once to x's dtype at the end.

Accepted input:
- x: float32, float16 or bfloat16; at least 1-D; last dim N in [1, MAX_N]; stride 1 in the
  last dim (a clear error otherwise: we never copy silently); any row stride, so a slice
  of a wider tensor is read in place.
- weight: None, or shape (N,) with x's dtype or float32, on x's device.
- eps: a real number in float32's normal range [EPS_MIN, EPS_MAX] (the kernels add it in
  fp32: a smaller one is 0 or subnormal there, a larger one overflows).
- weight_offset: a finite real number in float32's range, 0.0 by default, added to each
  weight element in fp32 (Gemma's y = x * rstd * (1 + w) is weight_offset=1.0: the 1 added
  in fp32, never in the weight's dtype); other than 0.0 only with a weight.
- out (the out= form): a contiguous tensor of x's shape, dtype and device that does not
  partially overlap x or weight in memory (out=x itself normalises in place); not with
  inputs that require grad (as torch's own out= functions).

Gradients: both ops are differentiable in x (and residual) and weight; the out= and
in-place forms refuse inputs that require grad. check_backward_inputs checks the backward
ops' arguments.

This module imports neither Triton nor the CUDA extension, so both kernels (and callers
that have only one of them) share one vocabulary of errors. ``swap_rms_norm(model,
module_cls)`` (rmsnorm_api.swap) puts either backend's module in place of a model's
RMSNorm modules; ``enable_compile_fusion(backend)`` (rmsnorm_api.fusion) has torch.compile
rewrite a residual add and the RMSNorm after it into the backend's fused op.
"""

from __future__ import annotations

import contextvars
import math
import numbers
import operator
import reprlib
from collections.abc import Callable, Sequence
from typing import Optional, Union

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.autograd import forward_ad as _forward_ad

#: Largest row width either kernel accepts (the CUDA kernel's cluster path holds up to
#: this many fp32 elements on chip; the Triton kernel matches it so they share a contract).
MAX_N = 262144

#: What each backend package exports (its __all__ begins with these): the ops' public
#: functions and their backward, the module, and the kernel-work entry points.
BACKEND_API = (
    "Config",
    "RMSNorm",
    "default_config",
    "fused_add_rms_norm",
    "fused_add_rms_norm_",
    "fused_add_rms_norm_backward",
    "fused_add_rms_norm_quant",
    "fused_add_rms_norm_quant_",
    "fused_add_rms_norm_with_config",
    "kernel_info",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_quant",
    "rms_norm_with_config",
    "search_space",
)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: The short names records, sweeps and the config tables give the dtypes.
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
DEFAULT_EPS = 1e-6
#: eps is added to an fp32 mean: below float32's smallest normal it is 0 or subnormal there
#: (a zero row gives NaN), above its largest it is inf (every output 0).
EPS_MIN = float(torch.finfo(torch.float32).tiny)
EPS_MAX = float(torch.finfo(torch.float32).max)

# the ops' description reads the constants above
from rmsnorm_api import spec as _spec  # noqa: E402


def check_inputs(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    weight_offset: float = 0.0,
    *,
    allow_cpu: bool = False,
    impl: str = "rms_norm",
    device_hint: Optional[str] = None,
) -> None:
    """Raise TypeError/ValueError naming the offending argument; return None if valid.
    device_hint: the reason given with a refused device, where the default would mislead
    (kernel_info, which reads a compiled GPU kernel)."""
    _check_op("rms_norm", impl, allow_cpu, device_hint, x=x, weight=weight, eps=eps,
              weight_offset=weight_offset)  # fmt: skip


def check_fused_inputs(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    weight_offset: float = 0.0,
    *,
    allow_cpu: bool = False,
    impl: str = "fused_add_rms_norm",
) -> None:
    """check_inputs for the fused add, with residual's checks (x's shape and device, x's
    dtype or float32, stride 1 in the last dimension). Raise TypeError/ValueError naming
    the offending argument."""
    _check_op("fused_add_rms_norm", impl, allow_cpu, x=x, residual=residual, weight=weight, eps=eps,
              weight_offset=weight_offset)  # fmt: skip


def _refuse(rule: str, **fields: object) -> None:
    error = TypeError if rule in _spec.MESSAGE_TYPE_ERRORS else ValueError
    raise error(_spec.MESSAGES[rule].format(**fields))


def _rules(a: _spec.Arg) -> tuple:
    """A tensor argument's rules as _check_tensor reads them: its name, whether it may be
    None, the argument its dtype follows ("" for "float") and whether float32 is allowed
    beside it, whether it is the rows, the argument its shape follows, whether that is
    "row of" (1) or "row or heads of" (2), and its stride rule."""
    row_of = 1 if a.shape.startswith("row of ") else 2 if a.shape.startswith("row or ") else 0
    return (
        a.name,
        a.optional,
        a.dtype_of,
        a.dtype.endswith("|float32"),
        a.shape == "rows",
        a.shape_of,
        row_of,
        a.stride,
        (a.dtype, a.shape) == ("float32", "one"),
    )


#: Each op's tensors' rules in check order, and its float arguments: read once.
_PLANS = {
    name: (tuple(_rules(a) for a in op.check_order), tuple(a for a in op.args if a.kind == "float"))
    for name, op in _spec.OPS.items()
}


_EPS_ARG, _OFFSET_ARG = (a for a in _spec.OPS["rms_norm"].args if a.kind == "float")

#: out='s rules (rms_norm_out's out), which check_out applies beside x's
_OUT_RULES = next(r for r in _PLANS["rms_norm_out"][0] if r[0] == "out")


def _check_tensor(rules: tuple, values: dict, impl: str) -> None:
    """One tensor argument against its rules (_rules): its type and layout, dtype, shape and
    stride."""
    name, optional, dtype_of, fp32_too, rows, shape_of, row_of, stride, exact = rules
    t = values[name]
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        rule = "tensor_or_none" if optional else "tensor"
        _refuse(rule, impl=impl, name=name, got=_type_name(t))
    if t.is_nested:
        _refuse("nested", impl=impl, name=name)
    if t.layout != torch.strided:
        _refuse("layout", impl=impl, name=name, got=t.layout)
    dtype = t.dtype
    if exact:  # a scale: one fp32 element
        if dtype != torch.float32:
            _refuse("dtype_fp32", impl=impl, name=name, got=dtype)
        if t.numel() != 1:
            _refuse("shape_one", impl=impl, name=name, got=tuple(t.shape))
        return
    if not dtype_of:
        if dtype not in DTYPES:
            _refuse("dtype_float", impl=impl, name=name, got=dtype)
    else:
        want = values[dtype_of].dtype
        if dtype != want and not (fp32_too and dtype == torch.float32):
            rule = "dtype_of_fp32" if want == torch.float32 else "dtype_of_or_fp32"
            rule = rule if fp32_too else "dtype_of"
            _refuse(rule, impl=impl, name=name, of=dtype_of, got=dtype, want=want)
    shape = t.shape
    if rows:
        if not shape:
            _refuse("rank", impl=impl, name=name)
        n = shape[-1]
        if n < 1:
            _refuse("n_min", impl=impl, name=name, got=n)
        if n > MAX_N:
            _refuse("n_max", impl=impl, name=name, got=n, want=MAX_N)
    elif row_of:
        of = values[shape_of].shape
        n = of[-1]
        heads = row_of == 2 and len(of) >= 2 and shape == of[-2:]
        if shape != (n,) and not heads:
            rule = "shape_row_of" if row_of == 1 else "shape_row_or_heads_of"
            # a row a head: the rows' last two dimensions, (H, N)
            want = str(tuple(of[-2:])) if len(of) >= 2 else f"none, {shape_of} is 1-D"
            _refuse(rule, impl=impl, name=name, of=shape_of, got=tuple(shape), n=n, want=want)
    else:
        want = values[shape_of].shape
        if shape != want:
            _refuse(
                "shape_of", impl=impl, name=name, of=shape_of, got=tuple(shape), want=tuple(want)
            )
    if stride == "row" and t.stride(-1) != 1 and t.numel() > 0:
        _refuse("stride_row", impl=impl, name=name, got=t.stride(-1))
    if stride == "dense" and not t.is_contiguous():
        _refuse("stride_dense", impl=impl, name=name)


def _check_op(
    op: str,
    impl: str,
    allow_cpu: bool = False,
    device_hint: Optional[str] = None,
    **values: object,
) -> None:
    """An op's arguments against its description (spec.OPS[op]): each tensor's rules (the
    rows first, then each after those its rules name), the others' devices beside the
    rows', the scalars' ranges, and last the rows' device (so that every other check also
    runs on a machine without a GPU: x on a CUDA device, on the CPU where allow_cpu (the
    Triton interpreter), or meta (shape inference: the ops give meta outputs and launch
    nothing)). device_hint: why another device is refused, where the default would
    mislead."""
    tensors, scalars = _PLANS[op]
    for rules in tensors:
        _check_tensor(rules, values, impl)
    rows = tensors[0][0]
    device = values[rows].device
    for rules in tensors[1:]:
        t = values[rules[0]]
        if t is not None and t.device != device:
            _refuse("device_of", impl=impl, name=rules[0], of=rows, got=t.device, want=device)
    for a in scalars:
        _check_scalar(a, values[a.name], impl)
        if a.needs and values[a.needs] is None and values[a.name] != a.default:
            _refuse("needs", impl=impl, name=a.name, of=a.needs, got=repr(float(values[a.name])))
    if "out_dtype" in values:
        _check_quant(values, values[rows], impl)
    if device.type not in ("cuda", "meta") and not (allow_cpu and device.type == "cpu"):
        hint = device_hint
        if hint is None:
            hint = " (Triton runs CPU tensors only under TRITON_INTERPRET=1)" * ("triton" in impl)
            hint = " (or a CPU tensor, under the Triton interpreter)" if allow_cpu else hint
        _refuse("device", impl=impl, name=rows, got=device, hint=hint)


#: The quantised outputs' dtypes (the ops' out_dtype), and the group sizes of group scales.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
GROUP_SIZES = (16, 1024)


def fp8_min_scale(dtype: torch.dtype) -> float:
    """The least dynamic scale of an fp8 dtype, 1 / (its max * 512) (vLLM's floor): a row or
    group of zeros divides by it, not by zero."""
    return 1.0 / (torch.finfo(dtype).max * 512.0)


def scales_shape(x_shape: Sequence[int], scale: object, group_size: int) -> tuple[int, ...]:
    """The shape of a quantised op's scales: (0,) for a static scale (the caller's), x's
    shape with a last dimension of 1 for a scale a row, of N / group_size for a group's."""
    if scale is not None:
        return (0,)
    return (*x_shape[:-1], x_shape[-1] // group_size if group_size else 1)


def _check_quant(values: dict, x: torch.Tensor, impl: str) -> None:
    """A quantised op's own rules (after the tensors'): out_dtype an fp8 dtype the device
    converts to, group_size 0 or a power of two in GROUP_SIZES dividing N, one way of
    scaling (a static scale, or dynamic scales a row with an optional upper bound, or a
    group's), and the scales' values in float32's normal range (check_scale_value)."""
    dtype, group = values["out_dtype"], values["group_size"]
    if dtype not in FP8_DTYPES:
        _refuse("dtype_fp8", impl=impl, name="out_dtype", got=dtype)
    if isinstance(group, bool) or not isinstance(group, int):
        _refuse("int", impl=impl, name="group_size", got=_type_name(group))
    lo, hi = GROUP_SIZES
    if group and not (lo <= group <= hi and group & (group - 1) == 0):
        _refuse("group", impl=impl, name="group_size", got=group, want=f"{lo}, {hi}")
    if group and x.shape[-1] % group:
        _refuse("group_of", impl=impl, name="group_size", got=group, of="x", n=x.shape[-1])
    scale, bound = values["scale"], values["scale_ub"]
    if scale is not None and group:
        hint = "a static scale is one for the whole tensor (group_size 0)"
        _refuse("quant_mode", impl=impl, name="group_size", of="scale", hint=hint)
    if bound is not None and (scale is not None or group):
        hint = "scale_ub bounds the dynamic scale of a row (scale None, group_size 0)"
        of = "scale" if scale is not None else "group_size"
        _refuse("quant_mode", impl=impl, name="scale_ub", of=of, hint=hint)
    if dtype == torch.float8_e4m3fn and x.is_cuda:
        cap = torch.cuda.get_device_capability(x.device)
        if cap < (8, 9):
            sm = f"sm_{cap[0]}{cap[1]}"
            _refuse("fp8_device", impl=impl, name="out_dtype", got=dtype, of="x's GPU", want=sm)
    for name in ("scale", "scale_ub"):
        if values[name] is not None:
            check_scale_value(values[name], name, impl)


#: scale tensors whose value was read, with the version read: each is read once a version
_SCALES_READ = None
#: set while a public quantised function calls its op, whose arguments it has just checked:
#: the op's own check reads no scale again (an inference tensor's is read each check)
_VALUES_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rmsnorm_api_values_checked", default=False
)


def _scale_value(t: torch.Tensor) -> float:
    """A scale's value, read from its tensor (a GPU tensor: one synchronisation)."""
    return float(t.reshape(()))


def check_scale_value(t: torch.Tensor, name: str, impl: str) -> None:
    """A scale's value in float32's normal range [EPS_MIN, EPS_MAX] (positive and finite,
    and its inverse, which the kernels multiply by, finite: a smaller one would turn a zero
    of y into 0 x inf, NaN), read from the tensor (a GPU tensor: one synchronisation) once
    for each version of it (a calibrated scale is read on its first call only; an inference
    tensor, which keeps no version, on every call); not while tracing (fake tensors,
    torch.compile) or capturing a CUDA graph, where a value cannot be read: there the
    caller vouches for it."""
    global _SCALES_READ
    if torch.compiler.is_compiling() or is_fake(t) or t.device.type == "meta":
        return
    if _VALUES_CHECKED.get():  # the public function read it just before calling the op
        return
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if _SCALES_READ is None:
        from torch.utils.weak import WeakIdKeyDictionary

        _SCALES_READ = WeakIdKeyDictionary()
    version = None if t.is_inference() else t._version
    if version is not None and _SCALES_READ.get(t) == version:
        return
    v = _scale_value(t)
    if not EPS_MIN <= v <= EPS_MAX:  # NaN outside too
        _refuse("range", impl=impl, name=name, got=repr(v), want=f"{EPS_MIN:.7g}, {EPS_MAX:.7g}")
    if version is not None:
        _SCALES_READ[t] = version


def _type_name(v: object) -> str:
    return "None" if v is None else type(v).__name__


def as_int(v: object, name: str, where: str, lo: int, hi: Optional[int] = None) -> int:
    """v as an int in [lo, hi] (hi None: no bound), the one rule for the integers the two
    backends' config helpers take: an integer by operator.index (a Python or NumPy
    integer; never a bool, a float or a string), else ValueError naming where and name."""
    try:
        if isinstance(v, bool):
            raise TypeError
        value = operator.index(v)
    except TypeError:
        value = None
    if value is None or value < lo or (hi is not None and value > hi):
        want = f"an int in [{lo}, {hi}]" if hi is not None else f"an int >= {lo}"
        raise ValueError(f"{where}: {name} is {v!r}; expected {want}")
    return value


#: The element sizes (bytes) of DTYPES, as the config helpers take them.
ELEMENT_SIZES = (2, 4)


def check_width(n: object, element_size: object, where: str) -> tuple[int, int]:
    """A row width and an element size as both backends' config helpers (default_config,
    search_space) take them: n an int in [1, MAX_N], element_size 2 or 4 (as_int's rule);
    returned as ints, else ValueError naming where and the argument."""
    n = as_int(n, "n", where, 1, MAX_N)
    size = as_int(element_size, "element_size", where, min(ELEMENT_SIZES), max(ELEMENT_SIZES))
    if size not in ELEMENT_SIZES:
        raise ValueError(f"{where}: element_size is {element_size!r}; expected 2 or 4")
    return n, size


def check_x(x: torch.Tensor, *, impl: str = "rms_norm") -> None:
    """The rules of an op's rows (spec.OPS' x), which the modules check before their own."""
    _check_tensor(_PLANS["rms_norm"][0][0], {"x": x}, impl)


def check_backward_inputs(
    dy: torch.Tensor,
    saved: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    d_residual_out: Optional[torch.Tensor] = None,
    weight_offset: float = 0.0,
    *,
    fused: bool = False,
    allow_cpu: bool = False,
    impl: str = "rms_norm_backward",
) -> None:
    """The backward ops' arguments: dy (the output gradient: a dtype of DTYPES, the saved
    tensor's shape, any strides), the saved tensor (rms_norm's x: dy's dtype; the fused
    add's residual_out: dy's dtype or float32; stride 1 in the last dimension), weight as
    the forward takes it beside dy, the fused add's d_residual_out (residual_out's shape and
    dtype, or None) and eps. Raise TypeError/ValueError naming the argument."""
    if fused:
        _check_op(
            "fused_add_rms_norm_backward",
            impl,
            allow_cpu,
            dy=dy,
            residual_out=saved,
            d_residual_out=d_residual_out,
            weight=weight,
            eps=eps,
            weight_offset=weight_offset,
        )
    else:
        _check_op("rms_norm_backward", impl, allow_cpu, dy=dy, x=saved, weight=weight, eps=eps,
                  weight_offset=weight_offset)  # fmt: skip


def _empty(o: _spec.Out, values: dict, device: torch.device) -> torch.Tensor:
    """A returned tensor (spec.Out), uninitialised: its dtype and shape arguments', or an
    empty (0,) tensor where the argument it depends on is absent (None or False)."""
    if o.unless and (values[o.unless] is None or values[o.unless] is False):
        return torch.empty(0, dtype=values[o.empty_dtype].dtype, device=device)
    dtype = values[o.dtype] if o.dtype != "float32" else torch.float32
    dtype = dtype if isinstance(dtype, torch.dtype) else dtype.dtype
    if o.shape == "scales":
        shape = scales_shape(values["x"].shape, values["scale"], values["group_size"])
    else:
        shape = values[o.shape].shape
    return torch.empty(shape, dtype=dtype, device=device)


def empty_outputs(op: str, **values: object) -> tuple[torch.Tensor, ...]:
    """An op's returned tensors as its description says (spec.OPS[op].returns), on the
    rows' device, uninitialised: what its fake returns."""
    spec = _spec.OPS[op]
    device = values[spec.rows.name].device
    return tuple(_empty(o, values, device) for o in spec.returns)


#: The fused backward's dx and dresidual (spec.Out), which its kernels' callers allocate.
_FUSED_BWD_DX, _FUSED_BWD_DRES, _ = _spec.OPS["fused_add_rms_norm_backward"].returns


def fused_backward_outputs(
    dy: torch.Tensor, residual_out: torch.Tensor, dresidual: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused add's backward outputs, for a kernel to write: dx in dy's dtype and
    dresidual in residual_out's, stored apart (two outputs never alias), or, where dresidual
    is False (autograd's call, where dx serves as both), an empty (0,) tensor in its place."""
    values = {"dy": dy, "residual_out": residual_out, "dresidual": dresidual}
    device = residual_out.device
    return _empty(_FUSED_BWD_DX, values, device), _empty(_FUSED_BWD_DRES, values, device)


def check_call(op: str, impl: str, values: dict, *, allow_cpu: bool = False) -> None:
    """The checks a call of op runs (values: its arguments by name, defaults included): its
    arguments' rules, and the written forms' memory (check_out, check_in_place)."""
    rules = {k: v for k, v in values.items() if k != "out"}
    if op == "rms_norm_out":
        _check_op("rms_norm", impl, allow_cpu, **rules)
        check_out(values["out"], values["x"], values["weight"], impl=impl)
    elif op == "fused_add_rms_norm_":
        _check_op("fused_add_rms_norm", impl, allow_cpu, **rules)
        check_in_place(values["x"], values["residual"], values["weight"], impl=impl)
    elif op == "fused_add_rms_norm_quant_":
        _check_op(op, impl, allow_cpu, **rules)
        check_in_place(values["x"], values["residual"], values["weight"], impl=impl,
                       x_written=False)  # fmt: skip
    else:
        _check_op(op, impl, allow_cpu, **rules)


def check_eps(eps: float, *, impl: str = "rms_norm") -> None:
    _check_scalar(_EPS_ARG, eps, impl)


def _check_scalar(a: _spec.Arg, v: object, impl: str) -> None:
    """A float argument (eps, weight_offset) against its range [a.lo, a.hi]."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        _refuse("real", impl=impl, name=a.name, got=_type_name(v))
    try:
        value, overflow = float(v), False
    except OverflowError:  # an int past float's range, shown shortened
        value, overflow = math.inf, True
    if not a.lo <= value <= a.hi:  # the range is finite: NaN and inf fall outside it
        # shown only when refused: a traced eps (a SymFloat under dynamic shapes) has no repr
        shown = reprlib.repr(v) if overflow else repr(value)
        _refuse(a.range_rule, impl=impl, name=a.name, got=shown, want=f"{a.lo:.7g}, {a.hi:.7g}")


def _memory_checked_later() -> bool:
    """Whether the memory checks of a form that writes (check_out, check_in_place) step
    aside: while dynamo traces a public function's Python, where storage queries
    (torch._C._is_alias_of, a tensor's storage offset) do not trace and would break the
    graph. They are not lost: the op the function calls runs the same checks on the traced
    tensors (the CUDA op's fake, the Triton op's body), where this is False
    (is_dynamo_compiling is True in the frame dynamo traces alone; is_compiling stays True
    through AOTAutograd and Inductor too, and would skip them there as well)."""
    return torch.compiler.is_dynamo_compiling()


def check_out(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    *,
    impl: str = "rms_norm",
) -> None:
    """Checks for the out= form: a contiguous tensor of x's shape, dtype and device, apart
    from x and weight in memory, or x itself (in place: rows of one stride or head rows,
    head_rows, which the kernels write where they lie), and no autograd (run after
    check_inputs)."""
    in_place = out is x or (
        not _memory_checked_later() and (_same_as(out, x) or _functional_twin(out, x))
    )
    if not in_place:
        _check_tensor(_OUT_RULES, {"out": out, "x": x}, impl)
        if out.device != x.device:
            _refuse("device_of", impl=impl, name="out", of="x", got=out.device, want=x.device)
    _refuse_grad("out=", impl, x=x, weight=weight, out=out)
    if _memory_checked_later():
        return
    hint = "pass a plain tensor (out.resolve_neg() is a copy)"
    _check_written(out, "out", impl, hint, heads=in_place)
    # A row written while another program still reads it gives wrong rows, silently; only
    # out=x itself is safe (each row is read whole before it is written).
    same_as_x = in_place or (out.storage_offset() == x.storage_offset() and x.is_contiguous())
    if _overlaps(out, x) and not same_as_x:
        raise ValueError(
            f"{impl}: out partially overlaps x in memory; pass a separate tensor, or out=x"
            " itself to normalise in place"
        )
    if weight is not None and _overlaps(out, weight):
        raise ValueError(f"{impl}: out overlaps weight in memory; pass a separate tensor")


def _same_layout(out: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether out and x have one shape, strides, storage offset, dtype and device."""
    return (
        out.shape == x.shape
        and out.stride() == x.stride()
        and out.storage_offset() == x.storage_offset()
        and out.dtype == x.dtype
        and out.device == x.device
    )


def _functional_twin(out: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether out is what out=x becomes in a traced graph's functional form (the op's fake
    under AOTAutograd and Inductor): a view of a clone of x's base, x's layout in another
    storage. The op's run sees the tensors Inductor re-inplaces, and checks them again."""
    return is_fake(out) and is_fake(x) and _same_layout(out, x)


def _same_as(out: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether out is x itself: one storage, the same offset, shape and strides."""
    return _same_layout(out, x) and torch._C._is_alias_of(out, x)


def _refuse_grad(form: str, impl: str, **tensors: Optional[torch.Tensor]) -> None:
    """A form that writes into given tensors has no autograd: refuse inputs that want it,
    as torch's own out= functions do, naming the first that requires grad or carries a
    forward-mode tangent (whose tangent the write would leave stale)."""
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if t is not None and t.requires_grad:
                raise ValueError(
                    f"{impl}: {form} does not support autograd, but {name} requires grad"
                    " (detach it, or call under torch.no_grad())"
                )
    if _forward_ad._current_level >= 0:
        for name, t in tensors.items():
            if t is not None and _forward_ad.unpack_dual(t).tangent is not None:
                raise ValueError(
                    f"{impl}: {form} does not support forward-mode AD, but {name} has a"
                    " tangent (use the functional form)"
                )


def check_forced_config_grad(impl: str, **tensors: Optional[torch.Tensor]) -> None:
    """The forced-config functions (rms_norm_with_config, fused_add_rms_norm_with_config:
    sweeps and profiles) have no autograd: refuse inputs that want it, naming the function
    and the first such tensor, rather than return an output with no gradient."""
    _refuse_grad("a forced config (for sweeps and profiles)", impl, **tensors)


def _rows(t: torch.Tensor) -> Optional[tuple[int, int, int, int]]:
    """t's elements as rows of its last dimension at one row stride, in bytes: (first byte,
    rows, row stride, row length); None where t has no such layout (a last dimension not
    of stride 1, or leading dimensions that merge into no one stride)."""
    e, n = t.element_size(), (t.shape[-1] if t.dim() else 1)
    if t.dim() and n > 1 and t.stride(-1) != 1:
        return None
    rows, stride = 1, 0
    for size, st in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1]), strict=True):
        if size == 1:
            continue
        if rows > 1 and st != stride * rows:
            return None
        stride = st if rows == 1 else stride
        rows *= size
    return t.storage_offset() * e, rows, stride * e, n * e


def _row_at(lo: int, hi: int, start: int, stride: int, rows: int) -> bool:
    """Whether some row start + j * stride (0 <= j < rows) lies strictly between lo and hi."""
    if stride == 0 or rows == 1:
        return lo < start < hi
    first = max(0, (lo - start) // stride + 1)
    last = min(rows - 1, -((start - hi) // stride) - 1)
    return first <= last


#: Rows of the smaller tensor walked one by one where two aliasing tensors' rows interleave
#: at different strides; past it such a pair is taken to overlap (refused, never risked).
_EXACT_ROWS = 1 << 16


def _rows_meet(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """Whether two row layouts (_rows) share a byte: exact, by arithmetic on the rows."""
    (a0, am, ast, al), (b0, bm, bst, bl) = a, b
    if a0 + (am - 1) * ast + al <= b0 or b0 + (bm - 1) * bst + bl <= a0:
        return False
    if am == 1 or ast == 0:  # a is one byte range (its rows, if several, coincide)
        return _row_at(a0 - bl, a0 + al, b0, bst, bm)
    if bm == 1 or bst == 0:
        return _row_at(b0 - al, b0 + bl, a0, ast, am)
    if ast == bst:  # row i of a meets row j of b where (i - j) * stride is near b0 - a0
        return _row_at(b0 - a0 - al, b0 - a0 + bl, -(bm - 1) * ast, ast, am + bm - 1)
    if min(am, bm) > _EXACT_ROWS:
        return True
    if am > bm:
        (a0, am, ast, al), (b0, bm, bst, bl) = (b0, bm, bst, bl), (a0, am, ast, al)
    return any(_row_at(a0 + i * ast - bl, a0 + i * ast + al, b0, bst, bm) for i in range(am))


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a's and b's elements share bytes of one storage, judged from offsets and
    strides (no data pointer, so fake tensors under tracing are judged alike): exactly for
    row layouts (slices and interleaved rows of one tensor included), by their address
    spans otherwise."""
    if a.numel() == 0 or b.numel() == 0 or not torch._C._is_alias_of(a, b):
        return False
    ra, rb = _rows(a), _rows(b)
    if ra is not None and rb is not None:
        return _rows_meet(ra, rb)

    def span(t: torch.Tensor) -> tuple[int, int]:
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
        start = t.storage_offset() * t.element_size()
        return start, start + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _check_written(t: torch.Tensor, name: str, impl: str, hint: str, heads: bool = False) -> None:
    """A tensor an op writes: viewable as rows in place (the kernels write rows at one
    stride; heads: or head rows, head_rows, which rms_norm's out=x writes where they lie),
    no negative bit (the kernel would write the raw data, which reads back negated) and no
    two elements at one address (all but one write would be lost), as torch's own in-place
    ops refuse. hint: what to pass instead."""
    r = _rows(t)
    if t.numel() > 1 and r is None and heads and head_rows(t) is not None:
        if t.is_neg():
            raise ValueError(
                f"{impl}: {name} is a negative view (torch._neg_view) and is written; {hint}"
            )
        if not _distinct(t):
            raise ValueError(
                f"{impl}: {name} has elements that share memory (more than one element of a"
                f" written-to tensor refers to a single memory location); {hint}"
            )
        return
    if t.numel() > 1 and r is None:
        raise ValueError(
            f"{impl}: {name}'s leading dimensions cannot be viewed as rows in place (the op"
            f" writes into {name}); call {name}.contiguous() first"
        )
    if t.is_neg():
        raise ValueError(
            f"{impl}: {name} is a negative view (torch._neg_view) and is written; {hint}"
        )
    if t.numel() > 1 and r[1] > 1 and r[2] < r[3]:
        raise ValueError(
            f"{impl}: {name} has elements that share memory (more than one element of a"
            f" written-to tensor refers to a single memory location); {hint}"
        )


def check_in_place(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    *,
    impl: str = "fused_add_rms_norm_",
    x_written: bool = True,
) -> None:
    """The in-place fused add writes y into x and residual_out into residual (x_written
    False: the quantised form, residual only, y a new fp8 tensor): a tensor written must be
    viewable as rows in place, apart from the others and from weight in memory, and none
    may require grad (run after check_fused_inputs)."""
    if x_written:
        _refuse_grad("the in-place form", impl, x=x, residual=residual, weight=weight)
    else:  # x and the weight are read: only the residual's autograd is at stake
        _refuse_grad("the in-place form", impl, residual=residual)
    if _memory_checked_later():
        return
    written = (("x", x), ("residual", residual))[not x_written :]
    for name, t in written:
        _check_written(t, name, impl, f"pass {name}.clone() (the in-place form writes {name})")
    which = "both are" if x_written else "residual is"
    if _overlaps(x, residual):
        raise ValueError(f"{impl}: x and residual overlap in memory; {which} written")
    if weight is not None and ((x_written and _overlaps(x, weight)) or _overlaps(residual, weight)):
        what = "x or residual" if x_written else "residual"
        raise ValueError(f"{impl}: weight overlaps {what} in memory; {which} written")


def backward_functions(ns: str, *, allow_cpu: bool = False) -> tuple[Callable, Callable]:
    """A backend's two public backward functions, rms_norm_backward and
    fused_add_rms_norm_backward, over its ops ``<ns>::rms_norm_backward`` and
    ``<ns>::fused_add_rms_norm_backward``: the arguments checked (check_backward_inputs),
    the op run, and dweight given as None without a weight. allow_cpu: the backend runs on
    CPU tensors (the Triton interpreter)."""
    ops = getattr(torch.ops, ns)
    bwd_impl, fused_impl = f"{ns}.rms_norm_backward", f"{ns}.fused_add_rms_norm_backward"

    def rms_norm_backward(
        dy: torch.Tensor,
        x: torch.Tensor,
        weight: Optional[torch.Tensor] = None,
        eps: float = DEFAULT_EPS,
        *,
        weight_offset: float = 0.0,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(dx, dweight) of rms_norm(x, weight, eps, weight_offset=weight_offset) for the
        output gradient dy (any strides); dweight in weight's dtype, None without a weight.
        Deterministic. Raises TypeError/ValueError naming the argument for unsupported
        input."""
        check_backward_inputs(dy, x, weight, eps, None, weight_offset, allow_cpu=allow_cpu,
                              impl=bwd_impl)  # fmt: skip
        dx, dw = ops.rms_norm_backward(dy, x, weight, float(eps), float(weight_offset))
        return dx, dw if weight is not None else None

    def fused_add_rms_norm_backward(
        dy: torch.Tensor,
        d_residual_out: Optional[torch.Tensor],
        residual_out: torch.Tensor,
        weight: Optional[torch.Tensor] = None,
        eps: float = DEFAULT_EPS,
        *,
        weight_offset: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(dx, dresidual, dweight) of the fused add from the gradients of y (dy, x's dtype)
        and of residual_out (None: zero), given the forward's residual_out; dweight as
        rms_norm_backward's. Deterministic. Raises TypeError/ValueError naming the argument
        for unsupported input."""
        check_backward_inputs(dy, residual_out, weight, eps, d_residual_out, weight_offset,
                              fused=True, allow_cpu=allow_cpu, impl=fused_impl)  # fmt: skip
        grads = ops.fused_add_rms_norm_backward(dy, d_residual_out, residual_out, weight,
                                                float(eps), True, float(weight_offset))  # fmt: skip
        return grads[0], grads[1], grads[2] if weight is not None else None

    for fn in (rms_norm_backward, fused_add_rms_norm_backward):
        fn.__module__, fn.__qualname__ = ns, fn.__name__
    return rms_norm_backward, fused_add_rms_norm_backward


def call_op(
    op: Callable[..., torch.Tensor],
    op_out: Callable[..., None],
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    out: Optional[torch.Tensor],
    weight_offset: float = 0.0,
    *,
    impl: str,
    allow_cpu: bool = False,
) -> torch.Tensor:
    """The body of both public rms_norm functions: check the arguments, then run the
    functional op, or the out= op into ``out`` and return it."""
    check_inputs(x, weight, eps, weight_offset, allow_cpu=allow_cpu, impl=impl)
    if out is None:
        return op(x, weight, float(eps), float(weight_offset))
    check_out(out, x, weight, impl=impl)
    op_out(out, x, weight, float(eps), float(weight_offset))
    return out


_C = torch._C
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _plain_cuda(t: torch.Tensor) -> bool:
    """A dense, strided CUDA tensor with neither a negative nor a zero-tensor bit."""
    return (
        t.is_cuda
        and t.layout is torch.strided
        and not (t.is_nested or t.is_neg() or t._is_zerotensor())
    )


def tensor_key(t: Optional[torch.Tensor]) -> Optional[tuple]:
    """What a call's checks and a launch depend on of a tensor besides its data: shape,
    strides, storage offset mod 8 elements (the split kernel's choice; allocations are
    16-byte aligned), dtype and device (the eager fast paths' keys)."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.storage_offset() % 8, t.dtype, t.get_device())


def bypass_ok(x, *others) -> bool:
    """Whether an eager call may go straight to a backend's kernel, past the dispatcher's
    keys above it (both backends' fast paths: CUDA redispatches below Autograd, Triton
    launches its cached plan), with nothing those keys would do left undone: plain CUDA
    tensors (dense and strided, not nested; no subclass, such as FakeTensor; no negative
    or zero-tensor bit, which those keys resolve: the raw data of a negative view has the
    other sign, a zero tensor has no storage), none of them needing a gradient, outside
    tracing (torch.compile, torch.jit.trace), forward-mode AD's dual level, functorch
    transforms and torch function or dispatch modes (each of which would not see the call).
    others: the call's other tensors, None where absent. Compiling is asked first: dynamo
    folds it to True and so never traces the rest."""
    if torch.compiler.is_compiling():
        return False
    if type(x) is not torch.Tensor or not _plain_cuda(x):
        return False
    needs = x.requires_grad
    for t in others:
        if t is not None:
            if type(t) not in _TENSOR_TYPES or not _plain_cuda(t):
                return False
            needs = needs or t.requires_grad
    return not (
        (needs and _C.is_grad_enabled())
        or _forward_ad._current_level >= 0
        or _C._get_tracing_state() is not None
        or _C._len_torch_dispatch_stack()
        or _C._is_torch_function_mode_enabled()
        or _C._are_functorch_transforms_active()
    )


def head_rows(x: torch.Tensor) -> Optional[torch.Tensor]:
    """x as (T, H, N) heads where its rows share no one stride but its dimensions before the
    heads merge (QK-norm's q = qkv[:, :H*D].view(T, H, D) of a packed projection, strides
    (3HD, D, 1)): both backends' heads kernels read, and out=x writes, them where they lie.
    None for rows of one stride (as_rows views them), and for leading dimensions that would
    need a copy anyway."""
    if x.dim() < 3 or _rows(x) is not None or _rows(x[..., 0, :]) is None:
        return None
    return x.view(-1, x.shape[-2], x.shape[-1])


def _distinct(t: torch.Tensor) -> bool:
    """Whether no two of t's elements share an address: its dimensions of more than one
    element, in order of stride, each steps past the whole of the one before it."""
    dims = sorted((st, size) for size, st in zip(t.shape, t.stride(), strict=True) if size > 1)
    return all(b >= a * size for (a, size), (b, _) in zip(dims, dims[1:], strict=False))


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as (M, N) rows sharing one row stride: a view wherever one exists.

    A 2-D slice of a wider tensor (and most 3-D ones) views in place; leading dims that
    cannot be merged into one stride (e.g. a transposed batch) are copied once, which is
    what ``reshape`` decides.
    """
    return x.reshape(-1, x.shape[-1])


class RMSNormModule(torch.nn.Module):
    """Drop-in for ``torch.nn.RMSNorm`` with a 1-D normalized_shape, backed by ``_fn``; with
    a residual, ``module(x, residual)`` is the fused add (``_fused_fn``) and returns
    ``(y, residual_out)``: residual_out = x + residual, y its RMSNorm, as a pre-norm
    transformer's residual stream computes them.

    Same constructor and defaults as torch.nn.RMSNorm: eps=None means
    ``torch.finfo(x.dtype).eps`` at call time; elementwise_affine creates a weight of ones.
    weight_offset (keyword, 0.0 by default) scales by weight + weight_offset, added in fp32
    (Gemma's norms: weight_offset=1.0), and starts the weight at 1 - weight_offset, so that
    a new module scales by one as torch.nn.RMSNorm's does (Gemma's weight starts at zeros).
    Trains: both ops have a backward (the weight gets its gradient).
    """

    _fn: Callable[..., torch.Tensor]
    _fused_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    def __init__(
        self,
        normalized_shape: Union[int, Sequence[int], torch.Size],
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        weight_offset: float = 0.0,
    ) -> None:
        super().__init__()
        impl = self._impl_name()
        if isinstance(normalized_shape, numbers.Integral) and not isinstance(
            normalized_shape, bool
        ):
            normalized_shape = (int(normalized_shape),)
        elif isinstance(normalized_shape, (str, bytes)) or not isinstance(
            normalized_shape, (Sequence, torch.Size)
        ):
            raise TypeError(
                f"{impl}: normalized_shape must be an int or a sequence of ints, got"
                f" {type(normalized_shape).__name__}"
            )
        normalized_shape = tuple(normalized_shape)
        if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in
                   normalized_shape):  # fmt: skip
            raise TypeError(
                f"{impl}: normalized_shape is {normalized_shape}; expected a sequence of ints"
            )
        normalized_shape = tuple(int(d) for d in normalized_shape)
        if len(normalized_shape) != 1:
            raise ValueError(
                f"{impl}: normalized_shape is {normalized_shape}; only a 1-D normalized_shape"
                " (the last dimension) is supported"
            )
        if not 1 <= normalized_shape[0] <= MAX_N:
            raise ValueError(
                f"{impl}: normalized_shape is {normalized_shape}; expected N in [1, {MAX_N}]"
            )
        if eps is not None:
            check_eps(eps, impl=impl)
        _check_scalar(_OFFSET_ARG, weight_offset, impl)
        if not elementwise_affine and weight_offset != 0.0:
            _refuse("needs", impl=impl, name="weight_offset", of="weight",
                    got=repr(float(weight_offset)))  # fmt: skip
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.weight_offset = float(weight_offset)
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
            torch.nn.init.constant_(self.weight, 1.0 - self.weight_offset)

    @classmethod
    def _impl_name(cls) -> str:
        return f"{cls.__module__.split('.')[0]}.{cls.__name__}"

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        impl = self._impl_name()
        check_x(x, impl=impl)
        if x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(
                f"{impl}: x has shape {tuple(x.shape)} but normalized_shape is"
                f" {self.normalized_shape}"
            )
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        # the default offset not passed, so that a module without one calls exactly what
        # it did before the offset existed
        kw = {"weight_offset": self.weight_offset} if self.weight_offset else {}
        if residual is None:
            return type(self)._fn(x, self.weight, eps, **kw)
        return type(self)._fused_fn(x, residual, self.weight, eps, **kw)

    def extra_repr(self) -> str:
        offset = f", weight_offset={self.weight_offset}" * bool(self.weight_offset)
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
            + offset
        )


# the swap helper is user-facing: one import with the rest of the contract; the autograd
# of both backends
from rmsnorm_api.autograd import register_autograd as register_autograd  # noqa: E402
from rmsnorm_api.swap import swap_rms_norm as swap_rms_norm  # noqa: E402


def __getattr__(name: str):
    # the compile fusion pass on first use: it imports Inductor, seconds a process
    if name in ("enable_compile_fusion", "disable_compile_fusion"):
        from rmsnorm_api import fusion

        return getattr(fusion, name)
    raise AttributeError(f"module 'rmsnorm_api' has no attribute {name!r}")
