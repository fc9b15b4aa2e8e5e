// Wide-row design probe (issue 15): one cluster kernel, its row shard either held in
// registers or staged in shared memory by cp.async, the weight read before or after the
// row's sum, slices contiguous a CTA or interleaved over the cluster. A standalone program
// (torch's headers only, for the shared device header; no library), so the design can be
// timed and profiled on the GPU without building the extension:
//   TORCH=$(python -c "import torch, os; print(os.path.dirname(torch.__file__))")
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I$TORCH/include \
//     -o build/wide_probe scripts/wide_probe.cu
//   build/wide_probe                       every candidate at N = 32768-262144, bf16 and fp32
//   build/wide_probe one DTYPE N BLOCK VPT MODE   one candidate, a few launches (for ncu)
// Output: one line a candidate, time, GB/s and % of a 1 GiB device copy, the largest error
// against a one-CTA-a-row fp32 reference, registers and the clusters that fit the GPU at once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../cuda_impl/csrc/rms_norm_device.cuh"
#include "cuda_check.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// MODE bits
constexpr int kStaged = 1;      // x's vectors by cp.async into shared memory, read from there twice
constexpr int kEarlyW = 2;      // the weight's vectors loaded into registers beside x's
constexpr int kInterleave = 4;  // vector k of thread t at (rank*BLOCK + t) + k*ranks*BLOCK
constexpr int kPrefetchW = 8;   // the weight's lines asked into L1 beside x's loads
constexpr int k2D = 16;         // grid (rows, ranks), clusters (1, ranks, 1), as QuACK launches
constexpr int kCa = 32;         // staged: cp.async.ca (L1-allocating) instead of .cg
constexpr int kPlainW = 64;     // the weight by a plain ld.global.v4 instead of ld.global.nc
constexpr int kBurst = 128;     // every output vector computed before the first store
constexpr int kPlainX = 256;    // registers: x by a plain ld.global.v4
constexpr int kMaxRanks = 16;

using cuda_impl::cluster_sum;  // the shipped kernel's, so the probe times its reduction
using cuda_impl::kVec;
using cuda_impl::Pack;
using cuda_impl::smem_u32;
using cuda_impl::to_float;

// a 16-byte vector of T: the sum of its squares; x * rstd * w, rounded to T
template <typename T>
__device__ __forceinline__ float sq(uint4 u) {
  Pack<T> p;
  p.raw = u;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i) s += to_float(p.e[i]) * to_float(p.e[i]);
  return s;
}
template <typename T>
__device__ __forceinline__ uint4 scale(uint4 x, uint4 w, float rstd) {
  Pack<T> a, b, o;
  a.raw = x;
  b.raw = w;
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i)
    o.e[i] = cuda_impl::from_float<T>(to_float(a.e[i]) * rstd * to_float(b.e[i]));
  return o.raw;
}

// x's 16-byte vector by a plain load, or the read-only non-allocating one (the default)
template <bool PLAIN>
__device__ __forceinline__ uint4 ld_v4(const uint4* p) {
  uint4 v;
  if constexpr (PLAIN)
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}

