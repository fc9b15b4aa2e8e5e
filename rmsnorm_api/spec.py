"""The ops as data: each op's arguments (tensors and scalars: their types, which may be
None, which the op writes, their defaults, a tensor's dtype, shape and stride rules, a
scalar's range) and what it returns, and the checks' wording, written once.

Both backends register these ops (cuda_impl's schema strings in C++, triton_impl's
inferred by torch.library from its Python signatures); tests/test_spec.py holds each
registered schema to the description. The checks read it: the contract's
(rmsnorm_api._check_op) and the C++ op's (rms_norm.cpp's check_op, through spec_rules.h,
which header() writes), in the one wording of MESSAGES; so do the C++ schemas, the CUDA
fakes and the autograd (the vmap row arguments, the scalars passed to the backward op).
The harness's ops are to read it next, and a variant (the weight offset, a per-head weight,
an fp8 output) to be a change of this description and of the kernels' epilogue:
docs/notebook/17-the-op-as-data.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rmsnorm_api import EPS_MAX, EPS_MIN

#: No default: the argument must be given.
REQUIRED = object()


@dataclass(frozen=True)
class Arg:
    """One argument: name, torch schema type ("Tensor", "float", "bool", "SymInt",
    "ScalarType"), whether it may be
    None, whether the op writes it, and its default (REQUIRED: none); a tensor's rules, each
    naming the argument it is judged against (the op's rows: x, or dy in the backward):

    - dtype: "float" (float32, float16 or bfloat16), "float32", "A" (A's dtype) or
      "A|float32";
    - shape: "rows" (at least 1-D, its last dimension N in [1, MAX_N]), "one" (one element:
      a scale), "A" (A's shape), "row of A" ((N,), N A's last dimension) or "row or heads
      of A" ((N,), or A's last two dimensions (H, N): a weight row a head, H A's second to
      last dimension);
    - stride: "any", "row" (stride 1 in the last dimension, rows any stride) or "dense"
      (contiguous).

    A scalar's: its range [lo, hi] (eps: float32's normal range; the weight offset: float32's
    finite range), the wording of a value outside it (MESSAGES' key), and the argument a
    value other than the default needs (the weight offset: a weight)."""

    name: str
    kind: str = "Tensor"
    optional: bool = False
    written: bool = False
    default: object = REQUIRED
    dtype: str = ""
    shape: str = ""
    stride: str = ""
    lo: float = 0.0
    hi: float = 0.0
    range_rule: str = "range"
    needs: str = ""

    @property
    def dtype_of(self) -> str:
        """The argument whose dtype this one's rule names ("" for "float" and "float32")."""
        return "" if self.dtype in ("float", "float32") else self.dtype.split("|")[0]

    @property
    def shape_of(self) -> str:
        """The argument whose shape this one's rule names ("" for "rows" and "one")."""
        if self.shape in ("rows", "one"):
            return ""
        return self.shape.removeprefix("row or heads of ").removeprefix("row of ")

    def text(self, alias: str) -> str:
        """The argument as a schema string writes it (alias: the letter of a written
        tensor's alias set)."""
        kind = self.kind + (f"({alias}!)" if self.written else "") + ("?" if self.optional else "")
        if self.default is REQUIRED:
            return f"{kind} {self.name}"
        if isinstance(self.default, torch.dtype):  # as torch.library writes a dtype
            return f"{kind} {self.name}={str(self.default).removeprefix('torch.')}"
        return f"{kind} {self.name}={self.default!r}"


@dataclass(frozen=True)
class Out:
    """A returned tensor: its name, the arguments whose dtype and shape it takes (on the
    rows' device), and, for one that may come back empty (a (0,) tensor), the argument whose
    absence (None, or False) empties it and the argument whose dtype it then takes."""

    name: str
    dtype: str
    shape: str
    unless: str = ""
    empty_dtype: str = ""


@dataclass(frozen=True)
class OpSpec:
    """An op: its name, its arguments in order, and the tensors it returns (none for a form
    that writes its arguments)."""

    name: str
    args: tuple[Arg, ...]
    returns: tuple[Out, ...] = ()

    @property
    def return_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.returns)

    @property
    def rows(self) -> Arg:
        """The tensor the others are judged against (shape "rows"): x, or dy."""
        return next(a for a in self.args if a.shape == "rows")

    @property
    def check_order(self) -> tuple[Arg, ...]:
        """The tensors in the order their checks run: the rows first, then each after the
        tensors its rules name (the fused backward's d_residual_out after residual_out)."""
        done, out = {self.rows.name}, [self.rows]
        rest = [a for a in self.args if a.kind == "Tensor" and a.name not in done]
        while rest:
            a = next(a for a in rest if {a.dtype_of, a.shape_of} <= done | {""})
            rest.remove(a)
            done.add(a.name)
            out.append(a)
        return tuple(out)

    def schema(self, ns: str = "") -> str:
        """The torch schema string of the op in namespace ns (none: as TORCH_LIBRARY's def
        takes it inside the namespace's block)."""
        letters = iter("abcdefgh")
        args = ", ".join(a.text(next(letters) if a.written else "") for a in self.args)
        if not self.returns:
            out = "()"
        elif len(self.returns) == 1:
            out = "Tensor"
        else:
            out = "(" + ", ".join("Tensor" for _ in self.returns) + ")"
        return f"{ns}::" * bool(ns) + f"{self.name}({args}) -> {out}"


