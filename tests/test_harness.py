"""The benchmark harness's logic on CPU: the op descriptions (input factory, bytes model,
both ops' registries and calling conventions), statistics, record schema (the op field,
sweep records), analysis, plots and report from a small SYNTHETIC records file of one op
or both (written to a tmp dir, never under results/), two such runs as two GPUs' side by
side (python -m harness.gpus, its argument errors included), bench's argument defaults
(its argument errors are test_cli's), the run's schedule and budget across ops, and the
no-GPU path of ``python -m harness.bench``.
"""

import json
import math
import sys
import types

import pytest
import torch

from conftest import DEVICE, HAS_GPU, hide_packages
from harness import analysis, bench, hardware, measure, plan, plot, records, timing
from harness.cases import Case
from harness.impls import (
    BASELINES,
    OURS,
    Impl,
    fused_add_registry,
    registry,
    runnable,
)
from harness.ops import (
    FORWARD_OPS,
    FUSED_ADD_RMS_NORM,
    GRAD_OPS,
    OPS,
    QUANT_OPS,
    RMS_NORM,
    VARIANT_OPS,
    rms_norm_bytes,
)
from harness.reference import TOL, fused_add_rms_norm_ref, rms_norm_ref
from harness.validate import check

# ---------------------------------------------------------------------------------------
# a synthetic run: made-up numbers, marked as such in env, plots and report
# ---------------------------------------------------------------------------------------

ENV = {
    "synthetic": True,
    "gpu": "SYNTHETIC GPU",
    "torch": torch.__version__,
    "triton": "x",
    "cuda": "x",
    "git_sha": "0" * 40,
    "git_dirty": False,
    "peak_gbps": 4814.0,
    "copy_gbps": 4270.0,
}
# made-up median microseconds for a 1 GiB-ish shape, per implementation
SPEED = {"triton": 1.0, "cuda": 0.95, "eager": 4.0, "compile": 1.1, "native": 1.6, "liger": 1.3}
# the fused add's, other numbers, so a table that mixed the two ops would show it
FUSED_SPEED = {
    "triton": 1.0,
    "cuda": 1.02,
    "eager": 6.0,
    "compile": 1.25,
    "native": 2.5,
    "liger": 1.5,
    "quack": 1.1,
}


def _op_bytes(op, dtype, m, n):
    """The op's bytes model at a shape, every tensor in dtype."""
    size = records.DTYPE_BYTES[dtype]
    if op is RMS_NORM:
        return rms_norm_bytes(m, n, size, size)
    return 2 * m * n * 2 * size + n * size  # x, residual read; y, residual_out written


def _timing(impl, dtype, m, n, us, sections, mode="cold", op=RMS_NORM):
    nbytes = _op_bytes(op, dtype, m, n)
    samples = [us * f for f in (0.98, 1.0, 1.0, 1.02, 1.05, 0.99)]
    stats = timing.summarize(samples)
    small = nbytes < 50e6
    gb = records.gbps(nbytes, stats["median_us"] * 1e-6)
    pct = None if small or mode != "cold" else 100 * gb / ENV["copy_gbps"]
    return _measured(
        op,
        impl,
        dtype,
        m,
        n,
        sections,
        mode,
        shape_class=plan.shape_class(dtype, n, small),
        small=small,
        bytes=nbytes,
        samples_us=samples,
        stats=stats,
        spread=0.01,
        blocks=[{"median_us": us, "p20_us": us, "p80_us": us, "n": 2}] * 3,
        gbps=None if mode == "host" else gb,
        gbps_lo=records.gbps(nbytes, stats["p80_us"] * 1e-6),
        gbps_hi=records.gbps(nbytes, stats["p20_us"] * 1e-6),
        pct_copy=pct,
        correct={"max_abs": 0.0, "max_rel": 0.0, "passed": True, "error": None},
        kernels={"class": "c", "names": [f"{impl}_kernel"], "count": 1, "path": None},
        compile_s=2.5 if impl == "compile" else None,
    )


def fused_records() -> list[dict]:
    """The fused add's part of a SYNTHETIC run: a bf16 grid, an M sweep, decode shapes, a
    FAIL (liger refusing a wide row) and a SKIP, all with op = fused_add_rms_norm."""
    op = FUSED_ADD_RMS_NORM
    recs = []
    for n in (1024, 4096, 65536):
        m = 2**27 // n
        base_us = _op_bytes(op, "bf16", m, n) / 3.9e12 * 1e6
        sections = ["grid", "msweep"] if n == 4096 else ["grid"]
        recs += [
            _timing(i, "bf16", m, n, base_us * f, sections, op=op) for i, f in FUSED_SPEED.items()
        ]
    for m in (1, 64):
        us = 6.0 + _op_bytes(op, "bf16", m, 4096) / 3.9e12 * 1e6
        recs += [
            _timing(i, "bf16", m, 4096, us * f, ["msweep"], op=op) for i, f in FUSED_SPEED.items()
        ]
    for mode, us in (("graph", 4.0), ("host", 14.0)):
        for impl, f in FUSED_SPEED.items():
            recs.append(_timing(impl, "bf16", 8, 8192, us * f, ["decode"], mode=mode, op=op))
    recs.append(_failed("liger", "ValueError: liger: no", op))
    recs.append(_skipped("cuda", "cuda_impl has no fused_add_rms_norm", op))
    return recs


def _measured(op, impl, dtype, m, n, sections, mode, **fields):
    """A synthetic timing record of op at (dtype, M, N): fields over the shared ones."""
    return records.make_record(
        run_id="synthetic",
        env=ENV,
        kind="timing",
        op=op.name,
        impl=impl,
        dtype=dtype,
        shape=[m, n],
        sections=sections,
        mode=mode,
        **fields,
    )


def _failed(impl, error, op=RMS_NORM):
    """A FAIL record of a bf16 1024 x 131072 grid shape."""
    failed = {"max_abs": None, "max_rel": None, "passed": False, "error": error}
    return _measured(
        op, impl, "bf16", 1024, 131072, ["grid"], "cold", bytes=1, status="FAIL", correct=failed
    )


def _skipped(impl, note, op=RMS_NORM):
    """The SKIP record of an implementation that could not run."""
    return records.make_record(
        run_id="synthetic", env=ENV, kind="skip", op=op.name, impl=impl, status="SKIP", notes=[note]
    )


def synthetic_records(path, fused=False):
    """Write a small SYNTHETIC run to path: copy, grid, M sweep, decode, a FAIL, a SKIP; with
    ``fused``, the fused add's records after rms_norm's (fused_records)."""
    recs = [
        records.make_record(
            run_id="synthetic",
            env=ENV,
            kind="copy",
            impl="copy",
            bytes=2 << 30,
            samples_us=[503.0, 502.0],
            stats=timing.summarize([503.0, 502.0]),
            gbps=4270.0,
        )
    ]
    for dtype in ("bf16", "fp32"):
        for n in (1024, 4096, 131072):
            m = 2**27 // n
            size = records.DTYPE_BYTES[dtype]
            base_us = rms_norm_bytes(m, n, size, size) / 3.9e12 * 1e6  # ~3.9 TB/s
            for impl, f in SPEED.items():
                if impl == "liger" and n > 65536:
                    continue
                # a shape in two sections is measured once, as in the bench
                sections = ["grid", "msweep"] if (dtype, n) == ("bf16", 4096) else ["grid"]
                recs.append(_timing(impl, dtype, m, n, base_us * f, sections))
    for m in (1, 64, 4096):
        us = 5.0 + rms_norm_bytes(m, 4096, 2, 2) / 3.9e12 * 1e6
        for impl, f in SPEED.items():
            recs.append(_timing(impl, "bf16", m, 4096, us * f, ["msweep"]))
    for m in (1, 8):
        for mode, us in (("graph", 3.0), ("host", 12.0)):
            for impl, f in SPEED.items():
                recs.append(_timing(impl, "bf16", m, 8192, us * f, ["decode"], mode=mode))
    recs.append(_failed("liger", "RuntimeError: Cannot launch Triton kernel since n = 131072"))
    recs.append(_skipped("quack", "quack not importable (No module named 'quack')"))
    if fused:
        recs += fused_records()
    with records.RecordWriter(path, append=False) as w:
        for r in recs:
            w.write(r)
    return recs


@pytest.fixture
def synthetic(tmp_path):
    path = tmp_path / "synthetic-records.jsonl"
    synthetic_records(path)
    return path


# ---------------------------------------------------------------------------------------
# the op description: input factory, bytes model, reference, implementations
# ---------------------------------------------------------------------------------------


def test_bytes_model():
    # bf16 x and weight: read x + write y (2 bytes each) + read weight
    assert rms_norm_bytes(4096, 4096, 2, 2) == 2 * 4096 * 4096 * 2 + 4096 * 2
    assert rms_norm_bytes(8, 1000, 4, 4) == 2 * 8 * 1000 * 4 + 1000 * 4
    assert rms_norm_bytes(8, 1000, 2, 4) == 2 * 8 * 1000 * 2 + 1000 * 4  # fp32 weight
    assert rms_norm_bytes(8, 1000, 2, None) == 2 * 8 * 1000 * 2  # no weight
    with pytest.raises(ValueError, match="N >= 1"):
        rms_norm_bytes(8, 0, 2, 2)
    assert records.gbps(10**9, 1.0) == pytest.approx(1.0)
    assert records.gbps(10**9, 0.0) is None


@pytest.mark.parametrize(
    "case, want",
    [
        (Case("c", (8, 1000), torch.bfloat16), rms_norm_bytes(8, 1000, 2, 2)),
        (Case("c", (2, 3, 1000), torch.float16, weight="fp32"), rms_norm_bytes(6, 1000, 2, 4)),
        (Case("c", (7, 1023), torch.float32, weight="none"), rms_norm_bytes(7, 1023, 4)),
        (Case("c", (64, 1000), torch.bfloat16, row_pad=24), rms_norm_bytes(64, 1000, 2, 2)),
    ],
    ids=["bf16", "3d-fp32-weight", "no-weight", "strided"],
)
def test_op_bytes_model_of_its_inputs(case, want):
    """The op's bytes model counts what its inputs are, not how they are laid out."""
    assert RMS_NORM.bytes_moved(RMS_NORM.make_inputs(case, "cpu", 0)) == want


def test_op_description():
    assert FORWARD_OPS == {"rms_norm": RMS_NORM, "fused_add_rms_norm": FUSED_ADD_RMS_NORM}
    # every op a record may name
    assert OPS == {**FORWARD_OPS, **VARIANT_OPS, **GRAD_OPS, **QUANT_OPS}
    assert RMS_NORM.name == "rms_norm"
    assert RMS_NORM.reference is rms_norm_ref  # the one definition, pointed to
    assert RMS_NORM.order == OURS + BASELINES
    assert set(RMS_NORM.registry()) == set(OURS)
    assert list(RMS_NORM.registry(baselines=True)) == list(RMS_NORM.order)


