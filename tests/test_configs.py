"""Every launch config either kernel can be forced into computes the same function.

The sweep (harness.sweep) times configs the default heuristics do not pick; a config that
is fast but wrong must fail here first. Triton candidates run everywhere (the interpreter
on CPU); CUDA configs need a GPU, except the table's own consistency.
"""

import pytest
import torch

from conftest import DEVICE, fn_or_skip, impl_or_skip
from harness import sweep
from harness.reference import TOL, rms_norm_ref

VEC = {torch.float32: 4, torch.bfloat16: 8}


def inputs(m, n, dtype):
    x = torch.randn(m, n, device=DEVICE).to(dtype)
    return x, (1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype)


@pytest.mark.parametrize("n", [17, 1000, 4097])
def test_every_triton_candidate_matches_reference(n):
    impl_or_skip("triton")
    from triton_impl.rms_norm_op import rms_norm_with_config

    x, w = inputs(5, n, torch.bfloat16)
    want = rms_norm_ref(x, w, 1e-6)
    for cfg in sweep.triton_candidates(n, 2):
        got = rms_norm_with_config(x, w, 1e-6, cfg)
        torch.testing.assert_close(
            got, want, **TOL[torch.bfloat16], msg=lambda m, cfg=cfg: f"{cfg}: {m}"
        )


@pytest.mark.parametrize("n", [17, 1000, 4097])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_split_kernel_any_alignment(n, dtype):
    """The split kernel finds x's 16-byte boundaries from its address and stores y with
    vectors only where y lines up: rows at odd offsets and odd strides stay correct."""
    impl_or_skip("triton")
    from triton_impl.rms_norm_op import rms_norm_with_config

    base = torch.randn(6, n + 5, device=DEVICE).to(dtype)
    x = base[:, 3 : 3 + n]  # 3 elements past the allocation, row stride n + 5
    w = (1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype)
    body = triton_next_pow2(n)
    cfg = dict(kernel="split", BLOCK_M=1, BLOCK_N=body, num_warps=2)
    got = rms_norm_with_config(x, w, 1e-6, cfg)
    torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("n", [12288, 12289])
