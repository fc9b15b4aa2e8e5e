// fused_add_rms_norm's kernels for fp32 x: the configs of its table (tuning/*.inc) that
// its ladders name for this dtype, for each weight and residual dtype: one unit of the
// forward's build (forward_kernels.cuh).
#include "forward_kernels.cuh"

namespace cuda_impl {
template KernelFn<float, float, float> kernel_at<float, float, float>(int);
}  // namespace cuda_impl
