// The GPU sampler (kernels/cuda/sampling/sampling.cu) against the engine's Sampler
// (engine/sample/sampler.h), label gpu; skips without a GPU.
//  - Greedy: ids exactly equal to Sampler's (ties -> lowest id, ties placed on purpose), over
//    vocabularies from 5 to 256000 (multiples of 4 and not: both copy paths); top_k = 1 is
//    greedy at any temperature.
//  - Logprobs: the sampled token's raw logprob and the top-N (N = 0, 1, 5, 20) ids equal,
//    values within 1e-4; a row of all-equal logits exercises the many-ties fallback.
//  - Penalties / logit_bias as LogitAdjust entries built the way a caller must build them
//    (one entry per token, subtract = float(presence + frequency * count) in double), several
//    rows with different parameters in one batch, two rows sharing a logits row (n > 1): the
//    argmax equals Sampler's token and the argmax of Sampler::ProcessedLogits.
//  - Determinism: the same (seed, offset) gives the same token (across launches and rows),
//    different offsets spread over many tokens.
//  - Filters: with top-k (with a tie at the boundary), top-p (with a tie at the boundary),
//    min-p and combinations, the GPU draws only tokens of the kept set, and over 20000 draws
//    the frequencies match the renormalised probabilities (chi-square with rare tokens pooled,
//    bound mean + 10 sd; deterministic seeds, so the test cannot flake). The kept set is
//    computed here by a direct double-precision transcription of Sampler's steps 5-8 (sort,
//    prefix), which is itself checked against the CPU Sampler's draws. Big-vocabulary variants
//    (all-equal logits: the kept set is the lowest ids) exercise the radix passes and the
//    id-ordered tie cutoffs.
//   ninja -C build sampling_gpu_test && (cd build && ctest -L gpu -R sampling)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "engine/sample/sampler.h"
#include "kernels/cuda/ops/model_ops.h"
#include "tests/kernels/sampling_fixtures.h"

namespace llm::test::sampling {
namespace {

// ---- greedy and logprobs ------------------------------------------------------------------
TEST_F(SamplingGpu, GreedyAndLogprobsMatchSampler) {
  for (int64_t vocab : {5, 1000, 32000, 50257, 128256, 256000}) {
    // Rows: random; a tie at the max between a high and a lower id; the max at the last id.
    const int num_rows = 3;
    std::vector<float> logits;
    for (int r = 0; r < num_rows; ++r) {
      std::vector<float> l = RandomLogits(vocab, uint32_t(vocab + r));
      const int top = Argmax(l);
      if (r == 1 && vocab > 3)
        l[size_t(vocab - 1)] = l[size_t(top)], l[size_t(top / 2)] = l[size_t(top)];
      if (r == 2) l[size_t(vocab - 1)] = l[size_t(top)] + 1.f;
      logits.insert(logits.end(), l.begin(), l.end());
    }
    for (int n : {0, 1, 5, 20}) {
      std::vector<SampleRowParams> params;
      for (int r = 0; r < num_rows; ++r) params.push_back(Greedy(r, n));
      const GpuResult g = RunGpu(logits, vocab, params);
      for (int r = 0; r < num_rows; ++r) {
        std::span<const float> row(logits.data() + r * vocab, size_t(vocab));
        SamplingParams sp;
        sp.temperature = 0;
        sp.logprobs = n;
        Sampler cpu(sp);
        const SampleResult want = cpu.Sample(row);
        const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) +
                                 " N " + std::to_string(n);
        ASSERT_EQ(g.token[r], want.token) << what;
        ASSERT_NEAR(g.logprob[r], *want.logprob, 1e-4) << what;
        const size_t expect_n = std::min<size_t>(size_t(n), size_t(vocab));
        ASSERT_EQ(want.top_logprobs.size(), expect_n);
        for (size_t i = 0; i < size_t(cuda::kMaxTopLogprobs); ++i) {
          const size_t at = size_t(r) * cuda::kMaxTopLogprobs + i;
          if (i < expect_n) {
            ASSERT_EQ(g.top_ids[at], want.top_logprobs[i].token) << what << " top " << i;
            ASSERT_NEAR(g.top_logprobs[at], want.top_logprobs[i].logprob, 1e-4)
                << what << " top " << i;
          } else {
            ASSERT_EQ(g.top_ids[at], -1) << what << " top " << i << " written past N";
          }
        }
      }
    }
  }
}

TEST_F(SamplingGpu, NoLogprobsLeavesOutputsUntouched) {
  const std::vector<float> logits = RandomLogits(1000, 5);
  const GpuResult g = RunGpu(logits, 1000, {Greedy(0, -1)});
  EXPECT_EQ(g.token[0], Argmax(logits));
  EXPECT_TRUE(std::isnan(g.logprob[0]));
  EXPECT_EQ(g.top_ids[0], -1);
}

// All logits equal: every token ties, more than fit the shared-memory ranking (the fallback).
TEST_F(SamplingGpu, TopLogprobsWithMassiveTies) {
  const int64_t vocab = 5000;
  std::vector<float> logits(size_t(vocab), 0.5f);
  logits[4321] = 0.25f;
  const GpuResult g = RunGpu(logits, vocab, {Greedy(0, 20)});
  EXPECT_EQ(g.token[0], 0);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(g.top_ids[i], i);
    EXPECT_NEAR(g.top_logprobs[i], 0.5f - LogSumExp(logits), 1e-4);
  }
}

