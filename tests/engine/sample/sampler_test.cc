#include "engine/sample/sampler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/error.h"
#include "tests/test_util.h"

namespace llm {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};

TEST(Sampler, GreedyPicksFirstMaximum) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.Sample(kLogits).token, 1);  // ties -> lowest id, as torch.argmax
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 5.0;
  p.top_k = 1;
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.Sample(kLogits).token, 1);
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 1234;
  Sampler a(p), b(p);
  std::vector<int> xa, xb;
  for (int i = 0; i < 200; ++i) {
    xa.push_back(a.Sample(kLogits).token);
    xb.push_back(b.Sample(kLogits).token);
  }
  EXPECT_EQ(xa, xb);
  p.seed = 1235;
  Sampler c(p);
  std::vector<int> xc;
  for (int i = 0; i < 200; ++i) xc.push_back(c.Sample(kLogits).token);
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
  for (int i = 0; i < n; ++i) counts[s.Sample(kLogits).token]++;
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
  for (int i = 0; i < 5000; ++i) counts[s.Sample(kLogits).token]++;
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
    const int id = s.Sample(kLogits).token;
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

// ---- logit bias and penalties (steps 1-3), checked on the processed logits ----------

TEST(Sampler, LogitBiasForcesAToken) {
  SamplingParams p;
  p.seed = 1;
  p.logit_bias = {{4, 100.0f}};
  Sampler s(p);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(s.Sample(kLogits).token, 4);
  p.temperature = 0;
  EXPECT_EQ(Sampler(p).Sample(kLogits).token, 4);
}

TEST(Sampler, LogitBiasBansTokens) {
  SamplingParams p;
  p.seed = 2;
  p.logit_bias = {{1, -100.0f}, {3, -100.0f}};
  Sampler s(p);
  std::map<int, int> counts;
  for (int i = 0; i < 5000; ++i) counts[s.Sample(kLogits).token]++;
  EXPECT_EQ(counts[1] + counts[3], 0);
  EXPECT_GT(counts[2], 0);
  p.temperature = 0;
  EXPECT_EQ(Sampler(p).Sample(kLogits).token, 2);
}

// Greedy ties after the bias still go to the lowest id.
TEST(Sampler, GreedyTieAfterBiasGoesToLowestId) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{0, 2.0f}};  // token 0: 1 + 2 = 3, tied with tokens 1 and 3
  EXPECT_EQ(Sampler(p).Sample(kLogits).token, 0);
  p.logit_bias = {{1, -0.5f}};  // token 3 alone at the top
  EXPECT_EQ(Sampler(p).Sample(kLogits).token, 3);
}

// HF/vLLM: seen (prompt or output) logits > 0 are divided by r, others multiplied.
TEST(Sampler, RepetitionPenaltyOnPromptAndOutput) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  const int prompt[] = {0, 4, 0};
  Sampler s(p, prompt);
  s.Observe(2);
  EXPECT_EQ(s.ProcessedLogits(kLogits), (std::vector<float>{0.5f, 3.0f, 1.0f, 3.0f, -2.0f}));
}

// OpenAI: output tokens only, logit -= presence * [count > 0] + frequency * count.
TEST(Sampler, PresenceAndFrequencyPenaltiesOnOutputOnly) {
  SamplingParams p;
  p.presence_penalty = 0.5;
  p.frequency_penalty = 0.25;
  const int prompt[] = {1};
  Sampler s(p, prompt);
  for (int id : {2, 2, 3}) s.Observe(id);
  const std::vector<float> got = s.ProcessedLogits(kLogits);
  const std::vector<float> want = {1.0f, 3.0f, 2.0f - 0.5f - 0.5f, 3.0f - 0.5f - 0.25f, -1.0f};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
}

// Order: bias, then repetition, then presence/frequency.
TEST(Sampler, BiasThenRepetitionThenPresence) {
  SamplingParams p;
  p.logit_bias = {{0, 1.0f}};
  p.repetition_penalty = 2.0;
  p.presence_penalty = 1.0;
  const int prompt[] = {0};
  Sampler s(p, prompt);
  s.Observe(4);
  const std::vector<float> got = s.ProcessedLogits(kLogits);
  EXPECT_FLOAT_EQ(got[0], (1.0f + 1.0f) / 2.0f);  // not 1 / 2 + 1
  EXPECT_FLOAT_EQ(got[4], -1.0f * 2.0f - 1.0f);   // not (-1 - 1) * 2
  EXPECT_FLOAT_EQ(got[1], 3.0f);
}

