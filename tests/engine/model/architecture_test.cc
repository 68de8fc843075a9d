// engine/model/architecture: the registry's lookups, the weight list every loader walks, the
// fused matrices of the CUDA backend, and the one place that refuses what a backend lacks
// (a feature the CUDA backend lacks, in the same words as any backend would; a feature
// through a test spec).
#include "engine/model/architecture.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/error.h"
#include "engine/model/model_config.h"
#include "engine/model/tensor_parallel.h"
#include "tests/test_util.h"

namespace llm {
namespace {

ModelConfig Llama(int64_t layers = 2) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = layers;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 8;
  c.vocab_size = 100;
  return c;
}

TEST(ArchitectureTest, EveryClassAndModelTypeResolvesToItsSpec) {
  ASSERT_FALSE(Architectures().empty());
  for (const ArchitectureSpec& spec : Architectures()) {
    for (const ArchitectureSpec::HfClass& c : spec.hf_classes) {
      EXPECT_EQ(FindArchitecture(c.architecture), &spec) << c.architecture;
      EXPECT_EQ(FindArchitectureByModelType(c.model_type), &spec) << c.model_type;
      EXPECT_EQ(ModelTypeOf(c.architecture), c.model_type);
      EXPECT_EQ(ArchitectureForModelType(c.model_type), c.architecture);
      EXPECT_NE(SupportedArchitectures().find(std::string(c.architecture)), std::string::npos);
    }
  }
  // Mistral's checkpoints are Llama's: one spec, as vLLM's registry maps them.
  EXPECT_EQ(FindArchitecture("MistralForCausalLM"), FindArchitecture("LlamaForCausalLM"));
  EXPECT_EQ(FindArchitecture("GPT2LMHeadModel"), nullptr);
  EXPECT_EQ(FindArchitectureByModelType("gpt2"), nullptr);
  EXPECT_EQ(ModelTypeOf("GPT2LMHeadModel"), "");
}

TEST(ArchitectureTest, ConfigParsingAcceptsExactlyTheRegisteredClasses) {
  nlohmann::json j = Llama().ToJson();
  for (const ArchitectureSpec& spec : Architectures()) {
    for (const ArchitectureSpec::HfClass& c : spec.hf_classes) {
      j["hidden_act"] = std::string(ActivationName(spec.features.mlp));
      j["num_local_experts"] = 4;  // read by the mixture-of-experts classes only
      j["num_experts_per_tok"] = 2;
      j["architectures"] = {c.architecture};
      j["model_type"] = c.model_type;
      EXPECT_EQ(ModelConfig::FromJson(j, "config.json").architecture, c.architecture);
      j.erase("architectures");  // model_type alone names the class
      EXPECT_EQ(ModelConfig::FromJson(j, "config.json").architecture, c.architecture);
    }
  }
  j["architectures"] = {"Qwen2MoeForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_act"] = "silu";
  test::ExpectError([&] { ModelConfig::FromJson(j, "config.json"); },
                    {"architectures", "Qwen2MoeForCausalLM", SupportedArchitectures()});
}

TEST(ArchitectureTest, ExpectedTensorsWalkTheWeightListInCheckpointOrder) {
  const ModelConfig c = Llama(2);
  const ArchitectureSpec& spec = ArchitectureOf(c);
  const std::vector<TensorSpec> tensors = ExpectedTensors(c);
  int64_t per_layer = 0, global = 0;
  for (const WeightSpec& w : spec.weights) (w.per_layer ? per_layer : global) += 1;
  ASSERT_EQ(std::ssize(tensors), global + 2 * per_layer);
  EXPECT_EQ(tensors.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(tensors[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(tensors[1].layer, 0);
  EXPECT_EQ(tensors[1 + per_layer].name, "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(tensors.back().name, "lm_head.weight");
  for (const TensorSpec& t : tensors) {
    ASSERT_NE(t.weight, nullptr);
    EXPECT_EQ(t.name, WeightName(*t.weight, t.layer));
    EXPECT_EQ(t.shape, WeightShape(*t.weight, c));
  }
  EXPECT_EQ(WeightShape(WeightOf(spec, WeightRole::kKProj), c), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(WeightShape(WeightOf(spec, WeightRole::kDownProj), c), (std::vector<int64_t>{64, 96}));
  ModelConfig tied = c;
  tied.tie_word_embeddings = true;
  EXPECT_EQ(std::ssize(ExpectedTensors(tied)), std::ssize(tensors) - 1);
  EXPECT_NE(ExpectedTensors(tied).back().name, "lm_head.weight");
}

TEST(ArchitectureTest, LayerMatricesFuseQkvAndGateUpInRowOrder) {
  const ArchitectureSpec& spec = *FindArchitecture("LlamaForCausalLM");
  const std::vector<FusedMatrix> m = LayerLinearMatrices(spec);
  ASSERT_EQ(m.size(), 4u);
  auto roles = [](const FusedMatrix& f) {
    std::vector<WeightRole> r;
    for (const WeightSpec* w : f.members) r.push_back(w->role);
    return r;
  };
  EXPECT_EQ(m[0].slot, FusedSlot::kQkv);
  EXPECT_EQ(roles(m[0]),
            (std::vector<WeightRole>{WeightRole::kQProj, WeightRole::kKProj, WeightRole::kVProj}));
  EXPECT_EQ(roles(m[1]), (std::vector<WeightRole>{WeightRole::kOProj}));
  EXPECT_EQ(m[2].slot, FusedSlot::kGateUp);
  EXPECT_EQ(roles(m[2]), (std::vector<WeightRole>{WeightRole::kGateProj, WeightRole::kUpProj}));
  EXPECT_EQ(roles(m[3]), (std::vector<WeightRole>{WeightRole::kDownProj}));
  // The splits the registry gives are the tensor-parallel shard's: at 2 ranks the fused q|k|v
  // of rank 1 holds its query heads, then its KV heads.
  const ModelConfig c = Llama();
  const TensorParallelShard s = MakeTensorParallelShard(c, 1, 2);
  EXPECT_EQ(s.Slice(*m[0].members[0], c).row_begin, 32);  // 4 of 8 query heads, head_dim 8
  EXPECT_EQ(s.Slice(*m[0].members[1], c).row_begin, 16);  // 2 of 4 KV heads
  EXPECT_EQ(s.Slice(*m[1].members[0], c).col_begin, 32);  // o_proj by columns
  const TpSlice norm = s.Slice(WeightOf(spec, WeightRole::kInputNorm), c);
  EXPECT_EQ(norm.num_rows, 64);  // replicated: the whole vector
}

// A feature a backend lacks is refused in the same words whatever the backend: the CUDA
// backend's refusal of a sliding window reads as the CPU backend's would.
TEST(ArchitectureTest, AMissingFeatureIsRefusedInTheSameWordsOnEveryBackend) {
  ModelConfig c = Llama();
  RequireBackendSupport(c, kCpuBackendSupport);  // no window: fine
  RequireBackendSupport(c, kCudaBackendSupport);
  c.sliding_window = 16;
  RequireBackendSupport(c, kCpuBackendSupport);  // the CPU backend slides
  BackendSupport cpu_without = kCpuBackendSupport;
  cpu_without.sliding_window = false;
  BackendSupport cuda_without = kCudaBackendSupport;
  cuda_without.sliding_window = false;
  std::string cpu, cuda;
  try {
    RequireBackendSupport(c, cpu_without);
  } catch (const Error& e) {
    cpu = e.what();
  }
  try {
    RequireBackendSupport(c, cuda_without);
  } catch (const Error& e) {
    cuda = e.what();
  }
  ASSERT_NE(cpu.find("'sliding_window' is 16"), std::string::npos) << cpu;
  ASSERT_NE(cpu.find("the cpu backend"), std::string::npos) << cpu;
  std::string cuda_as_cpu = cuda;
  cuda_as_cpu.replace(cuda_as_cpu.find("the cuda backend"), 16, "the cpu backend");
  EXPECT_EQ(cuda_as_cpu, cpu);
}

TEST(ArchitectureTest, AFeatureABackendLacksIsRefusedNamingIt) {
  ArchitectureSpec spec = *FindArchitecture("LlamaForCausalLM");
  spec.name = "test-qk-norm";
  spec.features.qk_norm = true;
  const ModelConfig c = Llama();
  BackendSupport without = kCpuBackendSupport;
  without.qk_norm = false;
  test::ExpectError([&] { RequireBackendSupport(c, spec, without); },
                    {"qk_norm", "test-qk-norm", "the cpu backend"});
  BackendSupport with_it = kCudaBackendSupport;
  with_it.qk_norm = true;
  with_it.attention_bias = false;
  RequireBackendSupport(c, spec, with_it);
  spec.features.attention_bias = true;
  test::ExpectError([&] { RequireBackendSupport(c, spec, with_it); },
                    {"attention_bias", "the cuda backend"});
}

// The registered architectures beyond Llama, and what each adds to its weight list.
TEST(ArchitectureTest, TodaysArchitecturesAreRegisteredWithTheirWeights) {
  for (const char* arch : {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
                           "Gemma3ForCausalLM", "MistralForCausalLM", "LlamaForCausalLM"}) {
    EXPECT_NE(FindArchitecture(arch), nullptr) << arch;
  }
  const ArchitectureSpec& qwen2 = *FindArchitecture("Qwen2ForCausalLM");
  EXPECT_TRUE(qwen2.features.attention_bias);
  EXPECT_EQ(WeightOf(qwen2, WeightRole::kKBias).name, "model.layers.{L}.self_attn.k_proj.bias");
  const ArchitectureSpec& qwen3 = *FindArchitecture("Qwen3ForCausalLM");
  EXPECT_EQ(WeightOf(qwen3, WeightRole::kQNorm).rows, Dim::kHeadDim);
  const ArchitectureSpec& phi3 = *FindArchitecture("Phi3ForCausalLM");
  EXPECT_EQ(FindWeight(phi3, WeightRole::kQProj), nullptr);
  ModelConfig c = Llama();
  c.architecture = "Phi3ForCausalLM";
  EXPECT_EQ(WeightShape(WeightOf(phi3, WeightRole::kQkvProj), c),
            (std::vector<int64_t>{(8 + 2 * 4) * 8, 64}));
  EXPECT_EQ(WeightShape(WeightOf(phi3, WeightRole::kGateUpProj), c),
            (std::vector<int64_t>{2 * 96, 64}));
  const std::vector<FusedMatrix> m = LayerLinearMatrices(phi3);
  ASSERT_EQ(m.size(), 4u);  // the packed tensors are the fused matrices themselves
  EXPECT_EQ(m[0].slot, FusedSlot::kQkv);
  EXPECT_EQ(m[0].members.size(), 1u);
  const ArchitectureSpec& gemma = *FindArchitecture("Gemma3ForCausalLM");
  EXPECT_EQ(WeightOf(gemma, WeightRole::kPostAttentionNorm).name,
            "model.layers.{L}.pre_feedforward_layernorm.weight");
  EXPECT_EQ(WeightOf(gemma, WeightRole::kAttnOutputNorm).name,
            "model.layers.{L}.post_attention_layernorm.weight");
  EXPECT_EQ(gemma.features.mlp, MlpKind::kGeGluTanh);
  // Mixtral: Llama's attention and per-expert w1 / w3 / w2 in place of the dense MLP, which
  // no layer holds; Qwen3-MoE keeps the dense MLP for its mlp_only_layers.
  const ArchitectureSpec& mixtral = *FindArchitecture("MixtralForCausalLM");
  EXPECT_TRUE(mixtral.features.moe && mixtral.features.moe_norm_topk_default);
  EXPECT_EQ(WeightOf(mixtral, WeightRole::kExpertUp).name,
            "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight");
  EXPECT_TRUE(WeightOf(mixtral, WeightRole::kExpertUp).per_expert);
  EXPECT_EQ(WeightOf(mixtral, WeightRole::kRouter).scope, LayerScope::kMoe);
  EXPECT_EQ(WeightOf(mixtral, WeightRole::kGateProj).scope, LayerScope::kDense);
  EXPECT_EQ(WeightName(WeightOf(mixtral, WeightRole::kExpertDown), 3, 5),
            "model.layers.3.block_sparse_moe.experts.5.w2.weight");
  const ArchitectureSpec& qwen3_moe = *FindArchitecture("Qwen3MoeForCausalLM");
  EXPECT_TRUE(qwen3_moe.features.qk_norm && qwen3_moe.features.moe);
  EXPECT_FALSE(qwen3_moe.features.moe_norm_topk_default);
  EXPECT_EQ(WeightOf(qwen3_moe, WeightRole::kRouter).name, "model.layers.{L}.mlp.gate.weight");
  // The fusing backends' dense matrices leave the experts out.
  for (const FusedMatrix& f : LayerLinearMatrices(qwen3_moe)) {
    for (const WeightSpec* w : f.members) EXPECT_FALSE(w->per_expert) << w->name;
  }
}

// Both backends run every feature of the hf-arch folders.
TEST(ArchitectureTest, BothBackendsRunEveryFolder) {
  for (const char* folder :
       {"qwen2", "qwen3", "phi3", "llama31", "mistral_sw16", "gemma3", "mixtral", "qwen3_moe"}) {
    const ModelConfig c =
        ModelConfig::Load((test::SharedDir() / "models/hf-arch" / folder).string());
    RequireBackendSupport(c, kCpuBackendSupport);
    RequireBackendSupport(c, kCudaBackendSupport);
  }
}

// Every config `llm make-model` ships parses, and the mixture-of-experts ones have the Hub
// checkpoints' experts: Mixtral-8x7B 2 of 8 (46.7B parameters), Qwen3-30B-A3B 8 of 128 (30.5B,
// 3.3B active).
TEST(ArchitectureTest, ShippedConfigsParseWithTheirExperts) {
  std::map<std::string, ModelConfig> configs;
  for (const auto& entry :
       std::filesystem::directory_iterator(test::SourceDir() / "engine/configs")) {
    const std::string path = entry.path().string();
    configs[entry.path().stem().string()] =
        ModelConfig::FromJson(nlohmann::json::parse(test::ReadFile(path)), path);
  }
  ASSERT_TRUE(configs.contains("mixtral-8x7b") && configs.contains("qwen3-30b-a3b"));
  auto params = [](const ModelConfig& c, bool active) {
    int64_t n = 0;
    for (const TensorSpec& t : ExpectedTensors(c)) {
      if (active && t.expert >= c.num_experts_per_tok) continue;
      int64_t size = 1;
      for (int64_t d : t.shape) size *= d;
      n += size;
    }
    return n;
  };
  const ModelConfig& mixtral = configs["mixtral-8x7b"];
  EXPECT_EQ(mixtral.num_experts, 8);
  EXPECT_EQ(mixtral.moe_intermediate_size, 14336);
  EXPECT_TRUE(mixtral.norm_topk_prob);
  EXPECT_NEAR(double(params(mixtral, false)), 46.70e9, 0.01e9);
  const ModelConfig& qwen = configs["qwen3-30b-a3b"];
  EXPECT_EQ(qwen.num_experts, 128);
  EXPECT_EQ(qwen.num_experts_per_tok, 8);
  EXPECT_EQ(qwen.moe_intermediate_size, 768);
  EXPECT_NEAR(double(params(qwen, false)), 30.53e9, 0.01e9);
  EXPECT_NEAR(double(params(qwen, true)), 3.35e9, 0.01e9);
  for (const auto& [name, c] : configs)
    EXPECT_EQ(c.num_experts > 0, ArchitectureOf(c).features.moe) << name;
}

}  // namespace
}  // namespace llm