TEST_F(SamplingGpu, TopK1IsGreedy) {
  const int64_t vocab = 32000;
  std::vector<float> logits = RandomLogits(vocab, 9);
  logits[31999] = logits[size_t(Argmax(logits))];  // a tie: the lower id wins
  std::vector<SampleRowParams> params;
  for (int i = 0; i < 64; ++i) {
    SampleRowParams p;
    p.temperature = 1.5f;
    p.top_k = 1;
    p.seed = 7;
    p.offset = uint64_t(i);
    params.push_back(p);
  }
  const GpuResult g = RunGpu(logits, vocab, params);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(g.token[i], Argmax(logits)) << i;
}

// ---- penalties and bias ---------------------------------------------------------------------
// What the caller does for a row: one entry per token touched by bias or penalties.
std::vector<LogitAdjust> AdjustEntries(const SamplingParams& sp, const std::vector<int>& prompt,
                                       const std::vector<int>& outputs) {
  std::set<int> seen(prompt.begin(), prompt.end());
  std::map<int, int> counts;
  for (int t : outputs) seen.insert(t), ++counts[t];
  std::set<int> tokens = seen;
  for (const auto& [id, bias] : sp.logit_bias) tokens.insert(id);
  std::vector<LogitAdjust> entries;
  for (int id : tokens) {
    LogitAdjust a;
    a.token = id;
    if (auto it = sp.logit_bias.find(id); it != sp.logit_bias.end()) a.bias = it->second;
    if (seen.count(id)) a.repetition = float(sp.repetition_penalty);
    if (auto it = counts.find(id); it != counts.end()) {
      a.subtract = float(sp.presence_penalty + sp.frequency_penalty * it->second);
    }
    entries.push_back(a);
  }
  return entries;
}

