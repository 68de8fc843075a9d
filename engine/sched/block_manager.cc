// The paged KV cache's bookkeeping. See block_manager.h for the contract; this file keeps
// the data structures:
//   - blocks_: per physical block, its ref count, and while it holds a prefix hash, the
//     block's token ids and the physical parent block it was registered against (both
//     compared on every hash hit, so a 64-bit collision can never hand out wrong KV);
//   - free_list_: blocks with ref count 0 and no hash (taken first);
//   - lru_: blocks with ref count 0 that still hold a hash (evicted front first);
//   - cached_: prefix hash -> the block registered for it;
//   - seqs_: per sequence, its token ids, block table and prefix-caching progress;
//   - sliding-window mode: each sequence's leading num_released_blocks table entries are -1
//     (given back), and its table may cover fewer tokens than it has (Reserve adds the rest).
// Every operation touches only the blocks it names: O(blocks touched) amortised.
#include "engine/sched/block_manager.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/paged_kv.h"

namespace llm {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kRootHash = 0x4c4c4d2d6b763031ull;  // the "parent hash" of block 0

// splitmix64's finaliser: a bijection with full avalanche.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Chained block hash: equal hashes mean (up to a 2^-64 accident, which the token and
// parent comparison then catches) equal whole prefixes.
uint64_t HashBlock(uint64_t parent_hash, std::span<const int> token_ids) {
  uint64_t h = Mix(parent_hash + kGolden);
  for (int t : token_ids) h = Mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + kGolden));
  return h;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

[[noreturn]] void Fail(const std::string& what) { throw std::logic_error("BlockManager: " + what); }

}  // namespace

// A block as a prefix-cache entry at one moment: `generation` changes whenever the
// block's hash is dropped, so a stale reference never matches a later reuse of the block.
struct BlockRef {
  int32_t block = -1;
  uint64_t generation = 0;
};

struct Block {
  int32_t ref_count = 0;
  bool has_hash = false;
  uint64_t hash = 0;
  uint64_t generation = 0;
  BlockRef parent;             // block -1 for the first block of a sequence
  std::vector<int> token_ids;  // block_size ids while has_hash
  bool is_evictable = false;   // in lru_
  std::list<int32_t>::iterator lru_pos;
};

struct Sequence {
  std::vector<int> token_ids;
  std::vector<int32_t> block_table;
  int64_t num_computed_tokens = 0;
  // Leading full computed blocks already offered to the prefix cache; `last_hash` is the
  // chain hash of the last of them and `last_cached` the registered block holding that
  // prefix (ours, or another sequence's with equal content), or block -1 when none is.
  int64_t num_hashed_blocks = 0;
  uint64_t last_hash = kRootHash;
  BlockRef last_cached;
  int64_t num_released_blocks = 0;  // sliding-window mode: leading entries given back (-1)
};

struct PrefixMatch {
  std::vector<int32_t> blocks;
  uint64_t last_hash = kRootHash;
};

struct BlockManager::Impl {
  int64_t block_size;
  bool is_prefix_caching;
  std::vector<Block> blocks;
  std::vector<int32_t> free_list;
  std::list<int32_t> lru;
  std::unordered_map<uint64_t, int32_t> cached;
  std::unordered_map<SeqId, Sequence> seqs;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t window = 0;     // sliding-window mode when > 0
  int64_t lookahead = 0;  // tokens a sequence's blocks span at most (sliding-window mode)
  int64_t window_released = 0;

  int64_t NumFree() const { return static_cast<int64_t>(free_list.size() + lru.size()); }

  Sequence& Get(SeqId seq) {
    auto it = seqs.find(seq);
    if (it == seqs.end()) Fail("unknown sequence " + std::to_string(seq));
    return it->second;
  }
  const Sequence& Get(SeqId seq) const { return const_cast<Impl*>(this)->Get(seq); }

  std::span<const int> BlockTokens(const Sequence& s, int64_t i) const {
    return std::span<const int>(s.token_ids).subspan(i * block_size, block_size);
  }

  BlockRef RefOf(int32_t b) const { return {b, blocks[b].generation}; }
  bool IsLive(BlockRef r) const {
    return r.block >= 0 && blocks[r.block].has_hash && blocks[r.block].generation == r.generation;
  }

