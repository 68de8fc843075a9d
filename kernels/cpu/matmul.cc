// CPU linear layer. Algorithm: one vectorised dot product per output element (RowDot), the
// weights widened to fp32 as they are loaded. Rows are split across threads in chunks; for
// several tokens a chunk stays in cache while the tokens stream past it, and decode reads
// each weight exactly once, in memory order. (A register-tiled 4-row × 2-token micro-kernel
// was tried first: it split the prefetcher's stream and made results depend on the batch.)
// Tested by tests/kernels/matmul_test.cc against LinearReference.
#include "kernels/cpu/matmul.h"

// GCC 12 reports its own AVX-512 intrinsics (_mm512_undefined_*) as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/matmul_half.h"
#include "kernels/cpu/matmul_int8.h"
#include "kernels/fp8.h"

namespace llm::cpu {
namespace {

// 8 consecutive weights as fp32.
template <DType kType>
inline __m256 Load8(const void* base, int64_t index) {
  if constexpr (kType == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  } else if constexpr (kType == DType::kBF16) {
    __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index));
    return _mm256_cvtph_ps(h);
  }
}

template <DType kType>
inline float LoadScalar(const void* base, int64_t index) {
  if constexpr (kType == DType::kF32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kType == DType::kBF16) {
    return Bf16ToF32(static_cast<const uint16_t*>(base)[index]);
  } else if constexpr (kType == DType::kF8E4M3) {
    return E4m3ToF32(static_cast<const uint8_t*>(base)[index]);  // unscaled
  } else {
    return F16ToF32(static_cast<const uint16_t*>(base)[index]);
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

// e4m3 codes (zero-extended to 16 bits) as the f16 bit patterns of value · 2^-8: the code's
// byte moved to the top of the lane, shifted right arithmetically by one (the sign lands on
// bits 15 and 14, exponent and mantissa on 13..7), bit 14 cleared. f16's exponent bias is 8
// more than e4m3's and its subnormals cover e4m3's, so every finite code maps exactly (NaN
// codes do not: the quantizer never writes them). 3 integer operations per 16 weights.
inline __m256i E4m3ToHalfBits(__m256i c16) {
  return _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(c16, 8), 1),
                          _mm256_set1_epi16(static_cast<short>(0xbf80)));
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline __m512i E4m3ToHalfBits(__m512i c16) {  // the same, 32 codes at a time
  return _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(c16, 8), 1),
                          _mm512_set1_epi16(static_cast<short>(0xbf80)));
}
#endif

// Where an FP8 row's weights come from, as value · 2^-8 in fp32: its codes (one token), or the
// row already widened by WidenFp8Row (batches: widened once, used by every token).
struct Fp8Codes {
  const uint8_t* q;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  void W32(int64_t k, __m512& lo, __m512& hi) const {
    const __m512i h = E4m3ToHalfBits(
        _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k))));
    lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  }
#endif
  void W16(int64_t k, __m256& lo, __m256& hi) const {
    const __m256i h = E4m3ToHalfBits(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k))));
    lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  }
  float Value(int64_t k) const { return E4m3ToF32(q[k]); }
};
struct Fp8Widened {
  const float* wv;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  void W32(int64_t k, __m512& lo, __m512& hi) const {
    lo = _mm512_loadu_ps(wv + k);
    hi = _mm512_loadu_ps(wv + k + 16);
  }
#endif
  void W16(int64_t k, __m256& lo, __m256& hi) const {
    lo = _mm256_loadu_ps(wv + k);
    hi = _mm256_loadu_ps(wv + k + 8);
  }
  float Value(int64_t k) const { return wv[k] * 256.f; }  // exact: the code's value
};

// One row of FP8 weights against one token: Σ x·w = scale · 2^8 · Σ x·(code · 2^-8). One
// function for both sources, so a token's result is bit-identical whether its batch widened
// the rows first or not (batch invariance); the tail uses explicit fma, which the compiler
// cannot contract differently where it inlines one source and the other.
template <typename Source>
inline float RowDotFp8(const float* x, const Source& w, int64_t cols, float scale) {
  int64_t k = 0;
  float sum = 0.f;  // in units of 2^-8
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const int64_t vec64 = cols & ~int64_t{63};
  __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
  for (; k < vec64; k += 64) {
    __m512 w0, w1, w2, w3;
    w.W32(k, w0, w1);
    w.W32(k + 32, w2, w3);
    b0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k), b0);
    b1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), b1);
    b2 = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x + k + 32), b2);
    b3 = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x + k + 48), b3);
  }
  sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));
