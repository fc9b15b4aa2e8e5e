"""The ops as data: each op's arguments (tensors and scalars: their types, which may be
None, which the op writes, their defaults) and what it returns, written once.

Both backends register these ops (cuda_impl's schema strings in C++, triton_impl's
inferred by torch.library from its Python signatures); tests/test_spec.py holds each
registered schema to the description here. The contract's other consumers (the checks,
the fakes, the autograd, the harness's ops) are to read it next, and a variant (a weight
offset, a per-head weight, an fp8 output) to be a change of this description and of the
kernels' epilogue: docs/notebook/17-the-op-as-data.md, v60.
"""

from __future__ import annotations

from dataclasses import dataclass

#: No default: the argument must be given.
REQUIRED = object()


@dataclass(frozen=True)
class Arg:
    """One argument: name, torch schema type ("Tensor", "float", "bool"), whether it may be
    None, whether the op writes it, and its default (REQUIRED: none)."""

    name: str
    kind: str = "Tensor"
    optional: bool = False
    written: bool = False
    default: object = REQUIRED

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


_X, _WEIGHT, _EPS = Arg("x"), Arg("weight", optional=True), Arg("eps", "float")

OPS = {
    op.name: op
    for op in (
        OpSpec("rms_norm", (_X, _WEIGHT, _EPS), ("y",)),
        OpSpec("rms_norm_out", (Arg("out", written=True), _X, _WEIGHT, _EPS)),
        OpSpec("fused_add_rms_norm", (_X, Arg("residual"), _WEIGHT, _EPS), ("y", "residual_out")),
        OpSpec(
            "fused_add_rms_norm_",
            (Arg("x", written=True), Arg("residual", written=True), _WEIGHT, _EPS),
        ),
        OpSpec("rms_norm_backward", (Arg("dy"), _X, _WEIGHT, _EPS), ("dx", "dweight")),
        OpSpec(
            "fused_add_rms_norm_backward",
            (
                Arg("dy"),
                Arg("d_residual_out", optional=True),
                Arg("residual_out"),
                _WEIGHT,
                _EPS,
                Arg("dresidual", "bool", default=True),
            ),
            ("dx", "dresidual", "dweight"),
        ),
    )
}
