// LateCopy (launch.h): a kernel that writes late, for the tests of kernels that read before
// their PdlWait (launch.h's named exception). One CTA: it waits for its predecessor, lets its
// successor launch, sleeps at least delay_ns, then copies. A successor that reads the destination
// before its own PdlWait sees the old bytes; one that reads it after sees the new.
// Test: decode_attention_gpu_test (NewestKeyWrittenLateByThePreviousKernel).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"

namespace llm::cuda {
namespace {

constexpr int kLateThreads = 256;

__global__ void __launch_bounds__(kLateThreads)
    LateCopyKernel(void* const* dst, const void* const* src, int count, int64_t bytes,
                   uint32_t delay_ns) {
  PdlWait();
  PdlTrigger();
  // The global timer counts nanoseconds; __nanosleep alone sleeps for an approximate time.
  auto now = [] {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  const uint64_t start = now();
  while (now() - start < delay_ns) __nanosleep(1000);
  for (int c = 0; c < count; ++c) {
    auto* d = static_cast<unsigned char*>(dst[c]);
    const auto* s = static_cast<const unsigned char*>(src[c]);
    for (int64_t i = threadIdx.x; i < bytes; i += kLateThreads) d[i] = s[i];
  }
}

}  // namespace

void LateCopy(void* const* dst, const void* const* src, int count, int64_t bytes, uint32_t delay_ns,
              cudaStream_t stream) {
  Launch(LateCopyKernel, dim3(1), dim3(kLateThreads), 0, stream, dst, src, count, bytes, delay_ns);
}

}  // namespace llm::cuda
