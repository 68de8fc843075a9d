// The GPU sampler's allowed-token masks (structured outputs: SampleRowParams::mask_row, the
// `masks` argument of cuda::SampleTokens) against the CPU's masking (Sampler::Sample sets a
// disallowed token's logit to -inf before everything else; logprobs stay the raw logits').
// Label gpu; the GPU tests skip without a GPU, the host-side checks (MaskLayout) run anywhere.
//  - Greedy: the token is the argmax over the allowed tokens (computed here), for masks
//    allowing a random 30%, exactly one token, only low logits, only the last ids, everything,
//    with logit_bias entries on allowed and disallowed tokens, over vocabularies that are and
//    are not multiples of 4 (both copy paths); logprobs and top-N equal the unmasked CPU
//    Sampler's (raw).
//  - Draws (temperature alone: the Gumbel pass; top-k, top-p, min-p, combined): every token is
//    allowed, and each is bit-identical to the token drawn with the same seed from logits
//    whose disallowed entries are -inf (no mask), whose frequencies CheckFilter holds to the
//    CPU Sampler's kept set (chi-square).
//  - A batch mixing masked and unmasked rows of every mode: the unmasked rows' tokens and
//    logprobs are bit-identical to a launch without masks (null `masks`), the masked rows'
//    logprobs and top-N too (they are of the raw row).
//  - Nothing allowed: token 0, as the CPU's argmax of an all -inf row.
//   ninja -C build sampling_mask_gpu_test && (cd build && ctest -L gpu -R sampling_mask)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/sample/sampler.h"
#include "kernels/cuda/ops/model_ops.h"
#include "tests/kernels/sampling_fixtures.h"

namespace llm::test::sampling {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

enum class MaskKind { kRandom, kOne, kLow, kLastIds, kAll, kNone };

const char* Name(MaskKind k) {
  switch (k) {
    case MaskKind::kRandom:
      return "random 30%";
    case MaskKind::kOne:
      return "one token";
    case MaskKind::kLow:
      return "low logits only";
    case MaskKind::kLastIds:
      return "last 3 ids";
    case MaskKind::kAll:
      return "all allowed";
    case MaskKind::kNone:
      return "none allowed";
  }
  return "?";
}

// Which ids of `row` a mask of kind k allows (seeded, deterministic).
std::vector<bool> MakeAllowed(MaskKind k, const std::vector<float>& row, uint32_t seed) {
  const size_t vocab = row.size();
  std::vector<bool> a(vocab, false);
  std::mt19937 rng(seed);
  switch (k) {
    case MaskKind::kRandom: {
      std::bernoulli_distribution keep(0.3);
      for (size_t i = 0; i < vocab; ++i) a[i] = keep(rng);
      a[rng() % vocab] = true;
      break;
    }
    case MaskKind::kOne: {
      // A low-logit token, so that the raw argmax is always disallowed.
      size_t lowest = 0;
      for (size_t i = 0; i < vocab; ++i) lowest = row[i] < row[lowest] ? i : lowest;
      a[lowest] = true;
      break;
    }
    case MaskKind::kLow: {  // the lowest tenth of the logits (at least one)
      std::vector<float> sorted(row);
      std::nth_element(sorted.begin(), sorted.begin() + long(vocab / 10), sorted.end());
      const float cut = sorted[vocab / 10];
      for (size_t i = 0; i < vocab; ++i) a[i] = row[i] <= cut;
      break;
    }
    case MaskKind::kLastIds:
      for (size_t i = vocab >= 3 ? vocab - 3 : 0; i < vocab; ++i) a[i] = true;
      break;
    case MaskKind::kAll:
      a.assign(vocab, true);
      break;
    case MaskKind::kNone:
      break;
  }
  return a;
}

// SampleMaskWords(vocab) words. The bits past the vocabulary are set: the kernel must not read
// them as tokens.
std::vector<uint32_t> Pack(const std::vector<bool>& allowed) {
  const int64_t vocab = int64_t(allowed.size());
  std::vector<uint32_t> w(size_t(cuda::SampleMaskWords(vocab)), 0u);
  for (int64_t t = 0; t < int64_t(w.size()) * 32; ++t) {
    if (t >= vocab || allowed[size_t(t)]) w[size_t(t / 32)] |= 1u << (t % 32);
  }
  return w;
}

// The CPU's masking: -inf where disallowed.
std::vector<float> Masked(std::span<const float> row, const std::vector<bool>& allowed) {
  std::vector<float> m(row.begin(), row.end());
  for (size_t i = 0; i < m.size(); ++i) m[i] = allowed[i] ? m[i] : kMinusInf;
  return m;
}

// Bit equality of floats (NaN == NaN: untouched outputs are NaN in both runs).
bool Same(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

TEST(MaskLayout, WordsAndDefaults) {
  EXPECT_EQ(cuda::SampleMaskWords(1), 1);
  EXPECT_EQ(cuda::SampleMaskWords(32), 1);
  EXPECT_EQ(cuda::SampleMaskWords(33), 2);
  EXPECT_EQ(cuda::SampleMaskWords(128256), 4008);
  EXPECT_EQ(cuda::SampleRowParams{}.mask_row, -1);
  const std::vector<uint32_t> w = Pack({true, false, false, true, false});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0], 0xFFFFFFE9u);  // ids 0 and 3, and the 27 bits past the vocabulary
}

