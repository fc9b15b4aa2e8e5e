// Op schemas and argument checks for cuda_impl::rms_norm / rms_norm_out and the fused add,
// cuda_impl::fused_add_rms_norm / fused_add_rms_norm_.
//
// The schemas live here; the CUDA implementations are registered in forward.cu and
// rms_norm_backward.cu.
// Every other input (CPU, sparse, nested, none at all) reaches a checking kernel, so it
// gets the Python side's error naming the argument instead of the dispatcher's message.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// A dtype as Python prints it (torch.int32, not Int).
std::string dtype_str(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kDouble: return "torch.float64";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    case at::kUInt16: return "torch.uint16";
    case at::kUInt32: return "torch.uint32";
    case at::kUInt64: return "torch.uint64";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kFloat8_e4m3fnuz: return "torch.float8_e4m3fnuz";
    case at::kFloat8_e5m2fnuz: return "torch.float8_e5m2fnuz";
    case at::kQUInt8: return "torch.quint8";
    case at::kQInt8: return "torch.qint8";
    case at::kQInt32: return "torch.qint32";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// A layout as Python prints it.
std::string layout_str(at::Layout l) {
  switch (l) {
    case at::kSparse: return "torch.sparse_coo";
    case at::kSparseCsr: return "torch.sparse_csr";
    case at::kSparseCsc: return "torch.sparse_csc";
    case at::kSparseBsr: return "torch.sparse_bsr";
    case at::kSparseBsc: return "torch.sparse_bsc";
    case at::kJagged: return "torch.jagged";
    case at::kMkldnn: return "torch._mkldnn";
    default: return "torch.strided";
  }
}

bool supported(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// A check's message (spec_rules.h) with its {field}s filled as rmsnorm_api fills them
// (impl and name, then the fields given; one not given is left empty: the Python side's
// device hint), raised as a TypeError or a ValueError as there.
using Fields = std::initializer_list<std::pair<std::string_view, std::string>>;
[[noreturn]] void refuse(const spec::Message& m, const char* impl, const char* name,
                         Fields fields = {}) {
  std::string out;
  for (const char* p = m.text; *p != '\0';) {
    if (*p != '{') {
      out += *p++;
      continue;
    }
    const char* end = std::strchr(p, '}');
    const std::string_view key(p + 1, static_cast<size_t>(end - p - 1));
    if (key == "impl") {
      out += impl;
    } else if (key == "name") {
      out += name;
    } else {
      for (const auto& [k, v] : fields) {
        if (k == key) out += v;
      }
    }
    p = end + 1;
  }
  if (m.type_error) TORCH_CHECK_TYPE(false, out);
  TORCH_CHECK_VALUE(false, out);
}

// t's elements as rows of its last dimension at one row stride, in bytes (rmsnorm_api's
// _rows): false where t has no such layout.
struct Rows {
  int64_t start, rows, stride, length;
};
bool rows_of(const at::Tensor& t, Rows& r) {
  const int64_t e = t.element_size();
  const int64_t n = t.dim() ? t.size(-1) : 1;
  if (t.dim() && n > 1 && t.stride(-1) != 1) return false;
  int64_t rows = 1, stride = 0;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (rows > 1 && t.stride(d) != stride * rows) return false;
    if (rows == 1) stride = t.stride(d);
    rows *= t.size(d);
  }
  r = {t.storage_offset() * e, rows, stride * e, n * e};
  return true;
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// Whether some row start + j * stride (0 <= j < rows) lies strictly between lo and hi.
bool row_at(int64_t lo, int64_t hi, int64_t start, int64_t stride, int64_t rows) {
  if (stride == 0 || rows == 1) return lo < start && start < hi;
  const int64_t first = std::max<int64_t>(0, floor_div(lo - start, stride) + 1);
  const int64_t last = std::min<int64_t>(rows - 1, -floor_div(start - hi, stride) - 1);
  return first <= last;
}

// Rows walked one by one where two row layouts interleave at different strides (the
// Python side's _EXACT_ROWS); past it such a pair is taken to overlap.
constexpr int64_t kExactRows = int64_t{1} << 16;

// Whether two row layouts share a byte: exact, by arithmetic on the rows.
bool rows_meet(Rows a, Rows b) {
  if (a.start + (a.rows - 1) * a.stride + a.length <= b.start ||
      b.start + (b.rows - 1) * b.stride + b.length <= a.start)
    return false;
  if (a.rows == 1 || a.stride == 0)
    return row_at(a.start - b.length, a.start + a.length, b.start, b.stride, b.rows);
  if (b.rows == 1 || b.stride == 0)
    return row_at(b.start - a.length, b.start + b.length, a.start, a.stride, a.rows);
  if (a.stride == b.stride)
    return row_at(b.start - a.start - a.length, b.start - a.start + b.length,
                  -(b.rows - 1) * a.stride, a.stride, a.rows + b.rows - 1);
  if (std::min(a.rows, b.rows) > kExactRows) return true;
  if (a.rows > b.rows) std::swap(a, b);
  for (int64_t i = 0; i < a.rows; ++i) {
    const int64_t at = a.start + i * a.stride;
    if (row_at(at - b.length, at + a.length, b.start, b.stride, b.rows)) return true;
  }
  return false;
}

// Whether a's and b's elements share bytes of one storage: exactly for row layouts, by
// their address spans otherwise (rmsnorm_api's _overlaps).
bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.is_alias_of(b)) return false;
  Rows ra, rb;
  if (rows_of(a, ra) && rows_of(b, rb)) return rows_meet(ra, rb);
  auto span = [](const at::Tensor& t) {
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    const int64_t start = t.storage_offset() * t.element_size();
    return std::make_pair(start, start + (last + 1) * t.element_size());
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

// Whether no two of t's elements share an address: its dimensions of more than one element,
// in order of stride, each steps past the whole of the one before it (rmsnorm_api's
// _distinct).
bool distinct(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  for (size_t i = 1; i < dims.size(); ++i)
    if (dims[i].first < dims[i - 1].first * dims[i - 1].second) return false;
  return true;
}

// A tensor an op writes: viewable as rows in place (heads: or head rows, which rms_norm's
// out=x writes where they lie), no negative bit and no two elements at one address
// (rmsnorm_api's _check_written, in its order).
void check_written(const at::Tensor& t, const char* name, const char* impl, const std::string& hint,
                   bool heads = false) {
  Rows r;
  const bool layout = rows_of(t, r);
  if (t.numel() > 1 && !layout && heads && head_rows(t)) {
    TORCH_CHECK_VALUE(!t.is_neg(), impl, ": ", name,
                      " is a negative view (torch._neg_view) and is written; ", hint);
    TORCH_CHECK_VALUE(distinct(t), impl, ": ", name,
                      " has elements that share memory (more than one element of a written-to "
                      "tensor refers to a single memory location); ", hint);
    return;
  }
  TORCH_CHECK_VALUE(t.numel() <= 1 || layout, impl, ": ", name,
                    "'s leading dimensions cannot be viewed as rows in place (the op writes "
                    "into ", name, "); call ", name, ".contiguous() first");
  TORCH_CHECK_VALUE(!t.is_neg(), impl, ": ", name,
                    " is a negative view (torch._neg_view) and is written; ", hint);
  TORCH_CHECK_VALUE(t.numel() <= 1 || !(r.rows > 1 && r.stride < r.length), impl, ": ", name,
                    " has elements that share memory (more than one element of a written-to "
                    "tensor refers to a single memory location); ", hint);
}

// A form that writes into given tensors has no autograd: refuse inputs that want it, naming
// the first that requires grad (null entries are absent optionals).
void refuse_grad(const char* form, const char* impl,
                 std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors) {
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK_VALUE(t == nullptr || !at::GradMode::is_enabled() || !t->requires_grad(), impl,
                      ": ", form, " does not support autograd, but ", name,
                      " requires grad (detach it, or call under torch.no_grad())");
  }
  // a forward-mode tangent the write would leave stale (the first dual level)
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK_VALUE(t == nullptr || !t->_fw_grad(0).defined(), impl, ": ", form,
                      " does not support forward-mode AD, but ", name,
                      " has a tangent (use the functional form)");
  }
}

}  // namespace

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // the shortest digits that round-trip, then Python's repr layout: scientific below 1e-4
  // and from 1e16, fixed with at least one decimal otherwise
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string s(buf, res.ptr);
  const size_t e = s.find('e');
  const int exp = std::stoi(s.substr(e + 1));
  const bool neg = s[0] == '-';
  std::string digits;
  for (size_t i = neg; i < e; ++i)
    if (s[i] != '.') digits += s[i];
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char tail[8];
    std::snprintf(tail, sizeof(tail), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += tail;
  } else if (exp < 0) {
    out = "0." + std::string(-exp - 1, '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exp + 1) {
    out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
  }
  return (neg ? "-" : "") + out;
}

