// The CUDA backend's fused element-wise ops and the GPU sampler: everything of the Llama
// forward pass that is not a GEMM (cuBLASLt) or attention (prefill/decode_attention.h).
// CPU twins (the specification) are in kernels/cpu/ops.h and engine/sample/sampler.h; tests in
// tests/kernels/model_ops_gpu_test.cc and tests/kernels/sampling_gpu_test.cc (label gpu).
//
// Conventions: every pointer is a device pointer; `dtype` is kBF16 or kF16 (the activation /
// weight / KV type; std::invalid_argument otherwise); the residual stream is fp32; every
// function is asynchronous on `stream` and launches a fixed grid for a given shape (so the
// calls can be captured in a CUDA graph).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention/attention.h"
#include "kernels/dtype.h"
#include "kernels/paged_kv.h"

namespace llm::cuda {

struct MoeRouting;  // kernels/cuda/moe/moe.h

// out[t, :] = float(table[token_ids[t], :]), out fp32 [num_tokens, hidden]. Ids must be in
// range (the caller validates them on the host).
// scale: multiplies every value (Gemma's sqrt(hidden), rounded to dtype as transformers does).
void EmbeddingGather(const void* table, DType dtype, const int32_t* token_ids, int64_t num_tokens,
                     int64_t hidden, float* out, cudaStream_t stream, float scale = 1.f);

// Async scheduling: token_ids[t] = sampled[feed[t]] for every t with feed[t] >= 0 (the ids the
// previous step sampled, still on the device); other tokens are unchanged. All int32
// [num_tokens] (sampled: as many as feed's largest entry needs). Capturable. CPU twin:
// ModelExecutor::ResolveFedTokens (engine/executor.h).
void FeedSampledTokens(int32_t* token_ids, const int32_t* feed, const int32_t* sampled,
                       int64_t num_tokens, cudaStream_t stream);

// One staging buffer scattered to many arrays in one kernel: for each segment i < count,
// segments[i].dst[0, bytes) = src[src_offset, src_offset + bytes) (device memory; src_offset
// and dst 16-byte aligned, bytes a multiple of 4; count <= kMaxCopySegments). The executor's
// step inputs: the host packs every input array's used part into one pinned buffer, one
// host-to-device copy moves it, and this puts each part where the forward (and its CUDA
// graphs, at fixed addresses) reads it, instead of one small copy per array (~3 µs each on
// the H200). Launched without programmatic dependent launch (it follows a copy). CPU twin:
// std::memcpy per segment.
struct CopySegment {
  int64_t src_offset = 0;
  void* dst = nullptr;
  int64_t bytes = 0;
};
inline constexpr int kMaxCopySegments = 16;
void ScatterCopies(const void* src, const CopySegment* segments, int count, cudaStream_t stream);

// Fused residual add + RMSNorm, one CTA per output row:
//   r = rows ? rows[i] : i
//   if delta:  residual[r, :] += float(delta[r, :])      (written back)
//   out[i, :] = dtype(residual[r, :] / sqrt(mean(residual[r, :]²) + eps) * weight[:])
// residual fp32 [*, hidden]; delta dtype [*, hidden] or null; weight fp32 [hidden];
// out dtype [num_rows, hidden]. `rows` (null = identity) gathers the rows that need logits.
void AddRmsNorm(float* residual, const void* delta, const float* weight, void* out, DType dtype,
                const int32_t* rows, int64_t num_rows, int64_t hidden, float eps,
                cudaStream_t stream);

// AddRmsNorm whose delta is a mixture-of-experts layer's output: residual[r, :] += the sum
// MoeCombine(expert_rows, routing, top_k) adds (kernels/cuda/moe/moe.h), bit for bit the same,
// then the RMSNorm as AddRmsNorm. One launch for MoeCombine + AddRmsNorm (a decode step of
// Qwen3-30B-A3B: 48 launches fewer). With `rows` (distinct: each is updated once), only those
// tokens' residuals are updated.
void MoeCombineRmsNorm(float* residual, const float* expert_rows, const MoeRouting& routing,
                       int top_k, const float* weight, void* out, DType dtype, const int32_t* rows,
                       int64_t num_rows, int64_t hidden, float eps, cudaStream_t stream);

// ---- FP8 (e4m3) activations and weights (--quantization fp8) ------------------------------
// Dynamic per-row scales: scale[r] = max_i |v[r, i]| / 448 (1 for an all-zero row) and
// code[r, i] = F32ToE4m3(v[r, i] / scale[r]) (kernels/fp8.h: nearest even, saturating), the
// rule of cpu::QuantizeFp8Rows bit for bit. Rows of activations are tokens (the per-token
// scales cuda's FP8 GEMM takes, engine/cuda/gemm.h); rows of weights are output features.
// codes: [rows, cols] bytes; scales fp32 [rows].

// v = the values of `in` (dtype bf16, fp16 or fp32 [rows, cols]). nonfinite (device int, may be
// null): incremented once per row holding a NaN or an infinity (the weights' check at load).
void QuantizeRowsE4m3(const void* in, DType dtype, int64_t rows, int64_t cols, uint8_t* codes,
                      float* scales, int* nonfinite, cudaStream_t stream);

// AddRmsNorm whose output is e4m3: v = the fp32 normalized row (before any rounding to dtype),
// out [num_rows, hidden] codes with out_scale [num_rows]; the residual update as AddRmsNorm.
void AddRmsNormE4m3(float* residual, const void* delta, const float* weight, uint8_t* out,
                    float* out_scale, DType dtype, const int32_t* rows, int64_t num_rows,
                    int64_t hidden, float eps, cudaStream_t stream);

// SiluMul whose output is e4m3: v[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i] in fp32
// (SiluMul's math without its rounding to dtype); out [num_tokens, inter] codes with
// out_scale [num_tokens].
void SiluMulE4m3(const void* gate_up, uint8_t* out, float* out_scale, int64_t num_tokens,
                 int64_t inter, DType dtype, cudaStream_t stream);

// RoPE (rotate-half pairs (i, i + head_dim/2), angle = float(position) * inv_freq[i] in fp32,
// as cpu::ApplyRope) fused with the KV append (as cpu::AppendKv):
//   qkv: dtype [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], q | k | v per token
//   q_out: dtype [num_tokens, num_heads, head_dim] = rotated q
//   the rotated k and the unchanged v are written to the cache slot slot_mapping[t] of
//   kv (layout kernels/paged_kv.h, same dtype); slot < 0 skips the token's K/V.
//   format.fp8: e4m3 pools; the rotated k (fp32, before any rounding to dtype) and the v
//   (dtype) are written as F32ToE4m3(x / scale) (kernels/cuda/attention/attention.h:
//   KvCacheFormat).
// positions int32 [num_tokens]; inv_freq fp32 [head_dim / 2].
// pre (optional, all null = none): before the rotation, in fp32, each head row
//   x += bias[head's rows of q|k|v]   (bias fp32 [(num_heads + 2 num_kv_heads) * head_dim]:
//                                       Qwen2's q/k/v biases; v heads get theirs too)
//   x = x / sqrt(mean(x²) + eps) * norm   for q heads (q_norm) and k heads (k_norm), fp32
//                                       [head_dim] each: Qwen3's per-head RMSNorms
// as cpu::AddBias, cpu::RmsNorm over rows of head_dim, then cpu::ApplyRope.
struct QkvPrologue {
  const float* bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  // With q_norm at head_dim 64 / 128 / 256: one warp per head (RopeAppendKvHeadsKernel) instead
  // of one CTA per token whose warps take the heads' norms in turn (the executor's default since
  // 2026-12-06: CudaExecutorOptions::rope_head_warps).
  bool head_warps = false;
  bool any() const { return bias != nullptr || q_norm != nullptr; }
};
void RopeAppendKv(const void* qkv, const int32_t* positions, const int64_t* slot_mapping,
                  const float* inv_freq, int64_t num_tokens, int num_heads, int num_kv_heads,
                  int head_dim, PagedKvView<void> kv, DType dtype, void* q_out, cudaStream_t stream,
                  const KvCacheFormat& format = {}, const QkvPrologue& pre = {});

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]   (fp32 math, one rounding)
// gate_up dtype [num_tokens, 2 * inter], out dtype [num_tokens, inter].
void SiluMul(const void* gate_up, void* out, int64_t num_tokens, int64_t inter, DType dtype,
             cudaStream_t stream);
