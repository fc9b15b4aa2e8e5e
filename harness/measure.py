"""One shape, measured: check every implementation on the op's inputs, then time it.

For each planned shape (harness.plan), in order:
1. fresh seeded inputs from the op's factory (harness.ops; for rms_norm x ~ randn,
   weight ~ 1 + randn/2, x's dtype, eps 1e-6; the fused add adds a randn residual in x's
   dtype) and the op's reference on them;
2. per implementation: prepare (compile's fresh per-shape compile, timed apart; the
   backward alone's forward, run once with its graph kept), check against the reference on
   those very inputs (harness.reference.TOL; gradients: grad_close); a failure is written
   as FAIL and never timed; one profiled call per implementation and shape class records
   the kernels that ran;
3. warm-up, then three cold-timing blocks with the implementations interleaved, and with
   them, at shapes that are not small, the forward ops' ceiling kernels (harness.ceiling),
   the fastest of which is the shape's ceiling each record's pct_ceiling is a share of;
4. for small shapes also CUDA-graph device time and host time per call, the
   implementations interleaved in both.
Each record is written as soon as it is measured (a small shape's graph and host records
once every implementation's interleaved samples are in). ``start`` opens a run: the
environment, the theoretical peak and the measured copy ceiling, written first.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from harness import analysis, ceiling, hardware, records, timing
from harness.impls import Impl
from harness.ops import RMS_NORM, Op
from harness.plan import Planned, shape_class
from harness.validate import check

# ---------------------------------------------------------------------------------------
# what ran: profiler and Triton register counts
# ---------------------------------------------------------------------------------------


def kernel_times(call: Callable[[], object], calls: int = 1) -> dict[str, dict]:
    """The device kernels of ``calls`` calls under torch.profiler, per call:
    {name: {"count": launches, "us": summed device microseconds}}."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    found: dict[str, dict] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        k = found.setdefault(e.name, {"count": 0, "us": 0.0})
        k["count"] += 1
        k["us"] += e.time_range.elapsed_us()
    return {n: {"count": k["count"] / calls, "us": k["us"] / calls} for n, k in found.items()}


def kernels_of(call, name: str, op: Op = RMS_NORM) -> dict:
    """The device kernels one call launches: {names, count, path} (path: kernel_path)."""
    times = kernel_times(call)
    names = [n for n, k in times.items() for _ in range(round(k["count"]))]
    path = kernel_path(name, names, grads=op.grads)
    return {"names": sorted(times), "count": len(names), "path": path}


def kernel_path(name: str, names: list[str], grads: bool = False) -> Optional[str]:
    """What the kernel names one call of implementation ``name`` launched prove, or None.

    native: "fused" when the norm ran as one kernel of its own (PyTorch's elementwise
    kernels beside it, the fused add's add and any cast, are not the norm), else
    "composite"; of a gradient op (``grads``) no claim, None: its backward's kernels (dx,
    dweight and their reduction) are listed by name. compile: "inductor" when Inductor's
    generated triton_* kernels ran, else "NOT-COMPILED" (it fell back to eager)."""
    if name == "native" and grads:
        return None
    if name == "native":
        norm = [n for n in names if "elementwise_kernel" not in n]
        return "fused" if len(norm) == 1 and "norm" in norm[0].lower() else "composite"
    if name == "compile":
        return "inductor" if any(n.startswith("triton_") for n in names) else "NOT-COMPILED"
    return None


def _resources(impl: Impl, inputs: tuple) -> Optional[list[dict]]:
    """What the kernel an implementation of ours launches for these inputs uses (None for
    peers). resources takes the op's tensors: its inputs less the trailing eps."""
    if impl.resources is None:
        return None
    try:
        return [impl.resources(*inputs[:-1])]
    except Exception as e:  # recorded, never fatal: the timing does not depend on it
        return [{"error": first_line(e)}]


@dataclass
class Bench:
    """What every shape's measurement shares."""

    run_id: str
    env: dict
    writer: records.RecordWriter
    flush: timing.L2Flush
    small_bytes: float
    seed: int
    op: Op = RMS_NORM  # the op measured now: a run of several ops sets it before each shape
    device: str = "cuda"  # where inputs are made (tests check the bookkeeping on "cpu")
    kernels: dict = field(default_factory=dict)  # (op, impl, class) -> kernels_of(...)
    ours_failed: int = 0

    def write(self, impl: str, kind: str = "timing", **fields) -> dict:
        rec = records.make_record(
            run_id=self.run_id, env=self.env, kind=kind, op=self.op.name, impl=impl, **fields
        )
        self.writer.write(rec)
        return rec


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {records.plain_text(text[0]) if text else ''}"


