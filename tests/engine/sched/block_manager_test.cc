#include "engine/sched/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <stdexcept>
#include <vector>

#include "kernels/paged_kv.h"

namespace llm {
namespace {

// Tokens start, start + 1, ..., start + n - 1.
std::vector<int> Range(int start, int n) {
  std::vector<int> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = start + i;
  return ids;
}

std::vector<int> Concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(BlockManager, AllocateAndAppendAcrossBlockBoundaries) {
  BlockManager bm(8, 4);
  EXPECT_EQ(bm.block_size(), 4);
  EXPECT_EQ(bm.Allocate(1, Range(0, 6)), 0);
  EXPECT_EQ(bm.NumTokens(1), 6);
  ASSERT_EQ(bm.BlockTable(1).size(), 2u);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  const int32_t b1 = bm.BlockTable(1)[1];
  EXPECT_EQ(bm.Slot(1, 5), b1 * 4 + 1);

  std::vector<BlockCopy> copies;
  bm.Append(1, Range(6, 2), &copies);  // fills block 1 exactly
  EXPECT_EQ(bm.BlockTable(1).size(), 2u);
  bm.Append(1, Range(8, 1), &copies);  // crosses into a third block
  ASSERT_EQ(bm.BlockTable(1).size(), 3u);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.NumTokens(1), 9);
  EXPECT_EQ(bm.Slot(1, 8), bm.BlockTable(1)[2] * 4);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  for (int32_t b : bm.BlockTable(1)) EXPECT_EQ(bm.RefCount(b), 1);
}

TEST(BlockManager, FreeReturnsEveryBlock) {
  BlockManager bm(8, 4);
  bm.Allocate(1, Range(0, 9));
  bm.Allocate(2, Range(100, 3));
  EXPECT_EQ(bm.num_free_blocks(), 4);
  const std::vector<int32_t> table = bm.BlockTable(1);
  bm.Free(1);
  EXPECT_FALSE(bm.Has(1));
  EXPECT_TRUE(bm.Has(2));
  for (int32_t b : table) EXPECT_EQ(bm.RefCount(b), 0);
  bm.Free(2);
  const BlockManagerCounters c = bm.counters();
  EXPECT_EQ(c.num_blocks, 8);
  EXPECT_EQ(c.num_free_blocks, 8);
  EXPECT_EQ(c.num_cached_blocks, 0);  // nothing was marked computed
  EXPECT_EQ(c.prefix_query_tokens, 12);
  EXPECT_EQ(c.prefix_hit_tokens, 0);
}

TEST(BlockManager, RepeatedPromptHitsOnlyAfterMarkComputed) {
  BlockManager bm(16, 4);
  const std::vector<int> prompt = Range(0, 10);
  EXPECT_EQ(bm.Allocate(1, prompt), 0);
  EXPECT_EQ(bm.Allocate(2, prompt), 0);  // seq 1's KV is not written yet
  EXPECT_EQ(bm.counters().num_cached_blocks, 0);
  bm.MarkComputed(1, 7);  // one full block computed
  EXPECT_EQ(bm.counters().num_cached_blocks, 1);
  bm.MarkComputed(1, 10);
  EXPECT_EQ(bm.counters().num_cached_blocks, 2);
  bm.MarkComputed(2, 10);  // same prefix computed twice: the first entry stays
  EXPECT_EQ(bm.counters().num_cached_blocks, 2);

  EXPECT_EQ(bm.Allocate(3, prompt), 8);
  const auto& t1 = bm.BlockTable(1);
  const auto& t3 = bm.BlockTable(3);
  EXPECT_EQ(t3[0], t1[0]);
  EXPECT_EQ(t3[1], t1[1]);
  EXPECT_NE(t3[2], t1[2]);
  EXPECT_EQ(bm.RefCount(t1[0]), 2);
  EXPECT_EQ(bm.RefCount(t3[2]), 1);
  const BlockManagerCounters c = bm.counters();
  EXPECT_EQ(c.prefix_query_tokens, 30);
  EXPECT_EQ(c.prefix_hit_tokens, 8);
}

TEST(BlockManager, FreedCachedBlocksAreRevived) {
  BlockManager bm(16, 4);
  const std::vector<int> prompt = Range(0, 10);
  bm.Allocate(1, prompt);
  bm.MarkComputed(1, 10);
  const std::vector<int32_t> table = bm.BlockTable(1);
  bm.Free(1);
  EXPECT_EQ(bm.num_free_blocks(), 16);  // cached-free blocks count as free
  EXPECT_EQ(bm.counters().num_cached_blocks, 2);
  EXPECT_EQ(bm.Allocate(2, prompt), 8);
  EXPECT_EQ(bm.BlockTable(2)[0], table[0]);
  EXPECT_EQ(bm.BlockTable(2)[1], table[1]);
  EXPECT_EQ(bm.RefCount(table[0]), 1);
  EXPECT_EQ(bm.num_free_blocks(), 13);
}

TEST(BlockManager, SameBlockUnderAnotherPrefixDoesNotHit) {
  BlockManager bm(16, 4);
  const std::vector<int> shared = Range(50, 4);
  bm.Allocate(1, Concat(Concat(Range(0, 4), shared), {9}));
  bm.MarkComputed(1, 9);
  EXPECT_EQ(bm.counters().num_cached_blocks, 2);
  // Block 1 has equal tokens, but its KV depends on a different first block.
  EXPECT_EQ(bm.Allocate(2, Concat(Concat(Range(10, 4), shared), {9})), 0);
  // A partial match stops at the first differing block.
  EXPECT_EQ(bm.Allocate(3, Concat(Concat(Range(0, 4), Range(60, 4)), {9})), 4);
}

TEST(BlockManager, BlockHoldingTheLastPromptTokenIsNeverReused) {
  BlockManager bm(16, 4);
  const std::vector<int> prompt = Range(0, 8);  // exactly two blocks
  bm.Allocate(1, prompt);
  bm.MarkComputed(1, 8);
  EXPECT_EQ(bm.counters().num_cached_blocks, 2);
  // Fully cached, yet the last token must be computed: block 1 is recomputed into a fresh
  // private block, and the cached one is never written.
  EXPECT_EQ(bm.Allocate(2, prompt), 4);
  EXPECT_EQ(bm.BlockTable(2)[0], bm.BlockTable(1)[0]);
  EXPECT_NE(bm.BlockTable(2)[1], bm.BlockTable(1)[1]);
  EXPECT_EQ(bm.RefCount(bm.BlockTable(1)[1]), 1);
  EXPECT_EQ(bm.Allocate(3, Range(0, 4)), 0);  // a one-block prompt computes its block
  EXPECT_EQ(bm.Allocate(4, Range(0, 9)), 8);  // one token past: both blocks hit
}

TEST(BlockManager, EvictsLeastRecentlyUsedCachedBlock) {
  BlockManager bm(4, 4);
  const std::vector<int> a = Range(0, 5);
  const std::vector<int> b = Range(100, 5);
  bm.Allocate(1, a);
  bm.Allocate(2, b);
  bm.MarkComputed(1, 5);
  bm.MarkComputed(2, 5);
  const int32_t cached_a = bm.BlockTable(1)[0];
  const int32_t cached_b = bm.BlockTable(2)[0];
  bm.Free(1);  // a's cached block is now the least recently used
  bm.Free(2);
  EXPECT_EQ(bm.counters().num_cached_blocks, 2);

  // Three fresh blocks: the two uncached free blocks first, then a's cached block.
  bm.Allocate(3, Range(200, 12));
  const auto& t3 = bm.BlockTable(3);
  EXPECT_NE(std::find(t3.begin(), t3.end(), cached_a), t3.end());
  EXPECT_EQ(std::find(t3.begin(), t3.end(), cached_b), t3.end());
  EXPECT_EQ(bm.counters().num_cached_blocks, 1);

  // b's hit is on a cached-free block: it still takes one of the free ones, so b needs 2.
  EXPECT_EQ(bm.num_free_blocks(), 1);
  EXPECT_FALSE(bm.CanAllocate(b));
  bm.Free(3);
  EXPECT_EQ(bm.Allocate(4, a), 0);
  EXPECT_EQ(bm.Allocate(5, b), 4);
  EXPECT_EQ(bm.BlockTable(5)[0], cached_b);
}

TEST(BlockManager, CanAllocateDiscountsHitsOnBlocksInUse) {
  BlockManager bm(3, 4);
  const std::vector<int> prompt = Range(0, 5);
  bm.Allocate(1, prompt);
  bm.MarkComputed(1, 5);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  EXPECT_FALSE(bm.CanAllocate(Range(50, 5)));  // needs two
  EXPECT_TRUE(bm.CanAllocate(prompt));         // block 0 is shared, block 1 is new
  EXPECT_EQ(bm.Allocate(2, prompt), 4);
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_FALSE(bm.CanAllocate(prompt));
  EXPECT_FALSE(bm.CanAllocate({}));
}

TEST(BlockManager, ForkSharesAndCopiesOnWriteToPartialBlock) {
  BlockManager bm(8, 4);
  bm.Allocate(1, Range(0, 6));
  bm.MarkComputed(1, 6);
  bm.Fork(1, 2);
  const std::vector<int32_t> parent_table = bm.BlockTable(1);
  EXPECT_EQ(bm.BlockTable(2), parent_table);
  for (int32_t b : parent_table) EXPECT_EQ(bm.RefCount(b), 2);

  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.CanAppend(2));
  bm.Append(2, std::vector<int>{42}, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src_block, parent_table[1]);
  EXPECT_EQ(copies[0].dst_block, bm.BlockTable(2)[1]);
  EXPECT_NE(copies[0].dst_block, parent_table[1]);
  EXPECT_EQ(bm.BlockTable(1), parent_table);  // the parent's blocks are untouched
  EXPECT_EQ(bm.BlockTable(2)[0], parent_table[0]);
  EXPECT_EQ(bm.RefCount(parent_table[0]), 2);
  EXPECT_EQ(bm.RefCount(parent_table[1]), 1);
  EXPECT_EQ(bm.Slot(2, 6), copies[0].dst_block * 4 + 2);

