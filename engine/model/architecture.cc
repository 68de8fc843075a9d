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

// A per-layer vector of the attention block ("model.layers.{L}.self_attn.<name>").
WeightSpec AttnVector(R role, std::string_view name, Dim rows, TpSplit tp) {
  return {role, name, true, rows, Dim::kNone, FusedSlot::kNone, tp, false};
}

// `list` with `extra` inserted after the entry of role `after`.
std::vector<WeightSpec> InsertAfter(std::vector<WeightSpec> list, R after,
                                    const std::vector<WeightSpec>& extra) {
  auto at = list.begin();
  while (at != list.end() && at->role != after) ++at;
  if (at == list.end()) throw std::logic_error("architecture table: no role to insert after");
  list.insert(at + 1, extra.begin(), extra.end());
  return list;
}

// Qwen2: Llama's weights with q/k/v biases.
std::vector<WeightSpec> Qwen2Weights() {
  return InsertAfter(LlamaWeights(), R::kVProj,
                     {AttnVector(R::kQBias, "model.layers.{L}.self_attn.q_proj.bias", Dim::kQDim,
                                 TpSplit::kQHeadRows),
                      AttnVector(R::kKBias, "model.layers.{L}.self_attn.k_proj.bias", Dim::kKvDim,
                                 TpSplit::kKvHeadRows),
                      AttnVector(R::kVBias, "model.layers.{L}.self_attn.v_proj.bias", Dim::kKvDim,
                                 TpSplit::kKvHeadRows)});
}

std::vector<WeightSpec> QkNorms() {
  return {AttnVector(R::kQNorm, "model.layers.{L}.self_attn.q_norm.weight", Dim::kHeadDim,
                     TpSplit::kReplicated),
          AttnVector(R::kKNorm, "model.layers.{L}.self_attn.k_norm.weight", Dim::kHeadDim,
                     TpSplit::kReplicated)};
}

// Qwen3: Llama's weights with per-head q/k RMSNorms.
std::vector<WeightSpec> Qwen3Weights() { return InsertAfter(LlamaWeights(), R::kOProj, QkNorms()); }

// Phi-3: q|k|v and gate|up packed in one tensor each (split at load by the CPU backend; the
// packed rows are the CUDA backend's fused matrices as they are).
std::vector<WeightSpec> Phi3Weights() {
  std::vector<WeightSpec> out;
  for (const WeightSpec& w : LlamaWeights()) {
    if (w.role == R::kQProj) {
      out.push_back({R::kQkvProj, "model.layers.{L}.self_attn.qkv_proj.weight", true, Dim::kQkvDim,
                     Dim::kHidden, FusedSlot::kQkv, TpSplit::kReplicated, true});
    } else if (w.role == R::kGateProj) {
      out.push_back({R::kGateUpProj, "model.layers.{L}.mlp.gate_up_proj.weight", true,
                     Dim::kGateUpDim, Dim::kHidden, FusedSlot::kGateUp, TpSplit::kReplicated,
                     true});
    } else if (w.role != R::kKProj && w.role != R::kVProj && w.role != R::kUpProj) {
      out.push_back(w);
    }
  }
  return out;
}

// Gemma 3 (text): q/k norms, and the sandwich norms. Its checkpoint's
// post_attention_layernorm normalizes the attention output and pre_feedforward_layernorm is
// the norm before the MLP (Llama's post_attention_layernorm role).
std::vector<WeightSpec> Gemma3Weights() {
  std::vector<WeightSpec> out = InsertAfter(LlamaWeights(), R::kOProj, QkNorms());
  for (WeightSpec& w : out) {
    if (w.role == R::kPostAttentionNorm)
      w.name = "model.layers.{L}.pre_feedforward_layernorm.weight";
  }
  const WeightSpec norm{R::kAttnOutputNorm,
                        "model.layers.{L}.post_attention_layernorm.weight",
                        true,
                        Dim::kHidden,
                        Dim::kNone,
                        FusedSlot::kNone,
                        TpSplit::kReplicated,
                        false};
  out = InsertAfter(out, R::kKNorm, {norm});
  WeightSpec mlp_norm = norm;
  mlp_norm.role = R::kMlpOutputNorm;
  mlp_norm.name = "model.layers.{L}.post_feedforward_layernorm.weight";
  return InsertAfter(out, R::kDownProj, {mlp_norm});
}

