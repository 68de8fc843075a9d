// bf16 / f16 weights on AVX-512 (kernels/cpu/matmul_half.cc): cpu::Linear's path for 16-bit
// weights where the build has AVX-512 (BW), register-tiled for batches (prompt processing) and
// one row at a time for a lone token (decode); fp32 arithmetic as the generic RowDot, in another
// order. Tested through cpu::Linear (tests/kernels/matmul_test.cc).
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace llm::cpu {

// y = x · Wᵀ for w.dtype bf16 or f16; false (nothing written) for other dtypes or where this
// build has no AVX-512 BW, whose callers take the generic path.
bool LinearHalf(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens);

}  // namespace llm::cpu
