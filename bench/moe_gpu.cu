// The mixture-of-experts kernels (kernels/cuda/moe/moe.h) at real layer shapes: Qwen3-30B-A3B
// (hidden 2048, experts' width 768, 8 of 128) and Mixtral-8x7B (4096, 14336, 2 of 8), at step
// sizes from batch-1 decode to prefill. Per step size: the routing (route + group) time, and
// each grouped GEMM (gate|up gathered, down) as TFLOP/s of the routed work and as weight
// bandwidth (the bytes of the experts the step touches, once each), beside cuBLASLt's dense
// GEMM of the same rows and shape (engine/cuda/gemm.h: the ceiling a grouped GEMM aims at).
// Logits are random (routing near uniform). Weights rotate over copies so that repeats do not
// find them in L2. CUDA events, median of the repeats.
//   build/bench_moe_gpu [--reps R] [--kernels 12345] [--wgmma-cols 128|256]
// kV3 at steps its GEMV takes also times gate|up with SiLU·mul fused (gate_up_silu_us; the
// others: -1).
// kV4's warpgroup-MMA tiles (steps averaging more than 32 rows per expert; kV5's: every step
// past the GEMV's) run CTAs of
// --wgmma-cols 128 or 256 outputs (default: MoeGroupedGemm's pick; "wgmma_cols": the gate|up
// call's, 0 where it takes no wgmma tiles), on 64-row tiles, or 128-row ones from 128 rows per
// expert on average ("tile_rows").
// Every kernel set (moe.h: MoeKernels kV1 .. kV5; --kernels picks some, e.g. --kernels 45) at
// every shape, with bf16 experts and with fp8
// ones (--quantization fp8: e4m3 codes with row scales; steps of up to 8 tokens on the
// weight-only GEMV and larger ones on the W8A8 tiles, as the engine runs them, beside
// cuBLASLt's FP8 GEMM for the dense ceiling).
// bf16 steps of >= 64 tokens also time cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx: one
// problem per expert the step touches, its rows contiguous as the sorted pairs are) on the same
// shapes, the library alternative a prefill-size step could take: cublas_gate_up_us /
// cublas_down_us (bf16 outputs; -1: not run or not supported). It needs each expert's row count
// on the host (a device-to-host copy and a sync per layer in an engine) and the gathered input
// rows; neither is in the time.
// Prints JSON lines {"kind":"moe", ...}.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/cuda/gemm.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/fill.h"
#include "kernels/cuda/moe/moe.h"