// Sample records its own token: a strong frequency penalty makes greedy alternate.
TEST(Sampler, SampleRecordsItsTokenForPenalties) {
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 2.0;
  Sampler s(p);
  const std::vector<float> logits = {1.0f, 1.5f};
  std::vector<int> got;
  for (int i = 0; i < 4; ++i) got.push_back(s.Sample(logits).token);
  EXPECT_EQ(got, (std::vector<int>{1, 0, 1, 0}));
}

// Frequencies follow softmax of the hand-computed processed logits.
TEST(Sampler, PenalizedDistributionMatchesHandComputed) {
  SamplingParams p;
  p.seed = 11;
  p.repetition_penalty = 1.5;
  const int prompt[] = {1, 3, 4};  // 3 -> 2, 3 -> 2, -1 -> -1.5
  const std::vector<float> want = {1.0f, 2.0f, 2.0f, 2.0f, -1.5f};
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    Sampler s(p, prompt, static_cast<uint64_t>(i));  // fresh: no output tokens yet
    counts[s.Sample(kLogits).token]++;
  }
  double z = 0;
  for (float l : want) z += std::exp(l);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(counts[int(i)] / double(n), std::exp(want[i]) / z, 0.01) << "token " << i;
  }
}

// ---- min-p, top-p over a large candidate set ------------------------------------------

TEST(Sampler, MinPCutsRelativeToTheMaximum) {
  SamplingParams p;
  p.seed = 21;
  p.min_p = 0.15;
  // Probabilities relative to the maximum: 1, 0.5, 0.09, 0.2, 0.01.
  const std::vector<float> logits = {0.0f, std::log(0.5f), std::log(0.09f), std::log(0.2f),
                                     std::log(0.01f)};
  Sampler s(p);
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) counts[s.Sample(logits).token]++;
  EXPECT_EQ(counts[2] + counts[4], 0);
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 1.7, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 0.5 / 1.7, 0.01);
  EXPECT_NEAR(counts[3] / double(n), 0.2 / 1.7, 0.01);
}

// 1000 equal logits, top_p 0.5: the nucleus is ids 0..499 (ties by id), found past the
// sorted head of 256 by the quickselect.
TEST(Sampler, TopPOverManyEqualTokens) {
  SamplingParams p;
  p.seed = 31;
  p.top_p = 0.5;
  const std::vector<float> logits(1000, 0.25f);
  Sampler s(p);
  std::set<int> seen;
  for (int i = 0; i < 20000; ++i) {
    const int id = s.Sample(logits).token;
    ASSERT_LT(id, 500);
    seen.insert(id);
  }
  EXPECT_GT(seen.size(), 490u);
}

// A flat distribution over 2000 tokens: the nucleus (about 1000 tokens) is found by the
// quickselect; it must equal the prefix of a full sort.
TEST(Sampler, TopPMatchesAFullSortReference) {
  std::mt19937 gen(4);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> logits(2000);
  for (float& l : logits) l = normal(gen);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double total = 0;
  for (float l : logits) total += std::exp(double(l));
  std::set<int> nucleus;
  double mass = 0;
  for (int id : order) {
    nucleus.insert(id);
    mass += std::exp(double(logits[id]));
    if (mass >= 0.5 * total) break;
  }
  ASSERT_GT(nucleus.size(), 600u);
  SamplingParams p;
  p.seed = 12;
  p.top_p = 0.5;
  Sampler s(p);
  std::set<int> seen;
  for (int i = 0; i < 30000; ++i) {
    const int id = s.Sample(logits).token;
    ASSERT_TRUE(nucleus.count(id)) << id;
    seen.insert(id);
  }
  EXPECT_GT(seen.size(), nucleus.size() * 9 / 10);
}

