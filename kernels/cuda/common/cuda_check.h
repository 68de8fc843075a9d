// CUDA error checking with file and line, and device discovery for tests and start-up.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace llm::cuda {

[[noreturn]] void ThrowCudaError(cudaError_t err, const char* expr, const char* file, int line);

#define LLM_CUDA_CHECK(expr)                                                                       \
  do {                                                                                             \
    cudaError_t llm_err_ = (expr);                                                                 \
    if (llm_err_ != cudaSuccess) ::llm::cuda::ThrowCudaError(llm_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// True when a CUDA device can be used; otherwise `why_not` says why (no driver, no device).
bool DeviceAvailable(std::string* why_not = nullptr);

// "NVIDIA H200, sm_90, 139 GiB" for logs.
std::string DeviceDescription(int device = 0);

// The current device's SM count (the kernels' grid sizing: waves, persistent grids).
int NumSms();

// The current device's L2 cache size in bytes (the kernels' L2-aware work orders).
int L2CacheBytes();

}  // namespace llm::cuda
