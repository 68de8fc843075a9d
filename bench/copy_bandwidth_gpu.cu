// Device copy bandwidth: the memory ceiling the attention benchmarks report ratios to.
// cudaMemcpyAsync device-to-device between two buffers (default 2 GiB each, several times the
// 50 MB L2), timed with CUDA events after a warm-up; median of the repeats. Bandwidth counts
// bytes read + bytes written (2 × buffer size per copy), as DESIGN.md's 4.22 TB/s does.
//   build/bench_copy_bandwidth_gpu [--bytes N] [--reps R]
// Prints one line: JSON {"kind":"copy",...}
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"

namespace {

// Fill with a non-zero pattern so no path can special-case zero pages.
__global__ void FillPattern(uint32_t* p, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (; i < n; i += stride) p[i] = static_cast<uint32_t>(i * 2654435761u) | 1u;
}

int Run(size_t bytes, int reps) {
  using llm::cuda::DeviceDescription;
  bytes &= ~static_cast<size_t>(255);
  void* src = nullptr;
  void* dst = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&src, bytes));
  LLM_CUDA_CHECK(cudaMalloc(&dst, bytes));
  FillPattern<<<1024, 256>>>(static_cast<uint32_t*>(src), bytes / 4);
  LLM_CUDA_CHECK(cudaGetLastError());
  LLM_CUDA_CHECK(cudaMemset(dst, 0x5a, bytes));
  LLM_CUDA_CHECK(cudaDeviceSynchronize());

  cudaEvent_t start, stop;
  LLM_CUDA_CHECK(cudaEventCreate(&start));
  LLM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) {  // warm-up
    LLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  }
  LLM_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> ms(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    // Alternate direction so neither buffer stays the read side (no cache reuse either way:
    // each buffer is far larger than L2).
    void* a = (r & 1) ? dst : src;
    void* b = (r & 1) ? src : dst;
    LLM_CUDA_CHECK(cudaEventRecord(start));
    LLM_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    LLM_CUDA_CHECK(cudaEventRecord(stop));
    LLM_CUDA_CHECK(cudaEventSynchronize(stop));
    LLM_CUDA_CHECK(cudaEventElapsedTime(&ms[static_cast<size_t>(r)], start, stop));
  }

  // Spot-check the copy really happened (last copy direction decides where the data is).
  const size_t probe_words = 4096;
  std::vector<uint32_t> h_src(probe_words), h_dst(probe_words);
  LLM_CUDA_CHECK(cudaMemcpy(h_src.data(), src, probe_words * 4, cudaMemcpyDeviceToHost));
  LLM_CUDA_CHECK(cudaMemcpy(h_dst.data(), dst, probe_words * 4, cudaMemcpyDeviceToHost));
  const bool ok = std::memcmp(h_src.data(), h_dst.data(), probe_words * 4) == 0;

  std::vector<float> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[sorted.size() / 2];
  const double best = sorted.front();
  const double moved = 2.0 * static_cast<double>(bytes);  // read + write
  std::printf(
      "JSON {\"kind\":\"copy\",\"variant\":\"cudaMemcpy_d2d\",\"device\":\"%s\","
      "\"bytes_per_copy\":%zu,\"reps\":%d,\"ms\":%.5f,\"best_ms\":%.5f,"
      "\"tb_per_s\":%.4f,\"best_tb_per_s\":%.4f,\"verified\":%s}\n",
      DeviceDescription().c_str(), bytes, reps, med, best, moved / (med * 1e-3) / 1e12,
      moved / (best * 1e-3) / 1e12, ok ? "true" : "false");
  std::fflush(stdout);

  LLM_CUDA_CHECK(cudaEventDestroy(start));
  LLM_CUDA_CHECK(cudaEventDestroy(stop));
  LLM_CUDA_CHECK(cudaFree(src));
  LLM_CUDA_CHECK(cudaFree(dst));
  if (!ok) {
    std::fprintf(stderr, "copy_bandwidth: destination differs from source\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{2} << 30;  // 2 GiB per buffer
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bytes" && i + 1 < argc) {
      bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--sanitize-small") {
      bytes = size_t{1} << 20;
      reps = 2;
    } else {
      std::fprintf(stderr, "usage: %s [--bytes N] [--reps R] [--sanitize-small]\n", argv[0]);
      return 2;
    }
  }
  try {
    std::string why;
    if (!llm::cuda::DeviceAvailable(&why)) {
      std::fprintf(stderr, "copy_bandwidth: %s\n", why.c_str());
      return 3;
    }
    return Run(bytes, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "copy_bandwidth: %s\n", e.what());
    return 1;
  }
}