// Top-p before min-p. Relative probabilities 1, 0.5, 0.3: top_p 0.6 keeps {0, 1}, then
// min_p 0.4 keeps both. (min-p first would keep {0, 1}, renormalize, and top-p would keep {0}.)
TEST(Sampler, TopPBeforeMinP) {
  SamplingParams p;
  p.seed = 13;
  p.top_p = 0.6;
  p.min_p = 0.4;
  const std::vector<float> logits = {0.0f, std::log(0.5f), std::log(0.3f)};
  Sampler s(p);
  std::map<int, int> counts;
  for (int i = 0; i < 3000; ++i) counts[s.Sample(logits).token]++;
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(counts[1] / 3000.0, 1.0 / 3.0, 0.04);
}

// ---- logprobs -----------------------------------------------------------------------

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(100);
  for (float& l : logits) l = normal(gen);
  logits[10] = logits[20] = logits[30] = 20.0f;  // a three-way tie at the top
  SamplingParams p;
  p.seed = 3;
  p.temperature = 0.5;  // processing must not leak into the logprobs
  p.logit_bias = {{50, 5.0f}};
  p.logprobs = 5;
  Sampler s(p);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  auto ref = [&](int id) { return std::log(std::exp(double(logits[id])) / z); };
  for (int step = 0; step < 20; ++step) {
    const SampleResult r = s.Sample(logits);
    ASSERT_TRUE(r.logprob.has_value());
    EXPECT_NEAR(*r.logprob, ref(r.token), 1e-5);
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    EXPECT_EQ(r.top_logprobs[0].token, 10);
    EXPECT_EQ(r.top_logprobs[1].token, 20);
    EXPECT_EQ(r.top_logprobs[2].token, 30);
    for (size_t i = 0; i < r.top_logprobs.size(); ++i) {
      EXPECT_NEAR(r.top_logprobs[i].logprob, ref(r.top_logprobs[i].token), 1e-5);
      if (i > 0) {
        EXPECT_LE(r.top_logprobs[i].logprob, r.top_logprobs[i - 1].logprob);
      }
    }
  }
}

TEST(Sampler, LogprobsZeroAndUnset) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 0;
  const SampleResult r = Sampler(p).Sample(kLogits);
  ASSERT_TRUE(r.logprob.has_value());
  EXPECT_TRUE(r.top_logprobs.empty());
  p.logprobs.reset();
  EXPECT_FALSE(Sampler(p).Sample(kLogits).logprob.has_value());
}

// ---- seeds --------------------------------------------------------------------------

std::vector<int> Draw(Sampler& s, int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(s.Sample(kLogits).token);
  return out;
}

TEST(Sampler, SeedOffsetGivesReproducibleDistinctStreams) {
  SamplingParams p;
  p.seed = 42;
  Sampler a0(p, {}, 0), b0(p, {}, 0), a1(p, {}, 1), b1(p, {}, 1);
  const std::vector<int> x0 = Draw(a0, 200), x1 = Draw(a1, 200);
  EXPECT_EQ(x0, Draw(b0, 200));
  EXPECT_EQ(x1, Draw(b1, 200));
  EXPECT_NE(x0, x1);
}

// A seeded sequence gives the same tokens alone or interleaved with other sequences.
TEST(Sampler, SeededSequenceIsIndependentOfTheBatch) {
  SamplingParams p;
  p.seed = 77;
  Sampler alone(p);
  const std::vector<int> want = Draw(alone, 100);
  SamplingParams other;
  other.seed = 5;
  Sampler mine(p), neighbour(other), unseeded(SamplingParams{});
  std::vector<int> got;
  for (int i = 0; i < 100; ++i) {
    neighbour.Sample(kLogits);
    got.push_back(mine.Sample(kLogits).token);
    unseeded.Sample(kLogits);
  }
  EXPECT_EQ(got, want);
}

// ---- validation ---------------------------------------------------------------------

