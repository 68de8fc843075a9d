// config.json (+ generation_config.json) of a Hugging Face checkpoint of a registered
// architecture (engine/model/architecture.h).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace llm {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  // llama3 only
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// One attention layer type's rotary embedding: base and scaling.
struct RopeParameters {
  double theta = 10000.0;
  RopeScaling scaling;
};

// Sampling defaults from generation_config.json (absent fields stay unset).
struct GenerationDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<bool> do_sample;
  std::optional<double> repetition_penalty;
  std::optional<int> max_new_tokens;
  std::vector<int> eos_token_ids;  // overrides config.json's when present
};

struct ModelConfig {
  std::string architecture;  // a class the registry accepts (engine/model/architecture.h)
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // num_hidden_layers
  int64_t num_heads = 0;     // num_attention_heads
  int64_t num_kv_heads = 0;  // num_key_value_heads (default num_heads)
  int64_t head_dim = 0;      // default hidden_size / num_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  // RoPE of the full-attention layers (of every layer unless sliding_rope is set): from
  // transformers 5's "rope_parameters" or transformers 4's "rope_theta" + "rope_scaling".
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Gemma 3: the sliding layers' own RoPE ("rope_parameters.sliding_attention", or transformers
  // 4's "rope_local_base_freq" with no scaling).
  std::optional<RopeParameters> sliding_rope;
  bool tie_word_embeddings = false;
  // The window of the sliding layers (Mistral, Gemma 3, Phi-3); null = none. Qwen2/3's
  // "use_sliding_window": false nulls it, as transformers does.
  std::optional<int64_t> sliding_window;
  // Per layer: full causal attention or the sliding window (config.json "layer_types"; else
  // Gemma 3's sliding_window_pattern, Qwen's max_window_layers, or every layer when
  // sliding_window is set). Size num_layers after FromJson; an empty list = every layer slides
  // (when sliding_window is set).
  enum class LayerType { kFull, kSliding };
  std::vector<LayerType> layer_types;
  // The window of layer `layer`'s attention (AttentionBatch::sliding_window): 0 = full.
  int64_t SlidingWindowOf(int64_t layer) const {
    const size_t i = static_cast<size_t>(layer);
    const bool slides = i >= layer_types.size() || layer_types[i] == LayerType::kSliding;
    return sliding_window && slides ? *sliding_window : 0;
  }
  // The window of every layer when all of them slide (Mistral), else 0 (Gemma 3's full layers
  // keep every key): keys that left it are never read again, so the KV cache gives them back.
  int64_t UniformSlidingWindow() const {
    for (int64_t layer = 0; layer < num_layers; ++layer)
      if (SlidingWindowOf(layer) == 0) return 0;
    return sliding_window.value_or(0);
  }
  // The RoPE of layer `layer` (sliding_rope for a sliding layer when set).
  RopeParameters RopeOf(int64_t layer) const;
  // Gemma 3's query_pre_attn_scalar: the softmax scale is its inverse square root (else
  // 1 / sqrt(head_dim)).
  std::optional<double> query_pre_attn_scalar;
  float AttentionScale() const;
  // Mixture of experts (ArchitectureFeatures::moe): 0 experts = a dense model.
  int64_t num_experts = 0;            // num_local_experts (Mixtral, transformers 5) / num_experts
  int64_t num_experts_per_tok = 0;    // top k
  int64_t moe_intermediate_size = 0;  // an expert's width (Mixtral: intermediate_size)
  bool norm_topk_prob = false;        // renormalize the top k's probabilities to sum 1
  int64_t decoder_sparse_step = 1;    // Qwen: every step-th layer is sparse ...
  std::vector<int64_t> mlp_only_layers;  // ... except these, which keep a dense MLP
  bool IsMoeLayer(int64_t layer) const;
  int bos_token_id = 1;
  std::vector<int> eos_token_ids = {2};  // eos_token_id may be an int or a list
  std::string torch_dtype = "float32";
  GenerationDefaults generation;

  // Parses and validates (positive sizes, heads divide hidden / kv heads divide heads,
  // supported architecture, hidden_act silu, rope_scaling type). `source` names the file
  // in error messages. Throws llm::Error naming the field.
  static ModelConfig FromJson(const nlohmann::json& j, const std::string& source);
  // Reads <dir>/config.json and, when present, <dir>/generation_config.json.
  static ModelConfig Load(const std::string& model_dir);
  // The inverse of FromJson (what `llm make-model` writes).
  nlohmann::json ToJson() const;
};

}  // namespace llm
