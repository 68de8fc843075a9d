// Batch-1 decode matvec throughput over a whole model's weight matrices (the work of one
// decode step minus attention): our cpu::Linear (f32 and bf16 weights) against llama2.c's
// matmul (f32, -Ofast, OpenMP) on the same matrices in the same run, plus the machine's
// read bandwidth. Prints JSON.   build/bench_matvec [tinyllama|110m] [repeats]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"

void NaiveMatvec(float* xout, const float* x, const float* w, int n, int d);

namespace {

struct Shape {
  int64_t rows, cols;
};

std::vector<Shape> ModelMatrices(const std::string& name) {
  // hidden, intermediate, layers, q heads*dim, kv dim, vocab
  const bool tiny = name == "tinyllama";
  const int64_t h = tiny ? 2048 : 768, inter = tiny ? 5632 : 2048, layers = tiny ? 22 : 12;
  const int64_t kv = tiny ? 256 : 768, vocab = 32000;
  std::vector<Shape> m;
  for (int64_t l = 0; l < layers; ++l) {
    for (Shape s : {Shape{h, h}, Shape{kv, h}, Shape{kv, h}, Shape{h, h}, Shape{inter, h},
                    Shape{inter, h}, Shape{h, inter}}) {
      m.push_back(s);
    }
  }
  m.push_back({vocab, h});
  return m;
}

template <typename Fn>
double BestSeconds(int repeats, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "tinyllama";
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::vector<Shape> shapes = ModelMatrices(model);
  int64_t total = 0, max_dim = 0;
  for (const Shape& s : shapes) {
    total += s.rows * s.cols;
    max_dim = std::max({max_dim, s.rows, s.cols});
  }
  std::vector<float> w32(static_cast<size_t>(total));
  std::vector<uint16_t> w16(static_cast<size_t>(total));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < total; ++i) {
    w32[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-4f - 0.05f;
    w16[i] = llm::F32ToBf16(w32[i]);
  }
  std::vector<float> x(static_cast<size_t>(max_dim), 0.5f), y(static_cast<size_t>(max_dim));
  auto run_ours = [&](llm::DType dtype) {
    int64_t off = 0;
    for (const Shape& s : shapes) {
      const void* data = dtype == llm::DType::kF32 ? static_cast<const void*>(&w32[off])
                                                   : static_cast<const void*>(&w16[off]);
      llm::cpu::Linear(x.data(), {dtype, data, s.rows, s.cols}, y.data(), 1);
      off += s.rows * s.cols;
    }
  };
  auto run_naive = [&] {
    int64_t off = 0;
    for (const Shape& s : shapes) {
      NaiveMatvec(y.data(), x.data(), &w32[off], int(s.cols), int(s.rows));
      off += s.rows * s.cols;
    }
  };
  // Interleave the contenders so bandwidth drift on a shared machine hits all alike.
  double naive = 1e30, ours32 = 1e30, ours16 = 1e30;
  for (int r = 0; r < repeats; ++r) {
    naive = std::min(naive, BestSeconds(1, run_naive));
    ours32 = std::min(ours32, BestSeconds(1, [&] { run_ours(llm::DType::kF32); }));
    ours16 = std::min(ours16, BestSeconds(1, [&] { run_ours(llm::DType::kBF16); }));
  }
  const double gb32 = total * 4 / 1e9, gb16 = total * 2 / 1e9;
  std::printf(
      "{\"model\": \"%s\", \"threads\": %d, \"weights_gb_f32\": %.3f,\n"
      " \"llama2c_matmul_f32\": {\"ms_per_token\": %.2f, \"tokens_per_s\": %.2f, \"gb_per_s\": "
      "%.1f},\n"
      " \"ours_f32\": {\"ms_per_token\": %.2f, \"tokens_per_s\": %.2f, \"gb_per_s\": %.1f},\n"
      " \"ours_bf16\": {\"ms_per_token\": %.2f, \"tokens_per_s\": %.2f, \"gb_per_s\": %.1f}}\n",
      model.c_str(), omp_get_max_threads(), gb32, naive * 1e3, 1 / naive, gb32 / naive,
      ours32 * 1e3, 1 / ours32, gb32 / ours32, ours16 * 1e3, 1 / ours16, gb16 / ours16);
  return 0;
}
