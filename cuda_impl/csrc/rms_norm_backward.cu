// The backward of both ops in CUDA C++. For y = s * rstd * w, rstd = 1 / sqrt(mean(s^2) +
// eps), s = x (rms_norm) or residual_out (the fused add), and the output gradient dy:
//   g = dy * w,  ds = rstd * (g - s * rstd^2 * mean(g * s)),  dw = sum over rows of dy * s * rstd.
// The fused add adds residual_out's own gradient to ds and stores it as dx in dy's dtype and,
// unless the caller takes dx as both (dresidual=False), as dresidual in residual_out's.
//
// Parallelisation: a persistent grid, as many CTAs as fit the SMs at once; a CTA walks rows
// blockIdx.x, blockIdx.x + gridDim.x, ... A thread owns the same columns in every row
// (VEC-element groups t, t + THREADS, ...), so its share of dweight stays in registers
// across the CTA's rows and is written once, as the CTA's fp32 row of a partials buffer;
// a second kernel sums the partials rows in a fixed order: dweight is deterministic, no
// atomics (its warps read rows of the partials in parallel, each column in one order).
// rstd is recomputed from s, which is read anyway, so the forward saves nothing.
//
// Which kernel: rows are staged (rms_norm_bwd_staged): 2-4 rows of s and dy in shared
// memory a CTA, the next ones' copies in flight while one is reduced and stored; any
// alignment, odd widths included; rows past one CTA's shared memory (16-bit past 16384, fp32
// past 8192) split over a cluster of 2-8 CTAs. In registers instead (rms_norm_bwd_kernel, not
// CHUNKED), where more CTAs an SM, with no shared memory to limit them, measured faster
// (docs/notebook/05-the-backward.md, v15;
// docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v46): fp32 rows to 2048
// groups, rms_norm's aligned ones and both ops' off a 16-byte boundary or of odd N (one
// phase); 16-bit rms_norm's such rows to 4103. What
// neither takes (tensors of differing alignment, rows past 8 CTAs) goes in CTA-wide chunks:
// sum, then re-read (from L2), ds, and the chunk's dweight share added into the CTA's
// partials row (its own: no other CTA touches it); 16-byte groups where every row of every
// tensor is aligned and N is whole groups, one element a group otherwise. Narrow aligned
// rms_norm rows (to kNarrowMaxGroups groups: QK-norm's head rows) go before all of these to
// rms_norm_bwd_narrow, several rows a CTA, a row's lanes within a warp.
//
// Precision: fp32 math on upcast inputs, each output cast once at its store. The weight is
// read as fp32 (the host converts a 16-bit weight once, N elements), except in the staged
// kernel's wide 2-row rings and its cluster CTAs (WT), which keep a 16-bit weight of dy's
// dtype as it is.
//
// Learned from: Apex's fused layer-norm backward (partial dweight per block, a second
// reduction kernel), QuACK's rmsnorm backward (persistent CTAs, partials per CTA).

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "rms_norm.h"
#include "rms_norm_device.cuh"
#include "tuning/backward.h"

