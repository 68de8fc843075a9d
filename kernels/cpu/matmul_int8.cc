// 8-bit CPU linear layers (kernels/cpu/matmul_int8.h). Algorithm: each token's x is quantized
// once per call (codes padded with zeros to a multiple of 64, and one fp32 scale per 4-byte
// lane: its block's d), then every output is one dot product over 64-byte chunks (AVX2: 32):
// the integer products of a lane summed exactly (vpdpbusd / vpmaddubsw + vpmaddwd, the weight's
// sign moved onto x so that the unsigned operand is |w|), converted to fp32 and accumulated
// with the lane's scale by one fma. Several tokens share each chunk of weights in registers
// (tiles of up to 4 rows x 4 tokens); each (row, token) pair runs the same sequence of
// operations whatever the tile, so results do not depend on the batch. Decode reads each row
// once, in memory order. The kernels are compiled for their ISA by target attributes and
// chosen at run time, so a build for AVX2 machines still runs AVX-512 VNNI where it exists.
#include "kernels/cpu/matmul_int8.h"

// GCC 12 reports its own AVX-512 intrinsics (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/row_tiles.h"

namespace llm::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
#define LLM_INT8_X86 1
#define LLM_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define LLM_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

constexpr int64_t kChunk = 64;  // bytes of a row per step of the VNNI kernel
// How far ahead of its loads a row is prefetched into L1 (the L2 streamer alone left decode at
// ~19 GB/s of the machine's ~28-31; 512 and 2048 bytes measured slower than 1024).
constexpr int64_t kPrefetchBytes = 1024;

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// One call's quantized tokens: codes [tokens][padded] (zeros past cols), the scale of each
// 4-byte lane [tokens][padded / 4] (0 past cols) and of each block [tokens][blocks].
struct Activations {
  int64_t cols = 0, padded = 0, lanes = 0, blocks = 0;
  std::vector<int8_t> q;
  std::vector<float> lane_scale, block_scale;
  const int8_t* Codes(int64_t t) const { return q.data() + t * padded; }
  const float* Lanes(int64_t t) const { return lane_scale.data() + t * lanes; }
  const float* Blocks(int64_t t) const { return block_scale.data() + t * blocks; }
};

// Token t's codes and scales (the header's rule). A block holding a NaN or infinity gets a NaN
// scale, so that the outputs it feeds are NaN rather than quietly wrong.
void QuantizeToken(const float* x, int64_t t, Activations& a) {
  int8_t* q = a.q.data() + t * a.padded;
  float* lanes = a.lane_scale.data() + t * a.lanes;
  float* blocks = a.block_scale.data() + t * a.blocks;
  std::memset(q, 0, size_t(a.padded));
  std::fill(lanes, lanes + a.lanes, 0.f);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int64_t begin = b * kInt8Block, end = std::min(a.cols, begin + kInt8Block);
    float amax = 0.f;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    if (!std::isfinite(amax) || std::isnan(amax)) {
      d = std::numeric_limits<float>::quiet_NaN();
      inv = 0.f;
    }
    bool finite = true;
    for (int64_t i = begin; i < end; ++i) {
      const float v = x[i] * inv;
      finite = finite && std::isfinite(v);
      q[i] = finite ? static_cast<int8_t>(std::nearbyint(std::clamp(v, -127.f, 127.f))) : 0;
    }
    if (!finite) d = std::numeric_limits<float>::quiet_NaN();
    blocks[b] = d;
    for (int64_t l = begin / 4; l < (end + 3) / 4; ++l) lanes[l] = d;
  }
}

void Quantize(const float* x, int64_t num_tokens, int64_t cols, Activations& a) {
  a.cols = cols;
  a.padded = RoundUp(std::max<int64_t>(cols, 1), kChunk);
  a.lanes = a.padded / 4;
  a.blocks = (cols + kInt8Block - 1) / kInt8Block;
  a.q.resize(size_t(num_tokens * a.padded));
  a.lane_scale.resize(size_t(num_tokens * a.lanes));
  a.block_scale.resize(size_t(num_tokens * a.blocks));
#pragma omp parallel for schedule(static) if (num_tokens > 8)
  for (int64_t t = 0; t < num_tokens; ++t) QuantizeToken(x + t * cols, t, a);
}

// ---- portable -----------------------------------------------------------------------------

