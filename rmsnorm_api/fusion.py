"""The residual add fused into the norm for a model that does not ask for it: an opt-in
Inductor pass (torch's pattern matcher, run after autograd on each compiled graph) that
rewrites ``h = x + residual; y = rms_norm(h)`` into one call of a backend's
``fused_add_rms_norm``, which reads x and residual once and writes y and h once.

    rmsnorm_api.enable_compile_fusion("triton")   # or "cuda"; then torch.compile as usual
    rmsnorm_api.disable_compile_fusion()

What it rewrites: the norm as F.rms_norm (torch.nn.RMSNorm) and as transformers'
LlamaRMSNorm composite (to fp32, pow 2, mean, rsqrt, back to the input's dtype, times the
weight) traces to, over the last dimension of a 2-D or 3-D x, with a weight; x, residual
and weight of one dtype and shape (no broadcast). The sum may be used elsewhere too (it
is the fused op's second output). What it leaves: a norm whose intermediate values are
used elsewhere, mixed dtypes, a broadcast add, a norm without a weight. Results equal the
fused op's (one fp32 rounding); the composite rounds to the input's dtype before the
weight, so rewritten outputs may differ from it by an ulp.

Training graphs: after autograd a graph's forward saves the norm's values for its backward,
which no pattern above matches. So a second pass runs before autograd (Inductor's pre-grad
pass, on the graph dynamo traced) on graphs that train: ``h = x + residual`` and
``torch.rms_norm(h, (N,), weight, eps)`` (what F.rms_norm and torch.nn.RMSNorm trace to),
where x, residual or the weight needs a gradient, become one call of the fused op, whose
autograd (its backward kernels) AOTAutograd then traces for both passes. Under the same
rules (one dtype, the op's own checks); an explicit eps only (eps=None, the dtype's
epsilon, is left as it is).

The norm then an fp8 quantisation: y over a static scale, saturated to the format's max
and cast to float8_e4m3fn or float8_e5m2 (``(y.float() / scale).clamp(-max, max).to(fp8)``,
torchao's and vLLM's references), or over a scale a row as vLLM's reference writes it
(``s = (y.abs().amax(-1, keepdim=True).float() / max).clamp(min=1 / (max * 512))``, the
quantised op's floor), or over a scale a group of G columns written the same way over
``y.unflatten(-1, (-1, G))`` (q flattened back, the scales squeezed: (..., N / G)), after
either norm form, with or without the residual add before it, becomes one call of the
backend's ``rms_norm_quant`` or ``fused_add_rms_norm_quant`` (with that group):
y is written in fp8 in the norm's pass, never stored in 16 bits, so it is the fp32 norm
quantised (it may differ from the unfused graph's where y's 16-bit rounding moved it
across a tie of the fp8 grid, and a row's scale by that rounding). Under the same rules,
and a static scale one fp32 element; other bounds, a scale of more elements, a row's or a
group's scale without that floor (a row of zeros: 0 / 0 there), a group the op does not
take, or another split of the row (a symbolic shape among them) are left.

The backend's own plain op: a model whose norms are already the backend's (its RMSNorm
module, swap_rms_norm, or its rms_norm called) holds the op itself after the add, an opaque
call no Inductor fusion reaches. The pre-grad pass rewrites ``h = x + residual`` and the
backend's ``rms_norm(h, weight, eps[, weight_offset])`` into its fused op too, the weight
offset kept (a swapped Gemma norm's 1.0), in every graph (inference and training), with or
without a weight, under the same rules (x and residual of one dtype, the fused op's own
checks).
"""

from __future__ import annotations

import functools
import hashlib
import operator
from typing import Optional

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import (
    Match,
    PatternMatcherPass,
    fwd_only,
    gen_pattern,
    register_graph_pattern,
    register_replacement,
)
from torch._subclasses.functional_tensor import dispatch_functionalize

BACKENDS = ("triton", "cuda")


