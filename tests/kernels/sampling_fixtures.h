// Shared fixtures of the GPU sampler tests (kernels/cuda/sampling/sampling.cu against the
// engine's Sampler, engine/sample/sampler.h): sampling_gpu_test.cc (greedy, logprobs, penalties,
// determinism, filters), sampling_gumbel_gpu_test.cc (the temperature-only Gumbel-max draw) and
// sampling_mask_gpu_test.cc (allowed-token masks).
// The SamplingGpu fixture (skips without a GPU), device buffers, RunGpu (SampleTokens over
// logits rows), random logits, greedy rows, and the filter reference: ReferenceKept (Sampler's
// steps 5-8 in double), the chi-square statistic and bound, CheckFilter. Header-only: each test
// executable includes it.
//   ninja -C build sampling_gpu_test sampling_gumbel_gpu_test && (cd build && ctest -L gpu -R
//   sampling)
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/sample/sampler.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/model_ops.h"

namespace llm::test::sampling {

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
inline void Upload(const DevBuf& b, const std::vector<T>& h) {
  if (!h.empty()) {
    LLM_CUDA_CHECK(cudaMemcpy(b.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
}
template <typename T>
inline std::vector<T> Download(const DevBuf& b, size_t n) {
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
// masks: [num_masks, SampleMaskWords(vocab)] words that the rows' mask_row index (empty: the
// kernel gets a null `masks`).
inline GpuResult RunGpu(const std::vector<float>& logits, int64_t vocab,
                        const std::vector<SampleRowParams>& params,
                        const std::vector<LogitAdjust>& adjust = {},
                        const cuda::SampleOptions& options = {},
                        const std::vector<uint32_t>& masks = {}) {
  constexpr int K = cuda::kMaxTopLogprobs;
  GpuResult r;
  DevBuf dlogits(logits.size() * 4),
      dadjust(std::max<size_t>(adjust.size(), 1) * sizeof(LogitAdjust)), dmasks(masks.size() * 4);
  Upload(dlogits, logits);
  Upload(dadjust, adjust);
  Upload(dmasks, masks);
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
                       static_cast<const LogitAdjust*>(dadjust.p),
                       static_cast<const uint32_t*>(dmasks.p), dws.p, out, nullptr, options);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    auto append = [](auto& dst, const auto& src) { dst.insert(dst.end(), src.begin(), src.end()); };
    append(r.token, Download<int32_t>(dtok, n));
    append(r.logprob, Download<float>(dlp, n));
    append(r.top_ids, Download<int32_t>(dtid, n * K));
    append(r.top_logprobs, Download<float>(dtlp, n * K));
  }
  return r;
}

inline std::vector<float> RandomLogits(int64_t vocab, uint32_t seed, float scale = 3.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& v : l) v = dist(rng);
  return l;
}

inline SampleRowParams Greedy(int32_t logits_row = 0, int32_t num_logprobs = -1) {
  SampleRowParams p;
  p.logits_row = logits_row;
  p.temperature = 0.f;
  p.num_logprobs = num_logprobs;
  return p;
}

// ---- filters: kept sets and frequencies -----------------------------------------------------
struct Filter {
  float temperature = 1.f;
  int top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
};

// Sampler's steps 5-8 transcribed directly (full sort, double sums): token -> probability.
inline std::map<int, double> ReferenceKept(const std::vector<float>& logits, const Filter& f) {
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
inline double ChiSquare(const std::map<int, int>& counts, const std::map<int, double>& probs,
                        int draws, int* num_bins) {
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
inline double ChiBound(int bins) { return (bins - 1) + 10 * std::sqrt(2.0 * (bins - 1)) + 10; }

// draws GPU samples and cpu_draws CPU samples (CPU Sampler: the reference's own check).
inline void CheckFilter(const std::vector<float>& logits, const Filter& f, int draws,
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
}  // namespace llm::test::sampling
