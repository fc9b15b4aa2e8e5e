// rms_norm's kernels for bf16 x: every config of its table (tuning/rms_norm.inc) for each
// weight dtype, one unit of the forward's build (forward_kernels.cuh).
#include "forward_kernels.cuh"

namespace cuda_impl {
template KernelFn<__nv_bfloat16, __nv_bfloat16, void> kernel_at<__nv_bfloat16, __nv_bfloat16, void>(int);
template KernelFn<__nv_bfloat16, float, void> kernel_at<__nv_bfloat16, float, void>(int);
}  // namespace cuda_impl
