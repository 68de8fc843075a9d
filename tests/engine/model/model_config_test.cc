// config.json parsing, ExpectedTensors and ValidateCheckpoint.
#include "engine/model/model_config.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "engine/loader/checkpoint_check.h"
#include "engine/loader/safetensors.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using nlohmann::json;
using test::TempDir;
using test::WriteFile;

const std::string kSource = "/models/x/config.json";

using test::ExpectError;

// A minimal valid Llama config; tests mutate one field at a time.
json Minimal() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 64},
          {"intermediate_size", 172},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 8},
          {"vocab_size", 512}};
}

// FromJson(config) must fail naming the file, `field` and every part of `more`.
void ExpectConfigError(const json& config, const std::string& field,
                       std::vector<std::string> more = {}) {
  more.push_back(kSource);
  more.push_back(field);
  ExpectError([&] { ModelConfig::FromJson(config, kSource); }, more);
}

std::string Stories() { return (test::SharedDir() / "models/stories260K").string(); }

TEST(ModelConfigTest, LoadsStories260K) {
  ModelConfig c = ModelConfig::Load(Stories());
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.generation.do_sample, false);
  EXPECT_EQ(c.generation.eos_token_ids, std::vector<int>{2});
  EXPECT_FALSE(c.generation.temperature.has_value());
}

TEST(ModelConfigTest, Defaults) {
  ModelConfig c = ModelConfig::FromJson(Minimal(), kSource);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
}

TEST(ModelConfigTest, ExplicitHeadDimMistralAndEosList) {
  json j = Minimal();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["head_dim"] = 16;  // differs from 64 / 8
  j["eos_token_id"] = {128001, 128008, 128009};
  j["sliding_window"] = 4096;
  ModelConfig c = ModelConfig::FromJson(j, kSource);
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(c.sliding_window, 4096);
}

TEST(ModelConfigTest, RopeScalingLlama3AndLinear) {
  json j = Minimal();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  ModelConfig c = ModelConfig::FromJson(j, kSource);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);

  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  c = ModelConfig::FromJson(j, kSource);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);

  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ModelConfig::FromJson(j, kSource).rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(ModelConfigTest, ToJsonRoundTrips) {
  json j = Minimal();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  j["eos_token_id"] = {5, 6};
  j["num_key_value_heads"] = 2;
  j["tie_word_embeddings"] = true;
  ModelConfig a = ModelConfig::FromJson(j, kSource);
  ModelConfig b = ModelConfig::FromJson(a.ToJson(), kSource);
  EXPECT_EQ(a.ToJson(), b.ToJson());
  EXPECT_EQ(b.num_kv_heads, 2);
  EXPECT_EQ(b.eos_token_ids, (std::vector<int>{5, 6}));
  EXPECT_EQ(b.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_TRUE(b.tie_word_embeddings);
}

TEST(ModelConfigTest, UnsupportedArchitecture) {
  json j = Minimal();
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  ExpectConfigError(j, "architectures", {"GPT2LMHeadModel"});
  j.erase("architectures");
  ExpectConfigError(j, "model_type", {"gpt2"});
}

TEST(ModelConfigTest, MissingOrNonPositiveRequiredFields) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size"}) {
    json j = Minimal();
    j.erase(field);
    ExpectConfigError(j, field, {"missing"});
    j[field] = 0;
    ExpectConfigError(j, field, {"positive"});
    j[field] = -3;
    ExpectConfigError(j, field, {"positive"});
  }
}

TEST(ModelConfigTest, WrongJsonTypes) {
  json j = Minimal();
  j["hidden_size"] = "big";
  ExpectConfigError(j, "hidden_size", {"integer"});
  j = Minimal();
  j["rms_norm_eps"] = "small";
  ExpectConfigError(j, "rms_norm_eps");
  j = Minimal();
  j["tie_word_embeddings"] = 1;
  ExpectConfigError(j, "tie_word_embeddings");
  j = Minimal();
  j["eos_token_id"] = {2, "x"};
  ExpectConfigError(j, "eos_token_id");
  j = Minimal();
  j["architectures"] = "LlamaForCausalLM";
  ExpectConfigError(j, "architectures");
  ExpectError([] { ModelConfig::FromJson(json::array(), kSource); }, {kSource});
}

TEST(ModelConfigTest, UnsupportedRopeScaling) {
  for (const char* type : {"yarn", "dynamic", "longrope"}) {
    json j = Minimal();
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    ExpectConfigError(j, "rope_scaling", {type});
  }
  json j = Minimal();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};  // llama3 fields missing
  ExpectConfigError(j, "rope_scaling.low_freq_factor");
}

TEST(ModelConfigTest, HiddenActHeadsAndBiases) {
  json j = Minimal();
  j["hidden_act"] = "gelu";
  ExpectConfigError(j, "hidden_act", {"gelu"});
  j = Minimal();
  j["num_key_value_heads"] = 3;
  ExpectConfigError(j, "num_key_value_heads");
  j = Minimal();
  j["num_attention_heads"] = 7;  // does not divide 64 and no head_dim given
  ExpectConfigError(j, "num_attention_heads");
  j["head_dim"] = 8;
  EXPECT_EQ(ModelConfig::FromJson(j, kSource).head_dim, 8);
  j = Minimal();
  j["attention_bias"] = true;
  ExpectConfigError(j, "attention_bias");
}

