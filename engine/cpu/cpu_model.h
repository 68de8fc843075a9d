// The CPU backend's forward pass (fp32 compute; weights f32, bf16 or f16, or FP8 e4m3 linear
// layers with per-row scales under --quantization fp8): the one layer skeleton of the
// registry's architectures (engine/model/architecture.h), loaded by walking the spec's weight
// list. The Llama decoder, with the hooks the other architectures' features gate ([...]):
//
//   tokens ─ embed [× sqrt(hidden)] ─┬─ RMSNorm ─ q,k,v proj [+ bias] [─ q/k RMSNorm] ─ RoPE ─
//     KV append ─ attention [sliding window] ─ o proj [─ RMSNorm] ─(+)─┐
//   ─────────────────────────────────┴───────────────────────────────────┘
//   ┌─ RMSNorm ─ gate,up proj ─ SiLU·mul [GELU-tanh·mul] ─ down proj [─ RMSNorm] ─(+)─┐ × layers
//   └────────────────────────────────────────────────────────────────────────────────┘
//     [mixture of experts: router ─ softmax ─ top k ─ each chosen expert's SwiGLU over the
//      tokens that chose it ─ weighted sum]
//   ─ RMSNorm ─ lm_head (tied to embed_tokens when the config says so) ─ logits
//
// Gemma's (1 + w) RMSNorms are ordinary ones over 1 + w, added at load; Phi-3's packed
// qkv_proj / gate_up_proj are split at load into row ranges of the one matrix (no copy).
//
// Attention is FlashAttention over the paged KV cache (kernels/cpu/flash_attention.h): the
// new tokens' keys and values are appended into their slots, then decode sequences use the
// split-KV decode kernel and prefill chunks the tiled prefill kernel.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/forward_batch.h"
#include "engine/model/architecture.h"
#include "engine/model/model_config.h"
#include "engine/model/rope.h"
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
  // --quantization int8: the same matrices and lm_head (as llama.cpp's Q8_0; a tied one gets
  // an int8 copy, the embedding lookups keep weight_dtype) as int8 codes with one fp32 scale
  // per output row (cpu::QuantizeInt8Rows), multiplied on the CPU's integer dot products
  // against x quantized per block of 32 (kernels/cpu/matmul_int8.h). Exclusive with
  // fp8_weights.
  bool int8_weights = false;
};

class KvCachePool;

class CpuModel {
 public:
  // Reads config.json, validates every tensor of the checkpoint (names and shapes) and
  // prepares the weights. Throws llm::Error naming the file and tensor at fault.
  static std::unique_ptr<CpuModel> Load(const std::string& model_dir,
                                        const LoadOptions& options = {});
  ~CpuModel();

  const ModelConfig& config() const { return config_; }
  DType weight_dtype() const { return weight_dtype_; }
  bool fp8_weights() const { return fp8_weights_; }
  bool int8_weights() const { return int8_weights_; }
  // "BF16", or "F8_E4M3 (linear layers, per-row scales) + BF16" under --quantization fp8
  // ("I8 (...)" under int8, naming the kernel this CPU runs).
  std::string WeightsDescription() const;
  // Bytes of weight matrices streamed per decoded token (all linear layers + lm_head; of a
  // mixture-of-experts layer, the router and num_experts_per_tok experts).
  int64_t weight_bytes_per_token() const;

  // Runs one step: appends the batch's keys/values into `kv` and returns the logits of
  // the rows in batch.logits_indices, [logits_indices.size(), vocab]. Throws llm::Error for
  // a token id outside the vocabulary.
  std::vector<float> Forward(const ForwardBatch& batch, KvCachePool& kv) const;

  // Mixture of experts: called by every MoE layer of every Forward with the experts its
  // tokens chose, [tokens · num_experts_per_tok], most probable first (tests compare the
  // backends' routing). Not thread-safe with concurrent Forward calls; null to stop.
  using RoutingObserver = std::function<void(int64_t layer, std::span<const int32_t> experts)>;
  void set_routing_observer(RoutingObserver observer) { routing_observer_ = std::move(observer); }

 private:
  struct Layer {
    std::vector<float> input_norm, post_attention_norm;  // [hidden]
    cpu::WeightMatrix q, k, v, o, gate, up, down;
    std::vector<float> q_bias, k_bias, v_bias;       // attention_bias
    std::vector<float> q_norm, k_norm;               // qk_norm: [head_dim]
    std::vector<float> attn_out_norm, mlp_out_norm;  // sandwich_norms: [hidden]
    // A mixture-of-experts layer (ModelConfig::IsMoeLayer): the router [experts, hidden] and
    // each expert's matrices, in place of gate/up/down.
    bool moe = false;
    cpu::WeightMatrix router;
    std::vector<cpu::WeightMatrix> expert_gate, expert_up, expert_down;
    const std::vector<float>* inv_freq = nullptr;  // this layer's RoPE
    int64_t sliding_window = 0;
  };
  CpuModel() = default;
  cpu::WeightMatrix Matrix(const std::string& name, std::vector<int64_t> shape);
  // A linear layer's matrix: Matrix(), or its FP8 / int8 quantization (int8 codes row-major,
  // in staging_ when this CPU's kernel packs them: Packed() then moves each piece out).
  cpu::WeightMatrix LinearMatrix(const std::string& name, std::vector<int64_t> shape);
  // m itself, or (int8 / bf16 / f16 where their kernel wants them packed) m packed into memory
  // of our own (cpu::PackInt8, cpu::PackHalf).
  cpu::WeightMatrix Packed(const cpu::WeightMatrix& m);
  std::vector<float> Vector(const std::string& name, int64_t size);
  // Where the registry's weight of `role` (of layer `layer`, for per-layer roles) lives.
  cpu::WeightMatrix* MatrixOf(WeightRole role, int64_t layer, int64_t expert);
  std::vector<float>* VectorOf(WeightRole role, int64_t layer);
  void Attention(const Layer& layer, int64_t layer_index, const float* normed, float* out,
                 const ForwardBatch& batch, KvCachePool& kv) const;
  void Mlp(const Layer& layer, int64_t layer_index, const float* normed, float* out,
           int64_t num_tokens) const;
  void MoeMlp(const Layer& layer, int64_t layer_index, const float* normed, float* out,
              int64_t num_tokens) const;

  ModelConfig config_;
  DType weight_dtype_ = DType::kF32;
  bool fp8_weights_ = false;
  bool int8_weights_ = false;
  std::unique_ptr<Checkpoint> checkpoint_;
  // Weights of our own (converted, quantized, or 16-bit copied out of the mapping): 2 MiB
  // aligned with transparent huge pages asked for (AllocateWeights); scales in owned32_.
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::vector<std::unique_ptr<void, FreeDeleter>> owned_;
  std::vector<int8_t> staging_;      // the last LinearMatrix's row-major int8 codes, to be packed
  std::vector<uint16_t> staging16_;  // the last Matrix's row-major 16-bit values, to be packed
  void* AllocateWeights(size_t bytes);
  std::vector<std::vector<float>> owned32_;
  cpu::WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;          // [head_dim / 2]: full-attention layers
  std::vector<float> sliding_inv_freq_;  // sliding layers with a RoPE of their own (Gemma 3)
  ArchitectureFeatures features_;
  RoutingObserver routing_observer_;
};

}  // namespace llm
