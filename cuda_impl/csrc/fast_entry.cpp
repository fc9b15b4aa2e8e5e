// Python entry points for eager calls that need nothing of the dispatcher: both backends'
// fast paths. A decode-sized call costs less on the GPU than the host spends reaching the
// kernel through the dispatcher's keys (a redispatch boxes its arguments and walks the
// dispatcher's tables) or through Python (the checks, Triton's launcher); here the whole
// eager hit is one pybind11 call:
// - the bypass test of rmsnorm_api.bypass_ok, in C++ (its Python form cost about as much
//   host time as the rest of a CUDA call): plain CUDA tensors, no gradient, no tracing,
//   forward-mode tangent, transform or mode; anything else returns None, and the caller
//   goes on through its Python paths, which handle it;
// - CUDA's ops, called with the same C++ checks as their registration;
// - Triton's cached plans (triton_impl/eager.py): the compiled kernel of a plan, its grid
//   and its arguments, launched with the driver's cuLaunchKernel as Triton's own launcher
//   would launch it, keyed by everything the launch depends on besides the data. Python
//   plans, checks and compiles on a miss and hands the launch here; a hit never enters
//   Python.
// The ops' registration (rms_norm.cpp) stays the one public face: tracing, autograd and
// every other key go through it.
//
// Built by setup.py only (a Python extension module: cuda_impl._C); the CMake library has
// no Python and no such module, and both backends then take their Python paths.
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

#include "rms_norm.h"

namespace {

// ---- the bypass test ----------------------------------------------------------------------

// A plain CUDA tensor as bypass_ok takes it (exact: torch.Tensor for x, torch.Tensor or
// nn.Parameter for the others; dense, strided, not nested, no negative or zero-tensor bit,
// no forward-mode tangent), or nullptr. grad: set when it requires grad.
const at::Tensor* plain(PyObject* obj, bool is_x, bool& grad) {
  PyTypeObject* type = Py_TYPE(obj);
  if (!(type == reinterpret_cast<PyTypeObject*>(THPVariableClass) ||
        (!is_x && type == reinterpret_cast<PyTypeObject*>(ParameterClass)))) {
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || !t.is_cuda() || t.layout() != at::kStrided || t.is_nested() ||
      t.is_neg() || t._is_zerotensor() || t._fw_grad(/*level=*/0).defined()) {
    return nullptr;
  }
  grad = grad || t.requires_grad();
  return &t;
}

// Nothing above the backend's kernel would act on the call: no gradient to record, no
// tracing, no dispatch or torch function mode, no functorch transform.
bool plain_context(bool grad) {
  if (grad && at::GradMode::is_enabled()) return false;
  if (torch::jit::tracer::isTracing()) return false;
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  if (at::impl::torch_function_mode_enabled()) return false;
  const auto included = c10::impl::tls_local_dispatch_key_set().included_;
  return !(included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
           included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode));
}

// A call's tensors, bypass-tested: x, residual (absent for rms_norm), weight (absent or
// None). ok false: the caller's Python paths take the call.
struct Call {
  const at::Tensor* x = nullptr;
  const at::Tensor* residual = nullptr;
  const at::Tensor* weight = nullptr;
  double eps = 0;
  double weight_offset = 0;
  bool ok = false;
};

Call bypass(PyObject* x, PyObject* residual, PyObject* weight, PyObject* eps,
            PyObject* weight_offset = nullptr) {
  Call c;
  // eps (and the weight offset) a Python float: anything else (an int, a tensor, a numpy
  // scalar) is converted or refused by the Python paths
  if (!PyFloat_CheckExact(eps)) return c;
  c.eps = PyFloat_AS_DOUBLE(eps);
  if (weight_offset != nullptr) {
    if (!PyFloat_CheckExact(weight_offset)) return c;
    c.weight_offset = PyFloat_AS_DOUBLE(weight_offset);
  }
  bool grad = false;
  if (!(c.x = plain(x, true, grad))) return c;
  if (residual != nullptr && !(c.residual = plain(residual, false, grad))) return c;
  if (weight != Py_None && !(c.weight = plain(weight, false, grad))) return c;
  c.ok = plain_context(grad);
  return c;
}

std::optional<at::Tensor> optional(const at::Tensor* t) {
  return t == nullptr ? std::nullopt : std::optional<at::Tensor>(*t);
}

