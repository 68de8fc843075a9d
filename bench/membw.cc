// Memory-bandwidth ceiling of this machine for the CPU decode roofline: streams a buffer far
// larger than the caches with every thread (read-only sum, as a decode step reads weights)
// and prints GB/s as JSON. Usage: build/bench_membw [MiB=2048] [repeats=5]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 2048;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const size_t n = mib * 1024 * 1024 / sizeof(float);
  std::vector<float> buf(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i & 1023);
  double best_read = 0, sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    double total = 0;
#pragma omp parallel reduction(+ : total)
    {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#pragma omp for schedule(static)
      for (size_t i = 0; i < n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(&buf[i]));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(&buf[i + 8]));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(&buf[i + 16]));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(&buf[i + 24]));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      for (float v : lanes) total += v;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_read = std::max(best_read, n * sizeof(float) / s / 1e9);
    sink += total;
  }
  std::printf("{\"read_gb_per_s\": %.2f, \"buffer_mib\": %zu, \"threads\": %d, \"sink\": %g}\n",
              best_read, mib, omp_get_max_threads(), sink > 0 ? 1.0 : 0.0);
  return 0;
}
