// 8-bit CPU linear layers (kernels/cpu/matmul_int8.h). Each token's x is quantized once per
// call (codes padded with zeros to a multiple of 64; one fp32 scale per block, and per 4-byte
// lane for the AVX2 kernel; -128 · the block's code sum for the VNNI one).
//  - VNNI (packed weights, the header's layout): tiles of up to 4 groups of 16 rows x 3 tokens;
//    per block of 32 columns and (group, token), 8 vpdpbusd into int32 sums and one conversion
//    and fma into the fp32 accumulator. A batch walks the columns in panels of 256 (a tile's
//    4 x 16 x 256 bytes of weights stay in L1 while its tokens pass), the accumulators parked in
//    y between panels, which leaves each output's sequence of operations unchanged.
//  - AVX2 (row-major): one dot product per (row, token) over 32-byte chunks, the lane sums
//    (vpmaddubsw + vpmaddwd, the weight's sign moved onto x) converted and accumulated with the
//    lane's scale; tiles of up to 4 rows x 2 tokens.
//  - portable: block sums in int32, blocks in order by fma (the VNNI kernel's arithmetic).
// Each (row, token) pair runs the same operations whatever the tile and batch, so results do
// not depend on the batch. Decode reads the weights once, in memory order. The kernels are
// compiled for their ISA by target attributes and chosen at run time, so a build for AVX2
// machines still runs AVX-512 VNNI where it exists.
#include "kernels/cpu/matmul_int8.h"

// GCC 12 reports its own AVX-512 intrinsics (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
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
// The packed layout's columns (kernels/cpu/matmul_int8.h).
int64_t PackedCols(int64_t cols) { return RoundUp(std::max<int64_t>(cols, 1), kInt8Block); }

