// The backward of both ops in CUDA C++. For y = s * rstd * w, rstd = 1 / sqrt(mean(s^2) +
// eps), s = x (rms_norm) or residual_out (the fused add), and the output gradient dy:
//   g = dy * w,  ds = rstd * (g - s * rstd^2 * mean(g * s)),  dw = sum over rows of dy * s * rstd.
// The fused add adds residual_out's own gradient to ds and stores it twice: dx in dy's
// dtype, dresidual in residual_out's.
//
// Parallelisation: a persistent grid, as many CTAs as fit the SMs at once; a CTA walks rows
// blockIdx.x, blockIdx.x + gridDim.x, ... A thread owns the same columns in every row
// (VEC-element groups t, t + THREADS, ...), so its share of dweight stays in registers
// across the CTA's rows and is written once, as the CTA's fp32 row of a partials buffer;
// a second kernel sums the partials rows in a fixed order: dweight is deterministic, no
// atomics (its warps read rows of the partials in parallel, each column in one order). A
// row that fits the CTA (VPT groups a thread) is held in registers: s and dy
// read once, both row sums (s^2, g * s) reduced together. Wider rows go in CTA-wide chunks,
// twice: sum, then re-read (from L2), ds, and the chunk's dweight share added into the
// CTA's partials row (its own: no other CTA touches it). rstd is recomputed from s, which
// is read anyway, so the forward saves nothing.
//
// Vectors: 16-byte groups of dy's elements where every row of every tensor starts on a
// 16-byte boundary and N is a whole number of groups (the host checks); otherwise one
// element a group (odd widths, offsets), in the chunked kernel.
//
// Precision: fp32 math on upcast inputs, each output cast once at its store. The weight is
// read as fp32 (the host converts a 16-bit weight once, N elements).
//
// Learned from: Apex's fused layer-norm backward (partial dweight per block, a second
// reduction kernel), QuACK's rmsnorm backward (persistent CTAs, partials per CTA).

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "rms_norm.h"
#include "rms_norm_device.cuh"

