// A step's inputs: the batch packed into the pinned host buffers and copied to the device (one
// packed copy and one scatter kernel with opt.packed_step_inputs).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cuda/cuda_worker.h"
#include "kernels/cuda/attention/prefill_attention.h"

namespace llm {

// Fills the input buffers for `b`. padded > 0: a decode graph's batch of `padded` rows
// (the extra rows attend to key 0 of block 0, write no KV and their logits are ignored).
// wait_inputs false: the caller waited for the previous step's copies already (Launch).
CudaWorker::Shape CudaWorker::Upload(const ForwardBatch& b, int64_t padded, int64_t width,
                                     bool wait_inputs) {
  if (wait_inputs) WaitInputsCopied();
  Shape s;
  const int64_t n = b.num_tokens(), ns = b.num_seqs();
  // Decode rows take the split-KV decode kernel unless the batch asks for batch-invariant
  // routing or the head_dim has no decode kernel (then the prefill kernel takes them).
  const bool decode_kernel = decode_kernel_ok && !b.is_batch_invariant;
  s.num_tokens = padded > 0 ? padded : n;
  s.num_seqs = padded > 0 ? padded : ns;
  s.num_rows = padded > 0 ? padded : int64_t(b.logits_indices.size());
  s.num_decode = !decode_kernel ? 0 : padded > 0 ? padded : b.num_decode_seqs;
  s.width = width;
  if (s.num_tokens > max_tokens || s.num_seqs > max_seqs || s.num_rows > max_rows ||
      width > table_cap) {
    throw Error("CUDA executor: a step of " + std::to_string(n) + " tokens, " + std::to_string(ns) +
                " sequences, " + std::to_string(s.num_rows) + " logits rows and " +
                std::to_string(width) +
                " blocks per sequence exceeds what was sized at start-up (" +
                std::to_string(max_tokens) + ", " + std::to_string(max_seqs) + ", " +
                std::to_string(max_rows) + ", " + std::to_string(table_cap) + ")");
  }
  s.has_feed = b.has_fed_tokens();
  for (int64_t t = 0; t < s.num_tokens; ++t) {
    const bool real = t < n;
    const int id = real ? b.token_ids[size_t(t)] : 0;
    if (s.has_feed) {
      const int32_t row = real ? b.prev_sample_rows[size_t(t)] : -1;
      if (shard.rank == 0 && row >= num_last_sampled) {  // (rank 0 validated it for the rest)
        throw std::logic_error("CUDA executor: token " + std::to_string(t) + " is fed from task " +
                               std::to_string(row) + " of the previous step, which sampled " +
                               std::to_string(num_last_sampled) + " tokens");
      }
      h_feed.p[t] = row;
    }
    if (id < 0 || id >= vocab) {
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(vocab) + ")");
    }
    h_tokens.p[t] = id;
    h_positions.p[t] = real ? b.positions[size_t(t)] : 0;
    h_slots.p[t] = real ? b.slot_mapping[size_t(t)] : -1;
  }
  for (int64_t i = 0; i <= s.num_seqs; ++i) {
    h_cu.p[i] = padded > 0 ? int32_t(i) : b.cu_seqlens_q[size_t(i)];  // decode rows: cu = i
  }
  const int64_t nd = s.num_decode;
  for (int64_t i = nd; i <= s.num_seqs; ++i) h_cu_prefill.p[i - nd] = h_cu.p[i] - h_cu.p[nd];
  for (int64_t i = 0; i < s.num_seqs; ++i) {
    int32_t* row = h_tables.p + i * width;
    if (i < ns) {
      const int32_t* src = b.block_tables.data() + i * b.max_blocks_per_seq;
      const int64_t len = std::min(width, b.max_blocks_per_seq);
      std::copy(src, src + len, row);
      std::fill(row + len, row + width, -1);
      const int32_t ctx = b.context_lens[size_t(i)];
      h_ctx.p[i] = ctx;
      const int32_t q_len = h_cu.p[i + 1] - h_cu.p[i];
      if (i < nd) {
        s.max_keys_decode = std::max<int64_t>(s.max_keys_decode, ctx + 1);
      } else {
        s.max_q_len = std::max<int64_t>(s.max_q_len, q_len);
        s.max_keys_prefill = std::max<int64_t>(s.max_keys_prefill, ctx + q_len);
      }
    } else {
      row[0] = 0;
      std::fill(row + 1, row + width, -1);
      h_ctx.p[i] = 0;
      if (i >= nd) {
        s.max_q_len = std::max<int64_t>(s.max_q_len, 1);
        s.max_keys_prefill = std::max<int64_t>(s.max_keys_prefill, 1);
      }
    }
  }
  // fp8 KV: group the prefill sequences by the pages the scratch holds (eager steps only:
  // a graph replays its capture's launches; batch-invariant steps keep one rung for every
  // row, as the graphs do).
  if (prefill_scratch != nullptr && padded == 0 && !b.is_batch_invariant) {
    Shape::PrefillGroup g{nd, nd, 0};
    for (int64_t i = nd; i < s.num_seqs; ++i) {
      const int64_t pages = cuda::PrefillPagesNeeded(h_cu.p + i, h_ctx.p + i, 1, opt.block_size);
      if (g.pages + pages > prefill_scratch_pages && i > g.begin) {
        g.end = i;
        s.prefill_groups.push_back(g);
        g = {i, i, 0};
      }
      g.pages += pages;
    }
    g.end = s.num_seqs;
    if (g.end > g.begin) s.prefill_groups.push_back(g);
  }
  for (int64_t r = 0; r < s.num_rows; ++r) {
    h_rows.p[r] = padded > 0 ? int32_t(r) : b.logits_indices[size_t(r)];
  }
  s.max_keys_decode = std::max<int64_t>(s.max_keys_decode, 1);
  if (nd > 0) {
    const size_t per_split =
        size_t(nd) * size_t(heads) * size_t(config.head_dim + 2) * sizeof(float);
    // One split count serves every layer: sized by the window when all of them slide (else the
    // full layers' whole context decides; the kernel caps a sliding layer's splits itself).
    s.splits =
        cuda::DecodeAutoSplits(nd, kv_heads, s.max_keys_decode, config.head_dim,
                               int64_t(kDecodeWorkspaceBytes / per_split),
                               opt.decode_min_tiles_per_split, config.UniformSlidingWindow());
  }
  CopyIn(d_tokens, h_tokens.p, s.num_tokens * 4);
  CopyIn(d_positions, h_positions.p, s.num_tokens * 4);
  CopyIn(d_slots, h_slots.p, s.num_tokens * 8);
  CopyIn(d_cu, h_cu.p, (s.num_seqs + 1) * 4);
  CopyIn(d_cu_prefill, h_cu_prefill.p, (s.num_seqs - nd + 1) * 4);
  CopyIn(d_ctx, h_ctx.p, s.num_seqs * 4);
  CopyIn(d_tables, h_tables.p, s.num_seqs * width * 4);
  CopyIn(d_rows, h_rows.p, s.num_rows * 4);
  if (s.has_feed) CopyIn(d_feed, h_feed.p, s.num_tokens * 4);
  FlushStaged();
  LLM_CUDA_CHECK(cudaEventRecord(ev_inputs, stream));
  return s;
}