// One call's quantized tokens: codes [tokens][padded] (zeros past cols), the scale of each
// 4-byte lane [tokens][padded / 4] (0 past cols) and of each block [tokens][blocks], and each
// block's -128 · Σ codes [tokens][blocks].
struct Activations {
  int64_t cols = 0, padded = 0, lanes = 0, blocks = 0;
  std::vector<int8_t> q;
  std::vector<float> lane_scale, block_scale;
  std::vector<int32_t> block_bias;
  const int8_t* Codes(int64_t t) const { return q.data() + t * padded; }
  const float* Lanes(int64_t t) const { return lane_scale.data() + t * lanes; }
  const float* Blocks(int64_t t) const { return block_scale.data() + t * blocks; }
  const int32_t* Bias(int64_t t) const { return block_bias.data() + t * blocks; }
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
    int32_t sum = 0;
    for (int64_t i = begin; i < end; ++i) sum += q[i];
    a.block_bias[size_t(t * a.blocks + b)] = -128 * sum;
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
  a.block_bias.resize(size_t(num_tokens * a.blocks));
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
// ---- AVX-512 VNNI, packed weights ----------------------------------------------------------

constexpr int kPackedGroups = 4;     // groups of 16 rows per tile
constexpr int kPackedTokens = 3;     // tokens per tile (4 x 3 x 2 accumulators: 24 zmm)
constexpr int64_t kPanelBlocks = 8;  // a batch's column panel: 256 columns
constexpr int64_t kGroupBlockBytes = kInt8GroupRows * kInt8Block;  // a group's block: 512

// Tile: groups [0, kG) of `w` (group g at w + g · group_bytes, rows row0 + 16g ...) x tokens
// t0 .. t0 + kT, blocks [b0, b1). The accumulators start at 0 (b0 == 0) or at what y holds;
// they go back to y, multiplied by the rows' scales when `last`. rows_left: rows from row0 on.
template <int kG, int kT>
LLM_TARGET_VNNI void PackedTile(const uint8_t* w, int64_t group_bytes, const Activations& a,
                                int64_t t0, int64_t b0, int64_t b1, float* y, int64_t ldy,
                                int64_t row0, int64_t rows_left, const float* scales, bool last) {
  __mmask16 mask[kG];
#pragma GCC unroll 4
  for (int g = 0; g < kG; ++g) mask[g] = GroupMask(rows_left, g);
  __m512 acc[kG][kT];
#pragma GCC unroll 4
  for (int g = 0; g < kG; ++g)
#pragma GCC unroll 3
    for (int t = 0; t < kT; ++t) {
      acc[g][t] = b0 == 0 ? _mm512_setzero_ps()
                          : _mm512_maskz_loadu_ps(mask[g], y + (t0 + t) * ldy + row0 + g * 16);
    }
  const int8_t* xs[kT];
#pragma GCC unroll 3
  for (int t = 0; t < kT; ++t) xs[t] = a.Codes(t0 + t);
  for (int64_t b = b0; b < b1; ++b) {
    __m512i sum[kG][kT];
#pragma GCC unroll 3
    for (int t = 0; t < kT; ++t) {
      const __m512i bias = _mm512_set1_epi32(a.Bias(t0 + t)[b]);
#pragma GCC unroll 4
      for (int g = 0; g < kG; ++g) sum[g][t] = bias;
    }
    const uint8_t* wb = w + b * kGroupBlockBytes;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i wv[kG];
#pragma GCC unroll 4
      for (int g = 0; g < kG; ++g) {
        const uint8_t* p = wb + g * group_bytes + j * 64;
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
        wv[g] = _mm512_loadu_si512(p);
      }
#pragma GCC unroll 3
      for (int t = 0; t < kT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xs[t] + b * kInt8Block + j * 4, 4);
        const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
        for (int g = 0; g < kG; ++g) sum[g][t] = _mm512_dpbusd_epi32(sum[g][t], wv[g], xb);
      }
    }
#pragma GCC unroll 3
    for (int t = 0; t < kT; ++t) {
      const __m512 d = _mm512_set1_ps(a.Blocks(t0 + t)[b]);
#pragma GCC unroll 4
      for (int g = 0; g < kG; ++g) {
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[g][t]), d, acc[g][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < kG; ++g) {
    const __m512 s =
        last ? _mm512_maskz_loadu_ps(mask[g], scales + row0 + g * 16) : _mm512_setzero_ps();
#pragma GCC unroll 3
    for (int t = 0; t < kT; ++t) {
      _mm512_mask_storeu_ps(y + (t0 + t) * ldy + row0 + g * 16, mask[g],
                            last ? _mm512_mul_ps(acc[g][t], s) : acc[g][t]);
    }
  }
}

using PackedTileFn = void (*)(const uint8_t*, int64_t, const Activations&, int64_t, int64_t,
                              int64_t, float*, int64_t, int64_t, int64_t, const float*, bool);

PackedTileFn PackedTileOf(int ng, int nt) {
  static constexpr PackedTileFn table[kPackedGroups][kPackedTokens] = {
      {PackedTile<1, 1>, PackedTile<1, 2>, PackedTile<1, 3>},
      {PackedTile<2, 1>, PackedTile<2, 2>, PackedTile<2, 3>},
      {PackedTile<3, 1>, PackedTile<3, 2>, PackedTile<3, 3>},
      {PackedTile<4, 1>, PackedTile<4, 2>, PackedTile<4, 3>}};
  return table[ng - 1][nt - 1];
}

// y = x · Wᵀ for packed W. Decode: tiles of 4 groups over all columns, handed out to the
// threads in order. A batch: each thread one contiguous range of groups; per block of tokens
// (their codes and the tiles' outputs sized to half of a 1 MiB L2), per 4 groups, per panel of
// columns, tiles of 3 tokens.
void LinearPacked(const Activations& a, const WeightMatrix& w, float* y, int64_t num_tokens) {
  const auto* packed = static_cast<const uint8_t*>(w.data);
  const int64_t groups = (w.rows + kInt8GroupRows - 1) / kInt8GroupRows;
  const int64_t group_bytes = kInt8GroupRows * PackedCols(w.cols);
  auto tile = [&](int64_t g0, int ng, int64_t t0, int nt, int64_t b0, int64_t b1) {
    PackedTileOf(ng, nt)(packed + g0 * group_bytes, group_bytes, a, t0, b0, b1, y, w.rows,
                         g0 * kInt8GroupRows, w.rows - g0 * kInt8GroupRows, w.scales,
                         b1 == a.blocks);
  };
  if (num_tokens == 1) {
    const int64_t chunks = (groups + kPackedGroups - 1) / kPackedGroups;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t g0 = c * kPackedGroups;
      tile(g0, int(std::min<int64_t>(kPackedGroups, groups - g0)), 0, 1, 0, a.blocks);
    }
    return;
  }
  const int64_t bytes_per_token = a.padded + kPackedGroups * kInt8GroupRows * 4;
  const int64_t token_block = std::max<int64_t>(
      kPackedTokens, (int64_t{512} << 10) / bytes_per_token / kPackedTokens * kPackedTokens);
#pragma omp parallel
  {
    const int64_t n = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t g_begin = groups * id / n, g_end = groups * (id + 1) / n;
    for (int64_t tb = 0; tb < num_tokens; tb += token_block) {
      const int64_t te = std::min(num_tokens, tb + token_block);
      for (int64_t g0 = g_begin; g0 < g_end; g0 += kPackedGroups) {
        const int ng = int(std::min<int64_t>(kPackedGroups, g_end - g0));
        for (int64_t b0 = 0; b0 < a.blocks; b0 += kPanelBlocks) {
          const int64_t b1 = std::min(a.blocks, b0 + kPanelBlocks);
          for (int64_t t0 = tb; t0 < te; t0 += kPackedTokens) {
            tile(g0, ng, t0, int(std::min<int64_t>(kPackedTokens, te - t0)), b0, b1);
          }
        }
      }
    }
  }
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

int64_t Int8PackedBytes(int64_t rows, int64_t cols) {
  return RoundUp(rows, kInt8GroupRows) * PackedCols(cols);
}

WeightMatrix PackInt8(const WeightMatrix& w, void* out) {
  const auto* codes = static_cast<const int8_t*>(w.data);
  auto* dst = static_cast<uint8_t*>(out);
  const int64_t groups = (w.rows + kInt8GroupRows - 1) / kInt8GroupRows, cols = PackedCols(w.cols);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* group = dst + g * kInt8GroupRows * cols;
    for (int64_t c4 = 0; c4 < cols / 4; ++c4) {
      for (int64_t i = 0; i < kInt8GroupRows; ++i) {
        const int64_t r = g * kInt8GroupRows + i;
        for (int64_t j = 0; j < 4; ++j) {
          const int64_t c = c4 * 4 + j;
          const int v = r < w.rows && c < w.cols ? codes[r * w.cols + c] : 0;
          group[(c4 * kInt8GroupRows + i) * 4 + j] = static_cast<uint8_t>(v + 128);
        }
      }
    }
  }
  WeightMatrix m = w;
  m.data = out;
  m.packed = true;
  return m;
}