TEST(Sampler, ValidateNamesEveryBadParameter) {
  const std::vector<std::pair<std::function<void(SamplingParams&)>, std::string>> cases = {
      {[](SamplingParams& p) { p.temperature = -0.5; },
       "temperature must be a finite number >= 0, got -0.5"},
      {[](SamplingParams& p) { p.temperature = INFINITY; },
       "temperature must be a finite number >= 0, got inf"},
      {[](SamplingParams& p) { p.top_k = -2; }, "top_k must be -1 or 0 (no limit) or >= 1, got -2"},
      {[](SamplingParams& p) { p.top_p = 1.5; }, "top_p must be in (0, 1], got 1.5"},
      {[](SamplingParams& p) { p.top_p = 0; }, "top_p must be in (0, 1], got 0"},
      {[](SamplingParams& p) { p.min_p = 1.25; }, "min_p must be in [0, 1], got 1.25"},
      {[](SamplingParams& p) { p.repetition_penalty = 0; },
       "repetition_penalty must be a finite number > 0, got 0"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5; },
       "presence_penalty must be in [-2, 2], got 2.5"},
      {[](SamplingParams& p) { p.frequency_penalty = -3; },
       "frequency_penalty must be in [-2, 2], got -3"},
      {[](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens must be >= 1, got 0"},
      {[](SamplingParams& p) { p.logprobs = 21; }, "logprobs must be between 0 and 20, got 21"},
      {[](SamplingParams& p) { p.logprobs = -1; }, "logprobs must be between 0 and 20, got -1"},
      {[](SamplingParams& p) { p.n = 0; }, "n must be between 1 and 16, got 0"},
      {[](SamplingParams& p) { p.n = 17; }, "n must be between 1 and 16, got 17"},
      {[](SamplingParams& p) {
         p.logit_bias = {{70000, 1.0f}};
       },
       "logit_bias token id 70000 is outside the vocabulary [0, 32000)"},
      {[](SamplingParams& p) {
         p.logit_bias = {{-1, 1.0f}};
       },
       "logit_bias token id -1 is outside the vocabulary [0, 32000)"},
      {[](SamplingParams& p) {
         p.logit_bias = {{5, 101.0f}};
       },
       "logit_bias for token 5 must be in [-100, 100], got 101"},
      {[](SamplingParams& p) {
         p.stop_token_ids = {2, 32000};
       },
       "stop_token_ids token id 32000 is outside the vocabulary [0, 32000)"},
      {[](SamplingParams& p) { p.stop.assign(17, "x"); },
       "stop may hold at most 16 strings, got 17"},
      {[](SamplingParams& p) {
         p.stop = {"a", ""};
       },
       "stop[1] must not be empty"},
  };
  for (const auto& [mutate, message] : cases) {
    SamplingParams p;
    mutate(p);
    EXPECT_EQ(p.Validate(32000), message);
  }
  SamplingParams ok;
  ok.top_k = -1;
  ok.logit_bias = {{31999, -100.0f}};
  ok.stop.assign(16, "x");
  ok.logprobs = 20;
  ok.n = 16;
  EXPECT_EQ(ok.Validate(32000), "");
  EXPECT_EQ(ok.Validate(), "");
  ok.logit_bias = {{-3, 0.0f}};
  EXPECT_EQ(ok.Validate(), "logit_bias token id -3 must be >= 0");
}

TEST(Sampler, BadTokenIdsThrowAtSampleTime) {
  SamplingParams p;
  p.logit_bias = {{9, 1.0f}};
  Sampler s(p);
  EXPECT_THROW(s.Sample(kLogits), Error);
  Sampler t(SamplingParams{});
  EXPECT_THROW(t.Observe(-1), Error);
  const std::vector<float> nan_logits = {0.0f, std::nanf("")};
  EXPECT_THROW(t.Sample(nan_logits), Error);
}

// ---- a 128k vocabulary --------------------------------------------------------------

TEST(Sampler, LargeVocabGreedyTopKTopP) {
  const size_t vocab = 128 * 1024;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(gen);
  logits[100000] = 30.0f;
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(Sampler(greedy).Sample(logits).token, 100000);

  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 40, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  const std::set<int> top40(order.begin(), order.begin() + 40);
  logits[100000] = 12.0f;  // leave room for the others
  SamplingParams p;
  p.seed = 9;
  p.top_k = 40;
  p.top_p = 0.9;
  p.logprobs = 5;
  Sampler s(p);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(top40.count(s.Sample(logits).token));
  p.top_k = 0;
  Sampler nucleus(p);
  for (int i = 0; i < 200; ++i) nucleus.Sample(logits);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Speed lives in benchmarks, not in timed unit tests: report it only.
  std::printf("[sampler] 400 samples over a 128k vocabulary in %.3f s\n", seconds);
}

}  // namespace
}  // namespace llm
