// Written from rmsnorm_api/spec.py by its header() (tests/test_spec.py holds this file
// to it, and says how to rewrite it): each op's schema and tensor rules, in the order
// the checks run, and the checks' wording, which the C++ op's registration and checks
// (rms_norm.cpp) apply as rmsnorm_api does.
#pragma once

#include <cstdint>

namespace cuda_impl::spec {

enum class Dtype { kFloat, kFloat32, kOf, kOfOrFloat32 };
enum class Shape { kRows, kOne, kOf, kRowOf, kRowOrHeadsOf };
enum class Stride { kAny, kRow, kDense };
// A tensor argument: its index among the op's arguments, its name, whether it may be
// None, and its rules (dtype_of, shape_of: the index of the argument a rule names, or
// -1).
struct Tensor {
  int arg;
  const char* name;
  bool optional;
  Dtype dtype;
  int dtype_of;
  Shape shape;
  int shape_of;
  Stride stride;
};
// A check's wording: its template ({field}s as rmsnorm_api fills them) and whether it is
// a TypeError (else a ValueError).
struct Message {
  const char* text;
  bool type_error;
};

constexpr int64_t kMaxN = 262144;
constexpr double kEpsMin = 1.1754943508222875e-38;
constexpr double kEpsMax = 3.4028234663852886e+38;
constexpr int64_t kGroupMin = 16;
constexpr int64_t kGroupMax = 1024;

constexpr Tensor kRmsNorm[] = {
    {0, "x", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kRow},
    {1, "weight", true, Dtype::kOfOrFloat32, 0, Shape::kRowOrHeadsOf, 0, Stride::kAny},
};
constexpr const char* kRmsNormSchema = "rms_norm(Tensor x, Tensor? weight, float eps, float weight_offset=0.0) -> Tensor";
constexpr Tensor kRmsNormOut[] = {
    {1, "x", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kRow},
    {0, "out", false, Dtype::kOf, 1, Shape::kOf, 1, Stride::kDense},
    {2, "weight", true, Dtype::kOfOrFloat32, 1, Shape::kRowOrHeadsOf, 1, Stride::kAny},
};
constexpr const char* kRmsNormOutSchema = "rms_norm_out(Tensor(a!) out, Tensor x, Tensor? weight, float eps, float weight_offset=0.0) -> ()";
constexpr Tensor kFusedAddRmsNorm[] = {
    {0, "x", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kRow},
    {1, "residual", false, Dtype::kOfOrFloat32, 0, Shape::kOf, 0, Stride::kRow},
    {2, "weight", true, Dtype::kOfOrFloat32, 0, Shape::kRowOf, 0, Stride::kAny},
};
constexpr const char* kFusedAddRmsNormSchema = "fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps, float weight_offset=0.0) -> (Tensor, Tensor)";
constexpr Tensor kFusedAddRmsNormInPlace[] = {
    {0, "x", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kRow},
    {1, "residual", false, Dtype::kOfOrFloat32, 0, Shape::kOf, 0, Stride::kRow},
    {2, "weight", true, Dtype::kOfOrFloat32, 0, Shape::kRowOf, 0, Stride::kAny},
};
constexpr const char* kFusedAddRmsNormInPlaceSchema = "fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps, float weight_offset=0.0) -> ()";
constexpr Tensor kRmsNormQuant[] = {
    {0, "x", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kRow},
    {1, "weight", true, Dtype::kOfOrFloat32, 0, Shape::kRowOf, 0, Stride::kAny},
    {3, "scale", true, Dtype::kFloat32, -1, Shape::kOne, -1, Stride::kAny},
    {5, "scale_ub", true, Dtype::kFloat32, -1, Shape::kOne, -1, Stride::kAny},
};
constexpr const char* kRmsNormQuantSchema = "rms_norm_quant(Tensor x, Tensor? weight, float eps, Tensor? scale=None, SymInt group_size=0, Tensor? scale_ub=None, ScalarType out_dtype=float8_e4m3fn, float weight_offset=0.0) -> (Tensor, Tensor)";
constexpr Tensor kFusedAddRmsNormQuant[] = {
    {0, "x", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kRow},
    {1, "residual", false, Dtype::kOfOrFloat32, 0, Shape::kOf, 0, Stride::kRow},
    {2, "weight", true, Dtype::kOfOrFloat32, 0, Shape::kRowOf, 0, Stride::kAny},
    {4, "scale", true, Dtype::kFloat32, -1, Shape::kOne, -1, Stride::kAny},
    {6, "scale_ub", true, Dtype::kFloat32, -1, Shape::kOne, -1, Stride::kAny},
};
constexpr const char* kFusedAddRmsNormQuantSchema = "fused_add_rms_norm_quant(Tensor x, Tensor residual, Tensor? weight, float eps, Tensor? scale=None, SymInt group_size=0, Tensor? scale_ub=None, ScalarType out_dtype=float8_e4m3fn, float weight_offset=0.0) -> (Tensor, Tensor, Tensor)";
constexpr Tensor kFusedAddRmsNormQuantInPlace[] = {
    {0, "x", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kRow},
    {1, "residual", false, Dtype::kOfOrFloat32, 0, Shape::kOf, 0, Stride::kRow},
    {2, "weight", true, Dtype::kOfOrFloat32, 0, Shape::kRowOf, 0, Stride::kAny},
    {4, "scale", true, Dtype::kFloat32, -1, Shape::kOne, -1, Stride::kAny},
    {6, "scale_ub", true, Dtype::kFloat32, -1, Shape::kOne, -1, Stride::kAny},
};
constexpr const char* kFusedAddRmsNormQuantInPlaceSchema = "fused_add_rms_norm_quant_(Tensor x, Tensor(a!) residual, Tensor? weight, float eps, Tensor? scale=None, SymInt group_size=0, Tensor? scale_ub=None, ScalarType out_dtype=float8_e4m3fn, float weight_offset=0.0) -> (Tensor, Tensor)";
constexpr Tensor kRmsNormBackward[] = {
    {0, "dy", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kAny},
    {1, "x", false, Dtype::kOf, 0, Shape::kOf, 0, Stride::kRow},
    {2, "weight", true, Dtype::kOfOrFloat32, 0, Shape::kRowOrHeadsOf, 0, Stride::kAny},
};
constexpr const char* kRmsNormBackwardSchema = "rms_norm_backward(Tensor dy, Tensor x, Tensor? weight, float eps, float weight_offset=0.0) -> (Tensor, Tensor)";
constexpr Tensor kFusedAddRmsNormBackward[] = {
    {0, "dy", false, Dtype::kFloat, -1, Shape::kRows, -1, Stride::kAny},
    {2, "residual_out", false, Dtype::kOfOrFloat32, 0, Shape::kOf, 0, Stride::kRow},
    {1, "d_residual_out", true, Dtype::kOf, 2, Shape::kOf, 0, Stride::kAny},
    {3, "weight", true, Dtype::kOfOrFloat32, 0, Shape::kRowOf, 0, Stride::kAny},
};
constexpr const char* kFusedAddRmsNormBackwardSchema = "fused_add_rms_norm_backward(Tensor dy, Tensor? d_residual_out, Tensor residual_out, Tensor? weight, float eps, bool dresidual=True, float weight_offset=0.0) -> (Tensor, Tensor, Tensor)";

constexpr Message kTensor = {"{impl}: {name} must be a torch.Tensor, got {got}", true};
constexpr Message kTensorOrNone = {"{impl}: {name} must be a torch.Tensor or None, got {got}", true};
constexpr Message kNested = {"{impl}: {name} is a nested tensor; expected a dense (strided) tensor", true};
constexpr Message kLayout = {"{impl}: {name} has layout {got}; expected torch.strided (a dense tensor)", true};
constexpr Message kDtypeFloat = {"{impl}: {name} has dtype {got}; expected one of float32, float16, bfloat16", true};
constexpr Message kDtypeOf = {"{impl}: {name} has dtype {got} but {of} has dtype {want}", true};
constexpr Message kDtypeOfOrFp32 = {"{impl}: {name} has dtype {got}; expected {of}'s dtype ({want}) or float32", true};
constexpr Message kDtypeOfFp32 = {"{impl}: {name} has dtype {got}; expected {of}'s dtype, torch.float32", true};
constexpr Message kDtypeFp32 = {"{impl}: {name} has dtype {got}; expected torch.float32", true};
constexpr Message kDtypeFp8 = {"{impl}: {name} is {got}; expected torch.float8_e4m3fn or torch.float8_e5m2", true};
constexpr Message kFp8Device = {"{impl}: {name} is {got}, which {of} ({want}) cannot convert to; it needs sm_89 or newer", false};
constexpr Message kRank = {"{impl}: {name} is 0-dimensional; expected at least 1 dimension", false};
constexpr Message kNMin = {"{impl}: {name}'s last dimension is {got}; expected N >= 1", false};
constexpr Message kNMax = {"{impl}: {name}'s last dimension is {got}; the supported maximum is N = {want}", false};
constexpr Message kShapeOf = {"{impl}: {name} has shape {got} but {of} has shape {want}", false};
constexpr Message kShapeOne = {"{impl}: {name} has shape {got}; expected one element (shape () or (1,))", false};
constexpr Message kShapeRowOf = {"{impl}: {name} has shape {got} but {of}'s last dimension is {n}; expected ({n},)", false};
constexpr Message kShapeRowOrHeadsOf = {"{impl}: {name} has shape {got} but {of}'s last dimension is {n}; expected ({n},), or a row a head: {want}", false};
constexpr Message kStrideRow = {"{impl}: {name} has stride {got} in its last dimension; expected 1 (call {name}.contiguous() first; rows may have any stride)", false};
constexpr Message kStrideDense = {"{impl}: {name} must be contiguous", false};
constexpr Message kDeviceOf = {"{impl}: {name} is on device '{got}' but {of} is on '{want}'", false};
constexpr Message kDevice = {"{impl}: {name} is on device '{got}'; expected a CUDA tensor{hint}", false};
constexpr Message kReal = {"{impl}: {name} must be a real number, got {got}", true};
constexpr Message kRange = {"{impl}: {name} is {got}; expected a number in float32's normal range [{want}]", false};
constexpr Message kRangeFinite = {"{impl}: {name} is {got}; expected a finite number in float32's range", false};
constexpr Message kNeeds = {"{impl}: {name} is {got} but {of} is None; {name} applies to a {of}", false};
constexpr Message kInt = {"{impl}: {name} must be an int, got {got}", true};
constexpr Message kGroup = {"{impl}: {name} is {got}; expected 0 (a scale a row) or a power of two in [{want}]", false};
constexpr Message kGroupOf = {"{impl}: {name} is {got}, which does not divide {of}'s last dimension {n}", false};
constexpr Message kQuantMode = {"{impl}: {name} is given with {of}; {hint}", false};

}  // namespace cuda_impl::spec
