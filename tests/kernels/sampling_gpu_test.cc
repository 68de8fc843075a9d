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
//  - The temperature-only (Gumbel-max) draw equals its definition computed here over the whole
//    row (Philox4x32-10 on the host, checked against Random123's known answers; the same float
//    Gumbel; double scores): the kernel's pruning of hopeless elements leaves the token exact;
//    and the same rows drawn with the pruning switched off (a test hook) give the same tokens
//    and logprobs bit for bit.
//   ninja -C build sampling_gpu_test && (cd build && ctest -L gpu -R sampling)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/sample/sampler.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/model_ops.h"

namespace llm {
namespace {

using cuda::LogitAdjust;
using cuda::SampleRowParams;

class SamplingGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU, sampling GPU test skipped: " << why;
  }
};

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    if (bytes) LLM_CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

template <typename T>
void Upload(const DevBuf& b, const std::vector<T>& h) {
  if (!h.empty()) {
    LLM_CUDA_CHECK(cudaMemcpy(b.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
}
template <typename T>
std::vector<T> Download(const DevBuf& b, size_t n) {
  std::vector<T> h(n);
  LLM_CUDA_CHECK(cudaMemcpy(h.data(), b.p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

struct GpuResult {
  std::vector<int32_t> token;
  std::vector<float> logprob;
  std::vector<int32_t> top_ids;     // [rows, kMaxTopLogprobs], -1 where untouched
  std::vector<float> top_logprobs;  // NaN where untouched
};

// Runs SampleTokens over logits [num_logit_rows, vocab] (rows of at most 1024 per launch).
GpuResult RunGpu(const std::vector<float>& logits, int64_t vocab,
                 const std::vector<SampleRowParams>& params,
                 const std::vector<LogitAdjust>& adjust = {},
                 const cuda::SampleOptions& options = {}) {
  constexpr int K = cuda::kMaxTopLogprobs;
  GpuResult r;
  DevBuf dlogits(logits.size() * 4),
      dadjust(std::max<size_t>(adjust.size(), 1) * sizeof(LogitAdjust));
  Upload(dlogits, logits);
  Upload(dadjust, adjust);
  for (size_t begin = 0; begin < params.size(); begin += 1024) {
    const int64_t n = int64_t(std::min<size_t>(1024, params.size() - begin));
    std::vector<SampleRowParams> p(params.begin() + begin, params.begin() + begin + n);
    DevBuf dparams(n * sizeof(SampleRowParams)), dws(cuda::SampleWorkspaceBytes(n, vocab));
    DevBuf dtok(n * 4), dlp(n * 4), dtid(n * K * 4), dtlp(n * K * 4);
    Upload(dparams, p);
    Upload(dtok, std::vector<int32_t>(n, -1));
    Upload(dlp, std::vector<float>(n, NAN));
    Upload(dtid, std::vector<int32_t>(n * K, -1));
    Upload(dtlp, std::vector<float>(n * K, NAN));
    cuda::SampleOutputs out{static_cast<int32_t*>(dtok.p), static_cast<float*>(dlp.p),
                            static_cast<int32_t*>(dtid.p), static_cast<float*>(dtlp.p)};
    cuda::SampleTokens(static_cast<const float*>(dlogits.p), vocab,
                       static_cast<const SampleRowParams*>(dparams.p), n,
                       static_cast<const LogitAdjust*>(dadjust.p), dws.p, out, nullptr, options);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    auto append = [](auto& dst, const auto& src) { dst.insert(dst.end(), src.begin(), src.end()); };
    append(r.token, Download<int32_t>(dtok, n));
    append(r.logprob, Download<float>(dlp, n));
    append(r.top_ids, Download<int32_t>(dtid, n * K));
    append(r.top_logprobs, Download<float>(dtlp, n * K));
  }
  return r;
}

std::vector<float> RandomLogits(int64_t vocab, uint32_t seed, float scale = 3.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& v : l) v = dist(rng);
  return l;
}

SampleRowParams Greedy(int32_t logits_row = 0, int32_t num_logprobs = -1) {
  SampleRowParams p;
  p.logits_row = logits_row;
  p.temperature = 0.f;
  p.num_logprobs = num_logprobs;
  return p;
}

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

// ---- filters: kept sets and frequencies -----------------------------------------------------
struct Filter {
  float temperature = 1.f;
  int top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
};

// Sampler's steps 5-8 transcribed directly (full sort, double sums): token -> probability.
std::map<int, double> ReferenceKept(const std::vector<float>& logits, const Filter& f) {
  const size_t vocab = logits.size();
  std::vector<int> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  size_t num = f.top_k > 0 && size_t(f.top_k) < vocab ? size_t(f.top_k) : vocab;
  const double max_logit = logits[size_t(ids[0])];
  const double inv_t = 1.0 / double(f.temperature);
  std::vector<double> w(num);
  for (size_t i = 0; i < num; ++i) {
    w[i] = std::exp(static_cast<float>((logits[size_t(ids[i])] - max_logit) * inv_t));
  }
  if (f.top_p < 1.f) {
    const double target = double(f.top_p) * std::accumulate(w.begin(), w.end(), 0.0);
    double mass = 0;
    for (size_t i = 0; i < num; ++i) {
      mass += w[i];
      if (mass >= target) {
        num = i + 1;
        break;
      }
    }
  }
  std::map<int, double> kept;
  double total = 0;
  for (size_t i = 0; i < num; ++i) {
    if (w[i] < double(f.min_p) || w[i] == 0) continue;
    kept[ids[i]] = w[i];
    total += w[i];
  }
  for (auto& [id, p] : kept) p /= total;
  return kept;
}

// Pearson's chi-square of counts against probabilities (tokens outside `probs` are checked
// before). Tokens expected fewer than 5 times are pooled into one bin, so the statistic has at
// most 1 / kMinProb bins: its degrees of freedom stay small whatever the kept set's size.
double ChiSquare(const std::map<int, int>& counts, const std::map<int, double>& probs, int draws,
                 int* num_bins) {
  double chi2 = 0, rest_p = 0, rest_c = 0;
  *num_bins = 0;
  for (const auto& [id, p] : probs) {
    const auto it = counts.find(id);
    const double c = it == counts.end() ? 0 : it->second, e = p * draws;
    if (e < 5) {
      rest_p += p, rest_c += c;
      continue;
    }
    chi2 += (c - e) * (c - e) / e;
    ++*num_bins;
  }
  if (rest_p * draws >= 1) {
    chi2 += (rest_c - rest_p * draws) * (rest_c - rest_p * draws) / (rest_p * draws);
    ++*num_bins;
  }
  return chi2;
}

// Chi-square bound for a statistic of `bins` bins (bins - 1 degrees of freedom): mean + 10
// standard deviations plus a margin, a tail far below 1e-9 for every df used here (<= ~30,
// except the 128k-vocabulary temperature rows, ~300-470 bins, where the bound is weak and
// the likeliest tokens' frequencies are checked one by one as well).
double ChiBound(int bins) { return (bins - 1) + 10 * std::sqrt(2.0 * (bins - 1)) + 10; }

// draws GPU samples and cpu_draws CPU samples (CPU Sampler: the reference's own check).
void CheckFilter(const std::vector<float>& logits, const Filter& f, int draws,
                 const std::string& what, int cpu_draws = -1) {
  if (cpu_draws < 0) cpu_draws = draws;
  const int64_t vocab = int64_t(logits.size());
  const std::map<int, double> kept = ReferenceKept(logits, f);
  int bins = 0;

  // The reference against the CPU Sampler: its draws stay in the set, frequencies agree.
  SamplingParams sp;
  sp.temperature = f.temperature;
  sp.top_k = f.top_k;
  sp.top_p = f.top_p;
  sp.min_p = f.min_p;
  sp.seed = 99;
  Sampler cpu(sp);
  std::map<int, int> cpu_counts;
  for (int i = 0; i < cpu_draws; ++i) ++cpu_counts[cpu.Sample(logits).token];
  for (const auto& [id, c] : cpu_counts) ASSERT_TRUE(kept.count(id)) << what << ": CPU drew " << id;
  const double cpu_chi2 = ChiSquare(cpu_counts, kept, cpu_draws, &bins);
  ASSERT_LT(cpu_chi2, ChiBound(bins)) << what << " (CPU vs reference), bins " << bins;

  std::vector<SampleRowParams> params(static_cast<size_t>(draws));
  for (int i = 0; i < draws; ++i) {
    SampleRowParams& p = params[size_t(i)];
    p.temperature = f.temperature;
    p.top_k = f.top_k;
    p.top_p = f.top_p;
    p.min_p = f.min_p;
    p.seed = 2024;
    p.offset = uint64_t(i);
  }
  const GpuResult g = RunGpu(logits, vocab, params);
  std::map<int, int> counts;
  for (int t : g.token) ++counts[t];
  for (const auto& [id, c] : counts) {
    ASSERT_TRUE(kept.count(id)) << what << ": GPU drew token " << id << " (" << c
                                << " times), which the CPU never keeps";
  }
  const double chi2 = ChiSquare(counts, kept, draws, &bins);
  EXPECT_LT(chi2, ChiBound(bins)) << what << ", bins " << bins;
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
}  // namespace llm
