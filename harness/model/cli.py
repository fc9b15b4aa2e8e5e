"""The command line (python -m harness.model): the flags, checked alike on any machine,
then the GPU run where there is a CUDA GPU, else the CPU path (unless --require-gpu).
"""

from __future__ import annotations

import argparse
from typing import Optional

import torch

from harness import hardware, records
from harness.model.config import (
    COMMITTED,
    CPU_SHAPES,
    DEFAULT_BUDGET_S,
    MODES,
    RECORDS_NAME,
    REPO,
    REPORT_NAME,
    SHAPE_NAMES,
    TINY,
    TRAIN_MODES,
    VARIANTS,
)
from harness.model.cpu import GPU_ONLY, _describe, run_cpu
from harness.model.gpu import run_gpu
from harness.plan import names_arg

EPILOG = f"""\
native always runs: it is the baseline every speedup and bound is against.
train is a training step (forward + backward) in the modes {", ".join(TRAIN_MODES)}; the
others are named as not applicable to it. --shapes train --append runs it on its own (a
device call of its own, its records added to a run's).

without a GPU:
  A tiny block ({_describe(TINY)};
  prefill {CPU_SHAPES["prefill"].tokens} tokens, decode {CPU_SHAPES["decode"].batch} x 1 over \
{CPU_SHAPES["decode"].kv_len}, train {CPU_SHAPES["train"].batch} x \
{CPU_SHAPES["train"].tokens}) runs each of --variants that runs
  on CPU (native, eager, and triton, triton_fused under the Triton interpreter) in each of
  --shapes, its outputs (at train: and gradients) checked against the block in fp32;
  transformers' LlamaDecoderLayer of the same sizes is checked swapped (at prefill, and
  at train when asked; when transformers imports; not with --no-layer), and its Qwen3 and
  Gemma 3 layers with every norm swapped (q_norm and k_norm on head rows). Then the
  committed H200 table ({COMMITTED.relative_to(REPO)})
  is printed. Named as ignored (they only apply on a GPU): {", ".join(GPU_ONLY)}.
  --require-gpu exits 1 instead.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.model",
        description="Time a Llama-3-8B-shaped decoder block with each RMSNorm variant and "
        "measure Amdahl's law:\nthe norm's share, its speedup alone, the bound, the "
        "block's measured speedup.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--shapes",
        default=None,
        help=f"comma-separated from {','.join(SHAPE_NAMES)} (default: all)",
    )
    p.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated from {','.join(MODES)} (default: all; GPU only)",
    )
    p.add_argument(
        "--variants", default=None, help=f"comma-separated from {','.join(VARIANTS)} (default: all)"
    )
    p.add_argument(
        "--out",
        default=None,
        help=f"output directory for {RECORDS_NAME} and {REPORT_NAME}, checked before any "
        "work (default: results/<gpu>/model; GPU only)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"start no new job after this many seconds (default {DEFAULT_BUDGET_S:.0f}; GPU only)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help=f"append to --out's {RECORDS_NAME}, not replace it (a run split over several "
        "calls, e.g. the compile modes in a second one; the report keeps the last record of "
        "each shape, mode and variant; GPU only)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    p.add_argument(
        "--no-layer",
        action="store_true",
        help="leave out transformers' layers (Llama's; Qwen3's and Gemma 3's, every norm swapped)",
    )
    p.add_argument("--require-gpu", action="store_true", help="exit 1 if there is no GPU")
    return p


def parse_args(
    argv: Optional[list[str]] = None, p: Optional[argparse.ArgumentParser] = None
) -> argparse.Namespace:
    """The checked arguments: the same checks on any machine, GPU or not."""
    p = p or build_parser()
    args = p.parse_args(argv)
    args.modes_given = args.modes is not None
    args.shapes = names_arg(p, "--shapes", args.shapes or ",".join(SHAPE_NAMES), SHAPE_NAMES)
    args.modes = names_arg(p, "--modes", args.modes if args.modes_given else ",".join(MODES), MODES)
    given = args.variants if args.variants is not None else ",".join(VARIANTS)
    chosen = set(names_arg(p, "--variants", given, VARIANTS)) | {"native"}
    args.variants = [v for v in VARIANTS if v in chosen]
    return records.refuse_bad_run_args(p, args)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv, p := build_parser())
    if hardware.no_gpu_refused(args):
        return 1
    if not torch.cuda.is_available():
        return run_cpu(args)
    out = hardware.gpu_out_dir(p, args, "model")
    if args.budget_s is None:
        args.budget_s = DEFAULT_BUDGET_S
    return run_gpu(args, out)
