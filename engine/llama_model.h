// The Llama forward pass on the CPU (fp32 compute; weights f32, bf16 or f16, or FP8 e4m3 linear
// layers with per-row scales under --quantization fp8).
//
//   tokens ─ embed ─┬─ RMSNorm ─ q,k,v proj ─ RoPE ─ KV append ─ attention ─ o proj ─(+)─┐
//                   └────────────────────────────────────────────────────────────────────┘
//                   ┌─ RMSNorm ─ gate,up proj ─ SiLU·mul ─ down proj ─(+)─┐  × num_layers
//                   └─────────────────────────────────────────────────────┘
//                   ─ RMSNorm ─ lm_head (tied to embed_tokens when the config says so) ─ logits
//
// Attention is FlashAttention over the paged KV cache (kernels/cpu/flash_attention.h): the
// new tokens' keys and values are appended into their slots, then decode sequences use the
// split-KV decode kernel and prefill chunks the tiled prefill kernel.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/dtype.h"

namespace llm {

class Checkpoint;

struct LoadOptions {
  // Element type the weight matrices are kept in. nullopt: as stored in the checkpoint
  // (no copy: the matrices point into the memory-mapped files).
  std::optional<DType> weight_dtype;
  // --quantization fp8: the linear layers' matrices (q, k, v, o, gate, up, down) become e4m3
  // codes with one fp32 scale per output row (cpu::QuantizeFp8Rows), a quarter of the bytes of
  // f32 and half of bf16; the embeddings and lm_head stay in weight_dtype (as vLLM keeps them).
  bool fp8_weights = false;
};

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
  bool is_batch_invariant = false;      // see LlamaModel::Attention
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

class KvCachePool;

class LlamaModel {
 public:
  // Reads config.json, validates every tensor of the checkpoint (names and shapes) and
  // prepares the weights. Throws llm::Error naming the file and tensor at fault.
  static std::unique_ptr<LlamaModel> Load(const std::string& model_dir,
                                          const LoadOptions& options = {});
  ~LlamaModel();

  const ModelConfig& config() const { return config_; }
  DType weight_dtype() const { return weight_dtype_; }
  bool fp8_weights() const { return fp8_weights_; }
  // "BF16", or "F8_E4M3 (linear layers, per-row scales) + BF16" under --quantization fp8.
  std::string WeightsDescription() const;
  // Bytes of weight matrices streamed per decoded token (all linear layers + lm_head).
  int64_t weight_bytes_per_token() const;

  // Runs one step: appends the batch's keys/values into `kv` and returns the logits of
  // the rows in batch.logits_indices, [logits_indices.size(), vocab]. Throws llm::Error for
  // a token id outside the vocabulary.
  std::vector<float> Forward(const ForwardBatch& batch, KvCachePool& kv) const;

 private:
  struct Layer {
    std::vector<float> input_norm, post_attention_norm;  // [hidden]
    cpu::WeightMatrix q, k, v, o, gate, up, down;
  };
  LlamaModel() = default;
  cpu::WeightMatrix Matrix(const std::string& name, std::vector<int64_t> shape);
  // A linear layer's matrix: Matrix(), or its FP8 quantization under fp8_weights_.
  cpu::WeightMatrix LinearMatrix(const std::string& name, std::vector<int64_t> shape);
  std::vector<float> Vector(const std::string& name, int64_t size);
  void Attention(const Layer& layer, int64_t layer_index, const float* normed, float* out,
                 const ForwardBatch& batch, KvCachePool& kv) const;
  void Mlp(const Layer& layer, const float* normed, float* out, int64_t num_tokens) const;

  ModelConfig config_;
  DType weight_dtype_ = DType::kF32;
  bool fp8_weights_ = false;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<std::vector<uint8_t>> owned8_;  // FP8 codes (fp8_weights_; scales in owned32_)
  std::vector<std::vector<uint16_t>> owned16_;  // converted weights (when not as stored)
  std::vector<std::vector<float>> owned32_;
  cpu::WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
};

// RoPE inverse frequencies [head_dim / 2] with the config's rope_scaling applied (as
// Hugging Face's ROPE_INIT_FUNCTIONS compute them, in float32).
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace llm