namespace cuda_impl {
namespace {

using namespace bwd_tuning;

// VEC consecutive elements of E at p as floats: 16-byte loads when VEC * sizeof(E) is a
// whole number of them (the caller guarantees alignment), element loads otherwise.
template <typename E, int VEC>
__device__ __forceinline__ void load_group(const E* __restrict__ p, float (&out)[VEC]) {
  if constexpr ((VEC * sizeof(E)) % 16 == 0) {
    constexpr int kPer = kVec<E>;
#pragma unroll
    for (int v = 0; v < VEC / kPer; ++v) {
      Pack<E> u;
      u.raw = *reinterpret_cast<const uint4*>(p + v * kPer);
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[v * kPer + i] = to_float(u.e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(p[i]);
  }
}

template <typename E, int VEC>
__device__ __forceinline__ void store_group(E* __restrict__ p, const float (&in)[VEC]) {
  if constexpr ((VEC * sizeof(E)) % 16 == 0) {
    constexpr int kPer = kVec<E>;
#pragma unroll
    for (int v = 0; v < VEC / kPer; ++v) {
      Pack<E> u;
#pragma unroll
      for (int i = 0; i < kPer; ++i) u.e[i] = from_float<E>(in[v * kPer + i]);
      *reinterpret_cast<uint4*>(p + v * kPer) = u.raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = from_float<E>(in[i]);
  }
}

// A group's raw bits, held through the reduction instead of its floats (half the registers
// for 16-bit data) and converted again where they are used.
template <typename E, int VEC>
struct Raw {
  static constexpr int kRegs = (VEC * static_cast<int>(sizeof(E)) + 15) / 16;
  uint4 r[kRegs];
};

template <typename E, int VEC>
__device__ __forceinline__ void load_raw(const E* __restrict__ p, Raw<E, VEC>& out) {
#pragma unroll
  for (int v = 0; v < Raw<E, VEC>::kRegs; ++v) out.r[v] = reinterpret_cast<const uint4*>(p)[v];
}

template <typename E, int VEC>
__device__ __forceinline__ void unpack(const Raw<E, VEC>& raw, float (&out)[VEC]) {
  const E* e = reinterpret_cast<const E*>(raw.r);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(e[i]);
}

// The two row sums over the CTA: warp shuffles, then the warps' partials through shared
// memory (every thread calls it; `red` holds 2 floats a warp). By default lane i of every
// warp takes warp i's partials and a butterfly over the warps' lanes sums them, broadcast
// from lane 0: 2 loads and 2 log2(warps) + 2 shuffles a thread, where adding every warp's
// partials in turn takes 4 a warp (64 instructions a thread a row at 512 threads). A
// butterfly gives every lane the same sums (lanes i and i ^ off add the same two values),
// and every warp adds the same partials in the same order: one result, the same every run.
// IN_TURN: every thread adds the warps' partials in turn, no shuffles after the barrier:
// faster for the plain op's 16-bit rows on one CTA of 1024 threads (16384), slower for the
// fused add's on the same kernel and level elsewhere
// (docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v51-v52).
template <int THREADS, bool IN_TURN = false>
__device__ __forceinline__ float2 block_sum2(float a, float b, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  constexpr int kWarps = THREADS / 32;
  static_assert(THREADS % 32 == 0 && (kWarps & (kWarps - 1)) == 0, "a power of two of warps");
  if constexpr (kWarps > 1) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (lane == 0) {
      red[2 * warp] = a;
      red[2 * warp + 1] = b;
    }
    __syncthreads();
    if constexpr (IN_TURN) {
      a = 0.f;
      b = 0.f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) {
        a += red[2 * i];
        b += red[2 * i + 1];
      }
    } else {
      a = lane < kWarps ? red[2 * lane] : 0.f;
      b = lane < kWarps ? red[2 * lane + 1] : 0.f;
#pragma unroll
      for (int off = kWarps / 2; off > 0; off /= 2) {
        a += __shfl_xor_sync(0xffffffffu, a, off);
        b += __shfl_xor_sync(0xffffffffu, b, off);
      }
      a = __shfl_sync(0xffffffffu, a, 0);
      b = __shfl_sync(0xffffffffu, b, 0);
    }
    __syncthreads();  // red is reused by the next row
  }
  return make_float2(a, b);
}

struct BwdArgs {
  const void* s;    // x or residual_out rows
  const void* dy;   // dy rows (dy's dtype: T)
  const float* w;   // fp32 weight, or null
  const void* dro;  // d_residual_out rows (S), or null
  void* ds;         // dx rows (T)
  void* ds2;        // dresidual rows (S), or null
  float* dwp;       // partials: gridDim.x rows of N fp32
  int64_t stride_s, stride_dy, stride_dro, stride_ds, stride_ds2;
  int64_t M;
  int N;
  float eps;
  int cap;          // the staged kernel's groups a stage holds
  const void* w_t;  // the staged kernel's weight in T (WT), or null
};

// The HEADS kernels' arguments (rms_norm's (T, H, N)): M counts tokens, and s, dy and ds
// step head_* elements from head to head, the weight head_w (N: a row a head; 0: one row for
// all). A type of their own: four more fields in BwdArgs moved every other kernel's
// registers (ptxas), one of them to spills.
struct HeadArgs : BwdArgs {
  int heads;
  int64_t head_s, head_dy, head_ds, head_w;
};
template <bool HEADS>
using ArgsOf = std::conditional_t<HEADS, HeadArgs, BwdArgs>;

// HEADS (a kernel's flag, compiled for the configs head rows take: heads_twin): the host
// runs a multiple of H CTAs, so all the rows of one are of one head, first_row % H, at
// tokens first_row / H, + row_step / H, ...: its tensors moved to that head, its rows
// counted in tokens. dweight's partials row stays the CTA's, whose head is its index % H.
// A flag, not a run-time test: beside every kernel the test and its 64-bit divisions took
// registers (the 16-bit edge kernels' 80 to 123).
template <bool HEADS, typename S, typename T>
__device__ __forceinline__ void to_head(ArgsOf<HEADS>& a, int64_t& first_row, int64_t& row_step) {
  if constexpr (HEADS) {
    const int64_t h = first_row % a.heads;
    a.s = static_cast<const S*>(a.s) + h * a.head_s;
    a.dy = static_cast<const T*>(a.dy) + h * a.head_dy;
    a.ds = static_cast<T*>(a.ds) + h * a.head_ds;
    if (a.w) a.w += h * a.head_w;
    if (a.w_t) a.w_t = static_cast<const T*>(a.w_t) + h * a.head_w;
    first_row /= a.heads;
    row_step /= a.heads;
  }
}

// The phase of s's row `row`: its elements before the 16-byte boundary at or before its
// start (the same in every tensor and in every row a CTA takes where the host picked a
// kernel that keeps one phase a CTA).
template <typename S>
__device__ __forceinline__ int row_phase(const BwdArgs& a, int64_t row) {
  return static_cast<int>(
      (reinterpret_cast<uintptr_t>(static_cast<const S*>(a.s) + row * a.stride_s) % 16) /
      sizeof(S));
}

// Rows wider than one CTA stages (CLUSTER) are shared by a thread-block cluster: CTA
// `rank` takes groups [rank * cap, (rank + 1) * cap) of every row of its cluster, and the
// CTAs' row sums are combined through distributed shared memory (see cluster_sums2).

// The slot sets of the ahead form: a CTA sends row q's sums once it has all of row q - 2's,
// which each peer sent before it read row q - 3's (and after it had read row q - 4's, a
// CTA barrier between: block_sum2's), so rows q - 3 to q need sets of their own.
constexpr int kAheadSets = 4;

// A cluster CTA's start: its rank and the cluster's size, its SETS mbarriers initialised
// (one arrival each), and this CTA's arrival announced (relaxed: the fence orders the
// initialisation before it); the first exchange completes that cluster barrier.
template <int SETS>
__device__ __forceinline__ void cluster_start(int& rank, int& ranks, uint64_t* bars) {
  cluster_position(rank, ranks);
  if (threadIdx.x == 0) {
    for (int i = 0; i < SETS; ++i) mbar_init(&bars[i]);
    mbar_init_fence();
  }
  cluster_arrive_relaxed();
}

// The sums of a row over the CTAs of a cluster, as a transaction barrier a slot set (the
// forward's cluster_sum), not a cluster barrier a row (which measured slower on every
// cluster row: docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v50): each
// CTA's (s^2, g*s) lands in slot `rank` of every CTA's slots[set] and on that CTA's mbarrier of
// the set (st.async, cluster_send2); a CTA waits on its own for all of them (bit `set` of
// `parity`: the phase that set is in) and adds its slots in rank order, the same result in
// every CTA (cluster_collect2). A fast CTA writes a set again only after the rows between
// complete, each of which needs the slow CTA's sums, which it sends after a CTA barrier
// that its reads of the set came before. `first`: the first exchange also completes the
// cluster barrier phase every CTA opened at its start (so none writes into a peer that is
// not running yet).
__device__ __forceinline__ void cluster_send2(float2 v, float2 (*slots)[kMaxClusterRanks],
                                              uint64_t* bars, int set, int rank, int ranks,
                                              bool first) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) mbar_expect(&bars[set], static_cast<uint32_t>(ranks * sizeof(float2)));
  if (first) cluster_wait();
  if (static_cast<int>(threadIdx.x) < ranks)
    st_async(&slots[set][rank], v, &bars[set], static_cast<int>(threadIdx.x));
#else
  __trap();  // a GPU without clusters: the host picks no cluster kernel there (has_clusters)
#endif
}

__device__ __forceinline__ float2 cluster_collect2(const float2 (*slots)[kMaxClusterRanks],
                                                   uint64_t* bars, uint32_t& parity, int set,
                                                   int ranks) {
  float2 v = make_float2(0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mbar_wait<true>(&bars[set], (parity >> set) & 1u);
  parity ^= 1u << set;
  for (int r = 0; r < ranks; ++r) {
    v.x += slots[set][r].x;
    v.y += slots[set][r].y;
  }
#else
  __trap();
#endif
  return v;
}

__device__ __forceinline__ float2 cluster_sums2(float2 v, float2 (*slots)[kMaxClusterRanks],
                                                uint64_t* bars, uint32_t& parity, int set,
                                                int rank, int ranks, bool first) {
  cluster_send2(v, slots, bars, set, rank, ranks, first);
  return cluster_collect2(slots, bars, parity, set, ranks);
}

// T: dy's and dx's dtype; S: s's (and d_residual_out's, dresidual's). VPT groups of VEC
// elements a thread; CHUNKED: the row in chunks of THREADS * VPT * VEC elements.
//
// EDGES (not CHUNKED): rows off a 16-byte boundary, or whose N is not whole groups, of one
// phase (the elements before a row's first 16-byte boundary, the same in every tensor and in
// every row this CTA takes: the host's grid is a whole number of phase periods). A row's
// groups are its aligned body; its head (the elements before the body) and its tail (those
// after it), fewer than VEC each, are one element a thread for the first head + tail
// threads, which own those columns in every row as they own their groups'.
template <typename T, typename S, int THREADS, int VPT, int VEC, bool CHUNKED, bool EDGES = false,
          bool CLUSTER = false, bool HEADS = false>
__global__ void __launch_bounds__(THREADS) rms_norm_bwd_kernel(ArgsOf<HEADS> a) {
  static_assert(!EDGES || (!CHUNKED && sizeof(S) == sizeof(T) && 2 * VEC <= THREADS),
                "one phase in s and dy; a thread for each edge element");
  static_assert(!CLUSTER || (!CHUNKED && !EDGES), "aligned rows held in registers");
  static_assert(!HEADS || (!CHUNKED && !CLUSTER), "a CTA's rows of one head");
  constexpr int kElems = VPT * VEC;
  constexpr int kChunk = THREADS * kElems;
  __shared__ float red[2 * (THREADS / 32)];
  // CLUSTER: a row over the cluster's CTAs, CTA `rank` its columns [rank N / ranks,
  // (rank + 1) N / ranks), the two sums through distributed shared memory (cluster_sums2)
  __shared__ float2 slots[CLUSTER ? 2 : 1][kMaxClusterRanks];
  __shared__ __align__(8) uint64_t sum_bars[CLUSTER ? 2 : 1];
  uint32_t parity = 0;
  int rank = 0, ranks = 1;
  if constexpr (CLUSTER) cluster_start<2>(rank, ranks, sum_bars);
  int64_t first_row = blockIdx.x / ranks;  // this CTA's (cluster's) first row
  int64_t row_step = gridDim.x / ranks;
  const int t = threadIdx.x;
  const int N = a.N;
  const float inv_n = 1.f / static_cast<float>(N);
  float* dwp = a.dwp + first_row * N;
  to_head<HEADS, S, T>(a, first_row, row_step);
  float dw[kElems];
  // the body's first column and groups; this thread's edge column (-1: none)
  int head = CLUSTER ? rank * (N / ranks) : 0, body = N / ranks / VEC, xc = -1;
  if constexpr (EDGES) {
    const int phase = row_phase<S>(a, first_row);
    head = min(N, (VEC - phase) % VEC);
    body = (N - head) / VEC;
    const int tail = N - head - body * VEC;
    xc = t < head ? t : t < head + tail ? head + body * VEC + (t - head) : -1;
  }
  float xdw = 0.f;  // EDGES: the edge column's dweight share
  // !CHUNKED: the weight of this thread's columns, read once into registers; read from L1
  // at each use it was slower at fp32 8192
  // (docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v45)
  float wr[CHUNKED ? 1 : kElems];
  if constexpr (!CHUNKED) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int g = k * THREADS + t;
      const int c = head + g * VEC;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        dw[k * VEC + i] = 0.f;
        wr[k * VEC + i] = a.w && g < body ? a.w[c + i] : 1.f;
      }
    }
  }
  int set = 0;  // CLUSTER: the slots this row's sums go through (alternate rows alternate)
  for (int64_t row = first_row; row < a.M; row += row_step) {
    const S* sr = static_cast<const S*>(a.s) + row * a.stride_s;
    const T* dyr = static_cast<const T*>(a.dy) + row * a.stride_dy;
    const S* dror = a.dro ? static_cast<const S*>(a.dro) + row * a.stride_dro : nullptr;
    T* dsr = static_cast<T*>(a.ds) + row * a.stride_ds;
    S* ds2r = a.ds2 ? static_cast<S*>(a.ds2) + row * a.stride_ds2 : nullptr;
    if constexpr (!CHUNKED) {
      // the row in registers, as raw bits: the body's groups (whole, aligned), and this
      // thread's edge element
      Raw<S, VEC> sraw[VPT];
      Raw<T, VEC> draw[VPT];
      float ss = 0.f, gs = 0.f;
      // the edge element's loads first: issued after the groups', they held the edge
      // threads' warps (and so the row's sums) back
      // (docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v46)
      float xs = 0.f, xd = 0.f;
      if (EDGES && xc >= 0) {
        xs = to_float(sr[xc]);
        xd = to_float(dyr[xc]);
      }
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int g = k * THREADS + t;
        if (g >= body) continue;
        load_raw<S, VEC>(sr + head + g * VEC, sraw[k]);
        load_raw<T, VEC>(dyr + head + g * VEC, draw[k]);
      }
      if (EDGES && xc >= 0) {
        xd *= a.w ? a.w[xc] : 1.f;  // dy * w (the weight from L1)
        ss = xs * xs;
        gs = xd * xs;
      }
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int g = k * THREADS + t;
        if (g >= body) continue;
        float sv[VEC], dv[VEC];
        unpack<S, VEC>(sraw[k], sv);
        unpack<T, VEC>(draw[k], dv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float wi = wr[k * VEC + i];
          ss = fmaf(sv[i], sv[i], ss);
          gs = fmaf(dv[i] * wi, sv[i], gs);
        }
      }
      float2 sums = block_sum2<THREADS>(ss, gs, red);
      if constexpr (CLUSTER) {
        sums = cluster_sums2(sums, slots, sum_bars, parity, set, rank, ranks, row == first_row);
        set ^= 1;
      }
      const float rstd = rsqrtf(sums.x * inv_n + a.eps);
      const float c2 = sums.y * inv_n * rstd * rstd;
      if (EDGES && xc >= 0) {
        const float out = (xd - xs * c2) * rstd + (dror ? to_float(dror[xc]) : 0.f);
        xdw = fmaf(to_float(dyr[xc]) * xs, rstd, xdw);  // dy again, from L1
        dsr[xc] = from_float<T>(out);
        if (ds2r) ds2r[xc] = from_float<S>(out);
      }
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int g = k * THREADS + t;
        const int c = head + g * VEC;
        if (g >= body) continue;
        float sv[VEC], dv[VEC], out[VEC], dro[VEC];
        unpack<S, VEC>(sraw[k], sv);
        unpack<T, VEC>(draw[k], dv);
        if (dror) load_group<S, VEC>(dror + c, dro);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float wi = wr[k * VEC + i];
          out[i] = (dv[i] * wi - sv[i] * c2) * rstd + (dror ? dro[i] : 0.f);
          dw[k * VEC + i] = fmaf(dv[i] * sv[i], rstd, dw[k * VEC + i]);
        }
        store_group<T, VEC>(dsr + c, out);
        if (ds2r) store_group<S, VEC>(ds2r + c, out);
      }
    } else {
      // sweep 1: both sums, chunk by chunk
      float ss = 0.f, gs = 0.f;
      for (int base = 0; base < N; base += kChunk) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = base + (k * THREADS + t) * VEC;
          if (c >= N) continue;
          float sv[VEC], dv[VEC];
          load_group<S, VEC>(sr + c, sv);
          load_group<T, VEC>(dyr + c, dv);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float wi = a.w ? a.w[c + i] : 1.f;
            ss = fmaf(sv[i], sv[i], ss);
            gs = fmaf(dv[i] * wi, sv[i], gs);
          }
        }
      }
      const float2 sums = block_sum2<THREADS>(ss, gs, red);
      const float rstd = rsqrtf(sums.x * inv_n + a.eps);
      const float c2 = sums.y * inv_n * rstd * rstd;
      // sweep 2: re-read (L2), ds, this row's dweight share into the CTA's partials row
      for (int base = 0; base < N; base += kChunk) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = base + (k * THREADS + t) * VEC;
          if (c >= N) continue;
          float sv[VEC], dv[VEC], out[VEC], dro[VEC];
          load_group<S, VEC>(sr + c, sv);
          load_group<T, VEC>(dyr + c, dv);
          if (dror) load_group<S, VEC>(dror + c, dro);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float wi = a.w ? a.w[c + i] : 1.f;
            out[i] = (dv[i] * wi - sv[i] * c2) * rstd + (dror ? dro[i] : 0.f);
            // the same thread owns these columns in every row of this CTA
            if (a.w) dwp[c + i] = fmaf(dv[i] * sv[i], rstd, row == blockIdx.x ? 0.f : dwp[c + i]);
          }
          store_group<T, VEC>(dsr + c, out);
          if (ds2r) store_group<S, VEC>(ds2r + c, out);
        }
      }
    }
  }
  if constexpr (!CHUNKED) {
    if (a.w == nullptr) return;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int g = k * THREADS + t;
      if (g >= body) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) dwp[head + g * VEC + i] = dw[k * VEC + i];
    }
    if (EDGES && xc >= 0) dwp[xc] = xdw;
  }
}

