// The e4m3 row producers of a W8A8 decode step (kernels/cuda/ops/fp8_rows.cu's SiluMulE4m3 and
// QuantizeRowsE4m3, model_ops.cu's AddRmsNormE4m3) timed alone at decode-step shapes (Llama-3-8B:
// hidden 4,096, intermediate 14,336; rows 64 ... 1,024), beside the time their bytes take at the
// copy bandwidth (cudaMemcpy device to device, measured here), and beside variants of the row
// quantizer written in this file (threads per row, loads issued before any math, the hardware
// e4m3 conversion, ...), each checked against the library's codes and scales bit for bit (a
// variant that is not exact says how many codes differ). "warm": the same input every launch
// (it stays in L2, as a GEMM's output just written is); "cold": inputs rotate over more than L2.
//   build/bench_fp8_rows_gpu [--reps R]
// Prints one JSON line per (op, variant, rows, warm|cold): {"kind":"fp8_rows",...}
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/cuda/ops/quantize_row.cuh"
#include "kernels/fp8.h"

namespace {

using bf16 = __nv_bfloat16;
using llm::cuda::vec::Load;

constexpr int kN = 8;  // values per 16-byte chunk of bf16

// x / scale as e4m3 codes, N = 8: the library's software rule, or the hardware conversion
// (cvt.rn.satfinite.e4m3x2.f32: nearest even, saturating to 448).
template <bool kHw>
__device__ __forceinline__ void StoreCodes(uint8_t* dst, const float (&x)[kN], float scale,
                                           bool recip) {
  const float r = 1.f / scale;
  float q[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) q[i] = recip ? x[i] * r : x[i] / scale;
  uint2 packed;
  if constexpr (kHw) {
    uint32_t w[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t lo =
          __nv_cvt_float2_to_fp8x2(make_float2(q[4 * k], q[4 * k + 1]), __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(q[4 * k + 2], q[4 * k + 3]),
                                                   __NV_SATFINITE, __NV_E4M3);
      w[k] = (lo & 0xffffu) | (hi << 16);
    }
    packed = make_uint2(w[0], w[1]);
  } else {
    uint8_t c[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) c[i] = llm::F32ToE4m3(q[i]);
    memcpy(&packed, c, 8);
  }
  *reinterpret_cast<uint2*>(dst) = packed;
}

// One CTA of kThreads per row, kCached chunks per thread held in registers (the row must fit:
// cols / 8 <= kThreads · kCached).
template <int kThreads, int kCached, bool kSilu, bool kLoadFirst, bool kHw, bool kRecip,
          bool kFastSilu>
__global__ void __launch_bounds__(kThreads)
    RowsVariantKernel(const bf16* __restrict__ in, int64_t cols, uint8_t* __restrict__ codes,
                      float* __restrict__ scales) {
  const int64_t r = blockIdx.x;
  const int64_t nc = cols / kN;
  const bf16* a = in + r * cols * (kSilu ? 2 : 1);
  const bf16* b = a + cols;
  float x[kCached][kN];
  float amax = 0.f;
  auto math = [&](const uint4& ra, const uint4& rb, float(&out)[kN]) {
    const bf16* ea = reinterpret_cast<const bf16*>(&ra);
    const bf16* eb = reinterpret_cast<const bf16*>(&rb);
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const float g = __bfloat162float(ea[i]);
      if constexpr (kSilu) {
        const float u = __bfloat162float(eb[i]);
        out[i] = kFastSilu ? __fdividef(g, 1.f + __expf(-g)) * u : g / (1.f + expf(-g)) * u;
      } else {
        out[i] = g;
      }
      amax = fmaxf(amax, fabsf(out[i]));
    }
  };
  if constexpr (kLoadFirst) {
    uint4 ra[kCached], rb[kCached];
#pragma unroll
    for (int j = 0; j < kCached; ++j) {
      const int64_t c = threadIdx.x + int64_t(j) * kThreads;
      if (c < nc) {
        ra[j] = *reinterpret_cast<const uint4*>(a + c * kN);
        if constexpr (kSilu) rb[j] = *reinterpret_cast<const uint4*>(b + c * kN);
      }
    }
#pragma unroll
    for (int j = 0; j < kCached; ++j) {
      const int64_t c = threadIdx.x + int64_t(j) * kThreads;
      if (c < nc) math(ra[j], rb[j], x[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kCached; ++j) {
      const int64_t c = threadIdx.x + int64_t(j) * kThreads;
      if (c < nc) {
        const uint4 ra = *reinterpret_cast<const uint4*>(a + c * kN);
        const uint4 rb = kSilu ? *reinterpret_cast<const uint4*>(b + c * kN) : ra;
        math(ra, rb, x[j]);
      }
    }
  }
  amax = llm::cuda::ops_detail::QuantBlockMax<kThreads>(amax);
  const float scale = amax > 0.f ? amax / llm::kE4m3Max : 1.f;
  if (threadIdx.x == 0) scales[r] = scale;
#pragma unroll
  for (int j = 0; j < kCached; ++j) {
    const int64_t c = threadIdx.x + int64_t(j) * kThreads;
    if (c < nc) StoreCodes<kHw>(codes + r * cols + c * kN, x[j], scale, kRecip);
  }
}

using Launcher = void (*)(const bf16*, int64_t, int64_t, uint8_t*, float*, cudaStream_t);

template <int kThreads, int kCached, bool kSilu, bool kLoadFirst, bool kHw, bool kRecip = false,
          bool kFastSilu = false>
void LaunchVariant(const bf16* in, int64_t rows, int64_t cols, uint8_t* codes, float* scales,
                   cudaStream_t s) {
  RowsVariantKernel<kThreads, kCached, kSilu, kLoadFirst, kHw, kRecip, kFastSilu>
      <<<unsigned(rows), kThreads, 0, s>>>(in, cols, codes, scales);
}

struct Impl {
  std::string name;
  Launcher launch;  // null: the library's
};

// gate|up rows (silu) or plain rows: the library's call.
void LaunchLibrary(bool silu, const bf16* in, int64_t rows, int64_t cols, uint8_t* codes,
                   float* scales, cudaStream_t s) {
  if (silu) {
    llm::cuda::SiluMulE4m3(in, codes, scales, rows, cols, llm::DType::kBF16, s);
  } else {
    llm::cuda::QuantizeRowsE4m3(in, llm::DType::kBF16, rows, cols, codes, scales, nullptr, s);
  }
}

float TimeMs(cudaStream_t s, int reps, const std::function<void(int)>& launch) {
  cudaEvent_t a, b;
  LLM_CUDA_CHECK(cudaEventCreate(&a));
  LLM_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch(i);
  std::vector<float> t;
  for (int k = 0; k < 5; ++k) {
    LLM_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < reps; ++i) launch(i);
    LLM_CUDA_CHECK(cudaEventRecord(b, s));
    LLM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.f;
    LLM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / float(reps));
  }
  LLM_CUDA_CHECK(cudaEventDestroy(a));
  LLM_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int Run(int reps) {
  cudaStream_t s;
  LLM_CUDA_CHECK(cudaStreamCreate(&s));
  cudaDeviceProp prop{};
  LLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int64_t hidden = 4096, inter = 14336, max_rows = 1024;
  constexpr int kBufs = 6;  // rotating inputs: 6 x 58.7 MB (silu at 1,024 rows) > L2
  const size_t in_elems = size_t(max_rows) * 2 * inter;
  std::vector<bf16> h(in_elems);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& v : h) v = __float2bfloat16(normal(rng));
  bf16* in[kBufs];
  for (auto& p : in) {
    LLM_CUDA_CHECK(cudaMalloc(&p, in_elems * sizeof(bf16)));
    LLM_CUDA_CHECK(cudaMemcpy(p, h.data(), in_elems * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  uint8_t *codes, *ref_codes;
  float *scales, *ref_scales;
  LLM_CUDA_CHECK(cudaMalloc(&codes, size_t(max_rows) * inter));
  LLM_CUDA_CHECK(cudaMalloc(&ref_codes, size_t(max_rows) * inter));
  LLM_CUDA_CHECK(cudaMalloc(&scales, max_rows * sizeof(float)));
  LLM_CUDA_CHECK(cudaMalloc(&ref_scales, max_rows * sizeof(float)));
  // The copy bandwidth (one 1 GiB device-to-device copy, best of 5).
  float copy_tbps = 0.f;
  {
    const size_t bytes = size_t(1) << 30;
    void *x, *y;
    LLM_CUDA_CHECK(cudaMalloc(&x, bytes));
    LLM_CUDA_CHECK(cudaMalloc(&y, bytes));
    const float ms = TimeMs(s, 3, [&](int) { cudaMemcpyAsync(y, x, bytes, cudaMemcpyDefault, s); });
    copy_tbps = float(2.0 * bytes / (ms * 1e-3) / 1e12);
    cudaFree(x);
    cudaFree(y);
  }
  std::printf("# %s, copy %.3f TB/s\n", prop.name, copy_tbps);

  // AddRmsNormE4m3 (residual fp32 += delta bf16, the normalized row as e4m3), library only.
  {
    float *res, *w;
    LLM_CUDA_CHECK(cudaMalloc(&res, size_t(max_rows) * hidden * sizeof(float)));
    LLM_CUDA_CHECK(cudaMalloc(&w, hidden * sizeof(float)));
    LLM_CUDA_CHECK(cudaMemset(res, 0, size_t(max_rows) * hidden * sizeof(float)));
    std::vector<float> hw(size_t(hidden), 1.f);
    LLM_CUDA_CHECK(cudaMemcpy(w, hw.data(), hidden * sizeof(float), cudaMemcpyHostToDevice));
    for (int64_t rows : {64, 256, 512, 1024}) {
      const double bytes = double(rows) * hidden * (4 + 2 + 4 + 1);
      const float ms = TimeMs(s, reps, [&](int i) {
        llm::cuda::AddRmsNormE4m3(res, in[i % kBufs], w, codes, scales, llm::DType::kBF16, nullptr,
                                  rows, hidden, 1e-5f, s);
      });
      std::printf(
          "{\"kind\":\"fp8_rows\",\"op\":\"add_rms_norm_e4m3\",\"variant\":\"library\",\"rows\":%"
          "lld,"
          "\"cols\":%lld,\"inputs\":\"cold\",\"us\":%.2f,\"bytes\":%.0f,\"copy_us\":%.2f,"
          "\"ratio_to_copy\":%.3f}\n",
          (long long)rows, (long long)hidden, ms * 1e3, bytes, bytes / (copy_tbps * 1e12) * 1e6,
          bytes / (copy_tbps * 1e12) / (ms * 1e-3));
    }
    cudaFree(res);
    cudaFree(w);
  }

  for (bool silu : {true, false}) {
    const int64_t cols = silu ? inter : hidden;
    std::vector<Impl> impls = {{"library", nullptr}};
    if (silu) {
      impls.push_back({"t256_c7", LaunchVariant<256, 7, true, false, false>});
      impls.push_back({"t256_c7_loadfirst", LaunchVariant<256, 7, true, true, false>});
      impls.push_back({"t256_c7_hw", LaunchVariant<256, 7, true, false, true>});
      impls.push_back({"t256_c7_loadfirst_hw", LaunchVariant<256, 7, true, true, true>});
      impls.push_back({"t512_c4_loadfirst_hw", LaunchVariant<512, 4, true, true, true>});
      impls.push_back({"t1024_c2_loadfirst_hw", LaunchVariant<1024, 2, true, true, true>});
      impls.push_back(
          {"t256_c7_loadfirst_hw_recip", LaunchVariant<256, 7, true, true, true, true>});
      impls.push_back({"t256_c7_loadfirst_hw_recip_fastsilu",
                       LaunchVariant<256, 7, true, true, true, true, true>});
      impls.push_back({"t512_c4_loadfirst_hw_recip_fastsilu",
                       LaunchVariant<512, 4, true, true, true, true, true>});
    } else {
      impls.push_back({"t256_c2", LaunchVariant<256, 2, false, false, false>});
      impls.push_back({"t256_c2_loadfirst_hw", LaunchVariant<256, 2, false, true, true>});
      impls.push_back({"t128_c4_loadfirst_hw", LaunchVariant<128, 4, false, true, true>});
      impls.push_back({"t512_c1_loadfirst_hw", LaunchVariant<512, 1, false, true, true>});
      impls.push_back({"t64_c8_loadfirst_hw", LaunchVariant<64, 8, false, true, true>});
    }
    for (int64_t rows : {64, 256, 512, 1024}) {
      LaunchLibrary(silu, in[0], rows, cols, ref_codes, ref_scales, s);
      std::vector<uint8_t> ref_c(static_cast<size_t>(rows * cols)), got_c(ref_c.size());
      std::vector<float> ref_s(static_cast<size_t>(rows)), got_s(ref_s.size());
      LLM_CUDA_CHECK(cudaMemcpy(ref_c.data(), ref_codes, ref_c.size(), cudaMemcpyDeviceToHost));
      LLM_CUDA_CHECK(
          cudaMemcpy(ref_s.data(), ref_scales, rows * sizeof(float), cudaMemcpyDeviceToHost));
      const double bytes = double(rows) * cols * ((silu ? 4 : 2) + 1);
      for (const Impl& impl : impls) {
        auto launch = [&](const bf16* x) {
          if (impl.launch == nullptr) {
            LaunchLibrary(silu, x, rows, cols, codes, scales, s);
          } else {
            impl.launch(x, rows, cols, codes, scales, s);
          }
        };
        LLM_CUDA_CHECK(cudaMemset(codes, 0, size_t(rows * cols)));
        launch(in[0]);
        LLM_CUDA_CHECK(cudaGetLastError());
        LLM_CUDA_CHECK(cudaMemcpy(got_c.data(), codes, got_c.size(), cudaMemcpyDeviceToHost));
        LLM_CUDA_CHECK(
            cudaMemcpy(got_s.data(), scales, rows * sizeof(float), cudaMemcpyDeviceToHost));
        int64_t diff_codes = 0, diff_scales = 0;
        for (size_t i = 0; i < got_c.size(); ++i) diff_codes += got_c[i] != ref_c[i];
        for (size_t i = 0; i < got_s.size(); ++i)
          diff_scales += std::memcmp(&got_s[i], &ref_s[i], 4) != 0;
        for (bool warm : {true, false}) {
          const float ms = TimeMs(s, reps, [&](int i) { launch(in[warm ? 0 : i % kBufs]); });
          std::printf(
              "{\"kind\":\"fp8_rows\",\"op\":\"%s\",\"variant\":\"%s\",\"rows\":%lld,\"cols\":%lld,"
              "\"inputs\":\"%s\",\"us\":%.2f,\"bytes\":%.0f,\"copy_us\":%.2f,\"ratio_to_copy\":%."
              "3f,"
              "\"codes_differing\":%lld,\"scales_differing\":%lld}\n",
              silu ? "silu_mul_e4m3" : "quantize_rows_e4m3", impl.name.c_str(), (long long)rows,
              (long long)cols, warm ? "warm" : "cold", ms * 1e3, bytes,
              bytes / (copy_tbps * 1e12) * 1e6, bytes / (copy_tbps * 1e12) / (ms * 1e-3),
              (long long)diff_codes, (long long)diff_scales);
        }
      }
    }
  }
  for (auto& p : in) cudaFree(p);
  cudaFree(codes);
  cudaFree(ref_codes);
  cudaFree(scales);
  cudaFree(ref_scales);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 50;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::atoi(argv[++i]);
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "bench_fp8_rows_gpu: no CUDA device\n");
    return 0;
  }
  return Run(reps);
}
