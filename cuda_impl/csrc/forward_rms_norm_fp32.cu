// rms_norm's kernels for fp32 x: every config of its table (tuning/rms_norm.inc) for each
// weight dtype, one unit of the forward's build (forward_kernels.cuh).
#include "forward_kernels.cuh"

namespace cuda_impl {
template KernelFn<float, float, void> kernel_at<float, float, void>(int);
}  // namespace cuda_impl
