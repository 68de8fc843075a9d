// KV append on the GPU: writes the new tokens' keys and values into the paged pools
// (layout kernels/paged_kv.h), the CUDA twin of cpu::AppendKv (kernels/cpu/flash_attention.h).
// One thread per 16-byte chunk of a (token, kv_head) row of K and of V, a grid-stride loop;
// a negative slot skips the token (padding). Memory-bound and tiny next to attention:
// num_tokens × kv_dim elements against attention's num_tokens × context reads. Rows whose
// byte size or pointers are not 16-byte aligned fall back to 2-byte chunks.
// Test:  ninja -C build decode_attention_gpu_test &&
//        (cd build && ctest -L gpu -R decode_attention)   (the AppendKv round trip)
//        e4m3 caches: the kv_fp8*_gpu_test targets, then ctest -L gpu -R kv_fp8 (AppendKvFp8Gpu)
// Bench: none of its own (tiny next to attention, above).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/fp8.h"

namespace llm::cuda {
namespace {

// V: the copy unit (uint4 = 16 bytes, or uint16_t). Strides are in units of V.
//   k, v: [num_tokens, num_kv_heads, units_per_row]; kc, vc: the pools.
template <typename V>
__global__ void AppendKvKernel(const V* __restrict__ k, const V* __restrict__ v,
                               const int64_t* __restrict__ slot_mapping, int64_t num_tokens,
                               int num_kv_heads, int units_per_row, int64_t block_size,
                               int64_t block_stride, int64_t head_stride, V* __restrict__ kc,
                               V* __restrict__ vc) {
  const int64_t total = num_tokens * num_kv_heads * units_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t unit = i % units_per_row;
    const int64_t token_head = i / units_per_row;
    const int64_t head = token_head % num_kv_heads;
    const int64_t token = token_head / num_kv_heads;
    const int64_t slot = slot_mapping[token];
    if (slot < 0) continue;
    const int64_t dst = (slot / block_size) * block_stride + head * head_stride +
                        (slot % block_size) * units_per_row + unit;
    kc[dst] = k[i];
    vc[dst] = v[i];
  }
}

template <typename V>
void Launch(const void* k, const void* v, const int64_t* slot_mapping, int64_t num_tokens,
            const PagedKvView<void>& kv, size_t row_bytes, cudaStream_t stream) {
  const PagedKvLayout& layout = kv.layout;
  const int units = static_cast<int>(row_bytes / sizeof(V));
  const int64_t elem_bytes = static_cast<int64_t>(row_bytes) / layout.head_dim;
  // Pool strides in units of V (row_bytes is a multiple of sizeof(V), so these are exact).
  const int64_t block_stride = layout.block_stride() * elem_bytes / int64_t(sizeof(V));
  const int64_t head_stride = layout.head_stride() * elem_bytes / int64_t(sizeof(V));
  const int64_t total = num_tokens * layout.num_kv_heads * units;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 65536);
  AppendKvKernel<V><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const V*>(k), static_cast<const V*>(v), slot_mapping, num_tokens,
      static_cast<int>(layout.num_kv_heads), units, layout.block_size, block_stride, head_stride,
      static_cast<V*>(kv.k), static_cast<V*>(kv.v));
  LLM_CUDA_CHECK(cudaGetLastError());
}

// FP8 pools: one thread per element pair (k and v of one (token, head, dim)), quantized as
// F32ToE4m3(float(x) / scale), the bit-exact rule of cpu::AppendKv's fp8 overload.
template <typename T>
__global__ void AppendKvFp8Kernel(const T* __restrict__ k, const T* __restrict__ v,
                                  const int64_t* __restrict__ slot_mapping, int64_t num_tokens,
                                  PagedKvLayout layout, float k_scale, float v_scale,
                                  uint8_t* __restrict__ kc, uint8_t* __restrict__ vc) {
  const int64_t row = layout.num_kv_heads * layout.head_dim;
  const int64_t total = num_tokens * row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = i / row;
    const int64_t slot = slot_mapping[token];
    if (slot < 0) continue;
    const int64_t head = (i % row) / layout.head_dim;
    const int64_t dst = layout.SlotOffset(slot, head) + i % layout.head_dim;
    kc[dst] = F32ToE4m3(vec::ToF32(k[i]) / k_scale);
    vc[dst] = F32ToE4m3(vec::ToF32(v[i]) / v_scale);
  }
}

template <typename T>
void LaunchFp8(const void* k, const void* v, const int64_t* slot_mapping, int64_t num_tokens,
               const PagedKvView<void>& kv, const KvCacheFormat& f, cudaStream_t stream) {
  const int64_t total = num_tokens * kv.layout.num_kv_heads * kv.layout.head_dim;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 65536);
  AppendKvFp8Kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const T*>(k), static_cast<const T*>(v), slot_mapping, num_tokens, kv.layout,
      f.k_scale, f.v_scale, static_cast<uint8_t*>(kv.k), static_cast<uint8_t*>(kv.v));
  LLM_CUDA_CHECK(cudaGetLastError());
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void AppendKv(const void* k, const void* v, const int64_t* slot_mapping, int64_t num_tokens,
              PagedKvView<void> kv, DType dtype, cudaStream_t stream, const KvCacheFormat& format) {
  if (num_tokens <= 0 || kv.layout.num_kv_heads <= 0 || kv.layout.head_dim <= 0) return;
  if (format.fp8) {
    if (dtype == DType::kBF16) {
      LaunchFp8<__nv_bfloat16>(k, v, slot_mapping, num_tokens, kv, format, stream);
    } else if (dtype == DType::kF16) {
      LaunchFp8<__half>(k, v, slot_mapping, num_tokens, kv, format, stream);
    } else {
      throw std::invalid_argument("AppendKv: fp8 cache needs BF16 or F16 inputs, got " +
                                  std::string(DTypeName(dtype)));
    }
    return;
  }
  const size_t row_bytes = size_t(kv.layout.head_dim) * DTypeSize(dtype);
  const bool vec16 =
      row_bytes % 16 == 0 && Aligned16(k) && Aligned16(v) && Aligned16(kv.k) && Aligned16(kv.v);
  if (vec16) {
    Launch<uint4>(k, v, slot_mapping, num_tokens, kv, row_bytes, stream);
  } else {
    Launch<uint16_t>(k, v, slot_mapping, num_tokens, kv, row_bytes, stream);
  }
}

}  // namespace llm::cuda