float DotPortable(const int8_t* w, const Activations& a, int64_t t) {
  const int8_t* q = a.Codes(t);
  const float* d = a.Blocks(t);
  float sum = 0.f;
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int64_t begin = b * kInt8Block, end = std::min(a.cols, begin + kInt8Block);
    int32_t s = 0;
    for (int64_t i = begin; i < end; ++i) s += int32_t(q[i]) * int32_t(w[i]);
    sum = std::fma(d[b], float(s), sum);
  }
  return sum;
}

void RowsPortable(const Activations& a, const WeightMatrix& w, float* y, int64_t num_tokens,
                  int64_t row_begin, int64_t row_end) {
  const auto* codes = static_cast<const int8_t*>(w.data);
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      y[t * w.rows + r] = DotPortable(codes + r * w.cols, a, t) * w.scales[r];
    }
  }
}

#if defined(LLM_INT8_X86)
// ---- AVX-512 VNNI -------------------------------------------------------------------------

// kR rows x kT tokens: out[r][t] = Σ over lanes of lane_scale · (exact lane sum). vpdpbusd
// multiplies unsigned by signed bytes: x goes in as x + 128 (its sign bit flipped) and the
// accumulator starts at -128 · Σ w of the lane, so each lane ends at Σ x · w exactly; the
// weights' part (one vpdpbusd and a subtraction per row) is shared by the tile's tokens.
template <int kR, int kT>
LLM_TARGET_VNNI void TileVnni(const int8_t* const* w, int64_t cols, const void* acts,
                              const int64_t* tokens, float (*out)[kMaxTileTokens]) {
  const Activations& a = *static_cast<const Activations*>(acts);
  __m512 acc[kR][kT];
#pragma GCC unroll 4
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));  // as unsigned: 128
  const int8_t* xs[kT];
  const float* ss[kT];
#pragma GCC unroll 4
  for (int t = 0; t < kT; ++t) {
    xs[t] = a.Codes(tokens[t]);
    ss[t] = a.Lanes(tokens[t]);
  }
  for (int64_t k = 0; k < cols; k += kChunk) {
    const __mmask64 m =
        cols - k >= kChunk ? ~__mmask64{0} : (__mmask64{1} << (cols - k)) - 1;  // the row's tail
    __m512i wv[kR], bias[kR];
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kPrefetchBytes, _MM_HINT_T0);
      wv[r] = _mm512_maskz_loadu_epi8(m, w[r] + k);
      bias[r] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, wv[r]));
    }
#pragma GCC unroll 4
    for (int t = 0; t < kT; ++t) {
      const __m512i xu = _mm512_xor_si512(_mm512_loadu_si512(xs[t] + k), flip);
      const __m512 s = _mm512_loadu_ps(ss[t] + k / 4);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        const __m512i p = _mm512_dpbusd_epi32(bias[r], xu, wv[r]);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < kT; ++t) out[r][t] = _mm512_reduce_add_ps(acc[r][t]);
}

// ---- AVX2 ---------------------------------------------------------------------------------

LLM_TARGET_AVX2 inline float HorizontalSum8(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

// 32-byte steps (one block); a row's tail (cols % 32) is copied into a zeroed buffer.
template <int kR, int kT>
LLM_TARGET_AVX2 void TileAvx2(const int8_t* const* w, int64_t cols, const void* acts,
                              const int64_t* tokens, float (*out)[kMaxTileTokens]) {
  const Activations& a = *static_cast<const Activations*>(acts);
  __m256 acc[kR][kT];
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < kT; ++t) acc[r][t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) int8_t tail[kR][32];
  for (int64_t k = 0; k < cols; k += 32) {
    __m256i wv[kR], aw[kR];
    for (int r = 0; r < kR; ++r) {
      const int8_t* src = w[r] + k;
      if (cols - k < 32) {
        std::memset(tail[r], 0, 32);
        std::memcpy(tail[r], src, size_t(cols - k));
        src = tail[r];
      }
      wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      aw[r] = _mm256_abs_epi8(wv[r]);
    }
    for (int t = 0; t < kT; ++t) {
      const __m256i x =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.Codes(tokens[t]) + k));
      const __m256 s = _mm256_loadu_ps(a.Lanes(tokens[t]) + k / 4);
      for (int r = 0; r < kR; ++r) {
        const __m256i p16 = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(x, wv[r]));
        const __m256i p = _mm256_madd_epi16(p16, ones);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < kT; ++t) out[r][t] = HorizontalSum8(acc[r][t]);
}

template <int kR, int kT>
struct Vnni {
  static constexpr TileFn<int8_t> Run = TileVnni<kR, kT>;
};
template <int kR, int kT>
struct Avx2 {
  static constexpr TileFn<int8_t> Run = TileAvx2<kR, kT>;
};
#endif  // LLM_INT8_X86