  copies.clear();
  bm.Append(1, std::vector<int>{43}, &copies);  // the parent's partial block is private again
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.Slot(1, 6), parent_table[1] * 4 + 2);
}

TEST(BlockManager, ForkOfFullBlocksAppendsIntoNewBlocks) {
  BlockManager bm(8, 4);
  bm.Allocate(1, Range(0, 8));
  bm.MarkComputed(1, 8);
  bm.Fork(1, 2);
  std::vector<BlockCopy> copies;
  bm.Append(2, std::vector<int>{7}, &copies);
  bm.Append(1, std::vector<int>{8}, &copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.BlockTable(2).size(), 3u);
  EXPECT_NE(bm.BlockTable(1)[2], bm.BlockTable(2)[2]);
  EXPECT_EQ(bm.RefCount(bm.BlockTable(1)[1]), 2);
}

TEST(BlockManager, RefusesWhenThePoolIsExhausted) {
  BlockManager bm(2, 4);
  EXPECT_FALSE(bm.CanAllocate(Range(0, 9)));
  EXPECT_THROW(bm.Allocate(1, Range(0, 9)), std::logic_error);
  EXPECT_FALSE(bm.Has(1));
  bm.Allocate(1, Range(0, 6));
  EXPECT_TRUE(bm.CanAppend(1, 2));
  EXPECT_FALSE(bm.CanAppend(1, 3));
  std::vector<BlockCopy> copies;
  EXPECT_THROW(bm.Append(1, Range(6, 3), &copies), std::logic_error);
  EXPECT_EQ(bm.NumTokens(1), 6);
  bm.Append(1, Range(6, 2), &copies);
  EXPECT_FALSE(bm.CanAppend(1));
  EXPECT_TRUE(bm.CanAppend(1, 0));

  // A copy-on-write needs a free block too.
  BlockManager cow(3, 4);
  cow.Allocate(1, Range(0, 6));
  cow.MarkComputed(1, 6);
  cow.Fork(1, 2);
  cow.Allocate(3, Range(50, 2));
  EXPECT_FALSE(cow.CanAppend(2));
}

