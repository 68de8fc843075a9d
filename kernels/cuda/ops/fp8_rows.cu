// FP8 (e4m3) activations with dynamic per-row scales (kernels/cuda/ops/model_ops.h):
// QuantizeRowsE4m3 (rows of bf16 / fp16 / fp32) and SiluMulE4m3 (silu(gate) · up of gate|up
// rows), one CTA per row through quantize_row.cuh's QuantizeRow, or, for many short rows (at
// least kWarpRowsMin rows of at most kQuantWarpChunks chunks: prefill-size steps), one warp per
// row through QuantizeRowWarp: cpu::QuantizeFp8Rows's rule bit for bit either way.
// (AddRmsNormE4m3, the third producer, is model_ops.cu's.)
// Test:  ninja -C build fp8_linear_gpu_test && (cd build && ctest -L gpu -R fp8_linear)
// Bench: none of its own (memory-bound, a small share of a W8A8 step).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/cuda/ops/ops_common.cuh"
#include "kernels/cuda/ops/quantize_row.cuh"

namespace llm::cuda {
namespace {

using ops_detail::Aligned16;
using ops_detail::CheckDType;
using ops_detail::kQuantThreads;
using ops_detail::kQuantWarpChunks;
using ops_detail::QuantizeRow;
using ops_detail::QuantizeRowWarp;

// The warp-per-row kernels from this many rows (fewer rows keep a CTA each: more threads per
// row where the rows are few, as in decode steps).
constexpr int64_t kWarpRowsMin = 256;
constexpr int kWarpRows = kQuantThreads / 32;  // rows per CTA of the warp kernels
using vec::kVec;

// N consecutive elements of T as loaded, before any conversion (16 bytes for 2-byte T at N = 8,
// two 16-byte loads for fp32).
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) RawChunk {
  static_assert(N == 1 || N == kVec, "a scalar or one 16-byte chunk of 2-byte values");
  T v[N];
};
template <typename T, int N>
__device__ __forceinline__ void LoadRaw(const T* p, RawChunk<T, N>& raw) {
  raw = *reinterpret_cast<const RawChunk<T, N>*>(p);
}
template <typename T, int N>
__device__ __forceinline__ void RawToF32(const RawChunk<T, N>& raw, float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      x[i] = raw.v[i];
    } else {
      x[i] = vec::ToF32(raw.v[i]);
    }
  }
}

// Sources (quantize_row.cuh): a row of T (bf16 / fp16 / fp32); silu(gate) * up of a gate|up
// row. Both split their loads from their math (kSplit), so that a thread's loads of a row
// are in flight together.
template <typename T, int N>
struct RowSource {
  // (fp32 rows, the weights at load, stay chunk by chunk: their raw chunks are twice as wide and
  // would spill the warp kernel's registers)
  static constexpr bool kSplit = !std::is_same_v<T, float>;
  using Raw = RawChunk<T, N>;
  const T* row;
  __device__ void Fetch(int64_t c, Raw& raw) const { LoadRaw<T, N>(row + c * N, raw); }
  __device__ void Make(const Raw& raw, float (&x)[N]) const { RawToF32<T, N>(raw, x); }
  __device__ void operator()(int64_t c, float (&x)[N]) const {
    Raw raw;
    Fetch(c, raw);
    Make(raw, x);
  }
};

// silu with the fast exponential and division (__expf, __fdividef: a relative error of a few
// 1e-6 where e4m3's step is 1/16; vLLM builds its kernels with --use_fast_math): with IEEE
// expf and division the math, not the memory, bounded SiluMulE4m3 (bench/fp8_rows_gpu.cu:
// 20.4 -> about 14 us at 512 x 14,336 on the H100, the bytes' copy time 12.1). One difference
// beyond rounding: for gate in about [-88.7, -87.3], 1 + exp(-gate) lies in (2^126, 2^128),
// where __fdividef returns 0 (IEEE: about -1e-36 · up).
template <typename T, int N>
struct SiluMulSource {
  static constexpr bool kSplit = true;
  struct Raw {
    RawChunk<T, N> gate, up;
  };
  const T* gate;  // the row's gate half; up = gate + inter
  int64_t inter;
  __device__ void Fetch(int64_t c, Raw& raw) const {
    LoadRaw<T, N>(gate + c * N, raw.gate);
    LoadRaw<T, N>(gate + inter + c * N, raw.up);
  }
  __device__ void Make(const Raw& raw, float (&x)[N]) const {
    float u[N];
    RawToF32<T, N>(raw.gate, x);
    RawToF32<T, N>(raw.up, u);
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] = __fdividef(x[j], 1.f + __expf(-x[j])) * u[j];
  }
  __device__ void operator()(int64_t c, float (&x)[N]) const {
    Raw raw;
    Fetch(c, raw);
    Make(raw, x);
  }
};

template <typename T, int N>
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeRowsKernel(const T* __restrict__ in, int64_t cols, uint8_t* __restrict__ codes,
                       float* __restrict__ scales, int* nonfinite) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const int64_t r = blockIdx.x;
  QuantizeRow<N>(RowSource<T, N>{in + r * cols}, cols / N, codes + r * cols, scales + r, nonfinite);
}

template <typename T, int N>
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeRowsWarpKernel(const T* __restrict__ in, int64_t rows, int64_t cols,
                           uint8_t* __restrict__ codes, float* __restrict__ scales,
                           int* nonfinite) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const int64_t r = int64_t(blockIdx.x) * kWarpRows + threadIdx.x / 32;
  if (r >= rows) return;  // a whole warp
  QuantizeRowWarp<N>(RowSource<T, N>{in + r * cols}, cols / N, codes + r * cols, scales + r,
                     nonfinite);
}

