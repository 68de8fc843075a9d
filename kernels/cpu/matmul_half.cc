// bf16 / f16 weights on AVX-512 (kernels/cpu/matmul_half.h). Two layouts:
//  - packed (what the CPU backend loads; the header's layout): 16 rows per vector, each column
//    pair one 64-byte load converted to two fp32 vectors, multiplied by the token's x[c]
//    broadcast into one accumulator per (16 rows, token): tiles of 3 groups x 6 tokens over
//    256-column panels, no horizontal sums, each row's sum taken over the columns in order.
//  - row-major (a matrix nobody packed): each (row, token) output one fp32 accumulator over
//    steps of 32 weights: one 64-byte load of the row, converted as two halves of 16 (f16:
//    vcvtph2ps each; bf16: the even and the odd elements, a shift and a mask, both already
//    fp32 bit patterns, with x permuted to match), two fmas; tiles of up to 4 rows x 4 tokens
//    (kernels/cpu/row_tiles.h), one row after another for a lone token. The rows' tails
//    (cols % 32) are masked loads; x is copied into a zero-padded buffer.
// In both, every (row, token) pair runs the same operations in any tile, so a token's result
// does not depend on its batch.
#include "kernels/cpu/matmul_half.h"

#include <algorithm>
#include <array>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
// GCC 12 reports its own AVX-512 intrinsics (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "kernels/cpu/row_tiles.h"
#endif

namespace llm::cpu {
namespace {
// The packed layout (matmul_half.h): rows per group, columns padded to even.
constexpr int kGroupRows = 16;
int64_t EvenCols(int64_t cols) { return (cols + 1) / 2 * 2; }
}  // namespace

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

// ---- packed weights (matmul_half.h's layout) ----------------------------------------------

constexpr int kPackedGroups = 3;      // groups of 16 rows per tile
constexpr int kPackedTokens = 6;      // tokens per tile: 18 accumulators + 6 weight vectors
constexpr int64_t kPanelPairs = 128;  // a panel: 256 columns
constexpr int64_t kBlockXBytes = int64_t{512} << 10;  // a token block's x panel: half an L2

// Decode reads 3 groups' streams at once: prefetched 4 KiB ahead (1 KiB: 110M-shape bf16
// decode ~215 tok/s, 4 KiB ~240; TinyLlama 27.6 -> 30.0; AMD EPYC dev VM, 2 threads).
constexpr int64_t kPackedPrefetchBytes = 4096;

// The fp32 values of columns 2p and 2p + 1 of a group's 16 rows.
template <DType kType>
inline void LoadPair(const uint16_t* group, int64_t p, __m512& even, __m512& odd) {
  const auto* at = reinterpret_cast<const char*>(group + p * 2 * kGroupRows);
  _mm_prefetch(at + kPackedPrefetchBytes, _MM_HINT_T0);
  if constexpr (kType == DType::kBF16) {
    const __m512i v = _mm512_loadu_si512(at);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  } else {
    even = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
    odd = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32)));
  }
}

// Groups [0, kG) (group g at w + g · group_elems; rows row0 + 16 g ...) x tokens t0 .. t0 + kT
// (x rows of ldx floats, zero-padded to even), column pairs [p0, p1); accumulators from 0
// (p0 == 0) or from y, back to y. rows_left: rows from row0 on.
template <DType kType, int kG, int kT>
void PackedTile(const uint16_t* w, int64_t group_elems, const float* x, int64_t ldx, int64_t t0,
                int64_t p0, int64_t p1, float* y, int64_t ldy, int64_t row0, int64_t rows_left) {
  __mmask16 mask[kG];
#pragma GCC unroll 3
  for (int g = 0; g < kG; ++g) mask[g] = GroupMask(rows_left, g);
  __m512 acc[kG][kT];
#pragma GCC unroll 3
  for (int g = 0; g < kG; ++g)
#pragma GCC unroll 6
    for (int t = 0; t < kT; ++t) {
      acc[g][t] = p0 == 0 ? _mm512_setzero_ps()
                          : _mm512_maskz_loadu_ps(mask[g], y + (t0 + t) * ldy + row0 + g * 16);
    }
  for (int64_t p = p0; p < p1; ++p) {
    __m512 even[kG], odd[kG];
#pragma GCC unroll 3
    for (int g = 0; g < kG; ++g) LoadPair<kType>(w + g * group_elems, p, even[g], odd[g]);
#pragma GCC unroll 6
    for (int t = 0; t < kT; ++t) {
      const float* xt = x + (t0 + t) * ldx + 2 * p;
      const __m512 xe = _mm512_set1_ps(xt[0]), xo = _mm512_set1_ps(xt[1]);
#pragma GCC unroll 3
      for (int g = 0; g < kG; ++g) {
        acc[g][t] = _mm512_fmadd_ps(even[g], xe, acc[g][t]);
        acc[g][t] = _mm512_fmadd_ps(odd[g], xo, acc[g][t]);
      }
    }
  }
#pragma GCC unroll 3
  for (int g = 0; g < kG; ++g)
#pragma GCC unroll 6
    for (int t = 0; t < kT; ++t) {
      _mm512_mask_storeu_ps(y + (t0 + t) * ldy + row0 + g * 16, mask[g], acc[g][t]);
    }
}

using PackedTileFn = void (*)(const uint16_t*, int64_t, const float*, int64_t, int64_t, int64_t,
                              int64_t, float*, int64_t, int64_t, int64_t);

template <DType kType, int kG>
constexpr std::array<PackedTileFn, kPackedTokens> TokensRow() {
  return {PackedTile<kType, kG, 1>, PackedTile<kType, kG, 2>, PackedTile<kType, kG, 3>,
          PackedTile<kType, kG, 4>, PackedTile<kType, kG, 5>, PackedTile<kType, kG, 6>};
}

