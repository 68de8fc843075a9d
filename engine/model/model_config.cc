// config.json / generation_config.json parsing. Every access goes through a typed reader so
// that a wrong JSON type becomes an llm::Error naming the file and field, never a
// nlohmann::json exception.
#include "engine/model/model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "engine/loader/safetensors_util.h"
#include "engine/model/architecture.h"

namespace llm {
namespace {

using nlohmann::json;

// Typed, optional access to the fields of one JSON object. A null value counts as absent
// (HF writes e.g. "rope_scaling": null, "sliding_window": null).
class Fields {
 public:
  Fields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void Fail(const std::string& field, const std::string& what) const {
    throw Error(source_ + ": field '" + prefix_ + field + "' " + what);
  }

  const json* Get(const std::string& field) const {
    auto it = j_.find(field);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  std::optional<int64_t> Int(const std::string& field) const {
    const json* v = Get(field);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_integer() && !(v->is_number_unsigned() && v->get<uint64_t>() > kMaxInt)) {
      return v->get<int64_t>();
    }
    // 4096.0 is accepted: some exporters write integral values as floats.
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
        return static_cast<int64_t>(d);
      }
    }
    Fail(field, "must be an integer, got " + Text(*v));
  }

  int64_t Positive(const std::string& field, std::optional<int64_t> fallback) const {
    std::optional<int64_t> v = Int(field);
    if (!v && !fallback) Fail(field, "is required but missing");
    if (v && *v <= 0) Fail(field, "must be positive, got " + std::to_string(*v));
    return v ? *v : *fallback;
  }

  std::optional<double> Double(const std::string& field) const {
    const json* v = Get(field);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) Fail(field, "must be a number, got " + Text(*v));
    return v->get<double>();
  }

  double PositiveDouble(const std::string& field, std::optional<double> fallback) const {
    std::optional<double> v = Double(field);
    if (!v && !fallback) Fail(field, "is required but missing");
    if (v && !(*v > 0 && std::isfinite(*v)))
      Fail(field, "must be positive, got " + Text(*Get(field)));
    return v ? *v : *fallback;
  }

  std::optional<bool> Bool(const std::string& field) const {
    const json* v = Get(field);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) Fail(field, "must be true or false, got " + Text(*v));
    return v->get<bool>();
  }

  std::optional<std::string> String(const std::string& field) const {
    const json* v = Get(field);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) Fail(field, "must be a string, got " + Text(*v));
    return v->get<std::string>();
  }

  // A token id: an int that fits and is not negative.
  std::optional<int> TokenId(const std::string& field) const {
    const json* v = Get(field);
    return v ? std::optional<int>(CheckTokenId(*v, field)) : std::nullopt;
  }

  // eos_token_id: an int or a non-empty list of ints.
  std::vector<int> TokenIds(const std::string& field) const {
    const json* v = Get(field);
    if (v == nullptr) return {};
    if (!v->is_array()) return {CheckTokenId(*v, field)};
    if (v->empty()) Fail(field, "is an empty list");
    std::vector<int> ids;
    for (size_t i = 0; i < v->size(); ++i) {
      ids.push_back(CheckTokenId((*v)[i], field + "[" + std::to_string(i) + "]"));
    }
    return ids;
  }

  static std::string Text(const json& v) { return JsonSnippet(v); }

 private:
  int CheckTokenId(const json& v, const std::string& name) const {
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    bool ok = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t{kMax}
                                     : v.is_number_integer() && v.get<int64_t>() >= 0;
    if (!ok) Fail(name, "is not a valid token id: " + Text(v));
    return v.get<int>();
  }

  static constexpr uint64_t kMaxInt = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const json& j_;
  std::string source_;
  std::string prefix_;
};

// "architectures": [one registered class], falling back to model_type when absent
// (engine/model/architecture.h: the registry decides which load).
std::string ParseArchitecture(const Fields& f) {
  const std::string supported_architectures = SupportedArchitectures();
  const std::string supported_model_types = SupportedModelTypes();
  std::string arch;
  if (const json* archs = f.Get("architectures")) {
    if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
      f.Fail("architectures", "must be a list of one name, got " + Fields::Text(*archs));
    }
    arch = (*archs)[0].get<std::string>();
    if (FindArchitecture(arch) == nullptr) {
      // Mixture-of-experts checkpoints (Qwen2-MoE, DeepSeek, ...) say so by their expert count.
      const bool moe = f.Get("num_local_experts") != nullptr || f.Get("num_experts") != nullptr ||
                       f.Get("n_routed_experts") != nullptr;
      f.Fail("architectures",
             "is '" + arch + "'" +
                 (moe ? ", a mixture-of-experts model of an architecture this engine does not "
                        "serve"
                      : "") +
                 "; supported: " + supported_architectures);
    }
  }
  std::optional<std::string> model_type = f.String("model_type");
  if (model_type && FindArchitectureByModelType(*model_type) == nullptr) {
    f.Fail("model_type", "is '" + *model_type + "', supported: " + supported_model_types);
  }
  if (arch.empty()) {
    if (!model_type) f.Fail("architectures", "is missing (and so is model_type)");
    arch = std::string(ArchitectureForModelType(*model_type));
  }
  return arch;
}