TEST(BlockManager, EngineInvariantsThrowLogicError) {
  BlockManager bm(4, 4);
  std::vector<BlockCopy> copies;
  EXPECT_THROW(bm.NumTokens(7), std::logic_error);
  EXPECT_THROW(bm.BlockTable(7), std::logic_error);
  EXPECT_THROW(bm.Free(7), std::logic_error);
  EXPECT_THROW(bm.Append(7, std::vector<int>{1}, &copies), std::logic_error);
  EXPECT_THROW(bm.Allocate(1, {}), std::logic_error);
  bm.Allocate(1, Range(0, 5));
  EXPECT_THROW(bm.Allocate(1, Range(0, 5)), std::logic_error);
  EXPECT_THROW(bm.Slot(1, 5), std::logic_error);
  EXPECT_THROW(bm.Slot(1, -1), std::logic_error);
  EXPECT_THROW(bm.MarkComputed(1, 6), std::logic_error);
  EXPECT_THROW(bm.RefCount(4), std::logic_error);
  EXPECT_THROW(bm.Fork(1, 2), std::logic_error);  // not computed yet
  bm.MarkComputed(1, 5);
  bm.Fork(1, 2);
  EXPECT_THROW(bm.Fork(1, 2), std::logic_error);
  EXPECT_THROW(BlockManager(0, 4), std::invalid_argument);
}

