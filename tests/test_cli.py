"""The command lines of harness.bench, validate, plot, report and sweep: bad arguments end
in a message naming the argument (argparse's exit 2) before any work, a filter or file
with nothing in it is an error, every option has help, and the no-GPU bench honours the
flags that apply. Also the plots' layout: no labels printed over each other, no legend
over data, no bar above the top tick.
"""

import argparse
import dataclasses
import itertools
import re
from pathlib import Path

import pytest
from test_harness import ENV, synthetic_records

from conftest import HAS_GPU, refusal
from harness import analysis, bench, gpus, plot, records, report, sweep, validate
from harness.ops import OPS
from rmsnorm_api import MAX_N

COMMITTED = bench.COMMITTED  # read at import, before any test patches it


def _bad_outs(tmp_path) -> list[tuple[str, str]]:
    """(--out value, what the message says): a file, a folder under a file, nothing."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    outs = [
        (str(a_file), "exists and is not a directory"),
        (str(a_file / "sub"), "is not a writable directory"),
        ("", "is empty"),
    ]
    if Path("/proc/self").is_dir():  # Linux: a tree no one can create folders in
        outs.append(("/proc/rmsnorm-x", "is not a writable directory"))
    return outs


def _no_work(monkeypatch):
    """Make any start of work a test failure: the --out check must come first."""

    def boom(*a, **k):
        raise AssertionError("work started before --out was checked")

    for name in ("run_gpu", "run_profile", "run_without_gpu"):
        monkeypatch.setattr(bench, name, boom)
    monkeypatch.setattr(plot, "draw", boom)
    monkeypatch.setattr(report, "write_report", boom)


# ---------------------------------------------------------------------------------------
# --out (bench, plot, report)
# ---------------------------------------------------------------------------------------


def test_out_dir_problem(tmp_path):
    assert records.out_dir_problem(tmp_path / "new" / "deep") is None
    assert (tmp_path / "new" / "deep").is_dir()
    for value, expected in _bad_outs(tmp_path):
        assert expected in records.out_dir_problem(value), value


def test_bad_out_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    synthetic = tmp_path / "records.jsonl"
    synthetic_records(synthetic)
    _no_work(monkeypatch)
    for value, expected in _bad_outs(tmp_path):
        for main, argv in (
            (bench.main, ["--out", value]),
            (bench.main, ["--out", value, "--require-gpu"]),
            (plot.main, [str(synthetic), "--out", value]),
            (report.main, [str(synthetic), "--out", value]),
        ):
            with pytest.raises(SystemExit) as e:
                main(argv)
            err = capsys.readouterr().err
            assert e.value.code == 2, (main, argv)
            assert f"error: --out {value}" in err and expected in err, err


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_bench_default_out_without_gpu_is_one_stated_place(tmp_path, monkeypatch, capsys):
    """The CI command, `python -m harness.bench`: exit 0, the committed records redrawn
    into NO_GPU_OUT, the same folder each run, named in the first line."""
    if not COMMITTED.exists():
        pytest.skip("no committed H200 records to redraw")
    fixed = tmp_path / "rmsnorm-bench"
    monkeypatch.setattr(bench, "NO_GPU_OUT", fixed)
    assert bench.main([]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert str(fixed) in first and "default output place without a GPU" in first
    for name in analysis.PLOT_NAMES + ("report.md",):
        assert (fixed / name).is_file(), name
    assert "NVIDIA H200" in (fixed / "report.md").read_text()
    assert bench.main([]) == 0
    assert str(fixed) in capsys.readouterr().out.splitlines()[0]
    assert list(tmp_path.iterdir()) == [fixed]  # the same folder again, no new one


# ---------------------------------------------------------------------------------------
# bench: every argument checked on any machine
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shapes", f"4x{MAX_N + 1}"], f"--shapes: 4x{MAX_N + 1} has N > {MAX_N}"),
        (["--shapes", "8x8,4x300000"], "--shapes: 4x300000 has N > 262144"),
        (["--shapes", ""], "--shapes"),
        (["--shapes", "4096by4096"], "--shapes"),
        (["--shapes", "0x4096"], "--shapes"),
        (["--quick", "--shapes", "8x8"], "exclusive"),
        (["--budget-s", "0"], "--budget-s"),
        (["--budget-s", "nan"], "--budget-s is nan"),
        (["--budget-s", "-1"], "--budget-s is -1.0"),
        (["--impls", ","], "--impls: ',' names nothing"),
        (["--impls", "triton,bogus"], "--impls: unknown bogus; choose from triton,cuda"),
        (["--dtypes", ""], "--dtypes: '' names nothing"),
        (["--dtypes", "fp8"], "--dtypes"),
        (["--dtypes", "bf16,fp8"], "--dtypes: unknown fp8"),
        (["--seed", "x"], "--seed"),
        (["--no-such-flag"], "unrecognized"),
        (
            ["--ops", "rms_norm,bogus"],
            "--ops: unknown bogus; choose from rms_norm,fused_add_rms_norm",
        ),
        (["--ops", ","], "--ops: ',' names nothing"),
        (["--ops", "fused_add"], "--ops: unknown fused_add"),
    ],
)
def test_bench_refuses_bad_arguments_on_any_machine(argv, message, monkeypatch, capsys):
    _no_work(monkeypatch)
    assert message in refusal(bench.main, argv, capsys)


def test_bench_ops_argument():
    """--ops: both ops by default, in harness.ops's order; a list picks and orders none of
    them differently; --impls is checked against the chosen ops' names."""
    assert bench.parse_args([]).ops == [OPS["rms_norm"], OPS["fused_add_rms_norm"]]
    args = bench.parse_args(["--ops", " fused_add_rms_norm ,fused_add_rms_norm"])
    assert args.ops == [OPS["fused_add_rms_norm"]]
    assert args.impls == list(OPS["fused_add_rms_norm"].order)
    assert bench.parse_args(["--ops", "fused_add_rms_norm,rms_norm"]).ops == [
        OPS["fused_add_rms_norm"],
        OPS["rms_norm"],
    ]


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_bench_without_gpu_checks_the_ops_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "COMMITTED", tmp_path / "none" / "records.jsonl")
    monkeypatch.setattr(bench, "REPO", tmp_path)
    argv = ["--ops", "fused_add_rms_norm", "--shapes", "5x4097", "--out", str(tmp_path / "o")]
    assert bench.main(argv + ["--dtypes", "fp16,fp32"]) == 0
    out = capsys.readouterr().out
    assert "(fused_add_rms_norm)" in out.splitlines()[0]
    lines = [ln.split()[1:3] for ln in out.splitlines() if ln.startswith("interpreter ")]
    assert lines == [["5x4097-fp16", "fused_add_rms_norm"], ["5x4097-fp32", "fused_add_rms_norm"]]
    assert out.count("PASS") == 2 and " rms_norm " not in out