// A rope_scaling object (transformers 4) or one rope_parameters entry (transformers 5, which
// holds rope_theta too): `field` names it in errors.
RopeScaling ParseRopeScaling(const Fields& f, const std::string& field, const json* v,
                             const std::string& source) {
  RopeScaling rs;
  if (v == nullptr) return rs;
  if (!v->is_object()) f.Fail(field, "must be an object or null, got " + Fields::Text(*v));
  Fields r(*v, source, field + ".");
  if (std::optional<double> partial = r.Double("partial_rotary_factor"); partial && *partial != 1) {
    r.Fail("partial_rotary_factor", "is " + Fields::Text(*r.Get("partial_rotary_factor")) +
                                        "; only full rotary embeddings (1.0) are supported");
  }
  std::optional<std::string> type = r.String("rope_type");
  if (!type) type = r.String("type");
  if (!type) f.Fail(field, "has neither 'rope_type' nor 'type'");
  if (*type == "default") return rs;
  if (*type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
    rs.factor = r.PositiveDouble("factor", std::nullopt);
    return rs;
  }
  if (*type != "llama3") {
    f.Fail(field, "has type '" + *type + "', supported: default, linear, llama3");
  }
  rs.type = RopeScaling::Type::kLlama3;
  rs.factor = r.PositiveDouble("factor", std::nullopt);
  rs.low_freq_factor = r.PositiveDouble("low_freq_factor", std::nullopt);
  rs.high_freq_factor = r.PositiveDouble("high_freq_factor", std::nullopt);
  rs.original_max_position_embeddings =
      r.Positive("original_max_position_embeddings", std::nullopt);
  // The llama3 formula divides by (high - low).
  if (rs.high_freq_factor <= rs.low_freq_factor) {
    f.Fail(field, "needs high_freq_factor > low_freq_factor");
  }
  return rs;
}

// One transformers 5 rope_parameters entry: {rope_theta, rope_type, ...}.
RopeParameters ParseRopeEntry(const Fields& f, const std::string& field, const json& v,
                              const std::string& source) {
  RopeParameters rp;
  rp.scaling = ParseRopeScaling(f, field, &v, source);
  rp.theta = Fields(v, source, field + ".").PositiveDouble("rope_theta", 10000.0);
  return rp;
}

// The RoPE of both config formats: transformers 5's "rope_parameters" (one entry, or one per
// layer type: "full_attention", "sliding_attention"), else transformers 4's "rope_theta" +
// "rope_scaling" (+ Gemma 3's "rope_local_base_freq" for its sliding layers).
void ParseRope(const Fields& f, const std::string& source, ModelConfig* c) {
  if (std::optional<double> partial = f.Double("partial_rotary_factor"); partial && *partial != 1) {
    f.Fail("partial_rotary_factor", "is " + Fields::Text(*f.Get("partial_rotary_factor")) +
                                        "; only full rotary embeddings (1.0) are supported");
  }
  if (const json* p = f.Get("rope_parameters")) {
    if (!p->is_object()) f.Fail("rope_parameters", "must be an object, got " + Fields::Text(*p));
    const bool per_type = p->contains("full_attention") || p->contains("sliding_attention");
    if (!per_type) {
      const RopeParameters rp = ParseRopeEntry(f, "rope_parameters", *p, source);
      c->rope_theta = rp.theta;
      c->rope_scaling = rp.scaling;
      return;
    }
    for (const auto& [key, value] : p->items()) {
      if (key != "full_attention" && key != "sliding_attention") {
        f.Fail("rope_parameters",
               "has an entry '" + key + "' (per layer type: full_attention, sliding_attention)");
      }
    }
    if (!p->contains("full_attention")) f.Fail("rope_parameters", "has no 'full_attention' entry");
    const RopeParameters full =
        ParseRopeEntry(f, "rope_parameters.full_attention", p->at("full_attention"), source);
    c->rope_theta = full.theta;
    c->rope_scaling = full.scaling;
    if (p->contains("sliding_attention")) {
      c->sliding_rope = ParseRopeEntry(f, "rope_parameters.sliding_attention",
                                       p->at("sliding_attention"), source);
    }
    return;
  }
  c->rope_theta = f.PositiveDouble("rope_theta", 10000.0);
  c->rope_scaling = ParseRopeScaling(f, "rope_scaling", f.Get("rope_scaling"), source);
  if (std::optional<double> local = f.Double("rope_local_base_freq")) {
    c->sliding_rope = RopeParameters{f.PositiveDouble("rope_local_base_freq", std::nullopt), {}};
  }
}

