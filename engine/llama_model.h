// The Llama forward pass on the CPU (fp32 compute; weights f32, bf16 or f16).
//
//   tokens ─ embed ─┬─ RMSNorm ─ q,k,v proj ─ RoPE ─ KV append ─ attention ─ o proj ─(+)─┐
//                   └────────────────────────────────────────────────────────────────────┘
//                   ┌─ RMSNorm ─ gate,up proj ─ SiLU·mul ─ down proj ─(+)─┐  × num_layers
//                   └─────────────────────────────────────────────────────┘
//                   ─ RMSNorm ─ lm_head (tied to embed_tokens when the config says so) ─ logits
//
// The attention here is the plain one over a contiguous per-sequence cache (KvCache);
// the paged flash-attention path replaces it in the paged-KV work.
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
};

// One sequence's keys and values, per layer [capacity, num_kv_heads, head_dim] fp32.
struct KvCache {
  int64_t capacity = 0;                  // tokens
  int64_t num_tokens = 0;                // tokens already in the cache (= next position)
  std::vector<std::vector<float>> k, v;  // [num_layers]
};

class LlamaModel {
 public:
  // Reads config.json, validates every tensor of the checkpoint (names and shapes) and
  // prepares the weights. Throws llm::Error naming the file and tensor at fault.
  static std::unique_ptr<LlamaModel> Load(const std::string& model_dir,
                                          const LoadOptions& options = {});
  ~LlamaModel();

  const ModelConfig& config() const { return config_; }
  DType weight_dtype() const { return weight_dtype_; }
  // Bytes of weight matrices streamed per decoded token (all linear layers + lm_head).
  int64_t weight_bytes_per_token() const;

  KvCache NewCache(int64_t capacity) const;

  // Runs `tokens` at positions [cache.num_tokens, cache.num_tokens + n), appending their
  // keys and values to the cache. Returns logits [n, vocab] when all_logits, else [1, vocab]
  // for the last token. Throws llm::Error when the cache or the model's context is full.
  std::vector<float> Forward(std::span<const int> tokens, KvCache& cache,
                             bool all_logits = false) const;

 private:
  struct Layer {
    std::vector<float> input_norm, post_attention_norm;  // [hidden]
    cpu::WeightMatrix q, k, v, o, gate, up, down;
  };
  LlamaModel() = default;
  cpu::WeightMatrix Matrix(const std::string& name, std::vector<int64_t> shape);
  std::vector<float> Vector(const std::string& name, int64_t size);
  void Attention(const Layer& layer, int64_t layer_index, const float* normed, float* out,
                 int64_t num_tokens, KvCache& cache, const int32_t* positions) const;
  void Mlp(const Layer& layer, const float* normed, float* out, int64_t num_tokens) const;

  ModelConfig config_;
  DType weight_dtype_ = DType::kF32;
  std::unique_ptr<Checkpoint> checkpoint_;
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
