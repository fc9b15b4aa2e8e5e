"""The ops as data: each op's arguments (tensors and scalars: their types, which may be
None, which the op writes, their defaults, a tensor's dtype, shape and stride rules, a
scalar's range) and what it returns, written once.

Both backends register these ops (cuda_impl's schema strings in C++, triton_impl's
inferred by torch.library from its Python signatures); tests/test_spec.py holds each
registered schema, and the contract's checks to the rules (which refuse every input a rule
forbids, naming the argument). The contract's other consumers (the checks themselves, the
fakes, the autograd, the harness's ops) are to read it next, and a variant (a weight
offset, a per-head weight, an fp8 output) to be a change of this description and of the
kernels' epilogue: docs/notebook/17-the-op-as-data.md, v60.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmsnorm_api import EPS_MAX, EPS_MIN

#: No default: the argument must be given.
REQUIRED = object()


@dataclass(frozen=True)
class Arg:
    """One argument: name, torch schema type ("Tensor", "float", "bool"), whether it may be
    None, whether the op writes it, and its default (REQUIRED: none); a tensor's rules, each
    naming the argument it is judged against (the op's rows: x, or dy in the backward):

    - dtype: "float" (float32, float16 or bfloat16), "A" (A's dtype) or "A|float32";
    - shape: "rows" (at least 1-D, its last dimension N in [1, MAX_N]), "A" (A's shape) or
      "row of A" ((N,), N A's last dimension);
    - stride: "any", "row" (stride 1 in the last dimension, rows any stride) or "dense"
      (contiguous).

    A scalar's: its range [lo, hi] (eps: float32's normal range)."""

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

    @property
    def dtype_of(self) -> str:
        """The argument whose dtype this one's rule names ("" for "float")."""
        return "" if self.dtype == "float" else self.dtype.split("|")[0]

    @property
    def shape_of(self) -> str:
        """The argument whose shape this one's rule names ("" for "rows")."""
        return "" if self.shape == "rows" else self.shape.removeprefix("row of ")

    def text(self, alias: str) -> str:
        """The argument as a schema string writes it (alias: the letter of a written
        tensor's alias set)."""
        kind = self.kind + (f"({alias}!)" if self.written else "") + ("?" if self.optional else "")
        if self.default is REQUIRED:
            return f"{kind} {self.name}"
        return f"{kind} {self.name}={self.default!r}"


@dataclass(frozen=True)
class OpSpec:
    """An op: its name, its arguments in order, and the tensors it returns (none for a form
    that writes its arguments)."""

    name: str
    args: tuple[Arg, ...]
    returns: tuple[str, ...] = ()

    def schema(self, ns: str) -> str:
        """The torch schema string of the op in namespace ns."""
        letters = iter("abcdefgh")
        args = ", ".join(a.text(next(letters) if a.written else "") for a in self.args)
        if not self.returns:
            out = "()"
        elif len(self.returns) == 1:
            out = "Tensor"
        else:
            out = "(" + ", ".join("Tensor" for _ in self.returns) + ")"
        return f"{ns}::{self.name}({args}) -> {out}"


def _eps() -> Arg:
    return Arg("eps", "float", lo=EPS_MIN, hi=EPS_MAX)


def _rows(name: str, **kw) -> Arg:
    return Arg(name, dtype="float", shape="rows", stride="row", **kw)


def _weight(of: str) -> Arg:
    return Arg("weight", optional=True, dtype=f"{of}|float32", shape=f"row of {of}", stride="any")


def _like(name: str, of: str, dtype: str, stride: str, **kw) -> Arg:
    return Arg(name, dtype=dtype, shape=of, stride=stride, **kw)


_X, _WEIGHT, _EPS = _rows("x"), _weight("x"), _eps()

OPS = {
    op.name: op
    for op in (
        OpSpec("rms_norm", (_X, _WEIGHT, _EPS), ("y",)),
        OpSpec("rms_norm_out", (_like("out", "x", "x", "dense", written=True), _X, _WEIGHT, _EPS)),
        OpSpec(
            "fused_add_rms_norm",
            (_X, _like("residual", "x", "x|float32", "row"), _WEIGHT, _EPS),
            ("y", "residual_out"),
        ),
        OpSpec(
            "fused_add_rms_norm_",
            (
                _rows("x", written=True),
                _like("residual", "x", "x|float32", "row", written=True),
                _WEIGHT,
                _EPS,
            ),
        ),
        OpSpec(
            "rms_norm_backward",
            (
                Arg("dy", dtype="float", shape="rows", stride="any"),
                _like("x", "dy", "dy", "row"),
                _weight("dy"),
                _EPS,
            ),
            ("dx", "dweight"),
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
            ),
            ("dx", "dresidual", "dweight"),
        ),
    )
}
