// CPU ops against direct float64 formulas.
#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace llm::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(RmsNorm, MatchesFormula) {
  const int64_t t = 3, h = 37;
  auto x = Random(t * h, 1), w = Random(h, 2);
  std::vector<float> out(x.size());
  RmsNorm(x.data(), w.data(), out.data(), t, h, 1e-5f);
  for (int64_t i = 0; i < t; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += double(x[i * h + j]) * x[i * h + j];
    const double inv = 1 / std::sqrt(ss / h + 1e-5);
    for (int64_t j = 0; j < h; ++j) {
      EXPECT_NEAR(out[i * h + j], w[j] * x[i * h + j] * inv, 1e-5);
    }
  }
}

TEST(SiluMul, MatchesFormula) {
  auto g = Random(100, 3), u = Random(100, 4);
  std::vector<float> out(100);
  SiluMul(g.data(), u.data(), out.data(), 100);
  for (int i = 0; i < 100; ++i) {
    EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-6);
  }
}

TEST(Rope, RotatesHalvesAndPreservesNorm) {
  const int64_t tokens = 4, heads = 2, dim = 8;
  auto x = Random(tokens * heads * dim, 5);
  auto orig = x;
  const int32_t pos[] = {0, 1, 7, 300};
  std::vector<float> inv_freq(dim / 2);
  for (int i = 0; i < dim / 2; ++i) inv_freq[i] = float(1 / std::pow(10000.0, 2.0 * i / dim));
  ApplyRope(x.data(), tokens, heads, dim, pos, inv_freq.data());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = orig.data() + (t * heads + h) * dim;
      const float* b = x.data() + (t * heads + h) * dim;
      for (int i = 0; i < dim / 2; ++i) {
        const double ang = double(pos[t]) * inv_freq[i];
        EXPECT_NEAR(b[i], a[i] * std::cos(ang) - a[i + dim / 2] * std::sin(ang), 1e-4);
        EXPECT_NEAR(b[i + dim / 2], a[i + dim / 2] * std::cos(ang) + a[i] * std::sin(ang), 1e-4);
      }
    }
  }
  // position 0 is the identity
  for (int i = 0; i < heads * dim; ++i) EXPECT_FLOAT_EQ(x[i], orig[i]);
}

// Plain attention against a float64 evaluation of softmax(q kᵀ / sqrt(d)) v with the causal
// mask, grouped-query heads and a context offset (chunked prefill).
TEST(AttentionPlain, MatchesFloat64Reference) {
  const int64_t heads = 8, kv_heads = 2, dim = 16, start = 5, tokens = 6;
  const int64_t total = start + tokens;
  auto q = Random(tokens * heads * dim, 6);
  auto k = Random(total * kv_heads * dim, 7), v = Random(total * kv_heads * dim, 8);
  std::vector<float> out(q.size(), std::nanf(""));
  AttentionPlain(q.data(), k.data(), v.data(), out.data(), tokens, start, heads, kv_heads, dim);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / (heads / kv_heads);
      const int64_t n = start + t + 1;
      std::vector<double> s(n);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < dim; ++d)
          dot += double(q[(t * heads + h) * dim + d]) * k[(j * kv_heads + kvh) * dim + d];
        s[j] = dot / std::sqrt(double(dim));
        mx = std::max(mx, s[j]);
      }
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t d = 0; d < dim; ++d) {
        double o = 0;
        for (int64_t j = 0; j < n; ++j) o += s[j] / sum * v[(j * kv_heads + kvh) * dim + d];
        EXPECT_NEAR(out[(t * heads + h) * dim + d], o, 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace llm::cpu