TEST(BlockManager, PrefixCachingDisabledNeverHits) {
  BlockManager bm(16, 4, /*enable_prefix_caching=*/false);
  bm.Allocate(1, Range(0, 10));
  bm.MarkComputed(1, 10);
  EXPECT_EQ(bm.Allocate(2, Range(0, 10)), 0);
  const BlockManagerCounters c = bm.counters();
  EXPECT_EQ(c.num_cached_blocks, 0);
  EXPECT_EQ(c.prefix_query_tokens, 20);
  EXPECT_EQ(c.prefix_hit_tokens, 0);
  bm.Free(1);
  bm.Free(2);
  EXPECT_EQ(bm.num_free_blocks(), 16);
}

// Sliding-window mode (kernels/paged_kv.h: FirstKeyRead aligns the window's first key down to
// kMaxKeyTile = 128). Block size 16, window 100, steps of at most 32 tokens: the lookahead is
// 100 + 128 + 3 * 32 = 324 tokens.
BlockManager WindowManager(int64_t num_blocks, bool prefix_caching = true) {
  return BlockManager(
      num_blocks, 16,
      BlockManagerOptions{
          .enable_prefix_caching = prefix_caching, .sliding_window = 100, .max_step_tokens = 32});
}

int64_t HeldBlocks(const BlockManager& bm, SeqId seq) {
  const auto& t = bm.BlockTable(seq);
  return std::count_if(t.begin(), t.end(), [](int32_t b) { return b >= 0; });
}

