// bf16 / f16 weights on AVX-512 (kernels/cpu/matmul_half.cc): cpu::Linear's path for 16-bit
// weights where the build has AVX-512 (BW), register-tiled for batches (prompt processing) and
// one row at a time for a lone token (decode); fp32 arithmetic as the generic RowDot, in another
// order. Tested through cpu::Linear (tests/kernels/matmul_test.cc).
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace llm::cpu {

// y = x · Wᵀ for w.dtype bf16 or f16; false (nothing written) for other dtypes or where this
// build has no AVX-512 BW, whose callers take the generic path (which cannot read packed
// weights: PackHalf only where HalfKernelWantsPacked()).
bool LinearHalf(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens);

// The packed layout (WeightMatrix::packed for bf16 / f16), the prompt-processing kernel's: rows
// in groups of 16, columns padded to even with zeros; for each pair of columns (c, c + 1) a
// group holds 64 bytes: bf16, 16 lanes of 32 bits, w[r][c] low and w[r][c + 1] high (a shift
// and a mask make each an fp32 vector); f16, w[r][c] of the 16 rows, then w[r][c + 1] (one
// vcvtph2ps each). The kernel multiplies 16 rows by a token's x[c] broadcast, so a row's result
// is one lane of one accumulator, summed over the columns in order by fma: the same for a token
// alone or in any batch. Batches walk 256-column panels (a tile's weights stay in L1 while
// every token of the block passes), the accumulators parked in y between panels.
bool HalfKernelWantsPacked();
int64_t HalfPackedBytes(int64_t rows, int64_t cols);
// Writes w's values (bf16 / f16, row-major) packed to `out` (HalfPackedBytes) and returns the
// matrix that reads them (packed = true).
WeightMatrix PackHalf(const WeightMatrix& w, void* out);
// The 16-bit value at (row, col) of a packed matrix.
uint16_t PackedHalfValue(const WeightMatrix& w, int64_t row, int64_t col);

}  // namespace llm::cpu
