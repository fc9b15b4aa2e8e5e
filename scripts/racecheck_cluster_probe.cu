// Racecheck probe of the cluster sum (cuda_impl::cluster_sum, the forward's wide rows): is
// what compute-sanitizer's racecheck reports there a race or the tool's model of the
// barriers? A standalone program (torch's headers only, for the shared device header) whose
// kernel runs the shipped cluster sum itself, after one of three starts:
//   0 shipped: thread 0 initialises the mbarrier, fence.mbarrier_init.release.cluster, then
//     every thread barrier.cluster.arrive.relaxed (what the forward and the backward do);
//   1 cta-barrier: the same with __syncthreads() after the fence (a CTA barrier, which
//     racecheck tracks, between the init and every other thread of the CTA);
//   2 release: barrier.cluster.arrive.release instead of the fence's relaxed arrive.
// The sum then waits at barrier.cluster.wait.acquire before any mbarrier operation of
// another thread, so in all three the init happens before every other access to the
// mbarrier by the PTX memory model (the fence orders the init before the relaxed arrive,
// the arrive-wait pair orders it before everything after the wait).
//   TORCH=$(python -c "import torch, os; print(os.path.dirname(torch.__file__))")
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I$TORCH/include \
//     -o build/racecheck_cluster_probe scripts/racecheck_cluster_probe.cu
//   build/racecheck_cluster_probe MODE [CLUSTERS] [LAUNCHES]
//   compute-sanitizer --tool racecheck build/racecheck_cluster_probe MODE 8 1
// Output: a line a (block, cluster) shape: clusters x launches run, and how many threads'
// sums differ from the exact sum (integers in fp32: exact in any order).
#include <cuda_runtime.h>

#include "../cuda_impl/csrc/rms_norm_device.cuh"
#include "cuda_check.cuh"

#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kMaxRanks = 8;

template <int BLOCK, int MODE>
__global__ void cluster_sum_probe(const float* in, float* out) {
  __shared__ float parts[BLOCK / 32 * kMaxRanks];
  __shared__ __align__(8) uint64_t bar;
  int rank = 0, ranks = 1;
  cuda_impl::cluster_position(rank, ranks);
  if (threadIdx.x == 0) {
    cuda_impl::mbar_init(&bar);
    cuda_impl::mbar_init_fence();
  }
  if constexpr (MODE == 1) __syncthreads();
  if constexpr (MODE == 2) {
    cuda_impl::cluster_arrive_release();
  } else {
    cuda_impl::cluster_arrive_relaxed();
  }
  const int64_t i = static_cast<int64_t>(blockIdx.x) * BLOCK + threadIdx.x;
  out[i] = cuda_impl::cluster_sum<BLOCK>(in[i], parts, &bar, rank, ranks);
}

template <int BLOCK, int MODE>
long run(int ranks, int clusters, int launches) {
  const int64_t n = static_cast<int64_t>(clusters) * ranks * BLOCK;
  std::vector<float> h(n), got(n);
  for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>((i * 7919) % 13) - 6.f;
  std::vector<double> want(clusters, 0.0);
  for (int64_t i = 0; i < n; ++i) want[i / (ranks * BLOCK)] += h[i];
  float *in, *out;
  CK(cudaMalloc(&in, n * sizeof(float)));
  CK(cudaMalloc(&out, n * sizeof(float)));
  CK(cudaMemcpy(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = cuda_impl::cluster_launch_config(
      dim3(clusters * ranks), BLOCK, 0, nullptr, dim3(ranks), attr);
  long wrong = 0;
  for (int l = 0; l < launches; ++l) {
    CK(cudaMemset(out, 0xff, n * sizeof(float)));  // NaN: a thread that writes nothing is wrong
    CK(cudaLaunchKernelEx(&cfg, cluster_sum_probe<BLOCK, MODE>, (const float*)in, out));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) wrong += got[i] != static_cast<float>(want[i / (ranks * BLOCK)]);
  }
  CK(cudaFree(in));
  CK(cudaFree(out));
  std::printf("mode %d block %4d cluster %d: %d clusters x %d launches, %ld wrong sums\n", MODE,
              BLOCK, ranks, clusters, launches, wrong);
  return wrong;
}

template <int MODE>
long run_all(int clusters, int launches) {
  long wrong = 0;
  for (int ranks : {2, 4, 8}) {
    wrong += run<256, MODE>(ranks, clusters, launches);
    wrong += run<512, MODE>(ranks, clusters, launches);
  }
  return wrong;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  const int clusters = argc > 2 ? std::atoi(argv[2]) : 1056;
  const int launches = argc > 3 ? std::atoi(argv[3]) : 20;
  long wrong = mode == 0 ? run_all<0>(clusters, launches)
             : mode == 1 ? run_all<1>(clusters, launches)
                         : run_all<2>(clusters, launches);
  return wrong == 0 ? 0 : 1;
}