def test_bench_accepts_the_widest_row():
    args = bench.parse_args(["--shapes", f"2x{MAX_N}"])
    assert args.shapes == [(2, MAX_N)] and args.budget_s is None and not args.impls_given


def test_bench_help_documents_the_no_gpu_mode(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for expected in ("without a GPU:", "interpreter", str(bench.NO_GPU_OUT), "--profile"):
        assert expected in text, expected


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_bench_without_gpu_honours_shapes_dtypes_impls(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "COMMITTED", tmp_path / "none" / "records.jsonl")
    monkeypatch.setattr(bench, "REPO", tmp_path)
    argv = [
        "--shapes",
        "64x8192,3x1000",
        "--dtypes",
        "fp32,bf16",
        "--impls",
        "triton,cuda,eager",
        "--profile",
        "--append",
        "--budget-s",
        "5",
        "--out",
        str(tmp_path / "o"),
    ]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("interpreter ")]
    ids = ["64x8192-fp32", "3x1000-fp32", "64x8192-bf16", "3x1000-bf16"]
    assert [ln.split()[1:3] for ln in lines] == [
        [case, op] for op in ("rms_norm", "fused_add_rms_norm") for case in ids
    ]
    assert all("PASS" in ln for ln in lines)
    # 64 x 8192 has 2^19 elements: cut to 2^18 // 8192 = 32 rows, as Case.cpu_cap does
    assert "M capped to 32 of 64" in lines[0] and "capped" not in lines[1]
    ignored = next(ln for ln in out.splitlines() if "do not apply" in ln)
    for flag in ("--profile", "--append", "--budget-s"):
        assert flag in ignored
    assert "--quick" not in ignored  # not given: not named
    assert "skip cuda: needs a CUDA GPU" in out and "skip eager: needs a CUDA GPU" in out
    # only GPU-side implementations named: each named as skipped, nothing checked, which
    # is exit 1 (validate's rule: test_validate_and_bench_share_the_exit_rule)
    assert bench.main(["--impls", "cuda", "--out", str(tmp_path / "o")]) == 1
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert validate.NOTHING_CHECKED in captured.err
    assert "skip cuda: needs a CUDA GPU" in out
    assert not any(ln.startswith("interpreter ") for ln in out)


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_bench_without_gpu_default_run_checks_every_dtype(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "COMMITTED", tmp_path / "none" / "records.jsonl")
    monkeypatch.setattr(bench, "REPO", tmp_path)
    assert bench.main(["--out", str(tmp_path / "o"), "--quick"]) == 0
    out = capsys.readouterr().out
    assert "ignored: --quick" in out
    assert "checking triton only: cuda, eager" in out
    # --quick: bf16 only, each op
    assert out.count("PASS") == len(bench.NO_GPU_SHAPES) * len(bench.DEFAULT_OPS)