template <typename T, int N>
__global__ void __launch_bounds__(kQuantThreads)
    SiluMulE4m3WarpKernel(const T* __restrict__ gate_up, int64_t rows, int64_t inter,
                          uint8_t* __restrict__ codes, float* __restrict__ scales) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const int64_t t = int64_t(blockIdx.x) * kWarpRows + threadIdx.x / 32;
  if (t >= rows) return;  // a whole warp
  QuantizeRowWarp<N>(SiluMulSource<T, N>{gate_up + t * 2 * inter, inter}, inter / N,
                     codes + t * inter, scales + t, nullptr);
}

template <typename T, int N>
__global__ void __launch_bounds__(kQuantThreads)
    SiluMulE4m3Kernel(const T* __restrict__ gate_up, int64_t inter, uint8_t* __restrict__ codes,
                      float* __restrict__ scales) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const int64_t t = blockIdx.x;
  QuantizeRow<N>(SiluMulSource<T, N>{gate_up + t * 2 * inter, inter}, inter / N, codes + t * inter,
                 scales + t, nullptr);
}

template <typename T>
void LaunchQuantizeRows(const void* in, int64_t rows, int64_t cols, uint8_t* codes, float* scales,
                        int* nonfinite, bool vec, cudaStream_t stream) {
  const T* p = static_cast<const T*>(in);
  const unsigned warp_grid = unsigned((rows + kWarpRows - 1) / kWarpRows);
  if (rows >= kWarpRowsMin && cols / (vec ? kVec : 1) <= kQuantWarpChunks) {
    if (vec) {
      Launch(QuantizeRowsWarpKernel<T, kVec>, dim3(warp_grid), dim3(kQuantThreads), 0, stream, p,
             rows, cols, codes, scales, nonfinite);
    } else {
      Launch(QuantizeRowsWarpKernel<T, 1>, dim3(warp_grid), dim3(kQuantThreads), 0, stream, p, rows,
             cols, codes, scales, nonfinite);
    }
    return;
  }
  if (vec) {
    Launch(QuantizeRowsKernel<T, kVec>, dim3(unsigned(rows)), dim3(kQuantThreads), 0, stream, p,
           cols, codes, scales, nonfinite);
  } else {
    Launch(QuantizeRowsKernel<T, 1>, dim3(unsigned(rows)), dim3(kQuantThreads), 0, stream, p, cols,
           codes, scales, nonfinite);
  }
}

template <typename T>
void LaunchSiluMulE4m3(const void* gate_up, uint8_t* out, float* out_scale, int64_t num_tokens,
                       int64_t inter, bool vec, cudaStream_t stream) {
  const T* p = static_cast<const T*>(gate_up);
  const unsigned warp_grid = unsigned((num_tokens + kWarpRows - 1) / kWarpRows);
  if (num_tokens >= kWarpRowsMin && inter / (vec ? kVec : 1) <= kQuantWarpChunks) {
    if (vec) {
      Launch(SiluMulE4m3WarpKernel<T, kVec>, dim3(warp_grid), dim3(kQuantThreads), 0, stream, p,
             num_tokens, inter, out, out_scale);
    } else {
      Launch(SiluMulE4m3WarpKernel<T, 1>, dim3(warp_grid), dim3(kQuantThreads), 0, stream, p,
             num_tokens, inter, out, out_scale);
    }
    return;
  }
  if (vec) {
    Launch(SiluMulE4m3Kernel<T, kVec>, dim3(unsigned(num_tokens)), dim3(kQuantThreads), 0, stream,
           p, inter, out, out_scale);
  } else {
    Launch(SiluMulE4m3Kernel<T, 1>, dim3(unsigned(num_tokens)), dim3(kQuantThreads), 0, stream, p,
           inter, out, out_scale);
  }
}

}  // namespace

void QuantizeRowsE4m3(const void* in, DType dtype, int64_t rows, int64_t cols, uint8_t* codes,
                      float* scales, int* nonfinite, cudaStream_t stream) {
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) {
    throw std::invalid_argument("QuantizeRowsE4m3: dtype must be BF16, F16 or F32, got " +
                                std::string(DTypeName(dtype)));
  }
  if (rows <= 0 || cols <= 0) return;
  const bool vec = cols % kVec == 0 && Aligned16(in) && reinterpret_cast<uintptr_t>(codes) % 8 == 0;
  if (dtype == DType::kBF16) {
    LaunchQuantizeRows<__nv_bfloat16>(in, rows, cols, codes, scales, nonfinite, vec, stream);
  } else if (dtype == DType::kF16) {
    LaunchQuantizeRows<__half>(in, rows, cols, codes, scales, nonfinite, vec, stream);
  } else {
    LaunchQuantizeRows<float>(in, rows, cols, codes, scales, nonfinite, vec, stream);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

void SiluMulE4m3(const void* gate_up, uint8_t* out, float* out_scale, int64_t num_tokens,
                 int64_t inter, DType dtype, cudaStream_t stream) {
  CheckDType(dtype, "SiluMulE4m3");
  if (num_tokens <= 0 || inter <= 0) return;
  const bool vec =
      inter % kVec == 0 && Aligned16(gate_up) && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  if (dtype == DType::kBF16) {
    LaunchSiluMulE4m3<__nv_bfloat16>(gate_up, out, out_scale, num_tokens, inter, vec, stream);
  } else {
    LaunchSiluMulE4m3<__half>(gate_up, out, out_scale, num_tokens, inter, vec, stream);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llm::cuda
