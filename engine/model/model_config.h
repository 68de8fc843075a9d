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
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  std::optional<int64_t> sliding_window;  // Mistral; null or absent = full attention
  // Per layer: full causal attention or the sliding window (config.json "layer_types"; without
  // it every layer slides when sliding_window is set). Size num_layers after FromJson.
  enum class LayerType { kFull, kSliding };
  std::vector<LayerType> layer_types;
  // The window of layer `layer`'s attention (AttentionBatch::sliding_window): 0 = full.
  int64_t SlidingWindowOf(int64_t layer) const {
    return sliding_window && layer_types.at(static_cast<size_t>(layer)) == LayerType::kSliding
               ? *sliding_window
               : 0;
  }
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
