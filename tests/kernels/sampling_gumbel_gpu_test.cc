// The GPU sampler's temperature-only (Gumbel-max) draw (kernels/cuda/sampling/sampling.cu)
// against the engine's Sampler (engine/sample/sampler.h), label gpu; skips without a GPU.
//  - Temperature alone: two tied top logits split evenly at a tiny temperature; over a 128k
//    row the frequencies match the renormalised probabilities (chi-square, and the likeliest
//    tokens one by one), with and without a logit_bias entry (the copy pass).
//  - The temperature-only (Gumbel-max) draw equals its definition computed here over the whole
//    row (Philox4x32-10 on the host, checked against Random123's known answers; the same float
//    Gumbel; double scores): the kernel's pruning of hopeless elements leaves the token exact;
//    and the same rows drawn with the pruning switched off (a test hook) give the same tokens
//    and logprobs bit for bit.
//   ninja -C build sampling_gumbel_gpu_test && (cd build && ctest -L gpu -R sampling)
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/ops/model_ops.h"
#include "tests/kernels/sampling_fixtures.h"

namespace llm::test::sampling {
namespace {

// Temperature alone at a tiny temperature: two tied top logits must split evenly (the scores
// are doubles; in float, l / T ~ 2e5 would round the noise to 1/64 and favour the lower id).
TEST_F(SamplingGpu, TemperatureOnlyTiesSplitEvenlyAtTinyTemperature) {
  std::vector<float> logits = RandomLogits(1000, 41, 1.f);
  logits[3] = logits[7] = 20.f;
  const int draws = 20000;
  std::vector<SampleRowParams> params(static_cast<size_t>(draws));
  for (int i = 0; i < draws; ++i) {
    params[size_t(i)].temperature = 1e-4f;
    params[size_t(i)].seed = 23;
    params[size_t(i)].offset = uint64_t(i);
  }
  const GpuResult g = RunGpu(logits, 1000, params);
  int low = 0;
  for (int t : g.token) {
    ASSERT_TRUE(t == 3 || t == 7) << "drew " << t;
    low += t == 3;
  }
  EXPECT_NEAR(low / double(draws), 0.5, 0.02);  // sd 0.0035
}

// Temperature alone over a realistic 128k row: the frequencies of the likeliest tokens (the
// rest pooled) match softmax(l / T); the draws of a row with a logit_bias entry (the copy
// pass) follow the biased row.
TEST_F(SamplingGpu, TemperatureOnlyFrequenciesOnBigVocabulary) {
  const int64_t vocab = 128256;
  std::vector<float> logits = RandomLogits(vocab, 78, 2.5f);
  for (int id : {5, 70000, 128255}) logits[size_t(id)] = 12.f;  // bins of their own
  CheckFilter(logits, {1.f, 0, 1.f, 0.f}, 20000, "T=1 vocab 128256", 300);
  CheckFilter(logits, {0.8f, 0, 1.f, 0.f}, 20000, "T=0.8 vocab 128256", 300);
  // The chi-square above has hundreds of bins (a weak bound): the three likeliest tokens'
  // frequencies each within 5 sd as well.
  for (float t : {1.f, 0.8f}) {
    const std::map<int, double> p = ReferenceKept(logits, {t, 0, 1.f, 0.f});
    const int n = 20000;
    std::vector<SampleRowParams> rows(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      rows[size_t(i)].temperature = t;
      rows[size_t(i)].seed = 29;
      rows[size_t(i)].offset = uint64_t(i);
    }
    const GpuResult r = RunGpu(logits, vocab, rows);
    std::map<int, int> c;
    for (int tok : r.token) ++c[tok];
    for (int id : {5, 70000, 128255}) {
      const double want = p.at(id), sd = std::sqrt(want * (1 - want) / n);
      EXPECT_NEAR(c[id] / double(n), want, 5 * sd) << "T " << t << " id " << id;
    }
  }

  // The bias moves id 9 to the top: it must be drawn at the biased row's frequency.
  std::vector<float> biased = logits;
  biased[9] += 13.f;
  const std::map<int, double> want = ReferenceKept(biased, {1.f, 0, 1.f, 0.f});
  const int draws = 20000;
  std::vector<SampleRowParams> params(static_cast<size_t>(draws));
  std::vector<LogitAdjust> adjust = {LogitAdjust{9, 13.f, 1.f, 0.f}};
  for (int i = 0; i < draws; ++i) {
    params[size_t(i)].seed = 17;
    params[size_t(i)].offset = uint64_t(i);
    params[size_t(i)].adjust_begin = 0;
    params[size_t(i)].adjust_end = 1;
  }
  const GpuResult g = RunGpu(logits, vocab, params, adjust);
  std::map<int, int> counts;
  for (int t : g.token) ++counts[t];
  int bins = 0;
  const double chi2 = ChiSquare(counts, want, draws, &bins);
  EXPECT_LT(chi2, ChiBound(bins)) << "bins " << bins;
  EXPECT_NEAR(counts[9] / double(draws), want.at(9), 0.02);
}

// ---- the Gumbel-max draw against its definition ---------------------------------------------
// Temperature-only rows draw token = argmax_i fma(double(l_i), 1 / double(T), double(G_i)) (ties
// -> lowest id, NaN scores never win), G_i = Gumbel(r_i) in float, r_i word i % 4 of
// Philox4x32-10(counter (i / 4, uint32(offset), uint32(offset >> 32), kGumbelStream),
// key (uint32(seed), uint32(seed >> 32))). The kernel prunes elements whose score provably cannot
// reach the best one; here every element is scored, so equal tokens show that pruning (and
// everything else) leaves the draw exact.

// Philox4x32-10 as curand_Philox4x32_10 (curand_philox4x32_x.h; Salmon et al., SC'11): 10 rounds
// of (hi0, lo0) = 0xD2511F53 * c0, (hi1, lo1) = 0xCD9E8D57 * c2,
// c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0), the key bumped by (0x9E3779B9, 0xBB67AE85)
// between rounds.
using Philox4 = std::array<uint32_t, 4>;
Philox4 Philox4x32_10(Philox4 c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
    const uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
  }
  return c;
}

// Random123's known-answer vectors for philox4x32_10 (kat_vectors): the host Philox is the
// standard one. Runs without a GPU.
TEST(SamplingHostReference, Philox4x32_10KnownAnswers) {
  EXPECT_EQ(Philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Philox4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  const uint32_t m = 0xffffffffu;
  EXPECT_EQ(Philox4x32_10({m, m, m, m}, {m, m}),
            (Philox4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(Philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (Philox4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

constexpr uint32_t kGumbelStream = 0x6a09e667u;  // sampling.cu's: the counter's last word

// sampling.cu's Gumbel(r), the same float operations and branches (glibc's logf / log1pf here,
// CUDA's there: they may differ by an ulp).
float HostGumbel(uint32_t r) {
  const float e = r < 0x80000000u ? -std::log((float(r) + 0.5f) * 0x1p-32f)
                                  : -std::log1p(-((float(~r) + 0.5f) * 0x1p-32f));
  return -std::log(e);
}

// The draw's definition over a whole row: the token, and every id whose score is within `tol`
// of the best (an ulp of G is at most 2^-19 ~ 1.9e-6 at |G| <= 23: host and device may order
// such near-ties differently).
struct GumbelRef {
  int token = -1;
  std::vector<int> near;  // ids within tol of the best score, the token included
};
GumbelRef GumbelArgmax(std::span<const float> l, float temperature, uint64_t seed, uint64_t offset,
                       double tol = 1e-5) {
  const double inv_t = 1.0 / double(temperature);
  const std::array<uint32_t, 2> key = {uint32_t(seed), uint32_t(seed >> 32)};
  std::vector<double> score(l.size(), NAN);
  GumbelRef ref;
  for (size_t c = 0; 4 * c < l.size(); ++c) {
    const Philox4 r =
        Philox4x32_10({uint32_t(c), uint32_t(offset), uint32_t(offset >> 32), kGumbelStream}, key);
    for (size_t e = 0; e < 4 && 4 * c + e < l.size(); ++e) {
      const size_t i = 4 * c + e;
      score[i] = std::fma(double(l[i]), inv_t, double(HostGumbel(r[e])));
      if (!std::isnan(score[i]) && (ref.token < 0 || score[i] > score[size_t(ref.token)])) {
        ref.token = int(i);  // strictly greater: ties keep the lower id
      }
    }
  }
  for (size_t i = 0; i < l.size() && ref.token >= 0; ++i) {
    if (score[i] >= score[size_t(ref.token)] - tol) ref.near.push_back(int(i));
  }
  return ref;
}

// GPU tokens equal the definition's, over rows that prune little (flat, normal), much (peaked,
// small T) and -inf / NaN logits, both load paths (vocab 1001: scalar loads, a partial last
// group), the copy pass (a logit_bias entry), several seeds and offsets (64-bit ones too).
TEST_F(SamplingGpu, TemperatureOnlyDrawEqualsTheGumbelArgmax) {
  struct Rows {
    std::string name;
    std::vector<float> logits;  // one row: every draw of the case samples it
    float temperature;
    int draws;
    float bias = 0.f;  // != 0: a LogitAdjust entry adds it to token 7 (the copy pass)
  };
  const int64_t big = 128256;
  std::vector<Rows> cases;
  cases.push_back({"normal T=1", RandomLogits(big, 301, 2.5f), 1.f, 48});
  cases.push_back({"normal T=0.7", RandomLogits(big, 302, 2.5f), 0.7f, 48});
  std::vector<float> peaked = RandomLogits(big, 303, 2.5f);
  peaked[77777] = 20.f;
  cases.push_back({"peaked +20 T=1", peaked, 1.f, 24});
  cases.push_back({"peaked +20 T=0.7", peaked, 0.7f, 24});
  cases.push_back({"normal T=0.05 (heavy pruning)", RandomLogits(big, 304, 2.5f), 0.05f, 16});
  std::vector<float> banned = RandomLogits(big, 305, 2.5f);
  for (int id : {0, 1, 2, 3, 4, 999, 50000, 128255}) banned[size_t(id)] = -INFINITY;
  for (size_t i = 100; i < 2100; ++i) banned[i] = -INFINITY;
  cases.push_back({"-inf entries T=1", banned, 1.f, 24});
  std::vector<float> nans = RandomLogits(big, 306, 2.5f);
  for (int id : {5, 6, 70000, 128254}) nans[size_t(id)] = NAN;  // never drawn: NaN scores
  cases.push_back({"NaN entries T=1", nans, 1.f, 16});
  cases.push_back({"flat T=1 (the noise decides)", std::vector<float>(size_t(big), 0.5f), 1.f, 16});
  cases.push_back({"bias +8 on id 7 T=1", RandomLogits(big, 307, 2.5f), 1.f, 16, 8.f});
  std::vector<float> odd = RandomLogits(1001, 308, 2.f);
  odd[600] = odd[601] = -INFINITY;
  cases.push_back({"vocab 1001 T=1", odd, 1.f, 256});
  cases.push_back({"vocab 1001 T=0.7", odd, 0.7f, 256});

  int near_ties = 0, rows = 0;
  for (const Rows& c : cases) {
    const int64_t vocab = int64_t(c.logits.size());
    std::vector<float> processed = c.logits;
    if (c.bias != 0.f) processed[7] += c.bias;  // l + bias; repetition 1, subtract 0: exact
    std::vector<SampleRowParams> params(size_t(c.draws));
    std::vector<LogitAdjust> adjust;
    for (int d = 0; d < c.draws; ++d) {
      SampleRowParams& p = params[size_t(d)];
      p.temperature = c.temperature;
      p.seed = d % 3 == 0 ? uint64_t(1000 + d) : 0x9e3779b97f4a7c15ull * uint64_t(d + 1);
      p.offset = d % 2 == 0 ? uint64_t(d) : (uint64_t(d) << 32) + 12345u;
      if (c.bias != 0.f) p.adjust_begin = 0, p.adjust_end = 1;
    }
    if (c.bias != 0.f) adjust.push_back(LogitAdjust{7, c.bias, 1.f, 0.f});
    const GpuResult g = RunGpu(c.logits, vocab, params, adjust);
    for (int d = 0; d < c.draws; ++d) {
      const SampleRowParams& p = params[size_t(d)];
      const GumbelRef ref = GumbelArgmax(processed, p.temperature, p.seed, p.offset);
      const int got = g.token[size_t(d)];
      const std::string what = c.name + " draw " + std::to_string(d);
      ++rows;
      if (ref.near.size() == 1) {
        ASSERT_EQ(got, ref.token) << what;
      } else {
        ++near_ties;
        ASSERT_NE(std::find(ref.near.begin(), ref.near.end(), got), ref.near.end())
            << what << ": GPU " << got << ", host " << ref.token;
      }
    }
  }
  std::printf("Gumbel draws checked: %d rows, %d near-ties (top scores within 1e-5)\n", rows,
              near_ties);
  RecordProperty("near_ties", near_ties);
  EXPECT_LE(near_ties, 2) << "near-ties should be rare";
}

// The pruning of the temperature-only draw changes no token: the same rows drawn with it and
// without it (SampleOptions::has_gumbel_pruning = false: every element's noise computed) give
// the same tokens and logprobs bit for bit, over rows where pruning is heavy (small T, a peaked
// row), light (large T, flat rows, where the noise decides), and over -inf / NaN / huge logits,
// at the vocabulary sizes of the other tests.
TEST_F(SamplingGpu, GumbelPruningChangesNoToken) {
  struct Rows {
    std::string name;
    std::vector<float> logits;
    float temperature;
  };
  const int64_t big = 128256;
  std::vector<Rows> cases;
  for (float t : {1.f, 0.7f, 0.05f, 2e-5f, 3.f, 1000.f}) {
    cases.push_back({"normal T=" + std::to_string(t), RandomLogits(big, 401, 2.5f), t});
  }
  std::vector<float> peaked = RandomLogits(big, 402, 2.5f);
  peaked[4242] = 25.f;
  cases.push_back({"peaked +25", peaked, 1.f});
  std::vector<float> close = RandomLogits(big, 403, 0.5f);
  for (int i = 0; i < 20; ++i) close[size_t(1000 * i + 7)] = 15.f + 0.01f * float(i);
  cases.push_back({"20 near-equal tops", close, 1.f});
  cases.push_back({"flat", std::vector<float>(size_t(big), -3.f), 1.f});
  std::vector<float> odd = RandomLogits(big, 404, 2.5f);
  for (size_t i = 0; i < odd.size(); i += 3) odd[i] = -INFINITY;
  odd[11] = NAN, odd[50001] = NAN;
  // The two largest tie in l, and in the scores too: the noise (at most 23) is below 1e30's
  // ulp in double, so the lower id wins every draw.
  odd[99] = 1e30f, odd[100] = 1e30f;
  cases.push_back({"-inf, NaN and 1e30 entries", odd, 1.f});
  std::vector<float> pair = RandomLogits(big, 408, 2.5f);
  pair[500] = 30.f, pair[60000] = 30.f;  // tied in l, far above the rest: the noise decides
  cases.push_back({"two equal tops", pair, 1.f});
  cases.push_back({"vocab 1001", RandomLogits(1001, 405, 2.f), 1.f});
  cases.push_back({"vocab 5", RandomLogits(5, 406, 2.f), 1.f});
  cases.push_back({"vocab 32003", RandomLogits(32003, 407, 2.f), 0.8f});
  for (const Rows& c : cases) {
    std::vector<SampleRowParams> params(64);
    for (size_t d = 0; d < params.size(); ++d) {
      params[d].temperature = c.temperature;
      params[d].seed = 0x9e3779b97f4a7c15ull * (d + 1);
      params[d].offset = d * 7919;
      params[d].num_logprobs = d % 4 == 0 ? 3 : -1;
    }
    const int64_t vocab = int64_t(c.logits.size());
    const GpuResult pruned = RunGpu(c.logits, vocab, params);
    cuda::SampleOptions no_pruning;
    no_pruning.has_gumbel_pruning = false;
    const GpuResult full = RunGpu(c.logits, vocab, params, /*adjust=*/{}, no_pruning);
    EXPECT_EQ(pruned.token, full.token) << c.name;
    EXPECT_EQ(0, std::memcmp(pruned.logprob.data(), full.logprob.data(),
                             pruned.logprob.size() * sizeof(float)))
        << c.name;
    std::set<int32_t> distinct(full.token.begin(), full.token.end());
    std::printf(
        "  %-28s vocab %6lld: 64 draws, %zu distinct tokens, equal with and without "
        "pruning\n",
        c.name.c_str(), (long long)vocab, distinct.size());
    if (c.name == "two equal tops") {  // each wins half the draws; both in 64 but for 2^-63
      EXPECT_EQ(distinct, (std::set<int32_t>{500, 60000})) << c.name;
    }
  }
}

}  // namespace
}  // namespace llm::test::sampling