#: The checks' wording, one template a rule, in the fields {impl} (the function refusing),
#: {name} (the argument), {of} (the argument a rule judges it against), {got} and {want}
#: (values), {n} (a row width) and {hint}: formatted by the contract (rmsnorm_api) and,
#: through the header tests/test_spec.py holds to this table (cuda_impl/csrc/spec_rules.h),
#: by the C++ op's checks, so that both say the same words. TypeError for the type, layout
#: and dtype rules, ValueError for the others (MESSAGE_TYPE_ERRORS).
MESSAGES = {
    "tensor": "{impl}: {name} must be a torch.Tensor, got {got}",
    "tensor_or_none": "{impl}: {name} must be a torch.Tensor or None, got {got}",
    "nested": "{impl}: {name} is a nested tensor; expected a dense (strided) tensor",
    "layout": "{impl}: {name} has layout {got}; expected torch.strided (a dense tensor)",
    "dtype_float": "{impl}: {name} has dtype {got}; expected one of float32, float16, bfloat16",
    "dtype_of": "{impl}: {name} has dtype {got} but {of} has dtype {want}",
    "dtype_of_or_fp32": "{impl}: {name} has dtype {got}; expected {of}'s dtype ({want}) or float32",
    "dtype_of_fp32": "{impl}: {name} has dtype {got}; expected {of}'s dtype, torch.float32",
    "dtype_fp32": "{impl}: {name} has dtype {got}; expected torch.float32",
    "dtype_fp8": "{impl}: {name} is {got}; expected torch.float8_e4m3fn or torch.float8_e5m2",
    "fp8_device": "{impl}: {name} is {got}, which {of} ({want}) cannot convert to; it needs"
    " sm_89 or newer",
    "rank": "{impl}: {name} is 0-dimensional; expected at least 1 dimension",
    "n_min": "{impl}: {name}'s last dimension is {got}; expected N >= 1",
    "n_max": "{impl}: {name}'s last dimension is {got}; the supported maximum is N = {want}",
    "shape_of": "{impl}: {name} has shape {got} but {of} has shape {want}",
    "shape_one": "{impl}: {name} has shape {got}; expected one element (shape () or (1,))",
    "shape_row_of": "{impl}: {name} has shape {got} but {of}'s last dimension is {n};"
    " expected ({n},)",
    "shape_row_or_heads_of": "{impl}: {name} has shape {got} but {of}'s last dimension is"
    " {n}; expected ({n},), or a row a head: {want}",
    "stride_row": "{impl}: {name} has stride {got} in its last dimension; expected 1 (call"
    " {name}.contiguous() first; rows may have any stride)",
    "stride_dense": "{impl}: {name} must be contiguous",
    "device_of": "{impl}: {name} is on device '{got}' but {of} is on '{want}'",
    "device": "{impl}: {name} is on device '{got}'; expected a CUDA tensor{hint}",
    "real": "{impl}: {name} must be a real number, got {got}",
    "range": "{impl}: {name} is {got}; expected a number in float32's normal range [{want}]",
    "range_finite": "{impl}: {name} is {got}; expected a finite number in float32's range",
    "needs": "{impl}: {name} is {got} but {of} is None; {name} applies to a {of}",
    "int": "{impl}: {name} must be an int, got {got}",
    "group": "{impl}: {name} is {got}; expected 0 (a scale a row) or a power of two in [{want}]",
    "group_of": "{impl}: {name} is {got}, which does not divide {of}'s last dimension {n}",
    "quant_mode": "{impl}: {name} is given with {of}; {hint}",
}
MESSAGE_TYPE_ERRORS = frozenset(
    ("tensor", "tensor_or_none", "nested", "layout", "dtype_float", "dtype_of")
    + ("dtype_of_or_fp32", "dtype_of_fp32", "real", "dtype_fp32", "dtype_fp8", "int")
)