def validate_impl(
    impl: Impl, inputs: tuple, ref, op: Op = RMS_NORM
) -> tuple[Optional[object], Optional[float], dict]:
    """Prepare and check one implementation on these inputs: (fn or None, compile_s, correct).

    compile_s is the wall time of the first call at this shape, kept out of the timing:
    torch.compile's trace and codegen (its ``prepare``), or for the others whatever JIT
    compilation a new shape triggers (Triton kernels, QuACK's CuTe DSL), plus one run."""
    compile_s = None
    try:
        fn = impl.fn
        if impl.prepare is not None:
            fn, compile_s = impl.prepare(*inputs)
        else:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(*inputs)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
        a, r, ok, err = check(dataclasses.replace(impl, fn=fn), *inputs, ref, op=op)
        torch.cuda.synchronize()
    except Exception as e:  # a crash or a refusal is this shape's failure, reported
        a, r, ok, err = math.nan, math.nan, False, first_line(e)
    correct = {"max_abs": a, "max_rel": r, "passed": ok, "error": err}
    return (fn if ok else None), compile_s, correct


def measure_shape(b: Bench, p: Planned, impls: list[Impl]) -> None:
    """Check, profile and time every implementation at one shape; write its records."""
    inputs = b.op.make_inputs(p, b.device, shape_seed(b.seed, p))
    base = shape_fields(b, p, inputs)
    ready = _check_all(b, impls, inputs, base)
    if ready:
        roof = {} if base["small"] else ceiling.calls(b.op.name, inputs)
        _time_cold(b, ready, base, roof)
    if ready and base["small"]:
        _time_small(b, ready, base)


def write_skipped(b: Bench, impl: str, p: Planned, why: str = "time budget spent") -> dict:
    """The record of a shape not run."""
    return b.write(
        impl,
        kind="skip",
        status="SKIP",
        dtype=p.dtype,
        shape=[p.m, p.n],
        sections=p.sections,
        notes=[f"not run: {why}"],
    )


def shape_seed(seed: int, p: Planned) -> int:
    """The seed of a shape's inputs: the run's, moved by M and N."""
    return seed + p.m * 131 + p.n


def shape_fields(b: Bench, p: Planned, inputs: tuple) -> dict:
    """The fields every record of this shape carries: dtype, shape, sections, its class,
    the op's bytes for these inputs, and whether that is small (under L2 or ~20 us)."""
    nbytes = b.op.bytes_moved(inputs)
    small = nbytes < b.small_bytes
    return dict(
        dtype=p.dtype,
        shape=[p.m, p.n],
        sections=p.sections,
        shape_class=shape_class(p.dtype, p.n, small),
        bytes=nbytes,
        small=small,
    )


def _check_all(b: Bench, impls: list[Impl], inputs: tuple, base: dict) -> dict[str, dict]:
    """Validate each implementation on the inputs; write FAIL records; profile the first of
    a shape class. Returns {name: {call, compile_s, correct, kernels, resources, notes}}."""
    from tqdm import tqdm

    ref = b.op.reference(*inputs)
    cls, (m, n) = base["shape_class"], base["shape"]
    ready: dict[str, dict] = {}
    for impl in impls:
        fn, compile_s, correct = validate_impl(impl, inputs, ref, b.op)
        if fn is None:
            b.ours_failed += impl.ours
            tqdm.write(f"FAIL {impl.name} {base['dtype']} {m}x{n}: {correct['error']}")
            b.write(
                impl.name,
                mode="cold",
                status="FAIL",
                correct=correct,
                compile_s=compile_s,
                notes=list(impl.notes),
                **base,
            )
            continue
        call = functools.partial(fn, *inputs)
        key = (b.op.name, impl.name, cls)  # the same name runs other kernels for another op
        if key not in b.kernels:
            try:
                found = kernels_of(call, impl.name, b.op)
            except Exception as e:
                found = {"names": [], "count": 0, "path": f"profiler failed: {first_line(e)}"}
            b.kernels[key] = {"class": cls, "profiled_shape": [m, n], **found}
        resources = _resources(impl, inputs)
        ready[impl.name] = dict(
            call=call,
            compile_s=compile_s,
            correct=correct,
            kernels=b.kernels[key],
            resources=resources,
            notes=impl.notes,
        )
    return ready


