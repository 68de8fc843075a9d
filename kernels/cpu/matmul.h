// y = x · Wᵀ on the CPU, the linear layer of every projection (fp32 activations, weights in
// f32, bf16 or f16 converted to fp32 in registers: bf16 weights halve the bytes streamed,
// which is what batch-1 decode is bound by).
//
//   x: [num_tokens, cols] fp32 row-major
//   W: [rows, cols] row-major (the Hugging Face nn.Linear layout: out_features × in_features)
//   y: [num_tokens, rows] fp32
//
// Multi-threaded over row blocks (OpenMP); each thread streams its rows once per block of
// tokens, so decode (num_tokens = 1) reads every weight byte exactly once.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace llm::cpu {

struct WeightMatrix {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features
  // kF8E4M3 and kI8: [rows] fp32 scales, W[r][c] = scales[r] · e4m3(data[r][c]) or
  // scales[r] · int8(data[r][c]). The e4m3 codes are never NaN (QuantizeFp8Rows rejects
  // non-finite weights), which the kernel relies on.
  const float* scales = nullptr;
  // kI8, kBF16, kF16: `data` holds the values in their kernel's layout, not row-major (PackInt8
  // in kernels/cpu/matmul_int8.h, PackHalf in matmul_half.h: groups of 16 rows).
  bool packed = false;

  bool quantized() const { return dtype == DType::kF8E4M3 || dtype == DType::kI8; }
  int64_t num_bytes() const;
};

// FP8 weights (vLLM's --quantization fp8 on a bf16/fp32 checkpoint, per output channel):
// each row's scale is max|w| / 448 (1 for an all-zero row) and each weight becomes the e4m3
// code of w / scale, rounded to nearest even. `src` is [rows, cols] fp32; writes rows·cols
// codes and `rows` scales. Returns false (writing nothing useful) if a weight is NaN or
// infinite: the caller names the tensor.
bool QuantizeFp8Rows(const float* src, int64_t rows, int64_t cols, uint8_t* codes, float* scales);

// kI8 weights run kernels/cpu/matmul_int8.h's LinearInt8 (x quantized per block of 32).
void Linear(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens);

// Reference: the same product in double precision, one element at a time (for tests; kI8
// weights against unquantized x: LinearInt8Reference quantizes x as the kernel does).
void LinearReference(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens);

// Converts one row of W to fp32 (embedding lookup, tests).
void LoadRow(const WeightMatrix& w, int64_t row, float* out);

}  // namespace llm::cpu