// ---- greedy -------------------------------------------------------------------------------
TEST_F(SamplingGpu, GreedyIsTheArgmaxOverAllowedTokens) {
  const MaskKind kinds[] = {MaskKind::kRandom,  MaskKind::kOne, MaskKind::kLow,
                            MaskKind::kLastIds, MaskKind::kAll, MaskKind::kRandom};
  for (int64_t vocab : {5, 1000, 32001, 128256}) {
    const int num_rows = int(std::size(kinds));
    std::vector<float> logits;
    std::vector<uint32_t> masks;
    std::vector<std::vector<bool>> allowed;
    for (int r = 0; r < num_rows; ++r) {
      const std::vector<float> l = RandomLogits(vocab, uint32_t(vocab * 7 + r));
      logits.insert(logits.end(), l.begin(), l.end());
      allowed.push_back(MakeAllowed(kinds[r], l, uint32_t(r + 1)));
      const std::vector<uint32_t> w = Pack(allowed.back());
      masks.insert(masks.end(), w.begin(), w.end());
    }
    // Rows: greedy over each mask (mask rows in reverse order, so mask_row != row); top_k = 1 at
    // temperature 1 (greedy too); the last row with biases: +50 on its raw argmax (disallowed
    // unless the mask allows it) and +5 on an allowed token.
    std::vector<SampleRowParams> params;
    std::vector<LogitAdjust> adjust;
    for (int r = 0; r < num_rows; ++r) {
      SampleRowParams p = Greedy(r, /*num_logprobs=*/5);
      p.mask_row = num_rows - 1 - r;
      if (r == 1) p.temperature = 1.f, p.top_k = 1;
      params.push_back(p);
    }
    const int biased = num_rows - 1;
    std::span<const float> biased_row(logits.data() + biased * vocab, size_t(vocab));
    const int raw_top = Argmax(biased_row);
    int some_allowed = 0;
    while (!allowed[biased][size_t(some_allowed)]) ++some_allowed;
    params[biased].adjust_begin = 0;
    adjust.push_back({raw_top, 50.f, 1.f, 0.f});
    if (some_allowed != raw_top) adjust.push_back({some_allowed, 5.f, 1.f, 0.f});
    params[biased].adjust_end = int32_t(adjust.size());
    // mask_row r reads mask num_rows - 1 - r: reorder the masks to match.
    std::vector<uint32_t> reordered;
    const size_t words = size_t(cuda::SampleMaskWords(vocab));
    for (int m = 0; m < num_rows; ++m) {
      const size_t row = size_t(num_rows - 1 - m);
      reordered.insert(reordered.end(), masks.begin() + long(row * words),
                       masks.begin() + long((row + 1) * words));
    }
    const GpuResult g = RunGpu(logits, vocab, params, adjust, {}, reordered);

    for (int r = 0; r < num_rows; ++r) {
      std::span<const float> row(logits.data() + r * vocab, size_t(vocab));
      std::vector<float> want_row = Masked(row, allowed[size_t(r)]);
      if (r == biased) {
        for (const LogitAdjust& a : adjust) {
          if (allowed[size_t(r)][size_t(a.token)]) want_row[size_t(a.token)] += a.bias;
        }
      }
      const int want = Argmax(want_row);
      const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) +
                               " (" + Name(kinds[r]) + ")";
      ASSERT_EQ(g.token[size_t(r)], want) << what;
      ASSERT_TRUE(allowed[size_t(r)][size_t(g.token[size_t(r)])]) << what;
      // Logprobs of the raw row: the CPU Sampler without a mask has the same top-N.
      SamplingParams sp;
      sp.temperature = 0;
      sp.logprobs = 5;
      Sampler cpu(sp);
      const SampleResult raw = cpu.Sample(row);
      ASSERT_NEAR(g.logprob[size_t(r)], row[size_t(want)] - LogSumExp(row), 1e-4) << what;
      for (size_t i = 0; i < raw.top_logprobs.size(); ++i) {
        const size_t at = size_t(r) * cuda::kMaxTopLogprobs + i;
        ASSERT_EQ(g.top_ids[at], raw.top_logprobs[i].token) << what << " top " << i;
        ASSERT_NEAR(g.top_logprobs[at], raw.top_logprobs[i].logprob, 1e-4) << what << " top " << i;
      }
    }
  }
}