TEST(BlockManagerSlidingWindow, LongPromptRunsInAWindowOfBlocks) {
  BlockManager bm = WindowManager(32);  // 512 tokens of KV
  EXPECT_EQ(bm.sliding_window(), 100);
  EXPECT_EQ(bm.window_lookahead_tokens(), 324);
  EXPECT_EQ(bm.MaxBlocksPerSequence(100), 7);
  EXPECT_EQ(bm.MaxBlocksPerSequence(100000), 23);  // ceil(324 / 16) + 2
  const std::vector<int> prompt = Range(0, 3000);  // 188 blocks without the window
  ASSERT_TRUE(bm.CanAllocate(prompt));
  EXPECT_EQ(bm.Allocate(1, prompt), 0);
  EXPECT_EQ(bm.BlockTable(1).size(), 21u);  // ceil(324 / 16)
  EXPECT_EQ(bm.num_free_blocks(), 11);
  EXPECT_THROW(bm.Slot(1, 324 + 16), std::logic_error);  // not reserved yet
  int64_t max_held = 0;
  for (int64_t done = 0; done < 3000; done += 32) {  // chunked prefill, 32 tokens a step
    const int64_t end = std::min<int64_t>(done + 32, 3000);
    ASSERT_TRUE(bm.CanReserve(1, end)) << end;
    bm.Reserve(1, end);
    EXPECT_GE(bm.Slot(1, end - 1), 0);
    bm.MarkComputed(1, end);
    // Exactly the blocks wholly left of the first key a later query reads are given back.
    const int64_t first_read = FirstKeyRead(end, 100);
    const auto& table = bm.BlockTable(1);
    for (int64_t i = 0; i < std::ssize(table); ++i) {
      ASSERT_EQ(table[static_cast<size_t>(i)] < 0, (i + 1) * 16 <= first_read) << end << " " << i;
    }
    if (first_read > 0) {
      EXPECT_THROW(bm.Slot(1, first_read - 1), std::logic_error);
    }
    max_held = std::max(max_held, HeldBlocks(bm, 1));
  }
  EXPECT_LE(max_held, bm.MaxBlocksPerSequence(3000));
  // Decoding on: each new block comes with a given-back one.
  std::vector<BlockCopy> copies;
  for (int t = 0; t < 500; ++t) {
    ASSERT_TRUE(bm.CanAppend(1, 1));
    const int token[1] = {t};
    bm.Append(1, token, &copies);
    bm.MarkComputed(1, bm.NumTokens(1));
    max_held = std::max(max_held, HeldBlocks(bm, 1));
  }
  EXPECT_TRUE(copies.empty());
  EXPECT_LE(max_held, bm.MaxBlocksPerSequence(3500));
  EXPECT_EQ(bm.BlockTable(1).size(), 219u);  // ceil(3500 / 16) entries, most of them -1
  const int64_t released = bm.counters().window_released_blocks;
  EXPECT_EQ(released, std::count(bm.BlockTable(1).begin(), bm.BlockTable(1).end(), -1));
  EXPECT_EQ(released, FirstKeyRead(3500, 100) / 16);
  bm.Free(1);
  EXPECT_EQ(bm.num_free_blocks(), 32);
}

TEST(BlockManagerSlidingWindow, GivenBackBlocksStayPrefixCacheEntries) {
  BlockManager bm = WindowManager(64);
  const std::vector<int> prompt = Range(0, 600);
  bm.Allocate(1, prompt);
  for (int64_t end = 32; end < 600 + 32; end += 32) {
    bm.Reserve(1, std::min<int64_t>(end, 600));
    bm.MarkComputed(1, std::min<int64_t>(end, 600));
  }
  EXPECT_EQ(bm.BlockTable(1)[0], -1);
  bm.Free(1);
  EXPECT_EQ(bm.num_free_blocks(), 64);
  // The same prompt and more: every full block before the last token hits, the given-back
  // ones included (37 blocks), and those left of the window are given back at once.
  const std::vector<int> longer = Concat(prompt, Range(5000, 40));
  ASSERT_TRUE(bm.CanAllocate(longer));
  EXPECT_EQ(bm.Allocate(2, longer), 592);
  EXPECT_EQ(bm.counters().prefix_hit_tokens, 592);
  const auto& table = bm.BlockTable(2);
  const int64_t first_read = FirstKeyRead(592, 100);  // 384
  ASSERT_EQ(first_read, 384);
  for (int64_t i = 0; i < std::ssize(table); ++i) {
    EXPECT_EQ(table[static_cast<size_t>(i)] < 0, i < 24) << i;
  }
  EXPECT_EQ(bm.Slot(2, 384), bm.BlockTable(2)[24] * 16);
  bm.Free(2);
  EXPECT_EQ(bm.num_free_blocks(), 64);
}