def test_op_inputs_are_fresh_and_random():
    """One factory for cases and planned shapes: seeded, random, never zeros."""
    planned = plan.Planned("bf16", 64, 1000)
    x, w, eps = RMS_NORM.make_inputs(planned, "cpu", 7)
    assert x.shape == (64, 1000) and x.dtype == w.dtype == torch.bfloat16 and w.shape == (1000,)
    assert eps == plan.EPS
    assert x.float().std() > 0.5 and (x != 0).float().mean() > 0.99  # randn, not zeros
    assert (w.float() - 1).abs().mean() > 0.1  # weight ~ 1 + randn/2, not ones
    x2, w2, _ = RMS_NORM.make_inputs(planned, "cpu", 7)
    assert torch.equal(x, x2) and torch.equal(w, w2)  # seeded
    x3, _, _ = RMS_NORM.make_inputs(planned, "cpu", 8)
    assert not torch.equal(x, x3)  # another seed, other values
    # a planned shape is the plain case of that shape: the same inputs
    xc, wc, _ = RMS_NORM.make_inputs(planned.case(), "cpu", 7)
    assert torch.equal(x, xc) and torch.equal(w, wc)
    # a case's layout and fills survive
    strided = Case("s", (16, 1000), torch.float16, row_pad=24, offset=3, weight="none")
    xs, ws, _ = RMS_NORM.make_inputs(strided, "cpu", 0)
    assert xs.stride() == (1024, 1) and xs.storage_offset() == 3 and ws is None
    zero = Case("z", (16, 64), torch.float32, fill="zero_rows")
    xz, _, _ = RMS_NORM.make_inputs(zero, "cpu", 0)
    assert (xz[::3] == 0).all() and (xz[1::3] != 0).any()


# ---------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------


def test_quantiles_and_summary():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert timing.quantile(xs, 0.5) == 3.0
    assert timing.quantile(xs, 0.0) == 1.0 and timing.quantile(xs, 1.0) == 5.0
    assert timing.quantile(xs, 0.2) == pytest.approx(1.8)  # linear, as numpy's default
    assert timing.quantile(list(range(11)), 0.8) == pytest.approx(8.0)
    s = timing.summarize(xs)
    assert (s["median_us"], s["min_us"], s["max_us"], s["n"]) == (3.0, 1.0, 5.0, 5)
    assert s["mean_us"] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        timing.quantile([], 0.5)
    with pytest.raises(ValueError):
        timing.quantile(xs, 1.5)


def test_spread_reps_and_rotation():
    assert timing.spread([100.0, 102.0, 101.0]) == pytest.approx(2 / 101)
    assert timing.spread([7.0]) == 0.0
    assert timing.reps_for(1e-6) == timing.MAX_REPS
    assert timing.reps_for(1.0) == timing.MIN_REPS
    assert timing.reps_for(timing.TARGET_BLOCK_S / 40) == 40
    names = ["a", "b", "c"]
    orders = timing.rotations(names, 3)
    assert all(sorted(o) == names for o in orders)  # every impl once per block
    assert len({o[0] for o in orders}) == 3  # nobody always goes first
    per_block, stats, spr = timing.block_summary([[1e-6, 2e-6], [1e-6, 1e-6], [3e-6, 3e-6]])
    assert [b["n"] for b in per_block] == [2, 2, 2]
    assert stats["n"] == 6 and stats["median_us"] == pytest.approx(1.5)
    assert spr == pytest.approx((3.0 - 1.0) / 1.5)


def test_host_lead_covers_the_batch():
    """The GPU sleeps long enough before a batch for the host to enqueue all of it."""
    reps = timing.MAX_REPS
    seconds = timing.lead_cycles(reps) / timing.SLEEP_CLOCK_HZ
    assert seconds == pytest.approx(reps * timing.HOST_LEAD_S_PER_REP)
    assert timing.HOST_LEAD_S_PER_REP >= 100e-6  # above a Python launcher's cost per call
    # a call whose host time is longer (autograd's forward + backward) gets a longer lead
    slow = timing.lead_cycles(reps, 1e-3) / timing.SLEEP_CLOCK_HZ
    assert slow == pytest.approx(reps * timing.HOST_LEAD_MARGIN * 1e-3)


def test_host_times_interleave_the_implementations(monkeypatch):
    """Host repeats go round the implementations in rotation, so each meets the same host;
    one that raises is reported with its error and the others keep every repeat."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    calls = []

    def fn(name):
        def call():
            calls.append(name)
            if name == "bad":
                raise RuntimeError("launch failed")

        return call

    got = timing.host_interleaved({n: fn(n) for n in ("a", "b", "bad")}, calls=2, repeats=3)
    assert len(got["a"][0]) == len(got["b"][0]) == 3 and got["a"][1] is None
    assert got["bad"] == (None, "RuntimeError: launch failed")
    assert calls[:5] == ["a", "a", "b", "b", "bad"]  # one repeat each, in turn
    assert calls[5:9] == ["b", "b", "a", "a"]  # the next round rotated; "bad" dropped


def test_hardware_pure_helpers():
    assert hardware.peak_gbps(3201, 6016) == pytest.approx(4814.3, abs=0.1)  # 4814 GB/s
    assert hardware.fallback_memory("NVIDIA H200") == (3201, 6016)
    assert hardware.fallback_memory("NVIDIA H100 PCIe") == (1593, 5120)
    assert hardware.fallback_memory("NVIDIA H100 80GB HBM3") == (2619, 5120)
    assert hardware.fallback_memory("Some GPU") is None
    assert hardware.gpu_slug("NVIDIA H200") == "h200"
    assert hardware.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert hardware.decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    env = hardware.environment()
    for key in ("gpu", "sm_count", "l2_bytes", "driver", "torch", "triton", "cuda", "git_sha"):
        assert key in env


# ---------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------


def test_record_round_trip(tmp_path):
    path = tmp_path / "r.jsonl"
    written = synthetic_records(path)
    back = records.read_records(path)
    assert back == json.loads(json.dumps(written))
    assert all(r["env"]["synthetic"] for r in back)
    assert all(r["schema"] == records.SCHEMA_VERSION for r in back)


def test_committed_evidence_reads_compressed(tmp_path):
    """A records file kept compressed (*.xz: the committed records, sweeps and probes) reads
    as the file it was, and an append to it starts from its records; every committed one is
    JSON lines (the older probes' own, not all of them records)."""
    import lzma
    import pathlib

    path = tmp_path / "r.jsonl"
    written = synthetic_records(path)
    packed = tmp_path / "r.jsonl.xz"
    packed.write_bytes(lzma.compress(path.read_bytes()))
    assert records.read_records(packed) == records.read_records(path)
    assert records.read_records(packed) == json.loads(json.dumps(written))
    # an append to a committed (xz'd) run starts from its records
    (tmp_path / "r.jsonl").rename(tmp_path / "plain.jsonl")
    with records.RecordWriter(path, append=True) as w:
        w.write(written[0])
    assert records.read_records(path) == json.loads(json.dumps([*written, written[0]]))
    results = pathlib.Path(__file__).resolve().parent.parent / "results"
    committed = sorted(results.rglob("*.jsonl.xz"))
    assert committed, "no compressed records, sweeps or probes under results/"
    for f in committed:
        lines = lzma.decompress(f.read_bytes()).decode().splitlines()
        assert lines and all(json.loads(line) is not None for line in lines if line), f


def test_record_nan_becomes_null_and_bad_records_are_named(tmp_path):
    r = records.make_record(
        run_id="t", env={}, kind="skip", impl="x", status="SKIP", gbps=float("nan")
    )
    assert r["gbps"] is None
    for breakage, match in [
        (lambda d: d.pop("impl"), "missing field 'impl'"),
        (lambda d: d.update(kind="bogus"), "kind"),
        (lambda d: d.update(samples_us="1,2"), "samples_us"),
        (lambda d: d.update(schema=99), "schema"),
        (lambda d: d.update(shape=[1, 2, 3]), "shape"),
    ]:
        bad = dict(r)
        breakage(bad)
        with pytest.raises(records.RecordError, match=match):
            records.validate_record(bad)
    with pytest.raises(records.RecordError, match="stats"):
        records.make_record(run_id="t", env={}, kind="copy", impl="copy")  # PASS without stats
    with pytest.raises(records.RecordError, match="unknown fields"):
        records.make_record(run_id="t", env={}, kind="skip", impl="x", colour="red")
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(r) + "\n{not json\n")
    with pytest.raises(records.RecordError, match=r"bad.jsonl:2"):
        records.read_records(path)


def test_records_carry_the_op_and_old_ones_read_as_rms_norm(tmp_path):
    new = _timing("triton", "bf16", 8, 4096, 10.0, ["grid"])
    assert new["op"] == "rms_norm" and new["config"] is None
    old = {k: v for k, v in new.items() if k not in ("op", "config")}  # before the field
    with pytest.raises(records.RecordError, match="missing field 'op'"):
        records.validate_record(old)
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (back,) = records.read_records(path)
    assert back["op"] == "rms_norm" and back == new
    for bad in ("", "Fused Add", 5):
        with pytest.raises(records.RecordError, match="op"):
            records.validate_record({**new, "op": bad})
    other = records.make_record(run_id="t", env={}, kind="skip", impl="x", op="fused_add_rms_norm")
    assert other["op"] == "fused_add_rms_norm"


def test_records_of_another_op_stay_out_of_rms_norms_pages(synthetic, tmp_path):
    """Report and plots group by op: another op's records never reach rms_norm's tables."""
    plot.redraw(synthetic, tmp_path / "one")
    recs = records.read_records(synthetic)
    alien = {**_timing("triton", "bf16", 8192, 4096, 0.001, ["grid"]), "op": "other_op"}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in recs + [alien]))
    plot.redraw(mixed, tmp_path / "two")
    one, two = ((tmp_path / d / "report.md").read_text() for d in ("one", "two"))
    assert one == two
    groups = analysis.by_op(records.latest(records.read_records(mixed)))
    assert list(groups) == [RMS_NORM] and all(r["op"] == "rms_norm" for r in groups[RMS_NORM])


def _sweep_record(cfg, default, us=10.0, status="PASS"):
    """A synthetic sweep record: a cold timing of one forced config, in the bench's schema."""
    rec = _timing("triton", "bf16", 2**15, 4096, us, ["grid"])
    rec.update(kind="sweep", config={"params": cfg, "default": default}, status=status)
    return rec


def test_sweep_records_follow_the_schema(tmp_path):
    a = _sweep_record({"kernel": "fused", "block_n": 4096, "num_warps": 8}, True, 12.0)
    b = _sweep_record({"kernel": "fused", "block_n": 4096, "num_warps": 16}, False, 10.0)
    for rec in (a, b):
        records.validate_record(rec)
    with pytest.raises(records.RecordError, match="config"):
        records.validate_record({**a, "config": None})
    with pytest.raises(records.RecordError, match="stats"):
        records.validate_record({**a, "stats": None})
    with pytest.raises(records.RecordError, match="correct"):
        records.validate_record({**a, "status": "FAIL", "correct": None})
    path = tmp_path / "sweep.jsonl"
    with records.RecordWriter(path, append=False) as w:
        for rec in (a, b, a):
            w.write(rec)
    assert len(records.latest(records.read_records(path))) == 2  # one per config


