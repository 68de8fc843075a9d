// The compute ceiling the end-to-end benchmarks report ratios to: bf16 GEMM throughput of
// our own cuBLASLt path (engine/cuda/gemm.h, the one every linear layer takes), for a large
// square GEMM and for the Llama-3-8B layer shapes at prefill-sized token counts. Timed with
// CUDA events after a warm-up, median of the repeats.
//   build/bench_gemm_peak_gpu [--reps R]
// Prints lines: JSON {"kind":"gemm","n":..,"m":..,"k":..,"ms":..,"tflops":..}
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cuda/gemm.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/gemv.h"

namespace {

double TimeGemm(llm::cuda::Gemm& gemm, int64_t n, int64_t m, int64_t k, int reps) {
  void *x = nullptr, *w = nullptr, *y = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&x, size_t(n * k * 2)));
  LLM_CUDA_CHECK(cudaMalloc(&w, size_t(m * k * 2)));
  LLM_CUDA_CHECK(cudaMalloc(&y, size_t(n * m * 2)));
  llm::cuda::FillUniform(x, llm::DType::kBF16, n * k, 1.f, 1, nullptr);
  llm::cuda::FillUniform(w, llm::DType::kBF16, m * k, 1.f, 2, nullptr);
  cudaEvent_t start, stop;
  LLM_CUDA_CHECK(cudaEventCreate(&start));
  LLM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) {
    gemm.Linear(x, w, y, n, m, k, llm::DType::kBF16, llm::DType::kBF16, false, nullptr);
  }
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    LLM_CUDA_CHECK(cudaEventRecord(start));
    gemm.Linear(x, w, y, n, m, k, llm::DType::kBF16, llm::DType::kBF16, false, nullptr);
    LLM_CUDA_CHECK(cudaEventRecord(stop));
    LLM_CUDA_CHECK(cudaEventSynchronize(stop));
    LLM_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(r)], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms[ms.size() / 2];
}

// Batch-1 decode GEMVs: cuBLASLt (n = 1) against our fused GEMV (kernels/cuda/gemv.h), as
// weight-streaming bandwidth (bytes of W per second). The repeats rotate over copies of W
// totalling >= 256 MB, so that no repeat finds its weights in the 50 MB L2 (a first version
// reused one W and overstated both sides for the matrices that fit).
void TimeGemv(llm::cuda::Gemm& gemm, int64_t m, int64_t k, llm::cuda::GemvPrologue prologue,
              const char* name, int reps) {
  using llm::DType;
  void *x = nullptr, *w_all = nullptr, *y = nullptr;
  float* norm = nullptr;
  const int64_t w_bytes = m * k * 2;
  const int copies = int(std::max<int64_t>(2, (int64_t{256} << 20) / w_bytes + 1));
  LLM_CUDA_CHECK(cudaMalloc(&x, size_t(2 * k * 4)));
  LLM_CUDA_CHECK(cudaMalloc(&w_all, size_t(w_bytes * copies)));
  LLM_CUDA_CHECK(cudaMalloc(&y, size_t(m * 4)));
  LLM_CUDA_CHECK(cudaMalloc(&norm, size_t(k * 4)));
  llm::cuda::FillUniform(x, DType::kBF16, 2 * k, 1.f, 3, nullptr);
  llm::cuda::FillUniform(w_all, DType::kBF16, m * k * copies, 1.f, 4, nullptr);
  int rep = 0;
  llm::cuda::FillConstant(norm, DType::kF32, k, 1.f, nullptr);
  cudaEvent_t start, stop;
  LLM_CUDA_CHECK(cudaEventCreate(&start));
  LLM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int variant = 0; variant < 2; ++variant) {
    auto launch = [&] {
      const void* w = static_cast<const char*>(w_all) + (rep++ % copies) * w_bytes;
      if (variant == 0) {
        gemm.Linear(x, w, y, 1, m, k, DType::kBF16, DType::kBF16, false, nullptr);
      } else {
        llm::cuda::GemvArgs g;
        g.prologue = prologue;
        g.x = x;
        g.norm_weight = norm;
        g.w = w;
        g.y = y;
        g.n = 1;
        g.m = m;
        g.k = k;
        llm::cuda::Gemv(g, nullptr);
      }
    };
    for (int i = 0; i < 3; ++i) launch();
    std::vector<float> ms(static_cast<size_t>(reps));
    for (int r = 0; r < reps; ++r) {
      LLM_CUDA_CHECK(cudaEventRecord(start));
      launch();
      LLM_CUDA_CHECK(cudaEventRecord(stop));
      LLM_CUDA_CHECK(cudaEventSynchronize(stop));
      LLM_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(r)], start, stop));
    }
    std::sort(ms.begin(), ms.end());
    const double t = ms[ms.size() / 2];
    std::printf(
        "JSON {\"kind\":\"gemv\",\"name\":\"%s\",\"impl\":\"%s\",\"m\":%lld,\"k\":%lld,"
        "\"us\":%.2f,\"weight_tb_per_s\":%.3f}\n",
        name, variant == 0 ? "cublaslt_n1" : "fused_gemv", (long long)m, (long long)k, t * 1e3,
        double(m * k * 2) / (t * 1e-3) / 1e12);
  }
  cudaFree(x);
  cudaFree(w_all);
  cudaFree(y);
  cudaFree(norm);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  try {
    llm::cuda::Gemm gemm;
    struct Shape {
      int64_t n, m, k;
      const char* name;
    };
    const Shape shapes[] = {{8192, 8192, 8192, "square"},
                            {8192, 6144, 4096, "llama3_8b_qkv"},
                            {8192, 28672, 4096, "llama3_8b_gate_up"},
                            {8192, 4096, 14336, "llama3_8b_down"},
                            {2048, 28672, 4096, "llama3_8b_gate_up_2k"}};
    for (const Shape& s : shapes) {
      const double ms = TimeGemm(gemm, s.n, s.m, s.k, reps);
      const double tflops = 2.0 * double(s.n) * double(s.m) * double(s.k) / (ms * 1e-3) / 1e12;
      std::printf(
          "JSON {\"kind\":\"gemm\",\"name\":\"%s\",\"n\":%lld,\"m\":%lld,\"k\":%lld,"
          "\"ms\":%.4f,\"tflops\":%.1f,\"device\":\"%s\"}\n",
          s.name, (long long)s.n, (long long)s.m, (long long)s.k, ms, tflops,
          llm::cuda::DeviceDescription().c_str());
    }
    using P = llm::cuda::GemvPrologue;
    TimeGemv(gemm, 6144, 4096, P::kRmsNorm, "llama3_8b_qkv_n1", reps);
    TimeGemv(gemm, 28672, 4096, P::kRmsNorm, "llama3_8b_gate_up_n1", reps);
    TimeGemv(gemm, 4096, 14336, P::kSiluMul, "llama3_8b_down_n1", reps);
    TimeGemv(gemm, 4096, 4096, P::kNone, "llama3_8b_o_n1", reps);
    TimeGemv(gemm, 128256, 4096, P::kRmsNorm, "llama3_8b_lm_head_n1", reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_peak_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
