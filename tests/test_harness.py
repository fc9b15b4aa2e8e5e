"""The benchmark harness's logic on CPU: bytes model, statistics, record schema, plots and
report from a small SYNTHETIC records file (written to a tmp dir, never under results/),
CLI argument errors, and the no-GPU path of ``python -m harness.bench``.
"""

import json
import math

import pytest
import torch

from conftest import DEVICE, HAS_GPU
from harness import bench, hardware, plot, records, report, timing
from harness.impls import BASELINES, OURS, eager_rms_norm, registry, runnable
from harness.reference import TOL, rms_norm_ref

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


def _timing(impl, dtype, m, n, us, sections, mode="cold"):
    nbytes = records.bytes_moved(m, n, records.DTYPE_BYTES[dtype], records.DTYPE_BYTES[dtype])
    samples = [us * f for f in (0.98, 1.0, 1.0, 1.02, 1.05, 0.99)]
    stats = timing.summarize(samples)
    small = nbytes < 50e6
    gb = records.gbps(nbytes, stats["median_us"] * 1e-6)
    pct = None if small or mode != "cold" else 100 * gb / ENV["copy_gbps"]
    return records.make_record(
        run_id="synthetic",
        env=ENV,
        kind="timing",
        impl=impl,
        dtype=dtype,
        shape=[m, n],
        sections=sections,
        shape_class=bench.shape_class(dtype, n, small),
        mode=mode,
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


def synthetic_records(path):
    """Write a small SYNTHETIC run to path: copy, grid, M sweep, decode, a FAIL, a SKIP."""
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
            base_us = records.bytes_moved(m, n, size, size) / 3.9e12 * 1e6  # ~3.9 TB/s
            for impl, f in SPEED.items():
                if impl == "liger" and n > 65536:
                    continue
                # a shape in two sections is measured once, as in the bench
                sections = ["grid", "msweep"] if (dtype, n) == ("bf16", 4096) else ["grid"]
                recs.append(_timing(impl, dtype, m, n, base_us * f, sections))
    for m in (1, 64, 4096):
        us = 5.0 + records.bytes_moved(m, 4096, 2, 2) / 3.9e12 * 1e6
        for impl, f in SPEED.items():
            recs.append(_timing(impl, "bf16", m, 4096, us * f, ["msweep"]))
    for m in (1, 8):
        for mode, us in (("graph", 3.0), ("host", 12.0)):
            for impl, f in SPEED.items():
                recs.append(_timing(impl, "bf16", m, 8192, us * f, ["decode"], mode=mode))
    recs.append(
        records.make_record(
            run_id="synthetic",
            env=ENV,
            kind="timing",
            impl="liger",
            dtype="bf16",
            shape=[1024, 131072],
            sections=["grid"],
            mode="cold",
            bytes=1,
            status="FAIL",
            correct={
                "max_abs": None,
                "max_rel": None,
                "passed": False,
                "error": "RuntimeError: Cannot launch Triton kernel since n = 131072",
            },
        )
    )
    recs.append(
        records.make_record(
            run_id="synthetic",
            env=ENV,
            kind="skip",
            impl="quack",
            status="SKIP",
            notes=["quack not importable (No module named 'quack')"],
        )
    )
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
# bytes model and statistics
# ---------------------------------------------------------------------------------------


def test_bytes_model():
    # bf16 x and weight: read x + write y (2 bytes each) + read weight
    assert records.bytes_moved(4096, 4096, 2, 2) == 2 * 4096 * 4096 * 2 + 4096 * 2
    assert records.bytes_moved(8, 1000, 4, 4) == 2 * 8 * 1000 * 4 + 1000 * 4
    assert records.bytes_moved(8, 1000, 2, 4) == 2 * 8 * 1000 * 2 + 1000 * 4  # fp32 weight
    assert records.bytes_moved(8, 1000, 2, None) == 2 * 8 * 1000 * 2  # no weight
    with pytest.raises(ValueError, match="N >= 1"):
        records.bytes_moved(8, 0, 2, 2)
    assert records.gbps(10**9, 1.0) == pytest.approx(1.0)
    assert records.gbps(10**9, 0.0) is None


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


def test_latest_record_wins():
    a = _timing("triton", "bf16", 8, 4096, 10.0, ["grid"])
    b = _timing("triton", "bf16", 8, 4096, 5.0, ["grid"])
    c = _timing("cuda", "bf16", 8, 4096, 7.0, ["grid"])
    kept = records.latest([a, c, b])
    assert len(kept) == 2 and b in kept and a not in kept


# ---------------------------------------------------------------------------------------
# analysis, plots, report
# ---------------------------------------------------------------------------------------


def test_analysis_helpers(synthetic):
    recs = records.latest(records.read_records(synthetic))
    sp = report.speedups(recs, "grid")
    # eager is 4x slower than triton at every synthetic shape
    assert [s for _, s in sp[("triton", "eager", "bf16")]] == pytest.approx([4.0] * 3)
    assert ("triton", "liger", "bf16") in sp and len(sp[("triton", "liger", "bf16")]) == 2
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert report.geomean([]) is None
    shapes = report.by_shape(report.passed(recs, "cold", "grid"))
    assert report.best_baseline(shapes[("bf16", 2**17, 1024)])[0] == "compile"
    sat = report.saturation_m(recs, ENV["copy_gbps"])
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
# bench: shapes, CLI, implementations, the no-GPU path
# ---------------------------------------------------------------------------------------


def test_plan():
    full = bench.plan(["bf16", "fp16", "fp32"])
    grid = [p for p in full if "grid" in p.sections]
    assert len(grid) == 3 * len(bench.LARGE_NS)
    assert all(p.m == 2**27 // p.n for p in grid)
    assert len(full) == len({(p.dtype, p.m, p.n) for p in full})  # each shape once
    both = next(p for p in full if (p.dtype, p.m, p.n) == ("bf16", 32768, 4096))
    assert both.sections == ["grid", "msweep"]
    assert full[0].dtype == "bf16" and full[-1].dtype == "fp32"  # headline first
    assert not any(p.dtype != "bf16" for p in full if "decode" in p.sections)
    ref = [p for p in full if "reference" in p.sections]
    assert [(p.dtype, p.m, p.n) for p in ref] == [("bf16", 8192, 8192)]
    quick = bench.plan(["bf16"], quick=True)
    assert 3 <= len(quick) <= 8
    custom = bench.plan(["fp16"], shapes=[(4096, 4096), (1, 8192)])
    assert [(p.m, p.n, p.sections) for p in custom] == [
        (4096, 4096, ["custom"]),
        (1, 8192, ["custom"]),
    ]
    assert bench.shape_class("bf16", 4097, False) == "bf16,large,N<=8192,odd"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtypes", "fp8"], "--dtypes"),
        (["--impls", "triton,bogus"], "--impls"),
        (["--shapes", "4096by4096"], "--shapes"),
        (["--shapes", "0x4096"], "--shapes"),
        (["--quick", "--shapes", "8x8"], "exclusive"),
        (["--budget-s", "0"], "--budget-s"),
        (["--no-such-flag"], "unrecognized"),
    ],
)
def test_bench_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_argument_defaults():
    args = bench.parse_args([])
    assert args.dtypes == ["bf16", "fp16", "fp32"] and args.impls == list(OURS + BASELINES)
    args = bench.parse_args(["--quick", "--impls", "cuda,triton,cuda"])
    assert args.dtypes == ["bf16"] and args.impls == ["cuda", "triton"]
    assert bench.parse_shapes("4096x4096, 1X8192") == [(4096, 4096), (1, 8192)]


