// The online softmax state of FlashAttention: one query row's running max and running sum,
// updated tile by tile, mergeable across split-KV partials (flash-decoding's combine step).
// Shared by the CPU kernels (kernels/cpu/flash_attention.cc) and, later, the CUDA kernels:
// only LLM_HOST_DEVICE functions, no std containers, no exceptions.
//
// Units (the FlashAttention-2 choice): scores are kept in the log2 domain, i.e. the caller
// pre-multiplies q by scale * log2(e) so that s = scale * (q·k) * log2(e), and every
// exponential is exp2 (one MUFU.EX2 on the GPU, a short polynomial on the CPU). Then
//     softmax weight of key j = 2^(s_j - m) / l
// with m = max_j s_j and l = sum_j 2^(s_j - m). The caller owns the unnormalised
// accumulator acc[head_dim] = sum_j 2^(s_j - m) v_j.
//
// Masked scores are -inf. A state that has seen only -inf scores (or nothing) keeps
// m = -inf, l = 0 and never computes (-inf) - (-inf): Offset() substitutes 0 for the max,
// Rescale() returns 1 while the max stays -inf, and Merge() skips two empty states.
// Finalize() of such a state yields zeros (the empty sum convention: no visible key
// contributes nothing), never NaN.
//
// Tested by tests/kernels/flash_attention_test.cc (OnlineSoftmaxTest.*):
//   ninja -C build flash_attention_test && (cd build && ctest -R flash_attention)
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

#if defined(_OPENMP) && !defined(__CUDA_ARCH__)
#define LLM_SIMD_REDUCE(op, var) _Pragma(LLM_STRINGIFY(omp simd reduction(op : var)))
#define LLM_STRINGIFY(x) #x
#else
#define LLM_SIMD_REDUCE(op, var)
#endif

namespace llm {

inline constexpr float kLog2e = 1.44269504088896340736f;
inline constexpr float kLn2 = 0.69314718055994530942f;

// 2^x. Device: the hardware exp2f. Host: a branch-free polynomial that the compiler
// vectorises (glibc's exp2f is not vectorised without -ffast-math): 2^x = 2^n · 2^f with
// n = round(x) (by the 1.5·2^23 shifter: adding it leaves n in the low mantissa bits),
// f = x - n in [-0.5, 0.5], 2^f by its degree-7 Taylor series (truncation error
// (0.5·ln2)^8 / 8! ≈ 5e-9, below fp32 rounding; measured max relative error ~1e-7).
// x <= -127 (including -inf) gives exactly 0; NaN stays NaN.
LLM_HOST_DEVICE float Exp2(float x) {
#if defined(__CUDA_ARCH__)
  return exp2f(x);
#else
  constexpr float kShifter = 12582912.f;  // 1.5 · 2^23
  x = x < -127.f ? -127.f : x;
  x = x > 127.f ? 127.f : x;
  const float shifted = x + kShifter;
  const float n = shifted - kShifter;
  const float f = x - n;
  float p = 1.5252733804059840e-5f;
  p = p * f + 1.5403530393381609e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.f;
  // The low mantissa bits of `shifted` hold n (two's complement); 2^n = (n + 127) << 23,
  // which is 0.0f for n = -127.
  const int32_t n_bits =
      __builtin_bit_cast(int32_t, shifted) - __builtin_bit_cast(int32_t, kShifter);
  return p * __builtin_bit_cast(float, (n_bits + 127) << 23);
#endif
}

// max(a, b) as a compare-select (vmaxps on the CPU; std::fmax is a libm call there unless
// -ffinite-math-only). A NaN score is dropped from the max but still reaches exp2 and l, so it
// still poisons the output.
LLM_HOST_DEVICE float Max(float a, float b) { return a > b ? a : b; }

struct OnlineSoftmax {
  float m = -INFINITY;  // running max of the log2-domain scores seen
  float l = 0.f;        // running sum of 2^(s - m)

  // The value subtracted before exp2: the max, or 0 while every score seen is -inf (so that
  // a masked score gives 2^(-inf) = 0 instead of 2^NaN).
  LLM_HOST_DEVICE float Offset() const { return m == -INFINITY ? 0.f : m; }

  // Raises the max to cover a tile whose max score is tile_max and rescales l. Returns
  // alpha = 2^(m_old - m_new), by which the caller multiplies its accumulator (1 while the
  // max stays -inf; 0 when the first finite max arrives, acc and l being 0 then anyway).
  LLM_HOST_DEVICE float Rescale(float tile_max) {
    const float m_new = Max(m, tile_max);
    const float alpha = m_new == -INFINITY ? 1.f : Exp2(m - m_new);
    m = m_new;
    l *= alpha;
    return alpha;
  }

  // One tile of n log2-domain scores s (masked ones -inf), replaced in place by their
  // unnormalised probabilities p = 2^(s - m_new), whose sum is added to l. Returns alpha (see
  // Rescale): the caller does acc = alpha · acc + P·V.
  LLM_HOST_DEVICE float Update(float* s, int64_t n) {
    float tile_max = -INFINITY;
    LLM_SIMD_REDUCE(max, tile_max)
    for (int64_t j = 0; j < n; ++j) tile_max = Max(tile_max, s[j]);
    const float alpha = Rescale(tile_max);
    const float offset = Offset();
    float sum = 0.f;
    LLM_SIMD_REDUCE(+, sum)
    for (int64_t j = 0; j < n; ++j) {
      s[j] = Exp2(s[j] - offset);
      sum += s[j];
    }
    l += sum;
    return alpha;
  }

  // Folds partial state `other` (accumulator other_acc) into this one (accumulator acc):
  // m = max, each side scaled by 2^(m_side - m). Order-independent up to rounding; merging
  // an empty state changes nothing.
  LLM_HOST_DEVICE void Merge(float* acc, const OnlineSoftmax& other, const float* other_acc,
                             int64_t head_dim) {
    const float m_new = Max(m, other.m);
    if (m_new == -INFINITY) return;  // both empty
    const float self_scale = Exp2(m - m_new);
    const float other_scale = Exp2(other.m - m_new);
    for (int64_t d = 0; d < head_dim; ++d)
      acc[d] = acc[d] * self_scale + other_acc[d] * other_scale;
    l = l * self_scale + other.l * other_scale;
    m = m_new;
  }

  // out = acc / l. A state that saw no visible key (l == 0) yields zeros. out may alias acc.
  LLM_HOST_DEVICE void Finalize(const float* acc, float* out, int64_t head_dim) const {
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] * inv_l;
  }

  // Log-sum-exp of the scaled scores in natural units, log(sum_j e^(scale·q·k_j)): what a
  // split-KV partial hands to a combine step that works on (O, lse) pairs. -inf when empty.
  LLM_HOST_DEVICE float Lse() const { return l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY; }
};

}  // namespace llm
