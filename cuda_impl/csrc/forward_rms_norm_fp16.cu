// rms_norm's kernels for fp16 x: every config of its table (tuning/rms_norm.inc) for each
// weight dtype, one unit of the forward's build (forward_kernels.cuh).
#include "forward_kernels.cuh"

namespace cuda_impl {
template KernelFn<__half, __half, void> kernel_at<__half, __half, void>(int);
template KernelFn<__half, float, void> kernel_at<__half, float, void>(int);
}  // namespace cuda_impl
