// The compute ceiling the end-to-end benchmarks report ratios to: bf16 GEMM throughput of
// our own cuBLASLt path (engine/cuda/gemm.h, the one every linear layer takes), for a large
// square GEMM and for the Llama-3-8B layer shapes at prefill-sized and decode-sized (512)
// token counts; the same shapes through the FP8 path (--quantization fp8: e4m3 x e4m3 with
// per-row and per-token scales), with cuBLASLt's precise and fast accumulation; the bf16
// shapes also with the algorithm timed by Gemm::set_tuning (rows "*_bf16_tuned"). Weights
// rotate over copies past L2 (cold, as in a model step). Timed with CUDA events after a
// warm-up, median of the repeats. Then the batch-1 decode GEMVs, bf16 and
// fp8 (e4m3) weights, per matrix and in a 32-layer chain, as weight TB/s.
//   build/bench_gemm_peak_gpu [--reps R]
// Prints lines: JSON {"kind":"gemm","n":..,"m":..,"k":..,"ms":..,"tflops":..},
// {"kind":"gemv",...} and {"kind":"decode_chain",...}
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "engine/cuda/gemm.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/fill.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/cuda/ops/model_ops.h"

namespace {

// FP8 weights for timing (the GEMV's speed does not depend on the values): e4m3 codes
// [count] cycling through 1.5, -1.0, 1.0, -0.75 (no NaN code, unlike random bytes), written
// as fp32 words whose bytes are those codes. The callers fill the per-row scales.
void FillFp8Codes(void* codes, int64_t count) {
  const uint32_t pattern = 0xb438b83cu;  // bytes 0x3c, 0xb8, 0x38, 0xb4 (little-endian)
  float word;
  std::memcpy(&word, &pattern, 4);
  llm::cuda::FillConstant(codes, llm::DType::kF32, count / 4, word, nullptr);
}

// One GEMM y[n, m] = x[n, k] · w[m, k]ᵀ with a bf16 output: bf16 operands, or (fp8) e4m3
// operands with per-token and per-row scales (LinearFp8). The calls rotate over copies of W
// totalling >= 256 MB, so that no call finds its weights in the 50 MB L2 (in a model step
// they stream from memory; the decode-sized shapes' smaller matrices would otherwise be
// timed warm).
double TimeGemm(llm::cuda::Gemm& gemm, int64_t n, int64_t m, int64_t k, int reps,
                bool fp8 = false) {
  void *x = nullptr, *w_all = nullptr, *y = nullptr;
  float *xs = nullptr, *ws = nullptr;
  const size_t es = fp8 ? 1 : 2;
  const int64_t w_elems = m * k;
  const int copies = int(std::max<int64_t>(2, (int64_t{256} << 20) / (w_elems * int64_t(es)) + 1));
  LLM_CUDA_CHECK(cudaMalloc(&x, size_t(n * k) * es));
  LLM_CUDA_CHECK(cudaMalloc(&w_all, size_t(w_elems * copies) * es));
  LLM_CUDA_CHECK(cudaMalloc(&y, size_t(n * m * 2)));
  LLM_CUDA_CHECK(cudaMalloc(&xs, size_t(n) * 4));
  LLM_CUDA_CHECK(cudaMalloc(&ws, size_t(m) * 4));
  if (fp8) {
    FillFp8Codes(x, n * k);
    FillFp8Codes(w_all, w_elems * copies);
    llm::cuda::FillConstant(xs, llm::DType::kF32, n, 0.01f, nullptr);
    llm::cuda::FillConstant(ws, llm::DType::kF32, m, 0.01f, nullptr);
  } else {
    llm::cuda::FillUniform(x, llm::DType::kBF16, n * k, 1.f, 1, nullptr);
    llm::cuda::FillUniform(w_all, llm::DType::kBF16, w_elems * copies, 1.f, 2, nullptr);
  }
  int call = 0;
  auto run = [&] {
    const void* w =
        static_cast<const char*>(w_all) + size_t(call++ % copies) * size_t(w_elems) * es;
    if (fp8) {
      gemm.LinearFp8(x, xs, w, ws, y, n, m, k, llm::DType::kBF16, false, nullptr);
    } else {
      gemm.Linear(x, w, y, n, m, k, llm::DType::kBF16, llm::DType::kBF16, false, nullptr);
    }
  };
  cudaEvent_t start, stop;
  LLM_CUDA_CHECK(cudaEventCreate(&start));
  LLM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) run();
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    LLM_CUDA_CHECK(cudaEventRecord(start));
    run();
    LLM_CUDA_CHECK(cudaEventRecord(stop));
    LLM_CUDA_CHECK(cudaEventSynchronize(stop));
    LLM_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(r)], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  cudaFree(x);
  cudaFree(w_all);
  cudaFree(y);
  cudaFree(xs);
  cudaFree(ws);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms[ms.size() / 2];
}

