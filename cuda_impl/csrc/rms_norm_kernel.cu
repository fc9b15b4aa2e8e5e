// Fused RMSNorm forward in CUDA C++: y = x / sqrt(mean(x^2) + eps) * weight, and the fused
// residual add: residual_out = x + residual (rounded once to residual's dtype), y = RMSNorm
// of residual_out; one kernel serves both (R = void for the plain op), x and residual read once.
//
// Parallelisation: a "row group" of ROW_THREADS threads owns one row. For small N a block
// holds several row groups (8..64 threads a row, 128 threads a block); for large N a block
// of up to 1024 threads owns one row; for rows wider than one block can hold in registers
// (N > 8192 vectors), a thread-block cluster of 2..8 CTAs shares the row and combines its
// partial sums through distributed shared memory (sm_90). In every path the row is loaded
// once into registers (VPT 16-byte vectors a thread), reduced, scaled and stored: x is read
// from HBM exactly once. Variants of the same kernel change how x is loaded and how long
// its converted values live (kPlainLoads, kLeanRegs); the ladders say which each width gets.
// 16-bit rows of 4096, 8192 or 12288 elements whose every access is a whole aligned vector
// take the row-chunk body instead (kRowChunks: one CTA a row, each thread its own vectors and no
// head or tail), many rows or few; rows of whole aligned vectors from 32768 elements take
// clusters of up to 16 CTAs that each stage a contiguous slice in shared memory
// (kWholeVectors, kStagedRow; both ops), no head or tail either. Many 16-bit rows off the
// 16-byte grid (odd N, odd offsets) take a ladder of their own (kOdd16).
//
// Alignment: the row is split into a scalar head (elements before x's first 16-byte
// boundary), a body of 16-byte vectors, and a scalar tail. So N = 4095 or 4097, storage
// offsets and strided rows all keep vector loads; y is stored with vectors whenever its row
// shares x's alignment (always, for contiguous x), and the weight is read with vectors when
// its offset allows.
//
// Precision: the policy of native F.rms_norm's fused path (rmsnorm_api): fp32 squares and
// sum, rsqrt and weight multiply in fp32, one cast to x's dtype at the store.
//
// Learned from: Apex / PyTorch's fused RMSNorm (warp shuffles, vector IO), QuACK's rmsnorm
// (rows in registers, clusters for wide rows), the CUDA programming guide on clusters.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "rms_norm.h"
#include "rms_norm_device.cuh"

namespace cuda_impl {
namespace {

// One of x's 16-byte vectors as the values a thread holds through the reduction: x's own
// (Pack<T>) for the plain op and for a fused add whose residual has x's dtype; fp32 sums,
// two 16-byte registers' worth, for an fp32 residual stream beside 16-bit x.
template <typename T>
union Wide {
  uint4 raw[2];
  float e[kVec<T>];
};
template <typename T, typename H>
using Lanes = std::conditional_t<sizeof(H) == sizeof(T), Pack<T>, Wide<T>>;

// The q-th 16-byte register of a held vector.
template <typename T>
__device__ __forceinline__ uint4& lane_raw(Pack<T>& p, int) { return p.raw; }
template <typename T>
__device__ __forceinline__ uint4& lane_raw(Wide<T>& p, int q) { return p.raw[q]; }

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}
inline bool aligned16_host(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

constexpr int kMaxClusterRanks = 8;  // portable cluster size
// A staged row's clusters (kStagedRow) may take up to 16 CTAs, the H100/H200's non-portable
// size (asked for at launch): a slice of 256 x 8 vectors a CTA, the fastest, holds a 16-bit
// row of 262144 only on 16 CTAs.
constexpr int kMaxStagedRanks = 16;

// Ask for the line holding p to be brought into L1 (no register, no wait).
template <typename W>
__device__ __forceinline__ void prefetch_l1(const W* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// Kernel variants (bits of Config::variant):
// - kPlainLoads: x through a plain `ld.global.v4` (SASS LDG.E.128), what Triton emits for
//   the same access, instead of the read-only, non-allocating load (LDG.E.NA.128.CONSTANT):
//   ahead wherever several CTAs share an SM, behind for a 1024-thread CTA alone on its SM.
// - kLeanRegs: x's vectors are re-read as raw bits after the reduction, so the compiler
//   converts them to fp32 again for the store instead of keeping the fp32 copies alive
//   through the reduction: fewer registers, more CTAs an SM.
// - kHintOnlyLoads / kNcOnlyLoads (sweep-only): the two halves of the read-only,
//   non-allocating load apart, `ld.global.L1::no_allocate` and `ld.global.nc`, to tell
//   which one costs the plain loads' lead.
// Measurements behind each: docs/PERF_NOTES.md ("Why the defaults are what they are").
constexpr int kPlainLoads = 1;
constexpr int kLeanRegs = 2;
constexpr int kHintOnlyLoads = 4;
constexpr int kNcOnlyLoads = 8;
// - kLateWeight: no early weight vectors; the weight is read after the reduction, as for
//   wider rows (its 16 registers a thread cost occupancy: beside the fused add's residual
//   vectors, and on rows off the 16-byte grid, where few rows could use them).
constexpr int kLateWeight = 16;
// - kRowChunks (rms_norm, one CTA a row): the row in CTA-wide chunks of ROW_THREADS x VPT
//   vectors, the first held in registers with its weight loaded beside it, the rest summed
//   as they arrive and read again for the scale; every access a whole 16-byte vector, no
//   scalar head or tail (row_chunks).
constexpr int kRowChunks = 32;
// - kWholeVectors | kStagedRow (clusters of both ops, the two together): a row whose every
//   access is a whole aligned 16-byte vector takes staged_slice: each CTA a contiguous
//   slice, no scalar head or tail, no per-access alignment test, copied into shared memory
//   by cp.async.ca (an L1-allocating copy: the non-allocating .cg lost 6-7 points of copy
//   at every shape, the same kernel otherwise) and read from there twice, the weight (of
//   x's dtype) loaded into registers while the copies fly: no row values held in registers
//   through the cluster's sum. Dynamic shared memory: ROW_THREADS x VPT x 16 bytes (the
//   fused add: and the residual's). Other rows take the general body (kPlainLoads and
//   kLeanRegs apply to it).
constexpr int kWholeVectors = 64;
constexpr int kStagedRow = 128;

// x's 16-byte vectors, loaded as VARIANT's bits say (default: read-only, no L1 allocation).
#define RMS_NORM_LD_V4(OP) \
  asm volatile(OP " {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p))
template <int VARIANT>
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  if constexpr ((VARIANT & kPlainLoads) != 0) {
    RMS_NORM_LD_V4("ld.global.v4.u32");
  } else if constexpr ((VARIANT & kHintOnlyLoads) != 0) {
    RMS_NORM_LD_V4("ld.global.L1::no_allocate.v4.u32");
  } else if constexpr ((VARIANT & kNcOnlyLoads) != 0) {
    RMS_NORM_LD_V4("ld.global.nc.v4.u32");
  } else {
    RMS_NORM_LD_V4("ld.global.nc.L1::no_allocate.v4.u32");
  }
  return v;
}
#undef RMS_NORM_LD_V4

// VEC weights as floats starting at w (element offset already applied); vector loads when
// the address is 16-byte aligned (fp32 weights beside 16-bit x take two vectors).
template <typename W, int VEC>
__device__ __forceinline__ void load_weight(const W* __restrict__ w, bool vec_ok,
                                            float (&out)[VEC]) {
  if (vec_ok) {
    constexpr int kPer = 16 / sizeof(W);
#pragma unroll
    for (int v = 0; v < VEC / kPer; ++v) {
      Pack<W> p;
      p.raw = __ldg(reinterpret_cast<const uint4*>(w) + v);
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[v * kPer + i] = to_float(p.e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(__ldg(w + i));
  }
}

constexpr int block_threads(int row_threads) { return row_threads < 128 ? 128 : row_threads; }
// The most CTAs a cluster of a config with this variant may have.
constexpr int max_ranks(int variant) {
  return (variant & kStagedRow) != 0 ? kMaxStagedRanks : kMaxClusterRanks;
}
// CTAs an SM the compiler must fit in registers: rms_norm's staged row's at 64 registers a
// thread (its slices live in shared memory; the general body it keeps for rows off the
// 16-byte grid would take 74 at 256 x 8, one CTA an SM fewer); 0 for any other, which
// leaves the choice to the compiler as the one-argument form does (a 1 there took 512 x 8
// from 64 to 72 registers, one CTA an SM, and bf16 32768 from 86% to 79% of copy). The
// fused add's staged configs hold twice the shared memory (two 256 x 8 CTAs an SM either
// way), and its general body spilled 76-588 bytes under 64 registers.
constexpr int min_blocks(int row_threads, int variant, bool fused) {
  return (variant & kStagedRow) != 0 && !fused ? 65536 / (block_threads(row_threads) * 64) : 0;
}

// A row split at x's 16-byte boundaries: `head` scalars, `nvec` 16-byte vectors from
// element head, `tail` scalars from element tail0.
struct RowSplit {
  int head, nvec, tail0, tail;
};

template <typename T>
__device__ __forceinline__ RowSplit split_row(const T* xr, int N) {
  constexpr int VEC = kVec<T>;
  const int misalign = static_cast<int>(reinterpret_cast<uintptr_t>(xr) & 15) / sizeof(T);
  RowSplit sp;
  sp.head = min(misalign ? VEC - misalign : 0, N);
  sp.nvec = (N - sp.head) / VEC;
  sp.tail0 = sp.head + sp.nvec * VEC;
  sp.tail = N - sp.tail0;
  return sp;
}

// This thread's sum of squares in fp32 (zero-filled lanes add nothing).
template <typename L, int VPT>
__device__ __forceinline__ float sum_squares(const L (&v)[VPT], float xh, float xt) {
  constexpr int kElems = sizeof(v[0].e) / sizeof(v[0].e[0]);
  float ss = xh * xh + xt * xt;
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      const float f = to_float(v[k].e[i]);
      ss = fmaf(f, f, ss);
    }
  return ss;
}

// 1 / sqrt(ss / N + eps), the row's scale, for the row-chunk body. The approximate divide
// and reciprocal square root (what Triton's kernels emit, a few ulp) cost no slow path: an
// IEEE divide checks its operands and branches to a subroutine, rsqrtf corrects denormal
// inputs, which a mean plus an eps of at least FLT_MIN never is; a decode-sized call's time
// is its instruction chain. The other bodies keep rsqrtf(ss / N + eps): in them the
// approximate form let the compiler keep more of the row live across the reduction (more
// registers, fewer CTAs an SM; docs/PERF_NOTES.md, v35).
__device__ __forceinline__ float approx_rstd(float ss, int N, float eps) {
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(__fdividef(ss, static_cast<float>(N)) + eps));
  return r;
}

// The sum over a row group: warp shuffles (xor stays inside aligned groups of ROW_THREADS
// < 32), then, for groups wider than a warp, shared memory (a block barrier: every thread
// of the block must call this).
template <int ROW_THREADS>
__device__ __forceinline__ float group_sum(float ss, float* warp_sums) {
  constexpr int WARPS_PER_ROW = ROW_THREADS / 32;
#pragma unroll
  for (int off = (ROW_THREADS < 32 ? ROW_THREADS : 32) / 2; off > 0; off /= 2)
    ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if constexpr (WARPS_PER_ROW > 1) {
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
    __syncthreads();
    const int first = (threadIdx.x / ROW_THREADS) * WARPS_PER_ROW;
    ss = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS_PER_ROW; ++i) ss += warp_sums[first + i];
  }
  return ss;
}

// A cluster CTA's contiguous share of a row of nvec vectors (the last one shorter): this
// thread's first vector lo, and the share's end hi (lo >= hi: nothing for this thread).
struct Slice {
  int lo, hi;
};
__device__ __forceinline__ Slice slice_of(int nvec, int rank, int ranks) {
  const int share = (nvec + ranks - 1) / ranks;
  return {rank * share + static_cast<int>(threadIdx.x), min(nvec, (rank + 1) * share)};
}

// One 16-byte vector copied into shared memory, L1-allocating (see kStagedRow).
__device__ __forceinline__ void copy_async_ca(uint4* dst, const uint4* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src)
               : "memory");
}

