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
// Sliding-window mode (a model whose every layer attends over the same window W of keys, e.g.
// Mistral's sliding_window; vLLM's sliding-window manager): a sequence holds only the blocks that
// its future queries can read. Once its first `c` tokens are computed (MarkComputed, Allocate's
// cached prefix), no later query reads a key left of FirstKeyRead(c, W) (kernels/paged_kv.h), so
// the blocks wholly left of it are given back to the pool (a hashed block stays a cache entry
// until evicted) and their block-table entries become -1. New sequences get blocks for their
// cached prefix plus a lookahead of tokens (window_lookahead_tokens(); Reserve adds the rest as
// chunked prefill reaches them), so a prompt longer than the pool runs in a window's worth of
// blocks. MaxBlocksPerSequence bounds what one sequence ever holds.
//
// Check/act pairs: callers ask CanAllocate / CanAppend before Allocate / Append; the acting
// calls assert the check holds (an engine invariant, not a user error). Every violated
// engine invariant (unknown or duplicate sequence id, acting without the check, a position
// or block out of range) throws std::logic_error; llm::Error is for user errors.
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
  int64_t num_free_blocks = 0;         // ref count 0 (includes cached-free blocks)
  int64_t num_cached_blocks = 0;       // blocks holding a prefix hash (in use or free)
  int64_t prefix_query_tokens = 0;     // prompt tokens looked up by Allocate (every Allocate
                                       // counts its whole prompt, caching on or off)
  int64_t prefix_hit_tokens = 0;       // of those, found cached
  int64_t window_released_blocks = 0;  // sliding-window mode: blocks given back, cumulative
};

struct BlockManagerOptions {
  bool enable_prefix_caching = true;
  // Sliding-window mode when > 0: the window W of every attention layer.
  int64_t sliding_window = 0;
  // Sliding-window mode: the most tokens one step computes for a sequence (the scheduler's
  // max_num_batched_tokens); sizes the lookahead and MaxBlocksPerSequence.
  int64_t max_step_tokens = 0;
};

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching = true);
  BlockManager(int64_t num_blocks, int64_t block_size, const BlockManagerOptions& options);

  int64_t block_size() const;
  int64_t num_free_blocks() const;
  int64_t sliding_window() const;  // 0: every block is kept until Free
  // Sliding-window mode: tokens past the cached prefix that Allocate backs with blocks (the
  // window, the widest key tile and two steps: async scheduling commits a step late); else all.
  int64_t window_lookahead_tokens() const;
  // The most blocks a sequence of `num_tokens` tokens holds at once (its own; a forked child
  // shares its parent's and adds at most this plus one copied block).
  int64_t MaxBlocksPerSequence(int64_t num_tokens) const;

  // Can a new sequence with this prompt get blocks for all its tokens now (counting the
  // blocks its cached prefix would reuse)? Exactly: ceil(len / block_size) minus the cached
  // hits whose blocks are in use by other sequences must be <= num_free_blocks(). A hit on a
  // cached-free block saves computing but still takes that block out of the free count.
  // An empty prompt is never allocatable. Sliding-window mode: blocks for the cached prefix
  // and the next window_lookahead_tokens() tokens, not all of them.
  bool CanAllocate(std::span<const int> prompt_ids) const;
  // Creates sequence `seq` holding the prompt's tokens. Returns how many leading tokens
  // already have their KV cached (a multiple of block_size, and always < prompt length so
  // at least one token is computed and produces logits).
  // Rule: only full blocks that lie entirely before the last prompt token are looked up,
  // i.e. at most floor((len - 1) / block_size) blocks. The block holding the last token is
  // always a fresh private block and is recomputed whole, even when an equal block is
  // cached (a 32-token prompt with block_size 16 fully cached returns 16 and recomputes
  // tokens 16..31 into a new block): no shared block is ever written. The first `result`
  // tokens count as computed.
  int64_t Allocate(SeqId seq, std::span<const int> prompt_ids);

  // Sliding-window mode: can / make the first `num_tokens` tokens of `seq` have blocks (the next
  // chunk of a prefill)? Always true / a no-op otherwise, and for tokens that already have them.
  bool CanReserve(SeqId seq, int64_t num_tokens) const;
  void Reserve(SeqId seq, int64_t num_tokens);

  // Can `seq` grow by `num_new_tokens` (a new block when crossing a boundary, a private copy
  // of a shared partial last block; sliding-window mode: blocks for every token it has, too)?
  // Append(seq, {}) backs the tokens it has.
  bool CanAppend(SeqId seq, int64_t num_new_tokens = 1) const;
  // Adds tokens to `seq`; copies needed before writing are appended to `copies` (which may
  // be null only when no copy is needed). The runner performs the copies (whole blocks)
  // before writing the new tokens' KV. A copy arises only when the last block is partial
  // and shared (after Fork); full shared blocks are never written, so new tokens beyond
  // them go to new blocks. (C++20's std::span takes no braced list: pass a vector, an array
  // or std::span(&token_id, 1).)
  void Append(SeqId seq, std::span<const int> token_ids, std::vector<BlockCopy>* copies);

  // Async scheduling appends a token before it is sampled (a placeholder id); this sets its
  // id once known. Only tokens not yet marked computed may change (they have no hash yet).
  void SetToken(SeqId seq, int64_t position, int token_id);

  // The first `num_computed_tokens` tokens of `seq` now have their KV written: full blocks
  // among them become cacheable (hashed) for other sequences. Never decreases the count;
  // past NumTokens(seq) is an invariant violation.
  void MarkComputed(SeqId seq, int64_t num_computed_tokens);

  // n > 1 completions: `child` shares all of `parent`'s blocks (ref counts +1). All of the
  // parent's tokens must be computed (MarkComputed(parent, NumTokens(parent)) first), since
  // shared blocks are only read from then on; fork, then Append each child's own token.
  void Fork(SeqId parent, SeqId child);
  // Releases the sequence's blocks (cached ones stay reusable until evicted).
  void Free(SeqId seq);

  bool Has(SeqId seq) const;
  int64_t NumTokens(SeqId seq) const;
  // Entries given back by the sliding window are -1; the table may end before the last tokens
  // (sliding-window mode, before Reserve reaches them).
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
