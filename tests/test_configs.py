"""Every launch config either kernel can be forced into computes the same function.

The sweep (harness.sweep) times configs the default heuristics do not pick; a config that
is fast but wrong must fail here first. Triton candidates run everywhere (the interpreter
on CPU); CUDA configs need a GPU, except the table's own consistency.
"""

import functools

import pytest
import torch

from conftest import (
    DEVICE,
    HAS_GPU,
    cluster_widths,
    fn_or_skip,
    impl_or_skip,
    sharded_to_stress,
)
from harness.reference import TOL, rms_norm_ref

VEC = {torch.float32: 4, torch.bfloat16: 8}


def inputs(m, n, dtype):
    x = torch.randn(m, n, device=DEVICE).to(dtype)
    return x, (1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype)


@pytest.mark.exhaustive
@pytest.mark.parametrize("n", [17, 1000, 4097])
def test_every_triton_candidate_matches_reference(n):
    impl_or_skip("triton")
    from triton_impl import rms_norm_with_config, search_space

    x, w = inputs(5, n, torch.bfloat16)
    want = rms_norm_ref(x, w, 1e-6)
    for cfg in search_space(n, 2):
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
    from triton_impl import Config, rms_norm_with_config

    base = torch.randn(6, n + 5, device=DEVICE).to(dtype)
    x = base[:, 3 : 3 + n]  # 3 elements past the allocation, row stride n + 5
    w = (1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype)
    body = triton_next_pow2(n)
    cfg = Config("split", body, 2)
    got = rms_norm_with_config(x, w, 1e-6, cfg)
    torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("n", [4096, 12289])
