// Runs one sequence through the model over a paged KV pool of its own (a BlockManager and a
// KvCachePool sized for max_tokens): the path of `llm generate`, and the tests' way to drive
// the model step by step. The continuous-batching engine does the same for many sequences.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/kv_cache.h"
#include "engine/sched/block_manager.h"

namespace llm {

class SequenceRunner {
 public:
  SequenceRunner(const CpuModel& model, int64_t max_tokens, int64_t block_size = 16,
                 KvCacheDType kv_dtype = KvCacheDType::kF32);

  // Feeds tokens (the prompt, a chunk of it, or one sampled token) and returns the logits of
  // the last one [vocab], or of every fed token [n, vocab] when all_logits. Throws
  // llm::Error when the sequence would exceed max_tokens or a token id is out of range.
  std::vector<float> Feed(std::span<const int> tokens, bool all_logits = false);

  int64_t num_tokens() const { return num_tokens_; }
  const BlockManager& blocks() const { return blocks_; }

 private:
  static constexpr SeqId kSeq = 0;
  const CpuModel& model_;
  BlockManager blocks_;
  KvCachePool kv_;
  int64_t num_tokens_ = 0;
};

}  // namespace llm
