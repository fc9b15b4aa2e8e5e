"""The ops' description (rmsnorm_api.spec) against what each backend registers: every op
of the contract, with the arguments (names, types, which may be None, which are written,
defaults) and the returns the description gives it."""

import pathlib

import pytest
import torch

from rmsnorm_api import MAX_N
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
        "x::fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps,"
        " float weight_offset=0.0) -> ()"
    )
    assert (
        OPS["fused_add_rms_norm_backward"]
        .schema("x")
        .endswith(
            "float eps, bool dresidual=True, float weight_offset=0.0) -> (Tensor, Tensor, Tensor)"
        )
    )


def _contract_checks():
    """Each op's argument checks in the contract (rmsnorm_api.check_call), keyed by op: what
    both backends run before their kernels (CPU tensors allowed: the rules are not the
    device)."""
    import rmsnorm_api as api

    def checks(op):
        return lambda a: api.check_call(op, op, a, allow_cpu=True)

    return {op: checks(op) for op in OPS}


def _valid(spec, dtype=torch.bfloat16, rows=(3, 8)) -> dict:
    """Arguments every rule of spec admits, built from the rules: the rows' tensors of
    dtype and shape rows, the others as their rules relate them (x|float32: x's dtype),
    each after the arguments it refers to."""
    args = {a.name: (1e-6 if a.kind == "float" else a.default) for a in spec.args
            if a.kind != "Tensor"}  # fmt: skip
    pending = [a for a in spec.args if a.kind == "Tensor"]
    scales = [a.name for a in pending if a.shape == "one"]
    for name in scales:  # the first scale given (two together are refused: a quant mode)
        args[name] = torch.tensor(0.5) if name == scales[0] else None
    pending = [a for a in pending if a.shape != "one"]
    while pending:
        a = next(a for a in pending if {a.dtype_of, a.shape_of} - {""} <= set(args))
        pending.remove(a)
        dt = args[a.dtype_of].dtype if a.dtype_of else dtype
        if not a.shape_of:
            shape = rows
        elif a.shape.startswith(("row of ", "row or heads of ")):
            shape = (args[a.shape_of].shape[-1],)
        else:
            shape = tuple(args[a.shape_of].shape)
        args[a.name] = torch.randn(shape).to(dt)
    return {a.name: args[a.name] for a in spec.args}


def _violations(spec, a) -> list:
    """(what, value) pairs breaking one rule of argument a each, the other arguments valid."""
    base = _valid(spec)[a.name]
    if a.shape == "one":  # a scale: one fp32 element
        base = torch.tensor(0.5)
        return [("fp64", base.double()), ("bf16", base.bfloat16()), ("two", base.repeat(2))]
    out = []
    if a.dtype == "float":
        out.append(("an int dtype", base.to(torch.int32)))
        # names C++ must print as Python does (c10's own spelling differs)
        out += [("fp8", base.to(torch.float8_e4m3fn)), ("uint16", base.to(torch.uint16))]
    elif "|" in a.dtype:
        out.append(("fp16 beside bf16", base.to(torch.float16)))
    else:
        out.append(("fp32 beside bf16", base.float()))
    if a.shape == "rows":
        out += [("0-d", base[0, 0].clone()), ("N = 0", base[:, :0].clone())]
        out.append(("N past MAX_N", torch.randn(1, MAX_N + 1).to(base.dtype)))
    else:
        out.append(
            ("another shape", torch.randn(*base.shape[:-1], base.shape[-1] + 1).to(base.dtype))
        )
    if a.shape.startswith("row or heads of "):  # a row a head, but not of the rows' heads
        rows = _valid(spec)[a.shape_of].shape
        out.append(("heads not the rows'", torch.randn(rows[-2] + 1, rows[-1]).to(base.dtype)))
    wide = torch.randn(*base.shape[:-1], 2 * base.shape[-1]).to(base.dtype)
    if a.stride in ("row", "dense"):
        out.append(("last-dim stride 2", wide[..., ::2]))
    if a.stride == "dense":
        out.append(("rows apart", wide[..., : base.shape[-1]]))
    return out


