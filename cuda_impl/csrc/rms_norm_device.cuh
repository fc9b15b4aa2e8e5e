// Device helpers shared by the forward (rms_norm_kernel.cu) and the backward
// (rms_norm_backward.cu): 16-byte vectors of elements, element conversions to and from fp32,
// thread-block cluster barriers; cached device attributes.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cooperative_groups.h>
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

}  // namespace cuda_impl