// ---- narrow rows, several a CTA at once -------------------------------------------------
// Rows of at most 32 x VPT groups (QK-norm's head rows: 64-256 columns), every row aligned
// and N whole groups, rms_norm's (no d_residual_out, no dresidual): a CTA of
// kNarrowThreads threads holds kNarrowThreads / LANES rows, LANES consecutive lanes of a
// warp a row (VPT groups a lane), and kNarrowDepth such sets at once (each lane's loads
// for all of them issued before any sum); a row's two sums by shuffles among its lanes,
// no barrier. The kernels above take a row a CTA: at 64 columns 8 of a CTA's 64 threads
// worked, and a CTA's row at a time (with its barriers) held the 17-33% of copy QK-norm's
// backward measured at D = 64-128. A CTA takes the rows the others would (first_row,
// + row_step, ...; HEADS: of one head, as to_head says), in that order, so the host's
// grid and partials rows are theirs; each lane's dweight shares stay in registers across
// its rows and are summed over the CTA's rows through shared memory, in a fixed order,
// into the CTA's partials row.
constexpr int kNarrowThreads = 256;
constexpr int kNarrowDepth = 2;

template <typename T, int LANES, int VPT, bool HEADS = false>
// (at most 64 registers a thread where a lane holds one group: 4 CTAs an SM, 1024 threads)
__global__ void __launch_bounds__(kNarrowThreads, VPT == 1 ? 4 : 2)
    rms_norm_bwd_narrow(ArgsOf<HEADS> a) {
  static_assert(32 % LANES == 0, "a row's lanes in one warp");
  constexpr int VEC = kVec<T>;
  constexpr int kRows = kNarrowThreads / LANES;  // rows of one set
  constexpr int kCols = LANES * VPT * VEC;       // the widest row taken
  __shared__ float part[kRows][kCols];
  int64_t first_row = blockIdx.x, row_step = gridDim.x;
  float* dwp = a.dwp + first_row * a.N;
  to_head<HEADS, T, T>(a, first_row, row_step);
  const int N = a.N, groups = N / VEC;
  const float inv_n = 1.f / static_cast<float>(N);
  const int sub = threadIdx.x / LANES, lane = threadIdx.x % LANES;
  float wr[VPT * VEC], dw[VPT * VEC];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int g = k * LANES + lane;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      dw[k * VEC + i] = 0.f;
      wr[k * VEC + i] = a.w && g < groups ? a.w[g * VEC + i] : 1.f;
    }
  }
  // every lane runs every round (the shuffles), rows past M with zeros
  const int64_t round = static_cast<int64_t>(kRows) * kNarrowDepth * row_step;
  for (int64_t base = first_row; base < a.M; base += round) {
    Raw<T, VEC> sraw[kNarrowDepth][VPT], draw[kNarrowDepth][VPT];
    int64_t row[kNarrowDepth];
#pragma unroll
    for (int d = 0; d < kNarrowDepth; ++d) {
      row[d] = base + static_cast<int64_t>(d * kRows + sub) * row_step;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int g = k * LANES + lane;
        if (row[d] < a.M && g < groups) {
          load_raw<T, VEC>(static_cast<const T*>(a.s) + row[d] * a.stride_s + g * VEC,
                           sraw[d][k]);
          load_raw<T, VEC>(static_cast<const T*>(a.dy) + row[d] * a.stride_dy + g * VEC,
                           draw[d][k]);
        } else {
          sraw[d][k] = {};
          draw[d][k] = {};
        }
      }
    }
#pragma unroll
    for (int d = 0; d < kNarrowDepth; ++d) {
      float ss = 0.f, gs = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        float sv[VEC], dv[VEC];
        unpack<T, VEC>(sraw[d][k], sv);
        unpack<T, VEC>(draw[d][k], dv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          ss = fmaf(sv[i], sv[i], ss);
          gs = fmaf(dv[i] * wr[k * VEC + i], sv[i], gs);
        }
      }
#pragma unroll
      for (int off = LANES / 2; off > 0; off /= 2) {
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
        gs += __shfl_xor_sync(0xffffffffu, gs, off);
      }
      if (row[d] >= a.M) continue;
      const float rstd = rsqrtf(ss * inv_n + a.eps);
      const float c2 = gs * inv_n * rstd * rstd;
      T* dsr = static_cast<T*>(a.ds) + row[d] * a.stride_ds;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int g = k * LANES + lane;
        if (g >= groups) continue;
        float sv[VEC], dv[VEC], out[VEC];
        unpack<T, VEC>(sraw[d][k], sv);
        unpack<T, VEC>(draw[d][k], dv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          out[i] = (dv[i] * wr[k * VEC + i] - sv[i] * c2) * rstd;
          dw[k * VEC + i] = fmaf(dv[i] * sv[i], rstd, dw[k * VEC + i]);
        }
        store_group<T, VEC>(dsr + g * VEC, out);
      }
    }
  }
  if (a.w == nullptr) return;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int g = k * LANES + lane;
    if (g >= groups) continue;
#pragma unroll
    for (int i = 0; i < VEC; ++i) part[sub][g * VEC + i] = dw[k * VEC + i];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < N; c += kNarrowThreads) {
    float sum = 0.f;
#pragma unroll 8
    for (int r = 0; r < kRows; ++r) sum += part[r][c];
    dwp[c] = sum;
  }
}

