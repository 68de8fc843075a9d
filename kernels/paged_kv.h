// The paged KV cache layout: the one place that defines where a key or value lives. The
// block manager, the CPU reference kernels and every CUDA kernel use it; nothing else
// derives addresses.
//
// Per layer, K and V are separate pools of identical shape
//
//     [num_blocks, num_kv_heads, block_size, head_dim]        (row-major, "HND" per block)
//
// and a sequence's token at position p lives in block block_table[p / block_size], at slot
// p % block_size. The flat slot id used by KV append is block * block_size + slot.
//
// Why heads outside tokens inside a block (FlashInfer's HND, not vLLM's NHD):
//  - One (block, kv_head) tile of block_size × head_dim is contiguous: 4 KiB for block size
//    16, head_dim 128, bf16. The GPU decode kernel (one CTA per sequence × KV head group)
//    and the prefill kernel's key tiles then read whole contiguous tiles: 16-byte vector
//    loads with no stride, one cp.async.bulk / TMA box per tile, every byte read once.
//  - The CPU kernels walk keys of one head in order, a sequential stream per head.
//  - KV append writes num_kv_heads runs of head_dim per token, which is cheap: appends are
//    num_tokens × kv_dim elements against attention's num_tokens × context reads.
// Block size is a runtime value (default 16; tests use 1..32).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace llm {

struct PagedKvLayout {
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;

  LLM_HOST_DEVICE int64_t head_stride() const { return block_size * head_dim; }
  LLM_HOST_DEVICE int64_t block_stride() const { return num_kv_heads * block_size * head_dim; }
  LLM_HOST_DEVICE int64_t pool_elements() const { return num_blocks * block_stride(); }
  // Element offset of (block, kv_head, slot within the block, dim 0).
  LLM_HOST_DEVICE int64_t Offset(int64_t block, int64_t kv_head, int64_t slot) const {
    return block * block_stride() + kv_head * head_stride() + slot * head_dim;
  }
  // The same for a flat slot id (block * block_size + slot).
  LLM_HOST_DEVICE int64_t SlotOffset(int64_t flat_slot, int64_t kv_head) const {
    return Offset(flat_slot / block_size, kv_head, flat_slot % block_size);
  }
};

// One layer's K and V pools. T is float on the CPU, bf16 / half on the GPU.
template <typename T>
struct PagedKvView {
  T* k = nullptr;
  T* v = nullptr;
  PagedKvLayout layout;
};

// Where the queries of a ragged batch sit and which cache blocks their sequences own.
// Host pointers on the CPU, device pointers on the GPU.
//   sequence i has q_len = cu_seqlens_q[i+1] - cu_seqlens_q[i] query tokens at positions
//   [context_lens[i], context_lens[i] + q_len): the tokens before them are already cached,
//   and the queries' own keys/values have been appended before attention runs, so sequence
//   i attends causally over context_lens[i] + q_len keys.
//   sliding_window W > 0 (Mistral's sliding_window, Gemma 3's sliding layers): a query at
//   position p sees only keys at positions (p - W, p], W keys including its own (the mask of
//   transformers' sliding_window_causal: q_idx - kv_idx < W); 0: every key up to p. The mask
//   is defined once, here (VisibleKeyBegin), for every kernel and the references.
struct AttentionBatch {
  int64_t num_seqs = 0;
  const int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t sliding_window = 0;  // 0: full causal attention
};

// The first key position a query at position `pos` sees (keys [VisibleKeyBegin, pos] are
// visible; the causal limit is the other end).
LLM_HOST_DEVICE int64_t VisibleKeyBegin(int64_t pos, int64_t sliding_window) {
  return sliding_window > 0 && pos >= sliding_window ? pos - sliding_window + 1 : 0;
}

// The widest key tile of any attention kernel (CUDA prefill v4's 128 keys); every kernel's
// tiles divide it. A kernel reads a window's keys from the start of the tile that holds the
// first visible key of its first query, so no query at a position >= pos reads a key left of
// FirstKeyRead(pos, W): the KV cache may give back the blocks wholly left of it
// (BlockManager's sliding-window mode), and their block-table entries become -1. Tested by
// poisoning those keys with NaN: SlidingWindowTest (CPU), sliding_window_gpu_test (CUDA).
inline constexpr int64_t kMaxKeyTile = 128;
LLM_HOST_DEVICE int64_t FirstKeyRead(int64_t pos, int64_t sliding_window) {
  return VisibleKeyBegin(pos, sliding_window) / kMaxKeyTile * kMaxKeyTile;
}

}  // namespace llm
