// The paged KV cache's bookkeeping (pure CPU, no tensors): a pool of num_blocks blocks of
// block_size tokens, per-sequence block tables, reference counts, and prefix caching.
//
// Prefix caching: a FULL block whose tokens have been computed is hashed from its token ids
// chained with its parent block's hash, so equal hashes mean equal whole prefixes. A new
// sequence reuses the cached blocks of its longest cached prefix. Blocks whose ref count
// drops to zero keep their hash and stay reusable until the pool needs them (evicted least
// recently used first). A shared block is never written: appending to a sequence whose last,
// partial block is shared (after Fork) first moves it to a private copy (copy-on-write),
// reported as a BlockCopy for the model runner to perform.
//
// Check/act pairs: callers ask CanAllocate / CanAppend before Allocate / Append; the acting
// calls assert the check holds (an engine invariant, not a user error).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace llm {

using SeqId = int64_t;

struct BlockCopy {
  int32_t src_block;
  int32_t dst_block;
};

struct BlockManagerCounters {
  int64_t num_blocks = 0;
  int64_t num_free_blocks = 0;    // ref count 0 (includes cached-free blocks)
  int64_t num_cached_blocks = 0;  // blocks holding a prefix hash (in use or free)
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up by Allocate
  int64_t prefix_hit_tokens = 0;    // of those, found cached
};

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching = true);

  int64_t block_size() const;
  int64_t num_free_blocks() const;

  // Can a new sequence with this prompt get blocks for all its tokens now (counting the
  // blocks its cached prefix would reuse)?
  bool CanAllocate(std::span<const int> prompt_ids) const;
  // Creates sequence `seq` holding the prompt's tokens. Returns how many leading tokens
  // already have their KV cached (a multiple of block_size, and always < prompt length so
  // at least one token is computed and produces logits).
  int64_t Allocate(SeqId seq, std::span<const int> prompt_ids);

  // Can `seq` grow by `num_new_tokens` (a new block when crossing a boundary, a private copy
  // of a shared partial last block)?
  bool CanAppend(SeqId seq, int64_t num_new_tokens = 1) const;
  // Adds tokens to `seq`; copies needed before writing are appended to `copies`.
  void Append(SeqId seq, std::span<const int> token_ids, std::vector<BlockCopy>* copies);

  // The first `num_computed_tokens` tokens of `seq` now have their KV written: full blocks
  // among them become cacheable (hashed) for other sequences.
  void MarkComputed(SeqId seq, int64_t num_computed_tokens);

  // n > 1 completions: `child` shares all of `parent`'s blocks (ref counts +1).
  void Fork(SeqId parent, SeqId child);
  // Releases the sequence's blocks (cached ones stay reusable until evicted).
  void Free(SeqId seq);

  bool Has(SeqId seq) const;
  int64_t NumTokens(SeqId seq) const;
  const std::vector<int32_t>& BlockTable(SeqId seq) const;
  // Flat slot (block * block_size + offset) of the token at `position` of `seq`.
  int64_t Slot(SeqId seq, int64_t position) const;
  int32_t RefCount(int32_t block) const;

  BlockManagerCounters counters() const;

  struct Impl;
  ~BlockManager();
  BlockManager(BlockManager&&) noexcept;
  BlockManager& operator=(BlockManager&&) noexcept;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace llm
