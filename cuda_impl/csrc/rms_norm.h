// Declarations shared by the op schemas (rms_norm.cpp) and the CUDA code (forward.cu and
// its units, rms_norm_backward.cu).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "spec_rules.h"

namespace cuda_impl {

// Numbers in messages are formatted with snprintf, never through an ostream: a build whose
// libstdc++ is linked statically (seen with torch 2.11's extension flags) crashes in the
// ostream's locale facets when formatting a number inside the host process.
inline std::string num(int64_t v) { return std::to_string(v); }
inline std::string num(int v) { return std::to_string(v); }

// A double as Python's repr prints it (0.0, 1e-06, nan), for messages that quote eps.
std::string py_float(double v);

// Largest row width accepted: rmsnorm_api.MAX_N, written into spec_rules.h.
constexpr int64_t kMaxN = spec::kMaxN;

// The names errors start with, as on the Python side.
constexpr const char* kImpl = "cuda_impl.rms_norm";
constexpr const char* kFusedImpl = "cuda_impl.fused_add_rms_norm";
constexpr const char* kFusedImplInPlace = "cuda_impl.fused_add_rms_norm_";
constexpr const char* kBwdImpl = "cuda_impl.rms_norm_backward";
constexpr const char* kFusedBwdImpl = "cuda_impl.fused_add_rms_norm_backward";
constexpr const char* kQuantImpl = "cuda_impl.rms_norm_quant";
constexpr const char* kFusedQuantImpl = "cuda_impl.fused_add_rms_norm_quant";
constexpr const char* kFusedQuantImplInPlace = "cuda_impl.fused_add_rms_norm_quant_";

// The argument checks of rmsnorm_api (check_inputs, check_out, check_fused_inputs,
// check_in_place), repeated for direct torch.ops callers: TypeError / ValueError in Python,
// with the same wording.
void check_inputs(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                  double weight_offset = 0.0, const char* impl = kImpl);
void check_eps(double eps, const char* impl = kImpl);
// eps in its range (spec_rules.h: float32's normal range, where an fp32 mean plus eps is
// neither 0, subnormal nor inf; NaN and inf outside it)
constexpr bool eps_ok(double eps) { return eps >= spec::kEpsMin && eps <= spec::kEpsMax; }
// the weight offset in its range (float32's finite numbers; NaN and inf outside it)
constexpr bool offset_ok(double offset) {
  return offset >= -spec::kEpsMax && offset <= spec::kEpsMax;
}
// The weight as both directions' kernels read it: contiguous, or, with a weight offset, a
// new fp32 tensor of weight + offset, the add in fp32 as the contract defines it (the
// kernels then run their fp32-weight form: a register more in the tight ones, for an add
// in the kernel, spilled; docs/notebook/17-the-op-as-data.md). Undefined without a weight.
at::Tensor weight_as_read(const std::optional<at::Tensor>& weight, double weight_offset);
void check_out(const at::Tensor& out, const at::Tensor& x,
               const std::optional<at::Tensor>& weight);
// Whether x is head rows: rows that share no one stride, whose dimensions before the heads
// (x's second to last) merge (QK-norm's q = qkv[:, :H*D].view(T, H, D)); as
// rmsnorm_api.head_rows, which the heads kernels read and out=x writes where they lie.
bool head_rows(const at::Tensor& x);
// Whether x (at least 2-D) views as (T, H, N) in place: its dimensions before the heads merge
// (head rows, or rows of one stride).
bool views_as_heads(const at::Tensor& x);
void check_fused_inputs(const at::Tensor& x, const at::Tensor& residual,
                        const std::optional<at::Tensor>& weight, double eps, double weight_offset,
                        const char* impl);
void check_in_place(const at::Tensor& x, const at::Tensor& residual,
                    const std::optional<at::Tensor>& weight, const char* impl);
// The quantised ops' arguments (rmsnorm_api's check_call of rms_norm_quant, or with a
// residual the fused add's), but the scales' values, which the Python functions read; and
// the in-place form's (residual written, x read).
void check_quant_inputs(const at::Tensor& x, const at::Tensor* residual,
                        const std::optional<at::Tensor>& weight, double eps,
                        const std::optional<at::Tensor>& scale, int64_t group_size,
                        const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype,
                        double weight_offset, const char* impl);
void check_quant_in_place(const at::Tensor& x, const at::Tensor& residual,
                          const std::optional<at::Tensor>& weight, const char* impl);
// rmsnorm_api.check_backward_inputs: saved is x, or (fused) the fused add's residual_out.
void check_backward_inputs(const at::Tensor& dy, const at::Tensor& saved,
                           const std::optional<at::Tensor>& weight, double eps,
                           double weight_offset,
                           const std::optional<at::Tensor>& d_residual_out, bool fused);

at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                    double weight_offset);
void rms_norm_out(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                  double eps, double weight_offset);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const std::optional<at::Tensor>& weight,
                                                      double eps, double weight_offset);
void fused_add_rms_norm_(at::Tensor& x, at::Tensor& residual,
                         const std::optional<at::Tensor>& weight, double eps,
                         double weight_offset);

// SMs of a device, asked once per device (forward.cu).
int sm_count(int device);
// A device's compute capability as major x 10 + minor (89: sm_89), asked once per device.
int sm_version(int device);
// Whether a device has thread-block clusters (sm_90 or newer), asked once per device; what
// both ops plan by: without them no cluster config is picked (forward.cu).
bool has_clusters(int device);
// Tests only: plan as if no GPU had clusters (true), or as each device says (false), so
// the paths a pre-sm_90 GPU takes run and are checked on an sm_90 one.
void pretend_no_clusters(bool on);

// The backward ops (rms_norm_backward.cu): (dx, dweight), and the fused add's (dx,
// dresidual, dweight); dweight is empty without a weight, dresidual without `dresidual`.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                     const std::optional<at::Tensor>& weight,
                                                     double eps, double weight_offset);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_backward(
    const at::Tensor& dy, const std::optional<at::Tensor>& d_residual_out,
    const at::Tensor& residual_out, const std::optional<at::Tensor>& weight, double eps,
    bool dresidual, double weight_offset);

// Sweeps: the compiled launch configs, flat (row_threads, vpt, cluster, in_default_ladder,
// variant).
std::vector<int64_t> rms_norm_configs();
std::vector<int64_t> fused_add_configs();
// The (row_threads, vpt, cluster, variant) rms_norm picks for rows of n elements of
// element_size bytes.
std::vector<int64_t> rms_norm_default_config(int64_t n, int64_t element_size);
// ... and fused_add_rms_norm's.
std::vector<int64_t> fused_add_default_config(int64_t n, int64_t element_size);
// The forward's variant bits by name, bit i at index i ("" where unused).
std::vector<std::string> forward_variants();

}  // namespace cuda_impl