// ---- draws --------------------------------------------------------------------------------
TEST_F(SamplingGpu, DrawsAreAllowedAndEqualTheDrawsFromMinusInfLogits) {
  const Filter filters[] = {{1.f, 0, 1.f, 0.f},
                            {0.7f, 50, 1.f, 0.f},
                            {1.f, 0, 0.9f, 0.f},
                            {1.f, 0, 1.f, 0.05f},
                            {1.3f, 200, 0.95f, 0.01f}};
  for (int64_t vocab : {1000, 4099, 128256}) {
    const std::vector<float> row = RandomLogits(vocab, uint32_t(vocab), 2.f);
    for (MaskKind kind : {MaskKind::kRandom, MaskKind::kLow, MaskKind::kOne}) {
      const std::vector<bool> allowed = MakeAllowed(kind, row, uint32_t(vocab + 3));
      const std::vector<uint32_t> mask = Pack(allowed);
      const std::vector<float> masked = Masked(row, allowed);
      for (size_t f = 0; f < std::size(filters); ++f) {
        const Filter& flt = filters[f];
        const std::string what = "vocab " + std::to_string(vocab) + " mask " + Name(kind) +
                                 " filter " + std::to_string(f);
        const int draws = vocab > 10000 ? 4000 : 10000;
        // The -inf logits against the CPU Sampler's kept set (and its own draws), GPU without
        // a mask: seed 2024, offsets 0..draws-1.
        CheckFilter(masked, flt, draws, what, vocab > 10000 ? 300 : draws);
        if (HasFatalFailure()) return;
        std::vector<SampleRowParams> params(static_cast<size_t>(draws));
        for (int i = 0; i < draws; ++i) {
          SampleRowParams& p = params[size_t(i)];
          p.temperature = flt.temperature;
          p.top_k = flt.top_k;
          p.top_p = flt.top_p;
          p.min_p = flt.min_p;
          p.seed = 2024;
          p.offset = uint64_t(i);
        }
        const GpuResult plain = RunGpu(masked, vocab, params);
        for (SampleRowParams& p : params) p.mask_row = 0;
        const GpuResult g = RunGpu(row, vocab, params, {}, {}, mask);
        for (int i = 0; i < draws; ++i) {
          const int t = g.token[size_t(i)];
          ASSERT_TRUE(t >= 0 && t < vocab && allowed[size_t(t)])
              << what << " draw " << i << ": " << t;
          ASSERT_EQ(t, plain.token[size_t(i)]) << what << " draw " << i;
        }
      }
    }
  }
}