void check_eps(double eps, const char* impl) {
  if (eps_ok(eps)) return;
  char range[64];
  std::snprintf(range, sizeof(range), "%.7g, %.7g", spec::kEpsMin, spec::kEpsMax);
  refuse(spec::kRange, impl, "eps", {{"got", py_float(eps)}, {"want", range}});
}

namespace {

// The name of an op's argument by its index (its rules' table lists every tensor).
template <size_t K>
const char* name_at(const spec::Tensor (&op)[K], int arg) {
  for (const auto& r : op) {
    if (r.arg == arg) return r.name;
  }
  return "?";
}

// An op's rules for the argument of that name (its rules' table lists every tensor).
template <size_t K>
const spec::Tensor& rule_of(const spec::Tensor (&op)[K], std::string_view name) {
  for (const auto& r : op) {
    if (name == r.name) return r;
  }
  TORCH_CHECK(false, "no rule for ", std::string(name));
}

// One tensor argument against its rules (rmsnorm_api's _check_tensor): args holds the op's
// arguments by index, nullptr for a scalar or None.
template <size_t K>
void check_tensor(const spec::Tensor (&op)[K], const spec::Tensor& r,
                  const at::Tensor* const* args, const char* impl) {
  // an optional argument not given is a null pointer; an undefined tensor (a C++ caller's
  // None where a tensor was promised) is refused, given or not
  const at::Tensor* t = args[r.arg];
  if (t == nullptr && r.optional) return;
  if (t == nullptr || !t->defined()) refuse(spec::kTensor, impl, r.name, {{"got", "None"}});
  if (t->is_nested()) refuse(spec::kNested, impl, r.name);
  if (t->layout() != at::kStrided) refuse(spec::kLayout, impl, r.name, {{"got", layout_str(t->layout())}});
  if (r.dtype == spec::Dtype::kFloat32) {  // a scale: one fp32 element
    if (t->scalar_type() != at::kFloat) {
      refuse(spec::kDtypeFp32, impl, r.name, {{"got", dtype_str(t->scalar_type())}});
    }
    if (t->numel() != 1) refuse(spec::kShapeOne, impl, r.name, {{"got", shape_str(t->sizes())}});
    return;
  }
  if (r.dtype == spec::Dtype::kFloat) {
    if (!supported(t->scalar_type())) {
      refuse(spec::kDtypeFloat, impl, r.name, {{"got", dtype_str(t->scalar_type())}});
    }
  } else {
    const at::ScalarType of = args[r.dtype_of]->scalar_type();
    const bool fp32_too = r.dtype == spec::Dtype::kOfOrFloat32;
    if (t->scalar_type() != of && !(fp32_too && t->scalar_type() == at::kFloat)) {
      const spec::Message& m = !fp32_too          ? spec::kDtypeOf
                               : of == at::kFloat ? spec::kDtypeOfFp32
                                                  : spec::kDtypeOfOrFp32;
      refuse(m, impl, r.name,
             {{"of", name_at(op, r.dtype_of)},
              {"got", dtype_str(t->scalar_type())},
              {"want", dtype_str(of)}});
    }
  }
  if (r.shape == spec::Shape::kRows) {
    if (t->dim() == 0) refuse(spec::kRank, impl, r.name);
    const int64_t n = t->size(-1);
    if (n < 1) refuse(spec::kNMin, impl, r.name, {{"got", num(n)}});
    if (n > kMaxN) refuse(spec::kNMax, impl, r.name, {{"got", num(n)}, {"want", num(kMaxN)}});
  } else {
    const at::Tensor& of = *args[r.shape_of];
    if (r.shape == spec::Shape::kOf && t->sizes() != of.sizes()) {
      refuse(spec::kShapeOf, impl, r.name,
             {{"of", name_at(op, r.shape_of)}, {"got", shape_str(t->sizes())},
              {"want", shape_str(of.sizes())}});
    }
    const bool row = t->dim() == 1 && t->size(0) == of.size(-1);
    if (r.shape == spec::Shape::kRowOf && !row) {
      refuse(spec::kShapeRowOf, impl, r.name,
             {{"of", name_at(op, r.shape_of)}, {"got", shape_str(t->sizes())},
              {"n", num(of.size(-1))}});
    }
    // or a row a head: of's last two dimensions (H, N)
    const bool heads = of.dim() >= 2 && t->dim() == 2 && t->size(0) == of.size(-2) &&
                       t->size(1) == of.size(-1);
    if (r.shape == spec::Shape::kRowOrHeadsOf && !row && !heads) {
      // a row a head: the rows' last two dimensions, (H, N)
      const std::string want = of.dim() >= 2 ? shape_str(of.sizes().slice(of.dim() - 2))
                                             : "none, " + std::string(name_at(op, r.shape_of)) +
                                                   " is 1-D";
      refuse(spec::kShapeRowOrHeadsOf, impl, r.name,
             {{"of", name_at(op, r.shape_of)}, {"got", shape_str(t->sizes())},
              {"n", num(of.size(-1))}, {"want", want}});
    }
  }
  if (r.stride == spec::Stride::kRow && t->numel() > 0 && t->stride(-1) != 1) {
    refuse(spec::kStrideRow, impl, r.name, {{"got", num(t->stride(-1))}});
  }
  if (r.stride == spec::Stride::kDense && !t->is_contiguous()) {
    refuse(spec::kStrideDense, impl, r.name);
  }
}

// An op's arguments against its rules (rmsnorm_api's _check_op, in its order): every
// tensor's, the others' devices beside the rows', eps, the weight offset (finite, and other
// than 0 only with a weight), the op's own (more: the quantised ops'), and last the rows'
// device, so every other check also runs on a machine without a GPU.
template <size_t K, typename More = void (*)()>
void check_op(const spec::Tensor (&op)[K], const at::Tensor* const* args, double eps,
              double weight_offset, const char* impl, More more = [] {}) {
  for (const auto& r : op) check_tensor(op, r, args, impl);
  const at::Tensor& rows = *args[op[0].arg];
  for (size_t i = 1; i < K; ++i) {
    const at::Tensor* t = args[op[i].arg];
    if (t != nullptr && t->defined() && t->device() != rows.device()) {
      refuse(spec::kDeviceOf, impl, op[i].name,
             {{"of", op[0].name}, {"got", t->device().str()}, {"want", rows.device().str()}});
    }
  }
  check_eps(eps, impl);
  if (!offset_ok(weight_offset)) {
    refuse(spec::kRangeFinite, impl, "weight_offset", {{"got", py_float(weight_offset)}});
  }
  if (weight_offset != 0.0 && args[rule_of(op, "weight").arg] == nullptr) {
    refuse(spec::kNeeds, impl, "weight_offset",
           {{"of", "weight"}, {"got", py_float(weight_offset)}});
  }
  more();
  if (!rows.is_cuda()) refuse(spec::kDevice, impl, op[0].name, {{"got", rows.device().str()}});
}

// A quantised op's own rules (rmsnorm_api's _check_quant, but the scales' values, which the
// Python functions read): out_dtype an fp8 dtype, group_size 0 or a power of two in
// [kGroupMin, kGroupMax] dividing N, and one way of scaling.
void check_quant(const at::Tensor& x, bool scale, int64_t group, bool bound,
                 at::ScalarType out_dtype, const char* impl) {
  if (out_dtype != at::kFloat8_e4m3fn && out_dtype != at::kFloat8_e5m2) {
    refuse(spec::kDtypeFp8, impl, "out_dtype", {{"got", dtype_str(out_dtype)}});
  }
  if (group != 0 && (group < spec::kGroupMin || group > spec::kGroupMax || (group & (group - 1)))) {
    refuse(spec::kGroup, impl, "group_size",
           {{"got", num(group)}, {"want", num(spec::kGroupMin) + ", " + num(spec::kGroupMax)}});
  }
  if (group != 0 && x.size(-1) % group != 0) {
    refuse(spec::kGroupOf, impl, "group_size",
           {{"got", num(group)}, {"of", "x"}, {"n", num(x.size(-1))}});
  }
  if (scale && group != 0) {
    refuse(spec::kQuantMode, impl, "group_size",
           {{"of", "scale"}, {"hint", "a static scale is one for the whole tensor (group_size 0)"}});
  }
  if (bound && (scale || group != 0)) {
    refuse(spec::kQuantMode, impl, "scale_ub",
           {{"of", scale ? "scale" : "group_size"},
            {"hint", "scale_ub bounds the dynamic scale of a row (scale None, group_size 0)"}});
  }
  if (out_dtype == at::kFloat8_e4m3fn && x.is_cuda()) {
    const int sm = sm_version(x.get_device());
    if (sm < 89) {
      refuse(spec::kFp8Device, impl, "out_dtype",
             {{"got", dtype_str(out_dtype)}, {"of", "x's GPU"}, {"want", "sm_" + num(sm)}});
    }
  }
}

const at::Tensor* maybe(const std::optional<at::Tensor>& t) { return t ? &*t : nullptr; }

}  // namespace

