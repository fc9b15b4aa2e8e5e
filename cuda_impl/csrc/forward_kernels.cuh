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
// Rows whose every access is a whole aligned vector take the row-chunk body instead
// (kRowChunks: one CTA a row, each thread its own vectors and no head or tail): many rows of
// 16-bit 5120-32768 and fp32 4096-24576 elements with nothing held through the sum, each
// vector read again (from L1 or L2) for the scale (kReread); 16-bit rows of 4096, 8192 or
// 12288 holding their first chunk, at any row count. Other rows of whole aligned vectors
// from 32768 elements take clusters of up to 16 CTAs that each stage a contiguous slice in
// shared memory (kWholeVectors, kStagedRow; both ops), no head or tail either. Many 16-bit
// rows off the 16-byte grid (odd N, odd offsets) take a ladder of their own (kOdd16).
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

//
// This header holds the device code; forward_table.h the launch configs (their data in
// tuning/*.inc); each forward_<op>_<dtype>.cu compiles one op's kernels for one x dtype
// (kernel_at below), so the units build side by side; forward.cu dispatches and launches.
#pragma once

// Device code only: no ATen or torch headers, which would triple each unit's compile time
// (nvcc parses them once a pass) for nothing the kernels use.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "forward_table.h"
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

// Ask for the line holding p to be brought into L1 (no register, no wait).
template <typename W>
__device__ __forceinline__ void prefetch_l1(const W* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// x's 16-byte vectors, loaded as VARIANT's bits say (default: read-only, no L1 allocation).
#define RMS_NORM_LD_V4(OP) \
  asm volatile(OP " {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p))
template <int VARIANT>
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  if constexpr ((VARIANT & kPlainLoads) != 0) {
    RMS_NORM_LD_V4("ld.global.v4.u32");
  } else {
    RMS_NORM_LD_V4("ld.global.nc.L1::no_allocate.v4.u32");
  }
  return v;
}
#undef RMS_NORM_LD_V4

// x's 16-byte vectors with an L2 eviction priority, as Triton's eviction hints compile:
// the row's first read kept (evict_last) for its second, which is the last (evict_first).
template <bool KEEP>
__device__ __forceinline__ uint4 load_hinted(const uint4* p) {
  uint4 v;
  uint64_t policy;
  if constexpr (KEEP) {
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
  } else {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
  }
  return v;
}

// A weight element as the scale reads it: in fp32, plus one where ONE (kPlusOne: Gemma's
// offset, an immediate of the add, never rounded through the weight's dtype).
template <bool ONE, typename W>
__device__ __forceinline__ float weight_float(W e) {
  if constexpr (ONE) {
    return to_float(e) + 1.f;
  } else {
    return to_float(e);
  }
}

// VEC weights as floats starting at w (element offset already applied); vector loads when
// the address is 16-byte aligned (fp32 weights beside 16-bit x take two vectors).
template <typename W, int VEC, bool ONE>
__device__ __forceinline__ void load_weight(const W* __restrict__ w, bool vec_ok,
                                            float (&out)[VEC]) {
  if (vec_ok) {
    constexpr int kPer = 16 / sizeof(W);
#pragma unroll
    for (int v = 0; v < VEC / kPer; ++v) {
      Pack<W> p;
      p.raw = __ldg(reinterpret_cast<const uint4*>(w) + v);
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[v * kPer + i] = weight_float<ONE>(p.e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = weight_float<ONE>(__ldg(w + i));
  }
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
// registers, fewer CTAs an SM; docs/notebook/07-decode-and-host-time.md, v35).
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
template <typename T, typename W, int VPT, bool ONE>
__device__ __forceinline__ void slice_weight(const W* __restrict__ w,
                                             const SliceWeight<T, W, VPT>& wv, int k, int j,
                                             float (&wf)[kVec<T>]) {
  constexpr int VEC = kVec<T>;
  if (w == nullptr) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) wf[i] = 1.f;
  } else if constexpr (kWeightBeside<T, W>) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) wf[i] = weight_float<ONE>(wv[k].e[i]);
  } else {
    load_weight<W, VEC, ONE>(w + j * VEC, true, wf);
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
template <typename T, typename W, typename R, int BLOCK, int VPT, bool ONE>
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
        copy_async_ca(&sh[(k * NH + q) * BLOCK + t],
                      reinterpret_cast<const uint4*>(rr) + j * NH + q);
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
    slice_weight<T, W, VPT, ONE>(w, wv, k, j, wf);
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
// copy ceiling without it). Figures: docs/notebook/01-why-the-defaults.md.
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
template <typename T, typename W, typename L, int VPT, bool ONE>
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
        for (int i = 0; i < VEC; ++i) wf[i] = weight_float<ONE>(wv[k].e[i]);
      }
    } else if (w != nullptr) {
      load_weight<W, VEC, ONE>(w + e0, w_vec, wf);
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
    const float wh = w != nullptr ? weight_float<ONE>(__ldg(w + g)) : 1.f;
    yr[g] = from_float<T>(xh * rstd * wh);
  }
  if (g < sp.tail) {
    const float wt = w != nullptr ? weight_float<ONE>(__ldg(w + sp.tail0 + g)) : 1.f;
    yr[sp.tail0 + g] = from_float<T>(xt * rstd * wt);
  }
}