def test_sweep_writes_validated_records(tmp_path, monkeypatch, capsys):
    """harness.sweep's own path on CPU (Triton interpreter, timing faked): inputs from the
    op's factory, one sweep record per candidate through harness.records, a FAIL record for
    a config that fails the check, GB/s by records.gbps of the op's bytes."""
    from harness import sweep
    from triton_impl import Config

    n = 1000
    good = sweep.candidates("triton", n, 2)[:2]
    monkeypatch.setattr(
        sweep, "candidates", lambda k, n, e, op="rms_norm": good + [Config("fused", 512, 4)]
    )
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    fake = [[20e-6, 21e-6], [20e-6, 22e-6], [19e-6, 20e-6]]
    monkeypatch.setattr(measure, "time_blocks", lambda b, fns: ({k: fake for k in fns}, None))
    monkeypatch.setattr(timing, "warm_up", lambda fns, *a: None)
    path = tmp_path / "sweep.jsonl"
    b = measure.Bench(
        run_id="synthetic",
        env=ENV,
        writer=records.RecordWriter(path, append=False),
        flush=None,
        small_bytes=0,
        seed=0,
        device=DEVICE,
    )
    written = sweep.sweep_shape(b, "triton", plan.Planned("bf16", 8, n, ["custom"]))
    b.writer.close()
    back = records.read_records(path)  # validated line by line
    assert back == json.loads(json.dumps(written)) and len(back) == 3
    assert {r["kind"] for r in back} == {"sweep"} and {r["op"] for r in back} == {"rms_norm"}
    # a failing config is written when it fails, the timed ones after the timing
    (failed,), passed = back[:1], back[1:]
    assert failed["status"] == "FAIL" and "narrower than the row" in failed["correct"]["error"]
    nbytes = rms_norm_bytes(8, n, 2, 2)
    for r, cfg in zip(passed, good, strict=True):
        assert r["status"] == "PASS" and r["correct"]["passed"]
        assert r["config"]["params"] == cfg.as_dict() and r["bytes"] == nbytes
        assert r["gbps"] == pytest.approx(records.gbps(nbytes, r["stats"]["median_us"] * 1e-6))
        assert r["pct_copy"] == pytest.approx(100 * r["gbps"] / ENV["copy_gbps"])
    default = sweep.default_config("triton", n, "bf16")
    assert [r["config"]["default"] for r in passed] == [c == default for c in good]
    sweep.summarize(back)
    assert "triton  bf16" in capsys.readouterr().out


def test_sweep_where_keeps_the_matching_candidates_and_today_s():
    """--where: of a kernel's candidates those matching any one alternative (every field of
    it), and today's config, which the sweep always times beside them."""
    from harness import sweep

    where = sweep.parse_where(["triton:reload=True", "triton:kernel=looped,num_warps=16"])
    assert where == {"triton": [{"reload": "True"}, {"kernel": "looped", "num_warps": "16"}]}
    n = 32768  # today's config: looped on 32 warps, no reload
    cands = sweep.candidates("triton", n, 2)
    kept = [c for c in cands if sweep.matches(c, where["triton"])]

    def wanted(c):
        return c.reload or (c.kernel == "looped" and c.num_warps == 16)

    assert kept and all(wanted(c) for c in kept) and any(not c.reload for c in kept)
    assert len(kept) == sum(wanted(c) for c in cands)
    assert not sweep.matches(sweep.default_config("triton", n, "bf16"), where["triton"])


def test_sweep_takes_its_grid_from_plan():
    """plan.py is the one grid: the sweep's default shapes are the bench's grid shapes, and
    neither the sweep nor scripts/ncu_one.py imports its shapes from harness.bench."""
    from pathlib import Path

    from harness import sweep

    assert sweep.grid is plan.grid and sweep.parse_shapes is plan.parse_shapes
    assert sweep.DTYPES is plan.DTYPES  # eps: the op's inputs carry plan.EPS
    bench_grid = [(p.m, p.n) for p in plan.plan(["bf16"]) if "grid" in p.sections]
    assert plan.grid() == bench_grid
    root = Path(__file__).resolve().parent.parent
    for path in (root / "harness" / "sweep.py", root / "scripts" / "ncu_one.py"):
        text = path.read_text()
        assert "from harness.plan import" in text and "from harness.bench" not in text, path


def _script(name: str):
    """scripts/NAME.py as a module (scripts/ is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device_log_tools():
    """A device call's log: bwd_probe --table puts its probes side by side (the default
    build, a --tune setting, a variant; a wrong result marked), and keep_log keeps a
    redrawn line's last form and drops pytest-benchmark's warnings."""
    log = "\n".join([
        "=== the backward kernels alone (a tuning probe, not a record) (21:41:13)",
        "dtype         shape    impl        us  % copy   rel err",
        "bf16   131072x1024    triton     205.6    92.2   2.8e-03",
        "bf16   131072x1024      cuda     251.8    75.3   2.8e-03",
        "--- tune BWD_SHARD_N=4096",
        "bf16   131072x1024    triton     210.0    90.1   2.8e-03  WRONG",
        "=== variant tx:RMSNORM_BWD_PROBE_TX_SUMS=1 (the probe again, on its build) (21:42:00)",
        "bf16   131072x1024      cuda     240.0    78.0   2.8e-03",
        "=== compute-sanitizer memcheck (21:43:00)",
        "bf16   131072x1024      cuda     1.0    1.0   2.8e-03",
    ])  # fmt: skip
    assert _script("bwd_probe").table(log).split("\n") == [
        "| impl | dtype | N | default | BWD_SHARD_N=4096 | tx |",
        "|---|---|---|---|---|---|",
        "| cuda | bf16 | 1024 | 75.3 |  | 78.0 |",
        "| triton | bf16 | 1024 | 92.2 | 90.1! |  |",
    ]
    noise = "x.py:44: PytestBenchmarkWarning: off\n  warner(PytestBenchmarkWarning(text))"
    assert _script("keep_log").clean(f"a\r 50%\r100%\n{noise}\nok") == ["100%", "ok"]


def test_latest_record_wins():
    a = _timing("triton", "bf16", 8, 4096, 10.0, ["grid"])
    b = _timing("triton", "bf16", 8, 4096, 5.0, ["grid"])
    c = _timing("cuda", "bf16", 8, 4096, 7.0, ["grid"])
    kept = records.latest([a, c, b])
    assert len(kept) == 2 and b in kept and a not in kept


def test_latest_drops_a_skip_a_later_line_measured():
    """A budget's "not run" SKIP of a shape gives way to a later measurement there (a run
    resumed by --resume); one with no later measurement, or written after it, stays."""

    def cut(n):  # measure.write_skipped's record: impl "all", the shape not run
        return records.make_record(run_id="synthetic", env=ENV, kind="skip", op="rms_norm",
                                   impl="all", status="SKIP", dtype="bf16", shape=[8, n],
                                   notes=["not run: time budget spent"])  # fmt: skip

    timed = _timing("triton", "bf16", 8, 4096, 5.0, ["grid"])
    first, other = cut(4096), cut(8192)
    kept = records.latest([first, other, timed])
    assert timed in kept and other in kept and first not in kept
    late = cut(4096)
    assert late in records.latest([timed, late])


# ---------------------------------------------------------------------------------------
# analysis, plots, report
# ---------------------------------------------------------------------------------------


def test_analysis_helpers(synthetic):
    recs = records.latest(records.read_records(synthetic))
    sp = analysis.speedups(recs, "grid")
    # eager is 4x slower than triton at every synthetic shape
    assert [s for _, s in sp[("triton", "eager", "bf16")]] == pytest.approx([4.0] * 3)
    assert ("triton", "liger", "bf16") in sp and len(sp[("triton", "liger", "bf16")]) == 2
    assert analysis.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert analysis.geomean([]) is None
    shapes = analysis.by_shape(analysis.passed(recs, "cold", "grid"))
    assert analysis.best_baseline(shapes[("bf16", 2**17, 1024)])[0] == "compile"
    sat = analysis.saturation_m(recs, ENV["copy_gbps"])
    assert sat["triton"] == 32768 and sat["eager"] is None


def test_plots_and_report_from_synthetic_records(synthetic, tmp_path):
    out = tmp_path / "drawn"
    written = plot.redraw(synthetic, out)
    names = {p.name for p in written}
    assert names == {
        "bandwidth_vs_n.png",
        "bandwidth_vs_m.png",
        "speedup.png",
        "small_shapes.png",
        "best_peer.png",
        *analysis.STUDY_PLOTS,
        "report.md",
    }
    for p in written:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    text = (out / "report.md").read_text()
    for expected in (
        "SYNTHETIC",
        "SYNTHETIC GPU",
        "## Failures",
        "Cannot launch Triton kernel",
        "quack not importable",
        "whole-model",
        "Smallest M reaching",
        "liger_kernel",
        "best baseline",
        "## Kernels each implementation ran",
    ):
        assert expected in text, expected


def test_best_peer_ratios(synthetic):
    """Each implementation's time against the best peer's at each grid width: the best
    peer at 1, ours above it where faster, in N's order; shapes without a peer left out."""
    recs = analysis.load(synthetic)
    got = analysis.best_peer_ratios(recs)
    assert sorted(got) == ["bf16", "fp32"]
    bf16 = dict(got["bf16"])
    assert [n for n, _ in bf16["triton"]] == [1024, 4096, 131072]
    best = min(f for name, f in SPEED.items() if name not in ("triton", "cuda"))  # compile
    for name, f in SPEED.items():
        for n, ratio in bf16[name]:
            assert ratio == pytest.approx(best / f), (name, n)
    assert all(r == pytest.approx(1.0) for _, r in bf16["compile"])
    ours_only = [r for r in recs if r.get("impl") in ("triton", "cuda")]
    assert analysis.best_peer_ratios(ours_only) == {}


def test_ours_ratios(synthetic):
    """CUDA's time over Triton's at each grid width where both passed, in N's order; none
    for an op or records without both."""
    recs = analysis.load(synthetic)
    got = analysis.ours_ratios(recs)
    assert sorted(got) == ["bf16", "fp32"]
    assert [n for n, _ in got["bf16"]] == [1024, 4096, 131072]
    for _, ratio in got["bf16"]:
        assert ratio == pytest.approx(SPEED["cuda"] / SPEED["triton"])
    assert analysis.ours_ratios([r for r in recs if r.get("impl") != "cuda"]) == {}


def test_odd_widths(synthetic):
    """% of copy at the odd widths' neighbours of one dtype, every implementation that
    passed; the grid's other widths and dtypes left out."""
    recs = analysis.load(synthetic)
    got = analysis.odd_widths(recs)
    assert sorted(got) == [1024, 4096]  # the synthetic grid's widths among the neighbours
    cold = analysis.by_shape(analysis.passed(recs, "cold", "grid"))
    for n, row in got.items():
        (impls,) = [v for (d, _m, nn), v in cold.items() if d == "bf16" and nn == n]
        assert row == {name: r["pct_copy"] for name, r in impls.items()}
    assert analysis.odd_widths(recs, "fp16") == {}


def test_plot_cli(synthetic, tmp_path, capsys):
    assert plot.main([str(synthetic), "--out", str(tmp_path / "o")]) == 0
    assert "report.md" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        plot.main([str(tmp_path / "missing.jsonl")])
    assert e.value.code == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": 1}\n')
    assert plot.main([str(bad), "--out", str(tmp_path / "o2")]) == 1


# ---------------------------------------------------------------------------------------
# two runs on two GPUs: analysis.portability, plot.plot_gpus, python -m harness.gpus
# ---------------------------------------------------------------------------------------

#: The second synthetic GPU's environment: another name, peak and copy ceiling.
ENV2 = {**ENV, "gpu": "SYNTHETIC GPU 2", "peak_gbps": 3352.0, "copy_gbps": 3000.0}


