// CUDA flash attention over the paged KV cache: the shared parameter block of the prefill
// and decode kernels (kernels/cuda/prefill_attention*.cu,
// kernels/cuda/attention/decode_attention.cu). The CPU twins (the specification) are in
// kernels/cpu/flash_attention.h; the layout is kernels/paged_kv.h; the online softmax math is
// kernels/online_softmax.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/paged_kv.h"

namespace llm::cuda {

// The KV cache's element format. Default: the pools hold the attention dtype (bf16 / fp16).
// fp8: the pools hold FP8 E4M3 codes (kernels/fp8.h), one byte per element; code c stands for
// E4m3ToF32(c) · k_scale (keys) or · v_scale (values), as cpu::Fp8KvScales: vLLM's
// --kv-cache-dtype fp8 with per-tensor scales (1 when not calibrated). The kernels dequantize
// exactly (every e4m3 value is an fp16 value) and fold the scales into the softmax scale (keys)
// and the output normalisation (values); appends quantize with F32ToE4m3(x / scale) (round to
// nearest even, saturating), bit-identical to the CPU's cpu::AppendKv over fp8 pools.
struct KvCacheFormat {
  bool fp8 = false;
  float k_scale = 1.f;
  float v_scale = 1.f;
};

// Every pointer is a device pointer.
//   q, out: [num_tokens, num_heads, head_dim] of `dtype` (kBF16 or kF16), fp32 accumulation
//   kv:     one layer's K and V pools, layout of kernels/paged_kv.h, elements of `dtype`
//           (or e4m3 bytes with kv_format.fp8)
//   batch:  device int32 arrays (cu_seqlens_q, context_lens, block_tables), as on the CPU
struct AttentionParams {
  const void* q = nullptr;
  void* out = nullptr;
  PagedKvView<const void> kv;
  AttentionBatch batch;
  int64_t num_heads = 0;
  float scale = 0;  // softmax scale, normally 1/sqrt(head_dim)
  bool causal = true;
  // Prefill: query i of a sequence sees keys 0 … context_lens + i (what the engine runs). false:
  // every key of its sequence (context_lens + q_len), the benchmark shapes' non-causal case,
  // on v4_wgmma only. Decode is causal by construction (one query, all its keys).
  DType dtype = DType::kBF16;
  KvCacheFormat kv_format;   // fp8: e4m3 pools (decode kernel, prefill v1_naive / v3_mma)
  int64_t max_q_len = 0;     // longest query chunk in the batch (grid sizing)
  int64_t max_num_keys = 0;  // longest context_lens[i] + q_len[i] in the batch
};

}  // namespace llm::cuda