// Whether a staged slice's weight vectors are loaded beside its copies (x's dtype), or
// read after the sum (an fp32 weight beside 16-bit x: twice the registers).
template <typename T, typename W>
constexpr bool kWeightBeside = sizeof(W) == sizeof(T);
template <typename T, typename W, int VPT>
using SliceWeight = Pack<W>[kWeightBeside<T, W> ? VPT : 1];

// Issued after a staged slice's copies: its weight vectors, where they are loaded beside.
template <typename T, typename W, int BLOCK, int VPT>
__device__ __forceinline__ void load_slice_weight(const W* __restrict__ w, const Slice& sl,
                                                  SliceWeight<T, W, VPT>& wv) {
  if constexpr (kWeightBeside<T, W>) {
    const uint4* wp = reinterpret_cast<const uint4*>(w);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = sl.lo + k * BLOCK;
      wv[k].raw = j < sl.hi && w != nullptr ? __ldg(wp + j) : make_uint4(0, 0, 0, 0);
    }
  }
}

// The weight's floats for vector j (the k-th of this thread's) of a staged slice.
template <typename T, typename W, int VPT>
__device__ __forceinline__ void slice_weight(const W* __restrict__ w,
                                             const SliceWeight<T, W, VPT>& wv, int k, int j,
                                             float (&wf)[kVec<T>]) {
  constexpr int VEC = kVec<T>;
  if (w == nullptr) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) wf[i] = 1.f;
  } else if constexpr (kWeightBeside<T, W>) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) wf[i] = to_float(wv[k].e[i]);
  } else {
    load_weight<W, VEC>(w + j * VEC, true, wf);
  }
}

// kWholeVectors | kStagedRow: a cluster's row of whole aligned 16-byte vectors (x, y, the
// weight and, for the fused add, the residual and residual_out 16-byte aligned, N a
// multiple of a vector). CTA `rank` of `ranks` takes a contiguous slice, an equal share of
// the row (the last one shorter); each thread copies its vectors of it (every BLOCK-th)
// into its own slots of shared memory (slot k of thread t at k x BLOCK + t: a warp's
// reads are 512 contiguous bytes), and sums and scales them from there. The fused add
// (R: the residual's type) copies the residual's vectors too, into NH slots a vector of x
// after x's (an fp32 residual beside 16-bit x takes two), and writes residual_out = x +
// residual, rounded once to R, out and over them before the sum. Dynamic shared memory:
// ROW_THREADS x VPT x 16 bytes, x (1 + NH) for the fused add. Every thread of every CTA
// of the cluster must call it.
template <typename T, typename W, typename R, int BLOCK, int VPT>
__device__ __forceinline__ void staged_slice(const T* __restrict__ xr, const R* __restrict__ rr,
                                             R* __restrict__ ro, const W* __restrict__ w,
                                             T* __restrict__ yr, int N, float eps, int rank,
                                             int ranks, float* parts, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kFused = !std::is_void_v<R>;
  using H = std::conditional_t<kFused, R, T>;  // what the sum and the scale read
  constexpr int VEC = kVec<T>;
  constexpr int NH = sizeof(H) / sizeof(T);
  extern __shared__ uint4 stage[];
  uint4* sh = kFused ? stage + BLOCK * VPT : stage;  // slot q of vector k: (k NH + q) BLOCK + t
  const int t = threadIdx.x;
  const Slice sl = slice_of(N / VEC, rank, ranks);
  const uint4* xp = reinterpret_cast<const uint4*>(xr);
  uint4* yp = reinterpret_cast<uint4*>(yr);
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = sl.lo + k * BLOCK;
    if (j >= sl.hi) continue;
    copy_async_ca(&stage[k * BLOCK + t], xp + j);
    if constexpr (kFused) {
#pragma unroll
      for (int q = 0; q < NH; ++q)
        copy_async_ca(&sh[(k * NH + q) * BLOCK + t], reinterpret_cast<const uint4*>(rr) + j * NH + q);
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  SliceWeight<T, W, VPT> wv;
  load_slice_weight<T, W, BLOCK, VPT>(w, sl, wv);
  asm volatile("cp.async.wait_all;" ::: "memory");
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = sl.lo + k * BLOCK;
    if (j >= sl.hi) break;
    Lanes<T, H> h;
#pragma unroll
    for (int q = 0; q < NH; ++q) lane_raw<T>(h, q) = sh[(k * NH + q) * BLOCK + t];
    if constexpr (kFused) {
      Pack<T> xv;
      xv.raw = stage[k * BLOCK + t];
#pragma unroll
      for (int i = 0; i < VEC; ++i) h.e[i] = from_float<R>(to_float(xv.e[i]) + to_float(h.e[i]));
#pragma unroll
      for (int q = 0; q < NH; ++q) {
        reinterpret_cast<uint4*>(ro)[j * NH + q] = lane_raw<T>(h, q);
        sh[(k * NH + q) * BLOCK + t] = lane_raw<T>(h, q);
      }
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss = fmaf(to_float(h.e[i]), to_float(h.e[i]), ss);
  }
  const float rstd =
      rsqrtf(cluster_sum<BLOCK>(ss, parts, bar, rank, ranks) / static_cast<float>(N) + eps);
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = sl.lo + k * BLOCK;
    if (j >= sl.hi) break;
    float wf[VEC];
    slice_weight<T, W, VPT>(w, wv, k, j, wf);
    Lanes<T, H> h;
#pragma unroll
    for (int q = 0; q < NH; ++q) lane_raw<T>(h, q) = sh[(k * NH + q) * BLOCK + t];
    Pack<T> o;
#pragma unroll
    for (int i = 0; i < VEC; ++i) o.e[i] = from_float<T>(to_float(h.e[i]) * rstd * wf[i]);
    yp[j] = o.raw;
  }
#endif
}

// 16-bit x with a 16-bit weight, CTAs under 1024 threads, at most 4 vectors a thread:
// this thread's weight vectors, issued right after x's so their latency (an L2 hit) hides
// under x's instead of following the reduction; returns whether it loaded them (the
// weight's vectors are 16-byte aligned here). The early vectors cost registers: with more
// than 4 vectors a thread they halve occupancy or spill, so not there. Not for 1024-thread
// CTAs (64 registers a thread at most; they prefetch into L1 instead) nor fp32 (near the
// copy ceiling without it). Figures: docs/PERF_NOTES.md.
template <typename T, typename W, int BLOCK, int VPT, int VARIANT>
__device__ __forceinline__ bool load_weight_early(const W* __restrict__ w, const RowSplit& sp,
                                                  int g, int G, bool row_ok,
                                                  Pack<W> (&wv)[VPT]) {
  if constexpr (sizeof(T) == 2 && sizeof(W) == 2 && BLOCK < 1024 && VPT <= 4 &&
                (VARIANT & kLateWeight) == 0) {
    // predicated loads, no early return: a branch here let the compiler schedule the sum
    // of squares (which waits for x) first and issue these only after x had arrived
    const W* base = w != nullptr ? w + sp.head : w;
    const bool ok = base != nullptr && row_ok && aligned16(base);
    const uint4* wp = reinterpret_cast<const uint4*>(base);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = g + k * G;
      wv[k].raw = ok && j < sp.nvec ? __ldg(wp + j) : make_uint4(0, 0, 0, 0);
    }
    return ok;
  }
  return false;
}

