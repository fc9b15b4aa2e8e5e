"""A shape's ceiling (harness.ceiling): its kernels copy what the op reads into what it
writes, exactly; the records and the reports carry each implementation's share of it."""

import pytest
import torch

from conftest import DEVICE
from harness import analysis, ceiling, plot, records, report, timing
from harness.ops import FUSED_ADD_RMS_NORM, RMS_NORM, RMS_NORM_BWD

ENV = {"gpu": "synthetic", "copy_gbps": 4000.0, "git_sha": "0" * 40}


@pytest.mark.parametrize("op", [RMS_NORM, FUSED_ADD_RMS_NORM], ids=lambda o: o.name)
@pytest.mark.parametrize("n", [4096, 4097])
def test_every_ceiling_kernel_copies_the_op_s_rows(op, n):
    """Each ceiling kernel writes new tensors equal to the rows the op reads (x; the fused
    add's x and residual, the residual in fp32 too), in their dtypes; odd widths too."""
    from harness.plan import Planned

    inputs = list(op.make_inputs(Planned("bf16", 5, n), DEVICE, 0))
    if op is FUSED_ADD_RMS_NORM:
        inputs[1] = inputs[1].float()
    rows = inputs[:2] if op is FUSED_ADD_RMS_NORM else inputs[:1]
    calls = ceiling.calls(op.name, tuple(inputs))
    assert list(calls) == [n for n in ceiling.NAMES if n != "cuda" or DEVICE == "cuda"]
    for name, call in calls.items():
        got = call()
        assert len(got) == len(rows), name
        for g, want in zip(got, rows, strict=True):
            assert g.dtype == want.dtype and g.data_ptr() != want.data_ptr(), name
            assert torch.equal(g, want), name


def test_no_ceiling_where_none_models_the_op():
    """Gradient ops, and rows that are not one contiguous block, keep the copy ceiling."""
    x = torch.randn(4, 64, device=DEVICE)
    assert ceiling.calls(RMS_NORM_BWD.name, (x, x, None, 1e-6)) == {}
    assert ceiling.calls(RMS_NORM.name, (x[:, :32], None, 1e-6)) == {}


def _record(kind, impl, gbps, **fields):
    us = 1000.0
    stats = timing.summarize([us, us])
    return records.make_record(
        run_id="synthetic",
        env=ENV,
        kind=kind,
        op=RMS_NORM.name,
        impl=impl,
        dtype="bf16",
        shape=[16384, 8192],
        sections=["grid"],
        mode="cold",
        shape_class="bf16,large",
        bytes=2 * 16384 * 8192 * 2,
        samples_us=[us, us],
        stats=stats,
        gbps=gbps,
        pct_copy=100 * gbps / ENV["copy_gbps"],
        correct={"max_abs": 0.0, "max_rel": 0.0, "passed": True, "error": None},
        **fields,
    )


def test_records_and_report_carry_the_share_of_the_ceiling(tmp_path):
    """Ceiling records validate; the fastest names the shape's ceiling; an implementation's
    pct_ceiling shows in the grid table and the summary beside its % of copy; a line
    written before the field reads as no ceiling."""
    recs = [
        _record("ceiling", "copy", 3900.0),
        _record("ceiling", "triton", 4100.0),
        _record("timing", "triton", 4059.0, pct_ceiling=99.0),
        _record("timing", "compile", 4018.0, pct_ceiling=98.0),
    ]
    assert analysis.ceilings(recs) == {("bf16", 16384, 8192): ("triton", 4100.0)}
    path = tmp_path / "records.jsonl"
    with records.RecordWriter(path, append=False) as w:
        for r in recs:
            w.write(r)
    old = dict(recs[2])
    del old["pct_ceiling"]
    assert records.upgrade(old)["pct_ceiling"] is None
    pages = report.write_report(records.read_records(path), tmp_path)
    text = "\n".join(p.read_text() for p in pages)
    assert "triton GB/s (% ceiling, % copy)" in text
    assert "4059 (99.0%, 101%)" in text and "4100 (triton)" in text
    assert "geomean of ceiling" in text
    drawn = plot.plot_bandwidth_vs_n(records.read_records(path), tmp_path)
    assert drawn is not None and drawn.stat().st_size > 0


def test_a_shape_s_ceiling_is_timed_with_the_implementations(tmp_path, monkeypatch):
    """measure's cold timing with ceiling kernels (timing faked, on CPU): one ceiling record
    each, in the implementations' blocks; each implementation's pct_ceiling is its GB/s
    over the fastest ceiling's, by the same bytes; a ceiling that raises is left out."""
    from harness import measure, plan

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    us = {"triton": 20.0, "copy": 21.0, "triton_copy": 19.0}
    monkeypatch.setattr(
        measure,
        "time_blocks",
        lambda b, fns: ({k: [[us[k.split(":")[-1]] * 1e-6] * 2] * 3 for k in fns}, None),
    )
    path = tmp_path / "records.jsonl"
    b = measure.Bench("synthetic", ENV, records.RecordWriter(path, append=False), None, 0, 0)
    p = plan.Planned("bf16", 8, 4096, ["grid"])
    inputs = RMS_NORM.make_inputs(p, DEVICE, 0)
    base = measure.shape_fields(b, p, inputs)
    ok = {"max_abs": 0.0, "max_rel": 0.0, "passed": True, "error": None}
    ready = {"triton": dict(call=lambda: None, compile_s=None, correct=ok, kernels=None,
                            resources=None, notes=[])}  # fmt: skip

    def broken():
        raise RuntimeError("no compiler")

    roof = {"copy": lambda: None, "triton_copy": lambda: None, "inductor": broken}
    measure._time_cold(b, ready, base, roof)
    b.writer.close()
    back = records.read_records(path)
    assert [(r["kind"], r["impl"]) for r in back] == [
        ("ceiling", "copy"),
        ("ceiling", "triton_copy"),
        ("timing", "triton"),
    ]
    assert back[2]["pct_ceiling"] == pytest.approx(100 * 19.0 / 20.0)
