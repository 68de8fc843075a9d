// The GPU sampler (kernels/cuda/sampling/sampling.cu, cuda::SampleTokens) timed per launch: vocab
// 128,256 (Llama 3), random logits, rows 1 / 128 / 512 / 1024, per mode: greedy, temperature
// 1 (the Gumbel-max pass), top_k = 50, top_p = 0.95, temperature 1 with one logit_bias
// entry per row (the copy pass), and greedy / temperature 1 with an allowed-token mask per row
// (structured outputs: the copy pass writes -inf for the disallowed half). CUDA events around each
// launch after a warm-up, median of the repeats; also the bytes of logits read once at the copy
// bandwidth's pace for scale. Before timing, each mode's tokens are checked: greedy equals the host
// argmax (over the allowed tokens), the others land in the vocabulary (and the mask) and vary over
// rows (the kernel's own correctness is sampling_gpu_test's job).
//   build/bench_sampling_gpu [--reps R]
// Prints one JSON line per (mode, rows): {"kind":"sampling",...}
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/model_ops.h"

namespace {

using llm::cuda::LogitAdjust;
using llm::cuda::SampleOutputs;
using llm::cuda::SampleRowParams;

struct Mode {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
  bool bias;
  bool mask;
};

// The benchmark's masks: about half of the ids allowed, a different half per row.
bool Allowed(int64_t row, int64_t id) {
  return ((uint32_t(id + 7 * row) * 2654435761u) >> 13) & 1u;
}

int Run(int reps) {
  const int64_t vocab = 128256;
  const int64_t max_rows = 1024;
  std::vector<float> h_logits(size_t(max_rows * vocab));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 2.5f);
  for (float& v : h_logits) v = normal(rng);
  float* logits = nullptr;
  void* workspace = nullptr;
  SampleRowParams* params = nullptr;
  LogitAdjust* adjust = nullptr;
  int32_t* tokens = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&logits, h_logits.size() * sizeof(float)));
  LLM_CUDA_CHECK(
      cudaMemcpy(logits, h_logits.data(), h_logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  LLM_CUDA_CHECK(cudaMalloc(&workspace, llm::cuda::SampleWorkspaceBytes(max_rows, vocab)));
  LLM_CUDA_CHECK(cudaMalloc(&params, max_rows * sizeof(SampleRowParams)));
  LLM_CUDA_CHECK(cudaMalloc(&adjust, max_rows * sizeof(LogitAdjust)));
  LLM_CUDA_CHECK(cudaMalloc(&tokens, max_rows * sizeof(int32_t)));
  std::vector<LogitAdjust> h_adjust(static_cast<size_t>(max_rows));
  for (int64_t r = 0; r < max_rows; ++r)
    h_adjust[size_t(r)] = {int32_t(r * 97 % vocab), 1.f, 1.f, 0.f};
  LLM_CUDA_CHECK(cudaMemcpy(adjust, h_adjust.data(), h_adjust.size() * sizeof(LogitAdjust),
                            cudaMemcpyHostToDevice));
  const int64_t words = llm::cuda::SampleMaskWords(vocab);
  std::vector<uint32_t> h_masks(size_t(max_rows * words), 0u);
  for (int64_t r = 0; r < max_rows; ++r) {
    for (int64_t t = 0; t < vocab; ++t) {
      if (Allowed(r, t)) h_masks[size_t(r * words + t / 32)] |= 1u << (t % 32);
    }
  }
  uint32_t* masks = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&masks, h_masks.size() * sizeof(uint32_t)));
  LLM_CUDA_CHECK(
      cudaMemcpy(masks, h_masks.data(), h_masks.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  cudaEvent_t start, stop;
  LLM_CUDA_CHECK(cudaEventCreate(&start));
  LLM_CUDA_CHECK(cudaEventCreate(&stop));

  const Mode modes[] = {{"greedy", 0.f, 0, 1.f, false, false},
                        {"temperature_1", 1.f, 0, 1.f, false, false},
                        {"top_k_50", 1.f, 50, 1.f, false, false},
                        {"top_p_0.95", 1.f, 0, 0.95f, false, false},
                        {"temperature_1_bias", 1.f, 0, 1.f, true, false},
                        {"greedy_mask", 0.f, 0, 1.f, false, true},
                        {"temperature_1_mask", 1.f, 0, 1.f, false, true}};
  int failures = 0;
  for (const Mode& mode : modes) {
    for (int64_t rows : {int64_t(1), int64_t(128), int64_t(512), max_rows}) {
      std::vector<SampleRowParams> h_params(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        SampleRowParams& p = h_params[size_t(r)];
        p.logits_row = int32_t(r);
        p.temperature = mode.temperature;
        p.top_k = mode.top_k;
        p.top_p = mode.top_p;
        p.seed = 11;
        p.offset = uint64_t(r);
        p.adjust_begin = mode.bias ? int32_t(r) : 0;
        p.adjust_end = mode.bias ? int32_t(r + 1) : 0;
        p.mask_row = mode.mask ? int32_t(r) : -1;
      }
      LLM_CUDA_CHECK(cudaMemcpy(params, h_params.data(), h_params.size() * sizeof(SampleRowParams),
                                cudaMemcpyHostToDevice));
      const SampleOutputs out{tokens, nullptr, nullptr, nullptr};
      auto launch = [&] {
        llm::cuda::SampleTokens(logits, vocab, params, rows, adjust, masks, workspace, out,
                                nullptr);
      };
      launch();
      LLM_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<int32_t> got(static_cast<size_t>(rows));
      LLM_CUDA_CHECK(
          cudaMemcpy(got.data(), tokens, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
      std::set<int32_t> distinct;
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t t = got[size_t(r)];
        distinct.insert(t);
        if (t < 0 || t >= vocab) {
          std::fprintf(stderr, "%s rows %lld: row %lld drew %d\n", mode.name, (long long)rows,
                       (long long)r, t);
          ++failures;
        } else if (mode.mask && !Allowed(r, t)) {
          std::fprintf(stderr, "%s row %lld: drew %d, which its mask disallows\n", mode.name,
                       (long long)r, t);
          ++failures;
        } else if (mode.temperature == 0.f) {
          const float* row = h_logits.data() + r * vocab;
          int64_t best = -1;
          for (int64_t i = 0; i < vocab; ++i) {
            if ((!mode.mask || Allowed(r, i)) && (best < 0 || row[i] > row[best])) best = i;
          }
          if (t != best) {
            std::fprintf(stderr, "greedy row %lld: %d, host argmax %lld\n", (long long)r, t,
                         (long long)best);
            ++failures;
          }
        }
      }
      if (mode.temperature > 0.f && rows >= 128 && distinct.size() < size_t(rows) / 4) {
        std::fprintf(stderr, "%s rows %lld: only %zu distinct tokens\n", mode.name, (long long)rows,
                     distinct.size());
        ++failures;
      }
      for (int i = 0; i < 3; ++i) launch();
      std::vector<float> ms(static_cast<size_t>(reps));
      for (int i = 0; i < reps; ++i) {
        LLM_CUDA_CHECK(cudaEventRecord(start));
        launch();
        LLM_CUDA_CHECK(cudaEventRecord(stop));
        LLM_CUDA_CHECK(cudaEventSynchronize(stop));
        LLM_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(i)], start, stop));
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double bytes = double(rows) * double(vocab) * sizeof(float);
      std::printf(
          "JSON {\"kind\":\"sampling\",\"mode\":\"%s\",\"rows\":%lld,\"vocab\":%lld,\"us\":%.2f,"
          "\"logits_tb_per_s\":%.3f,\"device\":\"%s\"}\n",
          mode.name, (long long)rows, (long long)vocab, med * 1e3, bytes / (med * 1e-3) / 1e12,
          llm::cuda::DeviceDescription().c_str());
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(logits);
  cudaFree(workspace);
  cudaFree(params);
  cudaFree(adjust);
  cudaFree(masks);
  cudaFree(tokens);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
  }
  std::string why;
  if (!llm::cuda::DeviceAvailable(&why)) {
    std::fprintf(stderr, "bench_sampling_gpu: no GPU (%s)\n", why.c_str());
    return 0;
  }
  return Run(reps);
}
