// Device-side initialisation of weight buffers for `--load-format dummy` (like vLLM's dummy
// loader): no files, no host traffic, any model shape in seconds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace llm::cuda {

// dst[i] = uniform(-scale, scale) from a counter-based hash of (seed, i): the same bytes for
// the same seed on any GPU and launch configuration. dtype kF32, kBF16 or kF16.
void FillUniform(void* dst, DType dtype, int64_t count, float scale, uint64_t seed,
                 cudaStream_t stream);

// dst[i] = value.
void FillConstant(void* dst, DType dtype, int64_t count, float value, cudaStream_t stream);

}  // namespace llm::cuda