// ---- rows staged through shared memory -------------------------------------------------
// The default for every row that fits: each CTA keeps 2-4 rows of s and dy in shared
// memory (staged_stages), the next rows' copies (cp.async, 16 bytes a thread at a time, no
// registers held) in flight while the current row is reduced and stored, so a CTA never
// waits on a row's loads with nothing else to do. The row's values are read from shared
// memory twice (the sums, then ds), the fp32 weight once a CTA into shared memory;
// dweight's share stays in registers.
//
// Any row alignment: a row's groups are counted from the 16-byte boundary at or before its
// start (its phase: elements past that boundary), so every group is one aligned 16-byte
// copy; the first and last groups may hold elements of the neighbouring rows, or (the
// tensor's first and last rows) bytes outside it, always inside the same aligned 16 bytes
// as an element of the row, so never outside its memory page. Those lanes are zeroed
// before use and never stored. A thread owns the same groups in every row, and so the same
// columns, because every row a CTA takes has the same phase: the host makes gridDim.x a
// multiple of the rows it takes the phase to repeat (and requires one phase, row by row,
// of every tensor).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// All but the latest `kPending` groups landed.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Bytes of shared memory a CTA of the staged kernel needs: `stages` rows of s and dy, and
// the weight (w_bytes an element: 4, T's 2, or 0 where KEEP holds it in registers), `cap`
// groups each.
template <typename T, typename S>
int staged_smem_bytes(int cap, int stages, int w_bytes) {
  const int elems = cap * kVec<T>;
  return stages * elems * static_cast<int>(sizeof(S) + sizeof(T)) + elems * w_bytes;
}

// STAGES rows a CTA in shared memory: the one being reduced and stored, and the next
// STAGES - 1 rows' copies in flight (pick_staged says how many). At most 64 registers a
// thread (1024 threads' worth an SM): more CTAs stay resident. WT: the weight (a.w_t) is
// kept in T, half the shared memory bytes of the fp32 copy and half the shared memory
// reads; built for the 2-row rings of 512 threads and more and the clusters' CTAs, where it
// measured faster (the one-CTA 3- and 4-row kernels spill with it:
// docs/notebook/05-the-backward.md, v18; the 512-thread 3-row cluster kernel does not:
// docs/notebook/13-the-cluster-backward-and-the-gluon-run.md, v43).
//
// KEEP: the row's values, as floats, and the weight of this thread's columns stay in
// registers from the sums to ds (no second pass over shared memory, no conversions again,
// no weight in shared memory), at up to 128 registers a thread (512 threads' worth an SM).
// Built for the plain op's aligned 16-bit rows (so no phase and no edge tests) to 512
// threads, whose CTAs an SM shared memory had held to 512-704 threads: 16-bit rows are the
// ones whose instructions a byte (two elements to convert, to sum, to scale) held the
// kernel back, and there it measured faster; the fused add's lost
// (docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v47). IN_TURN: the
// CTA sums' form (block_sum2).
template <typename T, typename S, int THREADS, int VPT, int STAGES, bool CLUSTER, bool WT,
          bool KEEP = false, bool IN_TURN = false, bool HEADS = false>
__global__ void __launch_bounds__(THREADS, (KEEP && VPT > 1 ? 512 : 1024) / THREADS)
    rms_norm_bwd_staged(ArgsOf<HEADS> a) {
  static_assert(STAGES >= 2, "a row in flight while one is reduced");
  static_assert(!KEEP || (!CLUSTER && !WT && THREADS <= 512), "one CTA a row, an fp32 weight");
  static_assert(!HEADS || !CLUSTER, "a CTA's rows of one head");
  constexpr int VEC = kVec<T>;
  extern __shared__ uint4 smem_raw[];
  __shared__ float red[2 * (THREADS / 32)];
  // AHEAD: a row's sums sent before the previous row's are waited for, so that wait has
  // the next row's first pass in front of it (faster at bf16 65536 and fp32 32768, level
  // elsewhere: docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v50);
  // with one row ahead of the one reduced, two rows are staged and the rest in flight
  constexpr bool AHEAD = CLUSTER && STAGES >= 3;
  static_assert(!AHEAD || THREADS > 32, "kAheadSets' order rests on block_sum2's CTA barrier");
  constexpr int SETS = AHEAD ? kAheadSets : STAGES;  // the cluster's slot sets
  __shared__ float2 slots[CLUSTER ? SETS : 1][kMaxClusterRanks];
  __shared__ __align__(8) uint64_t sum_bars[CLUSTER ? SETS : 1];
  uint32_t parity = 0;
  const int t = threadIdx.x;
  const int N = a.N;
  const int cap = a.cap;
  const int stage_elems = cap * VEC;
  // stage st's rows at s_sm + st * stage_elems and dy_sm + st * stage_elems
  S* const s_sm = reinterpret_cast<S*>(smem_raw);
  T* const dy_sm = reinterpret_cast<T*>(s_sm + STAGES * stage_elems);
  // the weight: fp32, or (WT) in T. WT's pointer is tested at run time, not folded by the
  // template: so written, ptxas leaves the 1024-thread kernel without spills, which the
  // `if constexpr` form had and which cost it most of WT's gain
  // (docs/notebook/05-the-backward.md, v18).
  float* const w_sm = reinterpret_cast<float*>(dy_sm + STAGES * stage_elems);
  T* const wt_sm = dy_sm + STAGES * stage_elems;

  int rank = 0, ranks = 1;
  if constexpr (CLUSTER) cluster_start<SETS>(rank, ranks, sum_bars);
  int64_t first_row = blockIdx.x / ranks;  // this CTA's cluster's first row
  int64_t row_step = gridDim.x / ranks;    // the clusters
  const int64_t part_row = first_row;  // the cluster's partials row (HEADS: moved from)
  to_head<HEADS, S, T>(a, first_row, row_step);
  const T* const w_t = WT ? static_cast<const T*>(a.w_t) : nullptr;
  const int g0 = rank * cap;                     // this CTA's first group of a row
  const S* s_base = static_cast<const S*>(a.s);
  const T* dy_base = static_cast<const T*>(a.dy);
  // this CTA's phase (the same in every tensor and every row it takes) and the groups a
  // row spans from its aligned start
  // (KEEP's rows are aligned and whole groups: the host picks it for those alone)
  const int phase = KEEP ? 0 : row_phase<S>(a, first_row);
  const int groups = (phase + N + VEC - 1) / VEC;
  const float inv_n = 1.f / static_cast<float>(N);
  // this thread's k-th group: local index l (its place in the stage), row group g
  auto owns = [&](int k, int& l, int& g) {
    l = k * THREADS + t;
    g = g0 + l;
    return l < cap && g < groups;
  };

  // fn(k, l, i, col) for lane i of each group this thread owns (col: its column, which may
  // be outside the row in the first and last groups)
  auto each_lane = [&](auto&& fn) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      int l, g;
      if (!owns(k, l, g)) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) fn(k, l, i, g * VEC + i - phase);
    }
  };

  // the weight of this thread's groups (0 outside the row), read by this thread alone: into
  // shared memory, or (KEEP) registers
  float wr[KEEP ? VPT * VEC : 1] = {};
  each_lane([&](int k, int l, int i, int col) {
    const bool out = col < 0 || col >= N;
    if constexpr (KEEP)
      wr[k * VEC + i] = out ? 0.f : (a.w ? a.w[col] : 1.f);
    else if (w_t)
      wt_sm[l * VEC + i] = out ? from_float<T>(0.f) : w_t[col];
    else
      w_sm[l * VEC + i] = out ? 0.f : (a.w ? a.w[col] : 1.f);
  });
  auto weight = [&](int k, int l, float (&wv)[VEC]) {
    if constexpr (KEEP) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) wv[i] = wr[k * VEC + i];
    } else if (w_t) {
      load_group<T, VEC>(wt_sm + l * VEC, wv);
    } else {
      load_group<float, VEC>(w_sm + l * VEC, wv);
    }
  };
  auto issue = [&](int64_t row, int st) {
    const S* sr = s_base + row * a.stride_s - phase;
    const T* dyr = dy_base + row * a.stride_dy - phase;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      int l, g;
      if (!owns(k, l, g)) continue;
#pragma unroll
      for (int v = 0; v < VEC * static_cast<int>(sizeof(S)) / 16; ++v)
        cp_async16(s_sm + st * stage_elems + l * VEC + v * kVec<S>, sr + g * VEC + v * kVec<S>);
      cp_async16(dy_sm + st * stage_elems + l * VEC, dyr + g * VEC);
    }
  };
  // a group's values from the stage, the lanes outside the row zeroed
  auto fetch = [&](int st, int l, int g, float (&sv)[VEC], float (&dv)[VEC]) {
    load_group<S, VEC>(s_sm + st * stage_elems + l * VEC, sv);
    load_group<T, VEC>(dy_sm + st * stage_elems + l * VEC, dv);
    if (!KEEP && (g == 0 || g == groups - 1)) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const int col = g * VEC + i - phase;
        if (col < 0 || col >= N) sv[i] = dv[i] = 0.f;
      }
    }
  };

  // KEEP: the row's values as the sums left them, for ds
  float sk[KEEP ? VPT * VEC : 1], dk[KEEP ? VPT * VEC : 1];
  // fn(k, g, sv, dv, wv) for each group this thread owns, with its s, dy and weight from
  // stage st (the sums; ds too unless KEEP), or (AGAIN) from sk and dk
  auto each_group = [&](int st, auto again, auto&& fn) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      int l, g;
      if (!owns(k, l, g)) continue;
      float sv[VEC], dv[VEC], wv[VEC];
      if constexpr (decltype(again)::value) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          sv[i] = sk[k * VEC + i];
          dv[i] = dk[k * VEC + i];
        }
      } else {
        fetch(st, l, g, sv, dv);
      }
      weight(k, l, wv);
      fn(k, g, sv, dv, wv);
    }
  };

  float dw[VPT * VEC];