at::Tensor weight_as_read(const std::optional<at::Tensor>& weight, double weight_offset) {
  if (!weight.has_value()) return at::Tensor();
  if (weight_offset == 0.0) return weight->contiguous();
  // never in place: to() returns an fp32 weight itself
  return at::add(weight->to(at::kFloat), static_cast<float>(weight_offset)).contiguous();
}

void check_inputs(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                  double weight_offset, const char* impl) {
  const at::Tensor* args[] = {&x, maybe(weight), nullptr, nullptr};
  check_op(spec::kRmsNorm, args, eps, weight_offset, impl);
}

void check_fused_inputs(const at::Tensor& x, const at::Tensor& residual,
                        const std::optional<at::Tensor>& weight, double eps, double weight_offset,
                        const char* impl) {
  const at::Tensor* args[] = {&x, &residual, maybe(weight), nullptr, nullptr};
  check_op(spec::kFusedAddRmsNorm, args, eps, weight_offset, impl);
}

void check_quant_inputs(const at::Tensor& x, const at::Tensor* residual,
                        const std::optional<at::Tensor>& weight, double eps,
                        const std::optional<at::Tensor>& scale, int64_t group_size,
                        const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype,
                        double weight_offset, const char* impl) {
  const auto more = [&] {
    check_quant(x, scale.has_value(), group_size, scale_ub.has_value(), out_dtype, impl);
  };
  if (residual == nullptr) {
    const at::Tensor* args[] = {&x,      maybe(weight), nullptr, maybe(scale),
                                nullptr, maybe(scale_ub), nullptr, nullptr};
    check_op(spec::kRmsNormQuant, args, eps, weight_offset, impl, more);
  } else {
    const at::Tensor* args[] = {&x,      residual, maybe(weight),   nullptr, maybe(scale),
                                nullptr, maybe(scale_ub), nullptr, nullptr};
    check_op(spec::kFusedAddRmsNormQuant, args, eps, weight_offset, impl, more);
  }
}

