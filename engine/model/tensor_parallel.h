// Tensor parallelism (Megatron-LM style) of a decoder over `size` GPUs of one host: which
// part of each weight a rank holds (each weight's TpSplit is in the architecture registry).
// Host-only, so the CPU tests check the split's arithmetic; the CUDA executor
// (engine/cuda/weights.cc) loads and runs the shards.
//
//   attention: q/k/v projections split by rows = by heads (rank r holds query heads
//              [r·H/N, (r+1)·H/N) and KV heads [r·KV/N, (r+1)·KV/N), so every query head's KV
//              head is on the same rank: H/KV is the same locally; with N > KV, a multiple of
//              KV, rank r holds KV head r·KV/N alone, each KV head replicated on N/KV ranks);
//              o_proj split by columns (the same heads); the KV cache holds the rank's KV
//              heads only
//   MLP:       gate/up split by rows, down by columns (the same intermediate features)
//   experts:   each expert's gate/up split by rows, down by columns (its own intermediate
//              features, moe_intermediate_size / N per rank); the router replicated, so every
//              rank routes each token to the same experts and holds a slice of each
//   replicated: embeddings, norms, lm_head (sampling runs on rank 0, which alone computes
//              the logits)
//
// Each rank's o_proj and down_proj give a partial sum of the full output; an all-reduce after
// each (2 per layer) makes the residual stream identical on every rank again.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/model/architecture.h"
#include "engine/model/model_config.h"

namespace llm {

// A block of a row-major [rows × cols] matrix: rows [row_begin, row_begin + num_rows),
// columns [col_begin, col_begin + num_cols).
struct TpSlice {
  int64_t row_begin = 0, num_rows = 0, col_begin = 0, num_cols = 0;
};

struct TensorParallelShard {
  int rank = 0;
  int size = 1;
  int64_t num_heads = 0;         // query heads on this rank
  int64_t num_kv_heads = 0;      // KV heads on this rank (and in its KV cache)
  int64_t kv_head_begin = 0;     // its first KV head (global numbering)
  int64_t intermediate = 0;      // MLP features on this rank
  int64_t moe_intermediate = 0;  // each expert's features on this rank (0: no experts)
  int64_t head_dim = 0;
  int64_t hidden = 0;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }

  // The part of the full checkpoint tensor (its Hugging Face [out, in] shape) this rank holds,
  // by the split the registry gives the weight (engine/model/architecture.h). kReplicated
  // needs the full shape: Slice(TpSplit::kReplicated) is empty.
  TpSlice Slice(TpSplit split) const;
  TpSlice Slice(const WeightSpec& w, const ModelConfig& config) const;
};

// Throws llm::Error, naming the model's numbers, when `size` does not divide the query heads,
// the intermediate size or the experts' intermediate size, neither divides nor is a multiple of the
// KV heads, or when rank is outside [0, size).
TensorParallelShard MakeTensorParallelShard(const ModelConfig& config, int rank, int size);

// Copies `slice` of a row-major matrix with `cols` columns of `elem_size`-byte elements into
// dst (num_rows × num_cols, row-major).
void CopySlice(const void* src, int64_t cols, const TpSlice& slice, size_t elem_size, void* dst);

}  // namespace llm