template <typename T, int BLOCK, int VPT, int MODE>
__global__ void __launch_bounds__(BLOCK)
    wide(const uint4* __restrict__ x, const uint4* __restrict__ w, uint4* __restrict__ y,
         int nvec, float inv_n, float eps) {
  constexpr bool kSt = (MODE & kStaged) != 0, kEw = (MODE & kEarlyW) != 0;
  constexpr bool kIl = (MODE & kInterleave) != 0, kPf = (MODE & kPrefetchW) != 0;
  extern __shared__ uint4 stage[];
  __shared__ float parts[BLOCK / 32 * kMaxRanks];
  __shared__ __align__(8) uint64_t bar;
  uint32_t rank, ranks;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(ranks));
  const int64_t row = (MODE & k2D) ? blockIdx.x : blockIdx.x / ranks;
  const uint4* xr = x + row * nvec;
  uint4* yr = y + row * nvec;
  const int t = threadIdx.x;
  auto at = [&](int k) -> int {
    return kIl ? static_cast<int>(rank) * BLOCK + t + k * static_cast<int>(ranks) * BLOCK
               : static_cast<int>(rank) * BLOCK * VPT + k * BLOCK + t;
  };
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cuda_impl::cluster_arrive_relaxed();
  uint4 v[kSt ? 1 : VPT];
  uint4 wv[kEw ? VPT : 1];
  if constexpr (kSt) {
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if constexpr ((MODE & kCa) != 0)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(smem_u32(&stage[k * BLOCK + t])),
                     "l"(xr + at(k))
                     : "memory");
      else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(&stage[k * BLOCK + t])),
                     "l"(xr + at(k))
                     : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  } else {
#pragma unroll
    for (int k = 0; k < VPT; ++k) v[k] = ld_v4<(MODE & kPlainX) != 0>(xr + at(k));
  }
  if constexpr (kEw) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) wv[k] = (MODE & kPlainW) ? ld_v4<true>(w + at(k)) : __ldg(w + at(k));
  }
  if constexpr (kPf) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) asm volatile("prefetch.global.L1 [%0];" ::"l"(w + at(k)));
  }
  if constexpr (kSt) asm volatile("cp.async.wait_all;" ::: "memory");
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) ss += sq<T>(kSt ? stage[k * BLOCK + t] : v[k]);
  ss = cluster_sum<BLOCK>(ss, parts, &bar, static_cast<int>(rank), static_cast<int>(ranks));
  const float rstd = rsqrtf(ss * inv_n + eps);
  if constexpr (!kSt) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) asm volatile("" : "+r"(v[k].x), "+r"(v[k].y), "+r"(v[k].z), "+r"(v[k].w));
  }
  if constexpr ((MODE & kBurst) != 0) {
    uint4 o[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const uint4 xv = kSt ? stage[k * BLOCK + t] : v[k];
      const uint4 wk = kEw ? wv[k] : __ldg(w + at(k));
      o[k] = scale<T>(xv, wk, rstd);
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) yr[at(k)] = o[k];
  } else {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const uint4 xv = kSt ? stage[k * BLOCK + t] : v[k];
      const uint4 wk = kEw ? wv[k] : __ldg(w + at(k));
      yr[at(k)] = scale<T>(xv, wk, rstd);
    }
  }
}

// reference: one 1024-thread CTA a row, fp32 sums, one vector at a time
template <typename T>
__global__ void reference(const uint4* x, const uint4* w, uint4* y, int nvec, float inv_n,
                          float eps) {
  __shared__ float red[32];
  const uint4* xr = x + static_cast<int64_t>(blockIdx.x) * nvec;
  uint4* yr = y + static_cast<int64_t>(blockIdx.x) * nvec;
  float s = 0.f;
  for (int j = threadIdx.x; j < nvec; j += blockDim.x) s += sq<T>(xr[j]);
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  s = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
  if (threadIdx.x < 32)
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (threadIdx.x == 0) red[0] = s;
  __syncthreads();
  const float rstd = rsqrtf(red[0] * inv_n + eps);
  for (int j = threadIdx.x; j < nvec; j += blockDim.x) yr[j] = scale<T>(xr[j], w[j], rstd);
}

__global__ void fill_random(uint32_t* p, int64_t n, uint32_t seed, bool is_bf16, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    const float u0 = lo + (hi - lo) * ((h & 0xffff) / 65535.f);
    const float u1 = lo + (hi - lo) * ((h >> 16) / 65535.f);
    if (is_bf16) {
      __nv_bfloat162 b = __floats2bfloat162_rn(u0, u1);
      std::memcpy(&p[i], &b, 4);
    } else {
      p[i] = __float_as_uint(u0);
    }
  }
}

// largest |a - b| / (1 + |b|) over n elements
template <typename T>
__global__ void max_err(const T* a, const T* b, int64_t n, unsigned* out) {
  float m = 0.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float fa = static_cast<float>(a[i]), fb = static_cast<float>(b[i]);
    float e = fabsf(fa - fb) / (1.f + fabsf(fb));
    if (!(e == e)) e = 1e30f;  // NaN (the poison) counts as a failure
    m = fmaxf(m, e);
  }
  atomicMax(out, __float_as_uint(m));
}

using KernelFn = void (*)(const uint4*, const uint4*, uint4*, int, float, float);

struct Cand {
  const char* dtype;
  int block, vpt, mode;
  KernelFn fn;
};