void check_quant_in_place(const at::Tensor& x, const at::Tensor& residual,
                          const std::optional<at::Tensor>& weight, const char* impl) {
  refuse_grad("the in-place form", impl, {{"residual", &residual}});  // x and weight are read
  check_written(residual, "residual", impl,
                "pass residual.clone() (the in-place form writes residual)");
  TORCH_CHECK_VALUE(!overlaps(x, residual), impl,
                    ": x and residual overlap in memory; residual is written");
  TORCH_CHECK_VALUE(!weight.has_value() || !overlaps(residual, *weight), impl,
                    ": weight overlaps residual in memory; residual is written");
}

// The backward ops' arguments: saved is x, or the fused add's residual_out.
void check_backward_inputs(const at::Tensor& dy, const at::Tensor& saved,
                           const std::optional<at::Tensor>& weight, double eps,
                           double weight_offset,
                           const std::optional<at::Tensor>& d_residual_out, bool fused) {
  if (fused) {
    const at::Tensor* args[] = {&dy,    maybe(d_residual_out), &saved, maybe(weight),
                                nullptr, nullptr,              nullptr};
    check_op(spec::kFusedAddRmsNormBackward, args, eps, weight_offset, kFusedBwdImpl);
  } else {
    const at::Tensor* args[] = {&dy, &saved, maybe(weight), nullptr, nullptr};
    check_op(spec::kRmsNormBackward, args, eps, weight_offset, kBwdImpl);
  }
}

