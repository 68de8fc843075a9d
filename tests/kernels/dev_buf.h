// An RAII device buffer for the GPU kernel tests: allocated by size or uploaded from a host
// vector, read back with Download (which synchronises the device first).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"

namespace llm::test {

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    if (n) LLM_CUDA_CHECK(cudaMalloc(&p, n));
  }
  template <typename T>
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size() * sizeof(T)) {
    Upload(h);
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  void Upload(const std::vector<T>& h) const {
    LLM_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> h(bytes / sizeof(T));
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    LLM_CUDA_CHECK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace llm::test
