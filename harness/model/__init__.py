"""The whole-model answer (docs METHOD item 11): a Llama-3-8B-shaped decoder block timed
with each RMSNorm variant, and Amdahl's law measured.

    python -m harness.model [--out DIR] [--shapes prefill,decode,train]
                            [--modes eager,graph,compile,compile_graph]
                            [--variants native,eager,triton,cuda,triton_fused,cuda_fused]
                            [--budget-s 360] [--append] [--seed 0] [--no-layer]
                            [--require-gpu]

A file a concern, each importing only those above it:

    config.py   the block's sizes and shapes; the names and limits the files share
    block.py    the norm variants and the block; its fp32 twin and the check against it
    train.py    the training step: the forward, autograd's gradients, their check
    shares.py   Amdahl's law, the norm's share of the kernel times, the measured speedup
    hf.py       the second client: transformers' LlamaDecoderLayer, built, swapped, checked
    state.py    the GPU run's state (the run; a shape's inputs and truth); a block's record
    alone.py    the norm and the step alone at the in-block shape (s)
    finish.py   a job's figures: shares, s, bounds, the speedup, flags and their reasons
    job.py      one (shape, mode) job of the block, or the transformers layer's
    families.py the real clients: transformers' Qwen3 and Gemma 3 layers, every norm swapped
    fp8.py      the FP8 client: the block's projections in fp8, the norms' outputs quantised
    tables.py   model.md: the report, a pure function of records
    figure.py   model_speedups.png: our variants' block speedups and their bounds, drawn
    gpu.py      the GPU run: the jobs planned and run, the table and the figure written
    cpu.py      without a GPU: the tiny config checked, then the committed table
    cli.py      the command line (__main__.py runs it)

The names other code uses are re-exported here.
"""

from harness.model.block import (
    Variant,
    _import,
    agreement,
    block_fn,
    fp32_block,
    llama_rms_norm,
    make_inputs,
    make_weights,
    unfused,
    variants,
)
from harness.model.cli import build_parser, main, parse_args
from harness.model.config import (
    BLOCK_OP,
    COMMITTED,
    COMMITTED_RECORDS,
    CPU_SHAPES,
    FAMILIES,
    FP8_SCALINGS,
    GPU_SHAPES,
    LAYER_OP,
    MODES,
    RECORDS_NAME,
    REPORT_NAME,
    TINY,
    VARIANTS,
    family_op,
    fp8_op,
)
from harness.model.cpu import check_blocks, check_layer, check_train_block, run_cpu, why_not_on
from harness.model.families import run_family_job
from harness.model.fp8 import check_fp8, run_fp8_job
from harness.model.gpu import not_applicable, plan_jobs, run_gpu
from harness.model.hf import LAYER_STEP_TENSORS, LAYER_VARIANTS, LayerStep
from harness.model.job import run_job, run_layer_job
from harness.model.shares import (
    _speedup,
    amdahl_bound,
    exceeds,
    is_norm_kernel,
    kernels_beyond,
    norm_share,
    train_share,
)
from harness.model.state import Run
from harness.model.tables import render, short_kernel
from harness.model.train import STEP_TENSORS, train_agreement
from harness.reference import fused_add_rms_norm_ref

__all__ = [
    "BLOCK_OP",
    "COMMITTED",
    "COMMITTED_RECORDS",
    "CPU_SHAPES",
    "FAMILIES",
    "FP8_SCALINGS",
    "GPU_SHAPES",
    "LAYER_OP",
    "LAYER_STEP_TENSORS",
    "LAYER_VARIANTS",
    "LayerStep",
    "MODES",
    "RECORDS_NAME",
    "REPORT_NAME",
    "Run",
    "STEP_TENSORS",
    "TINY",
    "VARIANTS",
    "Variant",
    "_import",
    "_speedup",
    "agreement",
    "amdahl_bound",
    "block_fn",
    "build_parser",
    "check_blocks",
    "check_fp8",
    "check_layer",
    "check_train_block",
    "exceeds",
    "family_op",
    "fp8_op",
    "fp32_block",
    "fused_add_rms_norm_ref",
    "is_norm_kernel",
    "kernels_beyond",
    "llama_rms_norm",
    "main",
    "make_inputs",
    "make_weights",
    "norm_share",
    "not_applicable",
    "parse_args",
    "plan_jobs",
    "render",
    "run_cpu",
    "run_family_job",
    "run_fp8_job",
    "run_gpu",
    "run_job",
    "run_layer_job",
    "short_kernel",
    "train_agreement",
    "train_share",
    "unfused",
    "variants",
    "why_not_on",
]
