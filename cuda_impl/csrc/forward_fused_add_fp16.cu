// fused_add_rms_norm's kernels for fp16 x: the configs of its table (tuning/*.inc) that
// its ladders name for this dtype, for each weight and residual dtype: one unit of the
// forward's build (forward_kernels.cuh).
#include "forward_kernels.cuh"

namespace cuda_impl {
template KernelFn<__half, __half, __half> kernel_at<__half, __half, __half>(int);
template KernelFn<__half, __half, float> kernel_at<__half, __half, float>(int);
template KernelFn<__half, float, __half> kernel_at<__half, float, __half>(int);
template KernelFn<__half, float, float> kernel_at<__half, float, float>(int);
}  // namespace cuda_impl
