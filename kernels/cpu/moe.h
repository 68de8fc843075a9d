// Mixture-of-experts routing on the CPU (Mixtral, Qwen3-MoE), as transformers computes it:
// the reference the CUDA router is tested against.
#pragma once

#include <cstdint>
#include <vector>

namespace llm::cpu {

// Per token: softmax over its router logits in fp32, the k most probable experts (equal
// probabilities: the lower expert index first, as a stable sort orders them), and their
// probabilities, divided by their sum when `normalize` (norm_topk_prob).
//   logits: [num_tokens, num_experts]; experts, weights: [num_tokens, k], most probable first
void MoeRoute(const float* logits, int64_t num_tokens, int64_t num_experts, int64_t k,
              bool normalize, int32_t* experts, float* weights);

// The routed (token, weight) pairs grouped by expert: expert e's pairs are
// [offsets[e], offsets[e + 1]) of tokens / weights, in token order. This is the permutation
// that lets each expert run one GEMM over all of its tokens.
struct ExpertGroups {
  std::vector<int64_t> offsets;  // [num_experts + 1]
  std::vector<int32_t> tokens;   // [num_tokens · k]
  std::vector<float> weights;    // [num_tokens · k]
};
ExpertGroups GroupByExpert(const int32_t* experts, const float* weights, int64_t num_tokens,
                           int64_t k, int64_t num_experts);

}  // namespace llm::cpu
