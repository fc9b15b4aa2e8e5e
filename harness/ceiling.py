"""A shape's practical ceiling: the fastest of several kernels that read an op's row tensors
once and write its outputs once and compute nothing, timed beside the implementations at
that very shape, in the same interleaved blocks (harness.measure).

The run's copy ceiling (one 1 GiB ``copy_``) is a single number for every shape, and at some
shapes a norm beats it: its launch shape, its rows, its eviction hints move the same bytes
faster than torch's copy does. The per-shape ceiling is the best of:

- ``copy``: torch's own copy (``clone``), what the copy ceiling times, at the shape's bytes;
- ``triton``: a flat Triton copy of 16 KiB a program in 16-byte vectors;
- ``inductor``: torch.compile's generated kernel for the same bytes (each tensor times a
  one-element tensor holding 1, which Inductor cannot fold away; dynamic shapes, so one
  compile a dtype, not one a shape);
- ``cuda`` (a GPU only): a CUDA copy with the norm's access pattern, one CTA a row, each
  thread four 16-byte vectors in flight at a time (byte by byte where a row is off the
  16-byte grid), built on first use by torch's inline extension loader (about a minute,
  then cached in torch's extension directory).

For the fused add, each reads x and the residual and writes two tensors of their dtypes, as
the op does (``copy``: two clones). Gradient ops keep the copy ceiling alone. Every
implementation's record then carries ``pct_ceiling``, its GB/s as a percentage of the best
of these at its shape, both by the op's bytes model (the weight, which none of these
reads, is a row's worth of bytes against M rows).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl

#: Bytes of each tensor a program of the Triton copy moves.
PROGRAM_BYTES = 16384
PROGRAM_WARPS = 8
#: The ceiling kernels' names, the order they are reported in (cuda: a GPU only).
NAMES = ("copy", "triton", "inductor", "cuda")

_CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

// One CTA a row of each tensor: the rows' bytes as 16-byte vectors, four in flight a
// thread, where a row's bytes and both pointers are on the 16-byte grid; else byte by byte.
__device__ void copy_row(const uint8_t* src, uint8_t* dst, int64_t bytes) {
  const bool vec = bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (vec) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const int64_t n = bytes / 16, step = 4 * (int64_t)blockDim.x;
    for (int64_t j = threadIdx.x; j < n; j += step) {
      uint4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (j + k * blockDim.x < n) v[k] = s[j + k * blockDim.x];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (j + k * blockDim.x < n) d[j + k * blockDim.x] = v[k];
    }
  } else {
    for (int64_t j = threadIdx.x; j < bytes; j += blockDim.x) dst[j] = src[j];
  }
}

__global__ void copy_rows_kernel(const uint8_t* a, uint8_t* oa, int64_t a_bytes,
                                 const uint8_t* b, uint8_t* ob, int64_t b_bytes) {
  const int64_t row = blockIdx.x;
  copy_row(a + row * a_bytes, oa + row * a_bytes, a_bytes);
  if (b != nullptr) copy_row(b + row * b_bytes, ob + row * b_bytes, b_bytes);
}

std::vector<torch::Tensor> copy_rows(std::vector<torch::Tensor> rows) {
  TORCH_CHECK(rows.size() == 1 || rows.size() == 2, "copy_rows: one or two tensors");
  std::vector<torch::Tensor> outs;
  for (auto& t : rows) {
    TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.dim() == 2, "copy_rows: 2-D CUDA rows");
    TORCH_CHECK(t.size(0) == rows[0].size(0), "copy_rows: the same rows");
    outs.push_back(torch::empty_like(t));
  }
  const int64_t m = rows[0].size(0);
  if (m == 0) return outs;
  auto bytes = [](const torch::Tensor& t) { return t.size(1) * (int64_t)t.element_size(); };
  const bool two = rows.size() == 2;
  const int64_t widest = two ? std::max(bytes(rows[0]), bytes(rows[1])) : bytes(rows[0]);
  // a thread four vectors of the widest row, whole warps, 128-1024 threads
  const int64_t quads = (widest / 64 + 31) / 32 * 32;
  const int threads = (int)std::min<int64_t>(1024, std::max<int64_t>(128, quads));
  copy_rows_kernel<<<m, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      (const uint8_t*)rows[0].data_ptr(), (uint8_t*)outs[0].data_ptr(), bytes(rows[0]),
      two ? (const uint8_t*)rows[1].data_ptr() : nullptr,
      two ? (uint8_t*)outs[1].data_ptr() : nullptr, two ? bytes(rows[1]) : 0);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return outs;
}
"""


@triton.jit
def _copy(a_ptr, b_ptr, out_a, out_b, numel, BLOCK: tl.constexpr, TWO: tl.constexpr):
    # a flat copy of one tensor (TWO: of two of the same numel), BLOCK elements a program
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    tl.store(out_a + offs, tl.load(a_ptr + offs, mask=ok), mask=ok)
    if TWO:
        tl.store(out_b + offs, tl.load(b_ptr + offs, mask=ok), mask=ok)


def triton_copy(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """New copies of one or two contiguous tensors of one numel, by one Triton launch."""
    a = tensors[0]
    b = tensors[-1]
    outs = tuple(torch.empty_like(t) for t in tensors)
    block = PROGRAM_BYTES // max(t.element_size() for t in tensors)
    grid = (triton.cdiv(a.numel(), block),)
    _copy[grid](a, b, outs[0], outs[-1], a.numel(), BLOCK=block, TWO=len(tensors) == 2,
                num_warps=PROGRAM_WARPS)  # fmt: skip
    return outs


@functools.cache
def _cuda_copy() -> Callable:
    from torch.utils.cpp_extension import load_inline

    mod = load_inline(
        name="rmsnorm_ceiling_copy_rows",
        cpp_sources="std::vector<torch::Tensor> copy_rows(std::vector<torch::Tensor> rows);",
        cuda_sources=_CUDA_SOURCE,
        functions=["copy_rows"],
        extra_cuda_cflags=["-O3"],
    )
    return mod.copy_rows


def cuda_copy(*rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """New copies of one or two 2-D contiguous CUDA tensors of the same rows, one CTA a
    row (built on the first call)."""
    return tuple(_cuda_copy()(list(rows)))


def _scaled(*tensors_and_one: torch.Tensor) -> tuple[torch.Tensor, ...]:
    *tensors, one = tensors_and_one
    return tuple(t * one for t in tensors)


@functools.cache
def _inductor() -> Callable:
    return torch.compile(_scaled, dynamic=True, fullgraph=True)


def calls(op_name: str, inputs: tuple) -> dict[str, Callable[[], object]]:
    """The ceiling kernels of a forward op's inputs, as calls of no argument ({} for an op
    these do not model: the gradient ops)."""
    if op_name == "rms_norm":
        rows = (inputs[0],)
    elif op_name == "fused_add_rms_norm":
        rows = (inputs[0], inputs[1])
    else:
        return {}
    if not all(t.is_contiguous() and t.numel() == rows[0].numel() for t in rows):
        return {}
    one = torch.ones((), dtype=torch.float32, device=rows[0].device)
    out = {
        "copy": lambda: tuple(t.clone() for t in rows),
        "triton": functools.partial(triton_copy, *rows),
        "inductor": functools.partial(_inductor(), *rows, one),
    }
    if rows[0].is_cuda:
        two_d = tuple(t.reshape(-1, t.shape[-1]) for t in rows)
        out["cuda"] = functools.partial(cuda_copy, *two_d)
    return out