TEST(ModelConfigTest, LoadErrorsNameTheFile) {
  TempDir dir;
  const std::string config = (dir.path() / "config.json").string();
  ExpectError([&] { ModelConfig::Load(dir.path().string()); }, {config});
  WriteFile(config, "{not json");
  ExpectError([&] { ModelConfig::Load(dir.path().string()); }, {config, "JSON"});
  WriteFile(config, Minimal().dump());
  const std::string gen = (dir.path() / "generation_config.json").string();
  WriteFile(gen, json{{"temperature", "hot"}}.dump());
  ExpectError([&] { ModelConfig::Load(dir.path().string()); }, {gen, "temperature"});
  WriteFile(gen, json{{"temperature", 0.7},
                      {"top_p", 0.9},
                      {"top_k", 40},
                      {"do_sample", true},
                      {"repetition_penalty", 1.1},
                      {"max_new_tokens", 64},
                      {"eos_token_id", {7, 8}}}
                     .dump());
  ModelConfig c = ModelConfig::Load(dir.path().string());
  EXPECT_DOUBLE_EQ(*c.generation.temperature, 0.7);
  EXPECT_DOUBLE_EQ(*c.generation.top_p, 0.9);
  EXPECT_EQ(*c.generation.top_k, 40);
  EXPECT_TRUE(*c.generation.do_sample);
  EXPECT_DOUBLE_EQ(*c.generation.repetition_penalty, 1.1);
  EXPECT_EQ(*c.generation.max_new_tokens, 64);
  EXPECT_EQ(c.generation.eos_token_ids, (std::vector<int>{7, 8}));
}

// ---- ExpectedTensors / ValidateCheckpoint --------------------------------------------

TEST(ModelConfigExpectedTensorsTest, NamesAndShapes) {
  json j = Minimal();
  j["num_key_value_heads"] = 4;
  j["head_dim"] = 16;
  ModelConfig c = ModelConfig::FromJson(j, kSource);
  std::vector<TensorSpec> specs = ExpectedTensors(c);
  ASSERT_EQ(specs.size(), 1u + 9 * 2 + 1 + 1);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.front().shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{64, 64}));   // k_proj: 4 x 16
  EXPECT_EQ(specs[5].shape, (std::vector<int64_t>{64, 128}));  // o_proj
  EXPECT_EQ(specs[9].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(specs[9].shape, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(specs.back().name, "lm_head.weight");
}

TEST(ValidateCheckpointTest, Stories260KPasses) {
  ModelConfig c = ModelConfig::Load(Stories());
  auto ckpt = Checkpoint::Open(Stories());
  EXPECT_NO_THROW(ValidateCheckpoint(c, *ckpt));
  EXPECT_EQ(ExpectedTensors(c).size(), ckpt->names().size());  // tied: no lm_head
}

// Writes the tensors of `c` (zeros) to <dir>/model.safetensors, letting `edit` change them.
void WriteModel(const ModelConfig& c, const std::string& dir,
                const std::function<void(std::vector<TensorData>*)>& edit) {
  std::vector<TensorData> tensors;
  for (const TensorSpec& s : ExpectedTensors(c)) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    tensors.push_back({s.name, DType::kBF16, s.shape, std::vector<std::byte>(n * 2)});
  }
  edit(&tensors);
  WriteSafetensors(dir + "/model.safetensors", tensors);
}

TEST(ValidateCheckpointTest, WrongShapeMissingTensorAndTiedLmHead) {
  TempDir dir;
  const std::string d = dir.path().string(), file = d + "/model.safetensors";
  json j = Minimal();
  j["intermediate_size"] = 172;
  ModelConfig c = ModelConfig::FromJson(j, kSource);
  WriteModel(c, d, [](auto*) {});
  EXPECT_NO_THROW(ValidateCheckpoint(c, *Checkpoint::Open(d)));

  WriteModel(c, d, [](std::vector<TensorData>* t) {
    for (TensorData& x : *t) {
      if (x.name == "model.layers.0.mlp.up_proj.weight") {
        x.shape = {172, 65};
        x.bytes.resize(172 * 65 * 2);
      }
    }
  });
  ExpectError([&] { ValidateCheckpoint(c, *Checkpoint::Open(d)); },
              {file,
               "tensor 'model.layers.0.mlp.up_proj.weight' has shape [172, 65], "
               "expected [172, 64]"});

  WriteModel(c, d, [](std::vector<TensorData>* t) { t->pop_back(); });  // drop lm_head.weight
  ExpectError([&] { ValidateCheckpoint(c, *Checkpoint::Open(d)); }, {d, "'lm_head.weight'"});

  c.tie_word_embeddings = true;  // a tied model that still carries lm_head.weight is fine
  WriteModel(c, d, [&](std::vector<TensorData>* t) {
    t->push_back({"lm_head.weight", DType::kBF16, {512, 64}, std::vector<std::byte>(512 * 64 * 2)});
  });
  EXPECT_NO_THROW(ValidateCheckpoint(c, *Checkpoint::Open(d)));
}

}  // namespace
}  // namespace llm