def _rms_norm_of_sum(x, residual, weight, eps):
    # F.rms_norm as Inductor's graphs hold it (decomposed; the traced F.rms_norm itself
    # holds an in-place add of an eps rounded to fp32, which matches nothing)
    h = x + residual
    hf = h.to(torch.float32)
    var = torch.ops.aten.add.Scalar(hf.pow(2).mean([h.dim() - 1], keepdim=True), eps)
    return (hf * torch.rsqrt(var) * weight).to(h.dtype), h


def _composite_of_sum(x, residual, weight, eps):
    h = x + residual
    hf = h.to(torch.float32)
    var = hf.pow(2).mean(-1, keepdim=True)
    return weight * (hf * torch.rsqrt(var + eps)).to(h.dtype), h


def _norm(x, weight, eps):
    # F.rms_norm of x as Inductor's graphs hold it (_rms_norm_of_sum's without the add)
    return _norm_fp32(x, weight, eps).to(x.dtype)


def _norm_fp32(x, weight, eps):
    # _norm before its cast to x's dtype: how torch 2.11's Inductor holds _norm cast back to
    # fp32 (its joint-graph pass drops a round trip through a float dtype), as a static
    # quantisation of a 16-bit y does
    xf = x.to(torch.float32)
    var = torch.ops.aten.add.Scalar(xf.pow(2).mean([x.dim() - 1], keepdim=True), eps)
    return xf * torch.rsqrt(var) * weight


def _composite(x, weight, eps):
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(var + eps)).to(x.dtype)


def _static_quant(dtype: torch.dtype):
    """y quantised by a static scale as PyTorch writes it (torchao's and vLLM's references:
    y in fp32 over the scale, saturated to the format's max, cast), for fp8 dtype."""
    top = float(torch.finfo(dtype).max)

    def quantise(y, scale):
        return (y.to(torch.float32) / scale).clamp(-top, top).to(dtype)

    return quantise


def _token_quant(dtype: torch.dtype, group: int = 0):
    """y quantised by a scale a row as vLLM's reference writes it: the row's max|y| in fp32
    over the format's max, at least 1 / (max * 512) (the quantised op's floor, the same
    number), then as the static form; (q, the scales). group: a scale a group of that many
    columns instead, the last dimension split into groups and joined again (the scales
    (..., N / group))."""
    top = float(torch.finfo(dtype).max)
    least = 1.0 / (top * 512.0)

    def quantise(y):
        s = (y.abs().amax(dim=-1, keepdim=True).to(torch.float32) / top).clamp(min=least)
        return (y.to(torch.float32) / s).clamp(-top, top).to(dtype), s

    def quantise_groups(y):
        q, s = quantise(y.unflatten(-1, (-1, group)))
        return q.flatten(-2), s.squeeze(-1)

    return quantise_groups if group else quantise

    return quantise


#: The group the group searches are traced with (their widths 2 of it); the split's shape
#: is a wildcard of the pattern, which _group_size reads and checks on a match.
_TRACED_GROUP = 4


def _quant_searches(dtype: torch.dtype) -> tuple:
    """The quantised patterns' searches for fp8 dtype, (mode, kind, search): each norm form
    then the static quantisation (x, weight, scale, eps) or the scale a row or a group (x,
    weight, eps: q and the scales); and the add before it (x, residual, weight, [scale,]
    eps: the quantised outputs and the sum, or the quantised outputs alone)."""
    static = _static_quant(dtype)

    def forms(norm, group=0):
        token, mode = _token_quant(dtype, group), "group" if group else "token"

        # closures over the norm form alone: the pattern matcher reads their parameters
        def plain(x, weight, scale, eps):
            return static(norm(x, weight, eps), scale)

        def both(x, residual, weight, scale, eps):
            h = x + residual
            return static(norm(h, weight, eps), scale), h

        def first(x, residual, weight, scale, eps):
            return both(x, residual, weight, scale, eps)[0]

        def plain_token(x, weight, eps):
            return token(norm(x, weight, eps))

        def both_token(x, residual, weight, eps):
            h = x + residual
            q, s = token(norm(h, weight, eps))
            return q, s, h

        def first_token(x, residual, weight, eps):
            q, s, _ = both_token(x, residual, weight, eps)
            return q, s

        return [("static", "plain", plain), ("static", "both", both),
                ("static", "first", first), (mode, "plain", plain_token),
                (mode, "both", both_token), (mode, "first", first_token)]  # fmt: skip

    unrounded = [f for f in forms(_norm_fp32) if f[0] == "static"]
    groups = [f for n in (_norm, _composite) for f in forms(n, _TRACED_GROUP) if f[0] == "group"]
    return tuple(forms(_norm) + forms(_composite) + unrounded + groups)


