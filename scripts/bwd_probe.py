"""A quick look at the backward kernels while tuning them: cold median device time of the
backward op alone (ours: the backward op called directly; native: autograd of F.rms_norm
with its graph kept), as a fraction of the copy ceiling by the backward bytes model (read
x, dy, write dx; the fused add's backward also reads d_residual_out and writes dresidual).
Figures of record come from ``python -m harness.bench``; this prints only, for the
predict-change-measure loop.

    python3 scripts/bwd_probe.py [--shapes 32768x4096,... | --widths 1024,4096,...]
                                 [--dtypes bf16,fp32] [--impls cuda]
                                 [--weight dtype|fp32|none]
                                 [--tune "BWD_SHARD_N=8192,BWD_SHARD_THREAD_ELEMS=16;..."]

    python3 scripts/bwd_probe.py --table run.log   # no GPU: a device call's probes, side by side

--impls names: triton, cuda (the plain backward), triton_fused, cuda_fused (the fused add's
public backward: dx and dresidual stored apart), triton_fused1, cuda_fused1 (its op with
dresidual=False: dx stored once, as a backward() through other nodes runs it), native.

--tune: each ';'-separated setting of triton_impl.backward's tuning names is probed in turn
(the settings accumulate; after the first, the Triton rows alone, the only ones they move),
for the predict-change-measure loop of a tuning value; an empty first setting probes the
defaults.
"""

import argparse
import collections
import functools
import re
import statistics

import torch
import torch.nn.functional as F

from harness import hardware, timing
from harness.plan import DTYPES

GRID_N = (1024, 2048, 4095, 4096, 4097, 8192, 16384, 32768, 65536)