// Batch-1 decode GEMVs: cuBLASLt (n = 1) against our fused GEMV (kernels/cuda/gemv/gemv.h) with
// bf16 weights and with fp8 (e4m3) weights, as weight-streaming bandwidth (bytes of W per
// second: m·k·2 for bf16, m·k for fp8, whose m fp32 scales are left out). The repeats rotate
// over copies of W totalling >= 256 MB, so that no repeat finds its weights in the 50 MB L2 (a
// first version reused one W and overstated both sides for the matrices that fit).
void TimeGemv(llm::cuda::Gemm& gemm, int64_t m, int64_t k, llm::cuda::GemvEpilogue epilogue,
              const char* name, int reps) {
  using llm::DType;
  void *x = nullptr, *w_all = nullptr, *w8_all = nullptr, *y = nullptr;
  float* scales = nullptr;
  const int64_t w_bytes = m * k * 2, w8_bytes = m * k;
  const int copies = int(std::max<int64_t>(2, (int64_t{256} << 20) / w_bytes + 1));
  const int copies8 = int(std::max<int64_t>(2, (int64_t{256} << 20) / w8_bytes + 1));
  LLM_CUDA_CHECK(cudaMalloc(&x, size_t(2 * k * 4)));
  LLM_CUDA_CHECK(cudaMalloc(&w_all, size_t(w_bytes * copies)));
  LLM_CUDA_CHECK(cudaMalloc(&w8_all, size_t(w8_bytes * copies8)));
  LLM_CUDA_CHECK(cudaMalloc(&scales, size_t(m * 4)));
  LLM_CUDA_CHECK(cudaMalloc(&y, size_t(m * 4)));
  llm::cuda::FillUniform(x, DType::kBF16, 2 * k, 1.f, 3, nullptr);
  llm::cuda::FillUniform(w_all, DType::kBF16, m * k * copies, 1.f, 4, nullptr);
  FillFp8Codes(w8_all, w8_bytes * copies8);
  llm::cuda::FillConstant(scales, DType::kF32, m, 1.f / 448.f, nullptr);
  int rep = 0;
  cudaEvent_t start, stop;
  LLM_CUDA_CHECK(cudaEventCreate(&start));
  LLM_CUDA_CHECK(cudaEventCreate(&stop));
  const char* impls[] = {"cublaslt_n1", "fused_gemv", "fused_gemv_fp8", "fused_gemv_ring",
                         "fused_gemv_fp8_ring"};
  for (int variant = 0; variant < 5; ++variant) {
    const bool fp8 = variant == 2 || variant == 4;
    auto launch = [&] {
      const int i = rep++;
      const void* w = fp8 ? static_cast<const char*>(w8_all) + (i % copies8) * w8_bytes
                          : static_cast<const char*>(w_all) + (i % copies) * w_bytes;
      if (variant == 0) {
        gemm.Linear(x, w, y, 1, m, k, DType::kBF16, DType::kBF16, false, nullptr);
      } else {
        llm::cuda::GemvArgs g;
        g.epilogue = epilogue;
        g.x = x;
        g.w = w;
        g.w_scale = fp8 ? scales : nullptr;
        g.y = y;
        g.n = 1;
        g.m = m;
        g.k = k;
        g.ring = variant >= 3;
        llm::cuda::Gemv(g, nullptr);
      }
    };
    for (int i = 0; i < 3; ++i) launch();
    std::vector<float> ms(static_cast<size_t>(reps));
    for (int r = 0; r < reps; ++r) {
      LLM_CUDA_CHECK(cudaEventRecord(start));
      launch();
      LLM_CUDA_CHECK(cudaEventRecord(stop));
      LLM_CUDA_CHECK(cudaEventSynchronize(stop));
      LLM_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(r)], start, stop));
    }
    std::sort(ms.begin(), ms.end());
    const double t = ms[ms.size() / 2];
    std::printf(
        "JSON {\"kind\":\"gemv\",\"name\":\"%s\",\"impl\":\"%s\",\"m\":%lld,\"k\":%lld,"
        "\"us\":%.2f,\"weight_tb_per_s\":%.3f}\n",
        name, impls[variant], (long long)m, (long long)k, t * 1e3,
        double(fp8 ? w8_bytes : w_bytes) / (t * 1e-3) / 1e12);
  }
  cudaFree(x);
  cudaFree(w_all);
  cudaFree(w8_all);
  cudaFree(scales);
  cudaFree(y);
}