namespace cuda_impl {
namespace {

// VEC consecutive elements of E at p as floats: 16-byte loads when VEC * sizeof(E) is a
// whole number of them (the caller guarantees alignment), element loads otherwise.
template <typename E, int VEC>
__device__ __forceinline__ void load_group(const E* __restrict__ p, float (&out)[VEC]) {
  if constexpr ((VEC * sizeof(E)) % 16 == 0) {
    constexpr int kPer = kVec<E>;
#pragma unroll
    for (int v = 0; v < VEC / kPer; ++v) {
      Pack<E> u;
      u.raw = *reinterpret_cast<const uint4*>(p + v * kPer);
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[v * kPer + i] = to_float(u.e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(p[i]);
  }
}

template <typename E, int VEC>
__device__ __forceinline__ void store_group(E* __restrict__ p, const float (&in)[VEC]) {
  if constexpr ((VEC * sizeof(E)) % 16 == 0) {
    constexpr int kPer = kVec<E>;
#pragma unroll
    for (int v = 0; v < VEC / kPer; ++v) {
      Pack<E> u;
#pragma unroll
      for (int i = 0; i < kPer; ++i) u.e[i] = from_float<E>(in[v * kPer + i]);
      *reinterpret_cast<uint4*>(p + v * kPer) = u.raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = from_float<E>(in[i]);
  }
}

// A group's raw bits, held through the reduction instead of its floats (half the registers
// for 16-bit data) and converted again where they are used.
template <typename E, int VEC>
struct Raw {
  static constexpr int kRegs = (VEC * static_cast<int>(sizeof(E)) + 15) / 16;
  uint4 r[kRegs];
};

template <typename E, int VEC>
__device__ __forceinline__ void load_raw(const E* __restrict__ p, Raw<E, VEC>& out) {
#pragma unroll
  for (int v = 0; v < Raw<E, VEC>::kRegs; ++v) out.r[v] = reinterpret_cast<const uint4*>(p)[v];
}

template <typename E, int VEC>
__device__ __forceinline__ void unpack(const Raw<E, VEC>& raw, float (&out)[VEC]) {
  const E* e = reinterpret_cast<const E*>(raw.r);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(e[i]);
}

// The two row sums over the CTA: warp shuffles, then the warps' partials through shared
// memory (every thread calls it; `red` holds 2 floats a warp).
template <int THREADS>
__device__ __forceinline__ float2 block_sum2(float a, float b, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  constexpr int kWarps = THREADS / 32;
  if constexpr (kWarps > 1) {
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
      red[2 * warp] = a;
      red[2 * warp + 1] = b;
    }
    __syncthreads();
    a = 0.f;
    b = 0.f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) {  // same order in every thread: one result
      a += red[2 * i];
      b += red[2 * i + 1];
    }
    __syncthreads();  // red is reused by the next row
  }
  return make_float2(a, b);
}

struct BwdArgs {
  const void* s;    // x or residual_out rows
  const void* dy;   // dy rows (dy's dtype: T)
  const float* w;   // fp32 weight, or null
  const void* dro;  // d_residual_out rows (S), or null
  void* ds;         // dx rows (T)
  void* ds2;        // dresidual rows (S), or null
  float* dwp;       // partials: gridDim.x rows of N fp32
  int64_t stride_s, stride_dy, stride_dro, stride_ds, stride_ds2;
  int64_t M;
  int N;
  float eps;
};

// T: dy's and dx's dtype; S: s's (and d_residual_out's, dresidual's). VPT groups of VEC
// elements a thread; CHUNKED: the row in chunks of THREADS * VPT * VEC elements.
template <typename T, typename S, int THREADS, int VPT, int VEC, bool CHUNKED>
__global__ void __launch_bounds__(THREADS) rms_norm_bwd_kernel(BwdArgs a) {
  constexpr int kElems = VPT * VEC;
  constexpr int kChunk = THREADS * kElems;
  __shared__ float red[2 * (THREADS / 32)];
  const int t = threadIdx.x;
  const int N = a.N;
  const float inv_n = 1.f / static_cast<float>(N);
  float* dwp = a.dwp + static_cast<int64_t>(blockIdx.x) * N;
  float dw[kElems];
  if constexpr (!CHUNKED) {
#pragma unroll
    for (int e = 0; e < kElems; ++e) dw[e] = 0.f;
  }
  for (int64_t row = blockIdx.x; row < a.M; row += gridDim.x) {
    const S* sr = static_cast<const S*>(a.s) + row * a.stride_s;
    const T* dyr = static_cast<const T*>(a.dy) + row * a.stride_dy;
    const S* dror = a.dro ? static_cast<const S*>(a.dro) + row * a.stride_dro : nullptr;
    T* dsr = static_cast<T*>(a.ds) + row * a.stride_ds;
    S* ds2r = a.ds2 ? static_cast<S*>(a.ds2) + row * a.stride_ds2 : nullptr;
    if constexpr (!CHUNKED) {
      // the row in registers, as raw bits: VEC-groups whole inside the row (the host
      // checked N); the weight comes from L1 each time (fewer registers, more CTAs an SM)
      Raw<S, VEC> sraw[VPT];
      Raw<T, VEC> draw[VPT];
      float ss = 0.f, gs = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (k * THREADS + t) * VEC;
        if (c >= N) continue;
        load_raw<S, VEC>(sr + c, sraw[k]);
        load_raw<T, VEC>(dyr + c, draw[k]);
      }
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (k * THREADS + t) * VEC;
        if (c >= N) continue;
        float sv[VEC], dv[VEC];
        unpack<S, VEC>(sraw[k], sv);
        unpack<T, VEC>(draw[k], dv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float wi = a.w ? __ldg(a.w + c + i) : 1.f;
          ss = fmaf(sv[i], sv[i], ss);
          gs = fmaf(dv[i] * wi, sv[i], gs);
        }
      }
      const float2 sums = block_sum2<THREADS>(ss, gs, red);
      const float rstd = rsqrtf(sums.x * inv_n + a.eps);
      const float c2 = sums.y * inv_n * rstd * rstd;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (k * THREADS + t) * VEC;
        if (c >= N) continue;
        float sv[VEC], dv[VEC], out[VEC], dro[VEC];
        unpack<S, VEC>(sraw[k], sv);
        unpack<T, VEC>(draw[k], dv);
        if (dror) load_group<S, VEC>(dror + c, dro);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float wi = a.w ? __ldg(a.w + c + i) : 1.f;
          out[i] = (dv[i] * wi - sv[i] * c2) * rstd + (dror ? dro[i] : 0.f);
          dw[k * VEC + i] = fmaf(dv[i] * sv[i], rstd, dw[k * VEC + i]);
        }
        store_group<T, VEC>(dsr + c, out);
        if (ds2r) store_group<S, VEC>(ds2r + c, out);
      }
    } else {
      // sweep 1: both sums, chunk by chunk
      float ss = 0.f, gs = 0.f;
      for (int base = 0; base < N; base += kChunk) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = base + (k * THREADS + t) * VEC;
          if (c >= N) continue;
          float sv[VEC], dv[VEC];
          load_group<S, VEC>(sr + c, sv);
          load_group<T, VEC>(dyr + c, dv);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float wi = a.w ? a.w[c + i] : 1.f;
            ss = fmaf(sv[i], sv[i], ss);
            gs = fmaf(dv[i] * wi, sv[i], gs);
          }
        }
      }
      const float2 sums = block_sum2<THREADS>(ss, gs, red);
      const float rstd = rsqrtf(sums.x * inv_n + a.eps);
      const float c2 = sums.y * inv_n * rstd * rstd;
      // sweep 2: re-read (L2), ds, this row's dweight share into the CTA's partials row
      for (int base = 0; base < N; base += kChunk) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = base + (k * THREADS + t) * VEC;
          if (c >= N) continue;
          float sv[VEC], dv[VEC], out[VEC], dro[VEC];
          load_group<S, VEC>(sr + c, sv);
          load_group<T, VEC>(dyr + c, dv);
          if (dror) load_group<S, VEC>(dror + c, dro);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float wi = a.w ? a.w[c + i] : 1.f;
            out[i] = (dv[i] * wi - sv[i] * c2) * rstd + (dror ? dro[i] : 0.f);
            // the same thread owns these columns in every row of this CTA
            if (a.w) dwp[c + i] = fmaf(dv[i] * sv[i], rstd, row == blockIdx.x ? 0.f : dwp[c + i]);
          }
          store_group<T, VEC>(dsr + c, out);
          if (ds2r) store_group<S, VEC>(ds2r + c, out);
        }
      }
    }
  }
  if constexpr (!CHUNKED) {
    if (a.w == nullptr) return;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * THREADS + t) * VEC;