#pragma unroll
  for (int e = 0; e < VPT * VEC; ++e) dw[e] = 0.f;
  // the ring: row first_row + j * row_step in stage j % STAGES, STAGES - 1 rows ahead of
  // the one reduced; one commit group a row (empty past the last). The CTA's first row
  // exists (the grid is at most M walkers). Two stages alternate by xor.
  auto next = [](int st) { return STAGES == 2 ? st ^ 1 : (st + 1 == STAGES ? 0 : st + 1); };
  auto last = [](int st) { return STAGES == 2 ? st ^ 1 : (st == 0 ? STAGES - 1 : st - 1); };
  int st = 0;
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j == 0 || first_row + j * row_step < a.M) issue(first_row + j * row_step, j);
    cp_async_commit();
  }
  // the row's two sums over this CTA's groups of stage st, whose copies have landed (KEEP:
  // the values kept in sk and dk)
  auto cta_sums = [&](int st) {
    float ss = 0.f, gs = 0.f;
    each_group(st, std::false_type{}, [&](int k, int, const float(&sv)[VEC], const float(&dv)[VEC],
                                          const float(&wv)[VEC]) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        ss = fmaf(sv[i], sv[i], ss);
        gs = fmaf(dv[i] * wv[i], sv[i], gs);
        if constexpr (KEEP) {
          sk[k * VEC + i] = sv[i];
          dk[k * VEC + i] = dv[i];
        }
      }
    });
    return block_sum2<THREADS, IN_TURN>(ss, gs, red);
  };
  // ds of `row` from stage st, and its dweight share, given the whole row's sums
  auto finish = [&](int64_t row, int st, float2 sums) {
    const float rstd = rsqrtf(sums.x * inv_n + a.eps);
    const float c2 = sums.y * inv_n * rstd * rstd;
    const int64_t off = -phase;
    T* dsr = static_cast<T*>(a.ds) + row * a.stride_ds + off;
    S* ds2r = a.ds2 ? static_cast<S*>(a.ds2) + row * a.stride_ds2 + off : nullptr;
    const S* dror = a.dro ? static_cast<const S*>(a.dro) + row * a.stride_dro + off : nullptr;
    each_group(st, std::bool_constant<KEEP>{}, [&](int k, int g, float(&sv)[VEC],
                                                   const float(&dv)[VEC], const float(&wv)[VEC]) {
      const bool whole =
          KEEP || ((g > 0 || phase == 0) && (g < groups - 1 || (phase + N) % VEC == 0));
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        dw[k * VEC + i] = fmaf(dv[i] * sv[i], rstd, dw[k * VEC + i]);
        sv[i] = (dv[i] * wv[i] - sv[i] * c2) * rstd;  // ds, in place
      }
      if (dror) {  // d_residual_out's own gradient
        float dro[VEC];
        if (whole) {
          load_group<S, VEC>(dror + g * VEC, dro);
        } else {
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const int col = g * VEC + i - phase;
            dro[i] = col < 0 || col >= N ? 0.f : to_float(dror[g * VEC + i]);
          }
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) sv[i] += dro[i];
      }
      const float(&out)[VEC] = sv;
      if (whole) {
        store_group<T, VEC>(dsr + g * VEC, out);
        if (ds2r) store_group<S, VEC>(ds2r + g * VEC, out);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const int col = g * VEC + i - phase;
          if (col < 0 || col >= N) continue;
          dsr[g * VEC + i] = from_float<T>(out[i]);
          if (ds2r) ds2r[g * VEC + i] = from_float<S>(out[i]);
        }
      }
    });
  };
  if constexpr (AHEAD) {
    // row first_row's sums sent; then each row's successor's sent before its own are
    // collected. Row first_row + j * row_step goes through set j % SETS.
    cp_async_wait<STAGES - 2>();
    cluster_send2(cta_sums(0), slots, sum_bars, 0, rank, ranks, true);
    int set = 0;
    for (int64_t row = first_row; row < a.M; row += row_step, st = next(st)) {
      const int64_t ahead = row + (STAGES - 1) * row_step;
      if (ahead < a.M) issue(ahead, last(st));  // the stage finished last
      cp_async_commit();
      const int set1 = set + 1 == SETS ? 0 : set + 1;
      if (row + row_step < a.M) {
        cp_async_wait<STAGES - 2>();  // the next row's copies landed
        cluster_send2(cta_sums(next(st)), slots, sum_bars, set1, rank, ranks, false);
      }
      finish(row, st, cluster_collect2(slots, sum_bars, parity, set, ranks));
      set = set1;
    }
  } else {
    for (int64_t row = first_row; row < a.M; row += row_step, st = next(st)) {
      const int64_t ahead = row + (STAGES - 1) * row_step;
      if (ahead < a.M) issue(ahead, last(st));  // the stage read last
      cp_async_commit();
      cp_async_wait<STAGES - 1>();  // this thread's copies of `row` landed (it reads no others)
      float2 sums = cta_sums(st);
      if constexpr (CLUSTER)
        sums = cluster_sums2(sums, slots, sum_bars, parity, st, rank, ranks, row == first_row);
      finish(row, st, sums);
    }
  }
  if (a.w == nullptr && w_t == nullptr) return;
  float* dwp = a.dwp + part_row * N;  // this CTA's columns of it
  each_lane([&](int k, int, int i, int col) {
    if (col >= 0 && col < N) dwp[col] = dw[k * VEC + i];
  });
}

// dweight[c] = sum over the P partials rows, cast once. A block takes COLS columns (32
// bytes of a partials row at least: whole sectors where N is a multiple of 8) and
// kReduceThreads / COLS slices: slice j sums rows j, j + slices, ... in order, kReduceUnroll
// loads in flight, then the slices' sums meet in a fixed tree: the same order every run.
// The fewer columns a block, the more blocks and the fewer rows a slice: the partials are
// read at the latency of a few rounds of loads, not of P / 8 of them (narrow rows have the
// most partials rows: a CTA each).
template <typename W, int COLS>
__global__ void __launch_bounds__(kReduceThreads) dw_reduce_kernel(const float* __restrict__ dwp,
                                                                 W* dw, int P, int N) {
  constexpr int kSlices = kReduceThreads / COLS;
  __shared__ float part[kSlices][COLS];
  const int col = threadIdx.x % COLS;
  const int slice = threadIdx.x / COLS;
  const int c = blockIdx.x * COLS + col;
  float acc = 0.f;
  if (c < N) {
#pragma unroll kReduceUnroll
    for (int p = slice; p < P; p += kSlices) acc += dwp[static_cast<int64_t>(p) * N + c];
  }
  part[slice][col] = acc;
  __syncthreads();
#pragma unroll
  for (int half = kSlices / 2; half > 0; half /= 2) {
    if (slice < half) part[slice][col] += part[slice + half][col];
    __syncthreads();
  }
  if (slice == 0 && c < N) dw[c] = from_float<W>(part[0][col]);
}

// dweight from the partials: blocks of the widest columns (kReduceMaxCols, half that, ...
// down to kReduceMinCols) of which there are at least as many as SMs (the last block
// partial), Triton's rule (tuning.DW_BLOCK_N).
template <typename W, int COLS = kReduceMaxCols>
void reduce_dweight(const float* dwp, W* dw, int P, int N, int sms, cudaStream_t stream) {
  if constexpr (COLS > kReduceMinCols) {
    if ((N + COLS - 1) / COLS < sms) return reduce_dweight<W, COLS / 2>(dwp, dw, P, N, sms, stream);
  }
  dw_reduce_kernel<W, COLS><<<(N + COLS - 1) / COLS, kReduceThreads, 0, stream>>>(dwp, dw, P, N);
}

// ---- launch ---------------------------------------------------------------------------
using KernelPtr = void (*)(BwdArgs);
using HeadsKernelPtr = void (*)(HeadArgs);

// The most shared memory a CTA may ask for on a device, asked once per device.
int smem_optin(int device) {
  return device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device);
}

struct Launch {
  KernelPtr kernel = nullptr;
  HeadsKernelPtr heads = nullptr;  // the kernel's HEADS twin, run in its place (heads_twin)
  int threads = 0;
  int smem = 0;   // dynamic shared memory bytes
  int cap = 0;    // the staged kernel's groups a stage holds (0: another kernel)
  int ranks = 1;  // CTAs a cluster (sharing each row)
  bool wt = false;  // the staged kernel reads the weight in T (a.w_t)
  int rows = 1;     // rows a CTA holds at once (the narrow kernel's), for its grid
};

// The cluster launch of a staged kernel (ranks > 1), over `walkers` clusters.
cudaLaunchConfig_t cluster_config(const Launch& l, int walkers, cudaStream_t stream,
                                  cudaLaunchAttribute* attr) {
  return cluster_launch_config(dim3(static_cast<unsigned>(walkers * l.ranks)), l.threads,
                               static_cast<size_t>(l.smem), stream, dim3(l.ranks), attr);
}