// The linear layers of a batch-1 decode step as they run in the executor: per layer RMSNorm,
// q|k|v, o (+ residual), RMSNorm, gate|up (+ SiLU·mul), down (+ residual), every layer's
// weights distinct (so the whole set streams from HBM, as in a real step), captured in one
// CUDA graph. Seventeen ways: cuBLASLt (+ RMSNorm and SiluMul kernels), our GEMV (+ RMSNorm
// kernels) with plain launches, the same with programmatic dependent launch, that with the
// RMSNorms in the GEMV prologues instead, and the executor's way (PDL) with fp8 weights
// (--quantization fp8: half the bytes; weight_bytes counts the codes, not the per-row scales);
// then the executor's bf16 and fp8 ways with one CTA per row group (the GEMV's grid before it
// became a persistent wave), then both on the ring kernel (GemvArgs::ring, --gemv-ring) with
// rings of 48, 96 and 192 KiB; then the RMSNorms folded into the GEMVs (--gemv-fold-norm:
// no RMSNorm kernel after layer 0) and that with o, gate|up and down as one persistent kernel
// (cuda::GemvChain, --gemv-chain), bf16 and fp8.
// Reports ms per step and weight TB/s; attention and RoPE are left out, so this is the linear
// layers' share of the batch-1 roofline.
void TimeDecodeChain(llm::cuda::Gemm& gemm, const char* name, int64_t layers, int64_t hidden,
                     int64_t qkv_dim, int64_t inter, int reps) {
  using llm::DType;
  namespace cu = llm::cuda;
  const int64_t per_layer =
      (qkv_dim * hidden + hidden * hidden + 2 * inter * hidden + hidden * inter) * 2;
  const int64_t rows_per_layer = qkv_dim + hidden + 2 * inter + hidden;  // fp8: one scale each
  void *w_all = nullptr, *w8_all = nullptr;
  float* scales_all = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&w_all, size_t(per_layer * layers)));
  LLM_CUDA_CHECK(cudaMalloc(&w8_all, size_t(per_layer / 2 * layers)));
  LLM_CUDA_CHECK(cudaMalloc(&scales_all, size_t(rows_per_layer * layers * 4)));
  cu::FillUniform(w_all, DType::kBF16, per_layer * layers / 2, 0.02f, 5, nullptr);
  FillFp8Codes(w8_all, per_layer / 2 * layers);
  cu::FillConstant(scales_all, DType::kF32, rows_per_layer * layers, 0.02f / 448.f, nullptr);
  void *normed = nullptr, *qkv = nullptr, *gate_up = nullptr, *act = nullptr;
  float *x = nullptr, *norm_w = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&normed, size_t(hidden * 2)));
  LLM_CUDA_CHECK(cudaMalloc(&qkv, size_t(qkv_dim * 2)));
  LLM_CUDA_CHECK(cudaMalloc(&gate_up, size_t(2 * inter * 2)));
  LLM_CUDA_CHECK(cudaMalloc(&act, size_t(inter * 2)));
  LLM_CUDA_CHECK(cudaMalloc(&x, size_t(hidden * 4)));
  LLM_CUDA_CHECK(cudaMalloc(&norm_w, size_t(hidden * 4)));
  cu::FillUniform(x, DType::kF32, hidden, 1.f, 6, nullptr);
  cu::FillConstant(norm_w, DType::kF32, hidden, 1.f, nullptr);
  cudaStream_t stream = nullptr;
  LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  LLM_CUDA_CHECK(cudaEventCreate(&start));
  LLM_CUDA_CHECK(cudaEventCreate(&stop));
  // gemv_pdl_per_group: one CTA per row group (the GEMV's grid before it was persistent);
  // the other GEMV rows run the executor's grids (a persistent wave; o one CTA per group).
  // The ring rows sweep its size (GemvArgs::ring_kib).
  struct Impl {
    const char* name;
    bool fp8 = false, per_group = false;
    int ring_kib = 0;           // > 0: the ring kernel
    int fold = 0;               // 1: the folded RMSNorm, 2: that and the chained MLP
    int chain_ctas_per_sm = 0;  // > 0: the chain's grid capped at SMs x this (barrier cost)
  };
  const Impl impls[] = {{"cublaslt"},
                        {"gemv"},
                        {"gemv_pdl"},
                        {"gemv_pdl_norm_prologue"},
                        {"gemv_pdl_fp8", true},
                        {"gemv_pdl_per_group", false, true},
                        {"gemv_pdl_fp8_per_group", true, true},
                        {"gemv_ring48_pdl", false, false, 48},
                        {"gemv_ring96_pdl", false, false, 96},
                        {"gemv_ring192_pdl", false, false, 192},
                        {"gemv_ring48_pdl_fp8", true, false, 48},
                        {"gemv_ring96_pdl_fp8", true, false, 96},
                        {"gemv_ring192_pdl_fp8", true, false, 192},
                        {"gemv_pdl_fold", false, false, 0, 1},
                        {"gemv_pdl_fold_fp8", true, false, 0, 1},
                        {"gemv_pdl_chain", false, false, 0, 2},
                        {"gemv_pdl_chain_fp8", true, false, 0, 2},
                        {"gemv_pdl_chain_c1", false, false, 0, 2, 1},
                        {"gemv_pdl_chain_c2", false, false, 0, 2, 2},
                        {"gemv_pdl_chain_fp8_c1", true, false, 0, 2, 1},
                        {"gemv_pdl_chain_fp8_c2", true, false, 0, 2, 2},
                        {"gemv_pdl_chain_fp8_c4", true, false, 0, 2, 4}};
  int sms = 0;
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* partials = nullptr;
  unsigned* sync = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&partials, size_t((hidden + 3) / 4 * 4)));
  LLM_CUDA_CHECK(cudaMalloc(&sync, size_t(cu::kGemvChainSyncWords * 4)));
  LLM_CUDA_CHECK(cudaMemset(sync, 0, size_t(cu::kGemvChainSyncWords * 4)));
  for (int impl = 0; impl < int(std::size(impls)); ++impl) {
    const bool fp8 = impls[impl].fp8, per_group = impls[impl].per_group;
    const int ring_kib = impls[impl].ring_kib;
    const int fold = impls[impl].fold;
    cu::SetProgrammaticLaunch(impl >= 2);
    // The matrix whose first weight is element `at` of the layer stack and whose first row is
    // row `row` of it: bf16 weights, or with fp8 the codes and scales at the same positions.
    // One GEMV's arguments (with `fold`: producers, kAccumulateF32, write the next norm's input
    // into `normed` and the partials; consumers read them).
    auto args = [&](cu::GemvEpilogue e, const void* in, const float* norm, int64_t at, int64_t row,
                    void* out, int64_t m, int64_t k, bool is_o = false) {
      cu::GemvArgs g;
      g.waves = per_group || is_o ? 0 : 1;
      g.ring = ring_kib > 0;
      g.ring_kib = ring_kib > 0 ? ring_kib : g.ring_kib;
      g.epilogue = e;
      g.x = in;
      g.norm_weight = norm;
      g.eps = 1e-5f;
      g.w = fp8 ? static_cast<const void*>(static_cast<const uint8_t*>(w8_all) + at)
                : static_cast<const void*>(static_cast<const uint16_t*>(w_all) + at);
      g.w_scale = fp8 ? scales_all + row : nullptr;
      g.y = out;
      g.n = 1;
      g.m = m;
      g.k = k;
      if (fold > 0) {
        g.rms_partials = partials;
        if (e == cu::GemvEpilogue::kAccumulateF32) {
          g.rms_weight = norm_w;
          g.rms_x = normed;
        } else {
          g.rms_num_partials = (hidden + 3) / 4;
        }
      }
      return g;
    };
    auto gemv = [&](cu::GemvEpilogue e, const void* in, const float* norm, int64_t at, int64_t row,
                    void* out, int64_t m, int64_t k, bool is_o = false) {
      cu::Gemv(args(e, in, norm, at, row, out, m, k, is_o), stream);
    };
    auto norm = [&] {
      cu::AddRmsNorm(x, nullptr, norm_w, normed, DType::kBF16, nullptr, 1, hidden, 1e-5f, stream);
    };
    auto step = [&] {
      for (int64_t l = 0; l < layers; ++l) {
        const int64_t at_qkv = l * per_layer / 2, at_o = at_qkv + qkv_dim * hidden,
                      at_gu = at_o + hidden * hidden, at_d = at_gu + 2 * inter * hidden;
        const int64_t row_qkv = l * rows_per_layer, row_o = row_qkv + qkv_dim,
                      row_gu = row_o + hidden, row_d = row_gu + 2 * inter;
        const auto* w = static_cast<const uint16_t*>(w_all);
        const DType bf16 = DType::kBF16, f32 = DType::kF32;
        using E = cu::GemvEpilogue;
        if (impl == 0) {  // cuBLASLt and the separate kernels
          norm();
          gemm.Linear(normed, w + at_qkv, qkv, 1, qkv_dim, hidden, bf16, bf16, false, stream);
          gemm.Linear(qkv, w + at_o, x, 1, hidden, hidden, bf16, f32, true, stream);
          norm();
          gemm.Linear(normed, w + at_gu, gate_up, 1, 2 * inter, hidden, bf16, bf16, false, stream);
          cu::SiluMul(gate_up, act, 1, inter, bf16, stream);
          gemm.Linear(act, w + at_d, x, 1, hidden, inter, bf16, f32, true, stream);
        } else if (fold > 0) {  // the folded RMSNorm (layer 0's input norm a kernel)
          cu::GemvArgs g = args(E::kStore, normed, nullptr, at_qkv, row_qkv, qkv, qkv_dim, hidden);
          if (l == 0) {  // as the executor: layer 0's input norm is a kernel, q|k|v reads it
            norm();
            g.rms_partials = nullptr;
            g.rms_num_partials = 0;
          }
          cu::Gemv(g, stream);
          if (fold == 2) {
            cu::GemvChainArgs c;
            c.phase[0] =
                args(E::kAccumulateF32, qkv, nullptr, at_o, row_o, x, hidden, hidden, true);
            c.phase[1] = args(E::kSiluMul, normed, nullptr, at_gu, row_gu, act, 2 * inter, hidden);
            c.phase[2] = args(E::kAccumulateF32, act, nullptr, at_d, row_d, x, hidden, inter);
            c.sync = sync;
            c.max_ctas = sms * impls[impl].chain_ctas_per_sm;
            cu::GemvChain(c, stream);
          } else {
            gemv(E::kAccumulateF32, qkv, nullptr, at_o, row_o, x, hidden, hidden, true);
            gemv(E::kSiluMul, normed, nullptr, at_gu, row_gu, act, 2 * inter, hidden);
            gemv(E::kAccumulateF32, act, nullptr, at_d, row_d, x, hidden, inter);
          }
        } else if (impl == 3) {  // the RMSNorms in the GEMV prologues
          gemv(E::kStore, x, norm_w, at_qkv, row_qkv, qkv, qkv_dim, hidden);
          gemv(E::kAccumulateF32, qkv, nullptr, at_o, row_o, x, hidden, hidden);
          gemv(E::kSiluMul, x, norm_w, at_gu, row_gu, act, 2 * inter, hidden);
          gemv(E::kAccumulateF32, act, nullptr, at_d, row_d, x, hidden, inter);
        } else {  // as the executor's small steps (there q|k|v also carries RoPE + KV append)
          norm();
          gemv(E::kStore, normed, nullptr, at_qkv, row_qkv, qkv, qkv_dim, hidden);
          gemv(E::kAccumulateF32, qkv, nullptr, at_o, row_o, x, hidden, hidden, true);
          norm();
          gemv(E::kSiluMul, normed, nullptr, at_gu, row_gu, act, 2 * inter, hidden);
          gemv(E::kAccumulateF32, act, nullptr, at_d, row_d, x, hidden, inter);
        }
      }
    };
    step();  // cuBLASLt plans, lazy module loading
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step();
    LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    LLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) LLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    std::vector<float> ms(static_cast<size_t>(reps));
    for (int r = 0; r < reps; ++r) {
      LLM_CUDA_CHECK(cudaEventRecord(start, stream));
      LLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      LLM_CUDA_CHECK(cudaEventRecord(stop, stream));
      LLM_CUDA_CHECK(cudaEventSynchronize(stop));
      LLM_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(r)], start, stop));
    }
    std::sort(ms.begin(), ms.end());
    const double t = ms[ms.size() / 2];
    const int64_t weight_bytes = fp8 ? per_layer / 2 : per_layer;  // per layer
    std::printf(
        "JSON {\"kind\":\"decode_chain\",\"name\":\"%s\",\"impl\":\"%s\",\"layers\":%lld,"
        "\"weight_bytes\":%lld,\"ms\":%.4f,\"weight_tb_per_s\":%.3f}\n",
        name, impls[impl].name, (long long)layers, (long long)(weight_bytes * layers), t,
        double(weight_bytes * layers) / (t * 1e-3) / 1e12);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cu::SetProgrammaticLaunch(false);
  for (void* p : {w_all, w8_all, static_cast<void*>(scales_all), normed, qkv, gate_up, act,
                  static_cast<void*>(x), static_cast<void*>(norm_w), static_cast<void*>(partials),
                  static_cast<void*>(sync)})
    cudaFree(p);
  cudaStreamDestroy(stream);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool chain_only = false;  // --chain-only: the decode chains alone
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--chain-only") == 0) {
      chain_only = true;
    }
  }
  try {
    llm::cuda::Gemm gemm, gemm_fast, gemm_tuned;
    gemm_fast.set_fast_accum(true);
    gemm_tuned.set_tuning(true);  // each shape's first (warm-up) call times the candidates
    struct Shape {
      int64_t n, m, k;
      const char* name;
    };
    const Shape shapes[] = {{8192, 8192, 8192, "square"},
                            {8192, 6144, 4096, "llama3_8b_qkv"},
                            {8192, 28672, 4096, "llama3_8b_gate_up"},
                            {8192, 4096, 14336, "llama3_8b_down"},
                            {2048, 28672, 4096, "llama3_8b_gate_up_2k"},
                            {512, 6144, 4096, "llama3_8b_qkv_512"},
                            {512, 4096, 4096, "llama3_8b_o_512"},
                            {512, 28672, 4096, "llama3_8b_gate_up_512"},
                            {512, 4096, 14336, "llama3_8b_down_512"},
                            {512, 128256, 4096, "llama3_8b_lm_head_512"},
                            {256, 6144, 4096, "llama3_8b_qkv_256"},
                            {256, 28672, 4096, "llama3_8b_gate_up_256"},
                            {256, 4096, 14336, "llama3_8b_down_256"}};
    // dtype: bf16 (cuBLASLt's heuristic pick), bf16_tuned (the fastest of its candidates,
    // Gemm::set_tuning), fp8 (cuBLASLt's precise accumulation), fp8_fast (the tensor cores'
    // own).
    for (const char* dtype : {"bf16", "bf16_tuned", "fp8", "fp8_fast"}) {
      if (chain_only) break;
      const bool fp8 = dtype[0] == 'f';
      llm::cuda::Gemm& g = std::strcmp(dtype, "fp8_fast") == 0     ? gemm_fast
                           : std::strcmp(dtype, "bf16_tuned") == 0 ? gemm_tuned
                                                                   : gemm;
      for (const Shape& s : shapes) {
        const double ms = TimeGemm(g, s.n, s.m, s.k, reps, fp8);
        const double tflops = 2.0 * double(s.n) * double(s.m) * double(s.k) / (ms * 1e-3) / 1e12;
        // The bf16 rows keep their names (the e2e report reads "square" as the ceiling).
        const std::string name =
            std::string(s.name) + (std::strcmp(dtype, "bf16") != 0 ? std::string("_") + dtype : "");
        std::printf(
            "JSON {\"kind\":\"gemm\",\"name\":\"%s\",\"dtype\":\"%s\",\"n\":%lld,"
            "\"m\":%lld,\"k\":%lld,\"ms\":%.4f,\"tflops\":%.1f,\"device\":\"%s\"}\n",
            name.c_str(), dtype, (long long)s.n, (long long)s.m, (long long)s.k, ms, tflops,
            llm::cuda::DeviceDescription().c_str());
      }
    }
    using E = llm::cuda::GemvEpilogue;
    if (!chain_only) {
      TimeGemv(gemm, 6144, 4096, E::kStore, "llama3_8b_qkv_n1", reps);
      TimeGemv(gemm, 28672, 4096, E::kSiluMul, "llama3_8b_gate_up_n1", reps);
      TimeGemv(gemm, 4096, 14336, E::kAccumulateF32, "llama3_8b_down_n1", reps);
      TimeGemv(gemm, 4096, 4096, E::kAccumulateF32, "llama3_8b_o_n1", reps);
      TimeGemv(gemm, 128256, 4096, E::kStoreF32, "llama3_8b_lm_head_n1", reps);
    }
    TimeDecodeChain(gemm, "llama2_7b", 32, 4096, 3 * 4096, 11008, reps);
    TimeDecodeChain(gemm, "llama3_8b", 32, 4096, 6144, 14336, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_peak_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
