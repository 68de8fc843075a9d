#include "engine/cuda/gemm.h"

#include <stdexcept>
#include <string>

#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda {
namespace {

void Check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLASLt: ") + what +
                             " failed: " + cublasLtGetStatusString(status));
  }
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::kI8:
      return CUDA_R_8I;
  }
  return CUDA_R_32F;
}

// One attribute of a matmul descriptor (the value's own type and size).
template <typename V>
void SetDesc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const V& value,
             const char* what) {
  Check(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)), what);
}

}  // namespace

Gemm::Gemm(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  Check(cublasLtCreate(&handle_), "cublasLtCreate");
  LLM_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

Gemm::Plan& Gemm::GetPlan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [n, m, k, dtype, out_dtype, fast_accum] = key;
  Plan p;
  Check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  SetDesc(p.op, CUBLASLT_MATMUL_DESC_TRANSA, trans_a, "set TRANSA");
  SetDesc(p.op, CUBLASLT_MATMUL_DESC_TRANSB, trans_b, "set TRANSB");
  if (sm_count_target_ > 0) {
    const int32_t sms = sm_count_target_;
    SetDesc(p.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, sms, "set SM_COUNT_TARGET");
  }
  // A = W as stored: column-major [k, m] (ld k), transposed by the op; B = X: [k, n] (ld k);
  // C = D = Y: column-major [m, n] (ld m), i.e. row-major [n, m].
  if (dtype == DType::kF8E4M3) {
    // Per-row weight scales (A: one per row of op(A), i.e. per output feature) and per-token
    // activation scales (B: one per column, i.e. per token); the pointers are set per call.
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    SetDesc(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer,
            "set A_SCALE_MODE (outer vector: needs cuBLAS >= 12.9 and sm_90)");
    SetDesc(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer, "set B_SCALE_MODE");
    const int8_t fast = fast_accum ? 1 : 0;
    SetDesc(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "set FAST_ACCUM");
    // The heuristic needs scale pointers of the right mode set; any device address does
    // (the real ones replace them per call).
    const void* any = workspace_;
    SetDesc(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, any, "set A_SCALE_POINTER");
    SetDesc(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, any, "set B_SCALE_POINTER");
  }
  Check(cublasLtMatrixLayoutCreate(&p.a, CudaType(dtype), static_cast<uint64_t>(k),
                                   static_cast<uint64_t>(m), k),
        "layout A");
  Check(cublasLtMatrixLayoutCreate(&p.b, CudaType(dtype), static_cast<uint64_t>(k),
                                   static_cast<uint64_t>(n), k),
        "layout B");
  Check(cublasLtMatrixLayoutCreate(&p.c, CudaType(out_dtype), static_cast<uint64_t>(m),
                                   static_cast<uint64_t>(n), m),
        "layout C");
  cublasLtMatmulPreference_t pref = nullptr;
  Check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  Check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes_, sizeof(workspace_bytes_)),
        "set workspace");
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates]{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref,
                                                           kTuneCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw std::runtime_error("cuBLASLt: no algorithm for GEMM n=" + std::to_string(n) +
                             " m=" + std::to_string(m) + " k=" + std::to_string(k) + " (" +
                             std::string(DTypeName(dtype)) + " -> " +
                             std::string(DTypeName(out_dtype)) + ")");
  }
  for (int i = 0; i < found; ++i) p.candidates[i] = results[i].algo;
  p.num_candidates = found;
  p.algo = p.candidates[0];
  return plans_.emplace(key, p).first->second;
}

