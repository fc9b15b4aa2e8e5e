// The forward with a quantised output (fp8, for inference): rms_norm and the fused residual
// add whose y is written in float8_e4m3fn or float8_e5m2 in the same pass, scaled by the
// caller's static scale, by a scale a row (max|y| / the format's max, clamped above by an
// optional bound and below by 1 / (max * 512)), or by a scale a group of `group`
// consecutive columns; rmsnorm_api and triton_impl.quant say what each form computes.
//
// A row is 16-byte slots of VEC elements, held by `tpr` threads (a power of two; thread t
// takes slots t, t + tpr, ...). Two bodies. Rows in registers (SLOTS slots a thread, up to
// kMaxSlots): a CTA holds one row or several (narrow rows), loads x (the fused add: x and
// residual, stores residual_out = x + residual rounded once to its dtype), sums the
// squares, scales each value by rstd and the weight where it lies, takes the row's or a
// group's max of |y| and stores y quantised; the row is read once. Wider rows loop, one a
// CTA, in two sweeps: the first sums the squares and, for a scale a row, the max of |s w|
// (times rstd > 0, the row's max|y|); the second reads the row again (from L1 or L2; the
// fused add reads back its own residual_out), scales it and stores it quantised (the form
// of Triton's looped kernel and of Inductor's). A slot is one 16-byte load where every row
// is aligned and N a whole number of slots, else VEC scalar loads, masked. The form, the
// weight's dtype and the fp8 dtype are arguments of the launch, uniform branches: 32
// kernels (x's dtype and the residual's: none, x's or fp32; SLOTS 1, 2, 4 or looped).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <torch/library.h>

#include <cstdint>
#include <type_traits>

#include "rms_norm.h"
#include "rms_norm_device.cuh"

