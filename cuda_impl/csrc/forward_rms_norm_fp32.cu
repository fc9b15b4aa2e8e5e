// rms_norm's kernels for fp32 x: every config of its table (tuning/rms_norm.inc) for each
// weight dtype: one unit of the forward's build (forward_kernels.cuh).
#include "forward_kernels.cuh"

CUDA_IMPL_FORWARD_AT(float, float, void)
CUDA_IMPL_HEADS_AT(float)
