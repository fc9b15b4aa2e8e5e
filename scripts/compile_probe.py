"""Our Triton kernel alone and inside torch.compile: device time a call, and how Inductor
launches it (its generated code), to tell why a kernel is slower inside a compiled graph.

    python3 scripts/compile_probe.py [--shape 4096x4096] [--dtype bf16]

Three programs at one shape: the op alone (eager), the op compiled alone, and the op
after an add (the pre-norm residual stream), compiled. Each is profiled over 20 calls;
the kernels whose names contain "rms_norm" are reported with their mean device time.
Then the lines of Inductor's output code that launch our kernel are printed.
"""

import argparse
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="4096x4096")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = p.parse_args()
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