#pragma unroll
      for (int i = 0; i < VEC; ++i)
        if (c + i < N) dwp[c + i] = dw[k * VEC + i];
    }
  }
}

// dweight[c] = sum over the P partials rows, cast once. A block takes 32 columns (a warp's
// coalesced 128 bytes) and kSlices warps: warp j sums rows j, j + kSlices, ... in order,
// then one thread a column adds the warps' sums in order; the same order every run.
constexpr int kSlices = 8;
template <typename W>
__global__ void __launch_bounds__(32 * kSlices) dw_reduce_kernel(const float* __restrict__ dwp,
                                                                 W* dw, int P, int N) {
  __shared__ float part[kSlices][32];
  const int lane = threadIdx.x % 32;
  const int slice = threadIdx.x / 32;
  const int c = blockIdx.x * 32 + lane;
  float acc = 0.f;
  if (c < N) {
#pragma unroll 4
    for (int p = slice; p < P; p += kSlices) acc += dwp[static_cast<int64_t>(p) * N + c];
  }
  part[slice][lane] = acc;
  __syncthreads();
  if (slice == 0 && c < N) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kSlices; ++j) sum += part[j][lane];
    dw[c] = from_float<W>(sum);
  }
}

// ---- launch ---------------------------------------------------------------------------
// Groups a thread for the register-resident rows; the widest such row is 1024 threads' worth.
constexpr int kVpt = 2;
constexpr int kScalarVpt = 4;  // elements a thread a chunk, one-element groups