def _first(fn):
    """fn's norm output alone: the pattern where the sum has no other use."""

    def first(x, residual, weight, eps):
        return fn(x, residual, weight, eps)[0]

    return first


def _is_fused_add_norm(devices: tuple[str, ...], match: Match) -> bool:
    """What the patterns leave open (their traced constants are wildcards), checked on the
    match: x, residual and weight tensors (not a number added to x), the square, the mean
    over the last dimension kept, the sum at fp32, an add without alpha; then x, residual,
    weight and eps as the fused op takes them: one dtype, the residual of x's shape, both of
    stride 1 along a row, the weight 1-D of x's width, on a device the backend runs on
    (`devices`), and whatever else the op's own checks refuse (a width outside [1, MAX_N],
    eps outside its range). A match the op would refuse stays the graph's own norm: the pass
    never turns a compile that works into one that fails."""
    try:
        return _fused_op_takes(devices, match)
    except Exception:  # a match the check cannot judge is left alone
        return False


def _norm_nodes(
    match: Match, x: torch.Tensor, fp8: Optional[torch.dtype] = None, grouped: bool = False
):
    """The match's eps where its nodes are the norm the patterns mean (what their traced
    wildcards leave open): an add without alpha, the square, the mean over the last
    dimension kept, casts to fp32 or x's dtype only; with fp8 (a quantised pattern) also a
    cast to it, a clamp at its max, and a row's max and its floor (a scale a row; grouped:
    the max over the last dimension of y split into groups, a group's). None where they
    are not."""
    aten, prims = torch.ops.aten, torch.ops.prims
    # eps is the add of a number; torch 2.11 traces it into a pattern checked against the
    # match's own values, whose kwargs then lack it
    eps = [n.args[1] for n in match.nodes if n.target in (aten.add.Scalar, aten.add.Tensor)]
    eps = [e for e in eps if isinstance(e, (int, float))]
    if len(eps) != 1:
        return None
    casts = (torch.float32, x.dtype) + ((fp8,) if fp8 else ())
    top = float(torch.finfo(fp8).max) if fp8 else 0.0  # no clamp in the others
    # the saturation, and a row's scale's floor (the quantised op's, the same number); a
    # clamp may come as clamp_min and clamp_max
    least = 1.0 / (top * 512.0) if fp8 else 0.0
    clamps = ((-top, top), (least,), (least, None))
    for node in match.nodes:
        if node.target is aten.add.Tensor and node.kwargs.get("alpha", 1) != 1:
            return None  # x + alpha * residual is not the fused op's sum
        if node.target is aten.pow.Tensor_Scalar and node.args[1] != 2:
            return None
        if node.target is aten.mean.dim and (
            list(node.args[1]) not in ([-1], [x.dim() - 1]) or not node.args[2]
        ):
            return None
        if node.target is prims.convert_element_type.default and node.args[1] not in casts:
            return None
        if node.target is aten.clamp.default and tuple(node.args[1:3]) not in clamps:
            return None
        if node.target is aten.clamp_min.default and node.args[1] not in (-top, least):
            return None
        if node.target is aten.clamp_max.default and node.args[1] != top:
            return None
        if node.target is aten.amax.default and (
            list(node.args[1]) not in ([-1], [x.dim() - (0 if grouped else 1)]) or not node.args[2]
        ):
            return None  # a row's max (a group's), kept
    return eps[0]