template <typename Run>
void Gemm::MaybeTune(Plan& p, cudaStream_t stream, Run run) {
  if (!tuning_ || p.tuned || p.num_candidates < 2) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LLM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;  // no timing inside a capture
  // Released on every path (a failed check below throws).
  struct Resources {
    cudaEvent_t start = nullptr, stop = nullptr;
    void* flush = nullptr;
    ~Resources() {
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
      if (flush) cudaFree(flush);
    }
  } res;
  LLM_CUDA_CHECK(cudaEventCreate(&res.start));
  LLM_CUDA_CHECK(cudaEventCreate(&res.stop));
  // Rounds over all candidates (kTuneReps runs each per round, after one warm-up run), so
  // that clock and temperature drift during tuning touch every candidate alike; each run is
  // timed alone (events around it, then a sync: back to back, a kernel's launch and tail
  // would hide under its neighbours', which a GEMM between other kernels does not get), and
  // a candidate's time is its fastest run. A candidate the call's shape or alignment rules
  // out fails to launch and drops out.
  // Each timed run starts with the operands out of L2 (kTuneFlushBytes written first, outside
  // the timing): in a model step the weights stream from memory, and a repeated run would find
  // a matrix of up to ~50 MB in L2 and favour the algorithms that reuse it.
  if (cudaMalloc(&res.flush, kTuneFlushBytes) != cudaSuccess) {
    cudaGetLastError();  // out of memory: tune without the flush (L2-warm timing)
    res.flush = nullptr;
  }
  // A launch cuBLASLt refuses may leave the runtime's last error set: cleared, so that the
  // next kernel launch's own check does not report it.
  auto try_run = [&](const cublasLtMatmulAlgo_t& algo) {
    const bool ok = run(algo) == CUBLAS_STATUS_SUCCESS;
    if (!ok) cudaGetLastError();
    return ok;
  };
  const int n = p.num_candidates;
  bool ok[kTuneCandidates];
  float ms[kTuneCandidates];
  for (int i = 0; i < n; ++i) ok[i] = try_run(p.candidates[i]), ms[i] = -1.f;
  for (int round = 0; round < kTuneRounds; ++round) {
    for (int i = 0; i < n; ++i) {
      for (int r = 0; r < kTuneReps && ok[i]; ++r) {
        if (res.flush) {
          LLM_CUDA_CHECK(cudaMemsetAsync(res.flush, r & 0xff, kTuneFlushBytes, stream));
        }
        LLM_CUDA_CHECK(cudaEventRecord(res.start, stream));
        ok[i] = try_run(p.candidates[i]);
        LLM_CUDA_CHECK(cudaEventRecord(res.stop, stream));
        LLM_CUDA_CHECK(cudaEventSynchronize(res.stop));
        float t = 0.f;
        LLM_CUDA_CHECK(cudaEventElapsedTime(&t, res.start, res.stop));
        if (ok[i] && (ms[i] < 0.f || t < ms[i])) ms[i] = t;
      }
    }
  }
  // The heuristic's first pick stays unless another is faster by kTuneMargin (timing noise
  // must not trade a good pick for an equal one).
  int best = 0;
  float best_ms = ok[0] ? ms[0] * (1.f - kTuneMargin) : -1.f;
  for (int i = 1; i < n; ++i) {
    if (ok[i] && (best_ms < 0.f || ms[i] < best_ms)) best_ms = ms[i], best = i;
  }
  p.algo = p.candidates[best];
  p.tuned = true;
  ++num_tuned_;
  if (best != 0) ++num_retuned_;
}

void Gemm::Linear(const void* x, const void* w, void* y, int64_t n, int64_t m, int64_t k,
                  DType dtype, DType out_dtype, bool accumulate, cudaStream_t stream) {
  if (n == 0) return;
  if (accumulate && out_dtype != DType::kF32) {
    throw std::invalid_argument("Gemm::Linear: accumulate needs an fp32 output");
  }
  Plan& p = GetPlan({n, m, k, dtype, out_dtype, false});
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &algo,
                          workspace_, workspace_bytes_, stream);
  };
  MaybeTune(p, stream, run);
  Check(run(p.algo), "Matmul");
}

void Gemm::LinearFp8(const void* x8, const float* x_scale, const void* w8, const float* w_scale,
                     void* y, int64_t n, int64_t m, int64_t k, DType out_dtype, bool accumulate,
                     cudaStream_t stream) {
  if (n == 0) return;
  if (accumulate && out_dtype != DType::kF32) {
    throw std::invalid_argument("Gemm::LinearFp8: accumulate needs an fp32 output");
  }
  if (k % 16 != 0) {
    throw std::invalid_argument("Gemm::LinearFp8: k = " + std::to_string(k) +
                                " is not a multiple of 16 (cuBLASLt's FP8 alignment)");
  }
  Plan& p = GetPlan({n, m, k, DType::kF8E4M3, out_dtype, fast_accum_});
  SetDesc(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale, "set A_SCALE_POINTER");
  SetDesc(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale, "set B_SCALE_POINTER");
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, p.op, &alpha, w8, p.a, x8, p.b, &beta, y, p.c, y, p.c, &algo,
                          workspace_, workspace_bytes_, stream);
  };
  MaybeTune(p, stream, run);
  const cublasStatus_t st = run(p.algo);
  if (st != CUBLAS_STATUS_SUCCESS) {
    Check(st, ("Matmul (fp8, n=" + std::to_string(n) + " m=" + std::to_string(m) +
               " k=" + std::to_string(k) + " -> " + std::string(DTypeName(out_dtype)) + ")")
                  .c_str());
  }
}

}  // namespace llm::cuda