def _on_second_gpu(recs, slower=(), fast_quack=()):
    """recs as a run on ENV2's GPU: each record's env replaced, the grid's (impl, dtype, N)
    in ``slower`` 1.2x slower (its % of copy with it), and a quack timing, faster than every
    implementation, at each bf16 width in ``fast_quack``: a peer only this run has."""
    out = []
    for r in recs:
        r = {**r, "env": ENV2}
        grid = r["kind"] == "timing" and "grid" in r["sections"] and r["mode"] == "cold"
        if grid and (r["impl"], r["dtype"], r["shape"][1]) in slower:
            r["stats"] = {**r["stats"], "median_us": 1.2 * r["stats"]["median_us"]}
            r["gbps"], r["pct_copy"] = r["gbps"] / 1.2, r["pct_copy"] / 1.2
        out.append(r)
    for r in recs:
        if r["impl"] == "compile" and r["dtype"] == "bf16" and "grid" in r["sections"]:
            if r["shape"][1] in fast_quack:
                m, n = r["shape"]
                quack = _timing("quack", "bf16", m, n, r["stats"]["median_us"] / 2, ["grid"])
                out.append({**quack, "env": ENV2})
    return out


def _two_gpus(tmp_path):
    """(first run's path, second's): the second with triton 1.2x slower at bf16 4096 (behind
    compile, the best peer, where it led by 1.1x: a flip), and quack twice as fast as
    compile at 1024, a peer the first run never timed."""
    first = tmp_path / "gpu1.jsonl"
    recs = synthetic_records(first)
    second = tmp_path / "gpu2.jsonl"
    with records.RecordWriter(second, append=False) as w:
        for r in _on_second_gpu(recs, {("triton", "bf16", 4096)}, fast_quack={1024}):
            w.write(r)
    return first, second


def test_portability_flags_a_flip(tmp_path):
    """A row a kernel, width and dtype both runs timed: % of copy and the ratio to the best
    peer on each GPU, the flip where it leads on one and trails on the other; the best peer
    one both runs timed; the page lists the rows that differ, with the counts."""
    from harness import report

    first, second = _two_gpus(tmp_path)
    runs = {"A": analysis.load(first), "B": analysis.load(second)}
    rows = analysis.portability(runs)
    # both dtypes, three widths, both kernels of ours
    assert len(rows) == 2 * 3 * 2
    assert [(r["dtype"], r["n"], r["impl"]) for r in rows[:2]] == [
        ("bf16", 1024, "triton"),
        ("bf16", 1024, "cuda"),
    ]
    at = {(r["dtype"], r["n"], r["impl"]): r for r in rows}
    flipped = at[("bf16", 4096, "triton")]
    assert flipped["ratio"]["A"] == pytest.approx(SPEED["compile"] / SPEED["triton"])
    assert flipped["ratio"]["B"] == pytest.approx(SPEED["compile"] / (1.2 * SPEED["triton"]))
    assert flipped["flip"] and flipped["differs"]
    assert flipped["points"] == pytest.approx(flipped["pct"]["A"] * (1 / 1.2 - 1))
    assert flipped["peer"] == {"A": "compile", "B": "compile"}
    # quack, faster than all at 1024 but timed by B alone, is no one's best peer
    assert at[("bf16", 1024, "triton")]["peer"] == {"A": "compile", "B": "compile"}
    assert [k for k, r in at.items() if r["flip"] or r["differs"]] == [("bf16", 4096, "triton")]
    with pytest.raises(ValueError, match="runs: expected two runs"):
        analysis.portability({"A": runs["A"]})
    lines = report.portability(rows, ["A", "B"])
    text = "\n".join(lines)
    assert "Rows listed: 1 of 12" in text and "more than 2 points apart: 1;" in text
    assert "a flip against the best peer: 1." in text
    table = [ln for ln in lines if ln.startswith("| rms_norm")]
    assert len(table) == 1 and "| 4096 | triton |" in table[0] and "**flip**" in table[0]
    assert "1.100x (compile)" in table[0]


def test_gpus_figure_and_page(tmp_path, capsys):
    """python -m harness.gpus writes gpus.png and gpus.md: both GPUs named, the flip listed;
    a dtype the runs do not share at any width is refused before anything is written."""
    from harness import gpus

    first, second = _two_gpus(tmp_path)
    out = tmp_path / "drawn"
    assert gpus.main([f"H200={first}", f"H100={second}", "--out", str(out)]) == 0
    png = out / plot.GPUS_PLOT
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    page = (out / gpus.PAGE).read_text()
    for expected in ("SYNTHETIC", "SYNTHETIC GPU", "SYNTHETIC GPU 2", "(gpus.png)", "**flip**"):
        assert expected in page, expected
    assert "wrote" in capsys.readouterr().out
    runs = {"A": analysis.load(first), "B": analysis.load(second)}
    assert plot.plot_gpus(runs, tmp_path / "fp16", "fp16") is None
    none = tmp_path / "none"
    assert (
        gpus.main([f"H200={first}", f"H100={second}", "--dtype", "fp16", "--out", str(none)]) == 1
    )
    assert "(--dtype)" in capsys.readouterr().err and not none.exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["H200", "H100={second}"], "argument NAME=PATH: 'H200' is not NAME=PATH"),
        (["=x", "H100={second}"], "argument NAME=PATH: '=x' is not NAME=PATH"),
        (["H200=", "H100={second}"], "argument NAME=PATH: 'H200=' is not NAME=PATH"),
        (["H200={first}", "H100={missing}"], "NAME=PATH: H100={missing}: no such file"),
        (["H200={first}", "H200={second}"], "NAME=PATH: both runs are named H200"),
        (["H200={first}"], "NAME=PATH"),
        (["H200={first}", "H100={second}", "--dtype", "int8"], "argument --dtype"),
    ],
)
def test_gpus_cli_rejects_a_bad_argument_by_name(argv, message, tmp_path, capsys):
    from harness import gpus

    first, second = _two_gpus(tmp_path)
    paths = dict(first=first, second=second, missing=tmp_path / "missing.jsonl")
    with pytest.raises(SystemExit) as e:
        gpus.main([a.format(**paths) for a in argv])
    assert e.value.code == 2
    assert message.format(**paths) in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# bench: shapes, CLI, implementations, the no-GPU path
# ---------------------------------------------------------------------------------------


