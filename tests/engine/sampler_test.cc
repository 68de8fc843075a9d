#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "engine/error.h"

namespace llm {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};

TEST(Sampler, GreedyPicksFirstMaximum) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.Sample(kLogits), 1);  // ties -> lowest id, as torch.argmax
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 5.0;
  p.top_k = 1;
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.Sample(kLogits), 1);
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 1234;
  Sampler a(p), b(p);
  std::vector<int> xa, xb;
  for (int i = 0; i < 200; ++i) {
    xa.push_back(a.Sample(kLogits));
    xb.push_back(b.Sample(kLogits));
  }
  EXPECT_EQ(xa, xb);
  p.seed = 1235;
  Sampler c(p);
  std::vector<int> xc;
  for (int i = 0; i < 200; ++i) xc.push_back(c.Sample(kLogits));
  EXPECT_NE(xa, xc);
}

// Empirical frequencies follow softmax(logits / T).
TEST(Sampler, TemperatureDistribution) {
  SamplingParams p;
  p.temperature = 0.7;
  p.seed = 99;
  Sampler s(p);
  const int n = 200000;
  std::map<int, int> counts;
  for (int i = 0; i < n; ++i) counts[s.Sample(kLogits)]++;
  double z = 0;
  for (float l : kLogits) z += std::exp(l / 0.7);
  for (size_t i = 0; i < kLogits.size(); ++i) {
    const double expected = std::exp(kLogits[i] / 0.7) / z;
    EXPECT_NEAR(counts[int(i)] / double(n), expected, 0.006) << "token " << i;
  }
}

// top-p keeps the smallest set reaching the mass: tokens 1 and 3 (equal logits, 2 highest).
TEST(Sampler, TopPCutsTheTail) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.6;
  p.seed = 5;
  Sampler s(p);
  std::map<int, int> counts;
  for (int i = 0; i < 5000; ++i) counts[s.Sample(kLogits)]++;
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[3], 0);
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
}

TEST(Sampler, TopKRestricts) {
  SamplingParams p;
  p.temperature = 2.0;
  p.top_k = 3;
  p.seed = 8;
  Sampler s(p);
  for (int i = 0; i < 2000; ++i) {
    const int id = s.Sample(kLogits);
    EXPECT_TRUE(id == 1 || id == 2 || id == 3) << id;
  }
}

TEST(Sampler, InvalidParametersAreRejected) {
  SamplingParams p;
  p.top_p = 0.0;
  EXPECT_NE(p.Validate().find("top_p"), std::string::npos);
  EXPECT_THROW(Sampler{p}, Error);
  p.top_p = 1.0;
  p.temperature = -1;
  EXPECT_NE(p.Validate().find("temperature"), std::string::npos);
  p.temperature = std::nan("");
  EXPECT_FALSE(p.Validate().empty());
}

}  // namespace
}  // namespace llm