// The same with gelu_tanh(gate) (GeGLU, Gemma; cpu::GeluTanhMul).
void GeluTanhMul(const void* gate_up, void* out, int64_t num_tokens, int64_t inter, DType dtype,
                 cudaStream_t stream);

// Gemma's sandwich norms: residual[r, :] += weight[:] · d / sqrt(mean(d²) + eps) with
// d = float(delta[r, :]) (cpu::RmsNorm of the delta, then cpu::AddInPlace). residual fp32,
// delta dtype [num_rows, hidden], weight fp32 [hidden]. One CTA per row.
void AddNormedDelta(float* residual, const void* delta, const float* weight, DType dtype,
                    int64_t num_rows, int64_t hidden, float eps, cudaStream_t stream);

// ---- Sampling on the GPU ------------------------------------------------------------------
// The order and meaning of engine/sample/sampler.h (Sampler::Sample): the allowed-token mask,
// logit bias and penalties (given as sparse per-row entries prepared by the host), greedy,
// temperature, top-k, top-p, min-p, one draw. Only ids and logprobs come back to the host.

// One sampled row's parameters (device array of num_rows).
struct SampleRowParams {
  int32_t logits_row = 0;     // which row of `logits` to read (n > 1 samples one row n times)
  float temperature = 1.f;    // < 1e-5: greedy (argmax, ties -> lowest id)
  int32_t top_k = 0;          // <= 0: off
  float top_p = 1.f;          // 1: off
  float min_p = 0.f;          // 0: off
  uint64_t seed = 0;          // Philox key for this row's draw ...
  uint64_t offset = 0;        // ... and counter (the sequence's step): deterministic per seed
  int32_t num_logprobs = -1;  // -1: none; 0: sampled token's raw logprob; N <= 20: + top N
  int32_t adjust_begin = 0;   // this row's entries in `adjust`: [adjust_begin, adjust_end)
  int32_t adjust_end = 0;
  int32_t mask_row = -1;  // -1: every token allowed; else this row's bitmask in `masks`
};

