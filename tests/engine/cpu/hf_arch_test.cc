// Today's architectures on the CPU backend against Hugging Face transformers itself:
// ../shared/models/hf-arch (PROVENANCE.md there) holds tiny random-weight checkpoints written
// by transformers' save_pretrained with its fp32 logits at every position of two prompts and
// its greedy 32-token continuation. Each folder must give those logits (relative error
// <= 1e-4) and that continuation, whole-prompt and chunked; its config rewritten into
// transformers 4's keys (rope_theta / rope_scaling / torch_dtype, no layer_types) must load as
// the same model. The mixture-of-experts folders (Mixtral, Qwen3-MoE) route each token to 2 of
// 8 experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/sequence_runner.h"
#include "engine/error.h"
#include "engine/model/architecture.h"
#include "engine/model/model_config.h"
#include "tests/test_util.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kMaxRelError = 1e-4;

std::string FolderOf(const std::string& name) {
  return (test::SharedDir() / "models" / "hf-arch" / name).string();
}

json ReadJson(const fs::path& p) { return json::parse(test::ReadFile(p)); }

// max |got - want| / max |want| over all rows.
double RelativeError(const std::vector<float>& got, const json& want_rows, int64_t vocab) {
  double max_diff = 0, max_ref = 0;
  for (size_t r = 0; r < want_rows.size(); ++r) {
    for (int64_t v = 0; v < vocab; ++v) {
      const double want = want_rows[r][size_t(v)].get<double>();
      const double g = got[r * size_t(vocab) + size_t(v)];
      max_diff = std::max(max_diff, std::isnan(g) ? INFINITY : std::fabs(g - want));
      max_ref = std::max(max_ref, std::fabs(want));
    }
  }
  return max_diff / max_ref;
}

int Argmax(const float* row, int64_t n) { return int(std::max_element(row, row + n) - row); }

// The prompt's logits at every position, fed in chunks of `chunk` tokens (0: all at once).
std::vector<float> PromptLogits(const CpuModel& model, const std::vector<int>& ids, size_t chunk) {
  SequenceRunner run(model, int64_t(ids.size()) + 40);
  if (chunk == 0) return run.Feed(ids, /*all_logits=*/true);
  std::vector<float> out;
  for (size_t at = 0; at < ids.size(); at += chunk) {
    const size_t n = std::min(chunk, ids.size() - at);
    const std::vector<float> part =
        run.Feed(std::span<const int>(ids.data() + at, n), /*all_logits=*/true);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<int> Greedy(const CpuModel& model, const std::vector<int>& ids, int n) {
  SequenceRunner run(model, int64_t(ids.size()) + n + 1);
  std::vector<float> logits = run.Feed(ids);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(Argmax(logits.data(), model.config().vocab_size));
    const int next = out.back();
    logits = run.Feed(std::span<const int>(&next, 1));
  }
  return out;
}

class HfArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfArchTest, LogitsAndGreedyMatchTransformers) {
  const std::string dir = FolderOf(GetParam());
  ASSERT_TRUE(fs::exists(dir + "/config.json")) << dir;
  const json ref = ReadJson(fs::path(dir) / "reference.json");
  const std::unique_ptr<CpuModel> model = CpuModel::Load(dir);
  const int64_t vocab = model->config().vocab_size;
  EXPECT_EQ(model->config().architecture, ref["architecture"].get<std::string>());
  for (const json& p : ref["prompts"]) {
    const std::vector<int> ids = p["ids"].get<std::vector<int>>();
    const double whole = RelativeError(PromptLogits(*model, ids, 0), p["logits_fp32"], vocab);
    // Chunks of 7 cross the window (16) and the cache's blocks (16) at odd offsets.
    const double chunked = RelativeError(PromptLogits(*model, ids, 7), p["logits_fp32"], vocab);
    std::printf("%-13s %2zu tokens: max rel err %.2g (chunked %.2g)\n", GetParam().c_str(),
                ids.size(), whole, chunked);
    EXPECT_LE(whole, kMaxRelError);
    EXPECT_LE(chunked, kMaxRelError);
    EXPECT_EQ(Greedy(*model, ids, 32), p["greedy_32"].get<std::vector<int>>());
  }
}

