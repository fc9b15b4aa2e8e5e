// CK(call): a CUDA runtime call whose failure ends a standalone probe with the call, where
// it stands and the error's words (scripts/wide_probe.cu, scripts/racecheck_cluster_probe.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(e)                                                                          \
  do {                                                                                 \
    cudaError_t err_ = (e);                                                            \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #e,                   \
                   cudaGetErrorString(err_));                                          \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
