// Dummy-weight initialisation (fill.h): a grid-stride loop, one splitmix64 hash per element.
// Test:  no kernel test of its own: the CUDA executor's --load-format dummy runs it
//        (ninja -C build cuda_executor_gpu_test && (cd build && ctest -L gpu -R cuda_executor)).
// Bench: none (bench_gemm_peak_gpu fills its inputs with it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/fill.h"
#include "kernels/cuda/common/vec.cuh"

namespace llm::cuda {
namespace {

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ void Store(void* dst, DType dtype, int64_t i, float v) {
  if (dtype == DType::kF32) {
    static_cast<float*>(dst)[i] = v;
  } else if (dtype == DType::kBF16) {
    static_cast<__nv_bfloat16*>(dst)[i] = vec::FromF32<__nv_bfloat16>(v);
  } else {
    static_cast<__half*>(dst)[i] = vec::FromF32<__half>(v);
  }
}

__global__ void FillKernel(void* dst, DType dtype, int64_t count, float scale, uint64_t seed,
                           bool random, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = value;
    if (random) {
      // 24 random bits -> [0, 1) -> [-scale, scale).
      const uint64_t h = SplitMix64(seed * 0x100000001b3ull + uint64_t(i));
      v = (float(h >> 40) * (1.f / 16777216.f) * 2.f - 1.f) * scale;
    }
    Store(dst, dtype, i, v);
  }
}

void Launch(void* dst, DType dtype, int64_t count, float scale, uint64_t seed, bool random,
            float value, cudaStream_t stream) {
  if (count <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, 65536);
  FillKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dst, dtype, count, scale, seed,
                                                                     random, value);
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void FillUniform(void* dst, DType dtype, int64_t count, float scale, uint64_t seed,
                 cudaStream_t stream) {
  Launch(dst, dtype, count, scale, seed, true, 0.f, stream);
}

void FillConstant(void* dst, DType dtype, int64_t count, float value, cudaStream_t stream) {
  Launch(dst, dtype, count, 0.f, 0, false, value, stream);
}

}  // namespace llm::cuda
