"""The ops' description (rmsnorm_api.spec) against what each backend registers: every op
of the contract, with the arguments (names, types, which may be None, which are written,
defaults) and the returns the description gives it."""

import pytest
import torch

from rmsnorm_api.spec import OPS


def _shape(schema) -> tuple:
    """What a schema says of its op, alias sets' names aside (torch.library names them a0,
    a1 where C++ schema strings say a, b)."""
    args = tuple(
        (a.name, str(a.type), bool(a.alias_info and a.alias_info.is_write), a.default_value)
        for a in schema.arguments
    )
    return args, tuple(str(r.type) for r in schema.returns)


@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_each_backend_registers_the_described_ops(name):
    ns = f"{name}_impl"
    pytest.importorskip(ns)  # its ops register at import, on a machine without a GPU too
    registered = {
        op.split("::", 1)[1]
        for op in torch._C._dispatch_get_all_op_names()
        if op.startswith(f"{ns}::")
    }
    assert set(OPS) <= registered, sorted(set(OPS) - registered)
    for op, spec in OPS.items():
        got = getattr(torch.ops, ns).__getattr__(op).default._schema
        want = torch._C.parse_schema(spec.schema(ns))
        assert _shape(got) == _shape(want), (str(got), spec.schema(ns))


def test_schema_text():
    assert OPS["fused_add_rms_norm_"].schema("x") == (
        "x::fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps) -> ()"
    )
    assert (
        OPS["fused_add_rms_norm_backward"]
        .schema("x")
        .endswith("float eps, bool dresidual=True) -> (Tensor, Tensor, Tensor)")
    )
