// Mixture-of-experts routing on the CPU (kernels/cpu/moe.h) against double-precision formulas,
// and the grouping of routed tokens by expert.
#include "kernels/cpu/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace llm::cpu {
namespace {

TEST(MoeRoute, TopKOfTheSoftmaxRenormalizedOrNot) {
  const int64_t n = 40, experts = 8, k = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<float> logits(size_t(n * experts));
  for (float& x : logits) x = dist(rng);
  for (const bool normalize : {false, true}) {
    std::vector<int32_t> chosen(size_t(n * k));
    std::vector<float> weights(size_t(n * k));
    MoeRoute(logits.data(), n, experts, k, normalize, chosen.data(), weights.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* row = logits.data() + t * experts;
      double z = 0;
      for (int64_t e = 0; e < experts; ++e) z += std::exp(double(row[e]));
      std::vector<int32_t> order(static_cast<size_t>(experts));
      for (int32_t e = 0; e < experts; ++e) order[size_t(e)] = e;
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      const double p0 = std::exp(double(row[order[0]])) / z,
                   p1 = std::exp(double(row[order[1]])) / z;
      const double want0 = normalize ? p0 / (p0 + p1) : p0, want1 = normalize ? p1 / (p0 + p1) : p1;
      EXPECT_EQ(chosen[size_t(t * k)], order[0]) << "token " << t;
      EXPECT_EQ(chosen[size_t(t * k + 1)], order[1]) << "token " << t;
      EXPECT_NEAR(weights[size_t(t * k)], want0, 1e-6) << "token " << t;
      EXPECT_NEAR(weights[size_t(t * k + 1)], want1, 1e-6) << "token " << t;
      if (normalize) {
        EXPECT_NEAR(weights[size_t(t * k)] + weights[size_t(t * k + 1)], 1.0, 1e-6);
      }
    }
  }
}

// Equal logits: the lower expert index wins, whatever the rest of the row holds.
TEST(MoeRoute, TiesGoToTheLowerExpert) {
  const std::vector<float> logits = {0.5f, 2.f, -1.f, 2.f, 2.f, 0.f};
  std::vector<int32_t> chosen(3);
  std::vector<float> weights(3);
  MoeRoute(logits.data(), 1, 6, 3, true, chosen.data(), weights.data());
  EXPECT_EQ(chosen, (std::vector<int32_t>{1, 3, 4}));
  for (float w : weights) EXPECT_FLOAT_EQ(w, 1.f / 3);
}

// Large logits do not overflow the softmax (it subtracts the row's maximum).
TEST(MoeRoute, LargeLogitsStayFinite) {
  const std::vector<float> logits = {1000.f, 999.f, -1000.f, 0.f};
  std::vector<int32_t> chosen(2);
  std::vector<float> weights(2);
  MoeRoute(logits.data(), 1, 4, 2, false, chosen.data(), weights.data());
  EXPECT_EQ(chosen, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(weights[0], 1 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(weights[1], std::exp(-1.0) / (1 + std::exp(-1.0)), 1e-6);
}

TEST(GroupByExpert, EachExpertsTokensInTokenOrder) {
  // 4 tokens, top 2 of 5 experts; expert 2 is chosen by none.
  const std::vector<int32_t> chosen = {3, 0, 0, 4, 3, 1, 0, 3};
  const std::vector<float> weights = {.6f, .4f, .7f, .3f, .9f, .1f, .5f, .5f};
  const ExpertGroups g = GroupByExpert(chosen.data(), weights.data(), 4, 2, 5);
  EXPECT_EQ(g.offsets, (std::vector<int64_t>{0, 3, 4, 4, 7, 8}));
  EXPECT_EQ(g.tokens, (std::vector<int32_t>{0, 1, 3, 2, 0, 2, 3, 1}));
  EXPECT_EQ(g.weights, (std::vector<float>{.4f, .7f, .5f, .1f, .6f, .9f, .5f, .3f}));
}

}  // namespace
}  // namespace llm::cpu
