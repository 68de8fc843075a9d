// The architecture registry: one table of the decoder architectures this engine serves, as
// vLLM's model registry is (models/registry.py). Each spec names the Hugging Face classes it
// accepts (several may share one spec, as Mistral's shares Llama's), its feature fields, and one
// weight list of {role, HF name, shape, fused slot, tensor-parallel split} that config validation
// (ExpectedTensors), `llm make-model`, both backends' loaders, the CUDA backend's dummy
// weights and the tensor-parallel split all iterate. Nothing else in the engine spells an
// architecture's class name.
//
// Adding an architecture is: a table entry in architecture.cc, the hooks its features gate in
// each backend's layer skeleton (engine/cpu/cpu_model.cc, engine/cuda/), its tests. A feature
// that a backend does not implement is refused by RequireBackendSupport, for both backends in
// the same words, before any weight is read.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llm {

struct ModelConfig;

// What a tensor is for, whatever the checkpoint calls it.
enum class WeightRole {
  kEmbed,              // [vocab, hidden]
  kLmHead,             // [vocab, hidden]; absent when tied to kEmbed
  kFinalNorm,          // [hidden]
  kInputNorm,          // per layer [hidden], before attention
  kPostAttentionNorm,  // per layer [hidden], before the MLP
  kQProj,              // per layer [q_dim, hidden]
  kKProj,              // per layer [kv_dim, hidden]
  kVProj,              // per layer [kv_dim, hidden]
  kOProj,              // per layer [hidden, q_dim]
  kGateProj,           // per layer [intermediate, hidden]
  kUpProj,             // per layer [intermediate, hidden]
  kDownProj,           // per layer [hidden, intermediate]
  // Beyond the Llama skeleton (each gated by an ArchitectureFeatures field):
  kQBias,           // per layer [q_dim]  (attention_bias: Qwen2)
  kKBias,           // per layer [kv_dim]
  kVBias,           // per layer [kv_dim]
  kQNorm,           // per layer [head_dim], RMSNorm of each query head (qk_norm: Qwen3, Gemma 3)
  kKNorm,           // per layer [head_dim]
  kAttnOutputNorm,  // per layer [hidden], of the attention output (sandwich_norms: Gemma 3)
  kMlpOutputNorm,   // per layer [hidden], of the MLP output
  kQkvProj,         // per layer [q_dim + 2 kv_dim, hidden]: q|k|v packed in one tensor (Phi-3)
  kGateUpProj,      // per layer [2 intermediate, hidden]: gate|up packed (Phi-3)
  // Mixture-of-experts layers (ArchitectureFeatures::moe; LayerScope::kMoe):
  kRouter,      // per layer [num_experts, hidden]: the router's logits (Mixtral's `gate`)
  kExpertGate,  // per layer and expert [moe_intermediate, hidden] (Mixtral's w1)
  kExpertUp,    // per layer and expert [moe_intermediate, hidden] (w3)
  kExpertDown,  // per layer and expert [hidden, moe_intermediate] (w2)
};

// A dimension of a weight's shape, resolved against a config (WeightShape).
enum class Dim {
  kNone,
  kHidden,
  kVocab,
  kQDim,
  kKvDim,
  kIntermediate,
  kHeadDim,
  kQkvDim,     // q_dim + 2 kv_dim
  kGateUpDim,  // 2 intermediate
  kNumExperts,
  kMoeIntermediate,  // an expert's MLP width (moe_intermediate_size; Mixtral: intermediate_size)
};

// The matrix a linear weight lands in on the backends that fuse them (the CUDA backend runs
// q|k|v and gate|up as one GEMM each): members of one slot are stacked by rows in the
// order of the weight list.
enum class FusedSlot { kNone, kQkv, kGateUp };

// Which part of a weight a tensor-parallel rank holds (engine/model/tensor_parallel.h).
enum class TpSplit {
  kReplicated,
  kQHeadRows,         // rows by query heads (q_proj)
  kKvHeadRows,        // rows by KV heads (k_proj, v_proj)
  kQHeadCols,         // columns by query heads (o_proj)
  kIntermediateRows,  // rows by MLP features (gate_proj, up_proj)
  kIntermediateCols,  // columns by MLP features (down_proj)
  kExpertRows,        // each expert's rows by its features (experts' gate_proj, up_proj)
  kExpertCols,        // each expert's columns by its features (experts' down_proj)
};

// Which layers of a mixture-of-experts model hold a per-layer weight
// (ModelConfig::IsMoeLayer): Qwen3-MoE's mlp_only_layers keep a dense MLP.
enum class LayerScope { kEvery, kDense, kMoe };

struct WeightSpec {
  WeightRole role;
  std::string_view name;  // Hugging Face name; "{L}" stands for the layer index, "{E}" the expert
  bool per_layer;
  Dim rows, cols;  // cols == kNone: a vector of `rows` elements
  FusedSlot fused;
  TpSplit tp;
  bool is_linear;  // a projection: quantized by --quantization fp8, run as a GEMM
  LayerScope scope = LayerScope::kEvery;
  bool per_expert = false;  // one tensor per expert ("{E}" in the name)
};

enum class NormStyle {
  kRmsNorm,        // x / rms(x) · w
  kRmsNormOffset,  // x / rms(x) · (1 + w)  (Gemma: the checkpoint stores w; loaders add 1)
};
enum class MlpKind {
  kSwiGlu,     // down(silu(gate(x)) · up(x))
  kGeGluTanh,  // down(gelu_tanh(gate(x)) · up(x))  (Gemma: hidden_activation gelu_pytorch_tanh)
};
// The config.json activation an MLP kind computes ("silu", "gelu_pytorch_tanh").
std::string_view ActivationName(MlpKind mlp);