#endif
  const int64_t vec16 = cols & ~int64_t{15};
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  for (; k < vec16; k += 16) {
    __m256 w0, w1;
    w.W16(k, w0, w1);
    a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k + 8), a1);
  }
  sum += HorizontalSum(_mm256_add_ps(a0, a1));
  float tail = 0.f;
  for (; k < cols; ++k) tail = std::fma(w.Value(k), x[k], tail);
  return std::fma(sum, 256.f, tail) * scale;
}

// Codes -> value · 2^-8 as fp32 (exact), converted as RowDotFp8 converts them.
inline void WidenFp8Row(const uint8_t* q, int64_t cols, float* out) {
  const Fp8Codes codes{q};
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    __m256 lo, hi;
    codes.W16(k, lo, hi);
    _mm256_storeu_ps(out + k, lo);
    _mm256_storeu_ps(out + k + 8, hi);
  }
  for (; k < cols; ++k) out[k] = codes.Value(k) * (1.f / 256.f);
}

// One row of W against one token, reading W strictly in memory order: rows are contiguous,
// so consecutive calls form a single sequential stream that the hardware prefetcher follows
// (interleaving several rows instead splits it into short streams and halves bandwidth).
// Four accumulators hide the FMA latency.
#if defined(__AVX512F__)
// 16 consecutive weights as fp32 (AVX-512: half the instructions per weight of the AVX2
// path, which matters once bf16 halves the bytes and the conversion becomes the cost).
template <DType kType>
inline __m512 Load16(const void* base, int64_t index) {
  if constexpr (kType == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + index);
  } else if constexpr (kType == DType::kBF16) {
    __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + index));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + index));
    return _mm512_cvtph_ps(h);
  }
}
#endif

template <DType kType>
inline float RowDot(const float* x, const WeightMatrix& w, int64_t r) {
  if constexpr (kType == DType::kF8E4M3) {
    return RowDotFp8(x, Fp8Codes{static_cast<const uint8_t*>(w.data) + r * w.cols}, w.cols,
                     w.scales[r]);
  }
  const int64_t cols = w.cols, base = r * cols;
  int64_t k = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  // fp32 weights stay on the 256-bit path below: measured faster for pure streaming.
  const int64_t vec64 = kType == DType::kF32 ? 0 : cols & ~int64_t{63};
  __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
  for (; k < vec64; k += 64) {
    b0 = _mm512_fmadd_ps(Load16<kType>(w.data, base + k), _mm512_loadu_ps(x + k), b0);
    b1 = _mm512_fmadd_ps(Load16<kType>(w.data, base + k + 16), _mm512_loadu_ps(x + k + 16), b1);
    b2 = _mm512_fmadd_ps(Load16<kType>(w.data, base + k + 32), _mm512_loadu_ps(x + k + 32), b2);
    b3 = _mm512_fmadd_ps(Load16<kType>(w.data, base + k + 48), _mm512_loadu_ps(x + k + 48), b3);
  }
  sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));