def cold_us(fn, flush, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    return statistics.median(timing.cold_samples(fn, reps, flush)) * 1e6


def reference(x, w, dy):
    """(dx, dweight) of rms_norm by autograd in fp32, the probe's check of what it times
    (dx alone without a weight)."""
    xf = x.float().requires_grad_()
    wf = None if w is None else w.float().requires_grad_()
    wrt = (xf,) if wf is None else (xf, wf)
    return torch.autograd.grad(F.rms_norm(xf, (x.shape[-1],), wf, 1e-6), wrt, dy.float())


def error(got, want) -> float:
    """The largest difference over got's tensors, relative to each reference's largest value."""
    return max(
        ((g.float() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        for g, r in zip(got, want, strict=True)
    )


ROW = re.compile(r"^(\w+)\s+(\d+)x(\d+)\s+(\w+)\s+[\d.]+\s+([\d.]+)\s+\S+(\s+WRONG)?$")


def table(log: str) -> str:
    """The probes of a device call's log (scripts/h200.sh backward: the default build, its
    --tune settings, each variant's build) side by side, as markdown: a row an impl, dtype
    and width, a column a probe, % of copy (! where the result was wrong)."""
    columns, cells, probe = [], collections.defaultdict(dict), None
    for line in log.split("\n"):
        if line.startswith("=== the backward kernels alone"):
            probe = "default"
        elif line.startswith("=== variant "):
            probe = line.split()[2].split(":")[0]
        elif line.startswith("--- tune ") and probe is not None:
            probe = line[len("--- tune ") :].strip()
        elif line.startswith("==="):
            probe = None
        m = ROW.match(line.strip()) if probe is not None else None
        if m:
            dtype, _, n, impl, pct, bad = m.groups()
            if probe not in columns:
                columns.append(probe)
            cells[(impl, dtype, int(n))][probe] = f"{pct}{'!' if bad else ''}"
    if not cells:
        return "no probe rows in the log"
    out = ["| impl | dtype | N | " + " | ".join(columns) + " |",
           "|---|---|---|" + "---|" * len(columns)]  # fmt: skip
    for impl, dtype, n in sorted(cells):
        row = cells[(impl, dtype, n)]
        out.append(f"| {impl} | {dtype} | {n} | "
                   + " | ".join(row.get(c, "") for c in columns) + " |")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--shapes", default="")
    p.add_argument("--widths", default="", help="grid widths (M = 2^27 / N, fp32 2^26 / N)")
    p.add_argument("--impls", default="triton,cuda,native")
    p.add_argument("--weight", default="dtype", choices=("dtype", "fp32", "none"),
                   help="the weight: x's dtype (default), fp32 beside x, or none")  # fmt: skip
    p.add_argument("--tune", default="", help="';'-separated NAME=V,... settings, each probed")
    p.add_argument("--table", default="", help="a device call's log: its probes side by side")
    args = p.parse_args()
    if args.table:
        try:
            with open(args.table, errors="replace") as f:
                print(table(f.read()))
        except OSError as e:
            raise SystemExit(f"--table: {e}") from None
        return 0
    import triton_impl
    import triton_impl.backward as bwd

    wrong = 0
    impls = args.impls
    for i, setting in enumerate(args.tune.split(";")):
        pairs = [kv.split("=") for kv in setting.split(",") if kv]
        for name, value in pairs:
            if not hasattr(bwd, name):
                raise SystemExit(f"--tune: triton_impl.backward has no {name}")
            setattr(bwd, name, int(value))
        if pairs:
            print(f"--- tune {setting}", flush=True)
        # the settings after the first move only the Triton rows: the others are not re-timed
        args.impls = (
            impls
            if i == 0
            else ",".join(name for name in impls.split(",") if name.startswith("triton"))
        )
        wrong += probe(args, triton_impl)
    if wrong:
        print(f"{wrong} results differ from the reference: the probe fails")
    return 1 if wrong else 0


def _one_store(op, dy, dro, x, w):
    """The fused backward op with dresidual=False: (dx, dx, dweight), dx stored once."""
    dx, _, dw = op(dy, dro, x, w, 1e-6, False)
    return dx, dx, dw if w is not None else None


def probe(args, triton_impl) -> int:
    """The probe's table for args' dtypes, shapes and impls; returns the wrong results."""
    impls = args.impls.split(",")
    libs = {"triton": triton_impl}
    if any(name.startswith("cuda") for name in impls):  # the extension, built
        import cuda_impl

        libs["cuda"] = cuda_impl

    ceiling = hardware.copy_ceiling()["gbps"]
    flush = timing.L2Flush(torch.cuda.get_device_properties(0).L2_cache_size)
    wrong = 0
    print(f"copy ceiling {ceiling:.0f} GB/s")
    print(f"{'dtype':6} {'shape':>12} {'impl':>7} {'us':>9} {'% copy':>7} {'rel err':>9}")
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        elem = torch.finfo(dtype).bits // 8
        if args.shapes:
            shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        else:
            widths = [int(n) for n in args.widths.split(",")] if args.widths else GRID_N
            shapes = [((2**27 if elem == 2 else 2**26) // n, n) for n in widths]
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda").to(dtype)
            w = (1 + 0.5 * torch.randn(n, device="cuda")).to(
                torch.float32 if args.weight == "fp32" else dtype
            )
            if args.weight == "none":
                w = None
            dy = torch.randn(m, n, device="cuda").to(dtype)
            xg = x.clone().requires_grad_()
            wg = None if w is None else w.clone().requires_grad_()
            y = F.rms_norm(xg, (n,), wg, 1e-6)
            wrt = (xg,) if wg is None else (xg, wg)
            fns = {
                "native": functools.partial(torch.autograd.grad, y, wrt, dy, retain_graph=True),
            }
            dro = torch.randn(m, n, device="cuda").to(dtype)
            for lib, mod in libs.items():
                fns[lib] = functools.partial(mod.rms_norm_backward, dy, x, w, 1e-6)
                fns[f"{lib}_fused"] = functools.partial(
                    mod.fused_add_rms_norm_backward, dy, dro, x, w, 1e-6
                )
                # the op storing dx once, as the fused add's autograd hands it on as both
                # gradients in a backward() through other nodes: the second store's cost
                op = getattr(torch.ops, f"{lib}_impl").fused_add_rms_norm_backward
                fns[f"{lib}_fused1"] = functools.partial(_one_store, op, dy, dro, x, w)
            ref_dx, *ref_dw = reference(x, w, dy)  # ref_dw: [] without a weight
            fused_dx = ref_dx + dro.float()
            refs = {"plain": (ref_dx, *ref_dw), "fused": (fused_dx, fused_dx, *ref_dw)}
            for name in impls:
                fn = fns[name]
                # ours: (dx, dw) or (dx, dresidual, dw), dw None without a weight; native:
                # (dx, dw) or (dx,)
                got = tuple(g for g in fn() if g is not None)
                fused = name.endswith(("_fused", "_fused1"))
                err = error(got, refs["fused" if fused else "plain"])
                # read s, dy (and d_residual_out), write dx (and dresidual), the weights: one
                # bytes model, whether dresidual is stored or handed on as dx
                tensors = 5 if fused else 3
                nbytes = tensors * m * n * elem + 2 * n * elem
                us = cold_us(fn, flush)
                pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceiling
                flag = "" if err < 2**-6 else "  WRONG"
                wrong += bool(flag)
                print(f"{dname:6} {m:>6}x{n:<6} {name:>7} {us:9.1f} {pct:7.1f} {err:9.1e}{flag}",
                      flush=True)  # fmt: skip
    return wrong


if __name__ == "__main__":
    raise SystemExit(main())