using KernelPtr = void (*)(BwdArgs);

// The CTAs that fit the GPU at once for this kernel (a persistent grid), at most M. The
// occupancy is asked once per kernel and device.
int persistent_ctas(KernelPtr kernel, int threads, int64_t M, int device) {
  static std::mutex mu;
  static std::map<std::pair<KernelPtr, int>, int> per_sm_of;
  int per_sm = 0;
  {
    const std::lock_guard<std::mutex> lock(mu);
    auto it = per_sm_of.find({kernel, device});
    if (it == per_sm_of.end()) {
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
      per_sm_of[{kernel, device}] = per_sm;
    } else {
      per_sm = it->second;
    }
  }
  const int64_t fit = int64_t(per_sm) * sm_count(device);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(M, fit)));
}

template <typename T, typename S>
void pick(int N, bool vec_ok, KernelPtr& kernel, int& threads) {
  constexpr int V = kVec<T>;
  const int groups = (N + V - 1) / V;
  if (vec_ok && groups <= 1024 * kVpt) {
    if (groups <= 64 * kVpt) {
      kernel = rms_norm_bwd_kernel<T, S, 64, kVpt, V, false>, threads = 64;
    } else if (groups <= 128 * kVpt) {
      kernel = rms_norm_bwd_kernel<T, S, 128, kVpt, V, false>, threads = 128;
    } else if (groups <= 256 * kVpt) {
      kernel = rms_norm_bwd_kernel<T, S, 256, kVpt, V, false>, threads = 256;
    } else if (groups <= 512 * kVpt) {
      kernel = rms_norm_bwd_kernel<T, S, 512, kVpt, V, false>, threads = 512;
    } else {
      kernel = rms_norm_bwd_kernel<T, S, 1024, kVpt, V, false>, threads = 1024;
    }
  } else if (vec_ok) {
    kernel = rms_norm_bwd_kernel<T, S, 1024, kVpt, V, true>, threads = 1024;
  } else {
    kernel = rms_norm_bwd_kernel<T, S, 1024, kScalarVpt, 1, true>, threads = 1024;
  }
}

// Whether every row of t starts on a 16-byte boundary, for groups of `vec` elements.
bool rows_aligned(const at::Tensor& t, int64_t stride, int vec) {
  return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0 && stride % vec == 0;
}

