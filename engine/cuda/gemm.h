// The CUDA backend's GEMMs through cuBLASLt: every linear layer is Y = X · Wᵀ with X
// [n, k] row-major activations and W [m, k] row-major weights (Hugging Face's layout).
// In cuBLASLt's column-major terms that is D[m, n] = op(A)·B with A = W (transposed),
// B = X: the "TN" case its kernels are fastest at. The algorithm is chosen once per shape
// by cublasLtMatmulAlgoGetHeuristic and cached; the workspace is fixed, so the calls can be
// captured in CUDA graphs.
//
// Epilogue fusion: with accumulate, D = X·Wᵀ + D in fp32 (beta = 1, C = D): the residual
// add of the attention output and MLP down projections costs no extra kernel or pass.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/dtype.h"

namespace llm::cuda {

class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes = size_t{32} << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[n, m] = x[n, k] · w[m, k]ᵀ (+ y when accumulate). x, w: `dtype` (bf16 / fp16);
  // y: out_dtype (dtype, or fp32; accumulate needs fp32). fp32 accumulation.
  void Linear(const void* x, const void* w, void* y, int64_t n, int64_t m, int64_t k, DType dtype,
              DType out_dtype, bool accumulate, cudaStream_t stream);

  int64_t num_plans() const { return static_cast<int64_t>(plans_.size()); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The plan does not depend on accumulate (beta is a launch argument, not in the heuristic).
  using Key = std::tuple<int64_t, int64_t, int64_t, DType, DType>;
  const Plan& GetPlan(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
};

}  // namespace llm::cuda