// y = x * rstd * weight for this thread's slice of the row: body vectors g, g + G, ...
// (VPT of them at most), then head element g and tail element g; fp32 math, one cast.
// wv: this thread's weight vectors when load_weight_early loaded them (w_early), else
// the weight is read here.
template <typename T, typename W, typename L, int VPT>
__device__ __forceinline__ void scale_store(const L (&v)[VPT], float xh, float xt,
                                            const RowSplit& sp, int g, int G, float rstd,
                                            const W* __restrict__ w, T* yr,
                                            const Pack<W> (&wv)[VPT], bool w_early) {
  constexpr int VEC = kVec<T>;
  const bool y_vec = aligned16(yr + sp.head);
  const bool w_vec = w != nullptr && aligned16(w + sp.head);
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = g + k * G;
    if (j >= sp.nvec) break;
    const int e0 = sp.head + j * VEC;
    float wf[VEC];
    if (w_early) {
      if constexpr (sizeof(W) == sizeof(T)) {  // always so when w_early is set
#pragma unroll
        for (int i = 0; i < VEC; ++i) wf[i] = to_float(wv[k].e[i]);
      }
    } else if (w != nullptr) {
      load_weight<W, VEC>(w + e0, w_vec, wf);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) wf[i] = 1.f;
    }
    Pack<T> o;
#pragma unroll
    for (int i = 0; i < VEC; ++i) o.e[i] = from_float<T>(to_float(v[k].e[i]) * rstd * wf[i]);
    if (y_vec) {
      *reinterpret_cast<uint4*>(yr + e0) = o.raw;
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) yr[e0 + i] = o.e[i];
    }
  }
  if (g < sp.head) {
    const float wh = w != nullptr ? to_float(__ldg(w + g)) : 1.f;
    yr[g] = from_float<T>(xh * rstd * wh);
  }
  if (g < sp.tail) {
    const float wt = w != nullptr ? to_float(__ldg(w + sp.tail0 + g)) : 1.f;
    yr[sp.tail0 + g] = from_float<T>(xt * rstd * wt);
  }
}

// ---- the row-chunk body ------------------------------------------------------------------
// kRowChunks: one CTA a row, for rows whose every access is a whole aligned 16-byte vector
// (x's and y's rows and the weight 16-byte aligned, N a multiple of a vector; the launcher
// picks it only for such rows). Each thread runs the work of its own vectors and nothing
// else: no head or tail, no unused vector slots (a decode-sized call is a few CTAs whose
// instruction count is their time). A row wider than the first chunk is walked as
// torch.compile's looped reduction walks it: later chunks summed as they arrive, then read
// again (from L1 or L2, where they have just been) for the scale, on few registers a
// thread, so many CTAs share an SM. Any other row (a forced config only) takes a scalar
// loop, correct at any alignment and width.
template <typename T, typename W, int ROW_THREADS, int VPT>
__device__ __forceinline__ void row_chunks(const T* __restrict__ x, const W* __restrict__ w,
                                           T* __restrict__ y, int64_t stride_x,
                                           int64_t stride_y, int N, float eps,
                                           float* warp_sums) {
  constexpr int VEC = kVec<T>;
  constexpr int CHUNK = ROW_THREADS * VPT;           // vectors a sweep of the CTA covers
  constexpr int NW = sizeof(W) / sizeof(T);          // weight vectors per x vector
  static_assert(ROW_THREADS >= 128 && ROW_THREADS % 32 == 0, "one row a CTA of whole warps");
  const int64_t row = blockIdx.x;
  const T* xr = x + row * stride_x;
  T* yr = y + row * stride_y;
  const int t = threadIdx.x;
  const bool vec_ok =
      N % VEC == 0 && aligned16(xr) && aligned16(yr) && (w == nullptr || aligned16(w));
  if (!vec_ok) {  // any alignment: element by element, x read twice
    float ss = 0.f;
    for (int e = t; e < N; e += ROW_THREADS) {
      const float f = to_float(xr[e]);
      ss = fmaf(f, f, ss);
    }
    const float rstd = approx_rstd(group_sum<ROW_THREADS>(ss, warp_sums), N, eps);
    for (int e = t; e < N; e += ROW_THREADS) {
      const float wf = w != nullptr ? to_float(__ldg(w + e)) : 1.f;
      yr[e] = from_float<T>(to_float(xr[e]) * rstd * wf);
    }
    return;
  }
  const int nvec = N / VEC;
  const uint4* xp = reinterpret_cast<const uint4*>(xr);
  const uint4* wp = reinterpret_cast<const uint4*>(w);
  uint4* yp = reinterpret_cast<uint4*>(yr);
  // load: the first chunk and its weight, every vector in flight before the first use
  Pack<T> v[VPT];
  uint4 wr[VPT][NW];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = t + k * ROW_THREADS;
    const bool in = j < nvec;
    v[k].raw = in ? load_stream<kPlainLoads>(xp + j) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int q = 0; q < NW; ++q)
      wr[k][q] = in && w != nullptr ? __ldg(wp + j * NW + q) : make_uint4(0, 0, 0, 0);
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (t + k * ROW_THREADS >= nvec) break;
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss = fmaf(to_float(v[k].e[i]), to_float(v[k].e[i]), ss);
  }
  // later chunks: summed as they arrive
  for (int c = CHUNK; c < nvec; c += CHUNK) {
    Pack<T> u[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = c + t + k * ROW_THREADS;
      u[k].raw = j < nvec ? load_stream<kPlainLoads>(xp + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss = fmaf(to_float(u[k].e[i]), to_float(u[k].e[i]), ss);
  }
  // reduce over the CTA
  const float rstd = approx_rstd(group_sum<ROW_THREADS>(ss, warp_sums), N, eps);
  // scale and store: the held chunk, then the later chunks read again
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = t + k * ROW_THREADS;
    if (j >= nvec) break;
    float wf[VEC];
#pragma unroll
    for (int q = 0; q < NW; ++q) {
      Pack<W> p;
      p.raw = wr[k][q];
#pragma unroll
      for (int i = 0; i < kVec<W>; ++i) wf[q * kVec<W> + i] = w != nullptr ? to_float(p.e[i]) : 1.f;
    }
    Pack<T> o;
#pragma unroll
    for (int i = 0; i < VEC; ++i) o.e[i] = from_float<T>(to_float(v[k].e[i]) * rstd * wf[i]);
    yp[j] = o.raw;
  }
  for (int c = CHUNK; c < nvec; c += CHUNK) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = c + t + k * ROW_THREADS;
      if (j >= nvec) break;
      Pack<T> u;
      u.raw = load_stream<kPlainLoads>(xp + j);
      float wf[VEC];
      if (w != nullptr) {
        load_weight<W, VEC>(w + j * VEC, true, wf);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) wf[i] = 1.f;
      }
      Pack<T> o;
#pragma unroll
      for (int i = 0; i < VEC; ++i) o.e[i] = from_float<T>(to_float(u.e[i]) * rstd * wf[i]);
      yp[j] = o.raw;
    }
  }
}

// ---- the kernels -----------------------------------------------------------------------
// A launch config: ROW_THREADS threads a row, VPT 16-byte vectors a thread, or (cluster) a
// cluster of CTAs of ROW_THREADS threads sharing one row; VARIANT: kPlainLoads / kLeanRegs
// / kLateWeight bits (the sweep-only kHintOnlyLoads / kNcOnlyLoads in a sweep build).
struct Config {
  int row_threads = 0;
  int vpt = 0;
  bool cluster = false;
  int variant = 0;
};

// x + residual for this thread's slice, rounded once to R, stored to residual_out and kept
// in v for the reduction and the scale (fused add only). The residual's vectors follow x's
// 16-byte split; where the residual's or residual_out's row does not share that alignment
// (a row stride or offset that breaks it) its elements go one by one.
template <typename T, typename R, int VPT, int VARIANT>
__device__ __forceinline__ void add_residual(const Pack<T> (&xv)[VPT], const R* __restrict__ rr,
                                             R* __restrict__ ro, const RowSplit& sp, int g,
                                             int G, bool row_ok, Lanes<T, R> (&v)[VPT]) {
  constexpr int VEC = kVec<T>;
  constexpr int NR = sizeof(R) / sizeof(T);  // residual vectors per x vector
  const bool r_vec = aligned16(rr + sp.head), ro_vec = aligned16(ro + sp.head);
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = g + k * G;
    const bool in = row_ok && j < sp.nvec;
    const int e0 = sp.head + j * VEC;
    if (r_vec) {
      const uint4* rp = reinterpret_cast<const uint4*>(rr + e0);
#pragma unroll
      for (int q = 0; q < NR; ++q)
        lane_raw<T>(v[k], q) = in ? load_stream<VARIANT>(rp + q) : make_uint4(0, 0, 0, 0);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[k].e[i] = in ? rr[e0 + i] : from_float<R>(0.f);
    }
  }
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = g + k * G;
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      v[k].e[i] = from_float<R>(to_float(xv[k].e[i]) + to_float(v[k].e[i]));
    if (!row_ok || j >= sp.nvec) continue;
    const int e0 = sp.head + j * VEC;
    if (ro_vec) {
#pragma unroll
      for (int q = 0; q < NR; ++q) reinterpret_cast<uint4*>(ro + e0)[q] = lane_raw<T>(v[k], q);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) ro[e0 + i] = v[k].e[i];
    }
  }
}