def _eps() -> Arg:
    return Arg("eps", "float", lo=EPS_MIN, hi=EPS_MAX)


#: y = x * rstd * (weight + weight_offset), the offset added to each weight element in fp32
#: (Gemma's (1 + w) is weight_offset=1.0): last, so every positional call stays as it was
_OFFSET = Arg(
    "weight_offset",
    "float",
    default=0.0,
    lo=-EPS_MAX,
    hi=EPS_MAX,
    range_rule="range_finite",
    needs="weight",
)


def _rows(name: str, **kw) -> Arg:
    return Arg(name, dtype="float", shape="rows", stride="row", **kw)


def _weight(of: str, heads: bool = False) -> Arg:
    """The weight: a row of N, or (heads: rms_norm and its backward) a row a head, (H, N)."""
    shape = f"row or heads of {of}" if heads else f"row of {of}"
    return Arg("weight", optional=True, dtype=f"{of}|float32", shape=shape, stride="any")


def _like(name: str, of: str, dtype: str, stride: str, **kw) -> Arg:
    return Arg(name, dtype=dtype, shape=of, stride=stride, **kw)


def _dweight(empty_dtype: str) -> Out:
    """The weight's gradient: the weight's dtype and shape, empty without a weight."""
    return Out("dweight", "weight", "weight", "weight", empty_dtype)


def _scale(name: str) -> Arg:
    """A quantised output's scale (the static one, or the dynamic scales' upper bound): one
    fp32 element on the rows' device, or None."""
    return Arg(name, optional=True, default=None, dtype="float32", shape="one", stride="any")


#: The quantised output's arguments (the forward's fp8 epilogue), after eps: the caller's
#: static scale, or (None) dynamic scales, a row's (group_size 0) or each group_size
#: columns' (a power of two dividing N), the row's clamped above by scale_ub; the output's
#: fp8 dtype
_QUANT = (
    _scale("scale"),
    Arg("group_size", "SymInt", default=0),
    _scale("scale_ub"),
    Arg("out_dtype", "ScalarType", default=torch.float8_e4m3fn),
)
#: Quantised outputs: y in out_dtype, x's shape; the dynamic scales (a row's: x's shape with
#: a last dimension of 1; a group's: of N / group_size), empty (0,) for a static scale
_Y_Q, _SCALES = Out("y", "out_dtype", "x"), Out("scales", "float32", "scales")

_X, _WEIGHT, _EPS = _rows("x"), _weight("x"), _eps()
_HEAD_WEIGHT = _weight("x", heads=True)
_Y = Out("y", "x", "x")

OPS = {
    op.name: op
    for op in (
        OpSpec("rms_norm", (_X, _HEAD_WEIGHT, _EPS, _OFFSET), (_Y,)),
        OpSpec(
            "rms_norm_out",
            (_like("out", "x", "x", "dense", written=True), _X, _HEAD_WEIGHT, _EPS, _OFFSET),
        ),
        OpSpec(
            "fused_add_rms_norm",
            (_X, _like("residual", "x", "x|float32", "row"), _WEIGHT, _EPS, _OFFSET),
            (_Y, Out("residual_out", "residual", "x")),
        ),
        OpSpec(
            "fused_add_rms_norm_",
            (
                _rows("x", written=True),
                _like("residual", "x", "x|float32", "row", written=True),
                _WEIGHT,
                _EPS,
                _OFFSET,
            ),
        ),
        OpSpec("rms_norm_quant", (_X, _WEIGHT, _EPS, *_QUANT, _OFFSET), (_Y_Q, _SCALES)),
        OpSpec(
            "fused_add_rms_norm_quant",
            (_X, _like("residual", "x", "x|float32", "row"), _WEIGHT, _EPS, *_QUANT, _OFFSET),
            (_Y_Q, Out("residual_out", "residual", "x"), _SCALES),
        ),
        OpSpec(
            "fused_add_rms_norm_quant_",
            (
                _X,
                _like("residual", "x", "x|float32", "row", written=True),
                _WEIGHT,
                _EPS,
                *_QUANT,
                _OFFSET,
            ),
            (_Y_Q, _SCALES),
        ),
        OpSpec(
            "rms_norm_backward",
            (
                Arg("dy", dtype="float", shape="rows", stride="any"),
                _like("x", "dy", "dy", "row"),
                _weight("dy", heads=True),
                _EPS,
                _OFFSET,
            ),
            (Out("dx", "x", "x"), _dweight("x")),
        ),
        OpSpec(
            "fused_add_rms_norm_backward",
            (
                Arg("dy", dtype="float", shape="rows", stride="any"),
                _like("d_residual_out", "dy", "residual_out", "any", optional=True),
                _like("residual_out", "dy", "dy|float32", "row"),
                _weight("dy"),
                _EPS,
                Arg("dresidual", "bool", default=True),
                _OFFSET,
            ),
            (
                Out("dx", "dy", "residual_out"),
                Out("dresidual", "residual_out", "residual_out", "dresidual", "residual_out"),
                _dweight("residual_out"),
            ),
        ),
    )
}


