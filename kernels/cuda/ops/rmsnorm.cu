// RMSNorm: one 256-thread block per token; each thread sums squares over a strided slice,
// a warp-shuffle + shared-memory reduction gives the row's mean square, then each thread
// scales its slice. Memory-bound: one read of x, one write of out.
// Not on the engine's path (its AddRmsNorm is model_ops.cu's): kept with its test.
// Test:  ninja -C build rmsnorm_gpu_test && (cd build && ctest -L gpu -R rmsnorm)
// Bench: none.
#include <cuda_bf16.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/ops/rmsnorm.h"

namespace llm::cuda {
namespace {

constexpr int kThreads = 256;

// bf16 elements travel as their bits (uint16_t, the interface's type). The load widens them
// by a shift (exact, as any bf16 -> fp32); vec::ToF32 would emit cvt.f32.bf16 instead, the
// same values through different machine code.
__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }
__device__ inline void Store(float* p, float v) { *p = v; }
__device__ inline void Store(uint16_t* p, float v) {
  *p = __bfloat16_as_ushort(vec::FromF32<__nv_bfloat16>(v));
}

template <typename T>
__global__ void RmsNormKernel(const T* __restrict__ x, const float* __restrict__ weight,
                              T* __restrict__ out, int64_t hidden, float eps) {
  const T* row = x + blockIdx.x * hidden;
  T* dst = out + blockIdx.x * hidden;
  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    const float v = ToFloat(row[i]);
    sum_sq += v * v;
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  }
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float inv_rms;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    inv_rms = rsqrtf(total / static_cast<float>(hidden) + eps);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    Store(dst + i, weight[i] * (ToFloat(row[i]) * inv_rms));
  }
}

template <typename T>
void Launch(const T* x, const float* weight, T* out, int64_t num_tokens, int64_t hidden, float eps,
            cudaStream_t stream) {
  if (num_tokens == 0) return;
  RmsNormKernel<T>
      <<<static_cast<unsigned>(num_tokens), kThreads, 0, stream>>>(x, weight, out, hidden, eps);
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void RmsNormF32(const float* x, const float* weight, float* out, int64_t num_tokens, int64_t hidden,
                float eps, cudaStream_t stream) {
  Launch(x, weight, out, num_tokens, hidden, eps, stream);
}

void RmsNormBf16(const uint16_t* x, const float* weight, uint16_t* out, int64_t num_tokens,
                 int64_t hidden, float eps, cudaStream_t stream) {
  Launch(x, weight, out, num_tokens, hidden, eps, stream);
}

}  // namespace llm::cuda