py::object wrap(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

// ---- CUDA's ops ---------------------------------------------------------------------------

py::object cuda_rms_norm(py::handle x, py::handle weight, py::handle eps, py::handle offset) {
  const Call c = bypass(x.ptr(), nullptr, weight.ptr(), eps.ptr(), offset.ptr());
  if (!c.ok) return py::none();
  return wrap(cuda_impl::rms_norm(*c.x, optional(c.weight), c.eps, c.weight_offset));
}

py::object cuda_fused_add(py::handle x, py::handle residual, py::handle weight, py::handle eps,
                          py::handle offset) {
  const Call c = bypass(x.ptr(), residual.ptr(), weight.ptr(), eps.ptr(), offset.ptr());
  if (!c.ok) return py::none();
  auto [y, r] = cuda_impl::fused_add_rms_norm(*c.x, *c.residual, optional(c.weight), c.eps,
                                              c.weight_offset);
  return py::make_tuple(wrap(std::move(y)), wrap(std::move(r)));
}

// The in-place fused add, bumping the versions of the tensors it writes as the op's
// ADInplaceOrView kernel does, so that autograd still notices a saved tensor overwritten.
// Bumped first: an inference tensor outside inference mode refuses the bump, and must
// refuse before its data is written. True: done; false: the Python paths take the call.
bool cuda_fused_add_in_place(py::handle x, py::handle residual, py::handle weight,
                             py::handle eps, py::handle offset) {
  const Call c = bypass(x.ptr(), residual.ptr(), weight.ptr(), eps.ptr(), offset.ptr());
  if (!c.ok) return false;
  at::Tensor xt = *c.x, rt = *c.residual;
  torch::autograd::impl::bump_version(xt);
  torch::autograd::impl::bump_version(rt);
  cuda_impl::fused_add_rms_norm_(xt, rt, optional(c.weight), c.eps, c.weight_offset);
  return true;
}

// ---- Triton's cached plans ----------------------------------------------------------------

using LaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, unsigned, CUstream, void**, void**);
using CtxGetCurrent = CUresult (*)(CUcontext*);

// A driver function, through the runtime (no link to libcuda of our own); nullptr where the
// driver has none.
void* driver_function(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t err = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();  // the failed query is not the next CUDA call's error
    return nullptr;
  }
  return p;
}

// Set by driver(), which triton_keep asks before keeping a plan: a hit finds them set.
LaunchKernel launch_kernel = nullptr;
CtxGetCurrent ctx_get_current = nullptr;

// Both driver functions, looked up once; false where either is missing (no Triton plan is
// then kept, and Python launches every call).
bool driver() {
  static const bool ok = [] {
    launch_kernel = reinterpret_cast<LaunchKernel>(driver_function("cuLaunchKernel"));
    ctx_get_current = reinterpret_cast<CtxGetCurrent>(driver_function("cuCtxGetCurrent"));
    return launch_kernel != nullptr && ctx_get_current != nullptr;
  }();
  return ok;
}

// A kernel argument of a plan, in the compiled kernel's parameter order (Triton's launcher
// passes the signature's non-constexpr arguments, then its two scratch pointers).
enum Arg : int64_t { kPointer = 0, kInt32 = 1, kInt64 = 2, kEps = 3 };

