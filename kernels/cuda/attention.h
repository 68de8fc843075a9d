// CUDA flash attention over the paged KV cache: the shared parameter block of the prefill
// and decode kernels (kernels/cuda/prefill_attention*.cu, kernels/cuda/decode_attention.cu).
// The CPU twins (the specification) are in kernels/cpu/flash_attention.h; the layout is
// kernels/paged_kv.h; the online softmax math is kernels/online_softmax.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/paged_kv.h"

namespace llm::cuda {

// Every pointer is a device pointer.
//   q, out: [num_tokens, num_heads, head_dim] of `dtype` (kBF16 or kF16), fp32 accumulation
//   kv:     one layer's K and V pools, same dtype, layout of kernels/paged_kv.h
//   batch:  device int32 arrays (cu_seqlens_q, context_lens, block_tables), as on the CPU
struct AttentionParams {
  const void* q = nullptr;
  void* out = nullptr;
  PagedKvView<const void> kv;
  AttentionBatch batch;
  int64_t num_heads = 0;
  float scale = 0;  // softmax scale, normally 1/sqrt(head_dim); causal mask always on
  DType dtype = DType::kBF16;
  int64_t max_q_len = 0;     // longest query chunk in the batch (grid sizing)
  int64_t max_num_keys = 0;  // longest context_lens[i] + q_len[i] in the batch
};

}  // namespace llm::cuda
