// Small-batch GEMV: the linear layers of the decode path at n <= 8 tokens, where a linear
// layer is a stream of its weights (one read of W at full HBM bandwidth is the whole cost) and
// cuBLASLt's n = 1 kernels reach only 1.5-2 TB/s on 4096-wide matrices (bench/RESULTS.md).
// CPU twin (the specification): cpu::Linear (kernels/cpu/matmul.h) and cpu::SiluMul
// (kernels/cpu/ops.h); test: tests/kernels/gemv_gpu_test.cc (label gpu).
//
//   s[t, j] = sum_i a[t, i] * w[j, i]          t < n, j < m, i < k;  w: dtype
//   s[t, j] = w_scale[j] * sum_i a[t, i] * E4m3ToF32(w[j, i])   with w_scale (--quantization
//             fp8: w holds e4m3 codes, kernels/fp8.h, one fp32 scale per output row; CPU twin
//             cpu::Linear with a kF8E4M3 WeightMatrix); the scale multiplies the fp32 sum once,
//             before any epilogue rounds it, so every epilogue below sees this s.
//   a = x (dtype [n, k]), or with the RMSNorm prologue (norm_weight set; kStore, kSiluMul and
//       kRopeAppendKv; n · k · 2 <= kGemvNormSharedBytes) a = dtype(g * (x * inv_rms)) of the
//       fp32 residual x [n, k], inv_rms = 1 / sqrt(mean(x²) + eps): what cuda::AddRmsNorm
//       would have written. Each CTA, after PdlWait, reads the residual row, reduces, and
//       writes the normalized rows into shared memory, where its FMAs read them. Measured
//       slower end to end than the separate RMSNorm kernel on the H200 (Llama-2-7B batch 1
//       4.05 against 3.81 ms/token: every CTA reads the same 32 KiB from L2 at once, before
//       its first FMA), so the executor uses it only with --gemv-norm-prologue.
//   epilogue:
//     kStore          y dtype [n, m]       = dtype(s)
//     kStoreF32       y fp32  [n, m]       = s                        (logits)
//     kAccumulateF32  y fp32  [n, m]      += s  (subnormals flush to 0) (residual add of o / down)
//     kRopeAppendKv   y dtype [n, num_heads, head_dim] = the rotated q; k, v into the cache
//     kSiluMul        y dtype [n, m / 2]   = dtype(silu(g) * u), g = dtype(s[t, j]),
//                     u = dtype(s[t, m/2 + j]): the gate|up projection with SiLU·mul fused,
//                     rounded exactly as a GEMM into dtype followed by cuda::SiluMul rounds.
//
// Design: a row group is 4 output rows (kSiluMul: 2 gate rows and their 2 up rows); a CTA of
// 256 threads splits k over all its threads: thread i takes 16-byte chunks i, i + 256, ... of
// every row, in stages of one chunk per row per thread (2048 columns; e4m3: 128 threads of 16
// codes, also 2048). The grid is one
// persistent wave (GemvArgs::waves): CTA b computes groups b, b + grid, ..., and its sequence of
// (group, stage) items is double buffered across group boundaries, so the next 16 KiB of its
// weights are in flight while it multiplies, reduces and stores a group (the reduction scratch
// alternates by group parity: one barrier per group). Against one CTA per group (a new CTA's
// ramp for every 32 KiB), the Llama-2-7B linear chain went 3.40 -> 3.30 ms (bench/RESULTS.md).
// The first two items are loaded before PdlWait() (kernels/cuda/common/launch.h): under
// programmatic dependent launch a GEMV streams its weights while the previous kernel finishes. No
// group's epilogue waits on a global load: kAccumulateF32 adds with a fire-and-forget reduction
// (each element once, so the same fp32 add as y += v, except that red.add.f32 flushes subnormals to
// zero: irrelevant for a residual stream), kRopeAppendKv reads slots and the cos / sin of every
// (token, dim) that the CTA computed into shared memory once (so head_dim <= 256). At n = 1
// the dtype kernels fit 64 registers (4 CTAs per SM; the q|k|v GEMV needed 74 with its sincosf
// in the epilogue: 3 per SM).
// fp32 accumulation; warp-shuffle then shared-memory reduction in a fixed order
// (deterministic, and the same for every grid). Needs k % 8 == 0 and 16-byte aligned x and w.
// E4m3 weights (the same kernel, templated on the weight format): a 16-byte chunk is 16 codes
// and pairs with two 16-byte chunks of x; the CTA has 128 threads (4 rows), so that a 4096-wide
// row is again 2 chunks per thread and an SM holds 6 CTAs at <= 80 registers (figures below
// from before the persistent grid): the same bytes in
// flight per thread and per SM as bf16, for half the bytes per row. Codes become floats
// exactly by cvt.rn.f16x2.e4m3x2 (sm_89+) and an fp16 -> fp32 convert; each CTA reads its 4
// rows' scales before PdlWait() too. Needs k % 16 == 0. On the H200
// (bench_gemm_peak_gpu, Llama-3-8B's linear layers, 32 layers, PDL): bf16 3.73 ms/step
// (3.74 TB/s), fp8 2.20 ms (3.17 TB/s of codes; 1.70x). Alone on the lm_head (32k CTAs, ramp
// and tail negligible) fp8 streams 4.24 TB/s against bf16's 4.41; in the chain, the 1.53 ms
// saved for 6.98 GB fewer bytes is 4.6 TB/s, so the gap to 2x is per-kernel cost that fp8 does
// not halve (ramp, tail and partial last wave of each GEMV, the RMSNorm kernels: ~0.6 ms per
// step if both stream alike). 256 threads (1 chunk per thread at k = 4096): 2.46 ms; 64: 2.23.
// Registers (at n = 1: dtype kernels <= 64, 4 CTAs/SM, or <= 80 with the RMSNorm prologue;
// e4m3 <= 80; no spills), from the repository root:
//   nvcc -DLLM_HAS_CUDA=1 -I. -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17
//     -Xptxas -v -c kernels/cuda/gemv/gemv.cu -o /tmp/gemv.o   (and gemv_ring.cu)
// Benchmark (bf16 and fp8 weight TB/s per matrix and in a 32-layer chain): bench_gemm_peak_gpu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention/attention.h"
#include "kernels/dtype.h"
#include "kernels/paged_kv.h"