template <typename T, int BLOCK, int VPT, int MODE>
void add(std::vector<Cand>& c, const char* dt) {
  c.push_back({dt, BLOCK, VPT, MODE, wide<T, BLOCK, VPT, MODE>});
}
template <typename T, int BLOCK, int VPT>
void add_modes(std::vector<Cand>& c, const char* dt) {
  if constexpr (VPT <= 16) {
    add<T, BLOCK, VPT, 0>(c, dt);
    add<T, BLOCK, VPT, kEarlyW>(c, dt);
    add<T, BLOCK, VPT, kInterleave>(c, dt);
    add<T, BLOCK, VPT, kPrefetchW>(c, dt);
  }
  if constexpr (BLOCK * VPT * 16 <= 200 * 1024) {
    add<T, BLOCK, VPT, kStaged>(c, dt);
    add<T, BLOCK, VPT, kStaged | kEarlyW>(c, dt);
  }
}
// QuACK's differences, one at a time and together
template <typename T, int BLOCK, int VPT>
void add_quack(std::vector<Cand>& c, const char* dt) {
  if constexpr (VPT <= 16) {
    add<T, BLOCK, VPT, kPlainX>(c, dt);
    add<T, BLOCK, VPT, kPlainX | k2D>(c, dt);
    add<T, BLOCK, VPT, kPlainX | kBurst>(c, dt);
  }
  add<T, BLOCK, VPT, kStaged | kEarlyW | k2D>(c, dt);
  add<T, BLOCK, VPT, kStaged | kEarlyW | kCa>(c, dt);
  add<T, BLOCK, VPT, kStaged | kEarlyW | kPlainW>(c, dt);
  add<T, BLOCK, VPT, kStaged | kEarlyW | kBurst>(c, dt);
  add<T, BLOCK, VPT, kStaged | kEarlyW | k2D | kCa | kPlainW | kBurst>(c, dt);
}
template <typename T>
void add_all(std::vector<Cand>& c, const char* dt) {
  add_quack<T, 256, 8>(c, dt);
  add_quack<T, 512, 8>(c, dt);
  add_quack<T, 256, 32>(c, dt);
  add_modes<T, 128, 8>(c, dt);
  add_modes<T, 128, 16>(c, dt);
  add_modes<T, 128, 32>(c, dt);
  add_modes<T, 256, 4>(c, dt);
  add_modes<T, 256, 8>(c, dt);
  add_modes<T, 256, 16>(c, dt);
  add_modes<T, 256, 32>(c, dt);
  add_modes<T, 512, 4>(c, dt);
  add_modes<T, 512, 8>(c, dt);
  add_modes<T, 512, 16>(c, dt);
  add_modes<T, 1024, 8>(c, dt);
}

std::string mode_name(int m) {
  std::string s = (m & kStaged) ? "staged" : "regs";
  if (m & kEarlyW) s += "+earlyw";
  if (m & kInterleave) s += "+interleave";
  if (m & kPrefetchW) s += "+prefetchw";
  if (m & k2D) s += "+2d";
  if (m & kCa) s += "+ca";
  if (m & kPlainW) s += "+plainw";
  if (m & kBurst) s += "+burst";
  if (m & kPlainX) s += "+plainx";
  return s;
}

struct Run {
  float us;
  int ranks, regs, clusters;
};

