"""How a kernel is timed (cold L2, warm-up, interleaved blocks), and the statistics every
record carries.

Cold timing, the headline: before each repetition a buffer >= 4x the L2 size is zeroed,
outside the timed event pair, so every repetition reads x from HBM. Start and end are
CUDA events recorded on the current stream around one call; there is no sync between
repetitions (the flush kernel separates them), one sync at the end of a batch. A GPU sleep
queued ahead of each batch lets the host enqueue the whole batch before the GPU reaches
it: without it, a call whose host-side launch is slower than the flush (Python launchers:
Triton, Liger) leaves the GPU idle between its start event and its kernel, and that idle
gap, host time, is counted as device time (the figures: docs/notebook/01-why-the-defaults.md,
"Harness").

Drift control: ``interleaved`` runs three blocks per shape; inside each block every
implementation runs its repetitions in turn, and the order rotates from block to block, so
a change of clock or temperature hits all implementations alike. Each block keeps its own
median; the spread of the block medians is the noise floor of the comparison.

Small shapes (working set under L2, or a few microseconds): a single call is dominated by
launch and the flush, so they also get ``graph_samples`` (device time per call under
CUDA-graph replay of back-to-back calls, L2 warm) and ``host_samples`` (wall time per call
of a loop of calls without sync: what the CPU pays to launch), each with the
implementations' replays or repeats interleaved (``graph_interleaved``,
``host_interleaved``), as the cold blocks are.

The statistics helpers at the top are pure Python and testable without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Optional, TypeVar

import torch

_T = TypeVar("_T")

#: Blocks per shape; implementations are interleaved inside each block.
BLOCKS = 3
#: Cold repetitions per implementation and block are chosen to fill about this much time.
TARGET_BLOCK_S = 0.015
MIN_REPS, MAX_REPS = 10, 100
#: Warm-up per shape, shared round-robin by all implementations (hundreds of ms).
WARMUP_S = 0.2
#: Host time budgeted to enqueue one cold repetition (flush, two events, one call), at
#: least; the GPU sleeps this long per repetition before a batch, so it never waits for the
#: host. A call whose host time is longer (autograd's forward + backward) is budgeted
#: HOST_LEAD_MARGIN times its own, measured on an untimed call before the batch.
HOST_LEAD_S_PER_REP = 250e-6
HOST_LEAD_MARGIN = 2.0
#: Cycles per second assumed for torch.cuda._sleep: the highest SM clock of the GPUs in
#: view (H100/H200 boost at 1.98 GHz); a slower clock only lengthens the sleep.
SLEEP_CLOCK_HZ = 2.0e9


# ---------------------------------------------------------------------------------------
# statistics (pure)
# ---------------------------------------------------------------------------------------


def quantile(samples: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) with linear interpolation between order statistics."""
    if not samples:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: q is {q}; expected 0 <= q <= 1")
    s = sorted(samples)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples_us: Sequence[float]) -> dict:
    """Median, p20, p80, min, max, mean and count of samples in microseconds."""
    return {
        "median_us": quantile(samples_us, 0.5),
        "p20_us": quantile(samples_us, 0.2),
        "p80_us": quantile(samples_us, 0.8),
        "min_us": min(samples_us),
        "max_us": max(samples_us),
        "mean_us": sum(samples_us) / len(samples_us),
        "n": len(samples_us),
    }


def spread(block_medians: Sequence[float]) -> float:
    """(max - min) / median of the block medians: 0.02 means blocks disagree by 2%."""
    if len(block_medians) < 2:
        return 0.0
    mid = quantile(block_medians, 0.5)
    return (max(block_medians) - min(block_medians)) / mid if mid > 0 else float("nan")


def reps_for(estimate_s: float, target_s: float = TARGET_BLOCK_S) -> int:
    """Repetitions per block for a call of ``estimate_s`` seconds, in [MIN_REPS, MAX_REPS]."""
    if estimate_s <= 0 or not math.isfinite(estimate_s):
        return MAX_REPS
    return max(MIN_REPS, min(MAX_REPS, round(target_s / estimate_s)))


