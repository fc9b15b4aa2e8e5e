// Python entry points straight to the CUDA kernels' C++ functions, for eager calls that
// cuda_impl/ops.py has already found need nothing of the dispatcher (rmsnorm_api.bypass_ok:
// plain CUDA tensors, no gradient, no tracing, transform or mode). A redispatch to the
// op's CUDA key boxes its arguments and walks the dispatcher's tables, which on a
// decode-sized call costs more host time than the rest of the call; a pybind11 call with
// the same C++ checks does not. The ops' registration (rms_norm.cpp) stays the one public
// face: tracing, autograd and every other key go through it.
//
// Built by setup.py only (a Python extension module: cuda_impl._C); the CMake library has
// no Python and no such module, and cuda_impl/ops.py then redispatches as before.
#include <torch/extension.h>

#include "rms_norm.h"

namespace {

// The in-place fused add, bumping the versions of the tensors it writes as the op's
// ADInplaceOrView kernel does, so that autograd still notices a saved tensor overwritten.
// Bumped first: an inference tensor outside inference mode refuses the bump, and must
// refuse before its data is written.
void fused_add_rms_norm_in_place(at::Tensor& x, at::Tensor& residual,
                                 const std::optional<at::Tensor>& weight, double eps) {
  torch::autograd::impl::bump_version(x);
  torch::autograd::impl::bump_version(residual);
  cuda_impl::fused_add_rms_norm_(x, residual, weight, eps);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Direct entry points of the CUDA C++ RMSNorm for eager calls (cuda_impl/ops.py)";
  m.def("rms_norm", &cuda_impl::rms_norm, "rms_norm(x, weight, eps) -> y");
  m.def("fused_add_rms_norm", &cuda_impl::fused_add_rms_norm,
        "fused_add_rms_norm(x, residual, weight, eps) -> (y, residual_out)");
  m.def("fused_add_rms_norm_", &fused_add_rms_norm_in_place,
        "fused_add_rms_norm_(x, residual, weight, eps): in place");
  m.def("_pretend_no_clusters", &cuda_impl::pretend_no_clusters,
        "tests only: plan as on a GPU without thread-block clusters (pre-sm_90)");
}