@pytest.mark.parametrize("stages, stream_y", [(1, False), (2, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weighted", [True, False], ids=["w", "no_w"])
def test_sharded_kernel(n, stages, stream_y, dtype, weighted):
    """The sharded kernel: a row's shards summed by one program each, the last to arrive
    normalising the row (a partial last shard at 12289, one shard narrower than 32 lanes a
    thread); the same function, with and without a weight."""
    impl_or_skip("triton")
    from triton_impl import Config, rms_norm_with_config

    x, w = inputs(5, n, dtype)
    w = w if weighted else None
    cfg = Config("sharded", 1024, 4, stages=stages, stream_y=stream_y)
    got = rms_norm_with_config(x, w, 1e-6, cfg)
    torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("reload", [False, True], ids=["held", "reload"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sharded_kernel_waiting_schedule(dtype, reload):
    """The waiting schedule's arithmetic, which the interpreter cannot run as scheduled (its
    programs run one after another): a last-arrival launch leaves the row's partial sums
    and full counts in its workspace, so a waiting launch over that workspace finds every
    row complete at once, and normalises each shard as the GPU's waiting programs do, from
    the shard it holds or (reload) read again."""
    impl_or_skip("triton")
    import dataclasses

    from triton_impl import Config
    from triton_impl.launch import launch, plan

    x, w = inputs(5, 12289, dtype)
    cfg = Config("sharded", 2048, 4, stream_y=True)
    p = plan("rms_norm", (x,), w, 1e-6, (torch.full_like(x, float("nan")),), cfg)
    launch(p)
    y = torch.full_like(x, float("nan"))
    meta = {**p.meta, "WAIT": True, "RELOAD": reload}
    waiting = dataclasses.replace(p, args=(x, w, y, *p.args[3:]), meta=meta)
    launch(waiting)
    torch.testing.assert_close(y, rms_norm_ref(x, w, 1e-6), **TOL[dtype])
    assert torch.equal(y, p.args[2])


@pytest.mark.parametrize("n", [4096, 8192, 1000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_kernel_weight_first(n, dtype):
    """The latency rule's fused kernel, its weight loaded before the reduction: the same
    function as the shipped order, with and without a weight; the latency rule picks it."""
    impl_or_skip("triton")
    from triton_impl import Config, rms_norm_with_config

    x, w = inputs(3, n, dtype)
    cfg = Config("fused", triton_next_pow2(n), 4, weight_first=True)
    for weight in (w, None):
        got = rms_norm_with_config(x, weight, 1e-6, cfg)
        torch.testing.assert_close(got, rms_norm_ref(x, weight, 1e-6), **TOL[dtype])


def test_latency_rule_weight_first_where_measured():
    """The latency rule, read from the tuning data: one row a program; the weight loaded
    first only by the fused kernel's rows up to LATENCY_FIRST_MAX_BYTES, on at most
    LATENCY_FIRST_MAX_WARPS warps; wider rows and the split kernel keep LATENCY_THREAD_BYTES
    a thread, up to LATENCY_MAX_WARPS, the weight after the sum; the looped kernel's rows
    wider than LATENCY_FIRST_MAX_BYTES keep its throughput config."""
    from triton_impl import tuning
    from triton_impl.configs import default_config

    def rule(n, elem, split_ok=True):  # a decode-sized call: 8 rows on 132 SMs
        return default_config(n, elem, split_ok=split_ok, rows=8, sms=132)

    def thread_warps(c, elem):  # the warps LATENCY_THREAD_BYTES a thread spreads the row on
        return min(tuning.LATENCY_MAX_WARPS, c.block_n * elem // (32 * tuning.LATENCY_THREAD_BYTES))

    for n, elem, split_ok in ((1000, 2, False), (4096, 2, False), (8191, 2, True),
                              (8192, 2, False), (16384, 2, True), (4096, 4, False),
                              (8192, 4, True), (32768, 4, True)):  # fmt: skip
        c = rule(n, elem, split_ok)
        if c.kernel == "looped":
            assert n * elem > tuning.LATENCY_FIRST_MAX_BYTES, (n, elem, c)
            assert c == default_config(n, elem, split_ok=split_ok), (n, elem, c)
            continue
        assert c.block_m == 1, (n, elem, c)
        first = c.kernel == "fused" and c.block_n * elem <= tuning.LATENCY_FIRST_MAX_BYTES
        assert c.weight_first == first, (n, elem, c)
        if first:
            assert 1 <= c.num_warps <= tuning.LATENCY_FIRST_MAX_WARPS, (n, elem, c)
        else:
            assert c.num_warps == thread_warps(c, elem), (n, elem, c)
    assert rule(8191, 2).kernel == "split" and rule(4096, 2, split_ok=False).weight_first


def test_fused_add_latency_rule():
    """The fused add's decode-sized calls take one row a program of its fused kernel, on
    FUSED_ADD_LATENCY_WARPS where the tuning data names the width, else
    FUSED_ADD_LATENCY_THREAD_BYTES of x a thread; many rows, the split kernel and the sharded
    one keep the throughput rule's configs."""
    from triton_impl import tuning
    from triton_impl.configs import Width, fused_add_config, fused_add_default_config

    def rule(n, elem, rows=8, split_ok=True):
        return fused_add_default_config(n, elem, split_ok, rows=rows, sms=132)

    for key, warps in tuning.FUSED_ADD_LATENCY_WARPS.items():
        c = rule(key.block_n, key.element_size)
        assert (c.kernel, c.block_m, c.num_warps) == ("fused", 1, warps), (key, c)
    for n, elem in ((4096, 4), (1024, 2)):
        assert Width(elem, n) not in tuning.FUSED_ADD_LATENCY_WARPS
        c = rule(n, elem)
        bytes_a_thread = n * elem // (32 * c.num_warps)
        assert (c.kernel, c.block_m) == ("fused", 1), (n, elem, c)
        assert bytes_a_thread == tuning.FUSED_ADD_LATENCY_THREAD_BYTES or c.num_warps == 32
    for n, elem, rows in ((4096, 2, 4096), (4095, 2, 8), (65536, 2, 8)):
        assert rule(n, elem, rows) == fused_add_config(n, elem), (n, elem, rows)
    assert fused_add_default_config(4096, 2) == fused_add_config(4096, 2)  # no GPU at hand


def test_sharded_kernel_shard_cap():
    """A forced shard so narrow that a row takes more than MAX_SHARDS programs is refused."""
    impl_or_skip("triton")
    from triton_impl import Config, rms_norm_with_config

    x, w = inputs(2, 4096, torch.float32)
    with pytest.raises(ValueError, match="splits a row of N = 4096 into 2048 shards"):
        rms_norm_with_config(x, w, 1e-6, Config("sharded", 2, 1))


def test_sharded_kernel_waits_only_where_a_row_fits_the_gpu():
    """A row of more shards than the GPU has SMs might not be resident at once: it takes the
    schedule that never waits."""
    from triton_impl.launch import wait_if_resident

    assert wait_if_resident({"WAIT": True, "SHARDS": 64}, sms=132)["WAIT"]
    assert not wait_if_resident({"WAIT": True, "SHARDS": 64}, sms=16)["WAIT"]
    assert not wait_if_resident({"WAIT": False, "SHARDS": 2}, sms=132)["WAIT"]
    assert not wait_if_resident({"WAIT": True, "RELOAD": True, "SHARDS": 64}, sms=16)["RELOAD"]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2048, 65536), (600, 131071), (257, 262144)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_sharded_kernel_many_rows_many_times(shape, dtype):
    """The sharded kernel's waiting candidates, a last-arrival one and the default config on
    many wide rows, ten times each, the partial sums poisoned with NaN before each launch
    (the allocator would hand back the last run's, right ones): a program that read a
    partial sum before its writer had arrived shows as a wrong row in some run; the
    shard-ordered sum gives the same bits every run."""
    impl_or_skip("triton")
    from triton_impl.configs import default_config
    from triton_impl.launch import launch, plan

    x, w = inputs(*shape, dtype)
    want = rms_norm_ref(x, w, 1e-6)
    cfgs = sharded_to_stress(shape[1], x.element_size())
    cfgs.append(default_config(shape[1], x.element_size()))
    first = {}
    for cfg in cfgs:
        for _ in range(10):
            y = torch.full_like(x, float("nan"))
            p = plan("rms_norm", (x,), w, 1e-6, (y,), cfg)
            if cfg.kernel == "sharded":
                p.args[3].fill_(float("nan"))  # the partial sums
            launch(p)
            if cfg not in first:
                first[cfg] = y
                torch.testing.assert_close(y, want, **TOL[dtype], msg=lambda m, c=cfg: f"{c}: {m}")
            assert torch.equal(y, first[cfg]), cfg


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_cuda_config_table():
    """The default plan holds the row, grows with N, and uses a cluster only past the
    widest single-CTA config; a default build compiles only the configs it picks."""
    fn_or_skip("cuda")
    import cuda_impl.configs as C

    table = C.compiled_configs()
    shipped = [c for c in table if c.shipped]
    assert shipped and len(shipped) == len(set(shipped))
    assert C.sweep_build() == (len(shipped) < len(table))
    assert any(c.cluster and c.row_threads == 1024 and c.vpt == 8 for c in table)
    # kernel variants: each bit the library names taken by some shipped config (no dead bit)
    for name, bit in C.variant_bits().items():
        assert any(c.variant & bit and c.shipped for c in table), name
    picked = set()
    for elem in (2, 4):
        caps = []
        for n in (1, 8, 64, 128, 1000, 4096, 4097, 8192, 32768, 65536, 131072, 262144):
            c = C.default_config(n, elem)
            assert c.holds(n, elem), (n, elem, c)
            caps.append(c.row_threads * c.vpt * c.cluster)
            picked.add((c.row_threads, c.vpt, c.cluster > 1, c.variant))
        assert caps == sorted(caps), (elem, caps)
        vec = 16 // elem
        # one CTA holds 8192 vectors; rows of whole vectors from 32768 elements take
        # whole-vector clusters (but 16-bit 32768, read twice by one CTA), other rows one
        # CTA until it cannot hold them
        assert C.default_config(8192 * vec - 1, elem).cluster == 1
        assert C.default_config(2 * 8192 * vec, elem).cluster >= 2
        assert not C.default_config(32768 - vec, elem).variant & C.variant_bits()["whole_vectors"]
        for n in (32768, 32768 + vec, 32768 * vec)[elem == 2 :]:
            c = C.default_config(n, elem)
            assert c.variant & C.variant_bits()["whole_vectors"] and c.cluster >= 2, (n, elem, c)
    # what the throughput ladders pick is shipped
    assert picked <= {(c.row_threads, c.vpt, c.cluster, c.variant) for c in shipped}
    # many rows of whole vectors past 512 of them, to 16-bit 32768 and fp32 24576: row chunks
    # read twice; 16-bit 4096 row chunks held; nothing else row chunks
    bits = C.variant_bits()
    for n, elem, want in ((5120, 2, "reread"), (8192, 2, "reread"), (12288, 2, "reread"),
                          (16384, 2, "reread"), (32768, 2, "reread"), (4096, 4, "reread"),
                          (24576, 4, "reread"), (4096, 2, "held"), (4097, 2, None),
                          (2048, 2, None), (32776, 2, None), (2048, 4, None), (5121, 4, None),
                          (24580, 4, None), (32768, 4, None)):  # fmt: skip
        v = C.default_config(n, elem).variant
        got = "reread" if v & bits["reread"] else "held" if v & bits["row_chunks"] else None
        assert got == want, (n, elem, got)
    # the late weight: 16-bit rows off the 16-byte grid of 257-512 whole vectors, nothing else
    for n, elem, want in ((4095, 2, True), (4097, 2, True), (2057, 2, True), (4103, 2, True),
                          (2049, 2, False), (4111, 2, False), (3072, 2, False),
                          (4097, 4, False)):  # fmt: skip
        got = bool(C.default_config(n, elem).variant & C.variant_bits()["late_weight"])
        assert got == want, (n, elem)


def test_cuda_sweep_only_configs():
    """A sweep build (RMSNORM_SWEEP_CONFIGS=1) adds candidates on no ladder, each compiled
    once beside the shipped ones."""
    fn_or_skip("cuda")
    import cuda_impl.configs as C

    if not C.sweep_build():
        pytest.skip("sweep-only configs not built (build with RMSNORM_SWEEP_CONFIGS=1)")
    for op in C.OPS:
        table = C.compiled_configs(op)
        extra = [c for c in table if not c.shipped]
        assert extra and len(set(table)) == len(table), op
        assert table[: len(table) - len(extra)] == [c for c in table if c.shipped], op


def cuda_cases():
    """(config, N) pairs: each compiled config at its full capacity and at an odd N below."""
    try:
        from cuda_impl import Config, compiled_configs
        from cuda_impl.configs import variant_bits
    except ImportError:
        return []
    out = []
    for c in compiled_configs():
        cfg = Config(c.row_threads, c.vpt, 2 if c.cluster else 1, c.variant)
        for dtype in VEC:
            cap = c.row_threads * c.vpt * cfg.cluster * VEC[dtype]
            more = (2 * cap + 5 * VEC[dtype],) if c.variant & variant_bits()["row_chunks"] else ()
            for n in (cap, cap - 3, *more):  # row chunks: a partial third chunk too
                tag = f"{c.row_threads}x{c.vpt}c{cfg.cluster}var{c.variant}"
                out.append(pytest.param(cfg, n, dtype, id=f"{tag}-n{n}-{dtype}"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("cfg, n, dtype", cuda_cases())
def test_every_cuda_config_matches_reference(cfg, n, dtype):
    impl_or_skip("cuda")
    from cuda_impl import rms_norm_with_config

    x, w = inputs(7, n, dtype)
    got = rms_norm_with_config(x, w, 1e-6, cfg)
    torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), **TOL[dtype])


#: how a case's rows lie: an fp32 weight beside x, no weight, every row one element off
#: x's 16-byte alignment, rows of a padded (aligned) stride, and rows of an odd stride (in
#: one launch, every vec-th row aligned and the others not)
ROW_LAYOUTS = ("fp32-weight", "no-weight", "offset", "strided", "odd-stride")


def layout_rows(layout: str, n: int, dtype: torch.dtype, vec: int):
    """x (5 rows; 2 * vec + 1 for odd-stride) and the weight of one ROW_LAYOUTS case."""
    rows = 2 * vec + 1 if layout == "odd-stride" else 5
    pad = {"offset": 1, "strided": 3 * vec, "odd-stride": 1}.get(layout, 0)
    x = torch.randn(rows, n + pad, device=DEVICE).to(dtype)
    x = x[:, 1 : n + 1] if layout == "offset" else x[:, :n]
    w = 1 + 0.5 * torch.randn(n, device=DEVICE)
    w = None if layout == "no-weight" else w if layout == "fp32-weight" else w.to(dtype)
    return x, w


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ROW_LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("bit", ["row_chunks", "whole_vectors"])
def test_cuda_whole_vector_bodies_any_row(bit, layout, dtype):
    """Every config of the bodies for rows of whole vectors (row chunks, whole-vector
    clusters), over their vector path and the one rows off x's 16-byte alignment take:
    row chunks at one chunk and at three, the last partial; clusters of 2 and of their most
    CTAs (8, staged 16) at their full width (at most MAX_N), at one whose slices are uneven
    (the last shortest) and, on the most CTAs, at 9 vectors (CTAs with an empty slice)."""
    impl_or_skip("cuda")
    from cuda_impl import Config, compiled_configs, rms_norm_with_config
    from cuda_impl import configs as C

    vec = 16 // torch.empty(0, dtype=dtype).element_size()
    mask = (
        C.variant_bits()["row_chunks"] if bit == "row_chunks" else C.variant_bits()["whole_vectors"]
    )
    picked = [c for c in compiled_configs() if c.variant & mask]
    assert picked
    for c in picked:
        most = C.max_cluster(c.variant)
        for ranks in (2, most) if c.cluster else (1,):
            cfg = Config(c.row_threads, c.vpt, ranks, c.variant)
            if c.cluster:
                widths = cluster_widths(c.row_threads, c.vpt, ranks, most, vec)
            else:
                cap = c.row_threads * c.vpt * vec
                widths = [cap, 2 * cap + 5 * vec]
            for n in widths:
                x, w = layout_rows(layout, n, dtype, vec)
                got = rms_norm_with_config(x, w, 1e-6, cfg)
                torch.testing.assert_close(
                    got, rms_norm_ref(x, w, 1e-6), **TOL[dtype], msg=f"{cfg} N={n}"
                )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_cuda_staged_default_widths(dtype):
    """The default plan's staged clusters at widths whose slices are uneven (one vector past
    a power of two) or fill fewer CTAs than the cluster's (40960, 98304); beside them a
    misaligned weight and a misaligned output (the plan takes the general clusters)."""
    impl_or_skip("cuda")
    from cuda_impl import configs as C
    from cuda_impl import rms_norm

    elem = torch.empty(0, dtype=dtype).element_size()
    vec = 16 // elem
    for n in (32768 + vec, 40960, 98304, 131072 - vec):
        assert C.default_config(n, elem).variant & C.variant_bits()["staged_row"], n
        x = torch.randn(3, n, device=DEVICE).to(dtype)
        w = (1 + 0.5 * torch.randn(n + 1, device=DEVICE)).to(dtype)
        ref = rms_norm_ref(x, w[:n], 1e-6)
        torch.testing.assert_close(rms_norm(x, w[:n], 1e-6), ref, **TOL[dtype], msg=f"N={n}")
        torch.testing.assert_close(
            rms_norm(x, w[1:], 1e-6), rms_norm_ref(x, w[1:], 1e-6), **TOL[dtype]
        )
        out = torch.full((3 * n + 1,), float("nan"), device=DEVICE, dtype=dtype)[1:].view(3, n)
        rms_norm(x, w[:n], 1e-6, out=out)
        torch.testing.assert_close(out, ref, **TOL[dtype], msg=f"N={n}, offset out")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cuda_staged_rows_in_a_graph(dtype):
    """Staged clusters past the 48 KB of shared memory a kernel has without asking (the
    launch asks for it) captured in a CUDA graph, first call inside the capture, and
    replayed on new data into a poisoned output."""
    impl_or_skip("cuda")
    from cuda_impl import configs as C
    from cuda_impl import rms_norm

    elem = torch.empty(0, dtype=dtype).element_size()
    for n in (131072, 262144):
        cfg = C.default_config(n, elem)
        x, w = inputs(4, n, dtype)
        out = torch.empty_like(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            rms_norm(x, w, 1e-6, out=out)
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6), **TOL[dtype], msg=f"{cfg}")


@pytest.mark.gpu
def test_forced_cuda_config_errors():
    impl_or_skip("cuda")
    from cuda_impl import Config, rms_norm_with_config
    from cuda_impl import configs as C
    from cuda_impl.configs import variant_bits

    x, w = inputs(4, 4096, torch.bfloat16)
    with pytest.raises(ValueError, match="no compiled config"):
        rms_norm_with_config(x, w, 1e-6, Config(96, 3))
    with pytest.raises(ValueError, match="variant 2"):  # 8 x 1 has no lean-register variant
        rms_norm_with_config(x, w, 1e-6, Config(8, 1, 1, variant_bits()["lean_regs"]))
    with pytest.raises(ValueError, match="no compiled config"):  # not wrapped into int range
        rms_norm_with_config(x, w, 1e-6, Config(2**32 + 8, 1, 1, variant_bits()["plain_loads"]))
    with pytest.raises(ValueError, match="elements a row; N is 4096"):
        rms_norm_with_config(x, w, 1e-6, Config(8, 1, 1, variant_bits()["plain_loads"]))
    with pytest.raises(ValueError, match=r"expected 1, 2, 4 or 8(?! or 16)"):
        rms_norm_with_config(x, w, 1e-6, Config(1024, 8, 3))
    # 16: staged rows only
    with pytest.raises(ValueError, match=r"expected 1, 2, 4 or 8(?! or 16)"):
        rms_norm_with_config(x, w, 1e-6, Config(1024, 8, 16))
    staged = Config(
        256, 8, 32, C.variant_bits()["staged_row"] | C.variant_bits()["whole_vectors"] | 3
    )
    with pytest.raises(ValueError, match="expected 1, 2, 4 or 8 or 16"):
        rms_norm_with_config(x, w, 1e-6, staged)
    with pytest.raises(ValueError, match="cfg must be a cuda_impl.configs.Config"):
        rms_norm_with_config(x, w, 1e-6, (128, 4, 1, 1))


# ---- kernel_info reports what runs -----------------------------------------------------

GRID_NS = (128, 512, 1000, 1024, 2048, 4095, 4096, 4097, 5120, 8192, 12288, 16384, 32768,
           65536, 131072, 262144)  # fmt: skip


def launched(fn) -> list[dict]:
    """The CUDA kernels one call of fn launches, from the profiler's trace: name, grid and
    block as the driver saw them."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("rows", ["grid", "decode"])
def test_kernel_info_is_what_runs(name, dtype, rows):
    """For every grid width (M = 2^27 / N, and 8 rows: the latency rule), the kernel
    kernel_info names is the one the profiler sees launched, with its grid and block (the
    sharded kernel's launch also zeroes its workspace's arrival counts: one fill before it)."""
    impl = impl_or_skip(name)
    info_fn = impl.resources
    for n in GRID_NS:
        m = 2**27 // n if rows == "grid" else 8
        x = torch.randn(m, n, device=DEVICE).to(dtype)
        w = torch.randn(n, device=DEVICE).to(dtype)
        impl.fn(x, w, 1e-6)  # compile outside the profile
        info = info_fn(x, w)
        ks = launched(functools.partial(impl.fn, x, w, 1e-6))
        cfg = info["config"]
        if cfg.get("kernel") == "sharded":
            fills = [e for e in ks if "fill" in e["name"].lower()]
            assert len(fills) == 1 and len(ks) == 2, (n, [e["name"] for e in ks])
            ks = [e for e in ks if e is not fills[0]]
        (k,) = ks
        if name == "triton":
            assert k["name"] == info["name"], (n, k["name"], info)
            assert k["args"]["grid"][0] == info["grid"][0], (n, k["args"], info)
            assert k["args"]["block"][0] == 32 * cfg["num_warps"], (n, k["args"], cfg)
        else:
            want = f"{cfg['row_threads']}, {cfg['vpt']}, {str(cfg['cluster'] > 1).lower()}"
            assert f"{want}, {cfg['variant']}>" in k["name"], (n, k["name"], cfg)
            assert k["args"]["block"][0] == max(128, cfg["row_threads"]), (n, k["args"], cfg)


def test_triton_kernel_info_config_is_the_rule():
    """kernel_info reports the config launch.plan decided, which is default_config's for the
    rows and SMs at hand (the latency rule for few rows), never a table lookup apart."""
    impl_or_skip("triton")
    from triton_impl import default_config
    from triton_impl.launch import plan

    for n, m in ((4096, 64), (4097, 3), (65536, 2), (12288, 300)):
        x = torch.randn(m, n, device=DEVICE)
        y = torch.empty_like(x)
        p = plan("rms_norm", (x,), None, 1e-6, (y,))
        sms = torch.cuda.get_device_properties(0).multi_processor_count if HAS_GPU else None
        assert p.cfg == default_config(n, 4, rows=m if HAS_GPU else None, sms=sms)


def triton_table_shapes() -> list:
    """(n, dtype) of every entry of the Triton tables, both ops': its tile's width, or three
    quarters of it where the entry is for rows narrower than the tile (padded), in the
    entry's dtype or every dtype of its element size; the sharded kernels' at MAX_N, wider
    than any table names."""
    from rmsnorm_api import DTYPE_NAMES, MAX_N
    from triton_impl import tuning as T

    dtypes = {2: (torch.bfloat16, torch.float16), 4: (torch.float32,)}
    keys = [
        *T.FUSED_TUNED,
        *T.LOOPED_TUNED,
        *T.FUSED_ADD_TUNED,
        *T.FUSED_ADD_WIDE_TUNED,
        *T.FUSED_ADD_LATENCY_WARPS,
    ]
    shapes = {
        (k.block_n * 3 // 4 if k.padded else k.block_n, d)
        for k in keys
        for d in dtypes[k.element_size]
        if k.dtype in (None, DTYPE_NAMES[d])
    }
    shapes |= {(MAX_N, d) for ds in dtypes.values() for d in ds}
    # the looped rule's bounds
    shapes |= {(b // e, d) for e, ds in dtypes.items() for d in ds for b in T.LOOPED_ROW_BYTES}
    return sorted(shapes, key=lambda s: (s[0], str(s[1])))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ["many", "few"])
def test_every_triton_table_entry_runs(rows):
    """Each shipped Triton config, at a width its table entry serves, for many rows (the
    throughput rule) and few (the latency rule): both ops match the reference, and the
    launch is the config the rule picks for those rows and SMs."""
    impl_or_skip("triton")
    from harness.reference import fused_add_rms_norm_ref
    from triton_impl import default_config, fused_add_rms_norm, rms_norm
    from triton_impl.launch import plan

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, dtype in triton_table_shapes():
        m = max(4, 2**24 // n) if rows == "many" else 4
        x = torch.randn(m, n, device=DEVICE).to(dtype)
        w = (1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype)
        r = torch.randn(m, n, device=DEVICE).to(dtype)
        elem = x.element_size()
        assert plan("rms_norm", (x,), w, 1e-6, (torch.empty_like(x),)).cfg == default_config(
            n, elem, rows=m, sms=sms
        ), (n, dtype)
        torch.testing.assert_close(
            rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **TOL[dtype], msg=f"{n} {dtype}"
        )
        y, ro = fused_add_rms_norm(x, r, w, 1e-6)
        want_y, want_ro = fused_add_rms_norm_ref(x, r, w, 1e-6)
        torch.testing.assert_close(ro, want_ro, **TOL[dtype], msg=f"fused {n} {dtype}")
        torch.testing.assert_close(y, want_y, **TOL[dtype], msg=f"fused {n} {dtype}")