# ---------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--cases", "nomatch"],
            "--cases: no case id of rms_norm, fused_add_rms_norm contains 'nomatch'",
        ),
        (["--ops", "rms_norm,backward"], "--ops: unknown backward; choose from rms_norm,"),
        (["--ops", ","], "--ops: ',' names nothing"),
        (["--impls", "bogus"], "--impls: unknown bogus; choose from triton,cuda"),
        (["--impls", "triton,,bogus"], "--impls: unknown bogus"),
        (["--impls", " , "], "--impls: ' , ' names nothing"),
        (["--impls", ""], "--impls: '' names nothing"),
        (["--seed", "1.5"], "--seed"),
    ],
)
def test_validate_refuses_bad_arguments(argv, message, capsys):
    assert message in refusal(validate.main, argv, capsys)


def test_validate_impls_parsing_and_one_case(capsys):
    p = validate.build_parser()
    assert validate.parse_impls(p, " triton , triton,cuda", ["triton", "cuda"]) == [
        "triton",
        "cuda",
    ]
    assert validate.parse_impls(p, None, ["triton", "cuda"]) == ["triton", "cuda"]
    argv = ["--impls", "triton, triton", "--cases", "n17-fp32", "--ops", "rms_norm"]
    assert validate.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[:3] for ln in out if "PASS" in ln] == [["rms_norm", "n17-fp32", "triton"]]
    assert out[-1] == "1 passed, 0 failed"


