// The CUDA backend's GEMMs through cuBLASLt: every linear layer is Y = X · Wᵀ with X
// [n, k] row-major activations and W [m, k] row-major weights (Hugging Face's layout).
// In cuBLASLt's column-major terms that is D[m, n] = op(A)·B with A = W (transposed),
// B = X: the "TN" case its kernels are fastest at. The algorithm is chosen once per shape
// and cached: cublasLtMatmulAlgoGetHeuristic's first, or with tuning on (set_tuning), the
// fastest of its first kTuneCandidates timed on the first call's own operands (TensorRT-LLM
// profiles its GEMM tactics the same way). The workspace is fixed, so the calls can be
// captured in CUDA graphs.
//
// Epilogue fusion: with accumulate, D = X·Wᵀ + D in fp32 (beta = 1, C = D): the residual
// add of the attention output and MLP down projections costs no extra kernel or pass.
//
// FP8 (--quantization fp8, LinearFp8): W holds e4m3 codes with one fp32 scale per output row
// (per channel) and X e4m3 codes with one scale per token (dynamic, from the row's max |x|:
// cuda::QuantizeRowsE4m3), D = (x_scale[t] · w_scale[j]) · Σ x8·w8 in fp32 on the tensor
// cores' FP8 path (twice bf16's peak on the H200). Both scale vectors are cuBLASLt's
// "outer vector" scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, cuBLAS >= 12.9 on
// sm_90), so the scaling is inside the GEMM's epilogue, not a pass of its own. Accumulation
// is cuBLASLt's precise mode (CUBLASLT_MATMUL_DESC_FAST_ACCUM off: partial sums are promoted
// to fp32 periodically) unless set_fast_accum(true) (the tensor cores' own accumulator
// throughout, faster; what vLLM's and TensorRT-LLM's FP8 GEMMs do).
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

  // y[n, m] = x_scale[t] · w_scale[j] · (x8[n, k] · w8[m, k]ᵀ) (+ y when accumulate): x8, w8
  // e4m3 codes (k % 16 == 0), x_scale fp32 [n], w_scale fp32 [m]; y: out_dtype (bf16, fp16,
  // or fp32; accumulate needs fp32).
  void LinearFp8(const void* x8, const float* x_scale, const void* w8, const float* w_scale,
                 void* y, int64_t n, int64_t m, int64_t k, DType out_dtype, bool accumulate,
                 cudaStream_t stream);
  // FP8 accumulation mode (CUBLASLT_MATMUL_DESC_FAST_ACCUM) of the later LinearFp8 calls.
  void set_fast_accum(bool on) { fast_accum_ = on; }
  // The SMs the GEMMs of plans made from now on are chosen and sized for
  // (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET): for GEMMs that share the GPU with kernels on
  // another stream (the executor's --decode-overlap). 0: all of them.
  void set_sm_count_target(int sms) { sm_count_target_ = sms; }

  int64_t num_plans() const { return static_cast<int64_t>(plans_.size()); }

  // While on, the first call of each shape made outside stream capture times up to
  // kTuneCandidates of the heuristic's algorithms (a warm-up, then kTuneRounds rounds over
  // the candidates of kTuneReps runs each, every run after an L2 flush) on the call's own
  // operands and keeps the fastest (the heuristic's first unless another beats it by
  // kTuneMargin) for every later call of that shape. Tuning writes the call's output several
  // times (accumulating into it several times when accumulate is set), so it is only for
  // calls whose outputs are thrown away: the executor's start-up passes. Every shape not tuned
  // yet is tuned when called with tuning on, also one first met with tuning off (until then
  // it ran the heuristic's choice).
  void set_tuning(bool on) { tuning_ = on; }
  int64_t num_tuned() const { return num_tuned_; }
  // Of the tuned shapes, how many picked another algorithm than the heuristic's first.
  int64_t num_retuned() const { return num_retuned_; }
  static constexpr int kTuneCandidates = 8;
  static constexpr int kTuneReps = 2;
  static constexpr int kTuneRounds = 3;
  static constexpr float kTuneMargin = 0.03f;
  static constexpr size_t kTuneFlushBytes = size_t{64} << 20;  // > the H200's 50 MB L2

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    // The heuristic's candidates, best first (algo = candidates[0] until tuned).
    cublasLtMatmulAlgo_t candidates[kTuneCandidates]{};
    int num_candidates = 0;
    bool tuned = false;
  };
  // The plan does not depend on accumulate (beta is a launch argument, not in the heuristic);
  // the fp8 plans' scale pointers are set per call (each layer has its own). The last field is
  // the fp8 accumulation mode (false for bf16 / fp16).
  using Key = std::tuple<int64_t, int64_t, int64_t, DType, DType, bool>;
  Plan& GetPlan(const Key& key);
  // Tuning (set_tuning): run(algo) enqueues the call with that algorithm on `stream`.
  template <typename Run>
  void MaybeTune(Plan& p, cudaStream_t stream, Run run);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
  bool fast_accum_ = false;
  int sm_count_target_ = 0;
  bool tuning_ = false;
  int64_t num_tuned_ = 0, num_retuned_ = 0;
};

}  // namespace llm::cuda