// A mixture-of-experts MLP: the router and one gate/up/down per expert ("{E}"), held by the
// MoE layers. `prefix` is the block's name ("model.layers.{L}.mlp."); `gate`, `up`, `down`
// the experts' tensor names.
std::vector<WeightSpec> MoeWeights(std::string_view router, std::string_view gate,
                                   std::string_view up, std::string_view down) {
  auto expert = [](R role, std::string_view name, Dim rows, Dim cols) {
    return WeightSpec{role,
                      name,
                      true,
                      rows,
                      cols,
                      FusedSlot::kNone,
                      role == R::kExpertDown ? TpSplit::kExpertCols : TpSplit::kExpertRows,
                      true,
                      LayerScope::kMoe,
                      true};
  };
  return {{R::kRouter, router, true, Dim::kNumExperts, Dim::kHidden, FusedSlot::kNone,
           TpSplit::kReplicated, false, LayerScope::kMoe, false},
          expert(R::kExpertGate, gate, Dim::kMoeIntermediate, Dim::kHidden),
          expert(R::kExpertUp, up, Dim::kMoeIntermediate, Dim::kHidden),
          expert(R::kExpertDown, down, Dim::kHidden, Dim::kMoeIntermediate)};
}

// `list` with its dense MLP held only by dense layers and `moe` after it.
std::vector<WeightSpec> WithMoe(std::vector<WeightSpec> list, const std::vector<WeightSpec>& moe) {
  for (WeightSpec& w : list) {
    if (w.role == R::kGateProj || w.role == R::kUpProj || w.role == R::kDownProj) {
      w.scope = LayerScope::kDense;
    }
  }
  return InsertAfter(std::move(list), R::kDownProj, moe);
}

// Mixtral: Llama's attention, every layer's MLP a block_sparse_moe of experts w1 (gate),
// w3 (up), w2 (down).
std::vector<WeightSpec> MixtralWeights() {
  return WithMoe(LlamaWeights(),
                 MoeWeights("model.layers.{L}.block_sparse_moe.gate.weight",
                            "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight",
                            "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight",
                            "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight"));
}

// Qwen3-MoE: Qwen3's attention; the MoE layers' mlp holds a router and experts, the
// mlp_only_layers a dense MLP of intermediate_size.
std::vector<WeightSpec> Qwen3MoeWeights() {
  return WithMoe(Qwen3Weights(), MoeWeights("model.layers.{L}.mlp.gate.weight",
                                            "model.layers.{L}.mlp.experts.{E}.gate_proj.weight",
                                            "model.layers.{L}.mlp.experts.{E}.up_proj.weight",
                                            "model.layers.{L}.mlp.experts.{E}.down_proj.weight"));
}