def test_validate_checks_each_op_as_bench_does(capsys):
    """--ops means what it means to harness.bench, with its default (the forward ops); each
    op is checked on its own cases, our kernels' second form included (the fused add in
    place), so a fused-add-only case is found."""
    assert validate.DEFAULT_OPS == bench.DEFAULT_OPS
    assert validate.main(["--impls", "triton", "--cases", "n17-fp32"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[:2] for ln in out if "PASS" in ln] == [
        [op, "n17-fp32"] for op in bench.DEFAULT_OPS
    ]
    # a case only the fused add has: the default finds it, rms_norm alone does not
    assert validate.main(["--impls", "triton", "--cases", "cancel-res-n4096-fp32"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[:2] for ln in out if "PASS" in ln] == [
        ["fused_add_rms_norm", "cancel-res-n4096-fp32"]
    ]
    assert "no case id of rms_norm contains" in refusal(
        validate.main, ["--ops", "rms_norm", "--cases", "cancel-res"], capsys
    )
    # every op has cases, and the gradient ops run: each by name, as bench takes them
    for op in OPS.values():
        assert op.cases(), op.name
    grads = ",".join(
        op.name for op in OPS.values() if op.grads and any(c.id == "n17-fp32" for c in op.cases())
    )
    assert "rms_norm_bwd" in grads.split(",")
    assert validate.main(["--impls", "triton", "--cases", "n17-fp32", "--ops", grads]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out if "PASS" in ln] == grads.split(",")


def test_validate_second_form_failure_is_a_failure(monkeypatch, capsys):
    """The fused add's in-place form is checked: one that writes nothing fails the case."""
    from harness import ops

    def writes_nothing(impl, inputs, ref):
        x, residual = inputs[0].clone(), inputs[1].clone()
        return x, residual  # the inputs back, not the sum or the norm

    bad = dataclasses.replace(ops.FUSED_ADD_RMS_NORM, second_form=writes_nothing)
    monkeypatch.setitem(validate.OPS, "fused_add_rms_norm", bad)
    argv = ["--impls", "triton", "--cases", "n17-fp32", "--ops", "fused_add_rms_norm"]
    assert validate.main(argv) == 1
    assert "0 passed, 1 failed" in capsys.readouterr().out


@pytest.mark.skipif(HAS_GPU, reason="tests the path taken without a GPU")
def test_validate_and_bench_share_the_exit_rule(tmp_path, monkeypatch, capsys):
    """One rule for both: an implementation that cannot run here is named as skipped and
    is not a failure; a run that checked nothing exits 1, saying so."""
    monkeypatch.setattr(bench, "COMMITTED", tmp_path / "none" / "records.jsonl")
    monkeypatch.setattr(bench, "REPO", tmp_path)
    out_dir = str(tmp_path / "o")
    shapes = ["--shapes", "3x17", "--dtypes", "fp32", "--ops", "rms_norm"]
    both = {
        "validate": lambda impls: validate.main(
            ["--impls", impls, "--cases", "n17-fp32", "--ops", "rms_norm"]
        ),
        "bench": lambda impls: bench.main(["--impls", impls, "--out", out_dir, *shapes]),
    }
    for name, main in both.items():
        assert main("cuda") == 1, name
        captured = capsys.readouterr()
        assert validate.NOTHING_CHECKED in captured.err, name
        assert "skip cuda" in captured.out and "needs a CUDA GPU" in captured.out, name
        assert main("triton,cuda") == 0, name
        captured = capsys.readouterr()
        assert "skip cuda" in captured.out and "PASS" in captured.out, name
        assert validate.NOTHING_CHECKED not in captured.err, name
    for build in (validate.build_parser, bench.build_parser):
        text = " ".join(build().format_help().split())
        assert "nothing at all could be checked" in text, build


# ---------------------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------------------


def test_sweep_refuses_bad_arguments_on_any_machine(capsys):
    """Checked before the GPU is looked for; the lists parsed as bench and validate do."""
    for flag, value, message in (
        ("--kernels", "triton,bogus", "unknown bogus; choose from triton,cuda"),
        ("--kernels", ",", "',' names nothing"),
        ("--dtypes", "fp8", "unknown fp8; choose from fp32,fp16,bf16"),
        ("--shapes", "4096by4096", "shape '4096by4096' is not MxN"),
    ):
        assert f"{flag}: {message}" in refusal(sweep.main, [flag, value], capsys)
    assert "--op: invalid choice: 'backward'" in refusal(sweep.main, ["--op", "backward"], capsys)
    group = ["--op", "fp8_rms_norm_group128", "--shapes", "8x1000"]
    assert "--shapes: 8x1000 has N not a multiple of 128" in refusal(sweep.main, group, capsys)
    for value, message in (
        ("reload=True", "expected KERNEL:FIELD=VALUE"),
        ("tpu:reload=True", "expected KERNEL:FIELD=VALUE"),
        ("triton:reload", "expected FIELD=VALUE, got 'reload'"),
        ("triton:reload=True,", "expected FIELD=VALUE, got ''"),
        ("cuda:reload=True", "cuda configs have no field reload"),
    ):
        assert f"--where: '{value}': {message}" in refusal(sweep.main, ["--where", value], capsys)


# ---------------------------------------------------------------------------------------
# plot and report: files with nothing to draw
# ---------------------------------------------------------------------------------------


def _write(path, recs):
    with records.RecordWriter(path, append=False) as w:
        for r in recs:
            w.write(r)
    return path


@pytest.mark.parametrize("main", [plot.main, report.main], ids=["plot", "report"])
def test_plot_and_report_refuse_files_with_nothing_to_draw(main, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    no_timing = _write(
        tmp_path / "copy-only.jsonl",
        [
            records.make_record(
                run_id="r", env=ENV, kind="copy", impl="copy", bytes=2, stats=None, status="SKIP"
            ),
            records.make_record(run_id="r", env=ENV, kind="skip", impl="quack", status="SKIP"),
        ],
    )
    out = tmp_path / "o"
    for path, message in (
        (empty, "holds no records"),
        (blank, "holds no records"),
        (no_timing, "holds no timing records (only copy, skip)"),
    ):
        assert main([str(path), "--out", str(out)]) == 1
        assert message in capsys.readouterr().err
        assert not out.exists()  # refused before anything was written
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "missing.jsonl")])
    assert e.value.code == 2
    assert "RECORDS: no such file" in capsys.readouterr().err