// One scalar of the head or tail: x's value, or for the fused add x + residual rounded to R
// (stored to residual_out), as the float the reduction and the scale use.
template <typename T, typename R>
__device__ __forceinline__ float edge_value(const T* xr, const R* rr, R* ro, int e, bool in) {
  if constexpr (std::is_void_v<R>) {
    return in ? to_float(xr[e]) : 0.f;
  } else {
    if (!in) return 0.f;
    const R s = from_float<R>(to_float(xr[e]) + to_float(rr[e]));
    ro[e] = s;
    return to_float(s);
  }
}

// The one kernel of both ops: rows of x (R = void: rms_norm), or of x + residual (the fused
// add, R the residual's type), normalised into y. T: x / y element; W: weight element (T or
// float); then a Config's fields, spelled out (nvcc's host stubs take no class-type template
// arguments), which also makes a kernel's name in a profile or an ncu report say its op and
// config. The fused add's in-place form passes y = x and residual_out = residual: each
// element is read whole before the same thread writes it, and no thread touches another's.
template <typename T, typename W, typename R, int ROW_THREADS, int VPT, bool CLUSTER, int VARIANT>
__global__ void __launch_bounds__(block_threads(ROW_THREADS),
                                  min_blocks(ROW_THREADS, VARIANT, !std::is_void_v<R>))
    // the parameters every rms_norm path reads come first: 48 bytes, which with the 16 the
    // parameter bank holds before them make one constant-cache line, so a decode-sized
    // call, whose CTAs each start on a cold constant cache, waits on one miss, not two
    rms_norm_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                    int64_t stride_x,  // elements between rows of x
                    int64_t stride_y,  // ... of y
                    int N, float eps,
                    const R* __restrict__ res, R* __restrict__ res_out,
                    int64_t stride_r,   // ... of residual (fused add)
                    int64_t stride_ro,  // ... of residual_out (fused add)
                    int64_t M) {
  constexpr bool kFused = !std::is_void_v<R>;
  using H = std::conditional_t<kFused, R, T>;  // what a thread holds a row's values as
  constexpr int VEC = kVec<T>;
  constexpr int BLOCK = block_threads(ROW_THREADS);
  constexpr int ROWS = BLOCK / ROW_THREADS;  // row groups per block
  static_assert(ROW_THREADS >= VEC, "head and tail need one thread per element");
  static_assert(!CLUSTER || ROWS == 1, "a cluster shares exactly one row");
  __shared__ float warp_sums[BLOCK / 32];
  // a cluster's row sum: every warp's partial of every CTA, and the mbarrier they land on
  __shared__ float cluster_parts[CLUSTER ? BLOCK / 32 * max_ranks(VARIANT) : 1];
  __shared__ __align__(8) uint64_t cluster_bar;
  if constexpr ((VARIANT & kRowChunks) != 0) {
    static_assert(!kFused && !CLUSTER, "row chunks: rms_norm, one CTA a row");
    row_chunks<T, W, ROW_THREADS, VPT>(x, w, y, stride_x, stride_y, N, eps, warp_sums);
    return;
  }

  // which row, and which slice of it this thread owns
  int rank = 0, ranks = 1;
  int64_t row;
  if constexpr (CLUSTER) {
    cluster_position(rank, ranks);
    row = blockIdx.x / ranks;
  } else {
    row = static_cast<int64_t>(blockIdx.x) * ROWS + threadIdx.x / ROW_THREADS;
  }
  const int lane = threadIdx.x % ROW_THREADS;
  const int g = rank * ROW_THREADS + lane;  // thread index within the row
  const int G = ranks * ROW_THREADS;        // threads sharing the row
  const bool row_ok = row < M;

  // split the row at x's 16-byte boundaries: scalar head, vector body, scalar tail
  const int64_t r0 = row_ok ? row : 0;
  const T* xr = x + r0 * stride_x;
  T* yr = y + r0 * stride_y;
  const RowSplit sp = split_row(xr, N);

  // A CTA may write into a peer's shared memory only once the peer runs, its mbarrier
  // initialised: announce that this one does (no wait here; the wait comes after the loads
  // are in flight). A relaxed arrive: fence.mbarrier_init orders the init before the
  // barrier; a releasing arrive was slower at every cluster shape (PERF_NOTES v23).
  if constexpr (CLUSTER) {
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&cluster_bar))
                   : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cluster_arrive_relaxed();
  }
  if constexpr ((VARIANT & kWholeVectors) != 0) {
    static_assert(CLUSTER && (VARIANT & kStagedRow) != 0, "whole vectors: a cluster a row, staged");
    // one row a cluster, so every CTA of it takes the same branch (both end in cluster_sum)
    const R* rr = nullptr;
    R* ro = nullptr;
    if constexpr (kFused) {
      rr = res + r0 * stride_r;
      ro = res_out + r0 * stride_ro;
    }
    if (N % VEC == 0 && aligned16(xr) && aligned16(yr) && (w == nullptr || aligned16(w)) &&
        (!kFused || (aligned16(rr) && aligned16(ro)))) {
      staged_slice<T, W, R, BLOCK, VPT>(xr, rr, ro, w, yr, N, eps, rank, ranks, cluster_parts,
                                        &cluster_bar);
      return;
    }
  }

  // load: every vector of this thread's slice is in flight before the first use
  Lanes<T, H> v[VPT];
  const uint4* xp = reinterpret_cast<const uint4*>(xr + sp.head);
  const R* rr = nullptr;
  R* ro = nullptr;
  if constexpr (kFused) {
    rr = res + r0 * stride_r;
    ro = res_out + r0 * stride_ro;
    Pack<T> xv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = g + k * G;
      xv[k].raw = (row_ok && j < sp.nvec) ? load_stream<VARIANT>(xp + j) : make_uint4(0, 0, 0, 0);
    }
    add_residual<T, R, VPT, VARIANT>(xv, rr, ro, sp, g, G, row_ok, v);
  } else {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = g + k * G;
      v[k].raw = (row_ok && j < sp.nvec) ? load_stream<VARIANT>(xp + j) : make_uint4(0, 0, 0, 0);
    }
  }
  // The weight is needed only after the reduction. A 1024-thread CTA is alone on its SM,
  // so nothing hides that wait: ask for the weight now (into L1). With several CTAs an SM
  // the prefetches only compete with x's loads (slower, docs/PERF_NOTES.md), so not there.
  if (BLOCK == 1024 && w != nullptr && row_ok) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = g + k * G;
      if (j < sp.nvec) prefetch_l1(w + sp.head + j * VEC);
    }
  }
  Pack<W> wv[VPT];
  const bool w_early =
      sizeof(H) == sizeof(T) && load_weight_early<T, W, BLOCK, VPT, VARIANT>(w, sp, g, G, row_ok, wv);
  const float xh = edge_value<T, R>(xr, rr, ro, g, row_ok && g < sp.head);
  const float xt = edge_value<T, R>(xr, rr, ro, sp.tail0 + g, row_ok && g < sp.tail);

  // reduce: within the row group (warp shuffles, then shared memory across its warps) ...
  // (a cluster: over all its CTAs' warps at once, through distributed shared memory)
  float ss;
  if constexpr (CLUSTER) {
    ss = cluster_sum<BLOCK>(sum_squares(v, xh, xt), cluster_parts, &cluster_bar, rank, ranks);
  } else {
    ss = group_sum<ROW_THREADS>(sum_squares(v, xh, xt), warp_sums);
  }
  const float rstd = rsqrtf(ss / static_cast<float>(N) + eps);
  if constexpr ((VARIANT & kLeanRegs) != 0) {
#pragma unroll
    for (int k = 0; k < VPT; ++k)  // opaque to the compiler: the raw bits "change" here
#pragma unroll
      for (int q = 0; q < static_cast<int>(sizeof(H) / sizeof(T)); ++q) {
        uint4& r = lane_raw<T>(v[k], q);
        asm volatile("" : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w));
      }
  }
  if (row_ok) scale_store(v, xh, xt, sp, g, G, rstd, w, yr, wv, w_early);
}