// ---- neighbours ---------------------------------------------------------------------------
TEST_F(SamplingGpu, UnmaskedRowsAndRawLogprobsAreUnchanged) {
  for (int64_t vocab : {50257, 128256}) {
    const int num_logit_rows = 8, num_rows = 96;
    std::vector<float> logits;
    for (int r = 0; r < num_logit_rows; ++r) {
      const std::vector<float> l = RandomLogits(vocab, uint32_t(vocab + 100 + r));
      logits.insert(logits.end(), l.begin(), l.end());
    }
    const Filter modes[] = {{0.f, 0, 1.f, 0.f},   {1.f, 0, 1.f, 0.f},  {0.8f, 40, 1.f, 0.f},
                            {1.f, 0, 0.92f, 0.f}, {1.f, 0, 1.f, 0.1f}, {1.f, 1, 1.f, 0.f}};
    std::vector<SampleRowParams> params;
    std::vector<LogitAdjust> adjust;
    std::vector<uint32_t> masks;
    std::vector<std::vector<bool>> allowed;
    for (int r = 0; r < num_rows; ++r) {
      const Filter& m = modes[size_t(r / 2) % std::size(modes)];
      SampleRowParams p;
      p.logits_row = r % num_logit_rows;
      p.temperature = m.temperature;
      p.top_k = m.top_k;
      p.top_p = m.top_p;
      p.min_p = m.min_p;
      p.seed = 77 + uint64_t(r % 5);
      p.offset = uint64_t(r);
      p.num_logprobs = r % 3 == 0 ? -1 : r % 3 == 1 ? 0 : 20;
      if (r % 4 >= 2) {  // a bias entry on half of the rows
        p.adjust_begin = int32_t(adjust.size());
        adjust.push_back({int32_t((r * 7919) % vocab), 2.f, 1.f, 0.f});
        p.adjust_end = int32_t(adjust.size());
      }
      params.push_back(p);
    }
    const GpuResult without = RunGpu(logits, vocab, params, adjust);
    // Odd rows masked (a random 30%, their mask rows packed in row order).
    for (int r = 1; r < num_rows; r += 2) {
      std::vector<float> row(logits.begin() + params[size_t(r)].logits_row * vocab,
                             logits.begin() + (params[size_t(r)].logits_row + 1) * vocab);
      allowed.push_back(MakeAllowed(MaskKind::kRandom, row, uint32_t(r)));
      const std::vector<uint32_t> w = Pack(allowed.back());
      masks.insert(masks.end(), w.begin(), w.end());
      params[size_t(r)].mask_row = int32_t(allowed.size() - 1);
    }
    const GpuResult with = RunGpu(logits, vocab, params, adjust, {}, masks);
    int num_changed = 0;
    for (int r = 0; r < num_rows; ++r) {
      const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r);
      const bool masked = r % 2 == 1;
      if (!masked) {
        ASSERT_EQ(with.token[size_t(r)], without.token[size_t(r)]) << what;
      } else {
        const int t = with.token[size_t(r)];
        ASSERT_TRUE(allowed[size_t(r / 2)][size_t(t)]) << what << ": token " << t;
        num_changed += t != without.token[size_t(r)];
      }
      // Logprobs: raw, whatever the mask. The sampled token's equals the unmasked run's when the
      // token is the same, and raw[token] - lse otherwise.
      if (params[size_t(r)].num_logprobs >= 0) {
        const int t = with.token[size_t(r)];
        std::span<const float> row(logits.data() + params[size_t(r)].logits_row * vocab,
                                   size_t(vocab));
        if (t == without.token[size_t(r)]) {
          ASSERT_TRUE(Same(with.logprob[size_t(r)], without.logprob[size_t(r)])) << what;
        } else {
          ASSERT_NEAR(with.logprob[size_t(r)], row[size_t(t)] - LogSumExp(row), 1e-4) << what;
        }
      }
      for (int i = 0; i < cuda::kMaxTopLogprobs; ++i) {
        const size_t at = size_t(r) * cuda::kMaxTopLogprobs + size_t(i);
        ASSERT_EQ(with.top_ids[at], without.top_ids[at]) << what << " top " << i;
        ASSERT_TRUE(Same(with.top_logprobs[at], without.top_logprobs[at])) << what << " top " << i;
      }
    }
    // A 30% mask moves most sampled tokens (the greedy rows' argmax is disallowed 70% of the
    // time): the masked rows did see their masks.
    EXPECT_GT(num_changed, num_rows / 2 / 3) << "vocab " << vocab;
  }
}

TEST_F(SamplingGpu, NothingAllowedGivesTheCpuArgmaxFallback) {
  const int64_t vocab = 1000;
  const std::vector<float> row = RandomLogits(vocab, 5);
  const std::vector<bool> none = MakeAllowed(MaskKind::kNone, row, 0);
  std::vector<SampleRowParams> params = {Greedy(0), Greedy(0)};
  params[1].temperature = 1.f, params[1].top_p = 0.9f;
  for (SampleRowParams& p : params) p.mask_row = 0;
  const GpuResult g = RunGpu(row, vocab, params, {}, {}, Pack(none));
  for (float t : {0.f, 1.f}) {
    SamplingParams sp;
    sp.temperature = t;
    sp.top_p = t > 0 ? 0.9 : 1.0;
    sp.seed = 1;
    Sampler cpu(sp);
    const int want = cpu.Sample(Masked(row, none)).token;
    EXPECT_EQ(want, 0);
    EXPECT_EQ(g.token[t > 0 ? 1 : 0], want) << "temperature " << t;
  }
}

}  // namespace
}  // namespace llm::test::sampling