def test_report_cli(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    synthetic_records(path)
    with pytest.raises(SystemExit) as e:
        report.main(["--help"])
    assert e.value.code == 0
    assert "usage: python -m harness.report" in capsys.readouterr().out
    # beside RECORDS, no plots there: none linked
    assert report.main([str(path)]) == 0
    assert "wrote" in capsys.readouterr().out
    text = (tmp_path / "report.md").read_text()
    assert "SYNTHETIC" in text and "## Plots" not in text
    # plots already in --out are linked
    out = tmp_path / "drawn"
    plot.redraw(path, out)
    (out / "report.md").unlink()
    assert report.main([str(path), "--out", str(out)]) == 0
    assert "![speedup](speedup.png)" in (out / "report.md").read_text()


# ---------------------------------------------------------------------------------------
# help text for every option
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build", [bench.build_parser, validate.build_parser, plot.build_parser,
              report.build_parser, sweep.build_parser, gpus.build_parser],
    ids=["bench", "validate", "plot", "report", "sweep", "gpus"],
)  # fmt: skip
def test_every_option_has_help(build):
    p = build()
    missing = [
        a.option_strings or a.dest
        for a in p._actions
        if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()
    ]
    assert not missing, f"{p.prog}: no help for {missing}"
    p.format_help()  # every %-placeholder in the help texts formats


# ---------------------------------------------------------------------------------------
# plot layout, from the synthetic run and from the committed H200 run
# ---------------------------------------------------------------------------------------


@pytest.fixture(params=["synthetic", "committed", "synthetic-fused-add"])
def run_records(request, tmp_path):
    """(records of one op, the op): each op's plots are held to the same layout."""
    if request.param == "committed":
        if not COMMITTED.exists():
            pytest.skip("no committed H200 records")
        return analysis.by_op(analysis.load(COMMITTED))[OPS["rms_norm"]], OPS["rms_norm"]
    path = tmp_path / "s.jsonl"
    synthetic_records(path, fused=request.param.endswith("fused-add"))
    op = OPS["fused_add_rms_norm" if request.param.endswith("fused-add") else "rms_norm"]
    return analysis.by_op(analysis.load(path))[op], op


