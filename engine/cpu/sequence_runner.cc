#include "engine/cpu/sequence_runner.h"

#include "engine/error.h"

namespace llm {
namespace {

int64_t BlocksFor(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

}  // namespace

SequenceRunner::SequenceRunner(const CpuModel& model, int64_t max_tokens, int64_t block_size,
                               KvCacheDType kv_dtype)
    : model_(model),
      blocks_(BlocksFor(max_tokens, block_size), block_size, /*enable_prefix_caching=*/false),
      kv_(model.config(), BlocksFor(max_tokens, block_size), block_size, kv_dtype) {}

std::vector<float> SequenceRunner::Feed(std::span<const int> tokens, bool all_logits) {
  if (tokens.empty()) throw Error("no tokens to run");
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t capacity = kv_.layout().num_blocks * kv_.layout().block_size;
  if (num_tokens_ == 0 ? !blocks_.CanAllocate(tokens) : !blocks_.CanAppend(kSeq, n)) {
    throw Error("sequence of " + std::to_string(num_tokens_ + n) +
                " tokens exceeds the KV cache capacity of " + std::to_string(capacity));
  }
  if (num_tokens_ == 0) {
    blocks_.Allocate(kSeq, tokens);
  } else {
    std::vector<BlockCopy> copies;
    blocks_.Append(kSeq, tokens, &copies);
    kv_.CopyBlocks(copies);
  }
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    slots[static_cast<size_t>(i)] = blocks_.Slot(kSeq, num_tokens_ + i);
  ForwardBatch batch;
  // One token after a context is a decode step (the decode kernel), as in the engine.
  const bool is_decode = n == 1 && num_tokens_ > 0;
  batch.AddSequence(tokens, num_tokens_, blocks_.BlockTable(kSeq), slots, /*wants_logits=*/true,
                    is_decode);
  if (all_logits) {
    batch.logits_indices.clear();
    for (int32_t i = 0; i < n; ++i) batch.logits_indices.push_back(i);
  }
  std::vector<float> logits = model_.Forward(batch, kv_);
  num_tokens_ += n;
  blocks_.MarkComputed(kSeq, num_tokens_);
  return logits;
}

}  // namespace llm
