// Random operations on a BlockManager checked against a reference model of what each
// sequence holds, with a simulated KV store: every slot holds the fingerprint of the whole
// prefix whose last token was written there, so reading a sequence back through its block
// table proves that prefix-cache hits and copy-on-write copies hand out correct KV. With a
// sliding window, the keys a sequence can still read (from FirstKeyRead of its computed tokens)
// read back so, and every block left of them has been given back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "engine/sched/block_manager.h"
#include "kernels/paged_kv.h"

namespace llm {
namespace {

// Independent of the manager's hash: a KV row depends on the token and everything before it.
uint64_t Fingerprint(uint64_t prev, int token) {
  uint64_t h = (prev ^ static_cast<uint64_t>(token + 7)) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

struct ModelSeq {
  std::vector<int> tokens;
  std::vector<uint64_t> fingerprints;  // [i]: the KV of the token at position i
  int64_t num_computed = 0;

  void Push(int token) {
    tokens.push_back(token);
    fingerprints.push_back(Fingerprint(fingerprints.empty() ? 1 : fingerprints.back(), token));
  }
};

struct Params {
  uint64_t seed;
  int64_t block_size;
  int64_t num_blocks;
  bool is_prefix_caching;
  int64_t sliding_window = 0;  // > 0: sliding-window mode
};

void PrintTo(const Params& p, std::ostream* os) {
  *os << "seed " << p.seed << ", block_size " << p.block_size << ", num_blocks " << p.num_blocks
      << ", prefix caching " << (p.is_prefix_caching ? "on" : "off") << ", window "
      << p.sliding_window;
}

class PropertyRun {
 public:
  explicit PropertyRun(const Params& p)
      : p_(p),
        bm_(p.num_blocks, p.block_size,
            BlockManagerOptions{.enable_prefix_caching = p.is_prefix_caching,
                                .sliding_window = p.sliding_window,
                                .max_step_tokens = kMaxChunk}),
        rng_(p.seed),
        kv_(p.num_blocks * p.block_size, 0) {
    // A few shared prefixes over a tiny vocabulary, so equal blocks under different
    // prefixes occur too.
    for (int i = 0; i < 4; ++i) {
      std::vector<int> prefix;
      for (int j = 0; j < 40; ++j) prefix.push_back(Uniform(0, 5));
      prefixes_.push_back(prefix);
    }
  }

  void Run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      // Sliding-window mode: longer sequences (more appends, fewer frees), so windows move.
      const bool w = p_.sliding_window > 0;
      const int kind = Uniform(0, 99);
      if (kind < (w ? 15 : 25)) {
        DoAllocate();
      } else if (kind < 50) {
        DoCompute();
      } else if (kind < (w ? 80 : 70)) {
        DoAppend();
      } else if (kind < (w ? 88 : 80)) {
        DoFork();
      } else {
        DoFree();
      }
      CheckInvariants();
      if (HasFailure()) FAIL() << "seed " << p_.seed << " op " << op;
    }
    FreeEverything();
  }

  int64_t num_hit_tokens = 0, num_copies = 0, num_refusals = 0, num_forks = 0;
  int64_t num_released() const { return bm_.counters().window_released_blocks; }

 private:
  static constexpr int kMaxChunk = 12;  // sliding-window mode: tokens per DoCompute at most
  static bool HasFailure() { return ::testing::Test::HasFailure(); }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  int64_t CeilDiv(int64_t a) const { return (a + p_.block_size - 1) / p_.block_size; }

  SeqId PickSeq() {
    auto it = seqs_.begin();
    std::advance(it, Uniform(0, static_cast<int>(seqs_.size()) - 1));
    return it->first;
  }

  // The first token a sequence can still read (0 without a window).
  int64_t FirstRead(const ModelSeq& s) const {
    return FirstKeyRead(s.num_computed, p_.sliding_window);
  }

  // Every sequence's computed tokens that it can still read, read back through its block table.
  void ExpectKvMatches(SeqId id, const ModelSeq& s) {
    for (int64_t pos = FirstRead(s); pos < s.num_computed; ++pos) {
      ASSERT_EQ(kv_[bm_.Slot(id, pos)], s.fingerprints[pos]) << "seq " << id << " pos " << pos;
    }
  }