def test_registry_keeps_ours_by_default_and_adds_baselines():
    assert set(registry()) == set(OURS)  # what tests and harness.validate run
    full = registry(baselines=True)
    assert list(full) == list(OURS + BASELINES)
    for name in BASELINES:
        assert runnable(full[name], "cpu")  # baselines are CUDA-only, with a reason
        assert not full[name].ours
    assert full["compile"].prepare is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_eager_baseline_matches_reference(dtype):
    x = torch.randn(5, 1000).to(dtype)
    w = (1 + 0.5 * torch.randn(1000)).to(dtype)
    torch.testing.assert_close(eager_rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **TOL[dtype])
    torch.testing.assert_close(eager_rms_norm(x), rms_norm_ref(x), **TOL[dtype])


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
    assert "FAIL" not in text and text.count("PASS") == 9
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
@pytest.mark.parametrize("elem", [2, 4])
def test_sweep_candidates_include_todays_config(n, elem):
    """harness.sweep compares each kernel's current choice with its alternatives."""
    from harness import sweep

    assert sweep.default_config("triton", n, elem) in sweep.candidates("triton", n, elem)
    try:
        import cuda_impl  # noqa: F401
    except ImportError as e:
        pytest.skip(f"cuda extension not built: {e}")
    assert sweep.default_config("cuda", n, elem) in sweep.candidates("cuda", n, elem)


def test_forced_configs_compute_the_same_function():
    """The sweep's forced-config entry points give the reference's answer (Triton here)."""
    from harness import sweep
    from triton_impl import Config

    for n in (1000, 4097):
        x = torch.randn(8, n, device=DEVICE).to(torch.bfloat16)
        w = torch.randn(n, device=DEVICE).to(torch.bfloat16)
        cands = sweep.candidates("triton", n, 2)
        assert any(c.kernel == "split" for c in cands)
        for cfg in cands[:4] + [c for c in cands if c.kernel == "split"][:2]:
            y = sweep.runner("triton", cfg)(x, w)
            torch.testing.assert_close(y, rms_norm_ref(x, w, 1e-6), **TOL[torch.bfloat16])
    with pytest.raises(ValueError, match="narrower than the row"):
        sweep.runner("triton", Config("fused", 512, 4))(x, w)


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