// The table. Mistral's checkpoints are Llama's (vLLM maps MistralForCausalLM to LlamaForCausalLM
// too); its sliding window is a config field (ModelConfig::layer_types).
const std::vector<ArchitectureSpec>& Table() {
  static const std::vector<ArchitectureSpec> table = {
      {"llama",
       {{"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}},
       ArchitectureFeatures{},
       LlamaWeights()},
      {"qwen2", {{"Qwen2ForCausalLM", "qwen2"}}, {.attention_bias = true}, Qwen2Weights()},
      {"qwen3", {{"Qwen3ForCausalLM", "qwen3"}}, {.qk_norm = true}, Qwen3Weights()},
      {"phi3", {{"Phi3ForCausalLM", "phi3"}}, {.packed_projections = true}, Phi3Weights()},
      {"gemma3",
       {{"Gemma3ForCausalLM", "gemma3_text"}},
       {.qk_norm = true,
        .norm = NormStyle::kRmsNormOffset,
        .mlp = MlpKind::kGeGluTanh,
        .sandwich_norms = true,
        .scale_embeddings = true},
       Gemma3Weights()},
      {"mixtral",
       {{"MixtralForCausalLM", "mixtral"}},
       {.moe = true, .moe_norm_topk_default = true},
       MixtralWeights()},
      {"qwen3_moe",
       {{"Qwen3MoeForCausalLM", "qwen3_moe"}},
       {.qk_norm = true, .moe = true},
       Qwen3MoeWeights()},
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

std::string_view ActivationName(MlpKind mlp) {
  return mlp == MlpKind::kGeGluTanh ? "gelu_pytorch_tanh" : "silu";
}

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

std::string WeightName(const WeightSpec& w, int64_t layer, int64_t expert) {
  std::string name(w.name);
  for (const auto& [key, value] : {std::pair{"{L}", layer}, std::pair{"{E}", expert}}) {
    const size_t at = name.find(key);
    if (at != std::string::npos) name.replace(at, 3, std::to_string(value));
  }
  return name;
}

bool LayerHolds(const WeightSpec& w, const ModelConfig& c, int64_t layer) {
  switch (w.scope) {
    case LayerScope::kEvery:
      return true;
    case LayerScope::kDense:
      return !c.IsMoeLayer(layer);
    case LayerScope::kMoe:
      return c.IsMoeLayer(layer);
  }
  return true;
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
    case Dim::kHeadDim:
      return c.head_dim;
    case Dim::kQkvDim:
      return (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    case Dim::kGateUpDim:
      return 2 * c.intermediate_size;
    case Dim::kNumExperts:
      return c.num_experts;
    case Dim::kMoeIntermediate:
      return c.moe_intermediate_size;
  }
  return 0;
}

std::vector<int64_t> WeightShape(const WeightSpec& w, const ModelConfig& c) {
  if (w.cols == Dim::kNone) return {DimSize(w.rows, c)};
  return {DimSize(w.rows, c), DimSize(w.cols, c)};
}

const WeightSpec* FindWeight(const ArchitectureSpec& spec, WeightRole role) {
  for (const WeightSpec& w : spec.weights) {
    if (w.role == role) return &w;
  }
  return nullptr;
}

const WeightSpec& WeightOf(const ArchitectureSpec& spec, WeightRole role) {
  if (const WeightSpec* w = FindWeight(spec, role)) return *w;
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
      if (!w.per_layer || !LayerHolds(w, c, i)) continue;
      if (!w.per_expert) {
        out.push_back({WeightName(w, i), WeightShape(w, c), &w, i});
        continue;
      }
      for (int64_t e = 0; e < c.num_experts; ++e) {
        out.push_back({WeightName(w, i, e), WeightShape(w, c), &w, i, e});
      }
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
    if (!w.per_layer || !w.is_linear || w.per_expert) continue;
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
  const std::string arch =
      "architecture " + config.architecture + " (" + std::string(spec.name) + ") needs ";
  if (spec.features.attention_bias && !backend.attention_bias) {
    throw Error(arch + "attention biases (attention_bias), which " + where + " does not implement");
  }
  if (spec.features.qk_norm && !backend.qk_norm) {
    throw Error(arch + "per-head q/k norms (qk_norm), which " + where + " does not implement");
  }
  const ArchitectureFeatures& f = spec.features;
  if ((f.norm != NormStyle::kRmsNorm || f.mlp != MlpKind::kSwiGlu || f.sandwich_norms ||
       f.scale_embeddings) &&
      !backend.gemma) {
    throw Error(arch +
                "Gemma's layer ((1 + w) RMSNorms, GeGLU, sandwich norms, scaled embeddings), "
                "which " +
                where + " does not implement yet");
  }
  if (f.moe && !backend.moe) {
    throw Error(arch + "mixture-of-experts layers (" + std::to_string(config.num_experts) +
                " experts, " + std::to_string(config.num_experts_per_tok) + " per token), which " +
                where + " does not implement yet");
  }
  if (f.packed_projections && !backend.packed) {
    throw Error(arch + "packed qkv_proj / gate_up_proj tensors, which " + where +
                " does not load yet");
  }
  if (config.sliding_window && !backend.sliding_window) {
    throw Error("config.json: field 'sliding_window' is " + std::to_string(*config.sliding_window) +
                ": " + where +
                " has no sliding-window attention yet (set it to null to attend to every "
                "token, which changes the model's output past the window)");
  }
}

}  // namespace llm