at::Tensor rows_of(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// ds (and ds2) for s's rows; returns dweight (undefined without a weight).
at::Tensor run_backward(const at::Tensor& dy_in, const at::Tensor& s_in,
                        const std::optional<at::Tensor>& weight, double eps,
                        const std::optional<at::Tensor>& dro_in, at::Tensor& ds,
                        at::Tensor* ds2) {
  const int N = static_cast<int>(s_in.size(-1));
  const at::Tensor dy = rows_of(dy_in.stride(-1) == 1 ? dy_in : dy_in.contiguous());
  const at::Tensor s = rows_of(s_in);
  const at::Tensor dro =
      dro_in ? rows_of(dro_in->stride(-1) == 1 ? *dro_in : dro_in->contiguous()) : at::Tensor();
  const at::Tensor ds_rows = ds.view({-1, N});
  const at::Tensor ds2_rows = ds2 ? ds2->view({-1, N}) : at::Tensor();
  const int64_t M = s.size(0);
  const bool has_w = weight.has_value() && weight->defined();
  const at::Tensor w32 = has_w ? weight->to(at::kFloat).contiguous() : at::Tensor();
  const int vec = 16 / static_cast<int>(dy.element_size());
  bool vec_ok = N % vec == 0 && rows_aligned(s, s.stride(0), vec) &&
                rows_aligned(dy, dy.stride(0), vec) && rows_aligned(ds_rows, N, vec);
  if (dro.defined()) vec_ok = vec_ok && rows_aligned(dro, dro.stride(0), vec);
  if (ds2) vec_ok = vec_ok && rows_aligned(ds2_rows, N, vec);

  KernelPtr kernel = nullptr;
  int threads = 0;
  const auto dt = dy.scalar_type();
  const bool s32 = s.scalar_type() == at::kFloat;
  if (dt == at::kFloat) {
    pick<float, float>(N, vec_ok, kernel, threads);
  } else if (dt == at::kHalf) {
    s32 ? pick<__half, float>(N, vec_ok, kernel, threads)
        : pick<__half, __half>(N, vec_ok, kernel, threads);
  } else {
    s32 ? pick<__nv_bfloat16, float>(N, vec_ok, kernel, threads)
        : pick<__nv_bfloat16, __nv_bfloat16>(N, vec_ok, kernel, threads);
  }
  const int ctas = persistent_ctas(kernel, threads, M, s.get_device());
  at::Tensor dwp = at::empty({has_w ? ctas : 1, N}, s.options().dtype(at::kFloat));
  auto stream = at::cuda::getCurrentCUDAStream();
  if (M > 0) {
    BwdArgs a{s.data_ptr(),
              dy.data_ptr(),
              has_w ? w32.data_ptr<float>() : nullptr,
              dro.defined() ? dro.data_ptr() : nullptr,
              ds_rows.data_ptr(),
              ds2 ? ds2_rows.data_ptr() : nullptr,
              dwp.data_ptr<float>(),
              s.stride(0),
              dy.stride(0),
              dro.defined() ? dro.stride(0) : 0,
              N,
              N,
              M,
              N,
              static_cast<float>(eps)};
    kernel<<<ctas, threads, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (!has_w) return at::Tensor();
  at::Tensor dw = at::empty({N}, weight->options().memory_format(at::MemoryFormat::Contiguous));
  if (M == 0) return dw.zero_();
  const int blocks = (N + 31) / 32;
  constexpr int kReduceThreads = 32 * kSlices;
  switch (weight->scalar_type()) {
    case at::kFloat:
      dw_reduce_kernel<float><<<blocks, kReduceThreads, 0, stream>>>(dwp.data_ptr<float>(),
                                                          dw.data_ptr<float>(), ctas, N);
      break;
    case at::kHalf:
      dw_reduce_kernel<__half><<<blocks, kReduceThreads, 0, stream>>>(
          dwp.data_ptr<float>(), reinterpret_cast<__half*>(dw.data_ptr()), ctas, N);
      break;
    default:
      dw_reduce_kernel<__nv_bfloat16><<<blocks, kReduceThreads, 0, stream>>>(
          dwp.data_ptr<float>(), reinterpret_cast<__nv_bfloat16*>(dw.data_ptr()), ctas, N);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return dw;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                     const std::optional<at::Tensor>& weight,
                                                     double eps) {
  check_backward_inputs(dy, x, weight, eps, std::nullopt, false);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0 && !weight) return {dx, x.new_empty({0})};
  at::Tensor dw = run_backward(dy, x, weight, eps, std::nullopt, dx, nullptr);
  return {dx, dw.defined() ? dw : x.new_empty({0})};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_backward(
    const at::Tensor& dy, const std::optional<at::Tensor>& d_residual_out,
    const at::Tensor& residual_out, const std::optional<at::Tensor>& weight, double eps) {
  check_backward_inputs(dy, residual_out, weight, eps, d_residual_out, true);
  const c10::cuda::CUDAGuard guard(residual_out.device());
  const auto contiguous = residual_out.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor dx = at::empty(residual_out.sizes(), contiguous.dtype(dy.scalar_type()));
  at::Tensor dres = at::empty(residual_out.sizes(), contiguous);
  at::Tensor dw = run_backward(dy, residual_out, weight, eps, d_residual_out, dx, &dres);
  return {dx, dres, dw.defined() ? dw : residual_out.new_empty({0})};
}

TORCH_LIBRARY_IMPL(cuda_impl, CUDA, m) {
  m.impl("rms_norm_backward", &rms_norm_backward);
  m.impl("fused_add_rms_norm_backward", &fused_add_rms_norm_backward);
}

}  // namespace cuda_impl