int8_t PackedInt8Code(const WeightMatrix& w, int64_t row, int64_t col) {
  const auto* p = static_cast<const uint8_t*>(w.data) +
                  row / kInt8GroupRows * kInt8GroupRows * PackedCols(w.cols);
  return static_cast<int8_t>(
      int(p[((col / 4) * kInt8GroupRows + row % kInt8GroupRows) * 4 + col % 4]) - 128);
}

bool Int8KernelWantsPacked() { return BestInt8Kernel() == Int8Kernel::kAvx512Vnni; }

void LinearInt8(const float* x, const WeightMatrix& w, float* y, int64_t num_tokens,
                Int8Kernel kernel) {
  if (num_tokens <= 0 || w.rows <= 0) return;
  // The caller's buffer, named by a reference: inside the parallel region a thread_local's
  // name would be each worker's own (empty) one.
  thread_local Activations buffer;
  Activations& a = buffer;
  Quantize(x, num_tokens, w.cols, a);
  if (w.packed) {
    if ((kernel != Int8Kernel::kAuto && kernel != Int8Kernel::kAvx512Vnni) ||
        !Int8KernelSupported(Int8Kernel::kAvx512Vnni)) {
      throw std::invalid_argument(std::string("LinearInt8: packed int8 weights need the ") +
                                  "avx512-vnni kernel (asked: " + Int8KernelName(kernel) + ")");
    }
#if defined(LLM_INT8_X86)
    LinearPacked(a, w, y, num_tokens);
#endif
    return;
  }
  Int8Kernel k = Resolve(kernel);
  if (k == Int8Kernel::kAvx512Vnni) k = Int8Kernel::kAvx2;  // VNNI reads packed weights only
  const auto* codes = static_cast<const int8_t*>(w.data);
  auto scale = [&](int64_t r) { return w.scales[r]; };
  // A token's activations: its codes and its lanes' scales.
  const int64_t bytes_per_token = a.padded + a.lanes * 4;
  ParallelRows(w.rows, num_tokens, bytes_per_token, [&](int64_t begin, int64_t end, int64_t block) {
    switch (k) {
#if defined(LLM_INT8_X86)
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
  auto code = [&](int64_t r, int64_t i) -> int64_t {
    return w.packed ? PackedInt8Code(w, r, i) : static_cast<const int8_t*>(w.data)[r * w.cols + i];
  };
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int8_t* q = a.Codes(t);
    for (int64_t r = 0; r < w.rows; ++r) {
      double sum = 0;
      for (int64_t b = 0; b < a.blocks; ++b) {
        int64_t s = 0;
        for (int64_t i = b * kInt8Block; i < std::min(w.cols, (b + 1) * kInt8Block); ++i) {
          s += int64_t(q[i]) * code(r, i);
        }
        sum += double(a.Blocks(t)[b]) * double(s);
      }
      y[t * w.rows + r] = float(sum * w.scales[r]);
    }
  }
}

}  // namespace llm::cpu