// The in-place form writes y into x and residual_out into residual (rmsnorm_api's
// check_in_place, in its order).
void check_in_place(const at::Tensor& x, const at::Tensor& residual,
                    const std::optional<at::Tensor>& weight, const char* impl) {
  const std::pair<const char*, const at::Tensor*> written[] = {{"x", &x}, {"residual", &residual}};
  for (const auto& [name, t] : written) {
    check_written(*t, name, impl,
                  std::string("pass ") + name + ".clone() (the in-place form writes " + name + ")");
  }
  TORCH_CHECK_VALUE(!overlaps(x, residual), impl,
                    ": x and residual overlap in memory; both are written");
  TORCH_CHECK_VALUE(!weight.has_value() || (!overlaps(x, *weight) && !overlaps(residual, *weight)),
                    impl, ": weight overlaps x or residual in memory; both are written");
  refuse_grad("the in-place form", impl,
              {{"x", &x}, {"residual", &residual}, {"weight", weight ? &*weight : nullptr}});
}

bool head_rows(const at::Tensor& x) {
  if (x.dim() < 3) return false;
  Rows r;
  return !rows_of(x, r) && rows_of(x.select(-2, 0), r);
}

bool views_as_heads(const at::Tensor& x) {
  Rows r;
  return x.dim() >= 2 && rows_of(x.select(-2, 0), r);
}