struct Plan {
  CUfunction function = nullptr;
  unsigned grid = 0, block = 0, shared = 0;
  int device = -1;
  std::vector<std::pair<int64_t, int64_t>> args;  // (Arg, the tensor's slot or the value)
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// Keyed as triton_impl.eager keys its plans (shape, strides, storage offset mod 8 elements,
// dtype, device of each tensor), with each pointer's 16-byte alignment, which Triton
// specialises on; the outputs are new allocations, always aligned.
std::unordered_map<std::vector<int64_t>, Plan, KeyHash> plans;
constexpr size_t kMaxPlans = 4096;  // as triton_impl.eager._MAX_PLANS

void key_of(std::vector<int64_t>& k, const at::Tensor* t) {
  if (t == nullptr) {
    k.push_back(-1);
    return;
  }
  k.push_back(t->dim());
  for (int64_t s : t->sizes()) k.push_back(s);
  for (int64_t s : t->strides()) k.push_back(s);
  k.push_back(t->storage_offset() % 8);
  k.push_back(static_cast<int64_t>(t->scalar_type()));
  k.push_back(t->get_device());
  k.push_back(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0);
}

std::vector<int64_t> plan_key(const Call& c) {
  std::vector<int64_t> k;
  k.reserve(32);
  key_of(k, c.x);
  key_of(k, c.residual);
  key_of(k, c.weight);
  return k;
}

// Whether Triton's launch hooks (triton.knobs.runtime's) are unset: None, or a chain with
// no calls. With one set, Python launches through Triton's launcher, which calls it.
bool hooks_quiet() {
  static PyObject* runtime = [] {
    py::object knobs = py::module_::import("triton").attr("knobs");
    return py::object(knobs.attr("runtime")).release().ptr();
  }();
  static PyObject* names[2] = {PyUnicode_InternFromString("launch_enter_hook"),
                               PyUnicode_InternFromString("launch_exit_hook")};
  static PyObject* calls = PyUnicode_InternFromString("calls");
  for (PyObject* name : names) {
    py::object hook = py::reinterpret_steal<py::object>(PyObject_GetAttr(runtime, name));
    if (!hook) throw py::error_already_set();
    if (hook.is_none()) continue;
    py::object chain = py::reinterpret_steal<py::object>(PyObject_GetAttr(hook.ptr(), calls));
    if (!chain) {
      PyErr_Clear();
      return false;  // a plain callable
    }
    const Py_ssize_t n = PyObject_Length(chain.ptr());
    if (n != 0) {
      if (n < 0) PyErr_Clear();
      return false;
    }
  }
  return true;
}

// Launch a plan on tensors (rms_norm: x, weight or x, y; the fused add: x, residual,
// weight or x, y, residual_out).
void launch(const Plan& p, const at::Tensor* const* tensors, double eps) {
  union Slot {
    void* pointer;
    int32_t i32;
    int64_t i64;
    float f32;
  };
  constexpr size_t kMaxArgs = 30;
  Slot slots[kMaxArgs + 2];
  void* params[kMaxArgs + 2];
  size_t n = 0;
  for (const auto& [kind, value] : p.args) {
    Slot& s = slots[n];
    switch (kind) {
      case kPointer: s.pointer = tensors[value]->data_ptr(); break;
      case kInt32: s.i32 = static_cast<int32_t>(value); break;
      case kInt64: s.i64 = value; break;
      default: s.f32 = static_cast<float>(eps); break;
    }
    params[n] = &slots[n];
    ++n;
  }
  for (int i = 0; i < 2; ++i, ++n) {  // the global and profile scratch: none
    slots[n].pointer = nullptr;
    params[n] = &slots[n];
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(p.device).stream();
  const CUresult err = launch_kernel(p.function, p.grid, 1, 1, p.block, 1, 1, p.shared,
                                       reinterpret_cast<CUstream>(stream), params, nullptr);
  TORCH_CHECK(err == CUDA_SUCCESS, "triton_impl: cuLaunchKernel failed with CUresult ",
              static_cast<int>(err));
}

// The plan of an eager call, or nullptr (a miss, another device current, a hook set): the
// caller's Python paths take it.
const Plan* find_plan(const Call& c) {
  if (!c.ok) return nullptr;
  // eps outside its range: refused by the Python path's checks
  if (!cuda_impl::eps_ok(c.eps)) return nullptr;
  auto it = plans.find(plan_key(c));
  if (it == plans.end()) return nullptr;
  // the function was loaded in the context of the device current when Triton compiled it
  // (triton_keep keeps only plans of that device); a thread with no current context (whose
  // first CUDA work this would be) goes through Triton's launcher, which makes one current
  if (it->second.device != c10::cuda::current_device() || !hooks_quiet()) return nullptr;
  CUcontext ctx = nullptr;
  if (ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) return nullptr;
  return &it->second;
}

at::Tensor empty_like_rows(const at::Tensor& shape_of, at::ScalarType dtype) {
  return at::detail::empty_cuda(shape_of.sizes(), dtype, shape_of.device(), std::nullopt);
}

py::object triton_rms_norm(py::handle x, py::handle weight, py::handle eps) {
  const Call c = bypass(x.ptr(), nullptr, weight.ptr(), eps.ptr());
  const Plan* p = find_plan(c);
  if (p == nullptr) return py::none();
  at::Tensor y = empty_like_rows(*c.x, c.x->scalar_type());
  const at::Tensor* tensors[] = {c.x, c.weight ? c.weight : c.x, &y};
  launch(*p, tensors, c.eps);
  return wrap(std::move(y));
}

py::object triton_fused_add(py::handle x, py::handle residual, py::handle weight,
                            py::handle eps) {
  const Call c = bypass(x.ptr(), residual.ptr(), weight.ptr(), eps.ptr());
  const Plan* p = find_plan(c);
  if (p == nullptr) return py::none();
  at::Tensor y = empty_like_rows(*c.x, c.x->scalar_type());
  at::Tensor r = empty_like_rows(*c.x, c.residual->scalar_type());
  const at::Tensor* tensors[] = {c.x, c.residual, c.weight ? c.weight : c.x, &y, &r};
  launch(*p, tensors, c.eps);
  return py::make_tuple(wrap(std::move(y)), wrap(std::move(r)));
}

// Python's record of a plan that it has just launched directly on these tensors (the
// outputs 16-byte aligned): its compiled function (a CUfunction, as an integer), grid,
// warps, shared memory and arguments ((Arg, slot or value) pairs). False: not kept (the
// tensors are not a bypass call, or the arguments do not fit).
bool triton_keep(py::handle x, py::handle residual, py::handle weight, uint64_t function,
                 int64_t grid, int64_t num_warps, int64_t shared,
                 const std::vector<std::pair<int64_t, int64_t>>& args) {
  Call c = bypass(x.ptr(), residual.is_none() ? nullptr : residual.ptr(), weight.ptr(),
                  py::float_(1e-6).ptr());
  const int64_t slots = residual.is_none() ? 3 : 5;
  // shared memory past 228 KiB needs a launch attribute Triton's launcher sets (none of
  // our kernels asks for it); a plan of another device than the current one (whose
  // context Triton loaded the function in) is launched by Python
  if (!c.ok || !driver() || c.x->get_device() != c10::cuda::current_device() ||
      function == 0 || grid <= 0 || grid > std::numeric_limits<int32_t>::max() ||
      num_warps <= 0 || num_warps > 32 || shared < 0 || shared > 228 * 1024 ||
      args.size() > 30) {
    return false;
  }
  for (const auto& [kind, value] : args) {
    if (kind < kPointer || kind > kEps || (kind == kPointer && (value < 0 || value >= slots))) {
      return false;
    }
  }
  if (plans.size() >= kMaxPlans) plans.clear();
  Plan& p = plans[plan_key(c)];
  p.function = reinterpret_cast<CUfunction>(function);
  p.grid = static_cast<unsigned>(grid);
  p.block = static_cast<unsigned>(32 * num_warps);
  p.shared = static_cast<unsigned>(shared);
  p.device = c.x->get_device();
  p.args = args;
  return true;
}

void triton_forget() { plans.clear(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Eager entry points of both backends' forward ops (cuda_impl/ops.py, "
            "triton_impl/eager.py): None where the call is not a plain eager one";
  m.def("rms_norm", &cuda_rms_norm, "rms_norm(x, weight, eps, weight_offset) -> y, or None");
  m.def("fused_add_rms_norm", &cuda_fused_add,
        "fused_add_rms_norm(x, residual, weight, eps, weight_offset) -> (y, residual_out), or "
        "None");
  m.def("fused_add_rms_norm_", &cuda_fused_add_in_place,
        "fused_add_rms_norm_(x, residual, weight, eps, weight_offset) -> whether it ran, in "
        "place");
  m.def("triton_rms_norm", &triton_rms_norm,
        "triton_rms_norm(x, weight, eps) -> y by a kept plan, or None");
  m.def("triton_fused_add_rms_norm", &triton_fused_add,
        "triton_fused_add_rms_norm(x, residual, weight, eps) -> (y, residual_out), or None");
  m.def("triton_keep", &triton_keep,
        "triton_keep(x, residual, weight, function, grid, num_warps, shared, args) -> kept");
  m.def("triton_forget", &triton_forget, "forget every kept Triton plan");
  m.def("triton_kept", [] { return plans.size(); }, "how many Triton plans are kept");
  m.def("_pretend_no_clusters", &cuda_impl::pretend_no_clusters,
        "tests only: plan as on a GPU without thread-block clusters (pre-sm_90)");
}