// --quantization int8 and fp8 on every architecture (the packed q|k|v and gate|up of Phi-3 and
// the experts included; int8 in the layout this CPU's kernel reads): the whole prompt's logits
// against transformers' fp32 ones. int8 (7 bits per weight and per activation block) must land
// closer than fp8 (3 mantissa bits per weight), and a dense model within 5% of max |logit|
// (measured 2.9-4.1%); on these random weights quantization reroutes tokens of the
// mixture-of-experts folders (mixtral 26%, qwen3_moe 16%, fp8 43% / 20%), so they get only the
// first bound.
TEST_P(HfArchTest, Int8WeightsCloserThanFp8) {
  const std::string dir = FolderOf(GetParam());
  const json ref = ReadJson(fs::path(dir) / "reference.json");
  const json& p = ref["prompts"][0];
  const std::vector<int> ids = p["ids"].get<std::vector<int>>();
  auto error = [&](bool int8) {
    LoadOptions o;
    o.weight_dtype = DType::kF32;
    o.int8_weights = int8;
    o.fp8_weights = !int8;
    const std::unique_ptr<CpuModel> model = CpuModel::Load(dir, o);
    return RelativeError(PromptLogits(*model, ids, 0), p["logits_fp32"],
                         model->config().vocab_size);
  };
  const double int8 = error(true), fp8 = error(false);
  std::printf("%-13s int8 weights: max rel err %.2g (fp8 %.2g)\n", GetParam().c_str(), int8, fp8);
  EXPECT_LE(int8, fp8);
  if (ModelConfig::Load(dir).num_experts == 0) {
    EXPECT_LE(int8, 5e-2);
  }
}

// transformers 4's keys for the same model: rope_theta / rope_scaling (/ rope_local_base_freq),
// torch_dtype, and no layer_types (Gemma 3's sliding_window_pattern instead).
json OldFormat(json c) {
  if (c.contains("dtype")) {
    c["torch_dtype"] = c["dtype"];
    c.erase("dtype");
  }
  auto split = [&](json rope) {  // {rope_theta, rope_type, ...} -> theta, rope_scaling or null
    const double theta = rope["rope_theta"].get<double>();
    rope.erase("rope_theta");
    if (rope.contains("partial_rotary_factor")) {
      c["partial_rotary_factor"] = rope["partial_rotary_factor"];
      rope.erase("partial_rotary_factor");
    }
    return std::make_pair(theta, rope["rope_type"] == "default" ? json(nullptr) : rope);
  };
  json rope = c["rope_parameters"];
  c.erase("rope_parameters");
  if (rope.contains("full_attention")) {
    std::tie(c["rope_theta"], c["rope_scaling"]) = split(rope["full_attention"]);
    c["rope_local_base_freq"] = split(rope["sliding_attention"]).first;
  } else {
    std::tie(c["rope_theta"], c["rope_scaling"]) = split(rope);
  }
  if (c["model_type"] == "qwen3_moe") {  // transformers 4's Qwen3MoeConfig: num_experts
    c["num_experts"] = c["num_local_experts"];
    c.erase("num_local_experts");
  }
  if (c.contains("layer_types")) {
    std::vector<std::string> types = c["layer_types"];
    c.erase("layer_types");
    if (c["model_type"] == "gemma3_text") {
      EXPECT_EQ(types, (std::vector<std::string>{"sliding_attention", "full_attention",
                                                 "sliding_attention"}));
      c["sliding_window_pattern"] = 2;  // every second layer is full: S, F, S
    }
  }
  return c;
}

