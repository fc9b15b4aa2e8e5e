// fused_add_rms_norm's kernels for bf16 x: the configs of its table (tuning/*.inc) that
// its ladders name for this dtype, for each weight and residual dtype: one unit of the
// forward's build (forward_kernels.cuh).
#include "forward_kernels.cuh"

namespace cuda_impl {
template KernelFn<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16> kernel_at<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>(int);
template KernelFn<__nv_bfloat16, __nv_bfloat16, float> kernel_at<__nv_bfloat16, __nv_bfloat16, float>(int);
template KernelFn<__nv_bfloat16, float, __nv_bfloat16> kernel_at<__nv_bfloat16, float, __nv_bfloat16>(int);
template KernelFn<__nv_bfloat16, float, float> kernel_at<__nv_bfloat16, float, float>(int);
}  // namespace cuda_impl