template <DType kType>
PackedTileFn PackedTileOf(int ng, int nt) {
  static constexpr std::array<std::array<PackedTileFn, kPackedTokens>, kPackedGroups> table = {
      TokensRow<kType, 1>(), TokensRow<kType, 2>(), TokensRow<kType, 3>()};
  return table[size_t(ng - 1)][size_t(nt - 1)];
}

// x padded to even columns (zeros), one row per token.
void PadX(const float* x, int64_t num_tokens, int64_t cols, std::vector<float>& out) {
  const int64_t padded = EvenCols(cols);
  out.resize(size_t(num_tokens * padded));
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::copy(x + t * cols, x + (t + 1) * cols, out.begin() + t * padded);
    if (padded != cols) out[size_t(t * padded + cols)] = 0.f;
  }
}

// Decode: tiles of 3 groups over all columns, handed to the threads in order. A batch: each
// thread one contiguous range of groups; per block of tokens (its x panel in half an L2), per
// panel of columns, per 3 groups (their panel in L1), tiles of 6 tokens.
template <DType kType>
void LinearPacked(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens) {
  thread_local std::vector<float> buffer;
  std::vector<float>& px = buffer;  // the caller's, by reference inside the parallel region
  const int64_t cols = EvenCols(w.cols), pairs = cols / 2;
  const float* xs = x;
  if (cols != w.cols) {
    PadX(x, num_tokens, w.cols, px);
    xs = px.data();
  }
  const auto* packed = static_cast<const uint16_t*>(w.data);
  const int64_t groups = (w.rows + kGroupRows - 1) / kGroupRows, group_elems = kGroupRows * cols;
  auto tile = [&](int64_t g0, int ng, int64_t t0, int nt, int64_t p0, int64_t p1) {
    PackedTileOf<kType>(ng, nt)(packed + g0 * group_elems, group_elems, xs, cols, t0, p0, p1, y,
                                w.rows, g0 * kGroupRows, w.rows - g0 * kGroupRows);
  };
  if (num_tokens == 1) {
    const int64_t chunks = (groups + kPackedGroups - 1) / kPackedGroups;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t g0 = c * kPackedGroups;
      tile(g0, int(std::min<int64_t>(kPackedGroups, groups - g0)), 0, 1, 0, pairs);
    }
    return;
  }
  const int64_t token_block =
      std::max<int64_t>(kPackedTokens, kBlockXBytes / (kPanelPairs * 2 * int64_t(sizeof(float))) /
                                           kPackedTokens * kPackedTokens);
#pragma omp parallel
  {
    const int64_t n = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t g_begin = groups * id / n, g_end = groups * (id + 1) / n;
    for (int64_t tb = 0; tb < num_tokens; tb += token_block) {
      const int64_t te = std::min(num_tokens, tb + token_block);
      for (int64_t p0 = 0; p0 < pairs; p0 += kPanelPairs) {
        const int64_t p1 = std::min(pairs, p0 + kPanelPairs);
        for (int64_t g0 = g_begin; g0 < g_end; g0 += kPackedGroups) {
          const int ng = int(std::min<int64_t>(kPackedGroups, g_end - g0));
          for (int64_t t0 = tb; t0 < te; t0 += kPackedTokens) {
            tile(g0, ng, t0, int(std::min<int64_t>(kPackedTokens, te - t0)), p0, p1);
          }
        }
      }
    }
  }
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
  if (w.packed) {
    if (w.dtype == DType::kBF16) {
      LinearPacked<DType::kBF16>(x, w, y, num_tokens);
    } else {
      LinearPacked<DType::kF16>(x, w, y, num_tokens);
    }
    return true;
  }
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

bool HalfKernelWantsPacked() { return true; }

#else

bool LinearHalf(const float*, const WeightMatrix&, float*, int64_t) { return false; }
bool HalfKernelWantsPacked() { return false; }

#endif

// The layout's helpers (any build: LoadRow reads packed matrices too).
namespace {
// Where (row, col) lives, in 16-bit elements from the matrix's start.
int64_t PackedIndex(int64_t cols, DType dtype, int64_t row, int64_t col) {
  const int64_t group = row / kGroupRows * kGroupRows * EvenCols(cols),
                pair = col / 2 * 2 * kGroupRows;
  const int64_t lane = row % kGroupRows;
  return group + pair + (dtype == DType::kBF16 ? 2 * lane + col % 2 : col % 2 * kGroupRows + lane);
}
}  // namespace

int64_t HalfPackedBytes(int64_t rows, int64_t cols) {
  return (rows + kGroupRows - 1) / kGroupRows * kGroupRows * EvenCols(cols) * 2;
}

WeightMatrix PackHalf(const WeightMatrix& w, void* out) {
  const auto* src = static_cast<const uint16_t*>(w.data);
  auto* dst = static_cast<uint16_t*>(out);
  const int64_t groups = (w.rows + kGroupRows - 1) / kGroupRows, cols = EvenCols(w.cols);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < kGroupRows; ++i) {
      const int64_t r = g * kGroupRows + i;
      for (int64_t c = 0; c < cols; ++c) {
        dst[PackedIndex(w.cols, w.dtype, r, c)] =
            r < w.rows && c < w.cols ? src[r * w.cols + c] : 0;
      }
    }
  }
  WeightMatrix m = w;
  m.data = out;
  m.packed = true;
  return m;
}

uint16_t PackedHalfValue(const WeightMatrix& w, int64_t row, int64_t col) {
  return static_cast<const uint16_t*>(w.data)[PackedIndex(w.cols, w.dtype, row, col)];
}

}  // namespace llm::cpu