namespace cuda_impl {
namespace {

enum QuantMode : int { kStatic = 1, kToken = 2, kGroup = 3 };

struct QuantArgs {
  const void* x;
  const void* r;  // the fused add's residual, else null
  const void* w;  // the weight (x's dtype or fp32), or null
  uint8_t* y;     // fp8, contiguous rows of N
  void* ro;       // the fused add's residual_out (residual itself in place), else null
  float* scales;  // dynamic scales, `cols` a row; null for a static scale
  const float* q_in;  // the static scale, or the bound of a row's scale, or null
  int64_t sx, sr, sro;  // row strides in elements (y's is N)
  int64_t m;            // rows
  int n, cols, group;
  int tpr;  // threads a row (a power of two; a whole number of a group's slots)
  float eps, offset, top, least;  // top: the fp8 max; least: the least dynamic scale
  int mode;
  bool w_fp32, e4m3, vec, w_vec;  // w_vec: the weight's slots whole 16-byte loads too
};

template <typename T>
constexpr int kSlot = 16 / sizeof(T);

// Slot j of a row of E (VEC of x's elements) as floats, 0 past N: whole 16-byte loads
// where vec (two for an fp32 residual beside 16-bit x), else scalar loads. Coherent loads
// (no __restrict__, so never the read-only path): the fused add's second sweep reads back
// residual_out, which in place is the residual its first sweep read.
template <typename E, int VEC>
__device__ __forceinline__ void load_slot(const E* row, int j, int n, bool vec,
                                          float (&out)[VEC]) {
  const int e0 = j * VEC;
  if (vec) {
    constexpr int kPer = kVec<E>;
#pragma unroll
    for (int h = 0; h < VEC / kPer; ++h) {
      Pack<E> p;
      p.raw = reinterpret_cast<const uint4*>(row + e0)[h];
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[h * kPer + i] = to_float(p.e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = e0 + i < n ? to_float(row[e0 + i]) : 0.f;
  }
}

// Slot j's weight elements in fp32 plus the offset (added in fp32: Gemma's 1 + w), 1
// without a weight; VEC of x's elements, whatever the weight's dtype.
template <typename T>
__device__ __forceinline__ void weight_slot(const QuantArgs& a, int j, float (&w)[kSlot<T>]) {
  constexpr int VEC = kSlot<T>;
  if (a.w == nullptr) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) w[i] = 1.f;
    return;
  }
  if (a.w_fp32) {
    load_slot<float, VEC>(static_cast<const float*>(a.w), j, a.n, a.w_vec, w);
  } else {
    load_slot<T, VEC>(static_cast<const T*>(a.w), j, a.n, a.w_vec, w);
  }
  if (a.offset != 0.f) {  // no add for none: a -0.0 keeps its sign
#pragma unroll
    for (int i = 0; i < VEC; ++i) w[i] += a.offset;
  }
}

// Slot j of a row of E written from floats (E's rounding), as load_slot reads it.
template <typename E, int VEC>
__device__ __forceinline__ void store_slot(E* row, int j, int n, bool vec,
                                           const float (&v)[VEC]) {
  const int e0 = j * VEC;
  if (vec) {
    constexpr int kPer = kVec<E>;
#pragma unroll
    for (int h = 0; h < VEC / kPer; ++h) {
      Pack<E> p;
#pragma unroll
      for (int i = 0; i < kPer; ++i) p.e[i] = from_float<E>(v[h * kPer + i]);
      reinterpret_cast<uint4*>(row + e0)[h] = p.raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      if (e0 + i < n) row[e0 + i] = from_float<E>(v[i]);
  }
}

// max and min that keep NaN (the reference's torch.amax and clamp): fmaxf and fminf drop it
__device__ __forceinline__ float max_nan(float a, float b) { return a > b || a != a ? a : b; }
__device__ __forceinline__ float min_nan(float a, float b) { return a < b || a != a ? a : b; }

// y * inv for two values at once, rounded to nearest even in the fp8 dtype K (one cvt a
// pair on sm_89+): satfinite saturates at the format's largest finite value, the clamp to
// +-top the reference applies before its cast, and keeps NaN (the fp8 NaN); first value in
// the low byte.
template <__nv_fp8_interpretation_t K, int VEC>
__device__ __forceinline__ void to_fp8_pairs(const float (&y)[VEC], float inv,
                                             uint16_t (&q)[VEC / 2]) {
#pragma unroll
  for (int i = 0; i < VEC / 2; ++i)
    q[i] = __nv_cvt_float2_to_fp8x2(make_float2(y[2 * i] * inv, y[2 * i + 1] * inv),
                                    __NV_SATFINITE, K);
}

// Slot j of y quantised by inv (y * inv saturated to +-top, rounded in the fp8 dtype).
template <int VEC>
__device__ __forceinline__ void store_quantised(const QuantArgs& a, uint8_t* __restrict__ yr,
                                                int j, const float (&y)[VEC], float inv) {
  uint16_t q[VEC / 2];
  if (a.e4m3) {
    to_fp8_pairs<__NV_E4M3>(y, inv, q);
  } else {
    to_fp8_pairs<__NV_E5M2>(y, inv, q);
  }
  const int e0 = j * VEC;
  if (a.vec) {
    if constexpr (VEC == 8) {
      *reinterpret_cast<uint2*>(yr + e0) =
          make_uint2(q[0] | static_cast<uint32_t>(q[1]) << 16, q[2] | static_cast<uint32_t>(q[3]) << 16);
    } else {
      *reinterpret_cast<uint32_t*>(yr + e0) = q[0] | static_cast<uint32_t>(q[1]) << 16;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      if (e0 + i < a.n) yr[e0 + i] = static_cast<uint8_t>(q[i / 2] >> (i % 2 * 8));
  }
}

// The sum (MAX: max) of v over `lanes` threads (a power of two), threads t .. t + lanes - 1
// of an aligned run: a row's threads, or a group's slots; past a warp, through red (a
// float a warp), every thread of the block calling.
template <bool MAX>
__device__ __forceinline__ float lanes_reduce(float v, int lanes, float* red) {
  const int in_warp = lanes < 32 ? lanes : 32;
  for (int off = in_warp / 2; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = MAX ? max_nan(v, o) : v + o;
  }
  if (lanes > 32) {
    const int warp = threadIdx.x / 32, per = lanes / 32, first = warp / per * per;
    __syncthreads();  // red's last readers are done
    if (threadIdx.x % 32 == 0) red[warp] = v;
    __syncthreads();
    v = red[first];
    for (int i = 1; i < per; ++i) v = MAX ? max_nan(v, red[first + i]) : v + red[first + i];
  }
  return v;
}

// A dynamic scale from its max|y|: at most the bound (ub), over top, at least least; IEEE
// divides, so it is the reference's to the rounding of amax.
__device__ __forceinline__ float scale_of(float amax, const QuantArgs& a, bool ub) {
  if (ub) amax = min_nan(amax, __ldg(a.q_in));
  return max_nan(__fdiv_rn(amax, a.top), a.least);
}

// What slot j's values (y, scaled) are quantised by: inv, or for a group the inverse of its
// scale, from the max over its `lanes` slots (every thread of the block calling); the
// group's first slot, where it is the thread's (mine), writes the scale.
template <int VEC>
__device__ __forceinline__ float slot_inv(const QuantArgs& a, const float (&y)[VEC], float inv,
                                          int64_t row, int j, int lanes, bool mine, float* red) {
  if (a.mode != kGroup) return inv;
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) m = max_nan(m, fabsf(y[i]));
  const float s = scale_of(lanes_reduce<true>(m, lanes, red), a, false);
  if (mine && j % lanes == 0) a.scales[row * a.cols + j / lanes] = s;
  return __fdiv_rn(1.f, s);
}

// The looped body: one row a CTA (tpr = blockDim.x), two sweeps (see the top).
template <typename T, typename R>
__device__ __forceinline__ void quant_looped(const QuantArgs& a, float* red) {
  constexpr bool kFused = !std::is_void_v<R>;
  constexpr int VEC = kSlot<T>;
  using S = std::conditional_t<kFused, R, T>;  // what the sum and the scale read
  const int64_t row = blockIdx.x;
  const T* xr = static_cast<const T*>(a.x) + row * a.sx;
  S* sr = nullptr;  // the fused add's residual_out row, read back by the second sweep
  if constexpr (kFused) sr = static_cast<R*>(a.ro) + row * a.sro;
  uint8_t* yr = a.y + row * a.n;
  const int slots = (a.n + VEC - 1) / VEC;
  const int t = threadIdx.x, B = blockDim.x;
  // the first sweep: the sum of squares (and the max of |s w| for a scale a row)
  float ss = 0.f, amx = 0.f;
  for (int j = t; j < slots; j += B) {
    float s[VEC];
    load_slot<T, VEC>(xr, j, a.n, a.vec, s);
    if constexpr (kFused) {
      float r[VEC];
      load_slot<R, VEC>(static_cast<const R*>(a.r) + row * a.sr, j, a.n, a.vec, r);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s[i] = to_float(from_float<R>(s[i] + r[i]));
      store_slot<R, VEC>(sr, j, a.n, a.vec, s);
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss = fmaf(s[i], s[i], ss);
    if (a.mode == kToken) {
      float w[VEC];
      weight_slot<T>(a, j, w);
#pragma unroll
      for (int i = 0; i < VEC; ++i) amx = max_nan(amx, fabsf(s[i] * w[i]));
    }
  }
  const float rstd = rsqrtf(lanes_reduce<false>(ss, B, red) / static_cast<float>(a.n) + a.eps);
  float inv = 0.f;
  if (a.mode == kStatic) {
    inv = __fdiv_rn(1.f, __ldg(a.q_in));
  } else if (a.mode == kToken) {
    const float s = scale_of(lanes_reduce<true>(amx, B, red) * rstd, a, a.q_in != nullptr);
    if (t == 0) a.scales[row] = s;
    inv = __fdiv_rn(1.f, s);
  }
  // the second sweep: the row again, scaled and stored quantised; a group's slots are
  // consecutive threads, so every thread runs every round (the group max's barriers)
  const int lanes = a.mode == kGroup ? a.group / VEC : 1;
  const int rounds = (slots + B - 1) / B;
  for (int k = 0; k < rounds; ++k) {
    const int j = t + k * B;
    float y[VEC], w[VEC];
    if (j < slots) {
      if constexpr (kFused) {
        load_slot<R, VEC>(sr, j, a.n, a.vec, y);
      } else {
        load_slot<T, VEC>(xr, j, a.n, a.vec, y);
      }
      weight_slot<T>(a, j, w);
#pragma unroll
      for (int i = 0; i < VEC; ++i) y[i] = y[i] * rstd * w[i];
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) y[i] = 0.f;
    }
    const float q_inv = slot_inv<VEC>(a, y, inv, row, j, lanes, j < slots, red);
    if (j < slots) store_quantised<VEC>(a, yr, j, y, q_inv);
  }
}

// The rows-in-registers body: blockDim.x / tpr rows a CTA, SLOTS slots a thread (see the
// top). Threads of a row past M run the reductions (their barriers) with zeros.
template <typename T, typename R, int SLOTS>
__device__ __forceinline__ void quant_rows(const QuantArgs& a, float* red) {
  constexpr bool kFused = !std::is_void_v<R>;
  constexpr int VEC = kSlot<T>;
  const int tpr = a.tpr, t = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool live = row < a.m;
  const int slots = (a.n + VEC - 1) / VEC;
  float v[SLOTS][VEC];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < SLOTS; ++k) {
    const int j = t + k * tpr;
    if (live && j < slots) {
      load_slot<T, VEC>(static_cast<const T*>(a.x) + row * a.sx, j, a.n, a.vec, v[k]);
      if constexpr (kFused) {
        float r[VEC];
        load_slot<R, VEC>(static_cast<const R*>(a.r) + row * a.sr, j, a.n, a.vec, r);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[k][i] = to_float(from_float<R>(v[k][i] + r[i]));
        store_slot<R, VEC>(static_cast<R*>(a.ro) + row * a.sro, j, a.n, a.vec, v[k]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[k][i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss = fmaf(v[k][i], v[k][i], ss);
  }
  const float rstd = rsqrtf(lanes_reduce<false>(ss, tpr, red) / static_cast<float>(a.n) + a.eps);
  // y = s rstd w in place; 0 past the row's end
#pragma unroll
  for (int k = 0; k < SLOTS; ++k) {
    const int j = t + k * tpr;
    if (live && j < slots) {
      float w[VEC];
      weight_slot<T>(a, j, w);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[k][i] = v[k][i] * rstd * w[i];
    }
  }
  float inv = 0.f;
  if (a.mode == kStatic) {
    inv = __fdiv_rn(1.f, __ldg(a.q_in));
  } else if (a.mode == kToken) {
    float amx = 0.f;  // the row's max|y| (NaN kept), the other forms without its work
#pragma unroll
    for (int k = 0; k < SLOTS; ++k)
#pragma unroll
      for (int i = 0; i < VEC; ++i) amx = max_nan(amx, fabsf(v[k][i]));
    const float s = scale_of(lanes_reduce<true>(amx, tpr, red), a, a.q_in != nullptr);
    if (live && t == 0) a.scales[row] = s;
    inv = __fdiv_rn(1.f, s);
  }
  uint8_t* yr = live ? a.y + row * a.n : a.y;  // a row past M writes nothing
  const int lanes = a.mode == kGroup ? a.group / VEC : 1;
#pragma unroll
  for (int k = 0; k < SLOTS; ++k) {
    const int j = t + k * tpr;
    const bool mine = live && j < slots;
    const float q_inv = slot_inv<VEC>(a, v[k], inv, row, j, lanes, mine, red);
    if (mine) store_quantised<VEC>(a, yr, j, v[k], q_inv);
  }
}

// SLOTS 0: the looped body.
template <typename T, typename R, int SLOTS>
__global__ void __launch_bounds__(1024) rms_norm_quant_kernel(const QuantArgs a) {
  __shared__ float red[32];
  if constexpr (SLOTS == 0) {
    quant_looped<T, R>(a, red);
  } else {
    quant_rows<T, R, SLOTS>(a, red);
  }
}

// Slots a thread the launch aims at, and the most a thread holds: past 1024 threads of
// those a row loops (__launch_bounds__(1024) leaves 64 registers a thread, which 4 slots
// of 8 floats and their temporaries fit)
constexpr int kAimSlots = 4, kMaxSlots = 4;

// Threads a row: a power of two near slots / kAimSlots, at least a warp's share of a
// group's slots (lanes) and at most 1024; then SLOTS, a power of two, covers the row.
template <typename T, typename R>
void launch(QuantArgs& a) {
  constexpr int VEC = kSlot<T>;
  const int slots = (a.n + VEC - 1) / VEC;
  const int lanes = a.mode == kGroup ? a.group / VEC : 1;
  int tpr = 1;
  while (tpr * kAimSlots < slots && tpr < 1024) tpr *= 2;
  tpr = std::max(tpr, lanes);
  int per = 1;
  while (per * tpr < slots) per *= 2;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCH_CHECK_VALUE(a.m <= INT32_MAX, "cuda_impl: x has ", num(a.m),
                    " rows, more than one launch can cover");
  if (per > kMaxSlots) {  // a row loops: one a CTA of 1024 threads
    a.tpr = 1024;
    rms_norm_quant_kernel<T, R, 0><<<static_cast<unsigned>(a.m), 1024, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  a.tpr = tpr;
  // a CTA of 128 threads at least: several narrow rows
  const int threads = std::max(tpr, 128), rows = threads / tpr;
  const auto grid = static_cast<unsigned>((a.m + rows - 1) / rows);
  switch (per) {
    case 1:
      rms_norm_quant_kernel<T, R, 1><<<grid, threads, 0, stream>>>(a);
      break;
    case 2:
      rms_norm_quant_kernel<T, R, 2><<<grid, threads, 0, stream>>>(a);
      break;
    default:
      rms_norm_quant_kernel<T, R, 4><<<grid, threads, 0, stream>>>(a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether every row of t (rows of N at stride s) starts 16-byte aligned.
bool rows_aligned(const at::Tensor& t, int64_t s) {
  return aligned(t.const_data_ptr()) && (s * t.element_size()) % 16 == 0;
}

// The quantised forward of x (and residual: the fused add) into y (fp8) and residual_out,
// the scales into `scales` (dynamic forms); the arguments checked.
void run_quant(const at::Tensor& x, const at::Tensor* residual, const at::Tensor* residual_out,
               const std::optional<at::Tensor>& weight, double eps,
               const std::optional<at::Tensor>& scale, int64_t group,
               const std::optional<at::Tensor>& scale_ub, double weight_offset, at::Tensor& y,
               at::Tensor& scales, const char* impl) {
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.numel() == 0) return;
  const int64_t n = x.size(-1);
  const at::Tensor x2 = x.reshape({-1, n});
  const at::Tensor r2 = residual ? residual->reshape({-1, n}) : at::Tensor();
  at::Tensor ro2 = residual_out ? residual_out->view({-1, n}) : at::Tensor();
  const at::Tensor w = weight ? weight->contiguous() : at::Tensor();
  const bool e4m3 = y.scalar_type() == at::kFloat8_e4m3fn;
  QuantArgs a = {};
  a.x = x2.const_data_ptr();
  a.r = residual ? r2.const_data_ptr() : nullptr;
  a.w = w.defined() ? w.const_data_ptr() : nullptr;
  a.y = static_cast<uint8_t*>(y.mutable_data_ptr());
  a.ro = residual_out ? ro2.mutable_data_ptr() : nullptr;
  a.scales = scale ? nullptr : scales.mutable_data_ptr<float>();
  a.q_in = scale ? scale->const_data_ptr<float>()
           : scale_ub ? scale_ub->const_data_ptr<float>()
                      : nullptr;
  a.sx = x2.stride(0);
  a.sr = residual ? r2.stride(0) : 0;
  a.sro = residual_out ? ro2.stride(0) : 0;
  a.n = static_cast<int>(n);
  a.group = static_cast<int>(group);
  a.cols = group ? static_cast<int>(n / group) : 1;
  a.eps = static_cast<float>(eps);
  a.offset = w.defined() ? static_cast<float>(weight_offset) : 0.f;
  a.top = e4m3 ? 448.f : 57344.f;
  a.least = 1.f / (a.top * 512.f);
  a.mode = scale ? kStatic : group ? kGroup : kToken;
  a.w_fp32 = w.defined() && w.scalar_type() == at::kFloat;
  a.e4m3 = e4m3;
  const int vec = 16 / static_cast<int>(x.element_size());
  a.vec = n % vec == 0 && rows_aligned(x2, a.sx) && aligned(a.y) &&
          (!residual || (rows_aligned(r2, a.sr) && rows_aligned(ro2, a.sro)));
  a.w_vec = a.vec && w.defined() && aligned(w.const_data_ptr());
  a.m = x2.size(0);
  const bool r_fp32 = residual && residual->scalar_type() == at::kFloat;
  switch (x.scalar_type()) {
    case at::kFloat:
      return residual ? launch<float, float>(a) : launch<float, void>(a);
    case at::kHalf:
      if (!residual) return launch<__half, void>(a);
      return r_fp32 ? launch<__half, float>(a) : launch<__half, __half>(a);
    case at::kBFloat16:
      if (!residual) return launch<__nv_bfloat16, void>(a);
      return r_fp32 ? launch<__nv_bfloat16, float>(a)
                    : launch<__nv_bfloat16, __nv_bfloat16>(a);
    default:
      TORCH_CHECK_TYPE(false, "cuda_impl: unsupported dtype ", x.scalar_type());
  }
}

// The scales a quantised op returns: (0,) for a static scale; x's shape with a last
// dimension of 1 (a row's) or N / group (a group's), fp32 (rmsnorm_api.scales_shape).
at::Tensor new_scales(const at::Tensor& x, const std::optional<at::Tensor>& scale,
                      int64_t group) {
  const auto opts = x.options().dtype(at::kFloat);
  if (scale) return at::empty({0}, opts);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = group ? shape.back() / group : 1;
  return at::empty(shape, opts);
}

at::Tensor new_y(const at::Tensor& x, at::ScalarType out_dtype) {
  return at::empty(x.sizes(), x.options().dtype(out_dtype).memory_format(at::MemoryFormat::Contiguous));
}

std::tuple<at::Tensor, at::Tensor> rms_norm_quant(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
    const std::optional<at::Tensor>& scale, int64_t group_size,
    const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype, double weight_offset) {
  check_quant_inputs(x, nullptr, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset, kQuantImpl);
  at::Tensor y = new_y(x, out_dtype), scales = new_scales(x, scale, group_size);
  run_quant(x, nullptr, nullptr, weight, eps, scale, group_size, scale_ub, weight_offset, y,
            scales, kQuantImpl);
  return {y, scales};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_quant(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, const std::optional<at::Tensor>& scale, int64_t group_size,
    const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype, double weight_offset) {
  check_quant_inputs(x, &residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset, kFusedQuantImpl);
  at::Tensor y = new_y(x, out_dtype), scales = new_scales(x, scale, group_size);
  at::Tensor residual_out =
      at::empty(x.sizes(), x.options()
                               .dtype(residual.scalar_type())
                               .memory_format(at::MemoryFormat::Contiguous));
  run_quant(x, &residual, &residual_out, weight, eps, scale, group_size, scale_ub,
            weight_offset, y, scales, kFusedQuantImpl);
  return {y, residual_out, scales};
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_quant_(
    const at::Tensor& x, at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, const std::optional<at::Tensor>& scale, int64_t group_size,
    const std::optional<at::Tensor>& scale_ub, at::ScalarType out_dtype, double weight_offset) {
  check_quant_inputs(x, &residual, weight, eps, scale, group_size, scale_ub, out_dtype,
                     weight_offset, kFusedQuantImplInPlace);
  check_quant_in_place(x, residual, weight, kFusedQuantImplInPlace);
  at::Tensor y = new_y(x, out_dtype), scales = new_scales(x, scale, group_size);
  run_quant(x, &residual, &residual, weight, eps, scale, group_size, scale_ub, weight_offset, y,
            scales, kFusedQuantImplInPlace);
  return {y, scales};
}

}  // namespace

TORCH_LIBRARY_IMPL(cuda_impl, CUDA, m) {
  m.impl("rms_norm_quant", &rms_norm_quant);
  m.impl("fused_add_rms_norm_quant", &fused_add_rms_norm_quant);
  m.impl("fused_add_rms_norm_quant_", &fused_add_rms_norm_quant_);
}

}  // namespace cuda_impl
