// How the CPU's tiled linear kernels (matmul_int8.cc, matmul_half.cc) walk a block of rows for
// a batch of tokens: tiles of up to 4 rows x max_tokens tokens, each (row, token) pair computed
// by the same sequence of operations whatever the tile's size (so a token's result does not
// depend on its batch); one token (decode): one row at a time, the weights read as a single
// stream in memory order.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace llm::cpu {

// The packed kernels (matmul_int8.cc, matmul_half.cc) keep 16 rows per vector: group g of a
// tile whose first row has rows_left rows after it holds the lanes this mask sets.
inline uint16_t GroupMask(int64_t rows_left, int g) {
  const int64_t n = std::clamp<int64_t>(rows_left - int64_t{g} * 16, 0, 16);
  return n == 16 ? uint16_t{0xffff} : static_cast<uint16_t>((1u << n) - 1);
}

inline constexpr int kMaxTileRows = 4;
inline constexpr int kMaxTileTokens = 4;

// A kernel's tile: out[r][t] for rows rows[0..nr) and tokens tokens[0..nt).
template <typename T>
using TileFn = void (*)(const T* const* rows, int64_t cols, const void* acts, const int64_t* tokens,
                        float (*out)[kMaxTileTokens]);

// The kernel K<R, T>::Run instantiated for every tile size, by (rows, tokens).
template <typename T, template <int, int> class K>
TileFn<T> TileOf(int nr, int nt) {
  static constexpr TileFn<T> table[kMaxTileRows][kMaxTileTokens] = {
      {K<1, 1>::Run, K<1, 2>::Run, K<1, 3>::Run, K<1, 4>::Run},
      {K<2, 1>::Run, K<2, 2>::Run, K<2, 3>::Run, K<2, 4>::Run},
      {K<3, 1>::Run, K<3, 2>::Run, K<3, 3>::Run, K<3, 4>::Run},
      {K<4, 1>::Run, K<4, 2>::Run, K<4, 3>::Run, K<4, 4>::Run}};
  return table[nr - 1][nt - 1];
}

// y[t][r] = scale(r) · out for rows [row_begin, row_end) of the [num_rows, cols] matrix `w`:
// for each block of token_block tokens (whose activations stay in L2 while the rows pass), for
// each tile of up to 4 rows (in L1 while the block's tokens pass), tiles of max_tokens tokens.
template <typename T, template <int, int> class K, typename Scale>
void RunTiles(const T* w, int64_t num_rows, int64_t cols, const void* acts, float* y,
              int64_t num_tokens, int64_t row_begin, int64_t row_end, int max_tokens,
              int64_t token_block, Scale scale) {
  const int max_r = num_tokens == 1 ? 1 : kMaxTileRows;
  float out[kMaxTileRows][kMaxTileTokens];
  for (int64_t b0 = 0; b0 < num_tokens; b0 += token_block) {
    const int64_t b1 = std::min(num_tokens, b0 + token_block);
    for (int64_t r0 = row_begin; r0 < row_end; r0 += max_r) {
      const int nr = int(std::min<int64_t>(max_r, row_end - r0));
      const T* rows[kMaxTileRows];
      for (int r = 0; r < nr; ++r) rows[r] = w + (r0 + r) * cols;
      for (int64_t t0 = b0; t0 < b1; t0 += max_tokens) {
        const int nt = int(std::min<int64_t>(max_tokens, b1 - t0));
        int64_t tokens[kMaxTileTokens];
        for (int t = 0; t < nt; ++t) tokens[t] = t0 + t;
        TileOf<T, K>(nr, nt)(rows, cols, acts, tokens, out);
        for (int r = 0; r < nr; ++r) {
          for (int t = 0; t < nt; ++t) y[(t0 + t) * num_rows + r0 + r] = scale(r0 + r) * out[r][t];
        }
      }
    }
  }
}

// Rows for tokens on every OpenMP thread: a lone token (decode) in chunks of 16 rows handed out
// in order; a batch as one contiguous range of rows per thread (a multiple of 4), each thread's
// token blocks sized to `bytes_per_token` (its activations) so a block fits half of a 2 MiB L2.
// run(row_begin, row_end, token_block) does the work.
template <typename Run>
void ParallelRows(int64_t num_rows, int64_t num_tokens, int64_t bytes_per_token, Run run) {
  if (num_tokens == 1) {
    constexpr int64_t kRowChunk = 16;
    const int64_t num_chunks = (num_rows + kRowChunk - 1) / kRowChunk;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < num_chunks; ++c) {
      run(c * kRowChunk, std::min(num_rows, (c + 1) * kRowChunk), int64_t{1});
    }
    return;
  }
  constexpr int64_t kBlockBytes = int64_t{1} << 20;
  const int64_t block =
      std::max<int64_t>(kMaxTileTokens, kBlockBytes / std::max<int64_t>(bytes_per_token, 1) /
                                            kMaxTileTokens * kMaxTileTokens);
#pragma omp parallel
  {
    const int64_t n = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t tiles = (num_rows + kMaxTileRows - 1) / kMaxTileRows;
    const int64_t begin = std::min(num_rows, tiles * id / n * kMaxTileRows);
    const int64_t end = std::min(num_rows, tiles * (id + 1) / n * kMaxTileRows);
    if (begin < end) run(begin, end, block);
  }
}

}  // namespace llm::cpu
