#include "engine/forward_batch.h"

#include <algorithm>
#include <stdexcept>

namespace llm {

void ForwardBatch::AddSequence(std::span<const int> tokens, int64_t context_len,
                               std::span<const int32_t> block_table, std::span<const int64_t> slots,
                               bool wants_logits, bool is_decode) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (is_decode) {
    if (n != 1 || context_len == 0 || num_decode_seqs != num_seqs()) {
      throw std::logic_error(
          "ForwardBatch: a decode chunk is one token after a context, "
          "placed before every prefill chunk");
    }
    ++num_decode_seqs;
  }
  if (cu_seqlens_q.empty()) cu_seqlens_q.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    token_ids.push_back(tokens[static_cast<size_t>(i)]);
    positions.push_back(static_cast<int32_t>(context_len + i));
    slot_mapping.push_back(slots[static_cast<size_t>(i)]);
  }
  if (wants_logits) logits_indices.push_back(static_cast<int32_t>(token_ids.size() - 1));
  cu_seqlens_q.push_back(static_cast<int32_t>(token_ids.size()));
  context_lens.push_back(static_cast<int32_t>(context_len));
  // Re-pad every table to the widest one seen so far.
  const int64_t width = std::max<int64_t>(max_blocks_per_seq, std::ssize(block_table));
  if (width != max_blocks_per_seq) {
    std::vector<int32_t> wider(static_cast<size_t>((num_seqs() - 1) * width), -1);
    for (int64_t s = 0; s + 1 < num_seqs(); ++s) {
      std::copy_n(block_tables.begin() + s * max_blocks_per_seq, max_blocks_per_seq,
                  wider.begin() + s * width);
    }
    block_tables = std::move(wider);
    max_blocks_per_seq = width;
  }
  block_tables.insert(block_tables.end(), block_table.begin(), block_table.end());
  block_tables.resize(static_cast<size_t>(num_seqs() * max_blocks_per_seq), -1);
  if (has_fed_tokens()) prev_sample_rows.resize(token_ids.size(), -1);
}

void ForwardBatch::FeedLastTokenFromPreviousStep(int32_t task) {
  if (token_ids.empty() || task < 0) throw std::logic_error("ForwardBatch: nothing to feed");
  prev_sample_rows.resize(token_ids.size(), -1);
  prev_sample_rows.back() = task;
  token_ids.back() = 0;
}

}  // namespace llm