// Which layers slide: "layer_types" (transformers 5, and late 4.x), else the family's older
// rule: Gemma 3's sliding_window_pattern (every pattern-th layer is full), Qwen's
// use_sliding_window + max_window_layers (layers from max_window_layers on slide), else every
// layer when sliding_window is set. Normalizes sliding_window to null when no layer slides.
void ParseLayerTypes(const Fields& f, ModelConfig* c) {
  using LT = ModelConfig::LayerType;
  const size_t n = static_cast<size_t>(c->num_layers);
  if (f.Bool("use_sliding_window") == false) c->sliding_window.reset();
  if (const json* types = f.Get("layer_types")) {
    if (!types->is_array() || types->size() != n) {
      f.Fail("layer_types", "must be a list of num_hidden_layers (" + std::to_string(n) +
                                ") entries, got " + Fields::Text(*types));
    }
    for (size_t i = 0; i < n; ++i) {
      const json& t = (*types)[i];
      if (t == "full_attention") {
        c->layer_types.push_back(LT::kFull);
      } else if (t == "sliding_attention") {
        c->layer_types.push_back(LT::kSliding);
      } else {
        f.Fail("layer_types[" + std::to_string(i) + "]",
               "is " + Fields::Text(t) + ", supported: full_attention, sliding_attention");
      }
    }
  } else if (std::optional<int64_t> pattern = f.Int("sliding_window_pattern")) {
    if (*pattern <= 0) f.Fail("sliding_window_pattern", "must be positive");
    for (size_t i = 0; i < n; ++i) {
      c->layer_types.push_back((int64_t(i) + 1) % *pattern == 0 ? LT::kFull : LT::kSliding);
    }
  } else if (f.Get("use_sliding_window") != nullptr) {
    const int64_t first = f.Int("max_window_layers").value_or(0);
    for (size_t i = 0; i < n; ++i) {
      c->layer_types.push_back(int64_t(i) >= first ? LT::kSliding : LT::kFull);
    }
  } else {
    c->layer_types.assign(n, LT::kSliding);
  }
  // A sliding layer without a window attends to every key (transformers: sliding_window null).
  bool any = false;
  for (LT& t : c->layer_types) {
    if (!c->sliding_window) t = LT::kFull;
    any = any || t == LT::kSliding;
  }
  if (!any) c->sliding_window.reset();
}