  // Does block `b` hold exactly the prefix (parent, tokens) under hash `h`?
  bool Holds(int32_t b, uint64_t h, BlockRef parent, std::span<const int> tokens) const {
    const Block& blk = blocks[b];
    return blk.has_hash && blk.hash == h && blk.parent.block == parent.block &&
           (parent.block < 0 || blk.parent.generation == parent.generation) &&
           std::equal(tokens.begin(), tokens.end(), blk.token_ids.begin(), blk.token_ids.end());
  }

  // The longest cached full-block prefix of `prompt`, excluding the block that holds the
  // prompt's last token (that token must be computed to produce logits).
  PrefixMatch Match(std::span<const int> prompt) const {
    PrefixMatch m;
    if (!is_prefix_caching) return m;
    const int64_t num_candidates = (static_cast<int64_t>(prompt.size()) - 1) / block_size;
    BlockRef parent;
    for (int64_t i = 0; i < num_candidates; ++i) {
      auto tokens = prompt.subspan(i * block_size, block_size);
      const uint64_t h = HashBlock(m.last_hash, tokens);
      auto it = cached.find(h);
      if (it == cached.end() || !Holds(it->second, h, parent, tokens)) break;
      m.blocks.push_back(it->second);
      m.last_hash = h;
      parent = RefOf(it->second);
    }
    return m;
  }

  void DropHash(int32_t b) {
    Block& blk = blocks[b];
    cached.erase(blk.hash);
    blk.has_hash = false;
    blk.generation++;
    blk.parent = BlockRef{};
    blk.token_ids.clear();
  }

  void RemoveFromLru(int32_t b) {
    lru.erase(blocks[b].lru_pos);
    blocks[b].is_evictable = false;
  }

  // A block for new KV: the free list first, else the least recently used cached block.
  int32_t TakeFreeBlock() {
    int32_t b;
    if (!free_list.empty()) {
      b = free_list.back();
      free_list.pop_back();
    } else {
      if (lru.empty()) Fail("no free block (callers must check CanAllocate/CanAppend)");
      b = lru.front();
      RemoveFromLru(b);
      DropHash(b);
    }
    blocks[b].ref_count = 1;
    return b;
  }

  // One more user of `b`: a cached-free block is revived out of the evictable set.
  void Acquire(int32_t b) {
    if (blocks[b].ref_count == 0) RemoveFromLru(b);
    blocks[b].ref_count++;
  }

  void Release(int32_t b) {
    Block& blk = blocks[b];
    if (blk.ref_count <= 0) Fail("releasing free block " + std::to_string(b));
    if (--blk.ref_count > 0) return;
    if (blk.has_hash) {
      blk.lru_pos = lru.insert(lru.end(), b);
      blk.is_evictable = true;
    } else {
      free_list.push_back(b);
    }
  }

  // Registers `own` (a full, computed block) as the cache entry for prefix (parent, tokens)
  // with hash `h`; returns the block that now caches that prefix, or block -1 if none can.
  BlockRef Register(int32_t own, uint64_t h, BlockRef parent, std::span<const int> tokens) {
    auto it = cached.find(h);
    if (it != cached.end()) {
      const int32_t other = it->second;
      // Another sequence computed the same prefix first: keep its entry, ours stays private.
      if (Holds(other, h, parent, tokens)) return RefOf(other);
      // A collision or an entry whose parent was evicted: replace it if nobody uses it.
      if (blocks[other].ref_count > 0) return BlockRef{};
      RemoveFromLru(other);
      DropHash(other);
      free_list.push_back(other);
    }
    Block& blk = blocks[own];
    blk.has_hash = true;
    blk.hash = h;
    blk.parent = parent;
    blk.token_ids.assign(tokens.begin(), tokens.end());
    cached.emplace(h, own);
    return RefOf(own);
  }

  int64_t NumTableTokens(const Sequence& s) const {
    return static_cast<int64_t>(s.block_table.size()) * block_size;
  }
  // Blocks `s` needs so that its first `num_tokens` tokens have one.
  int64_t NumToBack(const Sequence& s, int64_t num_tokens) const {
    return std::max<int64_t>(0, CeilDiv(num_tokens, block_size) - std::ssize(s.block_table));
  }
  void Back(Sequence& s, int64_t num_tokens) {
    while (NumTableTokens(s) < num_tokens) s.block_table.push_back(TakeFreeBlock());
  }
  // Where a new sequence's blocks end: every token without a window; with one, up to the
  // lookahead past the first key its first computed token reads.
  int64_t AllocationEnd(int64_t num_cached, int64_t num_tokens) const {
    if (window == 0) return num_tokens;
    return std::min(num_tokens, FirstKeyRead(num_cached, window) + lookahead);
  }