void check_out(const at::Tensor& out, const at::Tensor& x,
               const std::optional<at::Tensor>& weight) {
  // out=x itself (one storage, offset, shape and strides) normalises in place, any layout
  // the kernels write where it lies (check_written says which)
  const bool in_place = out.is_same(x) ||
                        (out.sizes() == x.sizes() && out.strides() == x.strides() &&
                         out.storage_offset() == x.storage_offset() &&
                         out.scalar_type() == x.scalar_type() && out.device() == x.device() &&
                         out.is_alias_of(x));
  if (!in_place) {
    const at::Tensor* args[] = {&out, &x, maybe(weight), nullptr, nullptr};
    check_tensor(spec::kRmsNormOut, rule_of(spec::kRmsNormOut, "out"), args, kImpl);
    if (out.device() != x.device()) {
      refuse(spec::kDeviceOf, kImpl, "out",
             {{"of", "x"}, {"got", out.device().str()}, {"want", x.device().str()}});
    }
  }
  check_written(out, "out", kImpl, "pass a plain tensor (out.resolve_neg() is a copy)", in_place);
  // a row written while another program still reads it gives wrong rows; out=x is safe
  const bool same_as_x =
      in_place || (out.storage_offset() == x.storage_offset() && x.is_contiguous());
  TORCH_CHECK_VALUE(!overlaps(out, x) || same_as_x, kImpl,
                    ": out partially overlaps x in memory; pass a separate tensor, or out=x "
                    "itself to normalise in place");
  TORCH_CHECK_VALUE(!weight.has_value() || !overlaps(out, *weight), kImpl,
                    ": out overlaps weight in memory; pass a separate tensor");
  refuse_grad("out=", kImpl, {{"x", &x}, {"weight", weight ? &*weight : nullptr}, {"out", &out}});
}