// A chunk's vectors from vector c of the row, all in flight before the first use (zeros past
// the row): plain loads beside a held first chunk, else with the L2 priority KEEP says (kept
// for the second read, or the last).
template <typename T, int ROW_THREADS, int VPT, bool HOLD, bool KEEP>
__device__ __forceinline__ void load_chunk(Pack<T> (&u)[VPT], const uint4* xp, int c, int t,
                                           int nvec) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = c + t + k * ROW_THREADS;
    u[k].raw = j >= nvec  ? make_uint4(0, 0, 0, 0)
               : HOLD     ? load_stream<kPlainLoads>(xp + j)
                          : load_hinted<KEEP>(xp + j);
  }
}

// ---- the row-chunk body ------------------------------------------------------------------
// kRowChunks: one CTA a row, for rows whose every access is a whole aligned 16-byte vector
// (x's and y's rows and the weight 16-byte aligned, N a multiple of a vector; the launcher
// picks it only for such rows). Each thread runs the work of its own vectors and nothing
// else: no head or tail, no unused vector slots (a decode-sized call is a few CTAs whose
// instruction count is their time). HOLD: the first chunk and its weight held in registers
// through the sum; a row wider than the first chunk (every chunk, without HOLD) is walked as
// torch.compile's looped reduction walks it: summed as it arrives, then read again (from L1
// or L2, where it has just been) for the scale, on few registers a thread, so many CTAs
// share an SM. Any other row (a forced config only) takes a scalar loop, correct at any
// alignment and width.
template <typename T, typename W, int ROW_THREADS, int VPT, bool HOLD, bool ONE>
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
      const float wf = w != nullptr ? weight_float<ONE>(__ldg(w + e)) : 1.f;
      yr[e] = from_float<T>(to_float(xr[e]) * rstd * wf);
    }
    return;
  }
  const int nvec = N / VEC;
  const uint4* xp = reinterpret_cast<const uint4*>(xr);
  const uint4* wp = reinterpret_cast<const uint4*>(w);
  uint4* yp = reinterpret_cast<uint4*>(yr);
  // HOLD: the first chunk and its weight loaded into registers, every vector in flight
  // before the first use, and held through the sum; else no chunk is held
  constexpr int FIRST = HOLD ? CHUNK : 0;  // the first chunk read again for the scale
  Pack<T> v[HOLD ? VPT : 1];
  uint4 wr[HOLD ? VPT : 1][NW];
  float ss = 0.f;
  if constexpr (HOLD) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = t + k * ROW_THREADS;
      const bool in = j < nvec;
      v[k].raw = in ? load_stream<kPlainLoads>(xp + j) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int q = 0; q < NW; ++q)
        wr[k][q] = in && w != nullptr ? __ldg(wp + j * NW + q) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (t + k * ROW_THREADS >= nvec) break;
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss = fmaf(to_float(v[k].e[i]), to_float(v[k].e[i]), ss);
    }
  }
  // the other chunks: summed as they arrive
  for (int c = FIRST; c < nvec; c += CHUNK) {
    Pack<T> u[VPT];
    load_chunk<T, ROW_THREADS, VPT, HOLD, true>(u, xp, c, t, nvec);
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss = fmaf(to_float(u[k].e[i]), to_float(u[k].e[i]), ss);
  }
  // reduce over the CTA
  const float rstd = approx_rstd(group_sum<ROW_THREADS>(ss, warp_sums), N, eps);
  // scale and store: the held chunk, then the other chunks read again
  if constexpr (HOLD) {
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
        for (int i = 0; i < kVec<W>; ++i)
          wf[q * kVec<W> + i] = w != nullptr ? weight_float<ONE>(p.e[i]) : 1.f;
      }
      Pack<T> o;
