// The engine-to-executor contract: one step's tokens, positions, KV slots and block tables,
// plain data built by the engine from the block manager's tables and run by either backend
// (engine/cpu/cpu_executor.h, engine/cuda/cuda_executor.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace llm {

// One step's tokens for the model, sequences laid out decodes first (one token each), then
// prefill chunks: the order the attention kernels take them in. Built by the caller from the
// block manager's tables (see kernels/paged_kv.h for the meaning of each field).
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens]
  std::vector<int64_t> slot_mapping;  // [num_tokens] flat KV slot of each token
  int64_t num_decode_seqs = 0;        // sequences [0, num_decode_seqs) have exactly 1 token
  std::vector<int32_t> cu_seqlens_q;  // [num_seqs + 1]
  std::vector<int32_t> context_lens;  // [num_seqs] tokens already cached before this step
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], -1 padded
  int64_t max_blocks_per_seq = 0;
  std::vector<int32_t> logits_indices;  // token rows whose logits Forward returns
  bool is_batch_invariant = false;      // see CpuModel::Attention (engine/cpu/cpu_model.h)
  // Asynchronous scheduling (ModelExecutor::Launch): [num_tokens], or empty when no token
  // is fed. prev_sample_rows[t] >= 0: token t is the one sampled by task prev_sample_rows[t]
  // of the previously launched step, not yet known on the host (token_ids[t] holds 0); -1:
  // token_ids[t].
  std::vector<int32_t> prev_sample_rows;

  int64_t num_seqs() const { return static_cast<int64_t>(context_lens.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  // Appends one sequence's chunk. Decode chunks (is_decode: exactly 1 token after a
  // cached context, run by the decode kernel) must all come before prefill chunks.
  void AddSequence(std::span<const int> tokens, int64_t context_len,
                   std::span<const int32_t> block_table, std::span<const int64_t> slots,
                   bool wants_logits, bool is_decode);
  // The last token added takes the token sampled by task `task` of the previous step.
  void FeedLastTokenFromPreviousStep(int32_t task);
  bool has_fed_tokens() const { return !prev_sample_rows.empty(); }
};

}  // namespace llm