// What distinguishes one architecture's forward from another's; the backends gate their
// hooks on them (and RequireBackendSupport refuses those a backend lacks).
struct ArchitectureFeatures {
  bool attention_bias = false;  // q/k/v projections carry biases (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
  NormStyle norm = NormStyle::kRmsNorm;
  MlpKind mlp = MlpKind::kSwiGlu;
  // Gemma 3: the attention and MLP outputs are normalized before the residual add
  // (kAttnOutputNorm, kMlpOutputNorm); kPostAttentionNorm is then its pre_feedforward norm.
  bool sandwich_norms = false;
  bool scale_embeddings = false;    // embeddings × sqrt(hidden) (Gemma)
  bool packed_projections = false;  // q|k|v and gate|up stored packed (kQkvProj, kGateUpProj)
  // Mixture of experts (Mixtral, Qwen3-MoE): the MLP of ModelConfig::IsMoeLayer layers is a
  // router choosing num_experts_per_tok of num_experts SwiGLU experts per token (softmax over
  // all router logits, the top k, renormalized to sum 1 when norm_topk_prob), their outputs
  // summed with those weights.
  bool moe = false;
  bool moe_norm_topk_default = false;  // norm_topk_prob when config.json has none (Mixtral: on)
};

struct ArchitectureSpec {
  std::string_view name;  // ours, for logs: "llama"
  struct HfClass {
    std::string_view architecture;  // config.json "architectures"[0]
    std::string_view model_type;    // config.json "model_type"
  };
  std::vector<HfClass> hf_classes;
  ArchitectureFeatures features;
  // The weights in checkpoint order: global ones (embeddings) first, one layer's, then the
  // global ones after the layers (final norm, lm_head).
  std::vector<WeightSpec> weights;
};

// Every registered architecture, in the order of the table.
std::span<const ArchitectureSpec> Architectures();

// The spec that accepts this "architectures" class name or model_type; nullptr when none does.
const ArchitectureSpec* FindArchitecture(std::string_view hf_class);
const ArchitectureSpec* FindArchitectureByModelType(std::string_view model_type);
// The accepted class names / model_types, comma-separated (for error messages).
std::string SupportedArchitectures();
std::string SupportedModelTypes();
// The registered class of `model_type`, and the model_type of a registered class ("" if none).
std::string_view ArchitectureForModelType(std::string_view model_type);
std::string_view ModelTypeOf(std::string_view hf_class);

// The spec of a parsed config (ModelConfig::FromJson accepted only registered classes).
const ArchitectureSpec& ArchitectureOf(const ModelConfig& config);

// One weight's Hugging Face name and shape under a config: [rows, cols], or [rows].
std::string WeightName(const WeightSpec& w, int64_t layer, int64_t expert = -1);
std::vector<int64_t> WeightShape(const WeightSpec& w, const ModelConfig& config);
int64_t DimSize(Dim d, const ModelConfig& config);
// Whether layer `layer` of `config` holds the per-layer weight `w` (its LayerScope).
bool LayerHolds(const WeightSpec& w, const ModelConfig& config, int64_t layer);
// q/k/v biases (every other vector weight is a norm).
inline bool IsBias(WeightRole role) {
  return role == WeightRole::kQBias || role == WeightRole::kKBias || role == WeightRole::kVBias;
}

// The spec's entry for `role` (every spec has the global roles of the Llama skeleton); the
// second form is nullptr when the spec has none.
const WeightSpec& WeightOf(const ArchitectureSpec& spec, WeightRole role);
const WeightSpec* FindWeight(const ArchitectureSpec& spec, WeightRole role);

// The tensors a checkpoint of this config must contain, with their shapes (lm_head only when
// not tied), in the registry's order: the leading globals, layer by layer, the other globals.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  const WeightSpec* weight = nullptr;
  int64_t layer = -1;   // -1 for the global weights
  int64_t expert = -1;  // per-expert weights: the expert's index
};
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// A fused matrix of one layer: its members, stacked by rows in this order (a member's first
// row is the sum of the rows the members before it hold on this rank).
struct FusedMatrix {
  FusedSlot slot = FusedSlot::kNone;
  std::vector<const WeightSpec*> members;
};
// The per-layer linear weights grouped as the fusing backends hold them, in load order:
// each fused slot once (at its first member), each unfused linear weight alone. Experts'
// weights are not among them.
std::vector<FusedMatrix> LayerLinearMatrices(const ArchitectureSpec& spec);

// What a backend implements beyond the Llama skeleton. RequireBackendSupport throws
// llm::Error naming the config field (or the architecture's feature) that `backend` cannot
// run, in the same words for every backend.
struct BackendSupport {
  std::string_view backend;  // "cpu", "cuda"
  bool sliding_window = false;
  bool attention_bias = false;
  bool qk_norm = false;
  bool gemma = false;   // (1 + w) norms, GeGLU, sandwich norms, scaled embeddings
  bool packed = false;  // packed q|k|v and gate|up tensors
  bool moe = false;     // mixture-of-experts layers
};
inline constexpr BackendSupport kCpuBackendSupport{"cpu", true, true, true, true, true, true};
inline constexpr BackendSupport kCudaBackendSupport{"cuda", true, true, true, true, true, true};
void RequireBackendSupport(const ModelConfig& config, const BackendSupport& backend);
void RequireBackendSupport(const ModelConfig& config, const ArchitectureSpec& spec,
                           const BackendSupport& backend);

}  // namespace llm