def _fused_op_takes(devices: tuple[str, ...], match: Match) -> bool:
    from rmsnorm_api import check_fused_inputs

    nodes = [match.kwargs.get(k) for k in ("x", "residual", "weight")]
    if not all(isinstance(n, torch.fx.Node) for n in nodes):
        return False  # x + 1.0: a number where the fused op takes a tensor
    x, r, w = (n.meta.get("val") for n in nodes)
    if not all(isinstance(t, torch.Tensor) for t in (x, r, w)) or x.device.type not in devices:
        return False
    eps = _norm_nodes(match, x)
    if eps is None:
        return False
    if not x.dtype == r.dtype == w.dtype:
        return False  # the patterns' one dtype (the op itself also takes an fp32 residual)
    # the rest as the op judges it: shapes (no broadcast), a row's stride 1, devices, the
    # width's and eps's ranges; what it refuses stays the graph's own norm
    try:
        check_fused_inputs(x, r, w, eps, allow_cpu=True, impl="rmsnorm_api.fusion")
    except (TypeError, ValueError):
        return False
    return True


def _is_quantised_norm(
    devices: tuple[str, ...], fp8: torch.dtype, match: Match, grouped: bool = False
) -> bool:
    """A quantised pattern's match (see _is_fused_add_norm): the norm's nodes as that check
    pins them, the cast's target fp8 and the clamp's bounds its max, a group pattern's
    split of the last dimension (_group_size), then the quantised op's own checks (the
    scale one fp32 element, the weight of x's dtype: the patterns' one dtype; the group a
    power of two in its range)."""
    try:
        return _quantised_args(devices, fp8, match, grouped) is not None
    except Exception:  # a match the check cannot judge is left alone
        return False