def _warm_ceilings(roof: dict[str, Callable]) -> dict[str, Callable]:
    """The ceiling kernels that ran in a warm-up (one that raised, e.g. a compile that
    failed, is left out and said)."""
    from tqdm import tqdm

    kept = {}
    for name, call in roof.items():
        try:
            timing.warm_up([call], timing.WARMUP_S / 4)
            kept[name] = call
        except Exception as e:
            tqdm.write(f"ceiling {name} left out: {first_line(e)}")
    return kept


def _time_cold(
    b: Bench, ready: dict[str, dict], base: dict, roof: Optional[dict[str, Callable]] = None
) -> None:
    """Warm up, then three interleaved cold blocks: one PASS record per implementation, and
    one per ceiling kernel of roof (its name -> a call), timed in the same blocks."""
    # warm-up, each implementation on its own so one that breaks now is dropped, not fatal
    for name in list(ready):
        try:
            timing.warm_up([ready[name]["call"]], timing.WARMUP_S / len(ready))
        except Exception as e:
            r = ready.pop(name)
            r["correct"] = {**r["correct"], "passed": False, "error": first_line(e)}
            b.write(
                name,
                mode="cold",
                status="FAIL",
                correct=r["correct"],
                notes=["raised in warm-up"],
                **base,
            )
    if not ready:
        return
    roof = _warm_ceilings(roof or {})
    fns = {name: r["call"] for name, r in ready.items()}
    fns.update({f"ceiling:{name}": call for name, call in roof.items()})
    blocks, clk = time_blocks(b, fns)
    roofs = [
        b.write(
            name,
            kind="ceiling",
            mode="cold",
            status="PASS",
            clocks=clk,
            **cold_fields(b, blocks[f"ceiling:{name}"], base),
            notes=["L2 flushed before each repetition"],
            **base,
        )
        for name in roof
    ]
    top = analysis.ceilings(roofs).get((base["dtype"], *base["shape"]))
    for name, r in ready.items():
        fields = cold_fields(b, blocks[name], base)
        if top and fields["gbps"]:
            fields["pct_ceiling"] = 100 * fields["gbps"] / top[1]
        b.write(
            name,
            mode="cold",
            status="PASS",
            correct=r["correct"],
            **fields,
            kernels=r["kernels"],
            compile_s=r["compile_s"],
            resources=r["resources"],
            clocks=clk,
            notes=list(r["notes"]) + ["L2 flushed before each repetition"],
            **base,
        )


def time_blocks(b: Bench, fns: dict) -> tuple[dict[str, list], Optional[dict]]:
    """Three interleaved cold blocks of every call in fns (L2 flushed before each
    repetition): ({name: blocks of seconds}, the clocks over the timing)."""
    reps = {name: timing.reps_for(timing.estimate_s(f, b.flush)) for name, f in fns.items()}
    clk0 = hardware.clocks()
    blocks = timing.interleaved(fns, reps, b.flush)
    return blocks, _merge_clocks(clk0, hardware.clocks())


def cold_fields(b: Bench, blocks: list, base: dict) -> dict:
    """A cold PASS record's numbers from its blocks: samples, per-block and overall
    statistics, spread, GB/s at the median, p80 and p20 times, % of peak and of copy."""
    per_block, stats, spr = timing.block_summary(blocks)
    nbytes, small = base["bytes"], base["small"]
    gb = records.gbps(nbytes, stats["median_us"] * 1e-6)
    return dict(
        samples_us=[v for blk in blocks for v in timing.to_us(blk)],
        blocks=per_block,
        stats=stats,
        spread=spr,
        gbps=gb,
        gbps_lo=records.gbps(nbytes, stats["p80_us"] * 1e-6),
        gbps_hi=records.gbps(nbytes, stats["p20_us"] * 1e-6),
        pct_peak=_pct(gb, b.env.get("peak_gbps"), small),
        pct_copy=_pct(gb, b.env.get("copy_gbps"), small),
    )