// ---- launch configuration --------------------------------------------------------------
// One table of rungs an op: a ladder is the rungs of one kind in order, and a row of at most
// max_vecs 16-byte vectors of x takes the first rung of its ladder that holds it. The
// default build compiles exactly the configs an op's rungs name (derived below), each for
// every dtype combination; a sweep build (RMSNORM_SWEEP_CONFIGS, see setup.py) adds the
// plain op's candidates harness.sweep times, reached only by rms_norm_with_config. Why each
// rung has its config: docs/PERF_NOTES.md.
enum class Ladder {
  kMany16,     // 16-bit x, many rows
  kMany32,     // fp32 x, many rows
  kFew,        // fewer row groups than SMs (decode-sized calls): 1-2 vectors a thread
  kCluster16,  // rows wider than one CTA holds: a cluster's CTAs share the row (16-bit)
  kCluster32,  // ... (fp32)
  kRows16,     // 16-bit rows of whole aligned 16-byte vectors, many or few: one CTA a row
  kWhole,      // rows of whole aligned 16-byte vectors, 32768 elements and wider
  kOdd16,      // 16-bit rows off the 16-byte grid (N, or a row's start, not on it), many rows
};
// kWhole takes rows of at least this many elements (both element sizes: the widths its
// sweep measured).
constexpr int kWholeMinN = 32768;
// kRows16 takes rows of a whole number of this many vectors, so that every thread of a
// 256-thread CTA has the same vectors (the widths the sweep measured; 5120 elements, 640
// vectors, lost 6 points of copy to the many-row ladder).
constexpr int kRowChunkVecs = 512;
// kOdd16 takes rows of more than this many vectors (the many-row rung below its first one;
// the band its sweep measured: 4095 and 4097 elements).
constexpr int kOddMinVecs = 256;
struct Rung {
  Ladder ladder;
  int max_vecs;  // widest row (16-byte vectors) it takes: a cluster rung at its most CTAs
  Config config;
};
constexpr int kPlain = kPlainLoads;
constexpr int kLean = kLeanRegs;
constexpr int kPlainLean = kPlainLoads | kLeanRegs;
constexpr int kPlainLate = kPlainLoads | kLateWeight;
// rows off the 16-byte grid in a staged whole-vector kernel take the general body, as lean
constexpr int kStagedWhole = kPlainLean | kWholeVectors | kStagedRow;

// rms_norm. Plain loads wherever CTAs share an SM, read-only ones for a 1024-thread CTA
// alone on its SM; lean registers for the 16-bit rungs of 8 vectors a thread; CTAs of at
// most 512 threads until a row needs more. Many rows: ~64 bytes of x a thread (16-bit),
// ~32 (fp32).
struct PlainTable {
  static constexpr Rung kRungs[] = {
      {Ladder::kMany16, 8, {8, 1, false, kPlain}},
      {Ladder::kMany16, 16, {8, 2, false, kPlain}},
      {Ladder::kMany16, 64, {32, 2, false, kPlain}},
      {Ladder::kMany16, 128, {32, 4, false, kPlain}},
      {Ladder::kMany16, 256, {64, 4, false, kPlain}},
      {Ladder::kMany16, 512, {128, 4, false, kPlainLean}},
      {Ladder::kMany16, 1024, {128, 8, false, kPlainLean}},
      {Ladder::kMany16, 2048, {256, 8, false, kPlainLean}},
      {Ladder::kMany16, 4096, {512, 8, false, kPlainLean}},
      {Ladder::kMany16, 8192, {1024, 8, false}},
      {Ladder::kMany32, 8, {8, 1, false, kPlain}},
      {Ladder::kMany32, 32, {16, 2, false, kPlain}},
      {Ladder::kMany32, 128, {64, 4, false, kPlain}},
      {Ladder::kMany32, 512, {128, 4, false, kPlain}},
      {Ladder::kMany32, 1024, {256, 8, false, kPlain}},
      {Ladder::kMany32, 1536, {512, 4, false, kPlain}},
      {Ladder::kMany32, 4096, {512, 8, false, kPlain}},
      {Ladder::kMany32, 8192, {1024, 8, false}},
      {Ladder::kFew, 8, {8, 1, false, kPlain}},
      {Ladder::kFew, 16, {16, 1, false, kPlain}},
      {Ladder::kFew, 32, {32, 1, false, kPlain}},
      {Ladder::kFew, 64, {32, 2, false, kPlain}},
      {Ladder::kFew, 256, {128, 4, false, kPlain}},
      {Ladder::kFew, 1024, {512, 4, false, kPlain}},
      {Ladder::kFew, 2048, {1024, 4, false}},
      // 16-bit: lean registers, two CTAs an SM; then 1024 x 8 past what 8 of those hold
      {Ladder::kCluster16, 8 * 4096, {512, 8, true, kLean}},
      {Ladder::kCluster16, 8 * 8192, {1024, 8, true}},
      {Ladder::kCluster32, 8 * 4096, {512, 8, true}},
      {Ladder::kCluster32, 8 * 8192, {1024, 8, true}},
      // row chunks: each thread its vectors and nothing else, throughput and decode alike
      {Ladder::kRows16, 512, {256, 2, false, kRowChunks}},
      {Ladder::kRows16, 1536, {256, 4, false, kRowChunks}},
      // wide rows of whole vectors: clusters staged through shared memory, both element
      // sizes. Whichever of 256 x 8 and 512 x 8 fills its slices on the fewest CTAs: 512 x 8
      // on 2-4 where 256 x 8 would take 4-8, 256 x 8 on 16 rather than 512 x 8 on 8
      {Ladder::kWhole, 2 * 2048, {256, 8, true, kStagedWhole}},
      {Ladder::kWhole, 4 * 4096, {512, 8, true, kStagedWhole}},
      {Ladder::kWhole, 16 * 2048, {256, 8, true, kStagedWhole}},
      {Ladder::kWhole, 16 * 4096, {512, 8, true, kStagedWhole}},
      // rows off the 16-byte grid: a row's weight vectors line up with x's only where its
      // head is empty (one row in eight of an odd width), so no early weight, whose
      // registers would cost CTAs an SM for nothing (docs/PERF_NOTES.md, v34)
      {Ladder::kOdd16, 512, {128, 4, false, kPlainLate}},
  };
#ifdef RMSNORM_SWEEP_CONFIGS
  static constexpr Config kSweepOnly[] = {
      // read-only loads
      {8, 1, false},    {8, 2, false},    {16, 1, false},   {16, 2, false},   {32, 1, false},
      {32, 2, false},   {32, 4, false},   {64, 4, false},   {128, 4, false},  {128, 8, false},
      {128, 16, false}, {256, 4, false},  {256, 8, false},  {256, 16, false}, {512, 4, false},
      {512, 8, false},  {512, 16, false},
      // plain loads; lean registers
      {128, 8, false, kPlain},  {256, 4, false, kPlain},  {1024, 4, false, kPlain},
      {1024, 8, false, kPlain}, {128, 8, false, kLean},   {256, 8, false, kLean},
      {256, 16, false, kLean},  {512, 8, false, kLean},   {256, 8, true, kLean},
      {1024, 8, true, kLean},
      // half of the read-only, non-allocating load each
      {128, 4, false, kHintOnlyLoads}, {128, 4, false, kNcOnlyLoads},
      {256, 8, false, kHintOnlyLoads}, {256, 8, false, kNcOnlyLoads},
      // row chunks: two chunks of a 16384-wide 16-bit row
      {512, 2, false, kRowChunks},
      // the odd rows' runner-up, lean registers too (the many-row rung's config before it
      // took lean registers ships on the latency ladder)
      {128, 4, false, kPlainLean | kLateWeight}};
  static constexpr int kNumSweepOnly = sizeof(kSweepOnly) / sizeof(kSweepOnly[0]);
#else
  static constexpr Config kSweepOnly[1] = {};
  static constexpr int kNumSweepOnly = 0;
#endif
};

// fused_add_rms_norm. A residual vector rides with each of x's (two when the residual is
// fp32 beside 16-bit x), so the rungs start from half the vectors a thread the plain op's
// hold, in twice the threads. The 16-bit rungs past 128 vectors and the clusters are what
// the fused sweep measured best (docs/PERF_NOTES.md, v13): the weight read late where the
// register count set the occupancy (256 x 4 at 5120 elements: 83% -> 97% of copy), lean
// registers at 8 vectors a thread, and one 512 x 8 CTA a row up to 4096 vectors where two
// clustered CTAs lost (70% -> 93%).
struct FusedTable {
  static constexpr Rung kRungs[] = {
      {Ladder::kMany16, 8, {8, 1, false, kPlain}},
      {Ladder::kMany16, 16, {16, 1, false, kPlain}},
      {Ladder::kMany16, 32, {32, 1, false, kPlain}},
      {Ladder::kMany16, 64, {32, 2, false, kPlain}},
      {Ladder::kMany16, 128, {64, 2, false, kPlain}},
      {Ladder::kMany16, 256, {128, 2, false, kPlainLate}},
      {Ladder::kMany16, 512, {128, 4, false, kPlainLean}},
      {Ladder::kMany16, 768, {256, 4, false, kPlainLate}},
      {Ladder::kMany16, 1024, {256, 4, false, kPlainLean}},
      {Ladder::kMany16, 1536, {256, 8, false, kPlainLean}},
      {Ladder::kMany16, 2048, {512, 4, false, kPlain}},
      {Ladder::kMany16, 4096, {512, 8, false, kPlainLean}},
      {Ladder::kMany32, 8, {8, 1, false, kPlain}},
      {Ladder::kMany32, 16, {16, 1, false, kPlain}},
      {Ladder::kMany32, 32, {32, 1, false, kPlain}},
      {Ladder::kMany32, 64, {32, 2, false, kPlain}},
      {Ladder::kMany32, 128, {64, 2, false, kPlain}},
      {Ladder::kMany32, 256, {128, 2, false, kPlain}},
      {Ladder::kMany32, 512, {128, 4, false, kPlain}},
      {Ladder::kMany32, 1024, {256, 4, false, kPlain}},
      {Ladder::kMany32, 2048, {512, 4, false, kPlain}},
      {Ladder::kMany32, 4096, {512, 8, false, kPlainLean}},
      {Ladder::kFew, 8, {8, 1, false, kPlain}},
      {Ladder::kFew, 16, {16, 1, false, kPlain}},
      {Ladder::kFew, 32, {32, 1, false, kPlain}},
      {Ladder::kFew, 64, {32, 2, false, kPlain}},
      {Ladder::kFew, 256, {128, 2, false, kPlain}},
      {Ladder::kFew, 1024, {512, 2, false, kPlain}},
      {Ladder::kFew, 2048, {512, 4, false, kPlain}},
      {Ladder::kCluster16, 8 * 1024, {256, 4, true, kPlainLate}},
      {Ladder::kCluster16, 8 * 2048, {512, 4, true, kLateWeight}},
      {Ladder::kCluster16, 8 * 4096, {1024, 4, true}},
      {Ladder::kCluster32, 8 * 1024, {256, 4, true, kPlainLate}},
      {Ladder::kCluster32, 8 * 2048, {512, 4, true}},
      {Ladder::kCluster32, 8 * 4096, {1024, 4, true}},
      {Ladder::kCluster32, 8 * 8192, {1024, 8, true}},
      // wide rows of whole vectors, the residual of x's dtype: rms_norm's staged clusters,
      // 512 x 8 on 2 CTAs only (on 4 it lost to 256 x 8 on 8: docs/PERF_NOTES.md, v33)
      {Ladder::kWhole, 2 * 2048, {256, 8, true, kStagedWhole}},
      {Ladder::kWhole, 2 * 4096, {512, 8, true, kStagedWhole}},
      {Ladder::kWhole, 16 * 2048, {256, 8, true, kStagedWhole}},
      {Ladder::kWhole, 16 * 4096, {512, 8, true, kStagedWhole}},
  };
#ifdef RMSNORM_SWEEP_CONFIGS
  // Candidates the fused sweep keeps timing beside the rungs: lean registers or the late
  // weight at other shapes, one 1024-thread CTA a row (256 x 4 lean is a rung's now).
  static constexpr Config kSweepOnly[] = {{512, 4, false, kPlainLean}, {1024, 4, false, kPlain},
                                          {1024, 4, false}, {128, 4, false, kPlainLate},
                                          {512, 4, false, kPlainLate}};
  static constexpr int kNumSweepOnly = sizeof(kSweepOnly) / sizeof(kSweepOnly[0]);
#else
  static constexpr Config kSweepOnly[1] = {};
  static constexpr int kNumSweepOnly = 0;
#endif
};

