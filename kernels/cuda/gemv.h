// Small-batch GEMV with fused prologues: the decode path of the CUDA backend at n <= 8 tokens,
// where a linear layer is a stream of its weights (one read of W at full HBM bandwidth is the
// whole cost) and the separate RMSNorm / SiLU·mul kernels around a cuBLASLt call cost more in
// launch and ramp than they move. CPU twin (the specification of each prologue):
// cpu::RmsNorm, cpu::SiluMul and cpu::Linear (kernels/cpu/ops.h, matmul.h); test:
// tests/kernels/gemv_gpu_test.cc (label gpu).
//
//   y[t, j] (+)= sum_i a[t, i] * w[j, i]      t < n, j < m, i < k
//   a = prologue(x):
//     kNone     a = x                             x: dtype [n, k]
//     kRmsNorm  a = dtype(x * rsqrt(mean(x²) + eps) * norm_weight)
//                                                 x: fp32 [n, k] (the residual), norm fp32 [k]
//     kSiluMul  a = dtype(silu(x[:, :k]) * x[:, k:])   x: dtype [n, 2k] (gate | up)
//   y: dtype; or fp32 with y_f32 (logits), and y += ... with accumulate (the residual add of
//   the o / down projections; implies y_f32)
//
// Design: one warp per two output rows, 16 rows per 256-thread CTA; lanes stream the rows in
// 16-byte chunks (8 elements), four 16-byte loads in flight per lane, the activations come
// from L1/L2 (n·k elements, tiny next to W) and their prologue is computed once per chunk for
// both rows; fp32 accumulation, one warp-shuffle reduction per (row, token). The RMSNorm
// prologue recomputes each token's inverse RMS per CTA from the fp32 residual (a CTA-wide
// reduction of k floats from L2). Needs k % 8 == 0 and 16-byte aligned rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace llm::cuda {

enum class GemvPrologue : uint8_t { kNone, kRmsNorm, kSiluMul };

inline constexpr int kGemvMaxTokens = 8;

struct GemvArgs {
  GemvPrologue prologue = GemvPrologue::kNone;
  const void* x = nullptr;
  const float* norm_weight = nullptr;  // kRmsNorm
  float eps = 1e-6f;                   // kRmsNorm
  const void* w = nullptr;             // dtype [m, k]
  void* y = nullptr;                   // dtype [n, m], or fp32 [n, m] when y_f32 / accumulate
  bool y_f32 = false;
  bool accumulate = false;
  int64_t n = 0, m = 0, k = 0;
  DType dtype = DType::kBF16;  // of x (kNone / kSiluMul), w, a and y (unless accumulate)
};

// True when Gemv can run this shape (n <= kGemvMaxTokens, k % 8 == 0, aligned pointers).
bool GemvSupports(const GemvArgs& a);

// Asynchronous on `stream`; std::invalid_argument when !GemvSupports(a) or the dtype is not
// kBF16 / kF16.
void Gemv(const GemvArgs& a, cudaStream_t stream);

}  // namespace llm::cuda
