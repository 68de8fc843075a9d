// 8-bit linear layers on the CPU's integer dot products (--quantization int8 on --device cpu):
// y = x · Wᵀ with W int8 per output row and x quantized per block of 32 on the fly, as
// llama.cpp's Q8_0 × Q8_0 does, so that the inner loop multiplies bytes (AVX-512 VNNI
// vpdpbusd: 64 products per instruction; AVX2 vpmaddubsw) instead of widening weights to fp32.
//
//   W (cpu::WeightMatrix, dtype kI8): codes int8 [rows, cols] in [-127, 127] and fp32 scales
//     [rows]: W[r][c] = scales[r] · codes[r][c] (QuantizeInt8Rows: scale = max|w| / 127)
//   x: each token's row in blocks of kInt8Block (the last one may be shorter), each block b
//     with its own scale d[b] = max|x| / 127 and codes q = nearest-even(x · (1 / d[b]))
//   y[t][r] = scales[r] · Σ_b d[b] · Σ_{i in b} q[i] · codes[r][i]   (integer sums exact,
//     the blocks' sum in fp32)
//
// Three kernels, the best one this CPU runs chosen at run time (Int8Kernel::kAuto): AVX-512
// VNNI, AVX2, and a portable one. A token's result does not depend on the rest of its batch
// (every kernel computes each output the same way for 1 or many tokens), so the engine's batch
// invariance holds; the kernels differ from each other by fp32 rounding only, and the VNNI
// kernel and the portable one not at all (both sum each block exactly in int32 and the blocks
// in order with one fp32 fma each, then multiply by the row's scale).
//
// The VNNI kernel reads W in its own layout (PackInt8; WeightMatrix::packed): 16 rows side by
// side, 4 bytes of each per 64-byte vector, so that one vpdpbusd multiplies 16 rows by a
// token's 4 bytes (broadcast) into 16 int32 sums, a block of 32 columns is 8 of them into the
// same sums, and one conversion and fma per block and 16 rows folds them into fp32 (the
// row-major alternative needs one per 4 columns). The codes are stored + 128 (unsigned, as
// vpdpbusd's first operand wants); each block's sum starts at -128 · Σ x of the block.
// Tested by tests/kernels/matmul_int8_test.cc against LinearInt8Reference.
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace llm::cpu {

inline constexpr int64_t kInt8Block = 32;

// Each row's scale is max|w| / 127 (1 for an all-zero row) and each weight becomes
// nearest-even(w / scale) in [-127, 127]. Returns false (writing nothing useful) if a weight is
// NaN or infinite: the caller names the tensor.
bool QuantizeInt8Rows(const float* src, int64_t rows, int64_t cols, int8_t* codes, float* scales);

enum class Int8Kernel { kAuto, kAvx512Vnni, kAvx2, kPortable };

// Whether this CPU (and build) runs kernel k; kAuto and kPortable always.
bool Int8KernelSupported(Int8Kernel k);
// What kAuto runs here: the first supported of kAvx512Vnni, kAvx2, kPortable.
Int8Kernel BestInt8Kernel();
const char* Int8KernelName(Int8Kernel k);

// The VNNI layout: rows padded to a multiple of 16 (kInt8GroupRows), columns to one of 32 (zero
// codes); group g's bytes at g · 16 · padded_cols: for each 4 columns c4, 16 rows x 4 bytes.
inline constexpr int64_t kInt8GroupRows = 16;
int64_t Int8PackedBytes(int64_t rows, int64_t cols);
// Writes w's codes (kI8, row-major) in the VNNI layout to `out` (Int8PackedBytes of them) and
// returns the matrix that reads them (same scales, packed = true).
WeightMatrix PackInt8(const WeightMatrix& w, void* out);
// The code at (row, col) of a packed matrix.
int8_t PackedInt8Code(const WeightMatrix& w, int64_t row, int64_t col);
// Whether the kernel kAuto picks here reads packed weights (a model should PackInt8 them).
bool Int8KernelWantsPacked();

// w.dtype must be kI8. Multi-threaded over row blocks (OpenMP), as cpu::Linear. Packed weights
// run the VNNI kernel (`kernel` must be kAuto or kAvx512Vnni, and this CPU must have it);
// row-major ones the AVX2 or portable kernel (kAvx512Vnni falls back to AVX2 for them).
void LinearInt8(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens,
                Int8Kernel kernel = Int8Kernel::kAuto);

// Reference: the same quantization of x, the products summed exactly per block and the blocks
// in double precision (for tests).
void LinearInt8Reference(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens);

}  // namespace llm::cpu