#pragma unroll
      for (int i = 0; i < VEC; ++i) o.e[i] = from_float<T>(to_float(v[k].e[i]) * rstd * wf[i]);
      yp[j] = o.raw;
    }
  }
  for (int c = FIRST; c < nvec; c += CHUNK) {
    Pack<T> u[VPT];  // every vector in flight before the first store
    load_chunk<T, ROW_THREADS, VPT, HOLD, false>(u, xp, c, t, nvec);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = c + t + k * ROW_THREADS;
      if (j >= nvec) break;
      float wf[VEC];
      if (w != nullptr) {
        load_weight<W, VEC, ONE>(w + j * VEC, true, wf);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) wf[i] = 1.f;
      }
      Pack<T> o;
#pragma unroll
      for (int i = 0; i < VEC; ++i) o.e[i] = from_float<T>(to_float(u[k].e[i]) * rstd * wf[i]);
      yp[j] = o.raw;
    }
  }
}


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
                                  min_blocks(ROW_THREADS, VARIANT, !std::is_void_v<R>,
                                             sizeof(W) == sizeof(T)))
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
                    int64_t M,
                    int64_t stride_yh,    // kHeads: y's step between heads
                    int64_t stride_wh) {  // kHeads: the weight's (a row a head, or 0)
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
  static_assert((VARIANT & kReread) == 0 || (VARIANT & kRowChunks) != 0,
                "reread: a variant of the row chunks");
  constexpr bool ONE = (VARIANT & kPlusOne) != 0;
  constexpr bool HEADS = (VARIANT & kHeads) != 0;
  static_assert(!HEADS || (!kFused && !CLUSTER && (VARIANT & kRowChunks) == 0),
                "head rows: rms_norm's general body");
  if constexpr ((VARIANT & kRowChunks) != 0) {
    static_assert(!kFused && !CLUSTER, "row chunks: rms_norm, one CTA a row");
    row_chunks<T, W, ROW_THREADS, VPT, (VARIANT & kReread) == 0, ONE>(x, w, y, stride_x,
                                                                      stride_y, N, eps, warp_sums);
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
  if constexpr (HEADS) {  // stride_ro: the heads; stride_r, stride_yh: x's, y's steps between them
    const int64_t tok = r0 / stride_ro, head = r0 - tok * stride_ro;
    xr = x + tok * stride_x + head * stride_r;
    yr = y + tok * stride_y + head * stride_yh;
    if (w != nullptr) w += head * stride_wh;
  }
  const RowSplit sp = split_row(xr, N);

  // A CTA may write into a peer's shared memory only once the peer runs, its mbarrier
  // initialised: announce that this one does (no wait here; the wait comes after the loads
  // are in flight). A relaxed arrive: fence.mbarrier_init orders the init before the
  // barrier; a releasing arrive was slower at every cluster shape
  // (docs/notebook/06-wide-rows.md, v23).
  if constexpr (CLUSTER) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
      mbar_init(&cluster_bar);
      mbar_init_fence();
    }
    cluster_arrive_relaxed();
#else
    // built for a GPU without clusters, where the host never launches it (has_clusters):
    // stop rather than write rows whose sum no peer shared
    __trap();
#endif
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
      staged_slice<T, W, R, BLOCK, VPT, ONE>(xr, rr, ro, w, yr, N, eps, rank, ranks, cluster_parts,
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
  // the prefetches only compete with x's loads (slower: docs/notebook/01-why-the-defaults.md),
  // so not there.
  if (BLOCK == 1024 && w != nullptr && row_ok) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = g + k * G;
      if (j < sp.nvec) prefetch_l1(w + sp.head + j * VEC);
    }
  }
  Pack<W> wv[VPT];
  const bool w_early = sizeof(H) == sizeof(T) &&
                       load_weight_early<T, W, BLOCK, VPT, VARIANT>(w, sp, g, G, row_ok, wv);
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
  if (row_ok)
    scale_store<T, W, Lanes<T, H>, VPT, ONE>(v, xh, xt, sp, g, G, rstd, w, yr, wv, w_early);
}

