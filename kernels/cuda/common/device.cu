// Host side of cuda_check.h: the CUDA error exception and device discovery. No kernels.
// Test:  every GPU test calls DeviceAvailable first (ninja -C build && (cd build && ctest -L
//        gpu)). Bench: none.
#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda {

void ThrowCudaError(cudaError_t err, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           " failed: " + cudaGetErrorString(err));
}

bool DeviceAvailable(std::string* why_not) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why_not) {
      *why_not = err != cudaSuccess
                     ? std::string("no usable CUDA driver/device: ") + cudaGetErrorString(err)
                     : "no CUDA device present";
    }
    cudaGetLastError();  // clear the sticky error for later callers
    return false;
  }
  return true;
}

int NumSms() {
  int device = 0, sms = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

int L2CacheBytes() {
  int device = 0, bytes = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
  return bytes;
}

std::string DeviceDescription(int device) {
  cudaDeviceProp prop{};
  LLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.name) + ", sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.totalGlobalMem >> 30) + " GiB";
}

}  // namespace llm::cuda