// A logit adjustment for one (row, token), applied before sampling as
//   l = l + bias;  l = l > 0 ? l / repetition : l * repetition;  l -= subtract
// (bias = logit_bias, repetition = repetition_penalty for tokens seen in prompt or output
// else 1, subtract = presence * [count > 0] + frequency * count): Sampler's steps 1-3.
struct LogitAdjust {
  int32_t token = 0;
  float bias = 0.f;
  float repetition = 1.f;
  float subtract = 0.f;
};

inline constexpr int kMaxTopLogprobs = 20;

// Per sampled row (device arrays of num_rows):
//   token: the sampled id; logprob: log_softmax(raw logits)[token] (raw = before adjustments,
//   vLLM's default); top_ids / top_logprobs [num_rows, kMaxTopLogprobs]: the N best tokens of
//   the raw distribution, logprob descending, ties by id ascending (rows with N <= 0 untouched).
struct SampleOutputs {
  int32_t* token = nullptr;
  float* logprob = nullptr;
  int32_t* top_ids = nullptr;
  float* top_logprobs = nullptr;
};

// How SampleTokens runs; the defaults are production's.
struct SampleOptions {
  // The temperature-only draw skips the noise of elements that provably cannot win (exact: the
  // same tokens). false computes every element's noise: tests compare the two bit for bit.
  bool has_gumbel_pruning = true;
};

// Allowed-token bitmasks (structured outputs, Sampler::AllowedTokens): a row's mask is
// SampleMaskWords(vocab) uint32 words, token t allowed iff bit t % 32 of word t / 32 is set.
inline constexpr int64_t SampleMaskWords(int64_t vocab) { return (vocab + 31) / 32; }

// logits fp32 [*, vocab] (not modified). `workspace` of SampleWorkspaceBytes(num_rows, vocab)
// bytes holds the adjusted (and masked) rows. adjust: device array of LogitAdjust. masks: device
// [*, SampleMaskWords(vocab)] uint32, read at the rows' mask_row (null when no row has one): a
// disallowed token's processed logit is -inf before anything picks a token; logprobs stay
// those of the raw logits.
size_t SampleWorkspaceBytes(int64_t num_rows, int64_t vocab);
void SampleTokens(const float* logits, int64_t vocab, const SampleRowParams* params,
                  int64_t num_rows, const LogitAdjust* adjust, const uint32_t* masks,
                  void* workspace, const SampleOutputs& out, cudaStream_t stream,
                  const SampleOptions& options = {});

}  // namespace llm::cuda
