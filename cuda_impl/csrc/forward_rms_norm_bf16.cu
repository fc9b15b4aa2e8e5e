// rms_norm's kernels for bf16 x: every config of its table (tuning/rms_norm.inc) for each
// weight dtype: one unit of the forward's build (forward_kernels.cuh).
#include "forward_kernels.cuh"

CUDA_IMPL_RMS_NORM_UNIT_16(__nv_bfloat16)