TEST(BlockManagerSlidingWindow, ForkedChildKeepsSharedBlocksItsParentGaveBack) {
  BlockManager bm = WindowManager(64, /*prefix_caching=*/false);
  bm.Allocate(1, Range(0, 300));
  bm.Reserve(1, 300);
  bm.MarkComputed(1, 300);  // first read 128: blocks 0..7 given back
  ASSERT_EQ(HeldBlocks(bm, 1), 11);
  bm.Fork(1, 2);
  EXPECT_EQ(bm.BlockTable(2), bm.BlockTable(1));
  std::vector<BlockCopy> copies;
  const int t1[1] = {7}, t2[1] = {8};
  bm.Append(1, t1, &copies);
  bm.Append(2, t2, &copies);
  ASSERT_EQ(copies.size(), 1u);  // the shared partial last block, copied on write
  // The parent moves on alone: the blocks it gives back stay with the child.
  for (int t = 0; t < 200; ++t) {
    const int token[1] = {t};
    bm.Append(1, token, &copies);
    bm.MarkComputed(1, bm.NumTokens(1));
  }
  const int32_t shared = bm.BlockTable(2)[8];
  EXPECT_EQ(bm.BlockTable(1)[8], -1);
  EXPECT_EQ(bm.RefCount(shared), 1);
  bm.Free(2);
  EXPECT_EQ(bm.RefCount(shared), 0);
  bm.Free(1);
  EXPECT_EQ(bm.num_free_blocks(), 64);
}

TEST(BlockManagerSlidingWindow, AppendOfNoTokensBacksWhatReserveHasNotReached) {
  BlockManager bm = WindowManager(64);
  bm.Allocate(1, Range(0, 401));  // a recomputed sequence: its prefill stops one short
  EXPECT_EQ(bm.BlockTable(1).size(), 21u);
  for (int64_t end = 0; end < 400;) {
    end = std::min<int64_t>(end + 32, 400);
    bm.Reserve(1, end);
    bm.MarkComputed(1, end);
  }
  EXPECT_EQ(bm.BlockTable(1).size(), 25u);  // 400 tokens reserved so far
  EXPECT_THROW(bm.Slot(1, 400), std::logic_error);
  ASSERT_TRUE(bm.CanAppend(1, 0));
  bm.Append(1, std::span<const int>(), nullptr);  // the decode of the last token
  EXPECT_EQ(bm.BlockTable(1).size(), 26u);
  EXPECT_GE(bm.Slot(1, 400), 0);
}

TEST(BlockManagerSlidingWindow, RefusesWhatThePoolCannotBack) {
  BlockManager bm = WindowManager(20);
  EXPECT_FALSE(bm.CanAllocate(Range(0, 3000)));  // needs 21 blocks for its lookahead
  EXPECT_TRUE(bm.CanAllocate(Range(0, 320)));    // 20
  bm.Allocate(1, Range(0, 100));
  EXPECT_TRUE(bm.CanReserve(1, 1000));  // clamped to its 100 tokens, all backed
  EXPECT_EQ(bm.num_free_blocks(), 13);
  EXPECT_THROW(BlockManager(8, 16, BlockManagerOptions{.sliding_window = -1}),
               std::invalid_argument);
  EXPECT_THROW(BlockManager(8, 16, BlockManagerOptions{.sliding_window = 4}),
               std::invalid_argument);  // no max_step_tokens
}

}  // namespace
}  // namespace llm
