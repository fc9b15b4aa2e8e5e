"""The block's sizes (LLAMA3_8B; TINY, what runs without a GPU) and shapes, and the names and
limits the files of harness.model share: the variants, modes and shapes, the records' file
names, the checks' factors.

Shapes: prefill (1 x 4096 tokens, causal), decode (64 sequences x 1 token, each attending
over a preallocated 2048-token KV cache whose last slot the step writes) and train (4 x 4096
tokens, causal, a training step: harness.model.train).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]  # harness/model/config.py: the repository's root
#: The committed H200 run the no-GPU path prints (python -m harness.model --out this).
COMMITTED = REPO / "results" / "h200" / "model"
RECORDS_NAME, REPORT_NAME = "records.jsonl", "model.md"
#: Its records, kept xz'd (read through lzma) as every committed run's are.
COMMITTED_RECORDS = COMMITTED / f"{RECORDS_NAME}.xz"

VARIANTS = (
    "native",
    "eager",
    "triton",
    "cuda",
    "triton_fused",
    "cuda_fused",
    "triton_pass",
    "cuda_pass",
    "triton_plain_pass",
    "cuda_plain_pass",
)
#: The variants compiled with rmsnorm_api.enable_compile_fusion(backend): native's block as
#: written (*_pass), or the block with the backend's plain op after the add (*_plain_pass,
#: as a model after swap_rms_norm); the pass puts the backend's fused add + norm in it, so
#: their pieces alone are the fused variants'. Compiled modes only.
PASS = {
    "triton_pass": "triton_fused",
    "cuda_pass": "cuda_fused",
    "triton_plain_pass": "triton_fused",
    "cuda_plain_pass": "cuda_fused",
}


def pass_not_applicable(mode: str) -> Optional[str]:
    """Why a PASS variant is not run in a mode (None: it is): the pass rewrites compiled
    graphs only, inference graphs after autograd and training graphs before it."""
    if not mode.startswith("compile"):
        return "not applicable: the pass rewrites compiled graphs (eagerly it is native)"
    return None


#: Kernel names that show the pass's fused op ran in a block: the fused add's forward
#: kernels, Triton's by name, CUDA's by the residual's type in the forward kernel's third
#: template argument (void in the plain op's, whose kernels a plain_pass block runs anyway).
PASS_KERNELS = re.compile(r"_fused_add_rms_norm_fwd|rms_norm_kernel<[^,<>]+, [^,<>]+, (?!void\b)")


def pass_left(kernels: Optional[dict], train: bool = False) -> Optional[str]:
    """Why a PASS variant's compiled record is not the pass's (None: it is): its block ran
    none of the fused op's kernels, so it timed the block without the pass (native's, or
    our plain op's). Such records were written before the pass rewrote training graphs, and
    before each variant's block was compiled on a code object of its own (until then dynamo
    gave a pass variant the graph compiled for native's or our plain block)."""
    names = (kernels or {}).get("names") or []
    if any(PASS_KERNELS.search(n) for n in names):
        return None
    graph = "the training graph" if train else "the graph"
    return (
        f"not applicable: this record's pass left {graph} (none of the fused op's kernels"
        " ran), so it timed the block without the pass"
    )


FUSED = ("triton_fused", "cuda_fused", *PASS)
MODES = ("eager", "graph", "compile", "compile_graph")
SHAPE_NAMES = ("prefill", "decode", "train")
#: The modes of the training step: the CUDA-graph ones are for inference here.
TRAIN_MODES = ("eager", "compile")
#: The variants whose norm torch.compile generates itself; ours are opaque ops to it, so
#: their kernels, and kernel times, are those of the eager launch.
COMPILED_NORMS = ("native", "eager")
BLOCK_OP, LAYER_OP = "decoder_block", "llama_decoder_layer"
#: The family layers (harness.model.families): family: (transformers' class prefix, its
#: config class, the norms' weight offset).
FAMILIES = {
    "qwen3": ("Qwen3", "Qwen3Config", 0.0),
    "gemma3": ("Gemma3", "Gemma3TextConfig", 1.0),
}


def family_op(family: str) -> str:
    """The records' op (block) name of a family's layer."""
    return f"{family}_decoder_layer"


#: The FP8 block's activation scalings (harness.model.fp8): a static scale, a scale a token.
FP8_SCALINGS = ("static", "token")


def fp8_op(scaling: str) -> str:
    """The records' op (block) name of the FP8 block with a scaling."""
    return f"fp8_{scaling}_decoder_block"


#: --budget-s when not given: no new job starts after it, so the run (compiles included)
#: ends well inside one 10-minute device call.
DEFAULT_BUDGET_S = 360.0
#: A variant's block passes when its outputs (relative L2 error, the worse of its two) are
#: as close to the block computed in fp32 as native's bf16 block is, within this factor:
#: correct norms differ in their rounding (the composite rounds twice, the interpreter
#: truncates), which moves the error a little; a wrong norm or wiring misses by far more.
TRUTH_FACTOR = 2.0
#: A gradient of the training step passes within this factor of native's error on the same
#: gradient: a gradient carries the forward's rounding through the chain rule and adds the
#: backward's own casts (the interpreter truncates at each of ours, a biased rounding of
#: twice the size); a backward that drops a term or scales one misses by far more.
GRAD_FACTOR = 3.0
#: The most native's own block may be from the fp32 block (bf16 rounding through a block
#: sits several times under it); also the limit where native's distance is not known.
NATIVE_MAX = 5e-2
#: A block whose kernels fill less of its time than this is host-bound.
HOST_BOUND_BUSY = 0.9


@dataclass(frozen=True)
class BlockConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    eps: float = 1e-5  # Llama 3's rms_norm_eps
    rope_theta: float = 500000.0

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


LLAMA3_8B = BlockConfig(hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336)
#: What runs without a GPU: every path of the real block, small enough for the interpreter.
TINY = BlockConfig(hidden=256, heads=4, kv_heads=2, head_dim=64, mlp=512, rope_theta=1e4)


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    tokens: int  # new tokens a sequence
    kv_len: int  # 0: prefill, causal over its own tokens; else the cache the step attends
    calls: int  # blocks back-to-back in one timed sample
    train: bool = False  # a training step: the forward, then the backward

    @property
    def rows(self) -> int:
        return self.batch * self.tokens

    def describe(self) -> str:
        if self.kv_len:
            return f"{self.batch} x {self.tokens} token over a {self.kv_len}-token KV cache"
        step = ", forward + backward" if self.train else ""
        return f"{self.batch} x {self.tokens} tokens, causal{step}"


# decode: one block is a few hundred microseconds, so a sample is 8 of them (see
# harness.model.job's docstring); a prefill block is milliseconds of matmuls, a training
# step tens
GPU_SHAPES = {
    "prefill": Shape("prefill", batch=1, tokens=4096, kv_len=0, calls=1),
    "decode": Shape("decode", batch=64, tokens=1, kv_len=2048, calls=8),
    "train": Shape("train", batch=4, tokens=4096, kv_len=0, calls=1, train=True),
}
CPU_SHAPES = {
    "prefill": Shape("prefill", batch=1, tokens=16, kv_len=0, calls=1),
    "decode": Shape("decode", batch=4, tokens=1, kv_len=32, calls=1),
    "train": Shape("train", batch=2, tokens=16, kv_len=0, calls=1, train=True),
}