def _group_size(match: Match, x: torch.Tensor) -> Optional[int]:
    """A group pattern's group: its views split y's last dimension into (N / G, G) and join
    q's again into x's shape, and the scales lose the groups' dimension; None where they do
    not (another split, a symbolic shape)."""
    aten = torch.ops.aten
    views = [n for n in match.nodes if n.target in (aten.view.default, aten.reshape.default)]
    squeezes = [n for n in match.nodes if n.target is aten.squeeze.dim]
    lead, n = list(x.shape[:-1]), x.shape[-1]
    if len(views) != 2 or len(squeezes) != 1 or squeezes[0].args[1] not in (-1, x.dim()):
        return None
    split, join = sorted(views, key=lambda v: len(v.args[1]), reverse=True)
    shape = list(split.args[1])
    if not all(isinstance(v, int) for v in [*shape, *lead, n]) or len(shape) != x.dim() + 1:
        return None
    g = shape[-1]
    if g <= 0 or n % g or shape != [*lead, n // g, g] or list(join.args[1]) != [*lead, n]:
        return None
    return g


def _quantised_args(
    devices: tuple[str, ...], fp8: torch.dtype, match: Match, grouped: bool = False
) -> Optional[tuple[float, int]]:
    """(eps, group) of a quantised pattern's match the op takes (see _is_quantised_norm;
    group 0 but for a group pattern's), else None."""
    from rmsnorm_api import check_call

    names = ("x", "residual", "weight", "scale")
    nodes = {k: match.kwargs.get(k) for k in names if k in match.kwargs}
    if not all(isinstance(n, torch.fx.Node) for n in nodes.values()):
        return None
    vals = {k: n.meta.get("val") for k, n in nodes.items()}
    if not all(isinstance(t, torch.Tensor) for t in vals.values()):
        return None
    x = vals["x"]
    if x.device.type not in devices:
        return None
    if nodes["x"].target is torch.ops.prims.convert_element_type.default:
        # x cast in the graph (the unrounded form's fp32 match of a 16-bit x): the op would
        # read a copy written in fp32, where the graph's own kernel reads x once
        return None
    group = _group_size(match, x) if grouped else 0
    eps = _norm_nodes(match, x, fp8, grouped)
    if eps is None or group is None:
        return None
    if any(v.dtype != x.dtype for k, v in vals.items() if k in ("residual", "weight")):
        return None
    op = "fused_add_rms_norm_quant" if "residual" in vals else "rms_norm_quant"
    values = {"scale": None, **vals, "eps": eps, "group_size": group, "scale_ub": None,
              "out_dtype": fp8, "weight_offset": 0.0}  # fmt: skip
    try:
        check_call(op, "rmsnorm_api.fusion", values, allow_cpu=True)
    except (TypeError, ValueError):
        return None
    return eps, group


def _quant_replacements(plain_q, fused_q, fp8: torch.dtype, group: int = 0) -> dict:
    """The quantised patterns' replacements, by (mode, kind) of _quant_searches, traced
    functionalized as _patterns' are; group: the dynamic forms' (0: a scale a row)."""

    @dispatch_functionalize
    def plain(x, weight, scale, eps):
        return plain_q(x, weight, eps, scale, 0, None, fp8)[0]

    @dispatch_functionalize
    def both(x, residual, weight, scale, eps):
        y, h, _ = fused_q(x, residual, weight, eps, scale, 0, None, fp8)
        return y, h

    @dispatch_functionalize
    def first(x, residual, weight, scale, eps):
        return fused_q(x, residual, weight, eps, scale, 0, None, fp8)[0]

    @dispatch_functionalize
    def plain_token(x, weight, eps):
        return plain_q(x, weight, eps, None, group, None, fp8)

    @dispatch_functionalize
    def both_token(x, residual, weight, eps):
        y, h, s = fused_q(x, residual, weight, eps, None, group, None, fp8)
        return y, s, h

    @dispatch_functionalize
    def first_token(x, residual, weight, eps):
        y, _, s = fused_q(x, residual, weight, eps, None, group, None, fp8)
        return y, s

    return {("static", "plain"): plain, ("static", "both"): both, ("static", "first"): first,
            ("token", "plain"): plain_token, ("token", "both"): both_token,
            ("token", "first"): first_token}  # fmt: skip


def _traced_reshaped(fn, args, **kwargs) -> torch.fx.GraphModule:
    """fwd_only's trace with its views as reshapes: how the graphs a post-grad pass sees
    hold them (Inductor's view_to_reshape runs first)."""
    gm = fwd_only(fn, args, **kwargs)
    for node in gm.graph.nodes:
        if node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    gm.recompile()
    return gm


def _group_handler(devices: tuple[str, ...], plain_q, fused_q, fp8: torch.dtype, kind: str):
    """A group pattern's rewrite: its group read off the match (a wildcard of the pattern,
    so not an argument register_replacement's replacements could take), then the
    replacement of a scale a row's with that group, eps a constant of it."""

    def handler(match: Match, *args, **kwargs) -> None:
        eps, group = _quantised_args(devices, fp8, match, grouped=True)
        fn = _quant_replacements(plain_q, fused_q, fp8, group)["token", kind]
        names = ("x", "weight") if kind == "plain" else ("x", "residual", "weight")
        match.replace_by_example(lambda *t: fn(*t, eps), [kwargs[k] for k in names])

    return handler


def _quant_patterns(backend: str, patterns: PatternMatcherPass) -> None:
    """The norm (and the add before it) then an fp8 quantisation, by a static scale, a
    scale a row or a scale a group, rewritten into the backend's quantised op: y written
    in fp8 in the norm's pass, never stored in 16 bits (so it may differ from the unfused
    graph's where y's 16-bit rounding moved it across an fp8 tie, and a row's or a group's
    scale by that rounding)."""
    ops = getattr(torch.ops, f"{backend}_impl")
    plain_q, fused_q = ops.rms_norm_quant.default, ops.fused_add_rms_norm_quant.default
    devices = _backend_op(backend)[1]
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        check = functools.partial(_is_quantised_norm, devices, fp8)
        replace = _quant_replacements(plain_q, fused_q, fp8)
        for dtype in (torch.bfloat16, torch.float32):
            for mode, kind, search in _quant_searches(fp8):
                args = [torch.empty(2, 8, dtype=dtype)] * (1 if kind == "plain" else 2)
                args.append(torch.empty(8, dtype=dtype))
                if mode == "static":
                    args.append(torch.empty((), dtype=torch.float32))
                if mode == "group":
                    pattern = gen_pattern(search, [*args, 1e-6], _traced_reshaped, {"eps": 1e-6})
                    register_graph_pattern(
                        pattern,
                        extra_check=functools.partial(check, grouped=True),
                        pass_dict=patterns,
                    )(_group_handler(devices, plain_q, fused_q, fp8, kind))
                    continue
                register_replacement(
                    search,
                    replace[mode, kind],
                    [*args, 1e-6],
                    fwd_only,
                    patterns,
                    extra_check=check,
                    scalar_workaround={"eps": 1e-6},
                    skip_duplicates=True,
                )


def _patterns(backend: str) -> PatternMatcherPass:
    """The pass's patterns for a backend: each search form, with the sum used on and not."""
    fused, devices = _backend_op(backend)
    check = functools.partial(_is_fused_add_norm, devices)

    # Traced functionalized, as AOTAutograd traces a model's own call to the op: the Triton
    # op then decomposes into its kernel launch, which Inductor's wrapper code makes itself
    # (an opaque op is a call back into the op's Python, several times the host time of a
    # launch: docs/notebook/12-the-pass-launch-and-the-sharded-backward.md, v40).
    @dispatch_functionalize
    def replace_both(x, residual, weight, eps):
        return fused(x, residual, weight, eps)

    @dispatch_functionalize
    def replace_norm(x, residual, weight, eps):
        return fused(x, residual, weight, eps)[0]

    # A 16-bit trace (casts to fp32 and back) and an fp32 one (none); traced dtypes, dims
    # and exponents are wildcards in the patterns, which _is_fused_add_norm pins down.
    patterns = PatternMatcherPass(pass_name=f"rmsnorm_api.fusion.{backend}")
    for search in (_rms_norm_of_sum, _composite_of_sum):
        for dtype in (torch.bfloat16, torch.float32):
            args = [torch.empty(2, 8, dtype=dtype) for _ in range(2)]
            args += [torch.empty(8, dtype=dtype), 1e-6]
            for s, r in ((search, replace_both), (_first(search), replace_norm)):
                register_replacement(
                    s,
                    r,
                    args,
                    fwd_only,
                    patterns,
                    extra_check=check,
                    scalar_workaround={"eps": 1e-6},
                    skip_duplicates=True,
                )
    _quant_patterns(backend, patterns)
    return patterns


def _backend_op(backend: str) -> tuple[object, tuple[str, ...]]:
    """(the backend's functional fused op, the devices it runs on here)."""
    ns = f"{backend}_impl"
    __import__(ns)  # registers the op
    devices = ("cuda",)
    if backend == "triton":
        from triton_impl.kernels import INTERPRET

        devices = ("cuda", "cpu") if INTERPRET else devices
    return getattr(torch.ops, ns).fused_add_rms_norm.default, devices


def _sum_before_norm(add, weight, eps, order: dict, devices: tuple[str, ...], offset=0.0):
    """(x, residual, and the example values of x, residual and weight) where ``add`` is a
    residual add of two tensors of one dtype, each contiguous (the fused op's sum is; the
    add's keeps a permuted layout), and it, the weight (a node made before the add, or
    None) and eps (a number) are what the fused op takes on a device it runs on here; else
    None. What both pre-grad matches ask of the sum."""
    from rmsnorm_api import check_fused_inputs

    if not (isinstance(add, torch.fx.Node) and add.op == "call_function"):
        return None
    if add.target not in (operator.add, torch.add) or len(add.args) != 2 or add.kwargs:
        return None
    x, r = add.args
    if not all(isinstance(n, torch.fx.Node) for n in (x, r)):
        return None  # x + 1.0: a number where the fused op takes a tensor
    if weight is not None and (not isinstance(weight, torch.fx.Node) or order[weight] > order[add]):
        return None  # a weight made after the sum
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None  # eps=None (the dtype's epsilon)
    xv, rv = (n.meta.get("example_value") for n in (x, r))
    wv = None if weight is None else weight.meta.get("example_value")
    if not (isinstance(xv, torch.Tensor) and isinstance(rv, torch.Tensor)):
        return None
    if weight is not None and not isinstance(wv, torch.Tensor):
        return None
    if xv.device.type not in devices or xv.dtype != rv.dtype:
        return None  # a promoting add: the fused op writes y in x's dtype
    if not (xv.is_contiguous() and rv.is_contiguous()):
        return None
    try:
        check_fused_inputs(xv, rv, wv, eps, offset, allow_cpu=True, impl="rmsnorm_api.fusion")
    except (TypeError, ValueError):
        return None
    return x, r, xv, rv, wv


def _training_match(norm: torch.fx.Node, order: dict, devices: tuple[str, ...]):
    """(add, x, residual, weight, eps, 0.0: no weight offset) where norm is torch.rms_norm
    of a residual add in a graph that trains and the fused op takes them, else None (see the
    module docstring)."""
    if norm.op != "call_function" or norm.target is not torch.rms_norm:
        return None
    args = dict(zip(("input", "normalized_shape", "weight", "eps"), norm.args, strict=False))
    args.update(norm.kwargs)
    add, weight, eps = args.get("input"), args.get("weight"), args.get("eps")
    found = None if weight is None else _sum_before_norm(add, weight, eps, order, devices)
    if found is None:
        return None
    x, r, xv, rv, wv = found
    if not any(v.requires_grad for v in (xv, rv, wv)):
        return None  # inference graphs: the post-grad pass's
    if wv.dtype != xv.dtype or list(args["normalized_shape"]) != [xv.shape[-1]]:
        return None
    return add, x, r, weight, float(eps), 0.0


def _own_norm_match(norm: torch.fx.Node, order: dict, devices: tuple[str, ...], plain):
    """(add, x, residual, weight, eps, weight_offset) where norm is the backend's own
    rms_norm op (as its public function and module call it: x, weight or None, eps, and
    the weight offset, a number) of a residual add, in any graph, and the fused op takes
    them; else None (see the module docstring). plain: the backend's rms_norm op."""
    if norm.op != "call_function" or norm.target not in (plain, plain.default):
        return None
    if len(norm.args) not in (3, 4) or norm.kwargs:
        return None
    add, weight, eps, *offset = norm.args
    offset = offset[0] if offset else 0.0
    if isinstance(offset, bool) or not isinstance(offset, (int, float)):
        return None
    found = _sum_before_norm(add, weight, eps, order, devices, float(offset))
    return None if found is None else (add, *found[:2], weight, float(eps), float(offset))


# operators a tensor takes in place (dynamo's graph keeps `h += r`, `h[i] = v` as these)
_IN_PLACE_OPERATORS = {
    operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
    operator.ixor, operator.ilshift, operator.irshift, operator.imatmul,
}  # fmt: skip
_IN_PLACE_DUNDERS = {f"__{op.__name__}__" for op in _IN_PLACE_OPERATORS}
# what the functions dynamo's graph switches modes with are named after
# (torch._C._set_grad_enabled, torch.amp.autocast_mode._enter_autocast, ...)
_MODE_SWITCHES = ("grad_enabled", "autocast", "inference_mode")


def _may_write(node: torch.fx.Node) -> bool:
    """Whether a node of dynamo's graph (not functionalized: an in-place op writes the
    tensor its argument node names) may write a tensor in place, or change a mode the
    norm would run under, judged conservatively: a module call, a higher-order operator
    (a user's Triton kernel, a wrapped region), an out= or a true inplace= argument, an
    in-place operator, an op whose schema writes, a method or function named as torch
    names its in-place ops (a trailing underscore), and a switch of grad mode, inference
    mode or autocast (the fused op at the add would run under the add's mode)."""
    if node.op == "call_module":
        return True
    if node.op not in ("call_method", "call_function"):
        return False
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        return True
    if "out" in node.kwargs or node.kwargs.get("inplace") or target in _IN_PLACE_OPERATORS:
        return True
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(getattr(target, o)._schema.is_mutable for o in target.overloads())
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.is_mutable:
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if any(mode in name for mode in _MODE_SWITCHES):
        return True
    return name in _IN_PLACE_DUNDERS or (name.endswith("_") and not name.endswith("__"))


def _rewrite_pre_grad(graph: torch.fx.Graph, backend: str) -> int:
    """Each match of _training_match or _own_norm_match rewritten into the fused op, placed
    at the add (so every use of the sum, before the norm too, reads its second output); the
    count. A match with a node that may write in place between the add and the norm is left:
    the fused op at the add would normalise the sum (and read the weight) as they were
    before that write, and would save for its backward a sum the write then changes."""
    fused, devices = _backend_op(backend)
    plain = getattr(torch.ops, f"{backend}_impl").rms_norm  # looked up once, not a node
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    count = 0
    for norm in nodes:
        try:
            found = _training_match(norm, order, devices) or _own_norm_match(
                norm, order, devices, plain
            )
            if found is not None and any(map(_may_write, nodes[order[found[0]] + 1 : order[norm]])):
                found = None
        except Exception:  # a node the check cannot judge is left alone
            found = None
        if found is None:
            continue
        add, x, r, weight, eps, offset = found
        with graph.inserting_after(add):
            # the weight offset passed only where there is one: the op's schema default
            args = (x, r, weight, eps, offset) if offset else (x, r, weight, eps)
            call = graph.call_function(fused, args)
        with graph.inserting_after(call):
            y = graph.call_function(operator.getitem, (call, 0))
        with graph.inserting_after(y):
            s = graph.call_function(operator.getitem, (call, 1))
        for node, value in ((y, norm), (s, add)):
            node.meta.update(value.meta)
        norm.replace_all_uses_with(y)
        graph.erase_node(norm)
        add.replace_all_uses_with(s)
        graph.erase_node(add)
        count += 1
    return count


class _FusionPass(CustomGraphPass):
    """The post-grad pass Inductor runs on each graph; its uuid keys Inductor's caches."""

    def __init__(self, backend: str):
        self.backend = backend
        # adds and norms rewritten, over every graph, training graphs' too (tests, the harness)
        self.rewrites = 0

    @functools.cached_property
    def _patterns(self) -> PatternMatcherPass:
        return _patterns(self.backend)

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.rewrites += self._patterns.apply(graph)

    def uuid(self) -> Optional[bytes]:
        return _uuid(self.backend)


def _uuid(backend: str) -> bytes:
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read() + backend.encode()).digest()


