// Op schema and argument checks for cuda_impl::rms_norm / cuda_impl::rms_norm_out.
//
// The schema lives here; the CUDA implementation is registered in rms_norm_kernel.cu.
// A CPU implementation is registered too, so a CPU tensor reaches check_inputs and gets a
// clear "expected a CUDA tensor" error instead of the dispatcher's "could not run" message.

#include <cmath>
#include <string>

#include <torch/library.h>

#include "rms_norm.h"

namespace cuda_impl {
namespace {

// A shape as Python prints a tuple: (4,) or (4, 64).
std::string shape_str(at::IntArrayRef s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + num(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

bool supported(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

}  // namespace

void check_inputs(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  TORCH_CHECK_TYPE(supported(x.scalar_type()), "cuda_impl.rms_norm: x has dtype ",
                   x.scalar_type(), "; expected one of float32, float16, bfloat16");
  TORCH_CHECK_VALUE(x.dim() > 0,
                    "cuda_impl.rms_norm: x is 0-dimensional; expected at least 1 dimension");
  const int64_t n = x.size(-1);
  TORCH_CHECK_VALUE(n >= 1, "cuda_impl.rms_norm: x's last dimension is ", num(n),
                    "; expected N >= 1");
  TORCH_CHECK_VALUE(n <= kMaxN, "cuda_impl.rms_norm: x's last dimension is ", num(n),
                    "; the supported maximum is N = ", num(kMaxN));
  TORCH_CHECK_VALUE(x.numel() == 0 || x.stride(-1) == 1, "cuda_impl.rms_norm: x has stride ",
                    num(x.stride(-1)), " in its last dimension; expected 1");
  if (weight.has_value()) {
    const at::Tensor& w = *weight;
    TORCH_CHECK_VALUE(w.dim() == 1 && w.size(0) == n, "cuda_impl.rms_norm: weight has shape ",
                      shape_str(w.sizes()), " but x's last dimension is ", num(n),
                      "; expected (", num(n), ",)");
    TORCH_CHECK_TYPE(w.scalar_type() == x.scalar_type() || w.scalar_type() == at::kFloat,
                     "cuda_impl.rms_norm: weight has dtype ", w.scalar_type(),
                     "; expected x's dtype (", x.scalar_type(), ") or float32");
    TORCH_CHECK_VALUE(w.device() == x.device(), "cuda_impl.rms_norm: weight is on device '",
                      w.device(), "' but x is on '", x.device(), "'");
  }
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0, "cuda_impl.rms_norm: eps is ", num(eps),
                    "; expected a finite number > 0");
  // last, as on the Python side
  TORCH_CHECK_VALUE(x.is_cuda(), "cuda_impl.rms_norm: x is on device '", x.device(),
                    "'; expected a CUDA tensor");
}

void check_out(const at::Tensor& out, const at::Tensor& x) {
  TORCH_CHECK_VALUE(out.sizes() == x.sizes(), "cuda_impl.rms_norm: out has shape ",
                    shape_str(out.sizes()), " but x has shape ", shape_str(x.sizes()));
  TORCH_CHECK_TYPE(out.scalar_type() == x.scalar_type(), "cuda_impl.rms_norm: out has dtype ",
                   out.scalar_type(), " but x has dtype ", x.scalar_type());
  TORCH_CHECK_VALUE(out.device() == x.device(), "cuda_impl.rms_norm: out is on device '",
                    out.device(), "' but x is on '", x.device(), "'");
  TORCH_CHECK_VALUE(out.is_contiguous(), "cuda_impl.rms_norm: out must be contiguous");
}

namespace {

// Reached only for CPU tensors: the checks raise before anything else happens.
at::Tensor rms_norm_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                        double eps) {
  check_inputs(x, weight, eps);
  TORCH_CHECK(false, "cuda_impl.rms_norm: unreachable for CPU tensors");
}

void rms_norm_out_cpu(at::Tensor& out, const at::Tensor& x,
                      const std::optional<at::Tensor>& weight, double eps) {
  check_inputs(x, weight, eps);
  TORCH_CHECK(false, "cuda_impl.rms_norm: unreachable for CPU tensors");
}

at::Tensor rms_norm_with_config_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                    double eps, int64_t, int64_t, int64_t, int64_t) {
  check_inputs(x, weight, eps);
  TORCH_CHECK(false, "cuda_impl.rms_norm: unreachable for CPU tensors");
}

std::vector<int64_t> rms_norm_kernel_info_cpu(const at::Tensor& x,
                                              const std::optional<at::Tensor>& weight) {
  check_inputs(x, weight, 1e-6);
  TORCH_CHECK(false, "cuda_impl.rms_norm: unreachable for CPU tensors");
}

}  // namespace

TORCH_LIBRARY(cuda_impl, m) {
  m.def("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor");
  m.def("rms_norm_out(Tensor(a!) out, Tensor x, Tensor? weight, float eps) -> ()");
  // For sweeps: force one of the compiled launch configs; and list them.
  m.def("rms_norm_with_config(Tensor x, Tensor? weight, float eps, int row_threads, int vpt, "
        "int cluster, int variant=0) -> Tensor");
  m.def("rms_norm_configs() -> int[]", &rms_norm_configs);
  m.def("rms_norm_default_config(int n, int element_size) -> int[]", &rms_norm_default_config);
  // The kernel rms_norm would launch for x: config, registers, local (spill) bytes, ...
  m.def("rms_norm_kernel_info(Tensor x, Tensor? weight) -> int[]");
}

TORCH_LIBRARY_IMPL(cuda_impl, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("rms_norm_out", &rms_norm_out_cpu);
  m.impl("rms_norm_with_config", &rms_norm_with_config_cpu);
  m.impl("rms_norm_kernel_info", &rms_norm_kernel_info_cpu);
}

}  // namespace cuda_impl