@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("per_sm", [0, 1])
def test_chunked_kernel_stages(n, stages, per_sm):
    """The chunked kernel with its chunk loads pipelined (stages > 1) or not, one program a
    row or a few walking rows: same function, with a partial last chunk (12289)."""
    impl_or_skip("triton")
    from triton_impl.rms_norm_op import rms_norm_with_config

    x, w = inputs(5, n, torch.bfloat16)
    cfg = dict(kernel="chunked", BLOCK_M=1, BLOCK_N=4096, num_warps=8, programs_per_sm=per_sm)
    if stages > 1:
        cfg["stages"] = stages
    got = rms_norm_with_config(x, w, 1e-6, cfg)
    torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **TOL[torch.bfloat16])


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_cuda_config_table():
    """The default plan holds the row, grows with N, and uses a cluster only past the
    widest single-CTA config; a default build compiles only the configs it picks."""
    fn_or_skip("cuda")
    import cuda_impl.ops as ops

    table = ops.configs()
    shipped = [c for c in table if c["default"]]
    assert shipped and len(shipped) == len({tuple(c.values()) for c in shipped})
    assert ops.sweep_build() == (len(shipped) < len(table))
    assert any(c["cluster"] and c["row_threads"] == 1024 and c["vpt"] == 8 for c in table)
    # kernel variants: each shipped bit taken by some default plan
    for bit in (ops.VARIANT_PLAIN_LOADS, ops.VARIANT_LEAN_REGS):
        assert any(c["variant"] & bit and c["default"] for c in table), bit
    # the two halves of the read-only load: on no ladder
    for bit in (ops.VARIANT_HINT_ONLY_LOADS, ops.VARIANT_NC_ONLY_LOADS):
        assert not any(c["variant"] & bit and c["default"] for c in table), bit
    picked = set()
    for elem in (2, 4):
        caps = []
        for n in (1, 8, 64, 128, 1000, 4096, 4097, 8192, 32768, 65536, 131072, 262144):
            c = ops.default_config(n, elem)
            cap = c["row_threads"] * c["vpt"] * c["cluster"]
            assert cap >= n * elem // 16, (n, elem, c)  # holds the row's whole vectors
            caps.append(cap)
            picked.add((c["row_threads"], c["vpt"], c["cluster"] > 1, c["variant"]))
        assert caps == sorted(caps), (elem, caps)
        assert ops.default_config(8192 * 16 // elem, elem)["cluster"] == 1
        assert ops.default_config(2 * 8192 * 16 // elem, elem)["cluster"] >= 2
    for c in shipped:  # what the throughput ladders pick is shipped
        del c["default"]
    keys = {(c["row_threads"], c["vpt"], c["cluster"], c["variant"]) for c in shipped}
    assert picked <= keys, picked - keys


def test_cuda_sweep_only_configs():
    """A sweep build (RMSNORM_SWEEP_CONFIGS=1) adds the sweep-only variant bits, on no
    ladder; a default build has none of them."""
    fn_or_skip("cuda")
    import cuda_impl.ops as ops

    if not ops.sweep_build():
        pytest.skip("sweep-only configs not built (build with RMSNORM_SWEEP_CONFIGS=1)")
    table = ops.configs()
    for bit in (ops.VARIANT_HINT_ONLY_LOADS, ops.VARIANT_NC_ONLY_LOADS):
        assert any(c["variant"] & bit and not c["default"] for c in table), bit


def cuda_cases():
    """(config, N) pairs: each config at its full capacity and at an odd N just below."""
    try:
        import cuda_impl.ops as ops
    except ImportError:
        return []
    out = []
    for c in ops.configs():
        ranks = 2 if c["cluster"] else 1
        for dtype in VEC:
            cap = c["row_threads"] * c["vpt"] * ranks * VEC[dtype]
            for n in (cap, cap - 3):
                tag = f"{c['row_threads']}x{c['vpt']}c{ranks}var{c['variant']}"
                out.append(pytest.param(c, ranks, n, dtype, id=f"{tag}-n{n}-{dtype}"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("cfg, ranks, n, dtype", cuda_cases())
def test_every_cuda_config_matches_reference(cfg, ranks, n, dtype):
    impl_or_skip("cuda")
    import cuda_impl.ops as ops

    x, w = inputs(7, n, dtype)
    got = ops.rms_norm_with_config(
        x, w, 1e-6, cfg["row_threads"], cfg["vpt"], ranks, cfg["variant"]
    )
    torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **TOL[dtype])


@pytest.mark.gpu
def test_forced_cuda_config_errors():
    impl_or_skip("cuda")
    import cuda_impl.ops as ops

    x, w = inputs(4, 4096, torch.bfloat16)
    with pytest.raises(ValueError, match="no compiled config"):
        ops.rms_norm_with_config(x, w, 1e-6, 96, 3, 1)
    with pytest.raises(ValueError, match="variant 2"):  # 8 x 1 has no lean-register variant
        ops.rms_norm_with_config(x, w, 1e-6, 8, 1, 1, ops.VARIANT_LEAN_REGS)
    with pytest.raises(ValueError, match="no compiled config"):  # not wrapped into int range
        ops.rms_norm_with_config(x, w, 1e-6, 2**32 + 8, 1, 1, ops.VARIANT_PLAIN_LOADS)
    with pytest.raises(ValueError, match="elements a row; N is 4096"):
        ops.rms_norm_with_config(x, w, 1e-6, 8, 1, 1, ops.VARIANT_PLAIN_LOADS)
    with pytest.raises(ValueError, match="expected 1, 2, 4 or 8"):
        ops.rms_norm_with_config(x, w, 1e-6, 1024, 8, 3)
