// RMSNorm on the GPU, the first fused op of the CUDA backend. CPU twin: cpu::RmsNorm
// (kernels/cpu/ops.h); test: tests/kernels/rmsnorm_gpu_test.cc (label gpu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace llm::cuda {

// out[t] = x[t] / sqrt(mean(x[t]²) + eps) * weight
//   x, out: [num_tokens, hidden] (device, bf16 stored as uint16_t, or fp32), weight: [hidden] fp32
// fp32 accumulation; one block per token.
void RmsNormF32(const float* x, const float* weight, float* out, int64_t num_tokens, int64_t hidden,
                float eps, cudaStream_t stream);
void RmsNormBf16(const uint16_t* x, const float* weight, uint16_t* out, int64_t num_tokens,
                 int64_t hidden, float eps, cudaStream_t stream);

}  // namespace llm::cuda