namespace {

using llm::DType;

struct Shape {
  const char* name;
  int hidden, inter, experts, top_k;
};

// cuBLAS's grouped GEMM over the experts a routing touches: out rows [offsets[e], offsets[e+1])
// = in rows of the same range · W[e]ᵀ (W [E, n, k] row major), bf16 in and out, fp32 compute.
// The device arrays of pointers are made per weight copy before timing.
class GroupedCublas {
 public:
  GroupedCublas(const std::vector<int32_t>& offsets, int n, int k, const void* in, const void* w,
                int64_t w_stride_bytes, int copies, void* out) {
    if (cublasCreate(&handle_) != CUBLAS_STATUS_SUCCESS) return;
    std::vector<const void*> ptrs;
    for (int c = 0; c < copies; ++c) {
      std::vector<const void*> a, b;
      std::vector<void*> o;
      for (size_t e = 0; e + 1 < offsets.size(); ++e) {
        const int rows = offsets[e + 1] - offsets[e];
        if (rows == 0) continue;
        if (c == 0) {
          m_.push_back(n);
          n_.push_back(rows);
        }
        a.push_back(static_cast<const char*>(w) + size_t(c) * size_t(w_stride_bytes) +
                    e * size_t(n) * size_t(k) * 2);
        b.push_back(static_cast<const char*>(in) + size_t(offsets[e]) * size_t(k) * 2);
        o.push_back(static_cast<char*>(out) + size_t(offsets[e]) * size_t(n) * 2);
      }
      ptrs.insert(ptrs.end(), a.begin(), a.end());
      ptrs.insert(ptrs.end(), b.begin(), b.end());
      ptrs.insert(ptrs.end(), o.begin(), o.end());
    }
    groups_ = int(m_.size());
    k_.assign(size_t(groups_), k);
    lda_.assign(size_t(groups_), k);
    ldb_.assign(size_t(groups_), k);
    ldc_.assign(size_t(groups_), n);
    ta_.assign(size_t(groups_), CUBLAS_OP_T);
    tb_.assign(size_t(groups_), CUBLAS_OP_N);
    alpha_.assign(size_t(groups_), 1.f);
    beta_.assign(size_t(groups_), 0.f);
    sizes_.assign(size_t(groups_), 1);
    LLM_CUDA_CHECK(cudaMalloc(&dev_ptrs_, ptrs.size() * sizeof(void*)));
    LLM_CUDA_CHECK(
        cudaMemcpy(dev_ptrs_, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
  }
  ~GroupedCublas() {
    if (dev_ptrs_ != nullptr) cudaFree(dev_ptrs_);
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  // One call on weight copy c; false: cuBLAS refused it (the status is printed once).
  bool Run(int c) {
    if (handle_ == nullptr || groups_ == 0) return false;
    void** base = static_cast<void**>(dev_ptrs_) + size_t(c) * 3 * size_t(groups_);
    const cublasStatus_t st = cublasGemmGroupedBatchedEx(
        handle_, ta_.data(), tb_.data(), m_.data(), n_.data(), k_.data(), alpha_.data(),
        reinterpret_cast<const void* const*>(base), CUDA_R_16BF, lda_.data(),
        reinterpret_cast<const void* const*>(base + groups_), CUDA_R_16BF, ldb_.data(),
        beta_.data(), base + 2 * groups_, CUDA_R_16BF, ldc_.data(), groups_, sizes_.data(),
        CUBLAS_COMPUTE_32F);
    if (st != CUBLAS_STATUS_SUCCESS && !warned_) {
      std::fprintf(stderr, "cublasGemmGroupedBatchedEx: %s\n", cublasGetStatusString(st));
      warned_ = true;
    }
    return st == CUBLAS_STATUS_SUCCESS;
  }

 private:
  cublasHandle_t handle_ = nullptr;
  void* dev_ptrs_ = nullptr;
  int groups_ = 0;
  bool warned_ = false;
  std::vector<int> m_, n_, k_, lda_, ldb_, ldc_, sizes_;
  std::vector<cublasOperation_t> ta_, tb_;
  std::vector<float> alpha_, beta_;
};

const char* const kSetNames[] = {"v1", "v2", "v3", "v4", "v5"};

template <typename F>
double MedianMs(F&& f, int reps) {
  cudaEvent_t a, b;
  LLM_CUDA_CHECK(cudaEventCreate(&a));
  LLM_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    LLM_CUDA_CHECK(cudaEventRecord(a));
    f();
    LLM_CUDA_CHECK(cudaEventRecord(b));
    LLM_CUDA_CHECK(cudaEventSynchronize(b));
    LLM_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(r)], a, b));
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms[ms.size() / 2];
}

void Run(const Shape& s, int tokens, int reps, llm::cuda::Gemm& gemm, llm::cuda::MoeKernels kernels,
         bool fp8, int wgmma_cols) {
  namespace cu = llm::cuda;
  const int64_t pairs = int64_t(tokens) * s.top_k, e = s.experts;
  const int64_t gu_elems = e * 2 * s.inter * s.hidden, d_elems = e * s.hidden * s.inter;
  const int64_t wes = fp8 ? 1 : 2;  // bytes per weight
  const int copies =
      int(std::max<int64_t>(2, (int64_t{1} << 30) / ((gu_elems + d_elems) * wes) + 1));
  // fp8: the engine's choice (forward.cc: MoeMlp), weight-only on the GEMV for small steps.
  const bool w8a8 = fp8 && tokens > 8;
  void *x, *w_gu, *w_d, *gate_up, *act, *down, *dense_in, *dense_out;
  float *logits, *scales;
  int32_t* ints;
  const int64_t tiles = cu::MoeMaxTiles(pairs, e);
  LLM_CUDA_CHECK(cudaMalloc(&x, size_t(tokens) * s.hidden * 2));
  LLM_CUDA_CHECK(cudaMalloc(&w_gu, size_t(gu_elems * wes) * copies));
  LLM_CUDA_CHECK(cudaMalloc(&w_d, size_t(d_elems * wes) * copies));
  LLM_CUDA_CHECK(cudaMalloc(&gate_up, size_t(pairs) * 2 * s.inter * 2));
  LLM_CUDA_CHECK(cudaMalloc(&act, size_t(pairs) * s.inter * 2));
  LLM_CUDA_CHECK(cudaMalloc(&down, size_t(pairs) * s.hidden * 4));
  LLM_CUDA_CHECK(cudaMalloc(&dense_in, size_t(pairs) * s.hidden * 2));
  LLM_CUDA_CHECK(cudaMalloc(&dense_out, size_t(pairs) * 2 * s.inter * 2));
  LLM_CUDA_CHECK(cudaMalloc(&logits, size_t(tokens) * e * 4));
  // fp8 row scales: the weights' ([E · 2 · inter] and [E · hidden]) and the inputs' ([pairs]).
  const int64_t num_scales = e * 2 * s.inter + e * s.hidden + pairs;
  LLM_CUDA_CHECK(cudaMalloc(&scales, size_t(num_scales) * 4));
  const int64_t num_ints = 4 * pairs + (e + 1) + 2 * tiles + 1;
  LLM_CUDA_CHECK(cudaMalloc(&ints, size_t(num_ints) * 4));
  cu::FillUniform(logits, DType::kF32, int64_t(tokens) * e, 2.f, 4, nullptr);
  cu::FillConstant(scales, DType::kF32, num_scales, 1e-2f, nullptr);
  if (fp8) {  // e4m3 codes of ±0.5 (the values do not change the time; none is NaN)
    LLM_CUDA_CHECK(cudaMemset(w_gu, 0x30, size_t(gu_elems) * copies));
    LLM_CUDA_CHECK(cudaMemset(w_d, 0xb0, size_t(d_elems) * copies));
  } else {
    cu::FillUniform(w_gu, DType::kBF16, gu_elems * copies, 0.05f, 2, nullptr);
    cu::FillUniform(w_d, DType::kBF16, d_elems * copies, 0.05f, 3, nullptr);
  }
  if (w8a8) {  // the inputs as codes too (x, act and dense_in hold e4m3 bytes)
    LLM_CUDA_CHECK(cudaMemset(x, 0x38, size_t(tokens) * s.hidden));
    LLM_CUDA_CHECK(cudaMemset(act, 0x38, size_t(pairs) * s.inter));
    LLM_CUDA_CHECK(cudaMemset(dense_in, 0x38, size_t(pairs) * s.hidden));
  } else {
    cu::FillUniform(x, DType::kBF16, int64_t(tokens) * s.hidden, 1.f, 1, nullptr);
    cu::FillUniform(act, DType::kBF16, pairs * s.inter, 1.f, 6, nullptr);
    cu::FillUniform(dense_in, DType::kBF16, pairs * s.hidden, 1.f, 5, nullptr);
  }
  const float* gu_scale = fp8 ? scales : nullptr;
  const float* d_scale = fp8 ? scales + e * 2 * s.inter : nullptr;
  const float* in_scale = w8a8 ? scales + e * 2 * s.inter + e * s.hidden : nullptr;
  cu::MoeRouting r;
  int32_t* p = ints;
  r.experts = p;
  p += pairs;
  r.weights = reinterpret_cast<float*>(p);
  p += pairs;
  r.offsets = p;
  p += e + 1;
  r.sorted_pairs = p;
  p += pairs;
  r.pair_rows = p;
  p += pairs;
  r.tile_expert = p;
  p += tiles;
  r.tile_begin = p;
  p += tiles;
  r.num_tiles = p;
  cu::MoeRoute(logits, tokens, int(e), s.top_k, true, r, nullptr, kernels);
  // The experts this routing touches (their weights are the bytes the step must read).
  std::vector<int32_t> offsets(size_t(e + 1));
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  LLM_CUDA_CHECK(cudaMemcpy(offsets.data(), r.offsets, offsets.size() * 4, cudaMemcpyDeviceToHost));
  int64_t hit = 0;
  for (int64_t i = 0; i < e; ++i) hit += offsets[size_t(i + 1)] > offsets[size_t(i)];
  const double route_ms = MedianMs(
      [&] { cu::MoeRoute(logits, tokens, int(e), s.top_k, true, r, nullptr, kernels); }, reps);
  int call = 0;
  cu::MoeGemm g;
  g.top_k = s.top_k;
  g.dtype = DType::kBF16;
  g.num_pairs = pairs;
  g.num_experts = int(e);
  g.wgmma_cols = wgmma_cols;
  const double gu_ms = MedianMs(
      [&] {
        g.x = x;
        g.x_scale = in_scale;
        g.gather = true;
        g.w = static_cast<const char*>(w_gu) + size_t(call++ % copies) * gu_elems * wes;
        g.w_scale = gu_scale;
        g.out = gate_up;
        g.out_f32 = false;
        g.n = 2 * s.inter;
        g.k = s.hidden;
        cu::MoeGroupedGemm(g, r, nullptr, kernels);
      },
      reps);
  // kV3's fused SiLU·mul (MoeGemm::silu_mul): the gate|up GEMV writing the activations.
  double silu_ms = -1e-3;
  g.x = x;
  g.x_scale = in_scale;
  g.gather = true;
  g.w_scale = gu_scale;
  g.out = act;
  g.out_f32 = false;
  g.n = 2 * s.inter;
  g.k = s.hidden;
  if (cu::MoeFusesSiluMul(g, kernels)) {
    silu_ms = MedianMs(
        [&] {
          g.w = static_cast<const char*>(w_gu) + size_t(call++ % copies) * gu_elems * wes;
          g.silu_mul = true;
          cu::MoeGroupedGemm(g, r, nullptr, kernels);
          g.silu_mul = false;
        },
        reps);
  }
  const double down_ms = MedianMs(
      [&] {
        g.x = act;
        g.x_scale = in_scale;
        g.gather = false;
        g.w = static_cast<const char*>(w_d) + size_t(call++ % copies) * d_elems * wes;
        g.w_scale = d_scale;
        g.out = down;
        g.out_f32 = true;
        g.n = s.hidden;
        g.k = s.inter;
        cu::MoeGroupedGemm(g, r, nullptr, kernels);
      },
      reps);
  // cuBLASLt, one expert's gate|up matrix over all the routed rows (same FLOPs, 1/hit of the
  // weight bytes): the dense ceiling of this shape (W8A8: its FP8 GEMM on e4m3 inputs;
  // weight-only fp8 steps: the bf16 GEMM).
  const double dense_ms = MedianMs(
      [&] {
        const void* w = static_cast<const char*>(w_gu) + size_t(call++ % copies) * gu_elems * wes;
        if (w8a8) {
          gemm.LinearFp8(dense_in, in_scale, w, gu_scale, dense_out, pairs, 2 * s.inter, s.hidden,
                         DType::kBF16, false, nullptr);
        } else {  // (weight-only fp8: one expert's bytes read as bf16, within the buffer)
          gemm.Linear(dense_in, w, dense_out, pairs, 2 * s.inter, s.hidden, DType::kBF16,
                      DType::kBF16, false, nullptr);
        }
      },
      reps);
  // cuBLAS's grouped GEMM, bf16 steps of >= 64 tokens (dense_in stands for the gathered rows;
  // gate|up into dense_out, down from act into `down` read as bf16 rows).
  double cublas_gu_ms = -1e-3, cublas_d_ms = -1e-3;
  if (!fp8 && tokens >= 64) {
    GroupedCublas cgu(offsets, 2 * s.inter, s.hidden, dense_in, w_gu, gu_elems * wes, copies,
                      dense_out);
    GroupedCublas cd(offsets, s.hidden, s.inter, act, w_d, d_elems * wes, copies, down);
    if (cgu.Run(0)) {
      cublas_gu_ms = MedianMs([&] { cgu.Run(call++ % copies); }, reps);
    }
    if (cd.Run(0)) {
      cublas_d_ms = MedianMs([&] { cd.Run(call++ % copies); }, reps);
    }
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const double gu_flop = 2.0 * pairs * 2 * s.inter * s.hidden,
               d_flop = 2.0 * pairs * s.hidden * s.inter;
  const double gu_bytes = double(hit) * 2 * s.inter * s.hidden * wes,
               d_bytes = double(hit) * s.hidden * s.inter * wes;
  std::printf(
      "{\"kind\":\"moe\",\"kernels\":\"%s\",\"wgmma_cols\":%d,\"tile_rows\":%d,"
      "\"weights\":\"%s\","
      "\"shape\":\"%s\","
      "\"tokens\":%d,\"experts_hit\":%lld,"
      "\"route_us\":%.1f,\"gate_up_us\":%.1f,\"gate_up_tflops\":%.1f,\"gate_up_weight_tbs\":%.2f,"
      "\"down_us\":%.1f,\"down_tflops\":%.1f,\"down_weight_tbs\":%.2f,"
      "\"dense_gate_up_us\":%.1f,\"dense_gate_up_tflops\":%.1f,\"gate_up_silu_us\":%.1f,"
      "\"cublas_gate_up_us\":%.1f,\"cublas_gate_up_tflops\":%.1f,\"cublas_down_us\":%.1f}\n",
      kSetNames[int(kernels)], cu::MoeWgmmaCols(g, kernels),
      cu::MoeTileRows(pairs, int(e), kernels),
      w8a8 ? "fp8-w8a8" : (fp8 ? "fp8-weight-only" : "bf16"), s.name, tokens,
      static_cast<long long>(hit), route_ms * 1e3, gu_ms * 1e3, gu_flop / gu_ms / 1e9,
      gu_bytes / gu_ms / 1e9, down_ms * 1e3, d_flop / down_ms / 1e9, d_bytes / down_ms / 1e9,
      dense_ms * 1e3, gu_flop / dense_ms / 1e9, silu_ms * 1e3, cublas_gu_ms * 1e3,
      cublas_gu_ms > 0 ? gu_flop / cublas_gu_ms / 1e9 : -1.0, cublas_d_ms * 1e3);
  std::fflush(stdout);
  for (void* q : {x, w_gu, w_d, gate_up, act, down, dense_in, dense_out, static_cast<void*>(logits),
                  static_cast<void*>(scales), static_cast<void*>(ints)})
    cudaFree(q);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, wgmma_cols = 0;
  std::string sets = "12345";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--kernels") == 0 && i + 1 < argc) sets = argv[++i];
    if (std::strcmp(argv[i], "--wgmma-cols") == 0 && i + 1 < argc) {
      wgmma_cols = std::atoi(argv[++i]);
    }
  }
  llm::cuda::Gemm gemm;
  const Shape shapes[] = {{"qwen3-30b-a3b", 2048, 768, 128, 8},
                          {"mixtral-8x7b", 4096, 14336, 8, 2}};
  for (const Shape& s : shapes) {
    for (int tokens : {1, 8, 16, 32, 64, 256, 1024, 4096}) {
      for (auto k :
           {llm::cuda::MoeKernels::kV1, llm::cuda::MoeKernels::kV2, llm::cuda::MoeKernels::kV3,
            llm::cuda::MoeKernels::kV4, llm::cuda::MoeKernels::kV5}) {
        if (sets.find(char('1' + int(k))) == std::string::npos) continue;
        for (bool fp8 : {false, true}) Run(s, tokens, reps, gemm, k, fp8, wgmma_cols);
      }
    }
  }
  return 0;
}