  // Sliding-window mode: gives back the blocks wholly left of the first key that a query at
  // or after the first uncomputed token reads.
  void ReleaseOutOfWindow(Sequence& s) {
    if (window == 0) return;
    const int64_t end = std::min<int64_t>(FirstKeyRead(s.num_computed_tokens, window) / block_size,
                                          std::ssize(s.block_table));
    for (; s.num_released_blocks < end; ++s.num_released_blocks) {
      int32_t& b = s.block_table[static_cast<size_t>(s.num_released_blocks)];
      Release(b);
      b = -1;
      window_released++;
    }
  }

  // Offers full block `i` of `s` (computed) to the prefix cache.
  void HashNextBlock(Sequence& s) {
    const int64_t i = s.num_hashed_blocks;
    auto tokens = BlockTokens(s, i);
    const uint64_t h = HashBlock(s.last_hash, tokens);
    const int32_t own = s.block_table[i];
    BlockRef holder;
    if (blocks[own].has_hash) {
      // Reused from the cache or shared by Fork: already registered for this very prefix.
      if (blocks[own].hash != h) Fail("block " + std::to_string(own) + " rehashed");
      holder = RefOf(own);
    } else if (i == 0 || IsLive(s.last_cached)) {
      holder = Register(own, h, i == 0 ? BlockRef{} : s.last_cached, tokens);
    }  // else: the cached parent was evicted, so this prefix can no longer be named exactly.
    s.last_hash = h;
    s.last_cached = holder;
    s.num_hashed_blocks = i + 1;
  }
};

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching)
    : BlockManager(num_blocks, block_size,
                   BlockManagerOptions{.enable_prefix_caching = enable_prefix_caching}) {}

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size,
                           const BlockManagerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (num_blocks <= 0 || num_blocks > INT32_MAX || block_size <= 0) {
    throw std::invalid_argument("BlockManager: num_blocks and block_size must be positive");
  }
  if (options.sliding_window < 0 || (options.sliding_window > 0 && options.max_step_tokens < 1)) {
    throw std::invalid_argument(
        "BlockManager: sliding_window must be >= 0, and with a window max_step_tokens >= 1");
  }
  impl_->block_size = block_size;
  impl_->is_prefix_caching = options.enable_prefix_caching;
  impl_->window = options.sliding_window;
  // The first key read trails the newest committed token by the window and a tile; the tokens
  // backed lead it by up to three steps (the one scheduled, and two launched whose results
  // are not committed yet).
  if (impl_->window > 0)
    impl_->lookahead = impl_->window + kMaxKeyTile + 3 * options.max_step_tokens;
  impl_->blocks.resize(num_blocks);
  // Popped from the back: fresh blocks are handed out as 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) impl_->free_list.push_back(b);
}

BlockManager::~BlockManager() = default;
BlockManager::BlockManager(BlockManager&&) noexcept = default;
BlockManager& BlockManager::operator=(BlockManager&&) noexcept = default;

int64_t BlockManager::block_size() const { return impl_->block_size; }
int64_t BlockManager::num_free_blocks() const { return impl_->NumFree(); }
int64_t BlockManager::sliding_window() const { return impl_->window; }
int64_t BlockManager::window_lookahead_tokens() const {
  return impl_->window > 0 ? impl_->lookahead : INT64_MAX;
}

int64_t BlockManager::MaxBlocksPerSequence(int64_t num_tokens) const {
  const int64_t all = CeilDiv(num_tokens, impl_->block_size);
  if (impl_->window == 0) return all;
  // The span of lookahead tokens, starting anywhere in a block (+1) and ending in one (+1).
  return std::min(all, CeilDiv(impl_->lookahead, impl_->block_size) + 2);
}

bool BlockManager::CanAllocate(std::span<const int> prompt_ids) const {
  if (prompt_ids.empty()) return false;
  const PrefixMatch m = impl_->Match(prompt_ids);
  // Hits on blocks in use cost nothing; hits on cached-free blocks leave the free pool just
  // as fresh blocks do, so only the former reduce the need.
  const int64_t num_cached = std::ssize(m.blocks) * impl_->block_size;
  int64_t num_needed =
      CeilDiv(impl_->AllocationEnd(num_cached, std::ssize(prompt_ids)), impl_->block_size);
  for (int32_t b : m.blocks) num_needed -= impl_->blocks[b].ref_count > 0 ? 1 : 0;
  return num_needed <= impl_->NumFree();
}