TEST_P(HfArchTest, TransformersFourConfigIsTheSameModel) {
  const std::string dir = FolderOf(GetParam());
  const test::TempDir tmp_dir;
  const fs::path& tmp = tmp_dir.path();
  const json old = OldFormat(ReadJson(fs::path(dir) / "config.json"));
  ASSERT_FALSE(old.contains("rope_parameters"));
  test::WriteFile(tmp / "config.json", old.dump(2));
  fs::create_symlink(fs::path(dir) / "model.safetensors", tmp / "model.safetensors");
  const std::unique_ptr<CpuModel> a = CpuModel::Load(dir), b = CpuModel::Load(tmp.string());
  const ModelConfig &ca = a->config(), &cb = b->config();
  EXPECT_EQ(ca.rope_theta, cb.rope_theta);
  EXPECT_EQ(ca.rope_scaling.type, cb.rope_scaling.type);
  EXPECT_EQ(ca.rope_scaling.factor, cb.rope_scaling.factor);
  EXPECT_EQ(ca.sliding_rope.has_value(), cb.sliding_rope.has_value());
  EXPECT_EQ(ca.sliding_window, cb.sliding_window);
  for (int64_t i = 0; i < ca.num_layers; ++i) {
    EXPECT_EQ(ca.SlidingWindowOf(i), cb.SlidingWindowOf(i)) << "layer " << i;
  }
  const json ref = ReadJson(fs::path(dir) / "reference.json");
  const std::vector<int> ids = ref["prompts"][0]["ids"].get<std::vector<int>>();
  EXPECT_EQ(PromptLogits(*a, ids, 0), PromptLogits(*b, ids, 0));  // bit for bit
  // And our own writer's config (llm make-model) reads back as the same model.
  const ModelConfig round = ModelConfig::FromJson(ca.ToJson(), "ToJson");
  EXPECT_EQ(round.architecture, ca.architecture);
  EXPECT_EQ(round.sliding_window, ca.sliding_window);
  EXPECT_EQ(round.query_pre_attn_scalar, ca.query_pre_attn_scalar);
  EXPECT_EQ(round.sliding_rope.has_value(), ca.sliding_rope.has_value());
  EXPECT_EQ(ca.num_experts, cb.num_experts);
  EXPECT_EQ(round.num_experts, ca.num_experts);
  EXPECT_EQ(round.num_experts_per_tok, ca.num_experts_per_tok);
  EXPECT_EQ(round.moe_intermediate_size, ca.moe_intermediate_size);
  EXPECT_EQ(round.norm_topk_prob, ca.norm_topk_prob);
  for (int64_t i = 0; i < ca.num_layers; ++i) {
    EXPECT_EQ(round.IsMoeLayer(i), ca.IsMoeLayer(i));
    EXPECT_EQ(round.SlidingWindowOf(i), ca.SlidingWindowOf(i));
    EXPECT_EQ(round.RopeOf(i).theta, ca.RopeOf(i).theta);
  }
}