// A step input to the device: staged into the packed upload (FlushStaged sends it), or its
// own copy.
void CudaWorker::CopyIn(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  if (!opt.packed_step_inputs) {
    LLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, stream));
    return;
  }
  const int64_t off = (staged_bytes + 15) / 16 * 16;
  if (off + bytes > stage_cap || int(staged.size()) == cuda::kMaxCopySegments || bytes % 4 != 0 ||
      reinterpret_cast<uintptr_t>(dst) % 16 != 0) {
    throw std::logic_error("CUDA executor: a packed step input does not fit its staging");
  }
  std::memcpy(h_stage.p + off, src, size_t(bytes));
  staged.push_back({off, dst, bytes});
  staged_bytes = off + bytes;
}

void CudaWorker::FlushStaged() {
  if (staged.empty()) return;
  const std::vector<cuda::CopySegment> segs = std::move(staged);
  const int64_t bytes = staged_bytes;
  DiscardStaged();  // (also when the copy or the scatter throws)
  LLM_CUDA_CHECK(
      cudaMemcpyAsync(d_stage, h_stage.p, size_t(bytes), cudaMemcpyHostToDevice, stream));
  cuda::ScatterCopies(d_stage, segs.data(), int(segs.size()), stream);
  ++stats.packed_uploads;
}

void CudaWorker::DiscardStaged() {
  staged.clear();
  staged_bytes = 0;
}

// The previous step's host-to-device copies are done: its pinned inputs may be rewritten.
void CudaWorker::WaitInputsCopied() { Sync(ev_inputs); }

}  // namespace llm
