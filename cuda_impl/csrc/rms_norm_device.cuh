// Device helpers shared by the forward (forward_kernels.cuh), the backward
// (rms_norm_backward.cu) and the wide-row probe (scripts/wide_probe.cu): 16-byte vectors of
// elements, element conversions to and from fp32, thread-block cluster barriers and the
// cluster's sum through distributed shared memory; cached device attributes, a cluster
// launch's config.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cooperative_groups.h>
#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace cuda_impl {

// A device attribute, asked once per device (a benign race: every writer writes the same).
template <cudaDeviceAttr kAttr>
int device_attribute(int device) {
  static int cache[64] = {};
  if (device < 0 || device >= 64) return 0;
  if (cache[device] == 0) {
    int n = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, kAttr, device));
    cache[device] = n;
  }
  return cache[device];
}

// A cluster launch's config: `grid` CTAs of `threads` threads, `smem` bytes of dynamic shared
// memory, clusters of `cluster` CTAs; `attr` holds its one attribute (it must outlive the
// launch).
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, int threads, size_t smem,
                                                cudaStream_t stream, dim3 cluster,
                                                cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = cluster.x;
  attr->val.clusterDim.y = cluster.y;
  attr->val.clusterDim.z = cluster.z;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// VEC elements of T make one 16-byte vector.
template <typename T>
constexpr int kVec = 16 / sizeof(T);

template <typename T>
union Pack {
  uint4 raw;
  T e[kVec<T>];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// fp32 to T, rounded to nearest even.
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Cluster barrier halves (sm_90): arrive without ordering, arrive releasing this thread's
// writes (shared::cluster included), and wait (acquire).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// This CTA's rank within its cluster, and the cluster's size (left as they are before sm_90).
__device__ __forceinline__ void cluster_position(int& rank, int& ranks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  rank = static_cast<int>(cluster.block_rank());
  ranks = static_cast<int>(cluster.num_blocks());
#endif
}

// a shared-memory address as the 32-bit form PTX's shared-state instructions take
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The steps of a sum over a cluster's CTAs as a transaction barrier (sm_90; before it, never
// called: the host launches no cluster kernel there). An mbarrier of one arrival, made
// visible to the cluster's CTAs by the fence before the cluster arrive that announces it.
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// the one arrival of bar's phase, which then completes when `bytes` more have landed on it
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
#endif
}
// until bar's phase of this parity completes; CLUSTER: acquiring at cluster scope, which
// orders this CTA's later writes into a peer (a slot set used again) after what the peers
// did before their bytes landed here (their reads of that set)
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    if constexpr (CLUSTER) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; "
          "selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(smem_u32(bar)), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, "
          "0, p; }"
          : "=r"(done)
          : "r"(smem_u32(bar)), "r"(parity)
          : "memory");
    }
  } while (!done);
#endif
}
// v into `slot` of CTA `peer`'s shared memory, its bytes counted on that CTA's `bar`
template <typename V>
__device__ __forceinline__ void st_async(const V* slot, V v, uint64_t* bar, int peer) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t at, peer_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(at)
               : "r"(smem_u32(slot)), "r"(peer));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(peer_bar)
               : "r"(smem_u32(bar)), "r"(peer));
  if constexpr (std::is_same_v<V, float2>) {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
            at),
        "f"(v.x), "f"(v.y), "r"(peer_bar)
        : "memory");
  } else {
    static_assert(std::is_same_v<V, float>, "a float or a float2");
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(
                     at),
                 "f"(v), "r"(peer_bar)
                 : "memory");
  }
#endif
}

// The sum over the CTAs of a cluster as one transaction barrier (as QuACK's rmsnorm does
// it), not a CTA barrier and then a cluster barrier: each warp's partial goes straight to
// slot (rank, warp) of every CTA of the cluster (st.async, which counts its bytes on the
// receiving CTA's mbarrier); a CTA waits on its own mbarrier alone, for all of them, and
// every warp sums the same slots in the same order. No cluster-wide arrival a row, which
// the sweep measured faster at every cluster config (docs/notebook/06-wide-rows.md, v23). A
// CTA cannot leave while a peer still writes into it: its own wait completes only when
// every peer's bytes have landed.
//
// The sum of every thread's `part` over the cluster's CTAs (BLOCK threads each, one row a
// cluster), through `parts` (BLOCK / 32 floats a CTA of the cluster) and the mbarrier `bar`,
// which thread 0 initialised (count 1) before the CTA's cluster arrive. Every
// thread of every CTA must call it, once.
template <int BLOCK>
__device__ __forceinline__ float cluster_sum(float part, float* parts, uint64_t* bar, int rank,
                                             int ranks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kWarps = BLOCK / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) mbar_expect(bar, static_cast<uint32_t>(kWarps * ranks * sizeof(float)));
  cluster_wait();  // every peer runs, its mbarrier initialised
  if (lane < ranks) st_async(&parts[rank * kWarps + warp], part, bar, lane);
  mbar_wait(bar, 0);
  // the same slots in the same order in every warp of every CTA: one result
  float s = 0.f;
  for (int i = lane; i < kWarps * ranks; i += 32) s += parts[i];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
#else
  return part;
#endif
}

}  // namespace cuda_impl