#endif
  const int64_t vec32 = cols & ~int64_t{31}, vec8 = cols & ~int64_t{7};
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (; k < vec32; k += 32) {
    a0 = _mm256_fmadd_ps(Load8<kType>(w.data, base + k), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(Load8<kType>(w.data, base + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(Load8<kType>(w.data, base + k + 16), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(Load8<kType>(w.data, base + k + 24), _mm256_loadu_ps(x + k + 24), a3);
  }
  for (; k < vec8; k += 8) {
    a0 = _mm256_fmadd_ps(Load8<kType>(w.data, base + k), _mm256_loadu_ps(x + k), a0);
  }
  sum += HorizontalSum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; k < cols; ++k) sum += LoadScalar<kType>(w.data, base + k) * x[k];
  return sum;
}

// Rows [row_begin, row_end) for all tokens. Every output element is one RowDot, computed
// the same way whatever the number of tokens: a token's result does not depend on the rest
// of the batch (batch invariance, which the engine's tests demand bit for bit on the CPU).
// The row chunk stays in L1/L2 while the tokens stream past it.
template <DType kType>
void LinearRows(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens,
                int64_t row_begin, int64_t row_end) {
  if constexpr (kType == DType::kF8E4M3) {
    // Several tokens: widen the chunk's rows once (not once per token: converting codes is
    // what bounds this path once the weights sit in cache), then stream the tokens past them.
    if (num_tokens > 1) {
      thread_local std::vector<float> wide;
      const int64_t cols = w.cols, n = row_end - row_begin;
      wide.resize(static_cast<size_t>(n * cols));
      const uint8_t* q = static_cast<const uint8_t*>(w.data);
      for (int64_t r = 0; r < n; ++r)
        WidenFp8Row(q + (row_begin + r) * cols, cols, &wide[r * cols]);
      for (int64_t t = 0; t < num_tokens; ++t) {
        const float* xt = x + t * cols;
        float* yt = y + t * w.rows;
        for (int64_t r = 0; r < n; ++r) {
          yt[row_begin + r] =
              RowDotFp8(xt, Fp8Widened{&wide[r * cols]}, cols, w.scales[row_begin + r]);
        }
      }
      return;
    }
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* xt = x + t * w.cols;
    float* yt = y + t * w.rows;
    for (int64_t r = row_begin; r < row_end; ++r) yt[r] = RowDot<kType>(xt, w, r);
  }
}

template <DType kType>
void LinearTyped(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens) {
  // Chunks of 16 rows keep the 4-row micro-tiles intact and balance the threads.
  constexpr int64_t kRowChunk = 16;
  const int64_t num_chunks = (w.rows + kRowChunk - 1) / kRowChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t begin = c * kRowChunk;
    LinearRows<kType>(x, w, y, num_tokens, begin, std::min(w.rows, begin + kRowChunk));
  }
}

}  // namespace

int64_t WeightMatrix::num_bytes() const {
  if (dtype == DType::kI8 && packed)
    return Int8PackedBytes(rows, cols) + rows * int64_t(sizeof(float));
  if (packed) return HalfPackedBytes(rows, cols);
  return rows * cols * static_cast<int64_t>(DTypeSize(dtype)) +
         (quantized() ? rows * int64_t(sizeof(float)) : 0);
}

void Linear(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens) {
  switch (w.dtype) {
    case DType::kF32:
      return LinearTyped<DType::kF32>(x, w, y, num_tokens);
    case DType::kBF16:
      if (LinearHalf(x, w, y, num_tokens)) return;
      return LinearTyped<DType::kBF16>(x, w, y, num_tokens);
    case DType::kF16:
      if (LinearHalf(x, w, y, num_tokens)) return;
      return LinearTyped<DType::kF16>(x, w, y, num_tokens);
    case DType::kF8E4M3:
      return LinearTyped<DType::kF8E4M3>(x, w, y, num_tokens);
    case DType::kI8:
      return LinearInt8(x, w, y, num_tokens);
  }
}

void LoadRow(const WeightMatrix& w, int64_t row, float* out) {
  for (int64_t k = 0; k < w.cols; ++k) {
    const int64_t i = row * w.cols + k;
    switch (w.dtype) {
      case DType::kF32:
        out[k] = LoadScalar<DType::kF32>(w.data, i);
        break;
      case DType::kBF16:
      case DType::kF16: {
        const uint16_t v =
            w.packed ? PackedHalfValue(w, row, k) : static_cast<const uint16_t*>(w.data)[i];
        out[k] = w.dtype == DType::kBF16 ? LoadScalar<DType::kBF16>(&v, 0)
                                         : LoadScalar<DType::kF16>(&v, 0);
        break;
      }
      case DType::kF8E4M3:
        out[k] = LoadScalar<DType::kF8E4M3>(w.data, i) * w.scales[row];
        break;
      case DType::kI8:
        out[k] =
            float(w.packed ? PackedInt8Code(w, row, k) : static_cast<const int8_t*>(w.data)[i]) *
            w.scales[row];
        break;
    }
  }
}

bool QuantizeFp8Rows(const float* src, int64_t rows, int64_t cols, uint8_t* codes, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * cols;
    float amax = 0.f;
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(row[c])) return false;
      amax = std::max(amax, std::fabs(row[c]));
    }
    const float scale = amax > 0.f ? amax / kE4m3Max : 1.f;
    scales[r] = scale;
    for (int64_t c = 0; c < cols; ++c) codes[r * cols + c] = F32ToE4m3(row[c] / scale);
  }
  return true;
}

void LinearReference(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    LoadRow(w, r, row.data());
    for (int64_t t = 0; t < num_tokens; ++t) {
      double sum = 0;
      for (int64_t k = 0; k < w.cols; ++k) sum += double(row[k]) * double(x[t * w.cols + k]);
      y[t * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace llm::cpu