// Config I's kernel for this dtype combination: rms_norm compiles every config of its table
// for every dtype pair, the fused add its shipped configs only for the dtypes whose ladders
// name them (null otherwise) and its sweep-only ones for all; the *_with_config entry
// points reach any compiled one.
// FLAGS: a launch's flags (kPlusOne), whose kernels are compiled for the configs the
// ladders of x's element size name only.
template <typename T, typename W, typename R, size_t I, int FLAGS>
constexpr KernelFn<T, W, R> kernel_of() {
  using C = TableOf<R>;
  constexpr bool shipped = I < static_cast<size_t>(kNumShipped<C>);
  constexpr bool named = shipped && ((FLAGS & kHeads) != 0 ? takes_heads<C>(I, sizeof(T))
                                                             : used_by<C>(I, sizeof(T)));
  if constexpr (FLAGS != 0 ? named : std::is_void_v<R> || !shipped || named) {
    return &rms_norm_kernel<T, W, R, kConfigs<C>[I].row_threads, kConfigs<C>[I].vpt,
                            kConfigs<C>[I].cluster, kConfigs<C>[I].variant | FLAGS>;
  } else {
    return nullptr;
  }
}

template <typename T, typename W, typename R, int FLAGS, size_t... I>
std::array<KernelFn<T, W, R>, sizeof...(I)> make_kernels(std::index_sequence<I...>) {
  return {kernel_of<T, W, R, I, FLAGS>()...};
}

}  // namespace

// The kernel of config i of R's table for this dtype combination (R = void: rms_norm, else
// the fused add's residual type); explicitly instantiated by the op's unit for x's dtype.
template <typename T, typename W, typename R>
KernelFn<T, W, R> kernel_at(int i) {
  static const auto table =
      make_kernels<T, W, R, 0>(std::make_index_sequence<kNumConfigs<TableOf<R>>>{});
  return table[i];
}

// ... and with the weight read as weight + 1 (kPlusOne), for x's dtype, a weight and a
// residual of x's: null for a config its ladders do not name (the launcher then reads an
// fp32 weight + 1 through kernel_at).
template <typename T, typename R>
KernelFn<T, T, R> kernel_plus_one_at(int i) {
  static const auto table =
      make_kernels<T, T, R, kPlusOne>(std::make_index_sequence<kNumConfigs<TableOf<R>>>{});
  return table[i];
}

// ... of rms_norm on head rows (kHeads), a weight of x's dtype (one: read as weight + 1,
// for 16-bit x): null for a config rows of at most kHeadsMaxVecs vectors do not climb to.
template <typename T>
KernelFn<T, T, void> kernel_heads_at(int i, bool one) {
  constexpr size_t kNum = kNumConfigs<PlainTable>;
  static const auto table = make_kernels<T, T, void, kHeads>(std::make_index_sequence<kNum>{});
  if constexpr (sizeof(T) == 2) {
    static const auto plus_one =
        make_kernels<T, T, void, kHeads | kPlusOne>(std::make_index_sequence<kNum>{});
    if (one) return plus_one[i];
  }
  return one ? nullptr : table[i];
}

}  // namespace cuda_impl

// A unit's instantiations. Each weight (and residual) dtype is x's or fp32, so a 16-bit x
// has two rms_norm combinations and four fused-add ones; fp32 x has one of each.
#define CUDA_IMPL_FORWARD_AT(T, W, R) \
  template cuda_impl::KernelFn<T, W, R> cuda_impl::kernel_at<T, W, R>(int);
// A 16-bit x with a weight (and residual) of its dtype has its plus-one kernels too.
#define CUDA_IMPL_PLUS_ONE_AT(T, R) \
  template cuda_impl::KernelFn<T, T, R> cuda_impl::kernel_plus_one_at<T, R>(int);
// ... and rms_norm its head-row kernels.
#define CUDA_IMPL_HEADS_AT(T) \
  template cuda_impl::KernelFn<T, T, void> cuda_impl::kernel_heads_at<T>(int, bool);
#define CUDA_IMPL_RMS_NORM_UNIT_16(T)   \
  CUDA_IMPL_FORWARD_AT(T, T, void)      \
  CUDA_IMPL_PLUS_ONE_AT(T, void)        \
  CUDA_IMPL_HEADS_AT(T)                 \
  CUDA_IMPL_FORWARD_AT(T, float, void)
#define CUDA_IMPL_FUSED_ADD_UNIT_16(T)  \
  CUDA_IMPL_FORWARD_AT(T, T, T)         \
  CUDA_IMPL_PLUS_ONE_AT(T, T)           \
  CUDA_IMPL_FORWARD_AT(T, T, float)     \
  CUDA_IMPL_FORWARD_AT(T, float, T)     \
  CUDA_IMPL_FORWARD_AT(T, float, float)