// The row walkers (CTAs, or clusters of l.ranks CTAs) that fit the GPU at once for this
// launch (a persistent grid), at most M. The occupancy is asked once per kernel, device,
// shared memory size and cluster size: one kernel serves clusters of 2, 4 and 8 CTAs with
// the same shared memory, and a count of 2-CTA clusters launched as 4-CTA ones is twice
// the clusters that fit, whose second half then waits for the first to finish.
int persistent_walkers(const Launch& l, int64_t M, int device) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, int>, int> fit_of;
  int fit = 0;
  const void* k = l.heads ? reinterpret_cast<const void*>(l.heads)
                          : reinterpret_cast<const void*>(l.kernel);
  {
    const std::lock_guard<std::mutex> lock(mu);
    auto it = fit_of.find({k, device, l.smem, l.ranks});
    if (it == fit_of.end()) {
      if (l.smem > 0) {  // staged rows: as much shared memory as the SM has, L1 the rest
        cudaFuncAttributes fa;
        C10_CUDA_CHECK(cudaFuncGetAttributes(&fa, k));  // its static shared memory counts too
        const int dynamic_max = smem_optin(device) - static_cast<int>(fa.sharedSizeBytes);
        C10_CUDA_CHECK(
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_max));
        C10_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
      }
      if (l.ranks > 1) {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg = cluster_config(l, 1, nullptr, &attr);
        C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, l.kernel, &cfg));
      } else {
        int per_sm = 0;
        C10_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, l.threads, l.smem));
        fit = per_sm * sm_count(device);
      }
      fit_of[{k, device, l.smem, l.ranks}] = fit;
    } else {
      fit = it->second;
    }
  }
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(M, fit)));
}

// make(std::integral_constant<int, THREADS>) for the fewest of THREADS, 2 THREADS, ...
// MAX_THREADS threads whose kVpt groups each span `cap` groups, else MAX_THREADS (those
// past it are not built).
template <int MAX_THREADS = 1024, int THREADS = 64, typename Make>
Launch by_threads(int cap, Make make) {
  if constexpr (THREADS < MAX_THREADS) {
    if (cap > THREADS * kVpt) return by_threads<MAX_THREADS, 2 * THREADS>(cap, make);
  }
  return make(std::integral_constant<int, THREADS>{});
}

// Rows a CTA of the one-CTA staged kernel keeps in shared memory, for rows of
// `stage_bytes` of s and dy: a row must stay in flight while the one before it is reduced
// and stored, and a short row is done before the next one lands (bwd_tuning::kRings).
int staged_stages(int stage_bytes, bool fused, bool aligned) {
  if (!aligned) return kUnalignedRing;
  for (const Ring& ring : kRings)
    if (stage_bytes <= ring.max_row_bytes) return fused ? ring.fused : ring.plain;
  return 2;
}

// The one-CTA staged kernel of THREADS threads with `stages` rows, or fewer (`stages` says
// which) where that depth is not built; with the weight in T if `wt` asks and the kernel is
// built so (`wt` says); KEEP if `keep` asks and the kernel is built so (`keep` says). Built
// are the depths staged_stages gives: the plain op's aligned 16-bit rows (KEEP) 4 to 256
// threads (16 KB a row) and 3 at 512 (32 KB); the fused add's rows to 16 KB 3 (256 threads
// or fewer); 2 for the rest, with the weight in T for 16-bit dy's rings of 512 and 1024
// threads, the plain op's 1024-thread one with its CTA sums in turn (block_sum2).
// (fp32's rows take the register kernel or a cluster, but for the fused add's aligned ones.)
template <typename T, typename S, int THREADS>
KernelPtr staged_kernel(int& stages, bool& wt, bool& keep) {
  [[maybe_unused]] const bool plain16 = keep;  // the plain op's aligned 16-bit rows
  if constexpr (std::is_same_v<T, S> && sizeof(T) == 2 && THREADS <= 512) {
    constexpr int kKeepStages = THREADS <= 256 ? 4 : 3;
    if (keep && stages >= kKeepStages) {
      stages = kKeepStages;
      wt = false;
      return rms_norm_bwd_staged<T, S, THREADS, kVpt, kKeepStages, false, false, true>;
    }
  }
  keep = false;
  if constexpr (THREADS <= 256) {
    if (stages >= 3) {
      stages = 3;
      wt = false;
      return rms_norm_bwd_staged<T, S, THREADS, kVpt, 3, false, false>;
    }
  }
  stages = 2;
  if constexpr (THREADS >= 512 && sizeof(T) == 2) {
    if constexpr (THREADS == 1024 && std::is_same_v<T, S>) {
      if (wt && plain16)
        return rms_norm_bwd_staged<T, S, THREADS, kVpt, 2, false, true, false, true>;
    }
    if (wt) return rms_norm_bwd_staged<T, S, THREADS, kVpt, 2, false, true>;
  }
  wt = false;
  return rms_norm_bwd_staged<T, S, THREADS, kVpt, 2, false, false>;
}

// What the choice of kernel reads besides the dtypes.
struct Rows {
  int N;
  bool staged;     // the rows may be staged (one phase in every tensor; aligned, whole
                   // groups where s's elements are wider than dy's)
  bool vec_ok;     // every row aligned, N whole groups
  bool fused;      // the fused add's backward (d_residual_out read; dresidual stored unless
                   // dx serves as it)
  int smem_optin;  // shared memory a CTA may have
  bool clusters;   // thread-block clusters (sm_90)
  bool w16;        // a weight of dy's 16-bit dtype (the staged kernel may keep it in T)
};

// The staged kernel for rows of `row_groups` groups: one CTA, the fewest threads that span
// them, if its stages fit (staged_stages', else 2); else a cluster of the fewest CTAs (2, 4,
// 8; sm_90) whose shares of the row fit, of the row's CTA shape (kClusterCta or
// kClusterOneCta).
template <typename T, typename S>
bool pick_staged(int row_groups, const Rows& r, Launch& l) {
  // A 16-bit weight stays in T in the 2-row rings of aligned rows on 512 threads or more
  // and in every cluster CTA of aligned rows, where it measured faster (the cluster shapes
  // were probed with it: docs/notebook/13-the-cluster-backward-and-the-gluon-run.md, v43);
  // on the one-CTA deeper rings it spilled and lost, and on rows off a 16-byte boundary it
  // lost too (docs/notebook/05-the-backward.md, v18).
  auto in_t = [&](int cap, int stages, bool cluster) {
    return r.w16 && r.vec_ok && (cluster || (stages == 2 && cap > kWeightInTMinThreads * kVpt));
  };
  // (the static shared memory, the row sums' 2 floats a warp, within the margin)
  auto smem = [&](int cap, int stages, bool cluster = false) {
    return staged_smem_bytes<T, S>(cap, stages, in_t(cap, stages, cluster) ? 2 : 4);
  };
  auto fits = [&](int cap, int stages, bool cluster = false) {
    return cap <= 1024 * kVpt && smem(cap, stages, cluster) <= r.smem_optin - kStaticSmemMargin;
  };
  const int stage_bytes = row_groups * kVec<T> * static_cast<int>(sizeof(S) + sizeof(T));
  int stages = staged_stages(stage_bytes, r.fused, r.vec_ok);
  // 16-bit rows off a 16-byte boundary in the odd band (bwd_tuning::kOdd*)
  if constexpr (sizeof(T) == 2 && std::is_same_v<T, S>) {
    if (!r.vec_ok && row_groups >= kOddMinGroups && row_groups <= kOddMaxGroups &&
        fits(row_groups, 2)) {
      l.kernel = rms_norm_bwd_staged<T, S, kOddThreads, kOddVpt, 2, false, false>;
      l.threads = kOddThreads;
      l.cap = row_groups;
      l.smem = smem(row_groups, 2);
      return true;
    }
  }
  if (!fits(row_groups, stages)) stages = 2;
  if (fits(row_groups, stages)) {
    bool wt = in_t(row_groups, stages, false);
    // KEEP (rms_norm_bwd_staged): the plain op's aligned 16-bit rows
    bool keep = !r.fused && r.vec_ok;
    l = by_threads(row_groups, [&stages, &wt, &keep](auto threads) {
      Launch one;
      one.kernel = staged_kernel<T, S, decltype(threads)::value>(stages, wt, keep);
      one.threads = threads;
      return one;
    });
    l.cap = row_groups;
    l.wt = wt;
    l.smem = staged_smem_bytes<T, S>(row_groups, stages, keep ? 0 : wt ? 2 : 4);
    return true;
  }
  if (!r.clusters) return false;
  // a cluster of CTAs of THREADS threads holding STAGES rows of their shares, if one fits;
  // WT_ONLY: the caller checked that a 16-bit weight stays in T, so only that kernel is built
  auto cluster = [&](auto threads, auto depth, auto wt_only) {
    constexpr int kThreads = decltype(threads)::value;
    constexpr int kStages = decltype(depth)::value;
    for (int ranks = 2; ranks <= kMaxClusterRanks; ranks *= 2) {
      const int cap = (row_groups + ranks - 1) / ranks;
      if (cap > kThreads * kVpt || !fits(cap, kStages, true)) continue;
      l.cap = cap;
      l.smem = smem(cap, kStages, true);
      l.ranks = ranks;
      l.wt = in_t(cap, kStages, true);
      if constexpr (sizeof(T) == 2 && decltype(wt_only)::value) {
        l.kernel = rms_norm_bwd_staged<T, S, kThreads, kVpt, kStages, true, true>;
      } else {
        l.kernel = rms_norm_bwd_staged<T, S, kThreads, kVpt, kStages, true, false>;
        if constexpr (sizeof(T) == 2) {
          if (l.wt) l.kernel = rms_norm_bwd_staged<T, S, kThreads, kVpt, kStages, true, true>;
        }
      }
      l.threads = kThreads;
      return true;
    }
    return false;
  };
  using std::integral_constant;
  if constexpr (std::is_same_v<T, S>) {  // the plain op's types (and the fused add's alike)
    // kClusterCta where it was measured, aligned rows whose two CTAs fit an SM (both
    // ops): fp32, and 16-bit with the weight kept in T (112 KB a CTA); a 16-bit row beside
    // an fp32 weight, or none, would take 128 KB, one CTA an SM, a shape never measured
    const bool two_ctas = r.vec_ok && (std::is_same_v<T, float> || r.w16);
    if (two_ctas && cluster(integral_constant<int, kClusterCta.threads>{},
                            integral_constant<int, kClusterCta.stages>{}, std::true_type{}))
      return true;
  }
  if (cluster(integral_constant<int, kClusterOneCta.threads>{},
              integral_constant<int, kClusterOneCta.stages>{}, std::false_type{}))
    return true;
  return false;
}