class _PreGradFusionPass(CustomGraphPass):
    """The pre-grad pass Inductor runs on each graph dynamo traced: training graphs'
    residual adds and norms, and any graph's add and the backend's own plain op, rewritten
    (_rewrite_pre_grad), counted in the post-grad pass's rewrites (what
    enable_compile_fusion returns)."""

    def __init__(self, counted: _FusionPass):
        self.counted = counted

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.counted.rewrites += _rewrite_pre_grad(graph, self.counted.backend)

    def uuid(self) -> Optional[bytes]:
        return _uuid(self.counted.backend + ":pre-grad")


def enable_compile_fusion(backend: str = "triton") -> _FusionPass:
    """From now on, graphs torch.compile builds with Inductor have each residual add and the
    RMSNorm after it rewritten into `backend`'s fused_add_rms_norm ("triton" or "cuda");
    returns the pass (its ``rewrites``: adds and norms rewritten, training graphs' too).
    ValueError for another backend, or while another custom post-grad or pre-grad pass is
    installed (Inductor runs one of each)."""
    if backend not in BACKENDS:
        raise ValueError(
            f"rmsnorm_api.enable_compile_fusion: backend is {backend!r}; expected one of"
            f" {list(BACKENDS)}"
        )
    for name, ours in (("post_grad_custom_post_pass", _FusionPass),
                       ("pre_grad_custom_pass", _PreGradFusionPass)):  # fmt: skip
        current = getattr(inductor_config, name)
        if current is not None and not isinstance(current, ours):
            raise ValueError(
                f"rmsnorm_api.enable_compile_fusion: torch._inductor.config.{name} is already"
                f" set ({current!r}); Inductor runs one"
            )
    installed = _FusionPass(backend)
    inductor_config.pre_grad_custom_pass = _PreGradFusionPass(installed)
    inductor_config.post_grad_custom_post_pass = installed
    return installed


def disable_compile_fusion() -> None:
    """Graphs compiled from now on keep their add and norm (what enable_compile_fusion
    installed goes; another pass is left as it is)."""
    if isinstance(inductor_config.post_grad_custom_post_pass, _FusionPass):
        inductor_config.post_grad_custom_post_pass = None
    if isinstance(inductor_config.pre_grad_custom_pass, _PreGradFusionPass):
        inductor_config.pre_grad_custom_pass = None