TEST_F(SamplingGpu, PenaltiesAndBiasMatchSampler) {
  const int64_t vocab = 4096;
  const int num_logit_rows = 4;
  std::vector<float> logits;
  for (int r = 0; r < num_logit_rows; ++r) {
    const std::vector<float> l = RandomLogits(vocab, 100 + r, 1.f);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(0, int(vocab) - 1);
  std::vector<SampleRowParams> params;
  std::vector<LogitAdjust> adjust;
  std::vector<int> expected;
  for (int row = 0; row < 48; ++row) {
    const int logits_row = row % num_logit_rows;  // rows share logits rows (n > 1)
    std::span<const float> raw(logits.data() + logits_row * vocab, size_t(vocab));
    SamplingParams sp;
    sp.temperature = 0;
    sp.repetition_penalty = 1.0 + 0.1 * (row % 7);
    sp.presence_penalty = (row % 3) * 0.5;
    sp.frequency_penalty = (row % 5) * 0.3 - 0.6;
    // Bias the current top few down and a random token up: the argmax moves.
    const int top = Argmax(raw);
    sp.logit_bias[top] = -5.f;
    sp.logit_bias[tok(rng)] = float(row % 4);
    if (row % 6 == 0) sp.logit_bias[tok(rng)] = 100.f;
    std::vector<int> prompt, outputs;
    for (int i = 0; i < 40; ++i) prompt.push_back(tok(rng));
    for (int i = 0; i < 30; ++i) outputs.push_back(i % 3 == 0 ? prompt[size_t(i)] : tok(rng));
    outputs.push_back(Argmax(Sampler(sp).ProcessedLogits(raw)));  // penalise the new top too

    Sampler cpu(sp, prompt);
    for (int t : outputs) cpu.Observe(t);
    const int want = Argmax(cpu.ProcessedLogits(raw));
    EXPECT_EQ(cpu.Sample(raw).token, want);
    expected.push_back(want);

    SampleRowParams p = Greedy(logits_row);
    const std::vector<LogitAdjust> e = AdjustEntries(sp, prompt, outputs);
    p.adjust_begin = int32_t(adjust.size());
    adjust.insert(adjust.end(), e.begin(), e.end());
    p.adjust_end = int32_t(adjust.size());
    params.push_back(p);
  }
  const GpuResult g = RunGpu(logits, vocab, params, adjust);
  for (size_t r = 0; r < params.size(); ++r) EXPECT_EQ(g.token[r], expected[r]) << "row " << r;
}

// ---- determinism ----------------------------------------------------------------------------
void ExpectSameSeedAndOffsetSameToken(float top_p) {
  const int64_t vocab = 1000;
  const std::vector<float> logits = RandomLogits(vocab, 21, 0.3f);  // flat: many candidates
  std::vector<SampleRowParams> params;
  for (int i = 0; i < 512; ++i) {
    SampleRowParams p;
    p.temperature = 1.f;
    p.top_p = top_p;
    p.seed = 1234;
    p.offset = uint64_t(i % 256);  // rows i and i + 256 share (seed, offset)
    params.push_back(p);
  }
  const GpuResult a = RunGpu(logits, vocab, params), b = RunGpu(logits, vocab, params);
  std::set<int> distinct;
  for (int i = 0; i < 512; ++i) {
    ASSERT_EQ(a.token[i], b.token[i]) << "launches differ at row " << i;
    distinct.insert(a.token[i]);
  }
  for (int i = 0; i < 256; ++i) ASSERT_EQ(a.token[i], a.token[i + 256]) << "rows differ at " << i;
  EXPECT_GT(distinct.size(), 100u) << "different offsets should give different draws";
  // Another seed gives another sequence.
  for (SampleRowParams& p : params) p.seed = 4321;
  const GpuResult c = RunGpu(logits, vocab, params);
  int same = 0;
  for (int i = 0; i < 256; ++i) same += c.token[i] == a.token[i];
  EXPECT_LT(same, 64);
}

TEST_F(SamplingGpu, SameSeedAndOffsetSameToken) {
  for (float top_p : {0.9f, 1.f}) {  // the filtered draw and the Gumbel-max pass
    SCOPED_TRACE("top_p " + std::to_string(top_p));
    ExpectSameSeedAndOffsetSameToken(top_p);
  }
}

TEST_F(SamplingGpu, FiltersKeepTheCpuSetWithTheCpuFrequencies) {
  const int draws = 20000;
  // A background of unlikely tokens, and a few likely ones placed by hand.
  std::vector<float> base = RandomLogits(1000, 31, 1.f);
  for (float& v : base) v -= 12.f;
  auto with = [&](std::map<int, float> top) {
    std::vector<float> l = base;
    for (const auto& [id, v] : top) l[size_t(id)] = v;
    return l;
  };
  // top-k = 3 with a tie at the 3rd place: id 30 is kept, id 40 (same logit) is not.
  const auto tie_k = with({{10, 2.f}, {20, 1.5f}, {30, 1.f}, {40, 1.f}, {5, 0.5f}});
  CheckFilter(tie_k, {1.f, 3, 1.f, 0.f}, draws, "top_k=3 tie");
  CheckFilter(tie_k, {0.5f, 4, 1.f, 0.f}, draws, "top_k=4 T=0.5");
  // top-p: weights 1, 0.5, 0.5 (ids 7 and 50 tie); target 0.6 · 2 = 1.2 keeps {3, 7}.
  const auto tie_p = with({{3, 0.f}, {50, std::log(0.5f)}, {7, std::log(0.5f)}});
  CheckFilter(tie_p, {1.f, 0, 0.6f, 0.f}, draws, "top_p=0.6 tie");
  // A 5-token distribution 0.4 / 0.25 / 0.15 / 0.1 / 0.1: top_p 0.75 keeps 3.
  const auto five = with({{100, std::log(0.4f)},
                          {200, std::log(0.25f)},
                          {300, std::log(0.15f)},
                          {400, std::log(0.1f)},
                          {500, std::log(0.1f)}});
  CheckFilter(five, {1.f, 0, 0.75f, 0.f}, draws, "top_p=0.75");
  CheckFilter(five, {1.f, 0, 1.f, 0.3f}, draws, "min_p=0.3");
  CheckFilter(five, {0.75f, 0, 1.f, 0.1f}, draws, "min_p=0.1 T=0.75");
  CheckFilter(five, {1.25f, 4, 0.875f, 0.05f}, draws, "top_k=4 top_p=0.875 min_p=0.05 T=1.25");
  CheckFilter(five, {1.f, 0, 1.f, 0.f}, draws, "no filter (background included)");
  // Temperature alone (the Gumbel-max pass): T below and above 1, top_k >= vocab (everything
  // kept), a vocabulary that is not a multiple of 4 (the scalar loads, a partial last group).
  CheckFilter(five, {0.5f, 0, 1.f, 0.f}, draws, "no filter T=0.5");
  CheckFilter(five, {2.f, 1000, 1.f, 0.f}, draws, "no filter T=2, top_k = vocab");
  std::vector<float> odd = five;
  odd.resize(1001, -12.f);
  odd[1000] = std::log(0.3f);
  odd[600] = odd[601] = -INFINITY;  // banned tokens: never drawn (CheckFilter: not kept)
  CheckFilter(odd, {1.f, 0, 1.f, 0.f}, draws, "no filter, vocab 1001, two banned");
}

// Big vocabularies of equal logits: every filter boundary is a tie, resolved by lowest id.
TEST_F(SamplingGpu, FiltersOnBigVocabularyTies) {
  const int draws = 5000;
  for (int64_t vocab : {128256, 256000}) {
    const std::vector<float> flat(size_t(vocab), 1.5f);
    // The CPU sampler is slow on flat rows (its top-p quickselect): fewer CPU draws.
    const int cpu_draws = 300;
    CheckFilter(flat, {1.f, 3, 1.f, 0.f}, draws, "flat top_k=3 vocab " + std::to_string(vocab),
                cpu_draws);
    // target = top_p · vocab = 4.5 (not an integer: no rounding ambiguity) -> ids 0..4.
    const float top_p = float(4.5 / double(vocab));
    CheckFilter(flat, {1.f, 0, top_p, 0.f}, draws, "flat top_p vocab " + std::to_string(vocab),
                cpu_draws);
    CheckFilter(flat, {0.7f, 6, 0.5f, 0.f}, draws, "flat top_k=6 top_p=0.5", cpu_draws);
  }
}

// Realistic rows: the draws stay inside the kept set (no frequency check: it may be large).
TEST_F(SamplingGpu, RandomRowsDrawOnlyKeptTokens) {
  const int64_t vocab = 128256;
  const std::vector<float> logits = RandomLogits(vocab, 77, 2.5f);
  for (const Filter& f :
       {Filter{1.f, 0, 1.f, 0.f}, Filter{0.8f, 40, 1.f, 0.f}, Filter{1.f, 0, 0.5f, 0.f},
        Filter{0.9f, 50, 0.9f, 0.f}, Filter{1.f, 0, 1.f, 0.2f}, Filter{1.1f, 1000, 0.95f, 0.01f}}) {
    std::map<int, double> kept = ReferenceKept(logits, f);
    std::vector<SampleRowParams> params(1024);
    for (int i = 0; i < 1024; ++i) {
      params[size_t(i)].temperature = f.temperature;
      params[size_t(i)].top_k = f.top_k;
      params[size_t(i)].top_p = f.top_p;
      params[size_t(i)].min_p = f.min_p;
      params[size_t(i)].seed = 5;
      params[size_t(i)].offset = uint64_t(i);
      params[size_t(i)].num_logprobs = 0;
    }
    const GpuResult g = RunGpu(logits, vocab, params);
    const double lse = LogSumExp(logits);
    for (int i = 0; i < 1024; ++i) {
      ASSERT_TRUE(kept.count(g.token[size_t(i)]))
          << "top_k " << f.top_k << " top_p " << f.top_p << " min_p " << f.min_p << ": token "
          << g.token[size_t(i)] << " is not kept (kept set size " << kept.size() << ")";
      ASSERT_NEAR(g.logprob[size_t(i)], logits[size_t(g.token[size_t(i)])] - lse, 1e-4);
    }
  }
}

}  // namespace
}  // namespace llm::test::sampling
