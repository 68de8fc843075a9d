// Small-batch GEMV with fused prologues (design in gemv.h).
// Instantiations: {bf16, fp16} × {kNone, kRmsNorm, kSiluMul} × N ∈ {1, 2, 4, 8} = 24.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"

namespace llm::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerCta = kWarps * kRowsPerWarp;

template <typename T>
struct Pack;  // 8 elements of T in a uint4
template <>
struct Pack<__nv_bfloat16> {
  __device__ static void ToFloat(const uint4& v, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 p = __bfloat1622float2(h[i]);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
  __device__ static float Round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
  __device__ static __nv_bfloat16 From(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Pack<__half> {
  __device__ static void ToFloat(const uint4& v, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 p = __half22float2(h[i]);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
  __device__ static float Round(float x) { return __half2float(__float2half_rn(x)); }
  __device__ static __half From(float x) { return __float2half_rn(x); }
};

// The weights are read exactly once: stream them past L1.
__device__ __forceinline__ uint4 LoadStream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The 8 activations of chunk c (elements 8c … 8c+7) of token t, after the prologue.
template <typename T, GemvPrologue P>
__device__ __forceinline__ void LoadA(const GemvArgs& a, const float* inv_rms, int t, int c,
                                      float* out) {
  if constexpr (P == GemvPrologue::kNone) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + t * a.k + 8 * c);
    Pack<T>::ToFloat(v, out);
  } else if constexpr (P == GemvPrologue::kRmsNorm) {
    const float4* x = reinterpret_cast<const float4*>(static_cast<const float*>(a.x) + t * a.k) +
                      2 * c;
    const float4* g = reinterpret_cast<const float4*>(a.norm_weight) + 2 * c;
    const float4 x0 = x[0], x1 = x[1], g0 = g[0], g1 = g[1];
    const float r = inv_rms[t];
    const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const float gs[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = Pack<T>::Round(gs[i] * (xs[i] * r));
  } else {
    const T* row = static_cast<const T*>(a.x) + t * 2 * a.k;
    float g[8], u[8];
    Pack<T>::ToFloat(*reinterpret_cast<const uint4*>(row + 8 * c), g);
    Pack<T>::ToFloat(*reinterpret_cast<const uint4*>(row + a.k + 8 * c), u);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = Pack<T>::Round(g[i] / (1.f + __expf(-g[i])) * u[i]);
  }
}

template <typename T, GemvPrologue P, int N>
__global__ void __launch_bounds__(kThreads) GemvKernel(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = static_cast<int>(a.n);
  __shared__ float inv_rms[N];
  if constexpr (P == GemvPrologue::kRmsNorm) {
    // Every token's inverse RMS over its fp32 residual row (as cpu::RmsNorm): the whole CTA
    // reduces, 16-byte loads, one pass for all tokens.
    __shared__ float partial[kWarps][N];
    float s[N];
#pragma unroll
    for (int t = 0; t < N; ++t) s[t] = 0.f;
    const int64_t quads = a.k / 4;
    for (int64_t i = threadIdx.x; i < quads; i += kThreads) {
#pragma unroll
      for (int t = 0; t < N; ++t) {
        if (t < n) {
          const float4 v =
              reinterpret_cast<const float4*>(static_cast<const float*>(a.x) + t * a.k)[i];
          s[t] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
      }
    }
#pragma unroll
    for (int t = 0; t < N; ++t) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s[t] += __shfl_xor_sync(0xffffffffu, s[t], o);
      if (lane == 0) partial[warp][t] = s[t];
    }
    __syncthreads();
    if (threadIdx.x < N) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += partial[w][threadIdx.x];
      inv_rms[threadIdx.x] = rsqrtf(total / static_cast<float>(a.k) + a.eps);
    }
    __syncthreads();
  }
  // Each warp: kRowsPerWarp consecutive output rows, so that every activation chunk (and its
  // prologue) is computed once for several weight rows.
  const int64_t j0 = (int64_t(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  if (j0 >= a.m) return;
  const uint4* wrow[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = j0 + r < a.m ? j0 + r : j0;  // a missing last row re-reads row j0
    wrow[r] = reinterpret_cast<const uint4*>(static_cast<const T*>(a.w) + j * a.k);
  }
  const int chunks = static_cast<int>(a.k / 8);
  float acc[kRowsPerWarp][N];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] = 0.f;
  }
  auto fma_chunk = [&](const uint4 (&wv)[kRowsPerWarp], int c) {
    float wf[kRowsPerWarp][8];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) Pack<T>::ToFloat(wv[r], wf[r]);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t < n) {
        float af[8];
        LoadA<T, P>(a, inv_rms, t, c, af);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][t] = fmaf(af[i], wf[r][i], acc[r][t]);
        }
      }
    }
  };
  int c = lane;
  for (; c + 32 < chunks; c += 64) {  // 2 chunks × kRowsPerWarp rows of loads in flight
    uint4 w0[kRowsPerWarp], w1[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      w0[r] = LoadStream(wrow[r] + c);
      w1[r] = LoadStream(wrow[r] + c + 32);
    }
    fma_chunk(w0, c);
    fma_chunk(w1, c + 32);
  }
  if (c < chunks) {
    uint4 w0[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) w0[r] = LoadStream(wrow[r] + c);
    fma_chunk(w0, c);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = j0 + r;
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float s = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0 && t < n && j < a.m) {
        if (a.accumulate) {
          static_cast<float*>(a.y)[t * a.m + j] += s;
        } else if (a.y_f32) {
          static_cast<float*>(a.y)[t * a.m + j] = s;
        } else {
          static_cast<T*>(a.y)[t * a.m + j] = Pack<T>::From(s);
        }
      }
    }
  }
}