// Features this engine does not implement must fail loudly, not compute a wrong model.
void RejectUnsupported(const Fields& f, const ArchitectureSpec& spec) {
  // Gemma writes "hidden_activation" (and may keep a stale "hidden_act"); the others hidden_act.
  const char* act_field = f.Get("hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string_view want = ActivationName(spec.features.mlp);
  std::optional<std::string> act = f.String(act_field);
  if (act && *act != want) {
    f.Fail(act_field,
           "is '" + *act + "'; " + std::string(spec.name) + " computes " + std::string(want));
  }
  // Qwen2's q/k/v biases are part of its architecture; elsewhere biases are not supported.
  if (!spec.features.attention_bias && f.Bool("attention_bias").value_or(false)) {
    f.Fail("attention_bias", "is true; biases are not supported for " + std::string(spec.name));
  }
  if (f.Bool("mlp_bias").value_or(false)) f.Fail("mlp_bias", "is true; biases are not supported");
  for (const char* cap : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (f.Get(cap) != nullptr) f.Fail(cap, "is set; logit soft-capping is not supported");
  }
  if (f.Bool("use_bidirectional_attention").value_or(false)) {
    f.Fail("use_bidirectional_attention", "is true; only causal attention is supported");
  }
}

void ParseSizes(const Fields& f, ModelConfig* c) {
  c->hidden_size = f.Positive("hidden_size", std::nullopt);
  c->intermediate_size = f.Positive("intermediate_size", std::nullopt);
  c->num_layers = f.Positive("num_hidden_layers", std::nullopt);
  c->num_heads = f.Positive("num_attention_heads", std::nullopt);
  c->vocab_size = f.Positive("vocab_size", std::nullopt);
  c->num_kv_heads = f.Positive("num_key_value_heads", c->num_heads);
  if (c->num_heads % c->num_kv_heads != 0) {
    f.Fail("num_key_value_heads", std::string("(") + std::to_string(c->num_kv_heads) +
                                      ") must divide num_attention_heads (" +
                                      std::to_string(c->num_heads) + ")");
  }
  if (f.Get("head_dim") == nullptr && c->hidden_size % c->num_heads != 0) {
    f.Fail("num_attention_heads", std::string("(") + std::to_string(c->num_heads) +
                                      ") must divide hidden_size (" +
                                      std::to_string(c->hidden_size) + ") when head_dim is absent");
  }
  c->head_dim = f.Positive("head_dim", c->hidden_size / c->num_heads);
  c->max_position_embeddings = f.Positive("max_position_embeddings", 2048);
  std::optional<int64_t> window = f.Int("sliding_window");
  if (window && *window <= 0) f.Fail("sliding_window", "must be positive or null");
  c->sliding_window = window;
}

// The experts of a mixture-of-experts architecture: num_local_experts (Mixtral; Qwen3-MoE
// under transformers 5) or num_experts (Qwen3-MoE under transformers 4), the top k, the
// experts' width, the renormalization, and which layers are sparse.
void ParseMoe(const Fields& f, const ArchitectureSpec& spec, ModelConfig* c) {
  if (!spec.features.moe) return;
  const char* count = f.Get("num_local_experts") ? "num_local_experts" : "num_experts";
  c->num_experts = f.Positive(count, std::nullopt);
  c->num_experts_per_tok = f.Positive("num_experts_per_tok", std::nullopt);
  if (c->num_experts_per_tok > c->num_experts) {
    f.Fail("num_experts_per_tok", "(" + std::to_string(c->num_experts_per_tok) +
                                      ") is more than the experts (" + count + " " +
                                      std::to_string(c->num_experts) + ")");
  }
  c->moe_intermediate_size = f.Positive("moe_intermediate_size", c->intermediate_size);
  c->norm_topk_prob = f.Bool("norm_topk_prob").value_or(spec.features.moe_norm_topk_default);
  c->decoder_sparse_step = f.Positive("decoder_sparse_step", 1);
  if (const json* only = f.Get("mlp_only_layers")) {
    if (!only->is_array()) f.Fail("mlp_only_layers", "must be a list of layer indices");
    for (size_t i = 0; i < only->size(); ++i) {
      const json& v = (*only)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c->num_layers) {
        f.Fail("mlp_only_layers[" + std::to_string(i) + "]",
               "is " + Fields::Text(v) + ", not a layer index below num_hidden_layers (" +
                   std::to_string(c->num_layers) + ")");
      }
      c->mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
}

GenerationDefaults ParseGeneration(const json& j, const std::string& source) {
  if (!j.is_object()) throw Error(source + ": not a JSON object");
  Fields f(j, source);
  GenerationDefaults g;
  g.temperature = f.Double("temperature");
  g.top_p = f.Double("top_p");
  if (auto k = f.Int("top_k")) {
    if (*k < 0 || *k > std::numeric_limits<int>::max()) f.Fail("top_k", "is out of range");
    g.top_k = static_cast<int>(*k);
  }
  g.do_sample = f.Bool("do_sample");
  g.repetition_penalty = f.Double("repetition_penalty");
  if (auto n = f.Int("max_new_tokens")) {
    if (*n <= 0 || *n > std::numeric_limits<int>::max())
      f.Fail("max_new_tokens", "is out of range");
    g.max_new_tokens = static_cast<int>(*n);
  }
  g.eos_token_ids = f.TokenIds("eos_token_id");
  return g;
}

}  // namespace

ModelConfig ModelConfig::FromJson(const json& j, const std::string& source) {
  if (!j.is_object()) throw Error(source + ": not a JSON object");
  Fields f(j, source);
  ModelConfig c;
  c.architecture = ParseArchitecture(f);
  RejectUnsupported(f, ArchitectureOf(c));
  ParseSizes(f, &c);
  ParseMoe(f, ArchitectureOf(c), &c);
  ParseLayerTypes(f, &c);
  c.rms_norm_eps = f.PositiveDouble("rms_norm_eps", 1e-6);
  ParseRope(f, source, &c);
  if (f.Get("query_pre_attn_scalar") != nullptr) {
    c.query_pre_attn_scalar = f.PositiveDouble("query_pre_attn_scalar", std::nullopt);
  }
  c.tie_word_embeddings = f.Bool("tie_word_embeddings").value_or(false);
  c.bos_token_id = f.TokenId("bos_token_id").value_or(1);
  std::vector<int> eos = f.TokenIds("eos_token_id");
  if (!eos.empty()) c.eos_token_ids = eos;
  // Newer transformers write "dtype" instead of "torch_dtype".
  std::optional<std::string> dtype = f.String("torch_dtype");
  if (!dtype) dtype = f.String("dtype");
  if (dtype) c.torch_dtype = *dtype;
  return c;
}

ModelConfig ModelConfig::Load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(model_dir) / "config.json").string();
  ModelConfig c = FromJson(ReadJsonFile(config_path), config_path);
  const std::string gen_path = (fs::path(model_dir) / "generation_config.json").string();
  std::error_code ec;
  if (fs::exists(gen_path, ec)) c.generation = ParseGeneration(ReadJsonFile(gen_path), gen_path);
  return c;
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts == 0) return false;
  for (int64_t dense : mlp_only_layers) {
    if (dense == layer) return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

RopeParameters ModelConfig::RopeOf(int64_t layer) const {
  if (sliding_rope && SlidingWindowOf(layer) > 0) return *sliding_rope;
  return {rope_theta, rope_scaling};
}

float ModelConfig::AttentionScale() const {
  const double d = query_pre_attn_scalar.value_or(static_cast<double>(head_dim));
  return static_cast<float>(1.0 / std::sqrt(d));
}

namespace {

json RopeScalingJson(const RopeScaling& rs) {
  switch (rs.type) {
    case RopeScaling::Type::kNone:
      return nullptr;
    case RopeScaling::Type::kLinear:
      return {{"rope_type", "linear"}, {"factor", rs.factor}};
    case RopeScaling::Type::kLlama3:
      return {{"rope_type", "llama3"},
              {"factor", rs.factor},
              {"low_freq_factor", rs.low_freq_factor},
              {"high_freq_factor", rs.high_freq_factor},
              {"original_max_position_embeddings", rs.original_max_position_embeddings}};
  }
  return nullptr;
}

}  // namespace

json ModelConfig::ToJson() const {
  json j = {
      {"architectures", {architecture}},
      {"model_type", std::string(ModelTypeOf(architecture))},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"tie_word_embeddings", tie_word_embeddings},
      {"bos_token_id", bos_token_id},
      {"hidden_act", std::string(ActivationName(ArchitectureOf(*this).features.mlp))},
      {"torch_dtype", torch_dtype},
  };
  j["eos_token_id"] = eos_token_ids.size() == 1 ? json(eos_token_ids[0]) : json(eos_token_ids);
  // transformers 4's keys (what most Hub checkpoints carry), plus layer_types.
  j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
  j["rope_scaling"] = RopeScalingJson(rope_scaling);
  if (sliding_rope) {
    if (sliding_rope->scaling.type != RopeScaling::Type::kNone) {
      // transformers 4 has no key for a scaled sliding rope: write transformers 5's.
      j.erase("rope_theta");
      j.erase("rope_scaling");
      json full = RopeScalingJson(rope_scaling), slide = RopeScalingJson(sliding_rope->scaling);
      if (full.is_null()) full = {{"rope_type", "default"}};
      if (slide.is_null()) slide = {{"rope_type", "default"}};
      full["rope_theta"] = rope_theta;
      slide["rope_theta"] = sliding_rope->theta;
      j["rope_parameters"] = {{"full_attention", full}, {"sliding_attention", slide}};
    } else {
      j["rope_local_base_freq"] = sliding_rope->theta;
    }
  }
  if (!layer_types.empty()) {
    json types = json::array();
    for (LayerType t : layer_types) {
      types.push_back(t == LayerType::kSliding ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
  }
  if (query_pre_attn_scalar) j["query_pre_attn_scalar"] = *query_pre_attn_scalar;
  if (num_experts > 0) {
    // Both names of the expert count: transformers 4's Qwen3-MoE reads num_experts.
    j["num_local_experts"] = num_experts;
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
  }
  return j;
}

}  // namespace llm