// The register-resident kernel for rows whose aligned body is `cap` groups (at most
// 1024 * kVpt; MAX_THREADS * kVpt where that is below 512), with head and tail elements
// (EDGES) or none: the fewest threads of kVpt groups that span them, to MAX_THREADS; wider
// rows on 512 threads of kRegWideVpt groups (bwd_tuning).
template <typename T, typename S, bool EDGES, int MAX_THREADS = 512>
Launch pick_registers(int cap) {
  static_assert(512 * kRegWideVpt >= 1024 * kVpt, "512 threads span every row taken here");
  if constexpr (MAX_THREADS >= 512) {
    if (cap > 512 * kVpt) {
      Launch l;
      l.kernel = rms_norm_bwd_kernel<T, S, 512, kRegWideVpt, kVec<T>, false, EDGES>;
      l.threads = 512;
      return l;
    }
  }
  return by_threads<MAX_THREADS>(cap, [](auto threads) {
    Launch l;
    l.kernel = rms_norm_bwd_kernel<T, S, decltype(threads)::value, kVpt, kVec<T>, false, EDGES>;
    l.threads = threads;
    return l;
  });
}

// The narrow kernel for aligned rows of `groups` groups (at most kNarrowMaxGroups): the
// fewest lanes a row, 8 to 32, of one group each, else 32 of two.
constexpr int narrow_lanes(int groups) { return groups <= 8 ? 8 : groups <= 16 ? 16 : 32; }

template <typename T, bool HEADS = false>
auto narrow_kernel(int groups) {
  if (groups > 32) return rms_norm_bwd_narrow<T, 32, 2, HEADS>;
  switch (narrow_lanes(groups)) {
    case 8:
      return rms_norm_bwd_narrow<T, 8, 1, HEADS>;
    case 16:
      return rms_norm_bwd_narrow<T, 16, 1, HEADS>;
    default:
      return rms_norm_bwd_narrow<T, 32, 1, HEADS>;
  }
}

// The kernel for rows `r`.
template <typename T, typename S>
Launch pick(const Rows& r) {
  constexpr int V = kVec<T>;
  Launch l;
  const int whole = r.N / V;  // a row's whole groups (its aligned body's at most, with edges)
  const int cap = r.vec_ok ? whole : (r.N + 2 * V - 2) / V;  // groups a row spans, any phase
  static_assert(kNarrowMaxGroups <= 64, "the narrow kernels hold 32 lanes of 2 groups at most");
  if constexpr (std::is_same_v<T, S>) {
    if (!r.fused && r.vec_ok && whole <= kNarrowMaxGroups) {
      l.kernel = narrow_kernel<T>(whole);
      l.threads = kNarrowThreads;
      l.rows = kNarrowThreads / narrow_lanes(whole) * kNarrowDepth;
      return l;
    }
  }
  // The register-resident kernel, with no shared memory to limit its CTAs an SM, kept
  // more rows in flight than two stages a CTA did: fp32 rms_norm's aligned rows to 8192
  // (the fused add's longer rows hide the staged kernel's next copy there;
  // docs/notebook/05-the-backward.md, v15); rows of one phase off a 16-byte boundary or of
  // odd N (EDGES; docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v46):
  // fp32's of both ops, and 16-bit rms_norm's to kEdges16MaxGroups
  const bool edges = !r.vec_ok && r.staged && whole <= 1024 * kVpt;
  if constexpr (std::is_same_v<T, float>) {
    if (!r.fused && r.vec_ok && cap <= 1024 * kVpt) return pick_registers<T, S, false>(cap);
    if (edges) return pick_registers<T, S, true>(whole);
  }
  if constexpr (sizeof(T) == 2 && std::is_same_v<T, S>) {
    // built to the threads those rows take, no further
    constexpr int kThreads = kEdges16MaxGroups / kVpt;
    static_assert(kThreads * kVpt == kEdges16MaxGroups && kThreads <= 512, "whole threads of kVpt");
    if (edges && !r.fused && whole <= kEdges16MaxGroups)
      return pick_registers<T, S, true, kThreads>(whole);
  }
  // The plain op's aligned fp32 rows past one CTA (2048 groups) in registers over a
  // cluster of the fewest CTAs (2-8) whose equal shares of whole groups fit
  // kRegClusterThreads threads of kRegWideVpt groups: faster than staged from fp32 16384,
  // least at 32768 (16-bit rows lost so;
  // docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v50).
  if constexpr (std::is_same_v<T, float> && std::is_same_v<S, float>) {
    if (r.clusters && !r.fused && r.vec_ok && cap > 2048) {
      for (int ranks = 2; ranks <= kMaxClusterRanks; ranks *= 2) {
        if (cap % ranks != 0 || cap / ranks > kRegClusterThreads * kRegWideVpt) continue;
        l.kernel = rms_norm_bwd_kernel<T, S, kRegClusterThreads, kRegWideVpt, V, false, false,
                                       true>;
        l.threads = kRegClusterThreads;
        l.ranks = ranks;
        return l;
      }
    }
  }
  if (r.staged && pick_staged<T, S>(cap, r, l)) return l;
  l.threads = 1024;
  l.kernel = r.vec_ok ? rms_norm_bwd_kernel<T, S, 1024, kVpt, V, true>
                    : rms_norm_bwd_kernel<T, S, 1024, kScalarVpt, 1, true>;
  return l;
}

// The HEADS twin of kernel k (rms_norm's T rows, picked by pick for one head's row), or
// null where there is none: built for the narrow kernels (aligned rows to kNarrowMaxGroups
// groups: every head width models use) and for the 64-thread kernels that other head rows
// of one phase take (to 128 groups), the staged one of aligned 16-bit rows, the register one
// of aligned fp32 rows, and the register one with edges. Rows that take another (a
// cluster's, the chunked kernel of differing phases) go head by head or as rows.
template <typename T>
HeadsKernelPtr heads_twin(KernelPtr k) {
  constexpr int V = kVec<T>;
  for (const int groups : {8, 16, 32, 64})
    if (k == narrow_kernel<T>(groups)) return narrow_kernel<T, true>(groups);
  if (k == rms_norm_bwd_kernel<T, T, 64, kVpt, V, false, true>)
    return rms_norm_bwd_kernel<T, T, 64, kVpt, V, false, true, false, true>;
  if constexpr (sizeof(T) == 2) {
    if (k == rms_norm_bwd_staged<T, T, 64, kVpt, 4, false, false, true>)
      return rms_norm_bwd_staged<T, T, 64, kVpt, 4, false, false, true, false, true>;
  } else {
    if (k == rms_norm_bwd_kernel<T, T, 64, kVpt, V, false, false>)
      return rms_norm_bwd_kernel<T, T, 64, kVpt, V, false, false, false, true>;
  }
  return nullptr;
}

// The rows after which rows `stride_bytes` apart come back to the same 16-byte phase.
int phase_period(int64_t stride_bytes) {
  const int64_t bytes = stride_bytes % 16;
  return bytes == 0 ? 1 : static_cast<int>(16 / std::gcd<int64_t>(16, bytes));
}

