// FlashAttention on the CPU over the paged KV cache: exact attention computed tile by tile
// with an online softmax (kernels/online_softmax.h), never materialising the score matrix.
// These are the references the CUDA kernels are tested against.
//
//   q:   [num_tokens, num_heads, head_dim] fp32 (num_tokens = cu_seqlens_q[num_seqs])
//   out: [num_tokens, num_heads, head_dim] fp32
//   kv:  one layer's paged pools (kernels/paged_kv.h)
//   grouped-query attention: query head h reads KV head h / (num_heads / num_kv_heads)
//   scale: softmax scale, normally 1/sqrt(head_dim); the flash kernels are causal (the plain
//   PagedAttentionReference below takes either), with batch.sliding_window when it is set
//   (kernels/paged_kv.h: VisibleKeyBegin); key tiles wholly left of a tile's window are
//   skipped, not masked
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/paged_kv.h"

namespace llm::cpu {

// Scratch the kernels used, for tests that bound it (attention memory must be O(tile)).
struct AttentionStats {
  size_t scratch_bytes_per_thread = 0;
  int64_t num_splits = 0;  // decode: KV splits used per sequence (max)
  // Keys the work items walked (summed over items: query tiles or splits × KV heads): with a
  // sliding window, only the tiles that reach into some row's window.
  int64_t keys_visited = 0;
};

// Ragged prefill (each sequence may already have cached context: chunked prefill).
void PagedPrefillAttention(const float* q, PagedKvView<const float> kv, const AttentionBatch& batch,
                           int64_t num_heads, float scale, float* out,
                           AttentionStats* stats = nullptr);

// The plain definition, for tests and benches: every query row's softmax(q·kᵀ·scale)·v in
// double precision, one row at a time over its sequence's keys through the block table.
// causal: query i of sequence s (position context_lens[s] + i) sees keys 0 … its position;
// otherwise all context_lens[s] + q_len keys of the sequence (the benchmark shapes' non-causal
// case; the engine's prefill is causal).
void PagedAttentionReference(const float* q, PagedKvView<const float> kv,
                             const AttentionBatch& batch, int64_t num_heads, float scale,
                             float* out, bool causal = true);
// One row of it: token t (a row of q, in sequence seq), head h, into out[head_dim] (double).
void PagedAttentionReferenceRow(const float* q, PagedKvView<const float> kv,
                                const AttentionBatch& batch, int64_t num_heads, float scale,
                                int64_t seq, int64_t t, int64_t h, bool causal, double* out);

// Decode: exactly one query per sequence (cu_seqlens_q[i] = i), attending over
// context_lens[i] + 1 keys. num_splits = 0 picks the split-KV factor automatically from the
// context lengths and the thread count (flash-decoding); 1 disables splitting.
void PagedDecodeAttention(const float* q, PagedKvView<const float> kv, const AttentionBatch& batch,
                          int64_t num_heads, float scale, float* out, int64_t num_splits = 0,
                          AttentionStats* stats = nullptr);

// Writes new keys and values: k, v [num_tokens, num_kv_heads, head_dim] go to flat slots
// slot_mapping[t] (= block * block_size + offset); a negative slot skips the token.
void AppendKv(const float* k, const float* v, const int64_t* slot_mapping, int64_t num_tokens,
              PagedKvView<float> kv);

// ---- FP8 KV cache (e4m3, kernels/fp8.h) ---------------------------------------------------
// The pools hold e4m3 codes: code c stands for E4m3ToF32(c) · scale, with one scale for all of
// a layer's keys and one for its values (vLLM's per-tensor k_scale / v_scale; 1 when not
// calibrated). Half the bytes of bf16, a quarter of fp32: what decode attention streams.
struct Fp8KvScales {
  float k = 1.f;
  float v = 1.f;
};

// The same kernels over fp8 pools: each key tile is dequantized into the thread's scratch as
// it is gathered, and the rest is the fp32 path's arithmetic, so the result equals the fp32
// kernel's over a pool holding the dequantized values, bit for bit.
void PagedPrefillAttention(const float* q, PagedKvView<const uint8_t> kv, Fp8KvScales scales,
                           const AttentionBatch& batch, int64_t num_heads, float scale, float* out,
                           AttentionStats* stats = nullptr);
void PagedDecodeAttention(const float* q, PagedKvView<const uint8_t> kv, Fp8KvScales scales,
                          const AttentionBatch& batch, int64_t num_heads, float scale, float* out,
                          int64_t num_splits = 0, AttentionStats* stats = nullptr);

// dst[i] = E4m3ToF32(src[i]) · scale, bit for bit, as the kernels above dequantize a key tile
// (8 codes at a time with AVX2 + F16C).
void DequantizeE4m3(const uint8_t* src, int64_t n, float scale, float* dst);

// Quantizes and writes: code = F32ToE4m3(x / scale) (round to nearest even, saturating at
// ±448 · scale).
void AppendKv(const float* k, const float* v, const int64_t* slot_mapping, int64_t num_tokens,
              PagedKvView<uint8_t> kv, Fp8KvScales scales);

}  // namespace llm::cpu
