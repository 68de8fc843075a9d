#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace llm::cpu {

void MoeRoute(const float* logits, int64_t num_tokens, int64_t num_experts, int64_t k,
              bool normalize, int32_t* experts, float* weights) {
  std::vector<float> probs(static_cast<size_t>(num_experts));
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits + t * num_experts;
    float max_v = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < num_experts; ++e) max_v = std::max(max_v, row[e]);
    float sum = 0.f;
    for (int64_t e = 0; e < num_experts; ++e) {
      probs[size_t(e)] = std::exp(row[e] - max_v);
      sum += probs[size_t(e)];
    }
    for (float& p : probs) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return probs[size_t(a)] > probs[size_t(b)]; });
    float chosen = 0.f;
    for (int64_t j = 0; j < k; ++j) chosen += probs[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[size_t(j)];
      experts[t * k + j] = e;
      weights[t * k + j] = normalize ? probs[size_t(e)] / chosen : probs[size_t(e)];
    }
  }
}

ExpertGroups GroupByExpert(const int32_t* experts, const float* weights, int64_t num_tokens,
                           int64_t k, int64_t num_experts) {
  ExpertGroups g;
  g.offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  const int64_t n = num_tokens * k;
  for (int64_t i = 0; i < n; ++i) ++g.offsets[size_t(experts[i]) + 1];
  for (int64_t e = 0; e < num_experts; ++e) g.offsets[size_t(e + 1)] += g.offsets[size_t(e)];
  g.tokens.resize(static_cast<size_t>(n));
  g.weights.resize(static_cast<size_t>(n));
  std::vector<int64_t> next(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) {  // in token order, so each group is too
    const int64_t at = next[size_t(experts[i])]++;
    g.tokens[size_t(at)] = static_cast<int32_t>(i / k);
    g.weights[size_t(at)] = weights[i];
  }
  return g;
}

}  // namespace llm::cpu