namespace llm::cuda {

enum class GemvEpilogue : uint8_t { kStore, kStoreF32, kAccumulateF32, kSiluMul, kRopeAppendKv };

// kRopeAppendKv: the q|k|v projection with cuda::RopeAppendKv fused (kernels/cuda/ops/model_ops.h,
// the same math and rounding, so the results are bit-identical to kStore + RopeAppendKv): a
// CTA's 4 rows are dims {p, p+1, p+half, p+half+1} of one head (the rotate-half partners), so
// the epilogue rotates q heads into q_out, rotates k heads into their KV slot and copies v heads
// to theirs (k and v only for slots >= 0). w is [(num_heads + 2 num_kv_heads) * head_dim, k].
struct GemvRope {
  const int32_t* positions = nullptr;                 // [n]
  const int64_t* slot_mapping = nullptr;              // [n] flat slots; < 0: no KV write
  const float* inv_freq = nullptr;                    // [head_dim / 2]
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;  // head_dim % 4 == 0
  PagedKvLayout layout;
  void* k_cache = nullptr;  // the layer's pools (dtype, or e4m3 with kv_format.fp8)
  void* v_cache = nullptr;
  KvCacheFormat kv_format;  // fp8: quantized as cuda::RopeAppendKv does, bit for bit
};

inline constexpr int kGemvMaxTokens = 8;
inline constexpr int kGemvMaxRingKib = 200;  // + ~11 KiB of static scratch <= 227 KiB per CTA

// The RMSNorm prologue keeps the n normalized rows (n · k dtype values) in shared memory.
inline constexpr int64_t kGemvNormSharedBytes = 32 * 1024;
inline constexpr bool GemvNormFits(int64_t n, int64_t k) {
  return n >= 1 && k >= 1 && n * k * 2 <= kGemvNormSharedBytes;
}

struct GemvArgs {
  GemvEpilogue epilogue = GemvEpilogue::kStore;
  const void* x = nullptr;             // dtype [n, k]; fp32 [n, k] with norm_weight
  const float* norm_weight = nullptr;  // fp32 [k]: the RMSNorm prologue
  float eps = 1e-6f;
  const void* w = nullptr;  // dtype [m, k]; e4m3 codes [m, k] with w_scale
  // fp32 [m]: w holds e4m3 codes [m, k] with one scale per row (--quantization fp8)
  const float* w_scale = nullptr;
  void* y = nullptr;  // see the epilogue
  int64_t n = 0, m = 0, k = 0;
  DType dtype = DType::kBF16;  // of x, of w without w_scale, of y for kStore / kSiluMul / RoPE
  GemvRope rope;               // kRopeAppendKv
  // The RMSNorm between two GEMVs, folded into both (rms_partials set; dtype bf16; no
  // norm_weight), so that no RMSNorm kernel runs between them:
  //  - producer (kAccumulateF32): besides y += s (then a load, the same fp32 add and a store),
  //    writes rms_x = dtype(rms_weight ⊙ y) [n, m] and rms_partials[t, g] = the sum of y[t, j]²
  //    over row group g's 4 rows ([n, ceil(m / 4)], in a fixed order);
  //  - consumer (kStore, kSiluMul, kRopeAppendKv): x is such an rms_x of a k-wide residual,
  //    and every sum is multiplied by inv_rms[t] = 1 / sqrt(sum_g rms_partials[t, g] / k +
  //    eps) (rms_num_partials = ceil(k / 4) groups, summed in a fixed order) before its
  //    epilogue: the
  //    RMSNorm of cuda::AddRmsNorm with its rounding to dtype taken before the scale by inv_rms
  //    instead of after (the same relative rounding error).
  const float* rms_weight = nullptr;  // producer: fp32 [m], the next RMSNorm's weight
  void* rms_x = nullptr;              // producer: dtype [n, m]
  float* rms_partials = nullptr;
  int64_t rms_num_partials = 0;  // consumer
  // The grid: min(row groups, waves × SMs × resident CTAs); waves = 0: one CTA per row group.
  int waves = 1;
  // > 0: at most this many CTAs (tests: many row groups per CTA).
  int max_ctas = 0;
  // With waves > 0: as few CTAs as give every CTA the same number of row groups (± 1 only
  // where they do not divide), so that no CTA streams a last group alone while the rest of its
  // SM is done: 1,024 groups on 924 slots (e4m3 at 7 per SM) run as 512 CTAs of 2, not 100 of
  // 2 beside 824 of 1. The register kernel only; the same bits (a group's sums do not depend on
  // the grid). Not yet measured end to end (--gemv-balanced-grid).
  bool balanced = false;
  // The ring kernel: the weights stream through a ring of stages in shared memory that one
  // producer warp fills with bulk copies (ring_kib per CTA, one CTA per SM × max(waves, 1)),
  // issued from the kernel's start, before PdlWait, and dependents may launch first thing.
  // The next kernel's CTAs fit beside it, so under programmatic dependent launch a GEMV after
  // an RMSNorm or the decode attention has its first 96 KiB per SM of weights loaded before
  // its input exists. The same items, FMAs and reduction order as the register kernel: the
  // same bits. Not with the RMSNorm prologue or the folded RMSNorm. Measured slower (H100,
  // Llama-2-7B batch 1: bf16 5.03 ms/token at 192 KiB against 4.98; e4m3 6.08 against 3.08;
  // bench/NOTEBOOK.md): one CTA's 4 (e4m3) or 8 computing warps per SM cannot hide the
  // latency of their x loads, barriers and epilogues the way the register kernel's 24-32 do.
  bool ring = false;
  // Its size, 1 .. kGemvMaxRingKib (rounded down to whole stages, at least 2: stages are 16 KiB
  // with dtype weights, 8 KiB with e4m3). Up to ~100, two CTAs (two GEMVs) fit an SM.
  int ring_kib = 96;
};

// True when Gemv can run this shape (1 <= n <= kGemvMaxTokens, k % 8 == 0, even m for
// kSiluMul, bf16/f16, 16-byte aligned x, w and norm_weight; the prologue only with kStore,
// kSiluMul or kRopeAppendKv and n · k · 2 <= kGemvNormSharedBytes; with w_scale (e4m3
// weights) k % 16 == 0; the folded RMSNorm only bf16, without the prologue and not with
// kStoreF32, the producer with rms_weight and rms_x, the consumer with rms_num_partials =
// ceil(k / 4), the producer's row groups).
bool GemvSupports(const GemvArgs& a);

// Asynchronous on `stream` (launched through cuda::Launch: programmatic dependent launch when
// enabled); std::invalid_argument when !GemvSupports(a).
void Gemv(const GemvArgs& a, cudaStream_t stream);

// The MLP half of a decode layer in one persistent kernel (gemv_chain.cu, --gemv-chain): o, then
// gate|up, then down, each what Gemv(phase[p]) computes, bit for bit, with a grid barrier
// between phases instead of a kernel boundary (and of the RMSNorm kernel: the norm is folded,
// GemvArgs::rms_partials). Every CTA streams its first weights of the next phase before it
// waits at the barrier, as a GEMV does before PdlWait, and no CTA gives its SM slot up between
// phases, so no phase waits for its CTAs to become resident. Per layer 3 kernels (q|k|v,
// attention, this) instead of 7 (5 with the fold alone). The grid is at most one co-resident
// wave (occupancy × SMs), so the barriers cannot wait on a CTA that has no slot; CTAs of other
// kernels may delay it, not block it. Measured slower in its first version (one arrival counter
// for the whole grid, reset at the end; H100, Llama-2-7B batch 1: bf16 5.32 ms/token against
// 4.98 with the defaults and 5.01 with the fold alone; e4m3 3.63 against 3.08 and 3.14;
// bench/NOTEBOOK.md), so it is opt-in; the barrier since (subgroup counters, no reset) has not
// run on a GPU yet.
inline constexpr int kGemvChainPhases = 3;
inline constexpr int kGemvChainSubgroups = 32;  // barrier arrivals spread over 32 counters
inline constexpr int kGemvChainLineWords = 32;  // one counter per 128-byte line
inline constexpr int kGemvChainSyncWords = (2 + kGemvChainSubgroups) * kGemvChainLineWords;
struct GemvChainArgs {
  // o: kAccumulateF32, the folded RMSNorm's producer (rms_weight, rms_x, rms_partials);
  // gate|up: kSiluMul, its consumer (x = o's rms_x, the same rms_partials); down:
  // kAccumulateF32, a producer again (for the next layer's q|k|v, or the final norm's weight).
  // bf16, the same n and weight format (all e4m3 or none); ring, waves and max_ctas ignored.
  GemvArgs phase[kGemvChainPhases];
  // The grid barrier's words (kGemvChainSyncWords, 16-byte aligned), zero before the first
  // launch (cudaMemset once): its counters return to zero at every barrier, its generation word
  // only grows. Chains may share them, one at a time (in one stream: each waits for the kernels
  // before it).
  unsigned* sync = nullptr;
  int max_ctas = 0;  // > 0: at most this many CTAs (tests: many groups per CTA)
};

// True when GemvChain can run c (each phase GemvSupports it, with the roles above).
bool GemvChainSupports(const GemvChainArgs& c);

// Asynchronous on `stream` (cuda::Launch); std::invalid_argument when !GemvChainSupports(c).
void GemvChain(const GemvChainArgs& c, cudaStream_t stream);

}  // namespace llm::cuda