at::Tensor rows_of(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// t as (T, H, N) heads: a view where its leading dimensions merge (head rows' do)
at::Tensor heads_of(const at::Tensor& t) { return t.reshape({-1, t.size(-2), t.size(-1)}); }

// ds (and ds2) for s's rows; returns dweight (undefined without a weight). heads (rms_norm's):
// s, dy and ds as (T, H, N) heads, s's where they lie, the weight a row or a row a head
// (dweight of its shape), in one launch of H x the CTAs' rows, each CTA's of one head, where
// the kernel picked has a HEADS twin (heads_twin); other rows go head by head (a row a head)
// or are copied into rows (a row).
at::Tensor run_backward(const at::Tensor& dy_in, const at::Tensor& s_in,
                        const std::optional<at::Tensor>& weight, double eps,
                        double weight_offset, const std::optional<at::Tensor>& dro_in,
                        at::Tensor& ds, at::Tensor* ds2, bool heads = false) {
  // heads are rms_norm's: HEADS kernels move s, dy, ds and the weight to a head, not the
  // fused add's d_residual_out or dresidual
  TORCH_INTERNAL_ASSERT(!heads || (!dro_in && ds2 == nullptr), "heads with the fused add");
  const int N = static_cast<int>(s_in.size(-1));
  const at::Tensor dy_n = dy_in.stride(-1) == 1 ? dy_in : dy_in.contiguous();
  const at::Tensor s = heads ? heads_of(s_in) : rows_of(s_in);
  const at::Tensor dy = heads ? dy_n.reshape(s.sizes()) : rows_of(dy_n);
  const at::Tensor dro =
      dro_in ? rows_of(dro_in->stride(-1) == 1 ? *dro_in : dro_in->contiguous()) : at::Tensor();
  const at::Tensor ds_rows = heads ? ds.view(s.sizes()) : ds.view({-1, N});
  const at::Tensor ds2_rows = ds2 ? ds2->view({-1, N}) : at::Tensor();
  const int64_t M = s.size(0);  // rows, or (heads) tokens
  const int64_t H = heads ? s.size(1) : 1;
  const bool has_w = weight.has_value() && weight->defined();
  const bool w_heads = has_w && weight->dim() == 2;

  // every row tensor: its address, row stride and head stride in bytes, for the alignment
  // checks (a CTA's rows are of one head: its head stride moves them all alike)
  struct RowTensor {
    uintptr_t addr;
    int64_t stride, head;
  };
  std::vector<RowTensor> rows;
  auto add = [&](const at::Tensor& t, int64_t stride) {
    const int64_t e = t.element_size();
    rows.push_back({reinterpret_cast<uintptr_t>(t.data_ptr()), stride * e,
                    heads ? t.stride(1) * e : 0});
  };
  add(s, s.stride(0));
  add(dy, dy.stride(0));
  add(ds_rows, ds_rows.stride(0));
  if (dro.defined()) add(dro, dro.stride(0));
  if (ds2) add(ds2_rows, N);
  const int vec = 16 / static_cast<int>(dy.element_size());
  bool vec_ok = N % vec == 0;
  bool one_phase = true;
  int period = 1;
  for (const auto& r : rows) {
    vec_ok = vec_ok && r.addr % 16 == 0 && r.stride % 16 == 0 && r.head % 16 == 0;
    one_phase = one_phase && r.addr % 16 == rows[0].addr % 16 &&
                r.stride % 16 == rows[0].stride % 16 && r.head % 16 == rows[0].head % 16;
    period = std::max(period, phase_period(r.stride));
  }
  const bool same_width = s.element_size() == dy.element_size();
  const bool staged = same_width ? one_phase : vec_ok;

  const int device = s.get_device();
  const auto dt = dy.scalar_type();
  // a 16-bit weight of dy's dtype may stay in it in the staged kernel's shared memory; with
  // a weight offset the kernels read weight + offset in fp32 (weight_as_read)
  const bool w16 =
      has_w && weight_offset == 0.0 && weight->scalar_type() == dt && dy.element_size() == 2;
  const Rows r{N,
               staged,
               vec_ok,
               dro.defined() || ds2 != nullptr,
               smem_optin(device),
               has_clusters(device),
               w16};
  Launch l;
  const bool s32 = s.scalar_type() == at::kFloat;
  if (dt == at::kFloat) {
    l = pick<float, float>(r);
  } else if (dt == at::kHalf) {
    l = s32 ? pick<__half, float>(r) : pick<__half, __half>(r);
  } else {
    l = s32 ? pick<__nv_bfloat16, float>(r) : pick<__nv_bfloat16, __nv_bfloat16>(r);
  }
  // the weight as the kernel reads it: in its dtype (the staged kernel's WT), else fp32,
  // the offset added there (weight_as_read)
  if (heads) {
    const bool same = s.scalar_type() == dt;
    l.heads = !same || l.ranks > 1 ? nullptr
              : dt == at::kFloat   ? heads_twin<float>(l.kernel)
              : dt == at::kHalf    ? heads_twin<__half>(l.kernel)
                                   : heads_twin<__nv_bfloat16>(l.kernel);
  }
  if (heads && l.heads == nullptr) {  // no HEADS kernel for these rows: head by head, or rows
    if (!w_heads) return run_backward(dy_in, s_in, weight, eps, weight_offset, dro_in, ds, ds2);
    at::Tensor dw = at::empty(weight->sizes(), weight->options());
    for (int64_t h = 0; h < H; ++h) {
      at::Tensor ds_h = ds_rows.select(1, h);
      dw.select(0, h).copy_(run_backward(dy.select(1, h), s.select(1, h), weight->select(0, h),
                                         eps, weight_offset, std::nullopt, ds_h, nullptr));
    }
    return dw;
  }
  const bool wt = l.wt;
  const at::Tensor w = !has_w ? at::Tensor()
                       : wt   ? weight->contiguous()
                              : weight_as_read(weight, weight_offset).to(at::kFloat).contiguous();
  const int64_t all_rows = M * H;
  // the narrow kernel's CTAs hold l.rows rows at once: no more CTAs than fill them
  int walkers = persistent_walkers(l, (all_rows + l.rows - 1) / l.rows, device);
  // the staged and register kernels' CTAs each keep one phase, and (heads) one head: a
  // whole number of H x periods of walkers (the chunked kernel, which takes rows of
  // differing phases, does not mind)
  const int unit = static_cast<int>(H) * period;
  if (walkers < all_rows)
    walkers = static_cast<int>(std::min<int64_t>(all_rows, std::max(unit, walkers / unit * unit)));
  at::Tensor dwp = at::empty({has_w ? walkers : 1, N}, s.options().dtype(at::kFloat));
  auto stream = at::cuda::getCurrentCUDAStream();
  if (M > 0) {
    BwdArgs a{s.data_ptr(),
              dy.data_ptr(),
              has_w && !wt ? w.data_ptr<float>() : nullptr,
              dro.defined() ? dro.data_ptr() : nullptr,
              ds_rows.data_ptr(),
              ds2 ? ds2_rows.data_ptr() : nullptr,
              dwp.data_ptr<float>(),
              s.stride(0),
              dy.stride(0),
              dro.defined() ? dro.stride(0) : 0,
              ds_rows.stride(0),
              N,
              M,
              N,
              static_cast<float>(eps),
              l.cap,
              wt ? w.data_ptr() : nullptr};
    if (l.heads) {
      const HeadArgs ha{a, static_cast<int>(H), s.stride(1), dy.stride(1), ds_rows.stride(1),
                        w_heads ? N : 0};
      l.heads<<<walkers, l.threads, l.smem, stream>>>(ha);
    } else if (l.ranks > 1) {
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t cfg = cluster_config(l, walkers, stream, &attr);
      C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, l.kernel, a));
    } else {
      l.kernel<<<walkers, l.threads, l.smem, stream>>>(a);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (!has_w) return at::Tensor();
  at::Tensor dw =
      at::empty(weight->sizes(), weight->options().memory_format(at::MemoryFormat::Contiguous));
  if (M == 0) return dw.zero_();
  const int sms = sm_count(device);
  // a row a head: CTA c's partials row is head c % H's, so the rows sum as (P / H, H x N)
  const int parts = w_heads ? walkers / static_cast<int>(H) : walkers;
  const int cols = w_heads ? static_cast<int>(H) * N : N;
  switch (weight->scalar_type()) {
    case at::kFloat:
      reduce_dweight(dwp.data_ptr<float>(), dw.data_ptr<float>(), parts, cols, sms, stream);
      break;
    case at::kHalf:
      reduce_dweight(dwp.data_ptr<float>(), reinterpret_cast<__half*>(dw.data_ptr()), parts, cols,
                     sms, stream);
      break;
    default:
      reduce_dweight(dwp.data_ptr<float>(), reinterpret_cast<__nv_bfloat16*>(dw.data_ptr()),
                     parts, cols, sms, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return dw;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                     const std::optional<at::Tensor>& weight,
                                                     double eps, double weight_offset) {
  check_backward_inputs(dy, x, weight, eps, weight_offset, std::nullopt, false);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0 && !weight) return {dx, x.new_empty({0})};
  // heads (a weight row a head, or x's head rows where they lie): one launch
  const bool heads = x.numel() > 0 && ((weight && weight->dim() == 2) || head_rows(x));
  at::Tensor dw =
      run_backward(dy, x, weight, eps, weight_offset, std::nullopt, dx, nullptr, heads);
  return {dx, dw.defined() ? dw : x.new_empty({0})};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_backward(
    const at::Tensor& dy, const std::optional<at::Tensor>& d_residual_out,
    const at::Tensor& residual_out, const std::optional<at::Tensor>& weight, double eps,
    bool dresidual, double weight_offset) {
  check_backward_inputs(dy, residual_out, weight, eps, weight_offset, d_residual_out, true);
  const c10::cuda::CUDAGuard guard(residual_out.device());
  const auto contiguous = residual_out.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor dx = at::empty(residual_out.sizes(), contiguous.dtype(dy.scalar_type()));
  at::Tensor dres = at::empty(dresidual ? residual_out.sizes() : at::IntArrayRef{0}, contiguous);
  at::Tensor dw =
      run_backward(dy, residual_out, weight, eps, weight_offset, d_residual_out, dx,
                   dresidual ? &dres : nullptr);
  return {dx, dres, dw.defined() ? dw : residual_out.new_empty({0})};
}

TORCH_LIBRARY_IMPL(cuda_impl, CUDA, m) {
  m.impl("rms_norm_backward", &rms_norm_backward);
  m.impl("fused_add_rms_norm_backward", &fused_add_rms_norm_backward);
}

}  // namespace cuda_impl