def rotations(names: Sequence[str], blocks: int = BLOCKS) -> list[list[str]]:
    """The order of implementations in each block: rotated by one per block."""
    k = len(names)
    return [[names[(b + i) % k] for i in range(k)] for b in range(blocks)] if k else []


# ---------------------------------------------------------------------------------------
# device timing
# ---------------------------------------------------------------------------------------


class L2Flush:
    """Zeroes a buffer of at least 4x the L2 size: after it, nothing of x is in L2."""

    def __init__(self, l2_bytes: int, device: torch.device | str = "cuda") -> None:
        self.nbytes = max(4 * int(l2_bytes), 64 << 20)
        self.buf = torch.empty(self.nbytes, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def event_pairs(n: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
    """n (start, end) timing events; ``record()`` puts them on the current stream."""
    return [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(n)
    ]


def elapsed_s(pairs: Sequence[tuple[torch.cuda.Event, torch.cuda.Event]]) -> list[float]:
    """Seconds between each start and end event (call after a synchronize)."""
    return [start.elapsed_time(end) * 1e-3 for start, end in pairs]


def lead_cycles(reps: int, host_s_per_rep: float = 0.0) -> int:
    """GPU sleep cycles that give the host time to enqueue ``reps`` cold repetitions, each
    taking host_s_per_rep of host time (measured; HOST_LEAD_S_PER_REP at least)."""
    per_rep = max(HOST_LEAD_S_PER_REP, HOST_LEAD_MARGIN * host_s_per_rep)
    return int(reps * per_rep * SLEEP_CLOCK_HZ)


def sleep_ahead(rep: Callable[[], object], reps: int) -> None:
    """Run one untimed repetition, then queue a GPU sleep long enough for the host to
    enqueue ``reps`` more (lead_cycles of its host time), outside every event pair: when the
    host falls behind, the GPU idles inside event pairs and the samples time the host."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    rep()
    torch.cuda._sleep(lead_cycles(reps, time.perf_counter() - t0))


def cold_samples(fn: Callable[[], object], reps: int, flush: L2Flush) -> list[float]:
    """Seconds per call for ``reps`` calls, each after an L2 flush outside its events."""
    pairs = event_pairs(reps)
    sleep_ahead(lambda: (flush(), fn()), reps)
    for start, end in pairs:
        flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return elapsed_s(pairs)


def warm_up(fns: Sequence[Callable[[], object]], seconds: float = WARMUP_S) -> None:
    """Call the functions round-robin for ``seconds`` of wall time (at least 3 rounds).

    Brings clocks up, finishes any JIT compilation, fills the allocator's cache.
    """
    deadline = time.perf_counter() + seconds
    rounds = 0
    while rounds < 3 or time.perf_counter() < deadline:
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        rounds += 1


def estimate_s(fn: Callable[[], object], flush: L2Flush) -> float:
    """A quick cold estimate of one call: the median of 3 flushed calls."""
    return quantile(cold_samples(fn, 3, flush), 0.5)


def interleaved(
    fns: dict[str, Callable[[], object]],
    reps: dict[str, int],
    flush: L2Flush,
    blocks: int = BLOCKS,
) -> dict[str, list[list[float]]]:
    """Cold samples (seconds) per implementation and block, implementations interleaved."""
    out: dict[str, list[list[float]]] = {name: [] for name in fns}
    for order in rotations(list(fns), blocks):
        for name in order:
            out[name].append(cold_samples(fns[name], reps[name], flush))
    return out


def capture(fn: Callable[[], object], calls: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back calls of fn, warmed up on a side stream first
    (as the CUDA docs ask: the first calls allocate and compile, which capture forbids).
    What fn allocates while captured lives in the graph's pool and is rewritten by each
    replay, so outputs fn keeps a reference to hold the last replay's results."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def graph_samples(fn: Callable[[], object], calls: int = 20, replays: int = 10) -> list[float]:
    """Device seconds per call under CUDA-graph replay of ``calls`` back-to-back calls.

    One sample per replay. L2 is warm (small shapes fit in it); launch overhead is gone.
    The GPU sleeps ahead of the timed replays (sleep_ahead, as for cold samples), so the
    host's graph launches stay out of the samples (docs/notebook/07-decode-and-host-time.md, v30).
    """
    graph = capture(fn, calls)
    for _ in range(3):
        graph.replay()
    pairs = event_pairs(replays)
    sleep_ahead(graph.replay, replays)
    for start, end in pairs:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    del graph
    return [s / calls for s in elapsed_s(pairs)]


def graph_interleaved(
    fns: dict[str, Callable[[], object]], calls: int = 20, replays: int = 10
) -> dict[str, tuple[Optional[list[float]], Optional[str]]]:
    """graph_samples of several calls at once, their replays interleaved: round r replays
    every graph once, in rotations' order, so a drift of the GPU's state during the
    measurement (clocks, a neighbour's load) reaches every implementation alike, where one
    call's replays after another's would give each its own moment. {name: (seconds per call
    a replay, None), or (None, the error) where the capture failed}; an error after the
    captures (a replay, a sticky device fault) raises, for all of them."""
    out: dict[str, tuple[Optional[list[float]], Optional[str]]] = {}
    graphs = {}
    for name, fn in fns.items():
        graphs[name], err = maybe(functools.partial(capture, fn, calls))
        if err is not None:
            del graphs[name]
            out[name] = (None, err)
    for g in graphs.values():
        for _ in range(3):
            g.replay()
    pairs = {name: event_pairs(replays) for name in graphs}
    sleep_ahead(lambda: [g.replay() for g in graphs.values()], replays)
    for r, order in enumerate(rotations(list(graphs), replays)):
        for name in order:
            start, end = pairs[name][r]
            start.record()
            graphs[name].replay()
            end.record()
    torch.cuda.synchronize()
    for name in graphs:
        out[name] = ([s / calls for s in elapsed_s(pairs[name])], None)
    graphs.clear()
    return {name: out[name] for name in fns}


def host_interleaved(
    fns: dict[str, Callable[[], object]], calls: int = 100, repeats: int = 7
) -> dict[str, tuple[Optional[list[float]], Optional[str]]]:
    """host_samples of several calls, their repeats interleaved (rotations' order), for
    the reason graph_interleaved gives: the host's speed drifts too, and a ratio of two
    implementations' host times means something only when both met the same host.
    {name: (seconds per call a repeat, None), or (None, the error) if a call raised}."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    errors: dict[str, str] = {}
    for order in rotations(list(fns), repeats):
        for name in order:
            if name in errors:
                continue
            got, err = maybe(functools.partial(host_samples, fns[name], calls, 1))
            if err is not None:
                errors[name] = err
            else:
                samples[name] += got
    return {name: (None, errors[name]) if name in errors else (samples[name], None) for name in fns}


def host_samples(fn: Callable[[], object], calls: int = 100, repeats: int = 7) -> list[float]:
    """Host seconds per call: wall time of ``calls`` back-to-back calls with no sync."""
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        out.append((t1 - t0) / calls)
    torch.cuda.synchronize()
    return out


def to_us(samples_s: Sequence[float]) -> list[float]:
    return [s * 1e6 for s in samples_s]


def block_summary(blocks_s: Sequence[Sequence[float]]) -> tuple[list[dict], dict, float]:
    """Per-block {median_us, p20_us, p80_us, n}, stats over all samples, and the spread."""
    per_block = []
    for b in blocks_s:
        us = to_us(b)
        per_block.append(
            {
                "median_us": quantile(us, 0.5),
                "p20_us": quantile(us, 0.2),
                "p80_us": quantile(us, 0.8),
                "n": len(us),
            }
        )
    all_us = [v for b in blocks_s for v in to_us(b)]
    return per_block, summarize(all_us), spread([b["median_us"] for b in per_block])


def maybe(fn: Callable[[], _T]) -> tuple[Optional[_T], Optional[str]]:
    """Run a timing function; (its samples, None) or (None, the error) if it raised."""
    try:
        return fn(), None
    except Exception as e:  # a capture failure is reported, never fatal to the run
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