@pytest.fixture
def figures(monkeypatch):
    """Keep each figure plot.save would write and close, to inspect its layout."""
    import matplotlib.pyplot as plt

    kept = {}

    def keep(fig, path):
        fig.tight_layout()
        fig.canvas.draw()
        kept[Path(path).name] = fig
        return path

    monkeypatch.setattr(plot, "save", keep)
    yield kept
    for fig in kept.values():
        plt.close(fig)


def _overlaps(boxes) -> list:
    return [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]


def test_bandwidth_vs_n_labels_and_legend(run_records, figures, tmp_path):
    recs, op = run_records
    fig = figures[plot.plot_bandwidth_vs_n(recs, tmp_path, op).name]
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        assert ax.get_legend() is None  # the legend is the figure's, under the panels
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert all(int(t.get_text()) & (int(t.get_text()) - 1) == 0 for t in labels)
        assert not _overlaps([t.get_window_extent(renderer) for t in labels])
        assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]
        ax_box = ax.get_window_extent(renderer)
        for legend in fig.legends:
            assert not legend.get_window_extent(renderer).overlaps(ax_box)
    assert len(fig.legends) == 1


def test_speedup_labels_and_limits(run_records, figures, tmp_path):
    recs, op = run_records
    fig = figures[plot.plot_speedup(recs, tmp_path, op).name]
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        values = [t for t in ax.texts if t.get_text().endswith("x")]
        assert values
        assert not _overlaps([t.get_window_extent(renderer) for t in values])
        lo, hi = ax.get_ylim()
        ticks = [v for v in ax.get_yticks() if lo <= v <= hi]
        tallest = max(p.get_height() for p in ax.patches)
        assert max(ticks) >= tallest  # no bar runs past the top labelled tick
        ax_box = ax.get_window_extent(renderer)
        assert all(ax_box.contains(*t.get_window_extent(renderer).max) for t in values)
        legend = ax.get_legend().get_window_extent(renderer)
        assert not any(legend.overlaps(t.get_window_extent(renderer)) for t in values)
        assert not any(
            legend.overlaps(p.get_window_extent(renderer)) for p in ax.patches if p.get_height()
        )


def test_small_shapes_legend_covers_no_bar(run_records, figures, tmp_path):
    recs, op = run_records
    fig = figures[plot.plot_small(recs, tmp_path, op).name]
    renderer = fig.canvas.get_renderer()
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    legend = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_window_extent(renderer))


# ---------------------------------------------------------------------------------------
# the newcomer's first commands: README's quickstart and what git ignores
# ---------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def test_readme_makes_the_venv_before_installing():
    """README's first command block creates and enters the virtual environment before its
    pip install, so a literal reader installs into it; and it says what the build and the
    tests take, not 'a few minutes'."""
    text = (REPO / "README.md").read_text()
    first = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first[0] == "python -m venv .venv && . .venv/bin/activate"
    assert "pip install" in first[1]
    flat = " ".join(text.split())
    assert "one to a few minutes" not in flat
    # the build's and the default tier's times, as measured (minutes and seconds)
    measured = flat.split("Measured from a fresh clone", 1)[1].split(".", 1)[0]
    assert len(re.findall(r"\d+ min \d+ s", measured)) == 2, measured


def test_the_venv_is_ignored():
    import subprocess

    got = subprocess.run(["git", "check-ignore", "-q", ".venv/bin/python"], cwd=REPO, check=False)
    assert got.returncode == 0, ".venv/ is not in .gitignore"


@pytest.mark.parametrize(
    "build", [bench.build_parser, validate.build_parser], ids=["bench", "validate"]
)
@pytest.mark.parametrize("columns", ["60", "80", "100"])
def test_help_keeps_op_names_whole(build, columns, monkeypatch):
    """--help never breaks an op name across lines, at any terminal width."""
    monkeypatch.setenv("COLUMNS", columns)
    words = {w.strip(",;()") for w in build().format_help().split()}
    for name in OPS:
        assert name in words, (name, columns)