template <typename Tb>
constexpr int kNumRungs = sizeof(Tb::kRungs) / sizeof(Rung);

constexpr bool same(const Config& a, const Config& b) {
  return a.row_threads == b.row_threads && a.vpt == b.vpt && a.cluster == b.cluster &&
         a.variant == b.variant;
}

// Whether rung i is the first to name its config.
template <typename Tb>
constexpr bool first_use(int i) {
  for (int j = 0; j < i; ++j)
    if (same(Tb::kRungs[j].config, Tb::kRungs[i].config)) return false;
  return true;
}

template <typename Tb>
constexpr int count_shipped() {
  int n = 0;
  for (int i = 0; i < kNumRungs<Tb>; ++i) n += first_use<Tb>(i);
  return n;
}
template <typename Tb>
constexpr int kNumShipped = count_shipped<Tb>();
template <typename Tb>
constexpr int kNumConfigs = kNumShipped<Tb> + Tb::kNumSweepOnly;

// Every compiled config: the rungs' own (in rung order), then the sweep-only ones.
template <typename Tb>
constexpr std::array<Config, kNumConfigs<Tb>> all_configs() {
  std::array<Config, kNumConfigs<Tb>> all{};
  int n = 0;
  for (int i = 0; i < kNumRungs<Tb>; ++i)
    if (first_use<Tb>(i)) all[n++] = Tb::kRungs[i].config;
  for (int i = 0; i < Tb::kNumSweepOnly; ++i) all[n++] = Tb::kSweepOnly[i];
  return all;
}
template <typename Tb>
constexpr std::array<Config, kNumConfigs<Tb>> kConfigs = all_configs<Tb>();

// Index of a compiled config, or -1.
template <typename Tb>
constexpr int find_config(const Config& c) {
  for (int i = 0; i < kNumConfigs<Tb>; ++i)
    if (same(kConfigs<Tb>[i], c)) return i;
  return -1;
}

// Each rung's index into kConfigs, resolved at compile time.
template <typename Tb>
constexpr std::array<int, kNumRungs<Tb>> rung_configs() {
  std::array<int, kNumRungs<Tb>> idx{};
  for (int i = 0; i < kNumRungs<Tb>; ++i) idx[i] = find_config<Tb>(Tb::kRungs[i].config);
  return idx;
}
template <typename Tb>
constexpr std::array<int, kNumRungs<Tb>> kRungConfig = rung_configs<Tb>();

template <typename Tb>
constexpr bool valid_table() {
  for (int i = 0; i < kNumConfigs<Tb>; ++i)  // compiled once each
    for (int j = 0; j < i; ++j)
      if (same(kConfigs<Tb>[i], kConfigs<Tb>[j])) return false;
  for (int i = 0; i < kNumRungs<Tb>; ++i) {
    const Rung& r = Tb::kRungs[i];
    const int ranks = r.config.cluster ? max_ranks(r.config.variant) : 1;
    const bool any_row = (r.config.variant & kRowChunks) != 0;
    if (!any_row && r.config.row_threads * r.config.vpt * ranks < r.max_vecs) return false;
    for (int j = 0; j < i; ++j)  // a ladder's rungs grow
      if (Tb::kRungs[j].ladder == r.ladder && Tb::kRungs[j].max_vecs >= r.max_vecs) return false;
  }
  return true;
}
static_assert(valid_table<PlainTable>(), "each config compiled once; rungs hold their rows, in order");
static_assert(valid_table<FusedTable>(), "each config compiled once; rungs hold their rows, in order");

}  // namespace

// SMs of a device, asked once per device.
int sm_count(int device) { return device_attribute<cudaDevAttrMultiProcessorCount>(device); }

