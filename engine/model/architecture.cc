#include "engine/model/architecture.h"

#include <stdexcept>

#include "engine/error.h"
#include "engine/model/model_config.h"

namespace llm {
namespace {

using R = WeightRole;

// The Llama decoder's weights as Hugging Face names them (LlamaForCausalLM's state dict).
std::vector<WeightSpec> LlamaWeights() {
  return {
      {R::kEmbed, "model.embed_tokens.weight", false, Dim::kVocab, Dim::kHidden, FusedSlot::kNone,
       TpSplit::kReplicated, false},
      {R::kInputNorm, "model.layers.{L}.input_layernorm.weight", true, Dim::kHidden, Dim::kNone,
       FusedSlot::kNone, TpSplit::kReplicated, false},
      {R::kQProj, "model.layers.{L}.self_attn.q_proj.weight", true, Dim::kQDim, Dim::kHidden,
       FusedSlot::kQkv, TpSplit::kQHeadRows, true},
      {R::kKProj, "model.layers.{L}.self_attn.k_proj.weight", true, Dim::kKvDim, Dim::kHidden,
       FusedSlot::kQkv, TpSplit::kKvHeadRows, true},
      {R::kVProj, "model.layers.{L}.self_attn.v_proj.weight", true, Dim::kKvDim, Dim::kHidden,
       FusedSlot::kQkv, TpSplit::kKvHeadRows, true},
      {R::kOProj, "model.layers.{L}.self_attn.o_proj.weight", true, Dim::kHidden, Dim::kQDim,
       FusedSlot::kNone, TpSplit::kQHeadCols, true},
      {R::kPostAttentionNorm, "model.layers.{L}.post_attention_layernorm.weight", true,
       Dim::kHidden, Dim::kNone, FusedSlot::kNone, TpSplit::kReplicated, false},
      {R::kGateProj, "model.layers.{L}.mlp.gate_proj.weight", true, Dim::kIntermediate,
       Dim::kHidden, FusedSlot::kGateUp, TpSplit::kIntermediateRows, true},
      {R::kUpProj, "model.layers.{L}.mlp.up_proj.weight", true, Dim::kIntermediate, Dim::kHidden,
       FusedSlot::kGateUp, TpSplit::kIntermediateRows, true},
      {R::kDownProj, "model.layers.{L}.mlp.down_proj.weight", true, Dim::kHidden,
       Dim::kIntermediate, FusedSlot::kNone, TpSplit::kIntermediateCols, true},
      {R::kFinalNorm, "model.norm.weight", false, Dim::kHidden, Dim::kNone, FusedSlot::kNone,
       TpSplit::kReplicated, false},
      {R::kLmHead, "lm_head.weight", false, Dim::kVocab, Dim::kHidden, FusedSlot::kNone,
       TpSplit::kReplicated, false},
  };
}

// The table. Mistral's checkpoints are Llama's (vLLM maps MistralForCausalLM to LlamaForCausalLM
// too); its sliding window is a config field, refused by RequireBackendSupport until a backend
// implements it.
const std::vector<ArchitectureSpec>& Table() {
  static const std::vector<ArchitectureSpec> table = {
      {"llama",
       {{"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}},
       ArchitectureFeatures{},
       LlamaWeights()},
  };
  return table;
}

template <typename Pred>
std::string JoinClasses(Pred field) {
  std::string out;
  for (const ArchitectureSpec& a : Table()) {
    for (const ArchitectureSpec::HfClass& c : a.hf_classes) {
      if (!out.empty()) out += ", ";
      out += field(c);
    }
  }
  return out;
}

}  // namespace

std::span<const ArchitectureSpec> Architectures() { return Table(); }

const ArchitectureSpec* FindArchitecture(std::string_view hf_class) {
  for (const ArchitectureSpec& a : Table()) {
    for (const ArchitectureSpec::HfClass& c : a.hf_classes) {
      if (c.architecture == hf_class) return &a;
    }
  }
  return nullptr;
}

const ArchitectureSpec* FindArchitectureByModelType(std::string_view model_type) {
  return FindArchitecture(ArchitectureForModelType(model_type));
}

std::string_view ArchitectureForModelType(std::string_view model_type) {
  for (const ArchitectureSpec& a : Table()) {
    for (const ArchitectureSpec::HfClass& c : a.hf_classes) {
      if (c.model_type == model_type) return c.architecture;
    }
  }
  return {};
}

std::string_view ModelTypeOf(std::string_view hf_class) {
  for (const ArchitectureSpec& a : Table()) {
    for (const ArchitectureSpec::HfClass& c : a.hf_classes) {
      if (c.architecture == hf_class) return c.model_type;
    }
  }
  return {};
}

std::string SupportedArchitectures() {
  return JoinClasses(
      [](const ArchitectureSpec::HfClass& c) { return std::string(c.architecture); });
}

std::string SupportedModelTypes() {
  return JoinClasses([](const ArchitectureSpec::HfClass& c) { return std::string(c.model_type); });
}

const ArchitectureSpec& ArchitectureOf(const ModelConfig& config) {
  const ArchitectureSpec* spec = FindArchitecture(config.architecture);
  if (spec == nullptr) {
    throw Error("architecture '" + config.architecture +
                "' is not registered (supported: " + SupportedArchitectures() + ")");
  }
  return *spec;
}

std::string WeightName(const WeightSpec& w, int64_t layer) {
  std::string name(w.name);
  const size_t at = name.find("{L}");
  if (at != std::string::npos) name.replace(at, 3, std::to_string(layer));
  return name;
}

int64_t DimSize(Dim d, const ModelConfig& c) {
  switch (d) {
    case Dim::kNone:
      return 0;
    case Dim::kHidden:
      return c.hidden_size;
    case Dim::kVocab:
      return c.vocab_size;
    case Dim::kQDim:
      return c.num_heads * c.head_dim;
    case Dim::kKvDim:
      return c.num_kv_heads * c.head_dim;
    case Dim::kIntermediate:
      return c.intermediate_size;
  }
  return 0;
}

std::vector<int64_t> WeightShape(const WeightSpec& w, const ModelConfig& c) {
  if (w.cols == Dim::kNone) return {DimSize(w.rows, c)};
  return {DimSize(w.rows, c), DimSize(w.cols, c)};
}

const WeightSpec& WeightOf(const ArchitectureSpec& spec, WeightRole role) {
  for (const WeightSpec& w : spec.weights) {
    if (w.role == role) return w;
  }
  throw std::logic_error("architecture " + std::string(spec.name) + " has no weight of role " +
                         std::to_string(static_cast<int>(role)));
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  const ArchitectureSpec& spec = ArchitectureOf(c);
  std::vector<TensorSpec> out;
  auto global = [&](const WeightSpec& w) {
    if (w.role == WeightRole::kLmHead && c.tie_word_embeddings) return;
    out.push_back({WeightName(w, -1), WeightShape(w, c), &w, -1});
  };
  // The table's order: the globals listed before the layer weights, every layer, the rest.
  size_t first_layer = 0;
  while (first_layer < spec.weights.size() && !spec.weights[first_layer].per_layer) {
    global(spec.weights[first_layer++]);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    for (const WeightSpec& w : spec.weights) {
      if (w.per_layer) out.push_back({WeightName(w, i), WeightShape(w, c), &w, i});
    }
  }
  for (size_t k = first_layer; k < spec.weights.size(); ++k) {
    if (!spec.weights[k].per_layer) global(spec.weights[k]);
  }
  return out;
}

std::vector<FusedMatrix> LayerLinearMatrices(const ArchitectureSpec& spec) {
  std::vector<FusedMatrix> out;
  for (const WeightSpec& w : spec.weights) {
    if (!w.per_layer || !w.is_linear) continue;
    FusedMatrix* into = nullptr;
    if (w.fused != FusedSlot::kNone) {
      for (FusedMatrix& m : out) {
        if (m.slot == w.fused) into = &m;
      }
    }
    if (into == nullptr) into = &out.emplace_back(FusedMatrix{w.fused, {}});
    into->members.push_back(&w);
  }
  return out;
}

void RequireBackendSupport(const ModelConfig& config, const BackendSupport& backend) {
  RequireBackendSupport(config, ArchitectureOf(config), backend);
}

void RequireBackendSupport(const ModelConfig& config, const ArchitectureSpec& spec,
                           const BackendSupport& backend) {
  const std::string where = "the " + std::string(backend.backend) + " backend";
  if (config.sliding_window && !backend.sliding_window) {
    throw Error("config.json: field 'sliding_window' is " + std::to_string(*config.sliding_window) +
                ": " + where +
                " has no sliding-window attention yet (set it to null to attend to every "
                "token, which changes the model's output past the window)");
  }
  const std::string arch =
      "architecture " + config.architecture + " (" + std::string(spec.name) + ") needs ";
  if (spec.features.attention_bias && !backend.attention_bias) {
    throw Error(arch + "attention biases (attention_bias), which " + where + " does not implement");
  }
  if (spec.features.qk_norm && !backend.qk_norm) {
    throw Error(arch + "per-head q/k norms (qk_norm), which " + where + " does not implement");
  }
}

}  // namespace llm
