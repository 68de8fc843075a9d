// The grouped GEMMs' epilogue (moe_gemm.cu's mma.sync tiles, moe_gemm_wgmma.cu's warpgroup
// tiles): one m16n8-shaped accumulator fragment of a thread, written to the tile's rows. Device
// code; include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/common/vec.cuh"

namespace llm::cuda::moe_detail {

// out[row0 + r][col, col + 1] = v[0], v[1] and out[row0 + r + 8][...] = v[2], v[3] for the rows
// below `rows`, in fp32 (kOutF32) or T; W8A8 (kFp8) scales each by its input row's scale
// (x_scale[a_rows[r]]) and the outputs' weight scales (w_scale[e][col], [col + 1]). col < n.
template <typename T, bool kOutF32, bool kFp8>
struct FragmentStore {
  void* out;
  int n, row0, rows, e;
  const float* w_scale;
  const float* x_scale;
  const int* a_rows;  // the tile's input rows (shared memory)

  __device__ __forceinline__ void operator()(int r, int col, const float* v) const {
    float ws0 = 1.f, ws1 = 1.f;
    if constexpr (kFp8) {
      ws0 = w_scale[int64_t(e) * n + col];
      ws1 = w_scale[int64_t(e) * n + col + 1];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r + h * 8;
      if (row >= rows) continue;
      const int64_t at = int64_t(row0 + row) * n + col;
      float v0 = v[2 * h], v1 = v[2 * h + 1];
      if constexpr (kFp8) {
        const float xs = x_scale[a_rows[row]];
        v0 *= xs * ws0;
        v1 *= xs * ws1;
      }
      if constexpr (kOutF32) {
        *reinterpret_cast<float2*>(static_cast<float*>(out) + at) = make_float2(v0, v1);
      } else {
        *reinterpret_cast<uint32_t*>(static_cast<T*>(out) + at) = vec::PackPair<T>(v0, v1);
      }
    }
  }
};

}  // namespace llm::cuda::moe_detail
