// Device helpers shared by the forward (rms_norm_kernel.cu) and the backward
// (rms_norm_backward.cu): 16-byte vectors of elements, element conversions to and from fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace cuda_impl {

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

}  // namespace cuda_impl