int64_t BlockManager::Allocate(SeqId seq, std::span<const int> prompt_ids) {
  Impl& im = *impl_;
  if (im.seqs.count(seq)) Fail("sequence " + std::to_string(seq) + " already exists");
  if (prompt_ids.empty()) Fail("empty prompt for sequence " + std::to_string(seq));
  if (!CanAllocate(prompt_ids))
    Fail("Allocate without CanAllocate, sequence " + std::to_string(seq));
  const PrefixMatch m = im.Match(prompt_ids);
  Sequence s;
  s.token_ids.assign(prompt_ids.begin(), prompt_ids.end());
  // Revive the hits before taking fresh blocks, so that eviction cannot take a hit.
  for (int32_t b : m.blocks) im.Acquire(b);
  s.block_table = m.blocks;
  const int64_t num_cached_tokens = static_cast<int64_t>(m.blocks.size()) * im.block_size;
  im.Back(s, im.AllocationEnd(num_cached_tokens, std::ssize(prompt_ids)));
  s.num_computed_tokens = num_cached_tokens;
  s.num_hashed_blocks = static_cast<int64_t>(m.blocks.size());
  s.last_hash = m.last_hash;
  if (!m.blocks.empty()) s.last_cached = im.RefOf(m.blocks.back());
  im.ReleaseOutOfWindow(s);
  im.seqs.emplace(seq, std::move(s));
  im.prefix_query_tokens += static_cast<int64_t>(prompt_ids.size());
  im.prefix_hit_tokens += num_cached_tokens;
  return num_cached_tokens;
}

bool BlockManager::CanReserve(SeqId seq, int64_t num_tokens) const {
  const Sequence& s = impl_->Get(seq);
  return impl_->NumToBack(s, std::min(num_tokens, std::ssize(s.token_ids))) <= impl_->NumFree();
}

void BlockManager::Reserve(SeqId seq, int64_t num_tokens) {
  Impl& im = *impl_;
  Sequence& s = im.Get(seq);
  if (!CanReserve(seq, num_tokens)) {
    Fail("Reserve without CanReserve, sequence " + std::to_string(seq));
  }
  im.Back(s, std::min(num_tokens, std::ssize(s.token_ids)));
}

bool BlockManager::CanAppend(SeqId seq, int64_t num_new_tokens) const {
  const Impl& im = *impl_;
  const Sequence& s = im.Get(seq);
  if (num_new_tokens < 0) Fail("negative token count");
  const int64_t num_tokens = static_cast<int64_t>(s.token_ids.size());
  int64_t num_needed = im.NumToBack(s, num_tokens + num_new_tokens);
  // Writing into a partial last block that is shared (after Fork) needs a private copy.
  const bool is_partial = num_tokens % im.block_size != 0 && im.NumTableTokens(s) >= num_tokens;
  if (num_new_tokens > 0 && is_partial && s.block_table.back() >= 0 &&
      im.blocks[s.block_table.back()].ref_count > 1) {
    num_needed++;
  }
  return num_needed <= im.NumFree();
}

void BlockManager::Append(SeqId seq, std::span<const int> token_ids,
                          std::vector<BlockCopy>* copies) {
  Impl& im = *impl_;
  Sequence& s = im.Get(seq);
  if (!CanAppend(seq, static_cast<int64_t>(token_ids.size()))) {
    Fail("Append without CanAppend, sequence " + std::to_string(seq));
  }
  im.Back(s, std::ssize(s.token_ids));  // sliding-window mode: tokens Reserve has not reached
  for (int t : token_ids) {
    const int64_t offset = static_cast<int64_t>(s.token_ids.size()) % im.block_size;
    if (offset == 0) {
      s.block_table.push_back(im.TakeFreeBlock());
    } else if (im.blocks[s.block_table.back()].ref_count > 1) {
      // Copy-on-write: the shared partial block stays as it is for its other users.
      if (copies == nullptr) Fail("Append needs a copy but `copies` is null");
      const int32_t src = s.block_table.back();
      const int32_t dst = im.TakeFreeBlock();
      copies->push_back(BlockCopy{src, dst});
      im.Release(src);
      s.block_table.back() = dst;
    }
    s.token_ids.push_back(t);
  }
}