def _time_small(b: Bench, ready: dict[str, dict], base: dict) -> None:
    """Small shapes: CUDA-graph device time and host time per call, a record each."""
    notes = {
        "graph": "CUDA-graph replay of 20 back-to-back calls, L2 warm, replays interleaved",
        "host": "host wall time per call, 100 calls without sync, repeats interleaved",
    }
    clk = hardware.clocks()
    fns = {name: r["call"] for name, r in ready.items()}
    timed = {}
    for mode, sampler in (("graph", timing.graph_interleaved), ("host", timing.host_interleaved)):
        got, err = timing.maybe(functools.partial(sampler, fns))
        timed[mode] = got if got is not None else dict.fromkeys(fns, (None, err))
    for name, r in ready.items():
        for mode in ("graph", "host"):
            got, err = timed[mode][name]
            if got is None:
                b.write(
                    name,
                    mode=mode,
                    status="SKIP",
                    kernels=r["kernels"],
                    notes=[f"{mode} timing failed: {err}"],
                    **base,
                )
                continue
            us = timing.to_us(got)
            stats = timing.summarize(us)
            gb = records.gbps(base["bytes"], stats["median_us"] * 1e-6)
            b.write(
                name,
                mode=mode,
                status="PASS",
                correct=r["correct"],
                samples_us=us,
                stats=stats,
                kernels=r["kernels"],
                clocks=clk,
                gbps=gb if mode == "graph" else None,
                notes=[notes[mode]],
                **base,
            )


def _pct(gb: Optional[float], top: Optional[float], small: bool) -> Optional[float]:
    """gb as % of a ceiling; None for small shapes, whose bytes need not come from HBM."""
    return 100 * gb / top if gb and top and not small else None


def _merge_clocks(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """The clock reading after timing, marked throttled if either reading was."""
    if after is None:
        return before
    merged = dict(after)
    merged["throttled"] = bool(after.get("throttled") or (before or {}).get("throttled"))
    merged["reasons"] = sorted(
        set(after.get("reasons", [])) | set((before or {}).get("reasons", []))
    )
    merged["sm_mhz_before"] = (before or {}).get("sm_mhz")
    return merged


# ---------------------------------------------------------------------------------------
# a run's start: environment, ceilings, the records file
# ---------------------------------------------------------------------------------------


def start(path: Path, *, append: bool, seed: int, op: Op = RMS_NORM) -> Bench:
    """Measure the environment, the theoretical peak and the copy ceiling, open the
    records file at path and write the copy record: what every run's records share."""
    env = hardware.environment()
    peak = hardware.theoretical_peak()
    print(
        f"{env['gpu']}: peak {peak['gbps'] or float('nan'):.0f} GB/s ({peak['source']}); "
        "measuring the copy ceiling ...",
        flush=True,
    )
    copy = hardware.copy_ceiling()
    env.update(
        peak_gbps=peak["gbps"],
        peak_source=peak["source"],
        mem_clock_mhz=peak["mem_clock_mhz"],
        bus_width_bits=peak["bus_width_bits"],
        copy_gbps=copy["gbps"],
    )
    print(f"copy ceiling {copy['gbps']:.0f} GB/s (1 GiB device-to-device, read + written)")
    l2 = env["l2_bytes"] or (50 << 20)
    b = Bench(
        run_id=records.new_run_id(),
        env=env,
        writer=records.RecordWriter(path, append=append),
        flush=timing.L2Flush(l2),
        small_bytes=max(l2, 20e-6 * copy["gbps"] * 1e9),
        seed=seed,
        op=op,
    )
    copy_stats = timing.summarize(copy["samples_us"])
    b.write(
        "copy",
        kind="copy",
        bytes=copy["bytes"],
        samples_us=copy["samples_us"],
        stats=copy_stats,
        gbps=copy["gbps"],
        gbps_lo=records.gbps(copy["bytes"], copy_stats["p80_us"] * 1e-6),
        gbps_hi=records.gbps(copy["bytes"], copy_stats["p20_us"] * 1e-6),
        pct_peak=100 * copy["gbps"] / peak["gbps"] if peak["gbps"] else None,
        clocks=hardware.clocks(),
        notes=["torch copy_ of 1 GiB, bytes read + written"],
    )
    return b