template <typename T, GemvPrologue P>
void LaunchN(const GemvArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.m + kRowsPerCta - 1) / kRowsPerCta));
  if (a.n <= 1) {
    GemvKernel<T, P, 1><<<grid, kThreads, 0, stream>>>(a);
  } else if (a.n <= 2) {
    GemvKernel<T, P, 2><<<grid, kThreads, 0, stream>>>(a);
  } else if (a.n <= 4) {
    GemvKernel<T, P, 4><<<grid, kThreads, 0, stream>>>(a);
  } else {
    GemvKernel<T, P, 8><<<grid, kThreads, 0, stream>>>(a);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void LaunchT(const GemvArgs& a, cudaStream_t stream) {
  switch (a.prologue) {
    case GemvPrologue::kNone:
      return LaunchN<T, GemvPrologue::kNone>(a, stream);
    case GemvPrologue::kRmsNorm:
      return LaunchN<T, GemvPrologue::kRmsNorm>(a, stream);
    case GemvPrologue::kSiluMul:
      return LaunchN<T, GemvPrologue::kSiluMul>(a, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GemvSupports(const GemvArgs& a) {
  return a.n >= 1 && a.n <= kGemvMaxTokens && a.k > 0 && a.k % 8 == 0 && a.m > 0 &&
         (a.dtype == DType::kBF16 || a.dtype == DType::kF16) && Aligned16(a.x) &&
         Aligned16(a.w) && (a.prologue != GemvPrologue::kRmsNorm || Aligned16(a.norm_weight));
}

void Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (!GemvSupports(a)) {
    throw std::invalid_argument("Gemv: unsupported shape n=" + std::to_string(a.n) + " m=" +
                                std::to_string(a.m) + " k=" + std::to_string(a.k) +
                                " (n in [1, 8], k % 8 == 0, 16-byte aligned, bf16/f16)");
  }
  if (a.dtype == DType::kBF16) {
    LaunchT<__nv_bfloat16>(a, stream);
  } else {
    LaunchT<__half>(a, stream);
  }
}

}  // namespace llm::cuda
