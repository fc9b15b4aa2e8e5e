// fused_add_rms_norm's kernels for fp16 x: the configs of its table (tuning/*.inc) that its
// ladders name for this dtype, for each weight and residual dtype: one unit of the forward's build.
#include "forward_kernels.cuh"

CUDA_IMPL_FUSED_ADD_UNIT_16(__half)
