// The persistent prefill kernel's item order (kernels/prefill_item_order.h): every item maps to
// one (pair, query tile) and back, sections hold whole GQA groups, a section's items run its
// pairs' heaviest tiles first, and the launcher's section sizes for the shapes it was measured
// on (bench/NOTEBOOK.md, 2026-12-06: an H100's 50 MiB L2 and 132 SMs).
#include "kernels/prefill_item_order.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

namespace llm {
namespace {

TEST(PrefillItemOrder, EveryItemOnceAndSectionsInOrder) {
  for (int pairs : {1, 2, 3, 7, 16, 33, 512}) {
    for (int per_pair : {1, 2, 4, 5, 16}) {
      for (int section : {1, 2, 3, 8, pairs}) {
        if (section > pairs) continue;
        std::set<std::pair<int, int>> seen;
        int last_section = 0, last_tile = 0;
        for (int item = 0; item < pairs * per_pair; ++item) {
          const PrefillItem it = PrefillItemAt(item, pairs, per_pair, section);
          ASSERT_GE(it.pair, 0);
          ASSERT_LT(it.pair, pairs);
          ASSERT_GE(it.tile_from_last, 0);
          ASSERT_LT(it.tile_from_last, per_pair);
          ASSERT_TRUE(seen.insert({it.pair, it.tile_from_last}).second)
              << "item " << item << " repeats (pairs " << pairs << ", per pair " << per_pair
              << ", section " << section << ")";
          // Sections in order; inside one, tiles heaviest first (never back to a heavier one).
          const int sec = it.pair / section;
          ASSERT_GE(sec, last_section) << "item " << item;
          if (sec == last_section) {
            ASSERT_GE(it.tile_from_last, last_tile) << "item " << item;
          } else {
            ASSERT_EQ(it.tile_from_last, 0) << "item " << item;
          }
          last_section = sec;
          last_tile = it.tile_from_last;
        }
        EXPECT_EQ(seen.size(), size_t(pairs) * per_pair);
      }
    }
  }
}

TEST(PrefillItemOrder, OneSectionIsTileOrderOverAllPairs) {
  // The order before sections: item i is tile i / pairs of pair i % pairs.
  for (int item = 0; item < 48; ++item) {
    const PrefillItem it = PrefillItemAt(item, 12, 4, 12);
    EXPECT_EQ(it.pair, item % 12);
    EXPECT_EQ(it.tile_from_last, item / 12);
  }
}

constexpr int64_t kL2 = 50 << 20;  // an H100's L2
constexpr int kSms = 132;
constexpr int64_t kHd128 = 128 * 2 * 2;  // K and V bytes per key, bf16, head_dim 128

TEST(PrefillItemOrder, SectionSizesOfTheMeasuredShapes) {
  // 16 heads, 16k tokens: 32 × 512 and 8 × 2k get sections of 100 and 25 pairs (their K/V at
  // 256 KiB and 1 MiB a pair in 25 MiB); 4 × 4k and 1 × 16k (64 and 16 KV pairs, at most
  // half the SMs) run in one section.
  EXPECT_EQ(PrefillItemSection(32, 16, 1, 512, kHd128, kL2, kSms), 100);
  EXPECT_EQ(PrefillItemSection(8, 16, 1, 2048, kHd128, kL2, kSms), 25);
  EXPECT_EQ(PrefillItemSection(4, 16, 1, 4096, kHd128, kL2, kSms), 64);
  EXPECT_EQ(PrefillItemSection(1, 16, 1, 16384, kHd128, kL2, kSms), 16);
  // The serving batch: 16 prompts to 2,560 keys, 256 pairs: 20 per section.
  EXPECT_EQ(PrefillItemSection(16, 16, 1, 2560, kHd128, kL2, kSms), 20);
}

TEST(PrefillItemOrder, SectionsHoldWholeGroupsAndFitHalfTheL2) {
  // Llama-3-8B heads (32 query, 8 KV: group 4): a KV head's four query heads share a section,
  // and a section's K/V (pairs / group KV heads' worth) stays within half the L2.
  for (int64_t keys : {512, 1024, 2048, 8192, 32768}) {
    for (int seqs : {64, 128, 512}) {
      const int s = PrefillItemSection(seqs, 32, 4, keys, kHd128, kL2, kSms);
      ASSERT_GE(s, 4);
      ASSERT_LE(s, seqs * 32);
      EXPECT_EQ(s % 4, 0) << "keys " << keys << ", seqs " << seqs;
      if (s > 4 && s < seqs * 32) {
        EXPECT_LE(s / 4 * keys * kHd128, kL2 / 2) << "keys " << keys;
      }
    }
  }
  // A pair whose K/V alone passes half the L2 still gets one group per section.
  EXPECT_EQ(PrefillItemSection(200, 32, 4, 1 << 20, kHd128, kL2, kSms), 4);
  // Few KV pairs (one long prompt of 8 KV heads): one section.
  EXPECT_EQ(PrefillItemSection(1, 32, 4, 2048, kHd128, kL2, kSms), 32);
  // Nothing to order.
  EXPECT_EQ(PrefillItemSection(0, 32, 4, 2048, kHd128, kL2, kSms), 1);
}

}  // namespace
}  // namespace llm
