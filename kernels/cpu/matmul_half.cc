// bf16 / f16 weights on AVX-512 (kernels/cpu/matmul_half.h). Each (row, token) output is one
// fp32 accumulator over steps of 32 weights: one 64-byte load of the row, converted as two
// halves of 16 (f16: vcvtph2ps each; bf16: the even and the odd elements, a shift and a mask,
// both already fp32 bit patterns, with x permuted to match), two fmas. Batches run tiles of up
// to 4 rows x 4 tokens (kernels/cpu/row_tiles.h): the weights' conversion is shared by the
// tile's tokens, and the 16 accumulators are independent chains; a lone token (decode) runs
// 1 x 1 tiles, one row after another in memory order. Every pair runs the same operations in
// any tile, so a token's result does not depend on its batch. The rows' tails (cols % 32) are
// masked loads; x is copied into a zero-padded buffer.
#include "kernels/cpu/matmul_half.h"

#include <algorithm>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
// GCC 12 reports its own AVX-512 intrinsics (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "kernels/cpu/row_tiles.h"
#endif

namespace llm::cpu {

#if defined(__AVX512F__) && defined(__AVX512BW__)
namespace {

constexpr int64_t kStep = 32;             // weights per step
constexpr int64_t kPrefetchBytes = 1024;  // L1 prefetch distance (as matmul_int8.cc's)

// The tokens' x, zero-padded to a multiple of kStep; for bf16, each 32-element block as its
// 16 even elements then its 16 odd ones.
struct PaddedX {
  int64_t padded = 0;
  std::vector<float> v;
  const float* Row(int64_t t) const { return v.data() + t * padded; }
};

void Prepare(const float* x, int64_t num_tokens, int64_t cols, bool bf16, PaddedX& p) {
  p.padded = (cols + kStep - 1) / kStep * kStep;
  p.v.assign(static_cast<size_t>(num_tokens * p.padded), 0.f);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* in = x + t * cols;
    float* out = p.v.data() + t * p.padded;
    if (!bf16) {
      std::copy(in, in + cols, out);
      continue;
    }
    for (int64_t b = 0; b < cols; b += kStep) {
      for (int64_t i = 0; i < kStep / 2; ++i) {
        if (b + 2 * i < cols) out[b + i] = in[b + 2 * i];
        if (b + 2 * i + 1 < cols) out[b + kStep / 2 + i] = in[b + 2 * i + 1];
      }
    }
  }
}

// 32 weights (fewer at a row's tail: the mask) as two vectors of 16 fp32.
template <DType kType>
inline void Load32(const uint16_t* row, int64_t k, __mmask32 m, __m512& lo, __m512& hi) {
  const __m512i v = _mm512_maskz_loadu_epi16(m, row + k);
  if constexpr (kType == DType::kBF16) {  // even elements, odd elements
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  } else {
    lo = _mm512_cvtph_ps(_mm512_castsi512_si256(v));
    hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
  }
}

template <DType kType, int kR, int kT>
void Tile(const uint16_t* const* w, int64_t cols, const void* acts, const int64_t* tokens,
          float (*out)[kMaxTileTokens]) {
  const PaddedX& x = *static_cast<const PaddedX*>(acts);
  __m512 acc[kR][kT];
#pragma GCC unroll 4
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  const float* xs[kT];
#pragma GCC unroll 4
  for (int t = 0; t < kT; ++t) xs[t] = x.Row(tokens[t]);
  for (int64_t k = 0; k < cols; k += kStep) {
    const __mmask32 m = cols - k >= kStep ? ~__mmask32{0} : (__mmask32{1} << (cols - k)) - 1;
    __m512 lo[kR], hi[kR];
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kPrefetchBytes, _MM_HINT_T0);
      Load32<kType>(w[r], k, m, lo[r], hi[r]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < kT; ++t) {
      const float* xt = xs[t] + k;
      const __m512 x0 = _mm512_loadu_ps(xt), x1 = _mm512_loadu_ps(xt + 16);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        acc[r][t] = _mm512_fmadd_ps(lo[r], x0, acc[r][t]);
        acc[r][t] = _mm512_fmadd_ps(hi[r], x1, acc[r][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < kT; ++t) out[r][t] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int kR, int kT>
struct Bf16Tile {
  static constexpr TileFn<uint16_t> Run = Tile<DType::kBF16, kR, kT>;
};
template <int kR, int kT>
struct F16Tile {
  static constexpr TileFn<uint16_t> Run = Tile<DType::kF16, kR, kT>;
};

}  // namespace

bool LinearHalf(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens) {
  if (w.dtype != DType::kBF16 && w.dtype != DType::kF16) return false;
  if (num_tokens <= 0 || w.rows <= 0) return true;
  thread_local PaddedX buffer;
  PaddedX& px = buffer;  // the caller's, by reference inside the parallel region
  const bool bf16 = w.dtype == DType::kBF16;
  Prepare(x, num_tokens, w.cols, bf16, px);
  const auto* rows = static_cast<const uint16_t*>(w.data);
  auto one = [](int64_t) { return 1.f; };
  ParallelRows(w.rows, num_tokens, px.padded * 4, [&](int64_t begin, int64_t end, int64_t block) {
    if (bf16) {
      RunTiles<uint16_t, Bf16Tile>(rows, w.rows, w.cols, &px, y, num_tokens, begin, end,
                                   kMaxTileTokens, block, one);
    } else {
      RunTiles<uint16_t, F16Tile>(rows, w.rows, w.cols, &px, y, num_tokens, begin, end,
                                  kMaxTileTokens, block, one);
    }
  });
  return true;
}

#else

bool LinearHalf(const float*, const WeightMatrix&, float*, int64_t) { return false; }

#endif

}  // namespace llm::cpu