def test_every_op_has_inputs_at_its_interpreter_shapes():
    """bench without a GPU checks each op under the interpreter on its own shapes (the QK
    ops: whole tokens of their heads), so every op's inputs can be made at them."""
    import torch

    from harness.cases import Case

    for op in OPS.values():
        for name, shape in op.no_gpu_shapes or bench.NO_GPU_SHAPES:
            case = Case(name, shape, torch.bfloat16).cpu_cap()
            assert op.make_inputs(case, "cpu", 0)[0].numel() == case.m * case.n, (op.name, name)


def _ours_span(ratios: dict, ops, keep) -> str:
    """The range of CUDA's time / Triton's (analysis.ours_ratios, an op each) over ops'
    (dtype, N) that keep takes, as README writes it: "0.95-1.04"."""
    vals = [v for o in ops for d, pts in ratios[o].items() for n, v in pts if keep(d, n)]
    return f"{min(vals):.2f}-{max(vals):.2f}"


def test_readme_triton_against_cuda_figures_are_the_records():
    """README's words under triton_vs_cuda.png, read back from the committed run of record:
    each range of CUDA's time / Triton's it quotes is the records' (to two places)."""
    if not COMMITTED.exists():
        pytest.skip("no committed H200 records")
    ratios = {
        op.name: analysis.ours_ratios(r, "grid", op)
        for op, r in analysis.by_op(analysis.load(COMMITTED)).items()
    }

    def span(ops, keep):
        return _ours_span(ratios, ops, keep)

    def pow2(n):
        return n & (n - 1) == 0

    fwd = ("rms_norm", "fused_add_rms_norm")
    words = " ".join((REPO / "README.md").read_text().split())
    for quoted in (
        f"The forward ops at {span(fwd, lambda d, n: n <= 32768)} to 32768",
        f"rms_norm at {span(['rms_norm'], lambda d, n: n >= 65536 and d != 'fp32')} in 16-bit",
        f"({span(['rms_norm'], lambda d, n: n >= 65536 and d == 'fp32')} in fp32)",
        "the fused add at "
        + span(["fused_add_rms_norm"], lambda d, n: n >= 65536 and (d, n) != ("fp32", 262144)),
        f"fp32 262144: {dict(ratios['fused_add_rms_norm']['fp32'])[262144]:.2f}",
        "rms_norm's backward at "
        + span(["rms_norm_bwd"], lambda d, n: d != "fp32" and pow2(n) and n <= 16384)
        + " at 16-bit power-of-two widths to 16384",
        f"{span(['rms_norm_bwd'], lambda d, n: n in (4095, 4097))} at 4095 and 4097",
        f"{span(['rms_norm_bwd'], lambda d, n: n >= 32768)} at 32768-65536",
    ):
        assert quoted in words, quoted