INSTANTIATE_TEST_SUITE_P(Folders, HfArchTest,
                         ::testing::Values("qwen2", "qwen3", "mistral_sw16", "llama31", "phi3",
                                           "gemma3", "mixtral", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

// What each folder exercises is what its config parses into.
TEST(HfArchConfigTest, FeaturesParseAsTransformersDefinesThem) {
  const ModelConfig gemma = ModelConfig::Load(FolderOf("gemma3"));
  EXPECT_EQ(gemma.SlidingWindowOf(0), 16);
  EXPECT_EQ(gemma.SlidingWindowOf(1), 0);
  EXPECT_EQ(gemma.SlidingWindowOf(2), 16);
  EXPECT_EQ(gemma.RopeOf(0).theta, 10000.0);
  EXPECT_EQ(gemma.RopeOf(1).theta, 1e6);
  EXPECT_FLOAT_EQ(gemma.AttentionScale(), 0.25f);  // query_pre_attn_scalar 16
  const ModelConfig sw = ModelConfig::Load(FolderOf("mistral_sw16"));
  for (int64_t i = 0; i < sw.num_layers; ++i) EXPECT_EQ(sw.SlidingWindowOf(i), 16);
  const ModelConfig qwen3 = ModelConfig::Load(FolderOf("qwen3"));
  EXPECT_EQ(qwen3.head_dim, 32);  // not hidden / heads = 16
  EXPECT_FALSE(qwen3.sliding_window.has_value());
  const ModelConfig llama31 = ModelConfig::Load(FolderOf("llama31"));
  EXPECT_EQ(llama31.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(llama31.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(llama31.rope_theta, 500000.0);
  // Qwen2.5's Hub configs carry a window that use_sliding_window switches off.
  json q = ReadJson(fs::path(FolderOf("qwen2")) / "config.json");
  q["sliding_window"] = 32768;
  q.erase("layer_types");
  EXPECT_FALSE(ModelConfig::FromJson(q, "config.json").sliding_window.has_value());
  q["use_sliding_window"] = true;
  q["max_window_layers"] = 1;
  const ModelConfig windowed = ModelConfig::FromJson(q, "config.json");
  EXPECT_EQ(windowed.SlidingWindowOf(0), 0);
  EXPECT_EQ(windowed.SlidingWindowOf(1), 32768);
}

TEST(HfArchConfigTest, BadFieldsAreErrorsNamingThem) {
  json g = ReadJson(fs::path(FolderOf("gemma3")) / "config.json");
  json bad = g;
  bad["layer_types"] = {"sliding_attention", "full_attention"};
  test::ExpectError([&] { ModelConfig::FromJson(bad, "config.json"); },
                    {"config.json", "layer_types", "num_hidden_layers (3)"});
  bad = g;
  bad["layer_types"][1] = "chunked_attention";
  test::ExpectError([&] { ModelConfig::FromJson(bad, "config.json"); },
                    {"layer_types[1]", "chunked_attention"});
  bad = g;
  bad["final_logit_softcapping"] = 30.0;
  test::ExpectError([&] { ModelConfig::FromJson(bad, "config.json"); },
                    {"final_logit_softcapping", "soft-capping"});
  bad = g;
  bad["hidden_activation"] = "silu";
  test::ExpectError([&] { ModelConfig::FromJson(bad, "config.json"); },
                    {"hidden_activation", "'silu'", "gelu_pytorch_tanh"});
  bad = g;
  bad["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  test::ExpectError([&] { ModelConfig::FromJson(bad, "config.json"); },
                    {"rope_parameters.full_attention", "yarn"});
  json phi = ReadJson(fs::path(FolderOf("phi3")) / "config.json");
  phi["rope_parameters"]["partial_rotary_factor"] = 0.75;
  test::ExpectError([&] { ModelConfig::FromJson(phi, "config.json"); },
                    {"partial_rotary_factor", "0.75"});
}

// The experts' fields of both folders as transformers reads them: Mixtral renormalizes its
// top 2 with no config field for it and sizes its experts by intermediate_size; Qwen3-MoE
// says norm_topk_prob and moe_intermediate_size.
TEST(HfArchConfigTest, MixtureOfExpertsFieldsParse) {
  const ModelConfig mixtral = ModelConfig::Load(FolderOf("mixtral"));
  EXPECT_EQ(mixtral.num_experts, 8);
  EXPECT_EQ(mixtral.num_experts_per_tok, 2);
  EXPECT_EQ(mixtral.moe_intermediate_size, 160);
  EXPECT_TRUE(mixtral.norm_topk_prob);
  const ModelConfig qwen = ModelConfig::Load(FolderOf("qwen3_moe"));
  EXPECT_EQ(qwen.num_experts, 8);
  EXPECT_EQ(qwen.moe_intermediate_size, 64);
  EXPECT_EQ(qwen.intermediate_size, 160);
  EXPECT_TRUE(qwen.norm_topk_prob);
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(mixtral.IsMoeLayer(i) && qwen.IsMoeLayer(i));
  // Qwen's defaults: no renormalization; mlp_only_layers and decoder_sparse_step make dense
  // layers.
  json q = ReadJson(fs::path(FolderOf("qwen3_moe")) / "config.json");
  q.erase("norm_topk_prob");
  q["mlp_only_layers"] = {0};
  q["decoder_sparse_step"] = 2;
  const ModelConfig sparse = ModelConfig::FromJson(q, "config.json");
  EXPECT_FALSE(sparse.norm_topk_prob);
  EXPECT_FALSE(sparse.IsMoeLayer(0));
  EXPECT_TRUE(sparse.IsMoeLayer(1));
  EXPECT_FALSE(sparse.IsMoeLayer(2));
  for (const auto& [field, value, words] :
       std::vector<std::tuple<std::string, json, std::vector<std::string>>>{
           {"num_experts_per_tok", 9, {"num_experts_per_tok", "(9)", "num_local_experts 8"}},
           {"num_local_experts", 0, {"num_local_experts", "positive"}},
           {"mlp_only_layers", json{3}, {"mlp_only_layers[0]", "num_hidden_layers (3)"}},
           {"moe_intermediate_size", "64", {"moe_intermediate_size", "integer"}}}) {
    json bad = ReadJson(fs::path(FolderOf("qwen3_moe")) / "config.json");
    bad[field] = value;
    std::vector<std::string> want = {"config.json"};
    want.insert(want.end(), words.begin(), words.end());
    test::ExpectError([&] { ModelConfig::FromJson(bad, "config.json"); }, want);
  }
}

// A Qwen3-MoE checkpoint with a dense layer (mlp_only_layers) holds that layer's mlp.gate_proj
// of intermediate_size and no experts there; one without an expert's tensor is refused naming
// it.
TEST(HfArchConfigTest, MixtureOfExpertsTensorsAreTheLayersOwn) {
  json q = ReadJson(fs::path(FolderOf("qwen3_moe")) / "config.json");
  q["mlp_only_layers"] = {1};
  const ModelConfig c = ModelConfig::FromJson(q, "config.json");
  std::vector<std::string> names;
  for (const TensorSpec& t : ExpectedTensors(c)) names.push_back(t.name);
  auto has = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  EXPECT_TRUE(has("model.layers.0.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(has("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(has("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(has("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_FALSE(has("model.layers.1.mlp.experts.0.gate_proj.weight"));
  EXPECT_FALSE(has("model.layers.1.mlp.gate.weight"));
  for (const TensorSpec& t : ExpectedTensors(c)) {
    if (t.name == "model.layers.1.mlp.gate_proj.weight") {
      EXPECT_EQ(t.shape[0], 160);
    } else if (t.name == "model.layers.2.mlp.experts.3.up_proj.weight") {
      EXPECT_EQ(t.shape[0], 64);
    } else if (t.name == "model.layers.2.mlp.gate.weight") {
      EXPECT_EQ(t.shape[0], 8);
    }
  }
  // The folder's own checkpoint lacks layer 1's dense MLP.
  const test::TempDir tmp_dir;
  const fs::path& tmp = tmp_dir.path();
  test::WriteFile(tmp / "config.json", q.dump(2));
  fs::create_symlink(fs::path(FolderOf("qwen3_moe")) / "model.safetensors",
                     tmp / "model.safetensors");
  test::ExpectError([&] { CpuModel::Load(tmp.string()); }, {"model.layers.1.mlp.gate_proj.weight"});
}

// A backend without mixture-of-experts layers says so before reading a weight; both of ours
// have them.
TEST(HfArchConfigTest, BackendsWithoutExpertsRefuseByName) {
  const ModelConfig c = ModelConfig::Load(FolderOf("mixtral"));
  BackendSupport without = kCudaBackendSupport;
  without.moe = false;
  test::ExpectError(
      [&] { RequireBackendSupport(c, without); },
      {"MixtralForCausalLM", "mixture-of-experts", "8 experts", "2 per token", "cuda backend"});
  RequireBackendSupport(c, kCpuBackendSupport);
  RequireBackendSupport(c, kCudaBackendSupport);
}

}  // namespace
}  // namespace llm