def test_plan():
    full = plan.plan(["bf16", "fp16", "fp32"])
    grid = [p for p in full if "grid" in p.sections]
    assert len(grid) == 3 * len(plan.LARGE_NS)
    assert all(p.m == 2**27 // p.n for p in grid)
    assert len(full) == len({(p.dtype, p.m, p.n) for p in full})  # each shape once
    both = next(p for p in full if (p.dtype, p.m, p.n) == ("bf16", 32768, 4096))
    assert both.sections == ["grid", "msweep"]
    assert full[0].dtype == "bf16" and full[-1].dtype == "fp32"  # headline first
    assert not any(p.dtype != "bf16" for p in full if "decode" in p.sections)
    ref = [p for p in full if "reference" in p.sections]
    assert [(p.dtype, p.m, p.n) for p in ref] == [("bf16", 8192, 8192)]
    quick = plan.plan(["bf16"], quick=True)
    assert 3 <= len(quick) <= 8
    custom = plan.plan(["fp16"], shapes=[(4096, 4096), (1, 8192)])
    assert [(p.m, p.n, p.sections) for p in custom] == [
        (4096, 4096, ["custom"]),
        (1, 8192, ["custom"]),
    ]
    # a requested shape the full plan has keeps its sections there (grid, decode, ...)
    named = plan.plan(["bf16"], shapes=[(2048, 65536), (1, 8192), (512, 262144), (3, 5000)])
    assert [(p.m, p.n, p.sections) for p in named] == [
        (2048, 65536, ["grid", "custom"]),
        (1, 8192, ["decode", "custom"]),
        (512, 262144, ["grid", "custom"]),
        (3, 5000, ["custom"]),
    ]
    assert plan.shape_class("bf16", 4097, False) == "bf16,large,N<=8192,odd"


def test_bench_argument_defaults():
    args = bench.parse_args([])
    assert args.dtypes == ["bf16", "fp16", "fp32"] and args.impls == list(OURS + BASELINES)
    args = bench.parse_args(["--quick", "--impls", "cuda,triton,cuda"])
    assert args.dtypes == ["bf16"] and args.impls == ["cuda", "triton"]
    assert plan.parse_shapes("4096x4096, 1X8192") == [(4096, 4096), (1, 8192)]
    assert plan.parse_names(" cuda,triton , cuda", OURS) == ["cuda", "triton"]
    for text, match in (("triton,bogus", "unknown bogus; choose from triton,cuda"), (",", "names")):
        with pytest.raises(ValueError, match=match):
            plan.parse_names(text, OURS)


def test_bench_group_forms_take_whole_groups_only(capsys):
    """A group's quantisation takes widths of whole groups: the grid's other widths are left
    out by name, and --shapes naming one is refused before any work."""
    with pytest.raises(SystemExit):
        bench.parse_args(["--ops", "fp8_rms_norm_group128", "--shapes", "64x4096,32x1000"])
    assert "32x1000 has N not a multiple of 128" in capsys.readouterr().err
    args = bench.parse_args(["--ops", "fp8_rms_norm_static", "--shapes", "32x1000"])
    assert bench._plan_of(args.ops[0], args)[0].n == 1000  # the other forms take any N
    args = bench.parse_args(["--ops", "fp8_fused_add_rms_norm_group128", "--dtypes", "bf16"])
    op = args.ops[0]
    planned = bench._plan_of(op, args)
    whole = [q for q in op.plan(["bf16"]) if q.n % 128 == 0]
    assert planned == whole and len(whole) < len(op.plan(["bf16"]))
    assert "N = 1000" in capsys.readouterr().out


def test_registry_keeps_ours_by_default_and_adds_baselines():
    assert set(registry()) == set(OURS)  # what tests and harness.validate run
    full = registry(baselines=True)
    assert list(full) == list(OURS + BASELINES)
    for name in BASELINES:
        assert runnable(full[name], "cpu")  # baselines are CUDA-only, with a reason
        assert not full[name].ours
    assert full["compile"].prepare is not None


def test_eager_baseline_is_the_reference():
    """The eager baseline is defined once: it is the reference function itself, and
    torch.compile's baseline compiles that function (the gradient ops': their forward's,
    tests/test_harness_backward.py)."""
    import inspect

    from harness import impls

    for op in FORWARD_OPS.values():
        full = op.registry(baselines=True)
        assert full["eager"].fn is op.reference
        assert full["compile"].prepare.func is impls.compile_fresh
        assert full["compile"].prepare.args == (op.reference,)
    assert "torch.compile(ref, dynamic=False, fullgraph=True)" in inspect.getsource(
        impls.compile_fresh
    )
    assert not hasattr(impls, "eager_rms_norm")


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_bench_without_gpu(tmp_path, monkeypatch, capsys):
    assert bench.main(["--require-gpu", "--out", str(tmp_path)]) == 1
    assert "--require-gpu" in capsys.readouterr().err
    # with committed records: redrawn into --out
    committed = tmp_path / "committed.jsonl"
    synthetic_records(committed)
    monkeypatch.setattr(bench, "COMMITTED", committed)
    monkeypatch.setattr(bench, "REPO", tmp_path)
    out = tmp_path / "out"
    assert bench.main(["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("no CUDA GPU")
    # 3 shapes x 3 dtypes of each default op
    assert "FAIL" not in text and text.count("PASS") == 9 * len(bench.DEFAULT_OPS)
    assert (out / "bandwidth_vs_n.png").exists() and (out / "report.md").exists()
    # without: says so and still succeeds
    monkeypatch.setattr(bench, "COMMITTED", tmp_path / "none" / "records.jsonl")
    assert bench.main(["--out", str(tmp_path / "out2")]) == 0
    assert "no committed H200 records" in capsys.readouterr().out


def test_no_synthetic_records_committed():
    """Synthetic runs live in tmp dirs only; anything under results/ is a real GPU run."""
    from pathlib import Path

    for path in (Path(__file__).resolve().parent.parent / "results").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            assert not json.loads(line)["env"].get("synthetic"), path
    assert math.isfinite(ENV["peak_gbps"])


@pytest.mark.parametrize("n", [1, 17, 128, 1000, 4096, 4097, 8192, 32768, 65536, 131072])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_sweep_candidates_include_todays_config(n, dtype):
    """harness.sweep compares each kernel's current choice with its alternatives, for both
    ops (the fused add's Triton rule names some dtypes)."""
    from harness import sweep

    elem = 4 if dtype == "fp32" else 2
    op = "fused_add_rms_norm"
    assert sweep.default_config("triton", n, dtype) in sweep.candidates("triton", n, elem)
    assert sweep.default_config("triton", n, dtype, op) in sweep.candidates("triton", n, elem, op)
    try:
        import cuda_impl  # noqa: F401
    except ImportError as e:
        pytest.skip(f"cuda extension not built: {e}")
    assert sweep.default_config("cuda", n, dtype) in sweep.candidates("cuda", n, elem)
    assert sweep.default_config("cuda", n, dtype, op) in sweep.candidates("cuda", n, elem, op)


@pytest.mark.parametrize("n", [1, 128, 1000, 4096, 8192, 16384, 65536])
def test_sweep_of_the_quantised_forms(n):
    """The fp8 forms' sweep (Triton's): today's config among the candidates, every
    candidate a quantising kernel in tiles of whole groups; the group forms take whole
    groups only."""
    from harness import sweep
    from harness.ops import QUANT_OPS

    for name in QUANT_OPS:
        base, mode, fused = sweep.quant_form(name)
        assert name == f"fp8_{base}_{mode}" and fused == ("fused_add" in name)
        group = 128 if mode == "group128" else 1
        if n % group:
            continue
        for dtype, elem in (("bf16", 2), ("fp32", 4)):
            cands = sweep.candidates("triton", n, elem, name)
            assert sweep.default_config("triton", n, dtype, name) in cands, (name, n, dtype)
            assert cands and all(c.kernel in ("fused", "looped") for c in cands)
            assert all(c.block_n % group == 0 for c in cands)
    assert ("fp8_rms_norm_static", "triton") in sweep.SWEEPABLE
    assert ("fp8_rms_norm_static", "cuda") not in sweep.SWEEPABLE
    assert sweep.quant_form("rms_norm") is None


def test_sweep_runs_forced_quantised_configs():
    """A quantised form with a forced config (the fused tile, the looped kernel in chunks
    narrower than the row) gives the reference's result through the sweep's runner, under
    the interpreter; a config of a kernel that does not quantise is refused by name."""
    from harness import sweep
    from harness.ops import QUANT_OPS
    from harness.validate import check
    from triton_impl import Config

    n = 1024
    for name, op in QUANT_OPS.items():
        inputs = op.make_inputs(plan.Planned("bf16", 6, n), DEVICE, 5)
        ref = op.reference(*inputs)
        for cfg in (Config("fused", n, 4, block_m=2), Config("looped", 256, 4, block_m=1)):
            impl = Impl("triton", sweep.runner("triton", cfg, name))
            _, _, ok, err = check(impl, *inputs, ref, op=op)
            assert ok, f"{name} {cfg}: {err}"
        split = sweep.runner("triton", Config("split", n, 4), name)
        with pytest.raises(ValueError, match="split kernel"):
            split(*inputs)


def test_forced_configs_compute_the_same_function():
    """The sweep's forced-config entry points give the reference's answer (Triton here)."""
    from harness import sweep
    from triton_impl import Config

    for n in (1000, 4097):
        x, w, eps = RMS_NORM.make_inputs(plan.Planned("bf16", 8, n), DEVICE, n)
        cands = sweep.candidates("triton", n, 2)
        assert any(c.kernel == "split" for c in cands)
        for cfg in cands[:4] + [c for c in cands if c.kernel == "split"][:2]:
            y = sweep.runner("triton", cfg)(x, w, eps)  # the op's inputs, as sweep_shape calls it
            torch.testing.assert_close(y, rms_norm_ref(x, w, eps), **TOL[torch.bfloat16])
    with pytest.raises(ValueError, match="narrower than the row"):
        sweep.runner("triton", Config("fused", 512, 4))(x, w, eps)


def test_report_lists_registers_and_first_calls_of_our_kernels(tmp_path):
    """kernel_info dicts and first-call (JIT) times of both kernels reach the report."""
    recs = [
        _timing("triton", "bf16", 2**15, 4096, 140.0, ["grid"]),
        _timing("cuda", "bf16", 2**15, 4096, 141.0, ["grid"]),
        _timing("compile", "bf16", 2**15, 4096, 139.0, ["grid"]),
    ]
    recs[0]["resources"] = [
        dict(name="_rms_norm_fwd_fused", config=dict(kernel="fused"), n_regs=40, n_spills=0)
    ]
    recs[1]["resources"] = [dict(row_threads=128, vpt=4, cluster=1, n_regs=32, local_bytes=0)]
    recs[0]["compile_s"], recs[1]["compile_s"] = 1.25, 0.0004
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    plot.redraw(path, tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Registers and spills of our kernels" in text
    assert "'kernel': 'fused'" in text
    assert "'row_threads': 128" in text and "| 32 |" in text and "| 40 |" in text
    assert "## First call at a new shape" in text and "| triton | 1.250 |" in text


# ---------------------------------------------------------------------------------------
# the fused add as a benchmarked op: registry, baselines, analysis and report per op, the
# run's schedule across ops
# ---------------------------------------------------------------------------------------


def test_fused_add_bytes_model_of_its_inputs():
    """read x + residual + weight, write y (x's size) + residual_out (residual's)."""
    op = FUSED_ADD_RMS_NORM
    same = Case("c", (8, 1000), torch.bfloat16)
    assert op.bytes_moved(op.make_inputs(same, "cpu", 0)) == _op_bytes(op, "bf16", 8, 1000)
    wide = Case("c", (8, 1000), torch.bfloat16, residual="fp32")
    assert op.bytes_moved(op.make_inputs(wide, "cpu", 0)) == 2 * 8 * 1000 * (2 + 4) + 1000 * 2


def test_fused_add_registry_names():
    op = FUSED_ADD_RMS_NORM
    assert op.ours == OURS == ("triton", "cuda")
    assert op.baselines == BASELINES  # the plain op's names, one each
    assert set(op.registry()) == set(OURS)
    full = fused_add_registry(baselines=True)
    assert list(full) == list(op.order)
    for name in OURS:
        impl = full[name]
        assert impl.ours and (impl.unavailable or impl.in_place is not None)
    for name in BASELINES:
        impl = full[name]
        assert not impl.ours and impl.in_place is None
        assert runnable(impl, "cpu")  # CUDA-only, with a reason, never a crash
    assert full["eager"].fn is fused_add_rms_norm_ref  # the eager baseline is the reference
    assert full["compile"].prepare.args == (fused_add_rms_norm_ref,)
    assert registry(baselines=True)["compile"].prepare.args == (rms_norm_ref,)


@pytest.mark.parametrize("rdtype", [torch.bfloat16, torch.float32], ids=["same", "fp32"])
@pytest.mark.parametrize("name", ["eager", "native"])
def test_fused_add_torch_baselines_calling_convention(name, rdtype):
    """fn(x, residual, weight, eps) -> (y in x's dtype, residual_out in residual's), the
    reference's answer, the caller's tensors untouched (run on CPU: plain PyTorch ops)."""
    case = Case(
        "c", (16, 1000), torch.bfloat16, residual="fp32" if rdtype == torch.float32 else "same"
    )
    x, residual, weight, eps = FUSED_ADD_RMS_NORM.make_inputs(case, "cpu", 3)
    assert residual.dtype == rdtype
    before = x.clone(), residual.clone()
    y, residual_out = fused_add_registry(baselines=True)[name].fn(x, residual, weight, eps)
    want_y, want_r = fused_add_rms_norm_ref(x, residual, weight, eps)
    assert y.dtype == x.dtype and residual_out.dtype == rdtype
    torch.testing.assert_close(residual_out, want_r, **TOL[rdtype])
    torch.testing.assert_close(y, want_y, **TOL[x.dtype])
    assert torch.equal(x, before[0]) and torch.equal(residual, before[1])
    y2, _ = fused_add_registry(baselines=True)[name].fn(x, residual, None, eps)  # no weight
    torch.testing.assert_close(
        y2, fused_add_rms_norm_ref(x, residual, None, eps)[0], **TOL[x.dtype]
    )


def test_compile_baseline_compiles_the_fused_reference():
    """compile's prepare for the fused add: a fresh fullgraph compile of the reference, the
    compile seconds returned apart; the lazy form recompiles when the inputs change."""
    reg = fused_add_registry(baselines=True)
    inputs = FUSED_ADD_RMS_NORM.make_inputs(Case("c", (4, 256), torch.float32), "cpu", 0)
    fn, seconds = reg["compile"].prepare(*inputs)
    assert seconds > 0
    for got, want in zip(fn(*inputs), fused_add_rms_norm_ref(*inputs), strict=True):
        torch.testing.assert_close(got, want, **TOL[torch.float32])
    lazy = reg["compile"].fn
    lazy(*inputs)
    key = lazy._key
    other = FUSED_ADD_RMS_NORM.make_inputs(Case("c", (4, 128), torch.float32), "cpu", 0)
    torch.testing.assert_close(lazy(*other)[0], fused_add_rms_norm_ref(*other)[0])
    assert lazy._key != key


def _fake_module(monkeypatch, name: str, **attrs):
    """Install a module under name (and its parents) in sys.modules for this test."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules or i == len(parts):
            monkeypatch.setitem(sys.modules, sub, types.ModuleType(sub))
    mod = sys.modules[name]
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def _fake_liger_function(monkeypatch, module: str, name: str, ref, n_args: int) -> list:
    """Install Liger's autograd Function ``module.name`` as a stand-in that answers with the
    reference on its first n_args arguments; returns the list each call's arguments go to,
    so a test sees how the wrapper called Liger."""
    calls = []

    class Fn:
        @staticmethod
        def apply(*args):
            calls.append(args)
            return ref(*args[:n_args])

    _fake_module(monkeypatch, module, **{name: Fn})
    return calls


def test_fused_add_peers_missing_are_unavailable(monkeypatch):
    hide_packages(monkeypatch, "liger_kernel", "quack")
    reg = fused_add_registry(baselines=True)
    assert "liger-kernel not importable" in reg["liger"].unavailable
    assert "quack not importable" in reg["quack"].unavailable
    assert reg["liger"].fn is None and runnable(reg["liger"], "cuda") == reg["liger"].unavailable


def test_fused_add_liger_wrapper(monkeypatch):
    """Liger's fused add is called in gemma mode with a weight always, and refuses an fp32
    residual (its residual_out would come back in x's dtype) with an error naming it."""
    calls = _fake_liger_function(
        monkeypatch,
        "liger_kernel.ops.fused_add_rms_norm",
        "LigerFusedAddRMSNormFunction",
        fused_add_rms_norm_ref,
        4,
    )
    liger = fused_add_registry(baselines=True)["liger"]
    assert liger.unavailable is None
    x, r, w, eps = FUSED_ADD_RMS_NORM.make_inputs(Case("c", (4, 64), torch.bfloat16), "cpu", 0)
    y, res = liger.fn(x, r, None, eps)
    (args,) = calls
    assert args[4:] == (0.0, "gemma", False) and torch.equal(args[2], torch.ones(64, dtype=x.dtype))
    with pytest.raises(ValueError, match="residual is torch.float32 but x is torch.bfloat16"):
        liger.fn(x, r.float(), w, eps)


def test_fused_add_quack_wrapper(monkeypatch):
    """QuACK's rmsnorm_fwd(residual=...) returns (y, residual_out, rstd): the wrapper gives
    (y, residual_out) in x's shape; a version that returns no residual_out is an error."""
    seen = {}

    def rmsnorm_fwd(x, weight=None, residual=None, eps=1e-6):
        seen.update(x=x.shape, residual=residual.shape, eps=eps)
        y, res = fused_add_rms_norm_ref(x, residual, weight, eps)
        return y, res, None

    mod = _fake_module(monkeypatch, "quack.rmsnorm", rmsnorm_fwd=rmsnorm_fwd)
    quack = fused_add_registry(baselines=True)["quack"]
    x, r, w, eps = FUSED_ADD_RMS_NORM.make_inputs(Case("c", (2, 3, 64), torch.float16), "cpu", 0)
    y, res = quack.fn(x, r, w, eps)
    assert seen == {"x": (6, 64), "residual": (6, 64), "eps": eps}  # 2-D rows
    assert y.shape == res.shape == x.shape
    mod.rmsnorm_fwd = lambda x, weight=None, residual=None, eps=1e-6: x
    quack = fused_add_registry(baselines=True)["quack"]
    with pytest.raises(TypeError, match="no residual_out"):
        quack.fn(x, r, w, eps)


# ---------------------------------------------------------------------------------------
# FlashInfer: both paths of both forward ops, and scripts/trim_flashinfer.py's package
# ---------------------------------------------------------------------------------------

FLASHINFER = ("flashinfer", "flashinfer_cuda")


def test_flashinfer_missing_is_unavailable(monkeypatch):
    """Without flashinfer both names are unavailable for both forward ops, the reason naming
    it; the gradient ops list them unavailable too (FlashInfer's norms have no backward)."""
    hide_packages(monkeypatch, "flashinfer")
    for op in FORWARD_OPS.values():
        full = op.registry(baselines=True)
        for name in FLASHINFER:
            impl = full[name]
            assert impl.fn is None and "flashinfer not importable" in impl.unavailable, name
            assert runnable(impl, "cuda") == impl.unavailable
    for op in GRAD_OPS.values():
        for name in FLASHINFER:
            assert "FlashInfer" in op.registry(baselines=True)[name].unavailable


def _fake_flashinfer(monkeypatch, use_cuda_norm: bool = False) -> types.ModuleType:
    """flashinfer.norm as a stand-in answering with the reference, its two functions as
    FlashInfer's are called (rmsnorm returns y; fused_add_rmsnorm writes y over input and
    the sum over residual); each call's (function, 2-D shape, path flag) is listed in
    norm.calls."""
    norm = types.ModuleType("flashinfer.norm")
    norm._USE_CUDA_NORM = use_cuda_norm
    norm._use_cuda_norm = lambda device: norm._USE_CUDA_NORM
    norm.calls = []

    def rmsnorm(input, weight, eps=1e-6):
        norm.calls.append(("rmsnorm", tuple(input.shape), norm._USE_CUDA_NORM, weight))
        return rms_norm_ref(input, weight, eps)

    def fused_add_rmsnorm(input, residual, weight, eps=1e-6):
        norm.calls.append(("fused_add_rmsnorm", tuple(input.shape), norm._USE_CUDA_NORM, weight))
        y, r = fused_add_rms_norm_ref(input, residual, weight, eps)
        residual.copy_(r)
        input.copy_(y)

    norm.rmsnorm, norm.fused_add_rmsnorm = rmsnorm, fused_add_rmsnorm
    package = types.ModuleType("flashinfer")
    package.norm = norm
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.norm", norm)
    return norm


def test_flashinfer_rms_norm_wrapper(monkeypatch):
    """rmsnorm on 2-D rows with a weight always (ones where none); the default path leaves
    the flag as it is, flashinfer_cuda sets it for the call alone (restored after a failure
    too); a weight in another dtype than x's is refused by name."""
    norm = _fake_flashinfer(monkeypatch)
    full = registry(baselines=True)
    x, w, eps = RMS_NORM.make_inputs(Case("c", (2, 3, 64), torch.bfloat16), "cpu", 0)
    for name, flag in (("flashinfer", False), ("flashinfer_cuda", True)):
        assert full[name].unavailable is None and full[name].prepare is None
        y = full[name].fn(x, None, eps)
        assert y.shape == x.shape and norm._USE_CUDA_NORM is False
        torch.testing.assert_close(y, rms_norm_ref(x, None, eps), **TOL[x.dtype])
        what, shape, seen_flag, weight = norm.calls[-1]
        assert (what, shape, seen_flag) == ("rmsnorm", (6, 64), flag)
        assert torch.equal(weight, torch.ones(64, dtype=x.dtype))
        with pytest.raises(ValueError, match="weight is torch.float32 but x is torch.bfloat16"):
            full[name].fn(x, w.float(), eps)
    norm.rmsnorm = lambda *a: 1 / 0
    with pytest.raises(ZeroDivisionError):
        full["flashinfer_cuda"].fn(x, w, eps)
    assert norm._USE_CUDA_NORM is False


def test_flashinfer_default_path_is_its_cute_dsl_one(monkeypatch):
    """Where flashinfer.norm's default is its CUDA kernel (FLASHINFER_USE_CUDA_NORM=1, or the
    DSL not importing) only flashinfer_cuda is available; a call whose dispatch would take
    the CUDA kernel on its device is refused, never timed as the default path."""
    monkeypatch.setenv("FLASHINFER_USE_CUDA_NORM", "1")
    _fake_flashinfer(monkeypatch, use_cuda_norm=True)
    for op in FORWARD_OPS.values():
        full = op.registry(baselines=True)
        assert "FLASHINFER_USE_CUDA_NORM=1" in full["flashinfer"].unavailable
        assert full["flashinfer_cuda"].unavailable is None
    norm = _fake_flashinfer(monkeypatch)
    norm._use_cuda_norm = lambda device: True  # e.g. an architecture the DSL does not target
    x, w, eps = RMS_NORM.make_inputs(Case("c", (4, 64), torch.float16), "cpu", 1)
    with pytest.raises(RuntimeError, match="dispatch takes the CUDA kernel"):
        registry(baselines=True)["flashinfer"].fn(x, w, eps)


@pytest.mark.parametrize("name", FLASHINFER)
def test_flashinfer_fused_add_wrapper(monkeypatch, name):
    """The in-place fused add as the harness's function: fn on copies (the caller's tensors
    untouched), the reference's answer; prepare's callable runs in place on copies made once,
    bound to those inputs (its first call is the reference's answer, later ones go on from
    the sums left); a residual in another dtype is refused by name."""
    norm = _fake_flashinfer(monkeypatch)
    impl = fused_add_registry(baselines=True)[name]
    inputs = FUSED_ADD_RMS_NORM.make_inputs(Case("c", (2, 4, 64), torch.bfloat16), "cpu", 2)
    x, r, w, eps = inputs
    before = x.clone(), r.clone()
    want = fused_add_rms_norm_ref(*inputs)
    for got, ref in zip(impl.fn(*inputs), want, strict=True):
        torch.testing.assert_close(got, ref, **TOL[ref.dtype])
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])
    assert norm.calls[-1][:3] == ("fused_add_rmsnorm", (8, 64), name == "flashinfer_cuda")
    assert check(impl, *inputs, want, op=FUSED_ADD_RMS_NORM)[2]
    timed, seconds = impl.prepare(*inputs)
    assert seconds > 0
    y, out = timed(*inputs)
    torch.testing.assert_close(y, want[0], **TOL[x.dtype])
    torch.testing.assert_close(out, want[1], **TOL[r.dtype])
    first = out.clone()
    y2, out2 = timed(*inputs)
    assert out2.data_ptr() == out.data_ptr() and not torch.equal(out2, first)  # in place
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])
    with pytest.raises(ValueError, match="other inputs"):
        timed(x.clone(), r, w, eps)
    with pytest.raises(ValueError, match="residual is torch.float32 but x is torch.bfloat16"):
        impl.fn(x, r.float(), w, eps)


def test_trim_flashinfer_builds_from_its_manifest(tmp_path, monkeypatch):
    """scripts/trim_flashinfer.py: the manifest's files (a folder entry whole), the minimal
    __init__ in place of the original, the dist-info with the version marked +norm and no
    RECORD or console script, one .tar.xz; a wheel lacking a listed path is refused. The
    committed manifest keeps both paths' sources and not the JIT's unused cutlass."""
    import tarfile
    import zipfile

    trim = _script("trim_flashinfer")
    keep = trim.read_manifest()
    for path in ("flashinfer/norm/__init__.py", "flashinfer/norm/kernels/rmsnorm.py",
                 "flashinfer/norm/kernels/fused_add_rmsnorm.py", "flashinfer/jit/norm.py",
                 "flashinfer/data/csrc/norm.cu", "flashinfer/data/include/flashinfer/norm.cuh",
                 "flashinfer/data/cccl/"):  # fmt: skip
        assert path in keep, path
    assert all(p.startswith("flashinfer/") for p in keep)
    unused = ("flashinfer/data/cutlass/", "flashinfer/data/spdlog/")
    assert not [p for p in keep if p.startswith(unused)]
    assert "flashinfer/__init__.py" not in keep  # written by the build
    wheel = tmp_path / "flashinfer_python-0.7.4-py3-none-any.whl"
    info = "flashinfer_python-0.7.4.dist-info/"
    with zipfile.ZipFile(wheel, "w") as z:
        for name in ("flashinfer/__init__.py", "flashinfer/version.py", "flashinfer/gemm.py",
                     "flashinfer/data/cccl/cub/a.cuh", "flashinfer/data/cutlass/b.h",
                     info + "RECORD", info + "WHEEL", info + "entry_points.txt",
                     info + "licenses/LICENSE"):  # fmt: skip
            z.writestr(name, f"# {name}\n")
        z.writestr(info + "METADATA", "Name: flashinfer-python\nVersion: 0.7.4\n")
    manifest = tmp_path / "keep.txt"
    manifest.write_text("# a comment\nflashinfer/version.py\nflashinfer/data/cccl/\n")
    monkeypatch.setattr(trim, "MANIFEST", manifest)
    target = trim.build(wheel, tmp_path / "out")
    assert target.name == "flashinfer_python-0.7.4+norm.tar.xz"
    with tarfile.open(target) as tar:
        names = set(tar.getnames())
        assert names == {
            "flashinfer/__init__.py",
            "flashinfer/version.py",
            "flashinfer/data/cccl/cub/a.cuh",
            "flashinfer_python-0.7.4+norm.dist-info/METADATA",
            "flashinfer_python-0.7.4+norm.dist-info/WHEEL",
            "flashinfer_python-0.7.4+norm.dist-info/top_level.txt",
            "flashinfer_python-0.7.4+norm.dist-info/licenses/LICENSE",
        }
        assert tar.extractfile("flashinfer/__init__.py").read().decode() == trim.MINIMAL_INIT
        meta = tar.extractfile("flashinfer_python-0.7.4+norm.dist-info/METADATA").read()
        assert b"Version: 0.7.4+norm\n" in meta
    manifest.write_text("flashinfer/absent.py\n")
    with pytest.raises(SystemExit, match="lacks flashinfer/absent.py"):
        trim.build(wheel, tmp_path / "out")


_IMPORT_TRIMMED = """
import glob, importlib.metadata, importlib.util, json, os, site, sys
sys.path.insert(0, sys.argv[1])
for d in os.environ.get("RMSNORM_SITE_DIRS", "").split(os.pathsep):
    if d:
        site.addsitedir(d)
dsl = importlib.util.find_spec("cutlass")
if dsl is not None and not any(
    glob.glob(os.path.join(d, "_mlir", "_mlir_libs", "_cutlass_ir.cu*"))
    for d in dsl.submodule_search_locations
):
    print(json.dumps({"dsl_without_compiler": True}))
    sys.exit(0)
import flashinfer.norm as norm
print(json.dumps({
    "file": norm.__file__,
    "version": importlib.metadata.version("flashinfer-python"),
    "functions": [f for f in ("rmsnorm", "fused_add_rmsnorm") if callable(getattr(norm, f, None))],
    "cuda_path_only": norm._USE_CUDA_NORM,
}))
"""


def test_trimmed_flashinfer_imports_its_norms(tmp_path):
    """The package scripts/fetch_peer_wheels.sh made (.fi/), unpacked into a temporary folder,
    imports flashinfer.norm from there alone, on CPU, in a fresh interpreter; where the CuTe
    DSL imports too, on its default DSL path."""
    import importlib.util
    import json
    import os
    import subprocess
    import tarfile
    from pathlib import Path

    found = sorted((Path(__file__).resolve().parent.parent / ".fi").glob("flashinfer*.tar.xz"))
    if not found:
        pytest.skip("no .fi/flashinfer*.tar.xz here: scripts/fetch_peer_wheels.sh makes it")
    if importlib.util.find_spec("tvm_ffi") is None:
        pytest.skip("apache-tvm-ffi not importable (flashinfer.jit imports it): QuACK's .qk2 "
                    "wheels, on a site directory named in RMSNORM_SITE_DIRS")  # fmt: skip
    with tarfile.open(found[-1]) as tar:
        tar.extractall(tmp_path, filter="data")
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_USE_CUDA_NORM"}
    env["FLASHINFER_WORKSPACE_BASE"] = str(tmp_path)  # its JIT log, not under $HOME
    got = subprocess.run(
        [sys.executable, "-c", _IMPORT_TRIMMED, str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    info = json.loads(got.stdout.strip().splitlines()[-1])
    if info.get("dsl_without_compiler"):
        # a device call that carried the first part of QuACK's library but not yet the
        # second: the CuTe DSL is there without its compiler library, and FlashInfer's
        # import refuses it
        pytest.skip(
            "the CuTe DSL is here without its compiler library (_cutlass_ir.cu*): QuACK's "
            "library wheel is carried in two parts, .qk1 and .qk3"
        )
    assert Path(info["file"]).is_relative_to(tmp_path), info
    assert info["version"].endswith("+norm")
    assert info["functions"] == ["rmsnorm", "fused_add_rmsnorm"]
    if importlib.util.find_spec("cutlass") is not None:
        assert info["cuda_path_only"] is False  # the DSL path's modules all shipped


def test_our_kernels_register_what_the_package_has(monkeypatch):
    """cuda_impl without the fused add (a build before it) is unavailable, saying so; with it
    both forms are registered, and its fused_add_kernel_info where it has one."""
    _fake_module(monkeypatch, "cuda_impl", rms_norm=lambda *a: None)
    cuda = fused_add_registry()["cuda"]
    assert cuda.fn is None and "cuda_impl has no fused_add_rms_norm" in cuda.unavailable
    info = lambda x, residual, weight: {"n_regs": 1}
    mod = _fake_module(
        monkeypatch, "cuda_impl", fused_add_rms_norm=lambda *a: None, fused_add_rms_norm_=print
    )
    mod.ops = types.SimpleNamespace(fused_add_kernel_info=info)
    cuda = fused_add_registry()["cuda"]
    assert cuda.unavailable is None and cuda.in_place is print and cuda.resources is info
    assert runnable(cuda, "cpu") == "needs a CUDA GPU"
    del mod.ops
    assert fused_add_registry()["cuda"].resources is None  # no kernel_info: none recorded


@pytest.mark.parametrize(
    "name, names, path",
    [
        ("native", ["void at::native::vectorized_layer_norm_kernel<c10::BFloat16>"], "fused"),
        (
            "native",
            ["LayerNormForwardCUDAKernel<float>", "RowwiseMomentsCUDAKernel<float>"],
            "composite",
        ),
        # the fused add's native: the add (and a cast) beside the one norm kernel
        (
            "native",
            [
                "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<c10::BFloat16>>",
                "void at::native::vectorized_layer_norm_kernel<c10::BFloat16>",
            ],
            "fused",
        ),
        (
            "native",
            ["vectorized_elementwise_kernel<4, pow>", "reduce_kernel<512, mean>"],
            "composite",
        ),
        ("compile", ["triton_per_fused_add_mean_mul_pow_rsqrt_0"], "inductor"),
        ("compile", ["vectorized_elementwise_kernel<4, add>"], "NOT-COMPILED"),
        ("triton", ["_rms_norm_fwd_fused"], None),
    ],
)
def test_kernel_path(name, names, path):
    assert measure.kernel_path(name, names) == path


def test_analysis_per_op(tmp_path):
    """Each op's numbers from its own records: its baselines, its best peer, its geomeans."""
    path = tmp_path / "both.jsonl"
    synthetic_records(path, fused=True)
    groups = analysis.by_op(analysis.load(path))
    assert list(groups) == [RMS_NORM, FUSED_ADD_RMS_NORM]
    fused = groups[FUSED_ADD_RMS_NORM]
    assert {r["op"] for r in fused} == {"fused_add_rms_norm"}
    shapes = analysis.by_shape(analysis.passed(fused, "cold", "grid"))
    # quack is the fused add's fastest peer (1.1); the plain op has no quack timings at all
    assert analysis.best_baseline(shapes[("bf16", 2**15, 4096)], FUSED_ADD_RMS_NORM)[0] == "quack"
    plain = {r["impl"]: r for r in analysis.summary(groups[RMS_NORM], "grid", RMS_NORM)}
    rows = analysis.summary(fused, "grid", FUSED_ADD_RMS_NORM)
    assert [(r["impl"], r["dtype"], r["shapes"]) for r in rows] == [
        ("triton", "bf16", 3),
        ("cuda", "bf16", 3),
    ]
    assert rows[0]["geo_ratio"] == pytest.approx(1.1)  # quack's time / triton's
    assert rows[1]["geo_ratio"] == pytest.approx(1.1 / 1.02)
    assert plain["triton"]["geo_ratio"] == pytest.approx(1.1)  # compile, the plain op's best
    sp = analysis.speedups(fused, "grid", FUSED_ADD_RMS_NORM)
    assert [s for _, s in sp[("triton", "eager", "bf16")]] == pytest.approx([6.0] * 3)
    assert analysis.saturation_m(fused, ENV["copy_gbps"], FUSED_ADD_RMS_NORM)["eager"] is None
    assert [f["impl"] for f in analysis.failures(fused)] == ["liger"]


def test_report_and_plots_have_a_section_per_op(tmp_path):
    """Several ops: report.md is the short page (each op's heading, summary table and the
    link to its own page), and each op's sections are its page, report-<op>.md."""
    path = tmp_path / "both.jsonl"
    synthetic_records(path, fused=True)
    out = tmp_path / "drawn"
    written = {p.name for p in plot.redraw(path, out)}
    assert written == set(analysis.PLOT_NAMES) | {
        f"fused_add_rms_norm-{n}" for n in analysis.PLOT_NAMES
    } | {*analysis.STUDY_PLOTS, "report.md", "report-rms_norm.md", "report-fused_add_rms_norm.md"}
    # the study's plot once, a panel an op, linked from the short page before the ops
    short = (out / "report.md").read_text()
    for name in analysis.STUDY_PLOTS:
        assert short.count(f"({name})") == 1
        assert short.index(name) < short.index("# RMSNorm forward (rms_norm)")
    text = (out / "report.md").read_text()
    plain_head = "# RMSNorm forward (rms_norm)"
    fused_head = "# fused residual add + RMSNorm forward (fused_add_rms_norm)"
    assert text.count(plain_head) == 1 and text.count(fused_head) == 1
    assert text.count("## Summary: grid shapes, cold") == 2
    assert "[report-rms_norm.md](report-rms_norm.md)" in text.split(fused_head)[0]
    assert "[report-fused_add_rms_norm.md](report-fused_add_rms_norm.md)" in text
    assert "## Kernels each implementation ran" not in text  # on the ops' pages
    plain = (out / "report-rms_norm.md").read_text()
    fused = (out / "report-fused_add_rms_norm.md").read_text()
    assert plain.startswith(plain_head) and fused.startswith(fused_head)
    for part in (plain, fused):
        for heading in (
            "## Summary: grid shapes, cold",
            "## Grid shapes (M = 2^27 / N), cold",
            "## Bandwidth against M at N = 4096",
            "## Small shapes",
            "## Failures",
            "## Kernels each implementation ran",
        ):
            assert heading in part, heading
    assert "(fused_add_rms_norm-speedup.png)" in fused and "(speedup.png)" in plain
    assert "fused_add_rms_norm-" not in plain
    assert "ValueError: liger: no" in fused and "ValueError: liger: no" not in plain
    assert "Cannot launch Triton kernel" in plain and "Cannot launch Triton kernel" not in fused
    assert "quack GB/s" in fused  # its peers' columns
    assert "read x + residual + weight, write y + residual_out" in text
    # the plain op's page alone is what it was: one page, no op headings
    alone = tmp_path / "plain.jsonl"
    synthetic_records(alone)
    assert [p.name for p in plot.redraw(alone, tmp_path / "plain")][-1] == "report.md"
    assert "(rms_norm)" not in (tmp_path / "plain" / "report.md").read_text()
    assert not list((tmp_path / "plain").glob("report-*.md"))


def _fake_run(monkeypatch, tmp_path, step_s: float):
    """bench.run_gpu on CPU: the start and each measurement faked, the clock advanced by
    step_s a measurement. Returns the (op, shape) measurements made, in order."""
    measured = []
    clock = [0.0]

    def start(path, *, append, seed, op):
        w = records.RecordWriter(path, append=append)
        return measure.Bench("synthetic", ENV, w, None, 0, seed, op=op, device="cpu")

    def measure_shape(b, p, impls):
        measured.append((b.op.name, p.m, p.n, [i.name for i in impls]))
        clock[0] += step_s

    monkeypatch.setattr(measure, "start", start)
    monkeypatch.setattr(measure, "measure_shape", measure_shape)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    return measured


def test_run_takes_the_ops_in_turn_shape_by_shape(tmp_path, monkeypatch, capsys):
    """Both ops at every shape, one after the other, into one records file; an
    implementation that cannot run gets a SKIP record of its op."""
    measured = _fake_run(monkeypatch, tmp_path, 0.0)
    args = bench.parse_args(["--quick", "--impls", "triton,eager,liger", "--out", str(tmp_path)])
    args.budget_s = 100.0
    hide_packages(monkeypatch, "liger_kernel")  # not installed, whatever is here
    assert bench.run_gpu(args, args.impls, tmp_path) == 0
    shapes = plan.plan(args.dtypes, quick=True)
    assert [(op, m, n) for op, m, n, _ in measured] == [
        (op, p.m, p.n) for p in shapes for op in ("rms_norm", "fused_add_rms_norm")
    ]
    assert all(impls == ["triton", "eager"] for *_, impls in measured)
    recs = records.read_records(tmp_path / "records.jsonl")
    skips = [(r["op"], r["impl"]) for r in recs if r["status"] == "SKIP"]
    assert skips == [("rms_norm", "liger"), ("fused_add_rms_norm", "liger")]
    assert "skip liger (fused_add_rms_norm): liger-kernel not importable" in capsys.readouterr().out


def test_run_budget_skips_both_ops_tails(tmp_path, monkeypatch, capsys):
    """A spent budget records every (op, shape) not run as skipped, under its op."""
    measured = _fake_run(monkeypatch, tmp_path, 10.0)
    args = bench.parse_args(["--quick", "--impls", "triton", "--out", str(tmp_path)])
    args.budget_s = 25.0  # the 4th measurement starts at 30 s
    bench.run_gpu(args, args.impls, tmp_path)
    shapes = plan.plan(args.dtypes, quick=True)
    first = shapes[0]
    assert [(op, m, n) for op, m, n, _ in measured] == [
        ("rms_norm", first.m, first.n),
        ("fused_add_rms_norm", first.m, first.n),
        ("rms_norm", shapes[1].m, shapes[1].n),
    ]
    recs = records.read_records(tmp_path / "records.jsonl")
    skipped = [(r["op"], r["shape"]) for r in recs if r["kind"] == "skip"]
    want = [(op, [p.m, p.n]) for p in shapes for op in ("rms_norm", "fused_add_rms_norm")][3:]
    assert skipped == want
    assert all("time budget spent" in r["notes"][0] for r in recs if r["kind"] == "skip")
    assert f"{len(want)} (op, shape) measurements not run" in capsys.readouterr().out


def test_report_includes_the_model_table(tmp_path):
    """report.md carries harness.model's table when one was written beside it, and says
    nothing of a model when none was."""
    from harness import report

    assert report._model(tmp_path) == []
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.md").write_text("## The whole model\n\n| a |\n")
    lines = report._model(tmp_path)
    assert lines[0].startswith("# The whole model") and "| a |" in "\n".join(lines)


# ---------------------------------------------------------------------------------------
# titles and the report's environment name what the records drawn hold, nothing else
# ---------------------------------------------------------------------------------------


def _rec_at(impl: str, sha: str, **env) -> dict:
    return {"impl": impl, "env": {**ENV, "git_sha": sha, **env}}


def test_commits_text_names_the_commits_of_the_points():
    from harness import analysis, plot

    same = [_rec_at("triton", "a" * 40), _rec_at("cuda", "a" * 7)]
    assert analysis.commits_text(same) == "git aaaaaaa"
    mixed = same + [_rec_at("triton", "b" * 40), _rec_at("eager", "a" * 40, git_dirty=True)]
    assert analysis.commits_text(mixed) == (
        "git aaaaaaa: cuda; aaaaaaa+dirty: eager; aaaaaaa bbbbbbb: triton"
    )
    assert analysis.commits_text([{"impl": "x", "env": {}}]) is None
    # a figure's title: its records' commits only, not the last run's where none is drawn
    env = {**ENV, "git_sha": "c" * 40, "synthetic": False}
    title = plot.subtitle(env, same)
    assert "git aaaaaaa" in title and "ccccccc" not in title
    assert "git ccccccc" in plot.subtitle(env, [])  # no records: the run's


def test_report_environment_takes_versions_from_the_records_that_have_them():
    from harness import report

    env = {**ENV, "git_sha": "b" * 40, "quack": None, "liger_kernel": None}
    recs = [
        _rec_at("quack", "a" * 40, quack="0.6.5"),
        _rec_at("triton", "b" * 40, quack=None),
    ]
    rows = dict(report._env_rows(env, recs))
    assert rows["quack"] == "0.6.5"
    assert "liger_kernel" not in rows  # no liger records: no row, never "None"
    assert rows["commits"] == "git aaaaaaa: quack; bbbbbbb: triton"
    assert "None" not in rows.values()  # an unknown value is a dash


def test_quant_ops_bytes_and_inputs():
    """The quantised ops' inputs (the plain op's, and the static scale) and bytes model: x
    and weight read, y written in one byte, the scales in four (a row's, a group's, none
    for the static scale), the fused add's residual read and residual_out written."""
    from harness.ops import QUANT_STATIC_SCALE

    planned = plan.Planned("bf16", 64, 1024)
    x, w, eps, scale = QUANT_OPS["fp8_rms_norm_static"].make_inputs(planned, "cpu", 7)
    assert scale.dtype == torch.float32 and float(scale) == QUANT_STATIC_SCALE
    m_n, n = 64 * 1024, 1024
    assert QUANT_OPS["fp8_rms_norm_static"].bytes_moved((x, w, eps, scale)) == 3 * m_n + 2 * n
    assert QUANT_OPS["fp8_rms_norm_token"].bytes_moved((x, w, eps)) == 3 * m_n + 2 * n + 4 * 64
    group = QUANT_OPS["fp8_rms_norm_group128"].bytes_moved((x, w, eps))
    assert group == 3 * m_n + 2 * n + 4 * m_n // 128
    fused = QUANT_OPS["fp8_fused_add_rms_norm_token"]
    xr, r, wr, _ = fused.make_inputs(planned, "cpu", 7)
    assert fused.bytes_moved((xr, r, wr, eps)) == 3 * m_n + 4 * m_n + 2 * n + 4 * 64


def test_quant_peers_judged_within_their_dtypes_rounding():
    """A peer whose y passes through x's dtype before the rounding to fp8 (native: F.rms_norm,
    y stored) lands a step off wherever that rounding moved y across a tie of the fp8 grid:
    q_close takes the neighbour within rel of a tie, and not one beyond it, nor a value two
    steps off; native, judged so, passes each quantised form at a width of 4096."""
    from harness.impls import quant_registry
    from harness.reference import TOL, q_close
    from harness.validate import check

    e4m3 = torch.float8_e4m3fn
    v = torch.tensor([31.0 + 0.01])  # a tie of 30 and 32 (31), 0.03% above it
    want, step = torch.tensor([32.0]).to(e4m3), torch.tensor([30.0]).to(e4m3)
    with pytest.raises(AssertionError, match="beyond a tie"):
        q_close(step, want, v)  # the fp32 tolerance: 4e-5
    q_close(step, want, v, rel=TOL[torch.bfloat16]["rtol"])
    with pytest.raises(AssertionError, match="beyond a tie"):
        q_close(torch.tensor([28.0]).to(e4m3), want, v, rel=TOL[torch.bfloat16]["rtol"])
    for name, op in QUANT_OPS.items():
        fused = "fused_add" in name
        mode = name.rsplit("_", 1)[1]
        native = quant_registry(True, mode, fused)["native"]
        assert native.rounds_in_dtype
        inputs = op.make_inputs(plan.Planned("bf16", 256, 4096), "cpu", 3)
        a, r, ok, err = check(native, *inputs, op.reference(*inputs), op=op)
        assert ok, f"{name}: {err}"


def test_cost_figure(tmp_path):
    """harness.cost: Triton's kernels are the jitted functions nothing calls, a build log
    gives CUDA's kernels and seconds (or a ValueError naming it), and the figure is drawn
    from the committed records and log."""
    from harness import cost

    src = tmp_path / "t"
    src.mkdir()
    (src / "k.py").write_text(
        "@triton.jit\ndef _helper(x):\n    return x\n\n\n"
        "@triton.jit\n@some.other\ndef _kernel(p):\n    _helper(p)\n"
    )
    assert cost.triton_kernels(src) == 1 and cost.lines_of(src, (".py",)) == 9
    log = tmp_path / "build.log"
    log.write_text("=== build\nbuild seconds: 96198e-3\nkernels: 593\n")
    assert cost.build_of(log) == (593, pytest.approx(96.198))
    bad = tmp_path / "bad.log"
    bad.write_text("kernels: 1\n")
    with pytest.raises(ValueError, match="bad.log"):
        cost.build_of(bad)
    committed = cost.REPO / "results/h200/records.jsonl.xz"
    if not committed.exists():
        pytest.skip("no committed H200 records")
    assert cost.main(["--build-log", str(log), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / cost.NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cost.main(["--build-log", str(bad), "--out", str(tmp_path / "o2")]) == 1


def test_bandwidth_plot_draws_an_ops_target():
    """An op with a target (a fraction of the copy) gets its line, labelled with whose it
    is and where it lies; an op without one, and a run without a copy ceiling, none."""
    import dataclasses

    import matplotlib.pyplot as plt

    from harness.ops import RMS_NORM

    env = {"peak_gbps": 4814.0, "copy_gbps": 4000.0}
    aimed = dataclasses.replace(RMS_NORM, target=(0.85, "a target"))
    for op, e, want in ((aimed, env, 1), (RMS_NORM, env, 0), (aimed, {"peak_gbps": 1.0}, 0)):
        fig, ax = plt.subplots()
        plot._ceilings(ax, e, op)
        got = [ln for ln in ax.get_lines() if ln.get_label().startswith("a target")]
        assert len(got) == want
        if want:
            assert got[0].get_ydata()[0] == pytest.approx(3400.0)
            assert "85% of copy, 3400 GB/s" in got[0].get_label()
        plt.close(fig)


def test_resume_counts_what_a_run_measured(tmp_path):
    """--resume continues a run of record: a shape's implementations timed cold, or FAIL
    (written untimed), count as measured; graph or host timings alone and skips do not;
    records from another commit or another GPU are refused, naming both."""
    path = tmp_path / "records.jsonl"
    synthetic_records(path)
    held = bench.measured(records.iter_records(path), ENV["git_sha"], ENV["gpu"])
    assert held[("rms_norm", "bf16", 2**27 // 4096, 4096)] == set(SPEED)
    assert "liger" in held[("rms_norm", "bf16", 1024, 131072)]  # its FAIL
    assert ("rms_norm", "bf16", 1, 8192) not in held  # decode: graph and host only
    # what a resume still measures: a shape lacking any runnable implementation, in order
    work = [  # the two grid shapes the run timed
        (RMS_NORM, p) for p in plan.plan(["bf16"]) if p.n in (4096, 131072) and p.m * p.n == 2**27
    ]
    assert len(work) == 2

    def left(*names):
        return bench.unmeasured(work, {"rms_norm": [Impl(n, fn=None) for n in names]}, held)

    assert left("triton", "liger") == []  # liger's FAIL at 131072 counts
    assert left("triton", "quack") == work  # quack never ran
    for sha, gpu in ((ENV["git_sha"], "ANOTHER GPU"), ("1" * 40, ENV["gpu"])):
        with pytest.raises(bench.ResumeMismatch, match=f"this run is {sha} on {gpu}"):
            bench.measured(records.iter_records(path), sha, gpu)
