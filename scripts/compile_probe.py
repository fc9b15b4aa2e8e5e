"""Our Triton kernel alone and inside torch.compile: device time a call, and how Inductor
launches it (its generated code), to tell why a kernel is slower inside a compiled graph.

    python3 scripts/compile_probe.py [--shape 4096x4096] [--dtype bf16]
    python3 scripts/compile_probe.py --add-norm [--shape 64x4096,4096x4096]

Three programs at one shape: the op alone (eager), the op compiled alone, and the op
after an add (the pre-norm residual stream), compiled. Each is profiled over 20 calls;
the kernels whose names contain "rms_norm" are reported with their mean device time.
Then the lines of Inductor's output code that launch our kernel are printed.

--add-norm: the residual add and the norm compiled as a model's block holds them, at the
block's shapes: native (Inductor's own kernels), our fused ops called, native's code with
the compile fusion pass (rmsnorm_api.enable_compile_fusion), our plain ops after the add.
For each: the kernels a call launches and their device time, back to back (L2 warm, as in
the block), the host time of a call (a call's wall time over 500 calls, the GPU never the
one waiting), and the lines of Inductor's wrapper code that call or launch anything.
"""

import argparse
import functools
import sys

import torch

from harness.measure import kernel_times
from harness.plan import DTYPES, parse_shapes


def kernel_us(fn, *args, calls: int = 20) -> dict[str, float]:
    """Mean device microseconds a launch of each of our kernels (names with rms_norm) over
    ``calls`` calls of fn, after three warm-up calls."""
    for _ in range(3):
        fn(*args)
    times = kernel_times(lambda: fn(*args), calls=calls)
    return {n[:90]: k["us"] / k["count"] for n, k in times.items() if "rms_norm" in n}


def add_norm_programs(backends: dict) -> dict:
    """{name: (function of (x, r, w), pass backend or None)}: the add and the norm as a
    compiled block holds them."""
    import torch.nn.functional as F

    def native(x, r, w):
        h = x + r
        return F.rms_norm(h, (h.shape[-1],), w, 1e-6), h

    out = {"native": (native, None)}
    for name, mod in backends.items():
        out[f"{name} fused"] = (lambda x, r, w, m=mod: m.fused_add_rms_norm(x, r, w, 1e-6), None)
        out[f"{name} pass"] = (native, name)

        def plain(x, r, w, m=mod):
            h = x + r
            return m.rms_norm(h, w, 1e-6), h

        out[f"{name} plain"] = (plain, None)
    return out


def host_us(fn, *args, calls: int = 500) -> float:
    """Microseconds of host time a call: calls issued back to back, wall time over calls
    (the GPU, a few microseconds a call at these shapes, is never what the host waits on)."""
    import time

    for _ in range(20):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def probe_add_norm(shapes, dtype) -> None:
    import rmsnorm_api

    backends = {}
    for name in ("triton", "cuda"):
        try:
            backends[name] = __import__(f"{name}_impl")
        except Exception as e:  # a CUDA build missing: the Triton rows alone
            print(f"{name}: not importable ({e})")
    from torch._inductor.utils import run_and_get_code

    for m, n in shapes:
        x, r = (torch.randn(m, n, device="cuda").to(dtype) for _ in range(2))
        w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype)
        print(f"=== {m} x {n} {dtype}")
        for name, (fn, backend) in add_norm_programs(backends).items():
            torch._dynamo.reset()
            if backend:
                rmsnorm_api.enable_compile_fusion(backend)
            try:
                compiled = torch.compile(fn, fullgraph=True, dynamic=False)
                with torch.no_grad():
                    _, code = run_and_get_code(compiled, x, r, w)
            finally:
                rmsnorm_api.disable_compile_fusion()
            with torch.no_grad():
                for _ in range(3):
                    compiled(x, r, w)
                times = kernel_times(functools.partial(compiled, x, r, w), calls=20)
                host = host_us(compiled, x, r, w)
            count = sum(k["count"] for k in times.values())  # a call's (kernel_times)
            dev = sum(k["us"] for k in times.values())
            print(f"--- {name}: {count:g} kernels, {dev:.2f} us device, {host:.1f} us host a call")
            for k, t in sorted(times.items()):
                print(f"    {t['us'] / t['count']:7.2f} us x{t['count']:g}  {k[:100]}")
            call = code[-1].split("def call(", 1)[-1] if code else ""
            for line in call.splitlines():
                if (
                    ".run(" in line
                    or "torch.ops." in line
                    or "extern_kernels" in line
                    or ("empty_strided" in line and "=" in line)
                ):
                    print("    | " + line.strip()[:160])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default=None, help="MxN[,MxN] (default 4096x4096; --add-norm: "
                   "the block's 64x4096,4096x4096)")  # fmt: skip
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--add-norm", action="store_true")
    args = p.parse_args()
    if args.add_norm:
        probe_add_norm(parse_shapes(args.shape or "64x4096,4096x4096"), DTYPES[args.dtype])
        return 0
    args.shape = args.shape or "4096x4096"
    from torch._inductor.utils import run_and_get_code

    import triton_impl

    m, n = parse_shapes(args.shape)[0]
    dtype = DTYPES[args.dtype]
    x = torch.randn(m, n, device="cuda").to(dtype)
    r = torch.randn(m, n, device="cuda").to(dtype)
    w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype)

    def alone(x, w):
        return triton_impl.rms_norm(x, w, 1e-6)

    def after_add(x, r, w):
        return triton_impl.rms_norm(x + r, w, 1e-6)

    runs = {"eager alone": (alone, (x, w)), "eager after add": (after_add, (x, r, w))}
    for name, (fn, a) in list(runs.items()):
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, dynamic=False)
        _, code = run_and_get_code(compiled, *a)
        runs[name.replace("eager", "compiled")] = (compiled, a)
        print(f"--- Inductor's launch of our kernel ({name.replace('eager', 'compiled')})")
        for src in code:
            lines = src.splitlines()
            for i, line in enumerate(lines):
                if "rms_norm_fwd" in line and ("run(" in line or "grid" in line or "[" in line):
                    print("\n".join(lines[max(0, i - 2) : i + 3]))
                if "num_warps" in line and "rms_norm" in src[: src.find(line)][-3000:]:
                    print(line.strip())
    for name, (fn, a) in runs.items():
        for k, us in kernel_us(fn, *a).items():
            print(f"{name:18s} {us:8.1f} us  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