namespace {

// Which config of a table, and how many CTAs share a row (1 unless the config is a cluster).
struct Plan {
  int config;
  int ranks;
};

// Vectors a row may have under plan p: a row-chunk config walks a row of any width.
template <typename Tb>
int capacity(const Plan& p) {
  const Config& c = kConfigs<Tb>[p.config];
  return (c.variant & kRowChunks) != 0 ? static_cast<int>(kMaxN) : c.row_threads * c.vpt * p.ranks;
}

// The config of the first rung of `ladder` that takes rows of `vecs` vectors, or -1.
template <typename Tb>
int climb(Ladder ladder, int vecs) {
  for (int i = 0; i < kNumRungs<Tb>; ++i) {
    if (Tb::kRungs[i].ladder == ladder && vecs <= Tb::kRungs[i].max_vecs)
      return kRungConfig<Tb>[i];
  }
  return -1;
}

// The fewest CTAs (2, 4, 8 or, staged, 16) of cluster config c that hold a row of `vecs`
// vectors.
inline int fewest_ranks(const Config& c, int vecs) {
  int ranks = 2;
  while (ranks * c.row_threads * c.vpt < vecs) ranks *= 2;
  return ranks;
}

// The default plan for rows of `vecs` vectors of `elem`-byte elements, `rows` of them on a
// GPU of `sms` SMs (rows = 0: many); `vectors`: every access of every row a whole aligned
// 16-byte vector (row_vectors, and y's rows aligned).
template <typename Tb>
Plan default_plan(int vecs, int elem, int64_t rows, int sms, bool vectors) {
  if (vectors && elem == 2 && vecs > 0 && vecs % kRowChunkVecs == 0) {
    const int c = climb<Tb>(Ladder::kRows16, vecs);
    if (c >= 0) return {c, 1};
  }
  if (vectors && vecs * (16 / elem) >= kWholeMinN) {
    const int c = climb<Tb>(Ladder::kWhole, vecs);
    if (c >= 0) return {c, fewest_ranks(kConfigs<Tb>[c], vecs)};
  }
  int config = climb<Tb>(elem == 4 ? Ladder::kMany32 : Ladder::kMany16, vecs);
  if (!vectors && elem == 2 && vecs > kOddMinVecs) {
    const int odd = climb<Tb>(Ladder::kOdd16, vecs);
    if (odd >= 0) config = odd;
  }
  if (config >= 0 && rows > 0) {
    const Config c = kConfigs<Tb>[config];
    const int per_block = block_threads(c.row_threads) / c.row_threads;
    const int64_t groups = (rows + per_block - 1) / per_block;
    const int few = climb<Tb>(Ladder::kFew, vecs);
    if (groups < sms && few >= 0) config = few;
  }
  if (config >= 0) return {config, 1};
  const int cluster = climb<Tb>(elem == 4 ? Ladder::kCluster32 : Ladder::kCluster16, vecs);
  return {cluster, fewest_ranks(kConfigs<Tb>[cluster], vecs)};
}

// ---- dispatch: one table of kernels a dtype combination, indexed like the op's configs ----
template <typename T, typename W, typename R>
using KernelFn = void (*)(const T*, const W*, T*, int64_t, int64_t, int, float, const R*, R*,
                          int64_t, int64_t, int64_t);

template <typename R>
using TableOf = std::conditional_t<std::is_void_v<R>, PlainTable, FusedTable>;

// Whether config i of table Tb is named by a rung of a ladder that rows of elem-byte
// elements climb (the fused add compiles each config only for the dtypes that reach it).
template <typename Tb>
constexpr bool used_by(int i, int elem) {
  const Ladder many = elem == 4 ? Ladder::kMany32 : Ladder::kMany16;
  const Ladder cluster = elem == 4 ? Ladder::kCluster32 : Ladder::kCluster16;
  for (int r = 0; r < kNumRungs<Tb>; ++r) {
    const Ladder l = Tb::kRungs[r].ladder;
    if ((l == many || l == cluster || l == Ladder::kFew || l == Ladder::kWhole ||
         (l == Ladder::kOdd16 && elem == 2)) &&
        same(Tb::kRungs[r].config, kConfigs<Tb>[i]))
      return true;
  }
  return false;
}

// Config I's kernel for this dtype combination: rms_norm compiles every config of its table
// for every dtype pair, the fused add its shipped configs only for the dtypes whose ladders
// name them (null otherwise) and its sweep-only ones for all; the *_with_config entry
// points reach any compiled one.
template <typename T, typename W, typename R, size_t I>
constexpr KernelFn<T, W, R> kernel_of() {
  using C = TableOf<R>;
  if constexpr (std::is_void_v<R> || I >= static_cast<size_t>(kNumShipped<C>) ||
                used_by<C>(I, sizeof(T))) {
    return &rms_norm_kernel<T, W, R, kConfigs<C>[I].row_threads, kConfigs<C>[I].vpt,
                            kConfigs<C>[I].cluster, kConfigs<C>[I].variant>;
  } else {
    return nullptr;
  }
}

template <typename T, typename W, typename R, size_t... I>
std::array<KernelFn<T, W, R>, sizeof...(I)> make_kernels(std::index_sequence<I...>) {
  return {kernel_of<T, W, R, I>()...};
}

// The kernel of config i for this dtype combination: R = void for rms_norm, else the fused
// add's residual type.
template <typename T, typename W, typename R>
KernelFn<T, W, R> kernel_at(int i) {
  static const auto table =
      make_kernels<T, W, R>(std::make_index_sequence<kNumConfigs<TableOf<R>>>{});
  return table[i];
}

// Launch `kernel` (a kernel of config c) over M rows, as a cluster launch when c is one;
// stage_bytes: the shared memory a staged config takes for each of a slice's x vectors.
template <typename Kernel, typename... Args>
void launch_kernel(const char* impl, const Config& c, int ranks, int64_t M, int stage_bytes,
                   Kernel kernel, Args... args) {
  const int block = block_threads(c.row_threads), rows = block / c.row_threads;
  const int64_t blocks = c.cluster ? M * ranks : (M + rows - 1) / rows;
  TORCH_CHECK_VALUE(blocks <= INT32_MAX, impl, ": x has ", num(M),
                    " rows, more than one launch can cover");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // a staged row's slice; past the 48 KB a kernel gets without asking, asked for (set per
  // launch: the attribute belongs to the current device's context, and such a launch, a
  // row of 128 KB or more, is long)
  const int smem = (c.variant & kStagedRow) != 0 ? block * c.vpt * stage_bytes : 0;
  if (smem > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // so, too, a cluster past the portable 8 CTAs (staged rows only)
  if (ranks > kMaxClusterRanks)
    C10_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  if (c.cluster) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        cluster_launch_config(dim3(static_cast<unsigned>(blocks)), block,
                              static_cast<size_t>(smem), stream, dim3(ranks), &attr);
    C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
  } else {
    kernel<<<static_cast<unsigned>(blocks), block, smem, stream>>>(args...);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Whether every row of t (2-D, stride 1 along a row) starts 16-byte aligned.
template <typename T>
bool rows_aligned(const at::Tensor& t) {
  return aligned16_host(t.const_data_ptr()) && (t.size(0) == 1 || t.stride(0) % kVec<T> == 0);
}

// Whether every access to x and the weight is a whole aligned 16-byte vector: N a multiple
// of a vector, x's rows and the weight (when there is one) 16-byte aligned. A launch's
// accesses all are when y's rows are aligned too (a new, contiguous y's are).
template <typename T>
bool row_vectors(const at::Tensor& x2, const at::Tensor& w) {
  return x2.size(1) % kVec<T> == 0 && rows_aligned<T>(x2) &&
         (!w.defined() || aligned16_host(w.const_data_ptr()));
}

// What an op launches for x2's dtype and width: the forced plan or the default one; a
// cluster plan only on a GPU that has clusters. vectors: every access of the launch a
// whole aligned vector (row_vectors, and y's rows aligned).
template <typename T, typename Tb>
Plan plan_for(const char* impl, const at::Tensor& x2, const std::optional<Plan>& forced,
              bool vectors) {
  const int N = static_cast<int>(x2.size(1));
  const int vecs = N / kVec<T>;  // body vectors a row can have, at most
  const int sms = sm_count(x2.device().index());
  const Plan plan = forced.has_value()
                        ? *forced
                        : default_plan<Tb>(vecs, sizeof(T), x2.size(0), sms, vectors);
  const Config& c = kConfigs<Tb>[plan.config];
  TORCH_CHECK_VALUE(vecs <= capacity<Tb>(plan), impl, ": config (", num(c.row_threads), ", ",
                    num(c.vpt), ", cluster ", num(plan.ranks), ") holds ",
                    num(capacity<Tb>(plan) * kVec<T>), " elements a row; N is ", num(N));
  return plan;
}

template <typename Tb>
void check_clusters(const char* impl, const Plan& plan, int N) {
  if (!kConfigs<Tb>[plan.config].cluster) return;
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                        c10::cuda::current_device()));
  TORCH_CHECK_VALUE(major >= 9, impl, ": N = ", num(N),
                    " needs thread-block clusters (sm_90 or newer); this GPU is sm_", num(major),
                    "x");
}

template <typename T, typename W>
void launch(const at::Tensor& x2, const at::Tensor& weight, at::Tensor& y2, float eps,
            const std::optional<Plan>& forced) {
  constexpr const char* kImpl = "cuda_impl.rms_norm";
  const W* w = weight.defined() ? reinterpret_cast<const W*>(weight.const_data_ptr()) : nullptr;
  const int64_t M = x2.size(0);
  const int N = static_cast<int>(x2.size(1));
  const bool vectors = row_vectors<T>(x2, weight) && rows_aligned<T>(y2);
  const Plan plan = plan_for<T, PlainTable>(kImpl, x2, forced, vectors);
  check_clusters<PlainTable>(kImpl, plan, N);
  launch_kernel(kImpl, kConfigs<PlainTable>[plan.config], plan.ranks, M, 16,
                kernel_at<T, W, void>(plan.config),
                reinterpret_cast<const T*>(x2.const_data_ptr()), w,
                reinterpret_cast<T*>(y2.mutable_data_ptr()), x2.stride(0), y2.stride(0), N, eps,
                nullptr, nullptr, int64_t{0}, int64_t{0}, M);
}

template <typename T, typename W, typename R>
void launch_fused(const at::Tensor& x2, const at::Tensor& r2, const at::Tensor& weight,
                  at::Tensor& y2, at::Tensor& ro2, float eps, const std::optional<Plan>& forced) {
  constexpr const char* kImpl = "cuda_impl.fused_add_rms_norm";
  const W* w = weight.defined() ? reinterpret_cast<const W*>(weight.const_data_ptr()) : nullptr;
  const int64_t M = x2.size(0);
  const int N = static_cast<int>(x2.size(1));
  // whole vectors: as rms_norm's, and the residual's rows and residual_out's aligned too; a
  // residual of x's dtype only (an fp32 residual beside 16-bit x keeps the general clusters)
  const bool vectors = sizeof(R) == sizeof(T) && row_vectors<T>(x2, weight) &&
                       rows_aligned<T>(y2) && rows_aligned<R>(r2) && rows_aligned<R>(ro2);
  const Plan plan = plan_for<T, FusedTable>(kImpl, x2, forced, vectors);
  check_clusters<FusedTable>(kImpl, plan, N);
  const KernelFn<T, W, R> kernel = kernel_at<T, W, R>(plan.config);
  // only a forced config can be one the default build leaves out for this dtype
  TORCH_CHECK_VALUE(kernel != nullptr, "cuda_impl.fused_add_rms_norm_with_config: config (",
                    num(kConfigs<FusedTable>[plan.config].row_threads), ", ",
                    num(kConfigs<FusedTable>[plan.config].vpt),
                    ") is compiled only for the dtypes whose ladders name it, not for x's; see "
                    "cuda_impl.compiled_configs('fused_add_rms_norm')");
  launch_kernel(kImpl, kConfigs<FusedTable>[plan.config], plan.ranks, M,
                static_cast<int>(16 * (1 + sizeof(R) / sizeof(T))), kernel,
                reinterpret_cast<const T*>(x2.const_data_ptr()), w,
                reinterpret_cast<T*>(y2.mutable_data_ptr()), x2.stride(0), y2.stride(0), N, eps,
                reinterpret_cast<const R*>(r2.const_data_ptr()),
                reinterpret_cast<R*>(ro2.mutable_data_ptr()), r2.stride(0), ro2.stride(0), M);
}

// The things done per (x dtype, weight dtype[, residual dtype]): launching either op, and
// describing rms_norm's launch.
struct Launch {
  template <typename T, typename W>
  static void apply(const at::Tensor& x2, const at::Tensor& w, at::Tensor& y2, float eps,
                    const std::optional<Plan>& plan) {
    launch<T, W>(x2, w, y2, eps, plan);
  }
};

struct LaunchFused {
  template <typename T, typename W>
  static void apply(const at::Tensor& x2, const at::Tensor& r2, const at::Tensor& w,
                    at::Tensor& y2, at::Tensor& ro2, float eps, const std::optional<Plan>& plan) {
    if (r2.scalar_type() == at::kFloat)
      return launch_fused<T, W, float>(x2, r2, w, y2, ro2, eps, plan);
    return launch_fused<T, W, T>(x2, r2, w, y2, ro2, eps, plan);
  }
};

struct Describe {
  // out: row_threads, vpt, ranks, variant, registers, local bytes, static shared bytes,
  // max threads; of the launch into a new (contiguous, aligned) y
  template <typename T, typename W>
  static void apply(const at::Tensor& x2, const at::Tensor& w, std::vector<int64_t>& out) {
    const Plan plan =
        plan_for<T, PlainTable>("cuda_impl.rms_norm", x2, std::nullopt, row_vectors<T>(x2, w));
    cudaFuncAttributes attr = {};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel_at<T, W, void>(plan.config)));
    const Config& c = kConfigs<PlainTable>[plan.config];
    out = {c.row_threads,
           c.vpt,
           plan.ranks,
           c.variant,
           attr.numRegs,
           static_cast<int64_t>(attr.localSizeBytes),
           static_cast<int64_t>(attr.sharedSizeBytes),
           attr.maxThreadsPerBlock};
  }
};