void BlockManager::SetToken(SeqId seq, int64_t position, int token_id) {
  Sequence& s = impl_->Get(seq);
  if (position < s.num_computed_tokens || position >= static_cast<int64_t>(s.token_ids.size())) {
    Fail("SetToken at position " + std::to_string(position) + " of sequence " +
         std::to_string(seq) + " (computed tokens are fixed)");
  }
  s.token_ids[static_cast<size_t>(position)] = token_id;
}

void BlockManager::MarkComputed(SeqId seq, int64_t num_computed_tokens) {
  Impl& im = *impl_;
  Sequence& s = im.Get(seq);
  if (num_computed_tokens < 0 || num_computed_tokens > static_cast<int64_t>(s.token_ids.size())) {
    Fail("MarkComputed past the end of sequence " + std::to_string(seq));
  }
  if (num_computed_tokens > im.NumTableTokens(s)) {
    Fail("MarkComputed of tokens without blocks, sequence " + std::to_string(seq));
  }
  s.num_computed_tokens = std::max(s.num_computed_tokens, num_computed_tokens);
  if (im.is_prefix_caching) {
    const int64_t num_full = s.num_computed_tokens / im.block_size;
    while (s.num_hashed_blocks < num_full) im.HashNextBlock(s);
  }
  im.ReleaseOutOfWindow(s);  // after hashing: a given-back block stays a cache entry
}

void BlockManager::Fork(SeqId parent, SeqId child) {
  Impl& im = *impl_;
  const Sequence& p = im.Get(parent);
  if (im.seqs.count(child)) Fail("sequence " + std::to_string(child) + " already exists");
  if (p.num_computed_tokens != static_cast<int64_t>(p.token_ids.size())) {
    Fail("Fork of sequence " + std::to_string(parent) +
         " before all its tokens are computed (shared blocks are never written)");
  }
  for (int32_t b : p.block_table)
    if (b >= 0) im.Acquire(b);
  Sequence c = p;
  im.seqs.emplace(child, std::move(c));
}

void BlockManager::Free(SeqId seq) {
  Impl& im = *impl_;
  Sequence& s = im.Get(seq);
  // Last block first: it becomes the older LRU entry, so a prompt's tail is evicted before
  // its head, which other prompts are more likely to share.
  for (auto it = s.block_table.rbegin(); it != s.block_table.rend(); ++it)
    if (*it >= 0) im.Release(*it);
  im.seqs.erase(seq);
}

bool BlockManager::Has(SeqId seq) const { return impl_->seqs.count(seq) > 0; }

int64_t BlockManager::NumTokens(SeqId seq) const {
  return static_cast<int64_t>(impl_->Get(seq).token_ids.size());
}

const std::vector<int32_t>& BlockManager::BlockTable(SeqId seq) const {
  return impl_->Get(seq).block_table;
}

int64_t BlockManager::Slot(SeqId seq, int64_t position) const {
  const Sequence& s = impl_->Get(seq);
  if (position < 0 || position >= static_cast<int64_t>(s.token_ids.size())) {
    Fail("position " + std::to_string(position) + " outside sequence " + std::to_string(seq));
  }
  const int64_t bs = impl_->block_size;
  const auto i = static_cast<size_t>(position / bs);
  if (i >= s.block_table.size() || s.block_table[i] < 0) {
    Fail("position " + std::to_string(position) + " of sequence " + std::to_string(seq) +
         " has no block (given back by the sliding window, or not reserved yet)");
  }
  return static_cast<int64_t>(s.block_table[i]) * bs + position % bs;
}

int32_t BlockManager::RefCount(int32_t block) const {
  if (block < 0 || block >= static_cast<int32_t>(impl_->blocks.size())) {
    Fail("block " + std::to_string(block) + " out of range");
  }
  return impl_->blocks[block].ref_count;
}

BlockManagerCounters BlockManager::counters() const {
  BlockManagerCounters c;
  c.num_blocks = static_cast<int64_t>(impl_->blocks.size());
  c.num_free_blocks = impl_->NumFree();
  c.num_cached_blocks = static_cast<int64_t>(impl_->cached.size());
  c.prefix_query_tokens = impl_->prefix_query_tokens;
  c.prefix_hit_tokens = impl_->prefix_hit_tokens;
  c.window_released_blocks = impl_->window_released;
  return c;
}

}  // namespace llm