Int8Kernel Resolve(Int8Kernel k) {
  if (k == Int8Kernel::kAuto) return BestInt8Kernel();
  if (!Int8KernelSupported(k)) return Int8Kernel::kPortable;
  return k;
}

}  // namespace

bool QuantizeInt8Rows(const float* src, int64_t rows, int64_t cols, int8_t* codes, float* scales) {
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * cols;
    float amax = 0.f;
    bool ok = true;
    for (int64_t c = 0; c < cols; ++c) {
      ok = ok && std::isfinite(row[c]);
      amax = std::max(amax, std::fabs(row[c]));
    }
    finite = finite && ok;
    if (!ok) continue;
    const float scale = amax > 0.f ? amax / 127.f : 1.f;
    scales[r] = scale;
    for (int64_t c = 0; c < cols; ++c) {
      codes[r * cols + c] =
          static_cast<int8_t>(std::clamp(std::nearbyint(row[c] / scale), -127.f, 127.f));
    }
  }
  return finite;
}

bool Int8KernelSupported(Int8Kernel k) {
  switch (k) {
    case Int8Kernel::kAuto:
    case Int8Kernel::kPortable:
      return true;
    case Int8Kernel::kAvx512Vnni:
#if defined(LLM_INT8_X86)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
#else
      return false;
#endif
    case Int8Kernel::kAvx2:
#if defined(LLM_INT8_X86)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

Int8Kernel BestInt8Kernel() {
  static const Int8Kernel best = [] {
    for (Int8Kernel k : {Int8Kernel::kAvx512Vnni, Int8Kernel::kAvx2}) {
      if (Int8KernelSupported(k)) return k;
    }
    return Int8Kernel::kPortable;
  }();
  return best;
}

const char* Int8KernelName(Int8Kernel k) {
  switch (k) {
    case Int8Kernel::kAuto:
      return "auto";
    case Int8Kernel::kAvx512Vnni:
      return "avx512-vnni";
    case Int8Kernel::kAvx2:
      return "avx2";
    case Int8Kernel::kPortable:
      return "portable";
  }
  return "?";
}

void LinearInt8(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens,
                Int8Kernel kernel) {
  if (num_tokens <= 0 || w.rows <= 0) return;
  // The caller's buffer, named by a reference: inside the parallel region a thread_local's
  // name would be each worker's own (empty) one.
  thread_local Activations buffer;
  Activations& a = buffer;
  Quantize(x, num_tokens, w.cols, a);
  const Int8Kernel k = Resolve(kernel);
  const auto* codes = static_cast<const int8_t*>(w.data);
  auto scale = [&](int64_t r) { return w.scales[r]; };
  // A token's activations: its codes and its lanes' scales.
  const int64_t bytes_per_token = a.padded + a.lanes * 4;
  ParallelRows(w.rows, num_tokens, bytes_per_token, [&](int64_t begin, int64_t end, int64_t block) {
    switch (k) {
#if defined(LLM_INT8_X86)
      case Int8Kernel::kAvx512Vnni:
        RunTiles<int8_t, Vnni>(codes, w.rows, w.cols, &a, y, num_tokens, begin, end, 4, block,
                               scale);
        break;
      case Int8Kernel::kAvx2:  // 16 ymm registers: tiles of up to 4 rows x 2 tokens
        RunTiles<int8_t, Avx2>(codes, w.rows, w.cols, &a, y, num_tokens, begin, end, 2, block,
                               scale);
        break;
#endif
      default:
        RowsPortable(a, w, y, num_tokens, begin, end);
        break;
    }
  });
}

void LinearInt8Reference(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens) {
  Activations a;
  Quantize(x, num_tokens, w.cols, a);
  const auto* codes = static_cast<const int8_t*>(w.data);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int8_t* q = a.Codes(t);
    for (int64_t r = 0; r < w.rows; ++r) {
      double sum = 0;
      for (int64_t b = 0; b < a.blocks; ++b) {
        int64_t s = 0;
        for (int64_t i = b * kInt8Block; i < std::min(w.cols, (b + 1) * kInt8Block); ++i) {
          s += int64_t(q[i]) * codes[r * w.cols + i];
        }
        sum += double(a.Blocks(t)[b]) * double(s);
      }
      y[t * w.rows + r] = float(sum * w.scales[r]);
    }
  }
}

}  // namespace llm::cpu