// Launch c over M rows of nvec vectors; false where the shape does not fit it.
bool launch(const Cand& c, int nvec, int64_t M, const uint4* x, const uint4* w, uint4* y,
            float inv_n, int* ranks_out) {  // ranks_out: first launch, set the attributes
  const int per_cta = c.block * c.vpt;
  if (nvec % per_cta != 0) return false;
  const int ranks = nvec / per_cta;
  if (ranks < 1 || ranks > kMaxRanks || (ranks & (ranks - 1)) != 0) return false;
  const size_t smem = (c.mode & kStaged) ? static_cast<size_t>(per_cta) * 16 : 0;
  if (ranks_out) {
    CK(cudaFuncSetAttribute(c.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    CK(cudaFuncSetAttribute(c.fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  const bool two_d = (c.mode & k2D) != 0;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cuda_impl::cluster_launch_config(
      two_d ? dim3(static_cast<unsigned>(M), ranks) : dim3(static_cast<unsigned>(M * ranks)),
      c.block, smem, nullptr, two_d ? dim3(1, ranks) : dim3(ranks), &attr);
  CK(cudaLaunchKernelEx(&cfg, c.fn, x, w, y, nvec, inv_n, 1e-6f));
  if (ranks_out) {
    *ranks_out = ranks;
  }
  return true;
}

int active_clusters(const Cand& c, int ranks) {
  const size_t smem = (c.mode & kStaged) ? static_cast<size_t>(c.block) * c.vpt * 16 : 0;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      cuda_impl::cluster_launch_config(dim3(ranks * 1024), c.block, smem, nullptr, dim3(ranks), &attr);
  int n = -1;
  if (cudaOccupancyMaxActiveClusters(&n, c.fn, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return n;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  std::vector<Cand> cands;
  add_all<__nv_bfloat16>(cands, "bf16");
  add_all<float>(cands, "fp32");
  const bool one = argc > 1 && std::strcmp(argv[1], "one") == 0;
  // quick: bf16 65536 / 131072 and fp32 131072, blocks of 256 and 512 x 8 and 256 x 32 only
  const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;

  // the copy ceiling, as the harness takes it: a 1 GiB device-to-device copy
  double copy_gbps = 0;
  {
    const size_t nb = size_t(1) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, nb));
    CK(cudaMalloc(&b, nb));
    CK(cudaMemset(a, 1, nb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int i = 0; i < (one ? 2 : 8); ++i) {
      CK(cudaEventRecord(e0));
      for (int r = 0; r < 4; ++r) CK(cudaMemcpyAsync(b, a, nb, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 2 || one) ts.push_back(ms / 4);
    }
    copy_gbps = 2.0 * nb / (median(ts) * 1e-3) / 1e9;
    std::printf("copy 1GiB: %.1f GB/s\n", copy_gbps);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  const int64_t total = int64_t(1) << 27;  // elements of x, M = 2^27 / N
  void *x, *y, *yref, *w;
  CK(cudaMalloc(&x, total * 4));
  CK(cudaMalloc(&y, total * 4));
  CK(cudaMalloc(&yref, total * 4));
  CK(cudaMalloc(&w, 262144 * 4));
  unsigned* err;
  CK(cudaMalloc(&err, 4));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  const char* dts[2] = {"bf16", "fp32"};
  std::vector<int> Ns = {32768, 65536, 131072, 262144};
  for (const char* dt : dts) {
    const bool b16 = std::strcmp(dt, "bf16") == 0;
    const int elem = b16 ? 2 : 4;
    for (int N : Ns) {
      if (one && (std::strcmp(argv[2], dt) != 0 || std::atoi(argv[3]) != N)) continue;
      if (quick && !((b16 && (N == 65536 || N == 131072)) || (!b16 && N == 131072))) continue;
      const int64_t M = total / N;
      const int nvec = N * elem / 16;
      const float inv_n = 1.f / N;
      const int64_t words = total * elem / 4;
      fill_random<<<1024, 256>>>(static_cast<uint32_t*>(x), words, 1234u + N, b16, -2.f, 2.f);
      fill_random<<<64, 256>>>(static_cast<uint32_t*>(w), N * elem / 4, 99u + N, b16, 0.5f, 1.5f);
      if (b16)
        reference<__nv_bfloat16><<<M, 1024>>>((const uint4*)x, (const uint4*)w, (uint4*)yref, nvec, inv_n, 1e-6f);
      else
        reference<float><<<M, 1024>>>((const uint4*)x, (const uint4*)w, (uint4*)yref, nvec, inv_n, 1e-6f);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      for (const Cand& c : cands) {
        if (std::strcmp(c.dtype, dt) != 0) continue;
        if (one && (c.block != std::atoi(argv[4]) || c.vpt != std::atoi(argv[5]) ||
                    c.mode != std::atoi(argv[6])))
          continue;
        if (quick && !((c.block == 256 && (c.vpt == 8 || c.vpt == 32)) || (c.block == 512 && c.vpt == 8)))
          continue;
        if (quick && !(c.mode == 0 || c.mode == 3 || c.mode >= k2D)) continue;
        CK(cudaMemset(y, 0xff, total * elem));  // poison: NaN in both dtypes
        int ranks = 0;
        if (!launch(c, nvec, M, (const uint4*)x, (const uint4*)w, (uint4*)y, inv_n, &ranks)) continue;
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemset(err, 0, 4));
        if (b16)
          max_err<__nv_bfloat16><<<1024, 256>>>((const __nv_bfloat16*)y, (const __nv_bfloat16*)yref, total, err);
        else
          max_err<float><<<1024, 256>>>((const float*)y, (const float*)yref, total, err);
        unsigned eb;
        CK(cudaMemcpy(&eb, err, 4, cudaMemcpyDeviceToHost));
        float e;
        std::memcpy(&e, &eb, 4);
        std::vector<float> ts;
        // samples of 5 back-to-back launches: no host time between a sample's kernels
        const int reps = one ? 1 : 7, per = one ? 2 : 5;
        for (int i = 0; i < reps + 1; ++i) {
          CK(cudaEventRecord(e0));
          for (int r = 0; r < per; ++r)
            launch(c, nvec, M, (const uint4*)x, (const uint4*)w, (uint4*)y, inv_n, nullptr);
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (i >= 1) ts.push_back(ms * 1000.f / per);
        }
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, c.fn));
        const float us = median(ts);
        const double gbps = 2.0 * total * elem / (us * 1e-6) / 1e9;
        std::printf("%s N=%d M=%ld %dx%d ranks=%d %-22s %8.1f us %7.1f GB/s %5.1f%% copy  err %.2e  regs %d  clusters %d\n",
                    dt, N, static_cast<long>(M), c.block, c.vpt, ranks, mode_name(c.mode).c_str(),
                    us, gbps, 100.0 * gbps / copy_gbps, e, fa.numRegs, active_clusters(c, ranks));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