  void DoAllocate() {
    if (seqs_.size() >= 12) return;
    const auto& prefix = prefixes_[Uniform(0, 3)];
    ModelSeq s;
    for (int i = 0, n = Uniform(0, 40); i < n; ++i) s.Push(prefix[i]);
    for (int i = 0, n = Uniform(s.tokens.empty() ? 1 : 0, 12); i < n; ++i) s.Push(Uniform(0, 5));
    if (!bm_.CanAllocate(s.tokens)) {
      num_refusals++;
      // Hits only ever reduce the need, so a refusal means too few free blocks outright.
      EXPECT_GT(CeilDiv(s.tokens.size()), bm_.num_free_blocks());
      return;
    }
    const SeqId id = next_id_++;
    const int64_t num_cached = bm_.Allocate(id, s.tokens);
    EXPECT_EQ(num_cached % p_.block_size, 0);
    EXPECT_LT(num_cached, static_cast<int64_t>(s.tokens.size()));
    if (!p_.is_prefix_caching) {
      EXPECT_EQ(num_cached, 0);
    }
    const int64_t table_size = std::ssize(bm_.BlockTable(id));
    if (p_.sliding_window == 0) {
      EXPECT_EQ(table_size, CeilDiv(s.tokens.size()));
    } else {  // the cached prefix and a lookahead past it
      EXPECT_EQ(table_size, CeilDiv(std::min<int64_t>(s.tokens.size(),
                                                      FirstKeyRead(num_cached, p_.sliding_window) +
                                                          bm_.window_lookahead_tokens())));
    }
    s.num_computed = num_cached;
    num_hit_tokens += num_cached;
    num_query_tokens_ += s.tokens.size();
    ExpectKvMatches(id, s);
    seqs_[id] = std::move(s);
  }

  // The model runner: writes KV for a chunk of uncomputed tokens, never into a block
  // that any other sequence references.
  void DoCompute() {
    std::vector<SeqId> pending;
    for (const auto& [id, s] : seqs_) {
      if (s.num_computed < static_cast<int64_t>(s.tokens.size())) pending.push_back(id);
    }
    if (pending.empty()) return;
    const SeqId id = pending[Uniform(0, static_cast<int>(pending.size()) - 1)];
    ModelSeq& s = seqs_[id];
    int64_t end = s.num_computed + Uniform(1, static_cast<int>(s.tokens.size() - s.num_computed));
    if (p_.sliding_window > 0) {  // chunk by chunk, each reserved first
      end = std::min<int64_t>(end, s.num_computed + kMaxChunk);
      if (!bm_.CanReserve(id, end)) {
        num_refusals++;
        EXPECT_GT(CeilDiv(end) - std::ssize(bm_.BlockTable(id)), bm_.num_free_blocks());
        return;
      }
      bm_.Reserve(id, end);
    }
    for (int64_t pos = s.num_computed; pos < end; ++pos) {
      const int64_t slot = bm_.Slot(id, pos);
      const int32_t block = static_cast<int32_t>(slot / p_.block_size);
      ASSERT_EQ(bm_.RefCount(block), 1) << "write into shared block " << block;
      for (const auto& [other, unused] : seqs_) {
        if (other == id) continue;
        const auto& table = bm_.BlockTable(other);
        ASSERT_EQ(std::count(table.begin(), table.end(), block), 0) << "block " << block;
      }
      kv_[slot] = s.fingerprints[pos];
    }
    s.num_computed = end;
    bm_.MarkComputed(id, end);
  }

  void DoAppend() {
    if (seqs_.empty()) return;
    const SeqId id = PickSeq();
    ModelSeq& s = seqs_[id];
    const int n = Uniform(1, p_.sliding_window > 0 ? 24 : 6);
    const int64_t num_tokens = s.tokens.size();
    const auto& table = bm_.BlockTable(id);
    const int64_t table_size = std::ssize(table);  // < CeilDiv(num_tokens): not all reserved
    const bool is_shared_partial = num_tokens % p_.block_size != 0 &&
                                   table_size == CeilDiv(num_tokens) &&
                                   bm_.RefCount(table.back()) > 1;
    if (!bm_.CanAppend(id, n)) {
      num_refusals++;
      const int64_t num_needed = CeilDiv(num_tokens + n) - table_size + is_shared_partial;
      EXPECT_GT(num_needed, bm_.num_free_blocks());
      return;
    }
    std::vector<int> ids;
    for (int i = 0; i < n; ++i) ids.push_back(Uniform(0, 5));
    std::vector<BlockCopy> copies;
    bm_.Append(id, ids, &copies);
    ASSERT_EQ(copies.size(), is_shared_partial ? 1u : 0u);
    for (const BlockCopy& c : copies) {  // the runner copies whole blocks
      ASSERT_GE(bm_.RefCount(c.src_block), 1);
      ASSERT_EQ(bm_.RefCount(c.dst_block), 1);
      for (int64_t i = 0; i < p_.block_size; ++i) {
        kv_[c.dst_block * p_.block_size + i] = kv_[c.src_block * p_.block_size + i];
      }
      num_copies++;
    }
    for (int t : ids) s.Push(t);
  }

  void DoFork() {
    if (seqs_.empty() || seqs_.size() >= 12) return;
    const SeqId parent = PickSeq();
    if (seqs_[parent].num_computed != static_cast<int64_t>(seqs_[parent].tokens.size())) return;
    const SeqId child = next_id_++;
    bm_.Fork(parent, child);
    seqs_[child] = seqs_[parent];
    num_forks++;
  }

  void DoFree() {
    if (seqs_.empty()) return;
    const SeqId id = PickSeq();
    bm_.Free(id);
    seqs_.erase(id);
  }