def test_readme_answer_figures_are_the_records():
    """README's one-paragraph answer, read back: the ratios from the committed run of
    record, Triton's kernels and both languages' lines from this tree (harness.cost's
    counts, in thousands to one place), Triton's median first call from the records."""
    if not COMMITTED.exists():
        pytest.skip("no committed H200 records")
    from harness import cost

    by_op = analysis.by_op(analysis.load(COMMITTED))
    ratios = {op.name: analysis.ours_ratios(r, "grid", op) for op, r in by_op.items()}

    def span(ops, keep):
        return _ours_span(ratios, ops, keep)

    fwd = ("rms_norm", "fused_add_rms_norm")
    peer = [
        (n, v)
        for op, r in by_op.items()
        if op.name in fwd
        for d, per in analysis.best_peer_ratios(r, "grid", op).items()
        if d != "fp32"
        for impl in ("triton", "cuda")
        for n, v in per[impl]
    ]
    odd = [v for n, v in peer if n in (4095, 4097)]
    llm = [v for n, v in peer if 4096 <= n <= 32768 and n != 4097]
    plain = next(op for op in by_op if op.name == "rms_norm")
    first = {f["impl"]: f["median_s"] for f in analysis.first_calls(by_op[plain], plain)}
    lines = {
        "triton": cost.lines_of(REPO / "triton_impl", (".py",)),
        "cuda": cost.lines_of(REPO / "cuda_impl", cost.CUDA_SOURCES),
    }
    words = " ".join((REPO / "README.md").read_text().split())
    answer = words.split("**Which to pick.**", 1)[1].split("###", 1)[0]
    for quoted in (
        f"Triton's {span(fwd, lambda d, n: n <= 32768)} in the forward ops to 32768",
        "("
        + span(["rms_norm_bwd"], lambda d, n: d != "fp32" and n & (n - 1) == 0 and n <= 16384)
        + ")",
        f"ratio is {span(['rms_norm'], lambda d, n: n >= 65536 and d != 'fp32')} in 16-bit",
        f"Triton {cost.triton_kernels(REPO / 'triton_impl')} kernels in "
        f"{lines['triton'] / 1000:.1f}k lines",
        f"(median {first['triton']:.2f} s)",
        f"kernels in {lines['cuda'] / 1000:.1f}k lines, built ahead",
        f"({min(odd):.2f}-{max(odd):.2f}x the best peer, 16-bit 4095 / 4097:",
        f"range from {min(llm):.2f}x to {max(llm):.2f}x it",
    ):
        assert quoted in answer, quoted
    # best_peer.png's caption names the same leads
    assert f"the odd widths' {min(odd):.2f}-{max(odd):.2f}x leads (16-bit)" in words
    # the cost table's lines row says the same
    assert (
        f"| lines of kernel and launch code | {lines['triton'] / 1000:.1f}k (`triton_impl/`, "
        f"Python) | {lines['cuda'] / 1000:.1f}k (`cuda_impl/`:" in words
    )
    # FINDINGS' one screen opens with the same paragraph, in the same words
    findings = " ".join((REPO / "docs" / "FINDINGS.md").read_text().split())
    assert answer.split("(FINDINGS,", 1)[0] in findings


def test_readme_odd_widths_figures_are_the_records():
    """README's words under odd_widths.png, read back from the committed run of record."""
    if not COMMITTED.exists():
        pytest.skip("no committed H200 records")
    got = {
        op.name: analysis.odd_widths(r)
        for op, r in analysis.by_op(analysis.load(COMMITTED)).items()
    }
    fwd = ("rms_norm", "fused_add_rms_norm")
    grads = [name for name in got if name not in fwd]

    def span(ops, pick):
        vals = [v for o in ops for n in (4095, 4097) for k, v in got[o][n].items() if pick(k)]
        return f"{min(vals):.0f}-{max(vals):.0f}"

    def ours(k):
        return k in ("triton", "cuda")

    def best_peers(ops):  # each op and width's best peer, as a range over them
        vals = [
            max(v for k, v in got[o][n].items() if not ours(k) and k != "eager")
            for o in ops
            for n in (4095, 4097)
        ]
        return f"{min(vals):.0f}-{max(vals):.0f}"

    words = " ".join((REPO / "README.md").read_text().split())
    for quoted in (
        f"kernels hold {span(fwd, ours)}% in the forward ops and {span(grads, ours)}% in the",
        f"falls to {best_peers(fwd)}% (forward) and {best_peers(grads)}% (gradients)",
        f"compile keeps pace in rms_norm ({got['rms_norm'][1000]['compile']:.0f}%)",
    ):
        assert quoted in words, quoted


def test_bench_ops_all_is_every_op():
    """--ops all: the run of record's every op and variant, in OPS' order."""
    assert [op.name for op in bench.parse_args(["--ops", "all"]).ops] == list(OPS)
