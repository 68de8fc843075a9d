// Batch invariance of the CPU prefill kernel: a query row's output is bit-identical whether
// its sequence is computed in one pass, in chunks over cached context, one token at a time,
// or next to other sequences. The engine's exactness guarantee rests on this.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/flash_attention.h"

namespace llm::cpu {
namespace {

struct Fixture {
  int64_t heads, kv_heads, hd, block_size, len;
  std::vector<float> k, v, q;
  std::vector<int32_t> table;
  PagedKvLayout layout;

  Fixture(int64_t heads_, int64_t kv_heads_, int64_t hd_, int64_t bs, int64_t len_)
      : heads(heads_), kv_heads(kv_heads_), hd(hd_), block_size(bs), len(len_) {
    const int64_t num_blocks = (len + bs - 1) / bs + 3;
    layout = {num_blocks, bs, kv_heads, hd};
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.f, 1.f);
    k.resize(static_cast<size_t>(layout.pool_elements()));
    v.resize(k.size());
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    q.resize(static_cast<size_t>(len * heads * hd));
    for (float& x : q) x = dist(rng);
    table.resize(static_cast<size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);  // scattered blocks
  }

  // Output rows [start, start + n) computed as one chunk with `start` tokens of context.
  std::vector<float> Chunk(int64_t start, int64_t n) const {
    const int32_t cu[2] = {0, static_cast<int32_t>(n)};
    const int32_t ctx[1] = {static_cast<int32_t>(start)};
    AttentionBatch b{1, cu, ctx, table.data(), std::ssize(table)};
    std::vector<float> out(static_cast<size_t>(n * heads * hd), std::nanf(""));
    PagedPrefillAttention(q.data() + start * heads * hd, {k.data(), v.data(), layout}, b, heads,
                          0.125f, out.data());
    return out;
  }
};

TEST(FlashAttentionInvariance, ChunkedAndTokenByTokenEqualOnePassBitForBit) {
  for (auto [heads, kv_heads, hd, bs] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{8, 4, 8, 16},
        {8, 2, 64, 16},
        {4, 4, 80, 8},
        {16, 2, 128, 32}}) {
    Fixture f(heads, kv_heads, hd, bs, 203);
    const std::vector<float> whole = f.Chunk(0, f.len);
    const int64_t row = heads * hd;
    for (int64_t chunk : {1, 7, 33, 64, 100}) {
      for (int64_t start = 0; start < f.len; start += chunk) {
        const int64_t n = std::min(chunk, f.len - start);
        const std::vector<float> part = f.Chunk(start, n);
        for (int64_t i = 0; i < n * row; ++i) {
          ASSERT_EQ(part[static_cast<size_t>(i)], whole[static_cast<size_t>(start * row + i)])
              << "hd " << hd << " chunk " << chunk << " token " << start + i / row;
        }
      }
    }
  }
}

}  // namespace
}  // namespace llm::cpu