  void CheckInvariants() {
    std::map<int32_t, int32_t> num_refs;
    for (const auto& [id, s] : seqs_) {
      ASSERT_TRUE(bm_.Has(id));
      ASSERT_EQ(bm_.NumTokens(id), static_cast<int64_t>(s.tokens.size()));
      const auto& table = bm_.BlockTable(id);
      if (p_.sliding_window == 0) {
        ASSERT_EQ(std::ssize(table), CeilDiv(s.tokens.size()));
      } else {  // every computed token has had its block; maybe not all the others yet
        ASSERT_GE(std::ssize(table), CeilDiv(s.num_computed));
        ASSERT_LE(std::ssize(table), CeilDiv(s.tokens.size()));
      }
      // Given back: exactly the blocks wholly left of the first key still read.
      const int64_t num_released = std::min<int64_t>(FirstRead(s) / p_.block_size, table.size());
      std::set<int32_t> distinct;
      for (int64_t i = 0; i < std::ssize(table); ++i) {
        const int32_t b = table[static_cast<size_t>(i)];
        ASSERT_EQ(b < 0, i < num_released) << "seq " << id << " table entry " << i;
        if (b < 0) continue;
        ASSERT_TRUE(distinct.insert(b).second) << "a block twice in seq " << id;
        num_refs[b]++;
      }
      ExpectKvMatches(id, s);
    }
    for (int32_t b = 0; b < p_.num_blocks; ++b) {
      const auto it = num_refs.find(b);
      ASSERT_EQ(bm_.RefCount(b), it == num_refs.end() ? 0 : it->second) << "block " << b;
    }
    const BlockManagerCounters c = bm_.counters();
    ASSERT_EQ(c.num_free_blocks, p_.num_blocks - static_cast<int64_t>(num_refs.size()));
    ASSERT_EQ(c.num_free_blocks, bm_.num_free_blocks());
    ASSERT_LE(c.num_cached_blocks, p_.num_blocks);
    if (!p_.is_prefix_caching) {
      ASSERT_EQ(c.num_cached_blocks, 0);
    }
    ASSERT_EQ(c.prefix_hit_tokens, num_hit_tokens);
    ASSERT_EQ(c.prefix_query_tokens, num_query_tokens_);
  }

  void FreeEverything() {
    while (!seqs_.empty()) DoFree();
    for (int32_t b = 0; b < p_.num_blocks; ++b) ASSERT_EQ(bm_.RefCount(b), 0);
    const BlockManagerCounters c = bm_.counters();
    EXPECT_EQ(c.num_blocks, p_.num_blocks);
    EXPECT_EQ(c.num_free_blocks, p_.num_blocks);
    EXPECT_LE(c.num_cached_blocks, p_.num_blocks);
    EXPECT_EQ(c.prefix_hit_tokens, num_hit_tokens);
    // Every block is allocatable again.
    EXPECT_TRUE(bm_.CanAllocate(std::vector<int>(p_.num_blocks * p_.block_size, 99)));
  }

  Params p_;
  BlockManager bm_;
  std::mt19937_64 rng_;
  std::vector<uint64_t> kv_;  // flat slot -> fingerprint of the prefix written there
  std::vector<std::vector<int>> prefixes_;
  std::map<SeqId, ModelSeq> seqs_;
  SeqId next_id_ = 0;
  int64_t num_query_tokens_ = 0;
};

class BlockManagerProperty : public ::testing::TestWithParam<Params> {};

TEST_P(BlockManagerProperty, RandomOperationsKeepTheModel) {
  PropertyRun run(GetParam());
  run.Run(20000);
  std::printf("hit tokens %ld, copies %ld, refusals %ld, forks %ld, window releases %ld\n",
              static_cast<long>(run.num_hit_tokens), static_cast<long>(run.num_copies),
              static_cast<long>(run.num_refusals), static_cast<long>(run.num_forks),
              static_cast<long>(run.num_released()));
  // The run must have exercised the interesting paths.
  if (GetParam().is_prefix_caching) {
    EXPECT_GT(run.num_hit_tokens, 0);
  }
  if (GetParam().block_size > 1) {  // block size 1 has no partial blocks to copy
    EXPECT_GT(run.num_copies, 0);
  }
  if (GetParam().sliding_window > 0) {
    EXPECT_GT(run.num_released(), 0);
  } else {
    EXPECT_EQ(run.num_released(), 0);
  }
  EXPECT_GT(run.num_refusals, 0);
  EXPECT_GT(run.num_forks, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, BlockManagerProperty,
                         ::testing::Values(Params{1, 4, 48, true}, Params{2, 4, 48, true},
                                           Params{3, 4, 48, true}, Params{4, 1, 160, true},
                                           Params{5, 16, 14, true}, Params{6, 4, 48, false},
                                           // Sliding-window mode: windows inside one block,
                                           // across blocks, wider than a block of 16.
                                           Params{7, 4, 200, true, 1}, Params{8, 4, 200, true, 9},
                                           Params{9, 16, 60, true, 40},
                                           Params{10, 4, 200, false, 9}),
                         [](const auto& info) { return "Seed" + std::to_string(info.param.seed); });

}  // namespace
}  // namespace llm