_ENUMS = {
    "dtype": {"float": "kFloat", "float32": "kFloat32", "A": "kOf", "A|float32": "kOfOrFloat32"},
    "shape": {
        "rows": "kRows",
        "one": "kOne",
        "A": "kOf",
        "row of A": "kRowOf",
        "row or heads of A": "kRowOrHeadsOf",
    },
    "stride": {"any": "kAny", "row": "kRow", "dense": "kDense"},
}


def _camel(key: str) -> str:
    """A C++ constant's name for a key: rms_norm -> RmsNorm, fused_add_rms_norm_ ->
    FusedAddRmsNormInPlace."""
    return "".join(w.capitalize() for w in key.split("_")) + "InPlace" * key.endswith("_")


def header() -> str:
    """cuda_impl/csrc/spec_rules.h: each op's tensor rules, in check order, and the checks'
    wording, for the C++ op's checks (tests/test_spec.py holds the committed file to this)."""
    from rmsnorm_api import GROUP_SIZES, MAX_N

    out = [
        "// Written from rmsnorm_api/spec.py by its header() (tests/test_spec.py holds this file",
        "// to it, and says how to rewrite it): each op's schema and tensor rules, in the order",
        "// the checks run, and the checks' wording, which the C++ op's registration and checks",
        "// (rms_norm.cpp) apply as rmsnorm_api does.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace cuda_impl::spec {",
        "",
        "enum class Dtype { kFloat, kFloat32, kOf, kOfOrFloat32 };",
        "enum class Shape { kRows, kOne, kOf, kRowOf, kRowOrHeadsOf };",
        "enum class Stride { kAny, kRow, kDense };",
        "// A tensor argument: its index among the op's arguments, its name, whether it may be",
        "// None, and its rules (dtype_of, shape_of: the index of the argument a rule names, or",
        "// -1).",
        "struct Tensor {",
        "  int arg;",
        "  const char* name;",
        "  bool optional;",
        "  Dtype dtype;",
        "  int dtype_of;",
        "  Shape shape;",
        "  int shape_of;",
        "  Stride stride;",
        "};",
        "// A check's wording: its template ({field}s as rmsnorm_api fills them) and whether it is",
        "// a TypeError (else a ValueError).",
        "struct Message {",
        "  const char* text;",
        "  bool type_error;",
        "};",
        "",
        f"constexpr int64_t kMaxN = {MAX_N};",
        f"constexpr double kEpsMin = {EPS_MIN!r};",
        f"constexpr double kEpsMax = {EPS_MAX!r};",
        f"constexpr int64_t kGroupMin = {GROUP_SIZES[0]};",
        f"constexpr int64_t kGroupMax = {GROUP_SIZES[1]};",
        "",
    ]
    for op in OPS.values():
        index = {a.name: i for i, a in enumerate(op.args)}
        out.append(f"constexpr Tensor k{_camel(op.name)}[] = {{")
        for a in op.check_order:
            dtype = _ENUMS["dtype"][a.dtype.replace(a.dtype_of, "A") if a.dtype_of else a.dtype]
            shape = _ENUMS["shape"][a.shape.replace(a.shape_of, "A") if a.shape_of else a.shape]
            out.append(
                f'    {{{index[a.name]}, "{a.name}", {str(a.optional).lower()}, Dtype::{dtype},'
                f" {index.get(a.dtype_of, -1)}, Shape::{shape}, {index.get(a.shape_of, -1)},"
                f" Stride::{_ENUMS['stride'][a.stride]}}},"
            )
        out.append("};")
        out.append(f"constexpr const char* k{_camel(op.name)}Schema = {_c_string(op.schema())};")
    out.append("")
    for key, text in MESSAGES.items():
        error = str(key in MESSAGE_TYPE_ERRORS).lower()
        out.append(f"constexpr Message k{_camel(key)} = {{{_c_string(text)}, {error}}};")
    out += ["", "}  // namespace cuda_impl::spec", ""]
    return "\n".join(out)


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