// F::apply<T, W>(args...) for x's dtype and the weight's (x's dtype, fp32, or none).
template <typename F, typename... Args>
void dispatch(at::ScalarType x_type, const at::Tensor& w, Args&&... args) {
  const bool w_fp32 = w.defined() && w.scalar_type() == at::kFloat;
  switch (x_type) {
    case at::kFloat:
      return F::template apply<float, float>(std::forward<Args>(args)...);
    case at::kHalf:
      if (w_fp32) return F::template apply<__half, float>(std::forward<Args>(args)...);
      return F::template apply<__half, __half>(std::forward<Args>(args)...);
    case at::kBFloat16:
      if (w_fp32) return F::template apply<__nv_bfloat16, float>(std::forward<Args>(args)...);
      return F::template apply<__nv_bfloat16, __nv_bfloat16>(std::forward<Args>(args)...);
    default:
      TORCH_CHECK_TYPE(false, "cuda_impl: unsupported dtype ", x_type);
  }
}

// Dispatch on x's dtype and the weight's (x's dtype, fp32, or none).
void run(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
         at::Tensor& y, const std::optional<Plan>& plan = std::nullopt) {
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor y2 = y.view({-1, x.size(-1)});
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  dispatch<Launch>(x.scalar_type(), w, x2, w, y2, static_cast<float>(eps), plan);
}

// The fused add into y and residual_out (x and residual themselves for the in-place form,
// whose checks made sure they view as rows).
void run_fused(const at::Tensor& x, const at::Tensor& residual,
               const std::optional<at::Tensor>& weight, double eps, at::Tensor& y,
               at::Tensor& residual_out, const std::optional<Plan>& plan = std::nullopt) {
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(-1);
  const at::Tensor x2 = x.reshape({-1, n}), r2 = residual.reshape({-1, n});
  at::Tensor y2 = y.view({-1, n}), ro2 = residual_out.view({-1, n});
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  dispatch<LaunchFused>(x.scalar_type(), w, x2, r2, w, y2, ro2, static_cast<float>(eps), plan);
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  check_inputs(x, weight, eps);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  run(x, weight, eps, y);
  return y;
}

void rms_norm_out(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                  double eps) {
  check_inputs(x, weight, eps);
  check_out(out, x, weight);
  run(x, weight, eps, out);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const std::optional<at::Tensor>& weight,
                                                      double eps) {
  check_fused_inputs(x, residual, weight, eps, kFusedImpl);
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor y = at::empty(x.sizes(), contiguous);
  at::Tensor residual_out = at::empty(x.sizes(), contiguous.dtype(residual.scalar_type()));
  run_fused(x, residual, weight, eps, y, residual_out);
  return {y, residual_out};
}

void fused_add_rms_norm_(at::Tensor& x, at::Tensor& residual,
                         const std::optional<at::Tensor>& weight, double eps) {
  check_fused_inputs(x, residual, weight, eps, kFusedImplInPlace);
  check_in_place(x, residual, weight, kFusedImplInPlace);
  run_fused(x, residual, weight, eps, x, residual);
}

namespace {
// A forced config's plan: the compiled config of table Tb with these fields, or a
// ValueError naming what was asked.
template <typename Tb>
Plan forced_plan(const char* fn, int64_t row_threads, int64_t vpt, int64_t cluster,
                 int64_t variant) {
  const int ranks = static_cast<int>(std::max<int64_t>(cluster, 1));
  // fields compared as the table's ints only once they fit them
  const bool fits = row_threads > 0 && row_threads <= 1024 && vpt > 0 && vpt <= 64 &&
                    variant >= 0 && variant <= 255;
  const int found = fits ? find_config<Tb>({static_cast<int>(row_threads), static_cast<int>(vpt),
                                            ranks > 1, static_cast<int>(variant)})
                         : -1;
  TORCH_CHECK_VALUE(found >= 0, fn, ": no compiled config (", num(row_threads), ", ", num(vpt),
                    ", cluster ", num(ranks), ", variant ", num(variant),
                    "); see cuda_impl.compiled_configs()");
  const int most = max_ranks(static_cast<int>(variant));
  TORCH_CHECK_VALUE(ranks == 1 || (ranks <= most && (ranks & (ranks - 1)) == 0), fn,
                    ": cluster is ", num(ranks), "; expected 1, 2, 4 or 8",
                    most > kMaxClusterRanks ? " or 16" : "");
  return Plan{found, ranks};
}
}  // namespace

at::Tensor rms_norm_with_config(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                double eps, int64_t row_threads, int64_t vpt, int64_t cluster,
                                int64_t variant) {
  check_inputs(x, weight, eps);
  const Plan plan = forced_plan<PlainTable>("cuda_impl.rms_norm_with_config", row_threads, vpt,
                                            cluster, variant);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  run(x, weight, eps, y, plan);
  return y;
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_with_config(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, int64_t row_threads, int64_t vpt, int64_t cluster, int64_t variant) {
  check_fused_inputs(x, residual, weight, eps, kFusedImpl);
  const Plan plan = forced_plan<FusedTable>("cuda_impl.fused_add_rms_norm_with_config",
                                            row_threads, vpt, cluster, variant);
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor y = at::empty(x.sizes(), contiguous);
  at::Tensor residual_out = at::empty(x.sizes(), contiguous.dtype(residual.scalar_type()));
  run_fused(x, residual, weight, eps, y, residual_out, plan);
  return {y, residual_out};
}

std::vector<int64_t> rms_norm_kernel_info(const at::Tensor& x,
                                          const std::optional<at::Tensor>& weight) {
  check_inputs(x, weight, 1e-6);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  std::vector<int64_t> out;
  dispatch<Describe>(x.scalar_type(), w, x.reshape({-1, x.size(-1)}), w, out);
  return out;
}

TORCH_LIBRARY_IMPL(cuda_impl, CUDA, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rms_norm_out", &rms_norm_out);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("fused_add_rms_norm_", &fused_add_rms_norm_);
  m.impl("rms_norm_with_config", &rms_norm_with_config);
  m.impl("fused_add_rms_norm_with_config", &fused_add_rms_norm_with_config);
  m.impl("rms_norm_kernel_info", &rms_norm_kernel_info);
}

namespace {
template <typename Tb>
std::vector<int64_t> configs_of() {
  std::vector<int64_t> out;
  for (int i = 0; i < kNumConfigs<Tb>; ++i) {
    out.insert(out.end(), {kConfigs<Tb>[i].row_threads, kConfigs<Tb>[i].vpt,
                           kConfigs<Tb>[i].cluster, i < kNumShipped<Tb>, kConfigs<Tb>[i].variant});
  }
  return out;
}
}  // namespace

// The compiled configs as flat (row_threads, vpt, cluster, in_default_ladder, variant)
// tuples, of each op.
std::vector<int64_t> rms_norm_configs() { return configs_of<PlainTable>(); }
std::vector<int64_t> fused_add_configs() { return configs_of<FusedTable>(); }

namespace {
template <typename Tb>
std::vector<int64_t> default_config_of(const char* fn, int64_t n, int64_t element_size) {
  TORCH_CHECK_VALUE(element_size == 2 || element_size == 4, fn, ": element_size is ",
                    num(element_size), "; expected 2 or 4");
  TORCH_CHECK_VALUE(n >= 1 && n <= kMaxN, fn, ": n is ", num(n), "; expected an int in [1, ",
                    num(kMaxN), "]");
  // rows as a contiguous, aligned tensor has them: whole vectors where n allows
  const Plan p = default_plan<Tb>(static_cast<int>(n * element_size / 16),
                                  static_cast<int>(element_size), 0, 0, n * element_size % 16 == 0);
  const Config& c = kConfigs<Tb>[p.config];
  return {c.row_threads, c.vpt, p.ranks, c.variant};
}
}  // namespace

std::vector<int64_t> rms_norm_default_config(int64_t n, int64_t element_size) {
  return default_config_of<PlainTable>("cuda_impl.rms_norm_default_config", n, element_size);
}

std::vector<int64_t> fused_add_default_config(int64_t n, int64_t element_size) {
  return default_config_of<FusedTable>("cuda_impl.fused_add_default_config", n, element_size);
}

}  // namespace cuda_impl