namespace {

// Every dispatch key without a kernel of its own (CPU, meta-less backends, sparse and nested
// tensors, and calls with no tensor at all, such as x=None) lands here: the checks raise
// before anything else happens, with the same errors as the Python side.
[[noreturn]] void unreachable() {
  TORCH_CHECK(false, kImpl, ": unreachable: the argument checks refuse every input here");
}

at::Tensor rms_norm_checked(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                            double eps, double weight_offset) {
  check_inputs(x, weight, eps, weight_offset);
  unreachable();
}

void rms_norm_out_checked(at::Tensor& out, const at::Tensor& x,
                          const std::optional<at::Tensor>& weight, double eps,
                          double weight_offset) {
  check_inputs(x, weight, eps, weight_offset);
  check_out(out, x, weight);
  unreachable();
}

at::Tensor rms_norm_with_config_checked(const at::Tensor& x,
                                        const std::optional<at::Tensor>& weight, double eps,
                                        int64_t, int64_t, int64_t, int64_t,
                                        double weight_offset) {
  check_inputs(x, weight, eps, weight_offset);
  unreachable();
}

std::vector<int64_t> rms_norm_kernel_info_checked(const at::Tensor& x,
                                                  const std::optional<at::Tensor>& weight) {
  check_inputs(x, weight, 1e-6);
  unreachable();
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_checked(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, double weight_offset) {
  check_fused_inputs(x, residual, weight, eps, weight_offset, kFusedImpl);
  unreachable();
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_with_config_checked(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, int64_t, int64_t, int64_t, int64_t, double weight_offset) {
  check_fused_inputs(x, residual, weight, eps, weight_offset, kFusedImpl);
  unreachable();
}

void fused_add_rms_norm__checked(at::Tensor& x, at::Tensor& residual,
                                 const std::optional<at::Tensor>& weight, double eps,
                                 double weight_offset) {
  check_fused_inputs(x, residual, weight, eps, weight_offset, kFusedImplInPlace);
  check_in_place(x, residual, weight, kFusedImplInPlace);
  unreachable();
}

std::tuple<at::Tensor, at::Tensor> rms_norm_quant_checked(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
    const std::optional<at::Tensor>& scale, int64_t group_size,
    const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype, double weight_offset) {
  check_quant_inputs(x, nullptr, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset, kQuantImpl);
  unreachable();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_quant_checked(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, const std::optional<at::Tensor>& scale, int64_t group_size,
    const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype, double weight_offset) {
  check_quant_inputs(x, &residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset, kFusedQuantImpl);
  unreachable();
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_quant__checked(
    const at::Tensor& x, at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, const std::optional<at::Tensor>& scale, int64_t group_size,
    const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype, double weight_offset) {
  check_quant_inputs(x, &residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset, kFusedQuantImplInPlace);
  check_quant_in_place(x, residual, weight, kFusedQuantImplInPlace);
  unreachable();
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_quant__versioned(
    const at::Tensor& x, at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, const std::optional<at::Tensor>& scale, int64_t group_size,
    const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype, double weight_offset) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("cuda_impl::fused_add_rms_norm_quant_", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&, double,
              const std::optional<at::Tensor>&, int64_t, const std::optional<at::Tensor>&,
              at::ScalarType, double)>();
  std::tuple<at::Tensor, at::Tensor> out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = op.call(x, residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                  weight_offset);
  }
  torch::autograd::impl::bump_version(residual);
  return out;
}

// The ops that write their arguments bump those tensors' versions (the ADInplaceOrView key),
// so autograd notices when a tensor it saved was overwritten instead of using stale values.
void rms_norm_out_versioned(at::Tensor& out, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight, double eps,
                            double weight_offset) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cuda_impl::rms_norm_out", "")
                             .typed<void(at::Tensor&, const at::Tensor&,
                                         const std::optional<at::Tensor>&, double, double)>();
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.call(out, x, weight, eps, weight_offset);
  }
  torch::autograd::impl::bump_version(out);
}

void fused_add_rms_norm__versioned(at::Tensor& x, at::Tensor& residual,
                                   const std::optional<at::Tensor>& weight, double eps,
                                   double weight_offset) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cuda_impl::fused_add_rms_norm_", "")
                             .typed<void(at::Tensor&, at::Tensor&,
                                         const std::optional<at::Tensor>&, double, double)>();
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.call(x, residual, weight, eps, weight_offset);
  }
  torch::autograd::impl::bump_version(x);
  torch::autograd::impl::bump_version(residual);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_checked(
    const at::Tensor& dy, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    double eps, double weight_offset) {
  check_backward_inputs(dy, x, weight, eps, weight_offset, std::nullopt, false);
  unreachable();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_backward_checked(
    const at::Tensor& dy, const std::optional<at::Tensor>& d_residual_out,
    const at::Tensor& residual_out, const std::optional<at::Tensor>& weight, double eps,
    bool /*dresidual*/, double weight_offset) {
  check_backward_inputs(dy, residual_out, weight, eps, weight_offset, d_residual_out, true);
  unreachable();
}

}  // namespace

TORCH_LIBRARY(cuda_impl, m) {
  // The described ops (rmsnorm_api/spec.py, through spec_rules.h): rms_norm and its out=
  // form; the fused residual add, (y, residual_out), and in place (y into x, residual_out
  // into residual); the backward ops (autograd: cuda_impl/ops.py), (dx, dweight) and (dx,
  // dresidual, dweight): dweight is empty without a weight, and dresidual=False does not
  // store dresidual (autograd's call where it would equal dx: dx serves as both).
  for (const char* schema : {spec::kRmsNormSchema, spec::kRmsNormOutSchema,
                             spec::kFusedAddRmsNormSchema, spec::kFusedAddRmsNormInPlaceSchema,
                             spec::kRmsNormBackwardSchema, spec::kFusedAddRmsNormBackwardSchema,
                             spec::kRmsNormQuantSchema, spec::kFusedAddRmsNormQuantSchema,
                             spec::kFusedAddRmsNormQuantInPlaceSchema}) {
    m.def(schema);
  }
  m.def("fused_add_default_config(int n, int element_size) -> int[]", &fused_add_default_config);
  m.def("fused_add_configs() -> int[]", &fused_add_configs);
  m.def("fused_add_rms_norm_with_config(Tensor x, Tensor residual, Tensor? weight, float eps, "
        "int row_threads, int vpt, int cluster, int variant=0, float weight_offset=0.0) -> "
        "(Tensor, Tensor)");
  // For sweeps: force one of the compiled launch configs; and list them.
  m.def("rms_norm_with_config(Tensor x, Tensor? weight, float eps, int row_threads, int vpt, "
        "int cluster, int variant=0, float weight_offset=0.0) -> Tensor");
  m.def("rms_norm_configs() -> int[]", &rms_norm_configs);
  // The forward's variant bits by name, bit i at index i ("" where unused).
  m.def("forward_variants() -> str[]", &forward_variants);
  m.def("rms_norm_default_config(int n, int element_size) -> int[]", &rms_norm_default_config);
  // The kernel rms_norm would launch for x: config, registers, local (spill) bytes, ...
  m.def("rms_norm_kernel_info(Tensor x, Tensor? weight) -> int[]");
}

// CompositeExplicitAutograd also serves the dispatcher's "no tensor arguments" case
// (x=None), sparse and CPU tensors; nested tensors stop at their autograd key. CUDA and
// Meta (the fakes, in ops.py) have kernels of their own.
void register_checked(torch::Library& m) {
  m.impl("rms_norm", &rms_norm_checked);
  m.impl("rms_norm_out", &rms_norm_out_checked);
  m.impl("rms_norm_with_config", &rms_norm_with_config_checked);
  m.impl("rms_norm_kernel_info", &rms_norm_kernel_info_checked);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm_checked);
  m.impl("fused_add_rms_norm_", &fused_add_rms_norm__checked);
  m.impl("fused_add_rms_norm_with_config", &fused_add_rms_norm_with_config_checked);
  m.impl("rms_norm_backward", &rms_norm_backward_checked);
  m.impl("fused_add_rms_norm_backward", &fused_add_rms_norm_backward_checked);
  m.impl("rms_norm_quant", &rms_norm_quant_checked);
  m.impl("fused_add_rms_norm_quant", &fused_add_rms_norm_quant_checked);
  m.impl("fused_add_rms_norm_quant_", &fused_add_rms_norm_quant__checked);
}

TORCH_LIBRARY_IMPL(cuda_impl, CompositeExplicitAutograd, m) { register_checked(m); }
TORCH_LIBRARY_IMPL(cuda_impl, AutogradNestedTensor, m) { register_checked(m); }
TORCH_LIBRARY_IMPL(cuda_impl, ADInplaceOrView, m) {
  m.impl("rms_norm_out", &rms_norm_out_versioned);
  m.impl("fused_add_rms_norm_", &fused_add_rms_norm__versioned);
  m.impl("fused_add_rms_norm_quant_", &fused_add_rms_norm_quant__versioned);
}

}  // namespace cuda_impl
