// The CUDA forward's host side: argument checks done, the plan (a config of the op's table
// and the CTAs sharing a row), the launch, and the ops' CUDA entry points. The kernels are
// compiled in the forward_<op>_<dtype>.cu units (forward_kernels.cuh); this file only
// declares them, so a kernel change rebuilds its units and a dispatch change this file.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "forward_table.h"
#include "rms_norm.h"
#include "rms_norm_device.cuh"

namespace cuda_impl {

// Defined in the op's unit for x's dtype (forward_kernels.cuh).
template <typename T, typename W, typename R>
KernelFn<T, W, R> kernel_at(int i);
template <typename T, typename R>
KernelFn<T, T, R> kernel_plus_one_at(int i);
template <typename T>
KernelFn<T, T, void> kernel_heads_at(int i, bool one);

// SMs of a device, asked once per device.
int sm_count(int device) { return device_attribute<cudaDevAttrMultiProcessorCount>(device); }

// Cached here, not by device_attribute, whose "not asked" is 0, which a minor version can be.
int sm_version(int device) {
  static int cache[64] = {};
  if (device < 0 || device >= 64) return 0;
  if (cache[device] == 0) {
    cache[device] = device_attribute<cudaDevAttrComputeCapabilityMajor>(device) * 10 +
                    device_attribute<cudaDevAttrComputeCapabilityMinor>(device);
  }
  return cache[device];
}

namespace {
std::atomic<bool> g_no_clusters{false};
}  // namespace

void pretend_no_clusters(bool on) { g_no_clusters.store(on, std::memory_order_relaxed); }

bool has_clusters(int device) {
  return !g_no_clusters.load(std::memory_order_relaxed) &&
         device_attribute<cudaDevAttrComputeCapabilityMajor>(device) >= 9;
}

namespace {

inline bool aligned16_host(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Which config of a table, and how many CTAs share a row (1 unless the config is a cluster).
struct Plan {
  int config;
  int ranks;
};

// Vectors a row may have under plan p: a row-chunk config walks a row of any width.
template <typename Tb>
int capacity(const Plan& p) {
  const Config& c = kConfigs<Tb>[p.config];
  return (c.variant & kRowChunks) != 0 ? static_cast<int>(kMaxN) : c.row_threads * c.vpt * p.ranks;
}

// The config of the first rung of `ladder` that takes rows of `vecs` vectors, or -1.
template <typename Tb>
int climb(Ladder ladder, int vecs) {
  for (int i = 0; i < kNumRungs<Tb>; ++i) {
    if (Tb::kRungs[i].ladder == ladder && vecs <= Tb::kRungs[i].max_vecs)
      return kRungConfig<Tb>[i];
  }
  return -1;
}

// The fewest CTAs (2, 4, 8 or, staged, 16) of cluster config c that hold a row of `vecs`
// vectors.
inline int fewest_ranks(const Config& c, int vecs) {
  int ranks = 2;
  while (ranks * c.row_threads * c.vpt < vecs) ranks *= 2;
  return ranks;
}

// The config of the last rung of `ladder`, or -1 where the table has none.
template <typename Tb>
int last_rung(Ladder ladder) {
  int c = -1;
  for (int i = 0; i < kNumRungs<Tb>; ++i) {
    if (Tb::kRungs[i].ladder == ladder) c = kRungConfig<Tb>[i];
  }
  return c;
}

// The default plan for rows of `vecs` vectors of `elem`-byte elements, `rows` of them on a
// GPU of `sms` SMs (rows = 0: many); `vectors`: every access of every row a whole aligned
// 16-byte vector (row_vectors, and y's rows aligned); `clusters`: the GPU has thread-block
// clusters. Without them a row past the many-row ladder takes the row-chunk body, which
// walks a row of any width and alignment in one CTA (rms_norm), or no config (-1: the fused
// add has no such body).
template <typename Tb>
Plan default_plan(int vecs, int elem, int64_t rows, int sms, bool vectors, bool clusters) {
  if (vectors && vecs > kRereadMinVecs && (rows == 0 || rows >= sms)) {
    const int c = climb<Tb>(elem == 4 ? Ladder::kReread32 : Ladder::kReread16, vecs);
    if (c >= 0) return {c, 1};
  }
  if (vectors && elem == 2 && vecs > 0 && vecs % kRowChunkVecs == 0) {
    const int c = climb<Tb>(Ladder::kRows16, vecs);
    if (c >= 0) return {c, 1};
  }
  const int whole_min = elem == 2 ? Tb::kWholeMinN16 : Tb::kWholeMinN32;
  if (clusters && vectors && vecs * (16 / elem) >= whole_min) {
    const int c = climb<Tb>(Ladder::kWhole, vecs);
    if (c >= 0) return {c, fewest_ranks(kConfigs<Tb>[c], vecs)};
  }
  int config = climb<Tb>(elem == 4 ? Ladder::kMany32 : Ladder::kMany16, vecs);
  if (!vectors && elem == 2 && vecs > kOddMinVecs) {
    const int odd = climb<Tb>(Ladder::kOdd16, vecs);
    if (odd >= 0) config = odd;
  }
  if (config >= 0 && rows > 0) {
    const Config c = kConfigs<Tb>[config];
    const int per_block = block_threads(c.row_threads) / c.row_threads;
    const int64_t groups = (rows + per_block - 1) / per_block;
    const int few = climb<Tb>(Ladder::kFew, vecs);
    if (groups < sms && few >= 0) config = few;
  }
  if (config >= 0) return {config, 1};
  if (!clusters) return {last_rung<Tb>(Ladder::kRows16), 1};
  const int cluster = climb<Tb>(elem == 4 ? Ladder::kCluster32 : Ladder::kCluster16, vecs);
  return {cluster, fewest_ranks(kConfigs<Tb>[cluster], vecs)};
}

// Launch `kernel` (a kernel of config c) over M rows, as a cluster launch when c is one;
// stage_bytes: the shared memory a staged config takes for each of a slice's x vectors.
template <typename Kernel, typename... Args>
void launch_kernel(const char* impl, const Config& c, int ranks, int64_t M, int stage_bytes,
                   Kernel kernel, Args... args) {
  const int block = block_threads(c.row_threads), rows = block / c.row_threads;
  const int64_t blocks = c.cluster ? M * ranks : (M + rows - 1) / rows;
  TORCH_CHECK_VALUE(blocks <= INT32_MAX, impl, ": x has ", num(M),
                    " rows, more than one launch can cover");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // a staged row's slice; past the 48 KB a kernel gets without asking, asked for (set per
  // launch: the attribute belongs to the current device's context, and such a launch, a
  // row of 128 KB or more, is long). The 48 KB count the kernel's static shared memory
  // too (its warp sums, cluster partials and barrier: at most 2.2 KB), so from 44 KB.
  const int smem = (c.variant & kStagedRow) != 0 ? block * c.vpt * stage_bytes : 0;
  if (smem > 44 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // so, too, a cluster past the portable 8 CTAs (staged rows only)
  if (ranks > kMaxClusterRanks)
    C10_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  if (c.cluster) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        cluster_launch_config(dim3(static_cast<unsigned>(blocks)), block,
                              static_cast<size_t>(smem), stream, dim3(ranks), &attr);
    C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
  } else {
    kernel<<<static_cast<unsigned>(blocks), block, smem, stream>>>(args...);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Whether every row of t (2-D, stride 1 along a row) starts 16-byte aligned.
template <typename T>
bool rows_aligned(const at::Tensor& t) {
  return aligned16_host(t.const_data_ptr()) && (t.size(0) == 1 || t.stride(0) % kVec<T> == 0);
}

// Whether every access to x and the weight is a whole aligned 16-byte vector: N a multiple
// of a vector, x's rows and the weight (when there is one) 16-byte aligned. A launch's
// accesses all are when y's rows are aligned too (a new, contiguous y's are).
template <typename T>
bool row_vectors(const at::Tensor& x2, const at::Tensor& w) {
  return x2.size(1) % kVec<T> == 0 && rows_aligned<T>(x2) &&
         (!w.defined() || aligned16_host(w.const_data_ptr()));
}

// What an op launches for x2's dtype and width: the forced plan or the default one; a
// cluster plan only on a GPU that has clusters. vectors: every access of the launch a
// whole aligned vector (row_vectors, and y's rows aligned).
template <typename T, typename Tb>
Plan plan_for(const char* impl, const at::Tensor& x2, const std::optional<Plan>& forced,
              bool vectors) {
  const int N = static_cast<int>(x2.size(1));
  const int vecs = N / kVec<T>;  // body vectors a row can have, at most
  const int device = x2.device().index();
  const bool clusters = has_clusters(device);
  const Plan plan =
      forced.has_value()
          ? *forced
          : default_plan<Tb>(vecs, sizeof(T), x2.size(0), sm_count(device), vectors, clusters);
  if (plan.config < 0) {
    const int many = last_rung<Tb>(sizeof(T) == 4 ? Ladder::kMany32 : Ladder::kMany16);
    TORCH_CHECK_VALUE(false, impl, ": N = ", num(N),
                      " needs thread-block clusters (sm_90 or newer), which this GPU has not; "
                      "without them a row holds at most ",
                      num(capacity<Tb>({many, 1}) * kVec<T>), " elements");
  }
  TORCH_CHECK_VALUE(clusters || !kConfigs<Tb>[plan.config].cluster, impl, ": config (",
                    num(kConfigs<Tb>[plan.config].row_threads), ", ",
                    num(kConfigs<Tb>[plan.config].vpt),
                    ") is a cluster config; this GPU has no thread-block clusters (sm_90 or "
                    "newer)");
  const Config& c = kConfigs<Tb>[plan.config];
  TORCH_CHECK_VALUE(vecs <= capacity<Tb>(plan), impl, ": config (", num(c.row_threads), ", ",
                    num(c.vpt), ", cluster ", num(plan.ranks), ") holds ",
                    num(capacity<Tb>(plan) * kVec<T>), " elements a row; N is ", num(N));
  return plan;
}

// The kernel of a planned config. one (a weight offset of 1): its plus-one kernel, which the
// build has for a 16-bit x with a weight and a residual of its dtype at the configs their
// ladders name; null where it has none (the launch then reads an fp32 weight + 1).
template <typename T, typename W, typename R>
KernelFn<T, W, R> kernel_for(int config, bool one) {
  if constexpr (sizeof(T) == 2 && std::is_same_v<W, T> &&
                (std::is_void_v<R> || std::is_same_v<R, T>)) {
    if (one) return kernel_plus_one_at<T, R>(config);
  }
  return one ? nullptr : kernel_at<T, W, R>(config);
}

template <typename T, typename W>
void launch(const at::Tensor& x2, const at::Tensor& weight, at::Tensor& y2, float eps,
            const std::optional<Plan>& forced, bool one) {
  constexpr const char* kImpl = "cuda_impl.rms_norm";
  const W* w = weight.defined() ? reinterpret_cast<const W*>(weight.const_data_ptr()) : nullptr;
  const int64_t M = x2.size(0);
  const int N = static_cast<int>(x2.size(1));
  const bool vectors = row_vectors<T>(x2, weight) && rows_aligned<T>(y2);
  const Plan plan = plan_for<T, PlainTable>(kImpl, x2, forced, vectors);
  const KernelFn<T, W, void> kernel = kernel_for<T, W, void>(plan.config, one);
  if (kernel == nullptr)  // one, without its kernel here
    return launch<T, float>(x2, weight_as_read(weight, 1.0), y2, eps, forced, false);
  launch_kernel(kImpl, kConfigs<PlainTable>[plan.config], plan.ranks, M, 16, kernel,
                reinterpret_cast<const T*>(x2.const_data_ptr()), w,
                reinterpret_cast<T*>(y2.mutable_data_ptr()), x2.stride(0), y2.stride(0), N, eps,
                nullptr, nullptr, int64_t{0}, int64_t{0}, M, int64_t{0}, int64_t{0});
}

template <typename T, typename W, typename R>
void launch_fused(const at::Tensor& x2, const at::Tensor& r2, const at::Tensor& weight,
                  at::Tensor& y2, at::Tensor& ro2, float eps, const std::optional<Plan>& forced,
                  bool one) {
  constexpr const char* kImpl = "cuda_impl.fused_add_rms_norm";
  const W* w = weight.defined() ? reinterpret_cast<const W*>(weight.const_data_ptr()) : nullptr;
  const int64_t M = x2.size(0);
  const int N = static_cast<int>(x2.size(1));
  // whole vectors: as rms_norm's, and the residual's rows and residual_out's aligned too; a
  // residual of x's dtype only (an fp32 residual beside 16-bit x keeps the general clusters)
  const bool vectors = sizeof(R) == sizeof(T) && row_vectors<T>(x2, weight) &&
                       rows_aligned<T>(y2) && rows_aligned<R>(r2) && rows_aligned<R>(ro2);
  const Plan plan = plan_for<T, FusedTable>(kImpl, x2, forced, vectors);
  const KernelFn<T, W, R> kernel = kernel_for<T, W, R>(plan.config, one);
  if (one && kernel == nullptr)  // one, without its kernel here
    return launch_fused<T, float, R>(x2, r2, weight_as_read(weight, 1.0), y2, ro2, eps, forced,
                                     false);
  // only a forced config can be one the default build leaves out for this dtype
  TORCH_CHECK_VALUE(kernel != nullptr, "cuda_impl.fused_add_rms_norm_with_config: config (",
                    num(kConfigs<FusedTable>[plan.config].row_threads), ", ",
                    num(kConfigs<FusedTable>[plan.config].vpt),
                    ") is compiled only for the dtypes whose ladders name it, not for x's; see "
                    "cuda_impl.compiled_configs('fused_add_rms_norm')");
  launch_kernel(kImpl, kConfigs<FusedTable>[plan.config], plan.ranks, M,
                static_cast<int>(16 * (1 + sizeof(R) / sizeof(T))), kernel,
                reinterpret_cast<const T*>(x2.const_data_ptr()), w,
                reinterpret_cast<T*>(y2.mutable_data_ptr()), x2.stride(0), y2.stride(0), N, eps,
                reinterpret_cast<const R*>(r2.const_data_ptr()),
                reinterpret_cast<R*>(ro2.mutable_data_ptr()), r2.stride(0), ro2.stride(0), M,
                int64_t{0}, int64_t{0});
}

// The things done per (x dtype, weight dtype[, residual dtype]): launching either op, and
// describing rms_norm's launch.
struct Launch {
  template <typename T, typename W>
  static void apply(const at::Tensor& x2, const at::Tensor& w, at::Tensor& y2, float eps,
                    const std::optional<Plan>& plan, bool one) {
    launch<T, W>(x2, w, y2, eps, plan, one);
  }
};

struct LaunchFused {
  template <typename T, typename W>
  static void apply(const at::Tensor& x2, const at::Tensor& r2, const at::Tensor& w,
                    at::Tensor& y2, at::Tensor& ro2, float eps, const std::optional<Plan>& plan,
                    bool one) {
    if (r2.scalar_type() == at::kFloat)
      return launch_fused<T, W, float>(x2, r2, w, y2, ro2, eps, plan, one);
    return launch_fused<T, W, T>(x2, r2, w, y2, ro2, eps, plan, one);
  }
};

struct Describe {
  // out: row_threads, vpt, ranks, variant, registers, local bytes, static shared bytes,
  // max threads; of the launch into a new (contiguous, aligned) y
  template <typename T, typename W>
  static void apply(const at::Tensor& x2, const at::Tensor& w, std::vector<int64_t>& out) {
    const Plan plan =
        plan_for<T, PlainTable>("cuda_impl.rms_norm", x2, std::nullopt, row_vectors<T>(x2, w));
    cudaFuncAttributes attr = {};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel_at<T, W, void>(plan.config)));
    const Config& c = kConfigs<PlainTable>[plan.config];
    out = {c.row_threads,
           c.vpt,
           plan.ranks,
           c.variant,
           attr.numRegs,
           static_cast<int64_t>(attr.localSizeBytes),
           static_cast<int64_t>(attr.sharedSizeBytes),
           attr.maxThreadsPerBlock};
  }
};

// F::apply<T, W>(args...) for x's dtype and the weight's (x's dtype, fp32, or none).
template <typename F, typename... Args>
void dispatch(at::ScalarType x_type, const at::Tensor& w, Args&&... args) {
  const bool w_fp32 = w.defined() && w.scalar_type() == at::kFloat;
  switch (x_type) {
    case at::kFloat:
      return F::template apply<float, float>(std::forward<Args>(args)...);
    case at::kHalf:
      if (w_fp32) return F::template apply<__half, float>(std::forward<Args>(args)...);
      return F::template apply<__half, __half>(std::forward<Args>(args)...);
    case at::kBFloat16:
      if (w_fp32) return F::template apply<__nv_bfloat16, float>(std::forward<Args>(args)...);
      return F::template apply<__nv_bfloat16, __nv_bfloat16>(std::forward<Args>(args)...);
    default:
      TORCH_CHECK_TYPE(false, "cuda_impl: unsupported dtype ", x_type);
  }
}

// rms_norm of head rows x into y (new and contiguous, or x itself: out=x) with the head-row
// kernel of the default plan's config, a weight of x's dtype or none; false (nothing
// launched) where that config has none (rows of more than kHeadsMaxVecs vectors, another
// weight dtype): the caller then copies x into rows.
template <typename T>
bool launch_heads(const at::Tensor& x, const at::Tensor& w, at::Tensor& y, float eps, bool one) {
  const int64_t H = x.size(-2), N = x.size(-1);
  const at::Tensor x3 = x.view({-1, H, N});  // head rows, or rows (a weight row a head)
  const at::Tensor y3 = y.view({-1, H, N});
  const int64_t M = x3.size(0) * H;
  const int vecs = static_cast<int>(N) / kVec<T>;
  const int device = x.device().index();
  const Plan plan = default_plan<PlainTable>(vecs, sizeof(T), M, sm_count(device), false,
                                             has_clusters(device));
  if (plan.config < 0 || kConfigs<PlainTable>[plan.config].cluster ||
      vecs > capacity<PlainTable>(plan))
    return false;
  const KernelFn<T, T, void> kernel = kernel_heads_at<T>(plan.config, one);
  if (kernel == nullptr) return false;
  const T* wp = w.defined() ? reinterpret_cast<const T*>(w.const_data_ptr()) : nullptr;
  // the fused add's residual arguments carry x's step between heads and the heads (kHeads)
  launch_kernel("cuda_impl.rms_norm", kConfigs<PlainTable>[plan.config], 1, M, 16, kernel,
                reinterpret_cast<const T*>(x3.const_data_ptr()), wp,
                reinterpret_cast<T*>(y3.mutable_data_ptr()), x3.stride(0), y3.stride(0),
                static_cast<int>(N), eps, nullptr, nullptr, x3.stride(1), H, M, y3.stride(1),
                w.defined() && w.dim() == 2 ? N : int64_t{0});
  return true;
}

bool run_heads(const at::Tensor& x, const at::Tensor& w, at::Tensor& y, float eps, bool one) {
  if (w.defined() && w.scalar_type() != x.scalar_type()) return false;
  switch (x.scalar_type()) {
    case at::kFloat:
      return launch_heads<float>(x, w, y, eps, one);
    case at::kHalf:
      return launch_heads<__half>(x, w, y, eps, one);
    case at::kBFloat16:
      return launch_heads<__nv_bfloat16>(x, w, y, eps, one);
    default:
      return false;
  }
}

// Dispatch on x's dtype and the weight's (x's dtype, fp32, or none); head rows (a default
// plan) to their kernel where it has one. Into head rows (out=x) the kernel does not
// reach: normalised into a new tensor, then copied into y.
void run(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
         double weight_offset, at::Tensor& y, const std::optional<Plan>& plan = std::nullopt) {
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const bool per_head = weight && weight->dim() == 2;  // a weight row a head
  if (per_head && !plan && views_as_heads(x)) {  // heads the kernel addresses in place
    const bool one = weight_offset == 1.0;
    const at::Tensor w = weight_as_read(weight, one ? 0.0 : weight_offset);
    if (run_heads(x, w, y, static_cast<float>(eps), one)) return;
  }
  if (per_head) {  // else each head's rows with its row
    for (int64_t h = 0; h < weight->size(0); ++h) {
      at::Tensor y_h = y.select(-2, h);
      run(x.select(-2, h), weight->select(0, h), eps, weight_offset, y_h, plan);
    }
    return;
  }
  const bool one = weight_offset == 1.0;
  const at::Tensor w = weight_as_read(weight, one ? 0.0 : weight_offset);
  if (!plan && head_rows(x) && run_heads(x, w, y, static_cast<float>(eps), one)) return;
  if (head_rows(y)) {
    at::Tensor fresh =
        at::empty(y.sizes(), y.options().memory_format(at::MemoryFormat::Contiguous));
    run(x, weight, eps, weight_offset, fresh, plan);
    y.copy_(fresh);
    return;
  }
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor y2 = y.view({-1, x.size(-1)});
  dispatch<Launch>(x.scalar_type(), w, x2, w, y2, static_cast<float>(eps), plan, one);
}

// The fused add into y and residual_out (x and residual themselves for the in-place form,
// whose checks made sure they view as rows).
void run_fused(const at::Tensor& x, const at::Tensor& residual,
               const std::optional<at::Tensor>& weight, double eps, double weight_offset,
               at::Tensor& y, at::Tensor& residual_out,
               const std::optional<Plan>& plan = std::nullopt) {
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(-1);
  const at::Tensor x2 = x.reshape({-1, n}), r2 = residual.reshape({-1, n});
  at::Tensor y2 = y.view({-1, n}), ro2 = residual_out.view({-1, n});
  const bool one = weight_offset == 1.0;
  const at::Tensor w = weight_as_read(weight, one ? 0.0 : weight_offset);
  dispatch<LaunchFused>(x.scalar_type(), w, x2, r2, w, y2, ro2, static_cast<float>(eps), plan,
                        one);
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                    double weight_offset) {
  check_inputs(x, weight, eps, weight_offset);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  run(x, weight, eps, weight_offset, y);
  return y;
}

void rms_norm_out(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                  double eps, double weight_offset) {
  check_inputs(x, weight, eps, weight_offset);
  check_out(out, x, weight);
  run(x, weight, eps, weight_offset, out);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const std::optional<at::Tensor>& weight,
                                                      double eps, double weight_offset) {
  check_fused_inputs(x, residual, weight, eps, weight_offset, kFusedImpl);
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor y = at::empty(x.sizes(), contiguous);
  at::Tensor residual_out = at::empty(x.sizes(), contiguous.dtype(residual.scalar_type()));
  run_fused(x, residual, weight, eps, weight_offset, y, residual_out);
  return {y, residual_out};
}

void fused_add_rms_norm_(at::Tensor& x, at::Tensor& residual,
                         const std::optional<at::Tensor>& weight, double eps,
                         double weight_offset) {
  check_fused_inputs(x, residual, weight, eps, weight_offset, kFusedImplInPlace);
  check_in_place(x, residual, weight, kFusedImplInPlace);
  run_fused(x, residual, weight, eps, weight_offset, x, residual);
}

namespace {
// A forced config's plan: the compiled config of table Tb with these fields, or a
// ValueError naming what was asked.
template <typename Tb>
Plan forced_plan(const char* fn, int64_t row_threads, int64_t vpt, int64_t cluster,
                 int64_t variant) {
  const int ranks = static_cast<int>(std::max<int64_t>(cluster, 1));
  // fields compared as the table's ints only once they fit them
  const bool fits = row_threads > 0 && row_threads <= 1024 && vpt > 0 && vpt <= 64 &&
                    variant >= 0 && variant <= 255;
  const int found = fits ? find_config<Tb>({static_cast<int>(row_threads), static_cast<int>(vpt),
                                            ranks > 1, static_cast<int>(variant)})
                         : -1;
  TORCH_CHECK_VALUE(found >= 0, fn, ": no compiled config (", num(row_threads), ", ", num(vpt),
                    ", cluster ", num(ranks), ", variant ", num(variant),
                    "); see cuda_impl.compiled_configs()");
  const int most = max_ranks(static_cast<int>(variant));
  TORCH_CHECK_VALUE(ranks == 1 || (ranks <= most && (ranks & (ranks - 1)) == 0), fn,
                    ": cluster is ", num(ranks), "; expected 1, 2, 4 or 8",
                    most > kMaxClusterRanks ? " or 16" : "");
  return Plan{found, ranks};
}
}  // namespace

at::Tensor rms_norm_with_config(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                double eps, int64_t row_threads, int64_t vpt, int64_t cluster,
                                int64_t variant, double weight_offset) {
  check_inputs(x, weight, eps, weight_offset);
  const Plan plan = forced_plan<PlainTable>("cuda_impl.rms_norm_with_config", row_threads, vpt,
                                            cluster, variant);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  run(x, weight, eps, weight_offset, y, plan);
  return y;
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_with_config(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, int64_t row_threads, int64_t vpt, int64_t cluster, int64_t variant,
    double weight_offset) {
  check_fused_inputs(x, residual, weight, eps, weight_offset, kFusedImpl);
  const Plan plan = forced_plan<FusedTable>("cuda_impl.fused_add_rms_norm_with_config",
                                            row_threads, vpt, cluster, variant);
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor y = at::empty(x.sizes(), contiguous);
  at::Tensor residual_out = at::empty(x.sizes(), contiguous.dtype(residual.scalar_type()));
  run_fused(x, residual, weight, eps, weight_offset, y, residual_out, plan);
  return {y, residual_out};
}

std::vector<int64_t> rms_norm_kernel_info(const at::Tensor& x,
                                          const std::optional<at::Tensor>& weight) {
  check_inputs(x, weight, 1e-6);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  std::vector<int64_t> out;
  dispatch<Describe>(x.scalar_type(), w, x.reshape({-1, x.size(-1)}), w, out);
  return out;
}

TORCH_LIBRARY_IMPL(cuda_impl, CUDA, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rms_norm_out", &rms_norm_out);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("fused_add_rms_norm_", &fused_add_rms_norm_);
  m.impl("rms_norm_with_config", &rms_norm_with_config);
  m.impl("fused_add_rms_norm_with_config", &fused_add_rms_norm_with_config);
  m.impl("rms_norm_kernel_info", &rms_norm_kernel_info);
}

namespace {
template <typename Tb>
std::vector<int64_t> configs_of() {
  std::vector<int64_t> out;
  for (int i = 0; i < kNumConfigs<Tb>; ++i) {
    out.insert(out.end(), {kConfigs<Tb>[i].row_threads, kConfigs<Tb>[i].vpt,
                           kConfigs<Tb>[i].cluster, i < kNumShipped<Tb>, kConfigs<Tb>[i].variant});
  }
  return out;
}
}  // namespace

// The compiled configs as flat (row_threads, vpt, cluster, in_default_ladder, variant)
// tuples, of each op.
std::vector<int64_t> rms_norm_configs() { return configs_of<PlainTable>(); }
std::vector<int64_t> fused_add_configs() { return configs_of<FusedTable>(); }

namespace {
template <typename Tb>
std::vector<int64_t> default_config_of(const char* fn, int64_t n, int64_t element_size) {
  TORCH_CHECK_VALUE(element_size == 2 || element_size == 4, fn, ": element_size is ",
                    num(element_size), "; expected 2 or 4");
  TORCH_CHECK_VALUE(n >= 1 && n <= kMaxN, fn, ": n is ", num(n), "; expected an int in [1, ",
                    num(kMaxN), "]");
  // rows as a contiguous, aligned tensor has them: whole vectors where n allows
  const Plan p = default_plan<Tb>(static_cast<int>(n * element_size / 16),
                                  static_cast<int>(element_size), 0, 0, n * element_size % 16 == 0,
                                  true);
  const Config& c = kConfigs<Tb>[p.config];
  return {c.row_threads, c.vpt, p.ranks, c.variant};
}
}  // namespace

std::vector<std::string> forward_variants() {
  return {std::begin(kVariantNames), std::end(kVariantNames)};
}

std::vector<int64_t> rms_norm_default_config(int64_t n, int64_t element_size) {
  return default_config_of<PlainTable>("cuda_impl.rms_norm_default_config", n, element_size);
}

std::vector<int64_t> fused_add_default_config(int64_t n, int64_t element_size) {
  return default_config_of<FusedTable>("cuda_impl.fused_add_default_config", n, element_size);
}

}  // namespace cuda_impl

