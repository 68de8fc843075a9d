// Register-blocked fp32 tile operations of the CPU flash-attention kernels
// (kernels/cpu/flash_attention.cc): the small vocabulary the kernel body is written in.
// Vectors are GCC/Clang vector extensions of 8 floats (AVX2 ymm; with AVX-512VL the compiler
// also has ymm16-31, so the 16-accumulator blocks below stay in registers).
//
//   ScoresFromTransposed  S[rows, kKeys] = Q[rows, hd] · Kt[hd, kKeys]  (2 rows × kKeys keys)
//   ScoresFromRows        S[rows, n]     = Q[rows, hd] · K[n rows]ᵀ     (4 rows × 4 keys, hsum)
//   AccumulatePV          acc[rows, hd] += P[rows, n] · V[n rows]      (4 rows × 32 dims)
// Benchmarked by build/bench_attention_cpu (see the .cc header for the command).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace llm::cpu::tiles {

typedef float V8 __attribute__((vector_size(32)));

inline V8 Load(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, V8 v) { std::memcpy(p, &v, sizeof(v)); }
inline V8 Splat(float x) { return V8{} + x; }
// a·b + c with one rounding, spelled out: left to the compiler's contraction, the 4-row and
// 1-row instantiations of one block were fused differently, and a query row's result then
// depended on how many rows shared its tile (breaking batch invariance).
inline V8 Fma(V8 a, V8 b, V8 c) {
#if defined(__FMA__)
  return V8(_mm256_fmadd_ps(__m256(a), __m256(b), __m256(c)));
#else
  return a * b + c;
#endif
}
inline float Sum(V8 v) {
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

// out[c] = sum of the lanes of v[c], c = 0..3 (three horizontal adds on AVX: the lanes of
// four accumulators are reduced together instead of one by one through memory).
inline void Sum4(const V8* v, float* out) {
#if defined(__AVX__)
  const __m256 ab = _mm256_hadd_ps(__m256(v[0]), __m256(v[1]));
  const __m256 cd = _mm256_hadd_ps(__m256(v[2]), __m256(v[3]));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // [a b c d](lanes 0-3) | [a b c d](lanes 4-7)
  const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
  _mm_storeu_ps(out, sum);
#else
  for (int c = 0; c < 4; ++c) out[c] = Sum(v[c]);
#endif
}

// R rows of S (row stride kKeys) from R query rows (stride hd) and Kt [hd, kKeys].
template <int R, int64_t kKeys>
inline void ScoreRowsT(const float* __restrict q, int64_t hd, const float* __restrict kt,
                       float* __restrict s) {
  constexpr int C = kKeys / 8;
  V8 acc[R][C] = {};
  for (int64_t d = 0; d < hd; ++d) {
    V8 qd[R];
    for (int r = 0; r < R; ++r) qd[r] = Splat(q[r * hd + d]);
    for (int c = 0; c < C; ++c) {
      const V8 k = Load(kt + d * kKeys + 8 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = Fma(qd[r], k, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) Store(s + r * kKeys + 8 * c, acc[r][c]);
  }
}

template <int64_t kKeys>
inline void ScoresFromTransposed(const float* q, int64_t rows, int64_t hd, const float* kt,
                                 float* s) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) ScoreRowsT<2, kKeys>(q + r * hd, hd, kt, s + r * kKeys);
  for (; r < rows; ++r) ScoreRowsT<1, kKeys>(q + r * hd, hd, kt, s + r * kKeys);
}

// S[r][j0 + c] for R rows × K keys, dot products over hd vectorised by 8 then summed.
template <int R, int K>
inline void DotBlock(const float* __restrict q, int64_t hd, const float* const* k_rows,
                     float* __restrict s, int64_t s_stride) {
  V8 acc[R][K] = {};
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8) {
    V8 k[K];
    for (int c = 0; c < K; ++c) k[c] = Load(k_rows[c] + d);
    for (int r = 0; r < R; ++r) {
      const V8 qv = Load(q + r * hd + d);
      for (int c = 0; c < K; ++c) acc[r][c] = Fma(qv, k[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float dots[K];
    if constexpr (K == 4) {
      Sum4(acc[r], dots);
    } else {
      for (int c = 0; c < K; ++c) dots[c] = Sum(acc[r][c]);
    }
    for (int c = 0; c < K; ++c) {
      for (int64_t e = d; e < hd; ++e)
        dots[c] = __builtin_fmaf(q[r * hd + e], k_rows[c][e], dots[c]);
      s[r * s_stride + c] = dots[c];
    }
  }
}

template <int R>
inline void DotRows(const float* q, int64_t hd, const float* const* k_rows, int64_t n, float* s,
                    int64_t s_stride) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) DotBlock<R, 4>(q, hd, k_rows + j, s + j, s_stride);
  for (; j < n; ++j) DotBlock<R, 1>(q, hd, k_rows + j, s + j, s_stride);
}

inline void ScoresFromRows(const float* q, int64_t rows, int64_t hd, const float* const* k_rows,
                           int64_t n, float* s, int64_t s_stride) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) DotRows<4>(q + r * hd, hd, k_rows, n, s + r * s_stride, s_stride);
  for (; r < rows; ++r) DotRows<1>(q + r * hd, hd, k_rows, n, s + r * s_stride, s_stride);
}

// acc[R rows, d0 .. d0 + 8C) += P[R rows, 0..n) · V[0..n)[d0 ..]; acc stays in registers.
template <int R, int C>
inline void PvBlock(const float* __restrict p, int64_t p_stride, const float* const* v_rows,
                    int64_t n, int64_t d0, float* __restrict acc, int64_t hd) {
  V8 a[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) a[r][c] = Load(acc + r * hd + d0 + 8 * c);
  }
  for (int64_t j = 0; j < n; ++j) {
    V8 v[C];
    for (int c = 0; c < C; ++c) v[c] = Load(v_rows[j] + d0 + 8 * c);
    for (int r = 0; r < R; ++r) {
      const V8 pr = Splat(p[r * p_stride + j]);
      for (int c = 0; c < C; ++c) a[r][c] = Fma(pr, v[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) Store(acc + r * hd + d0 + 8 * c, a[r][c]);
  }
}

template <int R>
inline void PvRows(const float* p, int64_t p_stride, const float* const* v_rows, int64_t n,
                   float* acc, int64_t hd) {
  int64_t d = 0;
  for (; d + 32 <= hd; d += 32) PvBlock<R, 4>(p, p_stride, v_rows, n, d, acc, hd);
  for (; d + 8 <= hd; d += 8) PvBlock<R, 1>(p, p_stride, v_rows, n, d, acc, hd);
  for (; d < hd; ++d) {  // head_dim not a multiple of 8
    for (int r = 0; r < R; ++r) {
      float sum = acc[r * hd + d];
      for (int64_t j = 0; j < n; ++j) sum = __builtin_fmaf(p[r * p_stride + j], v_rows[j][d], sum);
      acc[r * hd + d] = sum;
    }
  }
}

inline void AccumulatePV(const float* p, int64_t p_stride, int64_t rows, const float* const* v_rows,
                         int64_t n, float* acc, int64_t hd) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) PvRows<4>(p + r * p_stride, p_stride, v_rows, n, acc + r * hd, hd);
  for (; r < rows; ++r) PvRows<1>(p + r * p_stride, p_stride, v_rows, n, acc + r * hd, hd);
}

}  // namespace llm::cpu::tiles