def _cpp_op(op: str):
    """The CUDA extension's op (its checks run on CPU tensors too: every input off a CUDA
    device reaches a checking kernel), or None where the extension is not built."""
    try:
        import cuda_impl  # noqa: F401
    except ImportError:
        return None
    return getattr(torch.ops.cuda_impl, op)


@pytest.mark.parametrize("op", list(OPS))
def test_the_checks_keep_the_rules(op):
    """The contract's checks admit what the description's rules admit and refuse, naming
    the argument, every input breaking one rule: a tensor's dtype, shape or stride, a
    scalar out of its range; and the C++ op's checks, which read the same rules, refuse it
    in the same words (but out=, whose checks follow x's device there)."""
    import re

    spec = OPS[op]
    check = _contract_checks()[op]
    cpp = _cpp_op(op)

    def same_words(args: dict, e: pytest.ExceptionInfo) -> None:
        if cpp is None or (op == "rms_norm_out" and "out" in str(e.value).split(":")[1]):
            return
        with pytest.raises((TypeError, ValueError)) as c:
            cpp(*args.values())
        assert type(c.value) is type(e.value)
        # the same words after the function's name (each backend's own)
        assert str(c.value).splitlines()[0].split(": ", 1)[1] == str(e.value).split(": ", 1)[1]

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        check(_valid(spec, dtype))
        check(_valid(spec, dtype, rows=(2, 3, 5)))
    for a in spec.args:
        if a.kind == "float":
            # past each end of the range by half its size (eps: a subnormal, 1.5 x FLT_MAX;
            # the weight offset: past float32's range both ways), and NaN
            for bad in (a.lo - abs(a.lo) / 2, a.hi + abs(a.hi) / 2, float("nan")):
                args = _valid(spec)
                args[a.name] = bad
                with pytest.raises(ValueError, match=rf"\b{a.name}\b") as e:
                    check(args)
                same_words(args, e)
        if a.needs:  # a value other than the default without the argument it needs
            args = _valid(spec)
            args[a.needs], args[a.name] = None, 1.0
            with pytest.raises(ValueError, match=rf"\b{a.name}\b.*\b{a.needs}\b") as e:
                check(args)
            same_words(args, e)
            args[a.name] = a.default
            check(args)
        if a.kind != "Tensor":
            continue
        for what, value in _violations(spec, a):
            args = _valid(spec)
            args[a.name] = value
            with pytest.raises((TypeError, ValueError)) as e:
                check(args)
            assert re.search(rf"\b{a.name}\b", str(e.value)), (op, a.name, what, str(e.value))
            same_words(args, e)


def test_the_cpp_checks_read_the_same_rules():
    """The C++ op's checks read each op's rules and the wording from spec_rules.h, written
    from the description: the committed file is what header() writes now."""
    from rmsnorm_api.spec import header

    path = pathlib.Path(__file__).resolve().parent.parent / "cuda_impl/csrc/spec_rules.h"
    assert path.read_text() == header(), (
        "cuda_impl/csrc/spec_rules.h is stale: rewrite it with python -c"
        " \"from rmsnorm_api.spec import header; print(header(), end='')\" >"
        " cuda_impl/csrc/spec_rules.h"
    )


def test_rules_name_required_tensors():
    """A rule judges an argument against another that is always there: both engines read
    the named argument's dtype or shape without asking whether it was given."""
    for op in OPS.values():
        by_name = {a.name: a for a in op.args}
        for a in op.args:
            for of in (a.dtype_of, a.shape_of):
                if of:
                    assert by_name[of].kind == "Tensor" and not by_name[of].optional, (
                        op.name,
                        a.name,
                    )


def test_the_checks_trace_with_a_dynamic_eps():
    """The contract's checks inside a compiled graph where eps is traced (dynamic shapes,
    or a second eps): they build no message unless they refuse, so nothing breaks the
    graph."""
    import rmsnorm_api as api

    def f(x, w, eps):
        api.check_inputs(x, w, eps, allow_cpu=True)
        return x * 2

    g = torch.compile(f, fullgraph=True, dynamic=True, backend="eager")
    x, w = torch.randn(4, 8), torch.randn(8)
    for eps in (1e-6, 1e-5):
        torch.testing.assert_close(g(x, w, eps), x * 2)
