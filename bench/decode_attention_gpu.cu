// Paged decode attention on the GPU: validate against the CPU reference, then time against
// the device's copy bandwidth (kernels/cuda/attention/decode_attention.cu).
//
//   ninja -C build bench_decode_attention_gpu && ./build/bench_decode_attention_gpu
//
// Ladder (each version validated and timed by this bench; older ones are kept in git history):
//   v1  CTA = (sequence, KV head, split), 4 warps × 16 keys of each 64-key tile, mma.m16n8k16
//       for Q·Kᵀ and P·V (query rows padded to 16), cp.async 16-byte loads in a 3-stage
//       (hd 128) / 4-stage (hd 64) pipeline, page indices staged in shared memory by cp.async
//       one tile ahead, split-KV by FA2's wave-efficiency rule + a combine kernel.
//   v2  combine kernel in one parallel pass (split weights 2^(m_s - m) computed by a warp into
//       shared memory, acc loads unrolled) instead of v1's serial OnlineSoftmax::Merge chain,
//       which cost ~0.6 µs of dependent L2 latency per split (v1: 1×4k 26.6 µs, 1×32k 55 µs).
//   v3  one launch: the last CTA of each (sequence, KV head) merges the splits (arrival
//       counter in the workspace, reset in-kernel); splits chosen to fill every resident slot
//       (1×32k: 33 splits = 264 CTAs; v2 took 29 = 232); balanced split sizes; the first page
//       indices fetched as one cp.async group; programmatic dependent launch (PDL) capable.
//   "v3-nosplit" is v3 with num_splits forced to 1, to show what split-KV buys.
//   v4  (fp8 only) the persistent warp-item kernel (DecodeKernelChoice::kWarpItems): every warp
//       walks whole (sequence, KV head) items 16 keys per stage through one cp.async pipeline
//       across item boundaries, no cross-warp merge; 3 CTAs of 4 warps per SM. Slower than v3
//       on every shape measured (RESULTS.md: per-warp instruction latency, not memory
//       parallelism, bounds both), so opt-in only. v3 here is DecodeKernel (kCta).
//   v4-itemsT / auto (fp8): the transposed per-warp step (keys as the mma's rows, heads as its
//       columns) in the warp-item kernel (kWarpItemsT) / in DecodeKernel, which is what the
//       automatic choice (kAuto, the "auto" rows) runs for fp8 caches with groups <= 8.
//
// KV cache formats (--kv, default both; every JSON line carries "kv"):
//   bf16  the pools hold bf16 (2 B per K/V element), q/out bf16.
//   fp8   the pools hold FP8 E4M3 codes (kernels/fp8.h, 1 B per element; AttentionParams::
//         kv_format, k_scale 0.5, v_scale 0.25), q/out bf16; the kernel dequantizes to fp16 and
//         runs the tensor cores in fp16. Codes are F32ToE4m3(normal / scale) (never the NaN
//         codes 0x7f / 0xff). Validated against the CPU fp8 reference (cpu::PagedDecodeAttention
//         over PagedKvView<const uint8_t> with cpu::Fp8KvScales) with the bf16 tolerance, timed
//         the same way; v3-nosplit is added when v3's own split count is > 1 (fp8 occupancy
//         differs from bf16's, which DecodeAutoSplits assumes). When both formats run, each fp8
//         line also gives time_ratio_fp8_bf16 (per-launch median ms, fp8 / bf16) and
//         graph_ratio_fp8_bf16 (graph_pdl_us, fp8 / bf16) against the same variant and shape.
//         bench/attention_report.py keeps fp8 lines out of its bf16 tables (under "decode_fp8").
//
// Method: bytes = K + V bytes read (batch × context × kv_heads × head_dim × 2 (K and V) ×
// 2 B for bf16, 1 B for fp8); each shape rotates among enough disjoint KV sets (each with its
// own shuffled block table and query) to exceed 512 MB of K+V, so every timed launch reads
// from HBM, not the 50 MB L2; 5 warm-up launches, then the median of 30 launches, each timed
// by its own CUDA events. The copy
// ceiling is cudaMemcpy device-to-device of 2 GiB (read + write bytes / time), median of 10,
// measured in the same run. max_err: sequences 0 and batch - 1 of set 0 (the worse of the two)
// against cpu::PagedDecodeAttention on the same bf16 values (fp8: the same e4m3 codes and
// scales) in fp32 (max abs error / max |ref| is printed as rel_err).
// Also per shape (fields graph_us, graph_pdl_us): 30 launches over the rotating sets captured
// into one CUDA graph, replayed (median of 5 replays / 30), with PDL off and on: the kernel time
// without the host launch and event overhead that the per-launch median includes, as the
// engine's captured decode steps run it.
//
//   --sanitize-small   validation plus one small shape with a few launches (for
//                      compute-sanitizer; scripts/gpu_attention_bench.sh), then exit
//   --shapes BxC,...   time these batch × context shapes instead of the six above
//   --kv fp8|bf16|both KV cache formats to validate and time (default both: bf16 first, then
//                      fp8, per shape)
//   --ragged           sequence i > 0 attends over a length drawn from (0.75·C, C] instead of C
//                      (a throughput run's decode batch); bytes count the keys actually read
//   --window W         after each shape, the same shape with a sliding window of W keys
//                      (AttentionBatch::sliding_window; variant "v3-sw", JSON "sliding_window"):
//                      bytes count only the window's K and V (min(C, W) keys per sequence), the
//                      bytes it must read, so ratio_to_copy compares like with like beside the
//                      full-context line (e.g. --shapes 64x32768 --window 4096)
//   --head-dim D       64, 128 (default) or 256 (Gemma 3; no warp-item rows there: the v4 kernels
//                      take 64 and 128)
//   --heads H --kv-heads K   query and KV heads (default 32 and 8; Gemma-3-12B: 16 and 8)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/dtype.h"
#include "kernels/fp8.h"

namespace {

using llm::AttentionBatch;
using llm::PagedKvLayout;
using llm::PagedKvView;

// Deterministic pseudo-random bf16 in [-1, 1) (never all zeros: see METHOD.md).
__global__ void FillKernel(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ (uint32_t(i >> 32) + seed) * 0x9e3779b9u;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float f = float(x >> 8) * (2.f / 16777216.f) - 1.f;
    p[i] = __bfloat16_as_ushort(llm::cuda::vec::FromF32<__nv_bfloat16>(f));
  }
}

void Fill(void* p, size_t n, uint32_t seed) {
  FillKernel<<<4096, 256>>>(static_cast<uint16_t*>(p), n, seed);
  LLM_CUDA_CHECK(cudaGetLastError());
}

// The fp8 cache's per-tensor scales (code c stands for E4m3ToF32(c) · scale); not 1, so the
// kernel's folding of k_scale / v_scale is checked too.
constexpr float kKScale = 0.5f, kVScale = 0.25f;

llm::cuda::KvCacheFormat KvFormat(bool fp8) {
  llm::cuda::KvCacheFormat f;
  f.fp8 = fp8;
  f.k_scale = fp8 ? kKScale : 1.f;
  f.v_scale = fp8 ? kVScale : 1.f;
  return f;
}

llm::cpu::Fp8KvScales CpuScales() {
  llm::cpu::Fp8KvScales s;
  s.k = kKScale;
  s.v = kVScale;
  return s;
}

const char* KvName(bool fp8) { return fp8 ? "fp8" : "bf16"; }

// F32ToE4m3, never a NaN code (0x7f / 0xff): those become ±448 (unreachable for finite x,
// which F32ToE4m3 saturates, but the pools must never hold NaN).
__host__ __device__ inline uint8_t E4m3Code(float x) {
  const uint8_t c = llm::F32ToE4m3(x);
  return (c & 0x7f) == 0x7f ? uint8_t((c & 0x80) | 0x7e) : c;
}

__device__ inline uint32_t Mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Deterministic pseudo-random e4m3 codes: F32ToE4m3(z / scale), z standard normal
// (Box-Muller on two hashed uniforms; u1 in (0, 1], so |z| <= 5.8 and finite).
__global__ void FillE4m3Kernel(uint8_t* p, size_t n, uint32_t seed, float inv_scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t a = Mix(uint32_t(i) * 2654435761u ^ (uint32_t(i >> 32) + seed) * 0x9e3779b9u);
    const uint32_t b = Mix(a ^ 0x68e31da4u);
    const float u1 = (float(a >> 8) + 1.f) * (1.f / 16777216.f);  // (0, 1]
    const float u2 = float(b >> 8) * (1.f / 16777216.f);          // [0, 1)
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    p[i] = E4m3Code(z * inv_scale);
  }
}

void FillE4m3(void* p, size_t n, uint32_t seed, float scale) {
  FillE4m3Kernel<<<4096, 256>>>(static_cast<uint8_t*>(p), n, seed, 1.f / scale);
  LLM_CUDA_CHECK(cudaGetLastError());
}

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double CopyBandwidthTBs() {
  const size_t bytes = size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&a, bytes));
  LLM_CUDA_CHECK(cudaMalloc(&b, bytes));
  LLM_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  LLM_CUDA_CHECK(cudaEventCreate(&e0));
  LLM_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    LLM_CUDA_CHECK(cudaEventRecord(e0));
    LLM_CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    LLM_CUDA_CHECK(cudaEventRecord(e1));
    LLM_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    LLM_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (Median(ms) * 1e-3) / 1e12;
}

struct Shape {
  int batch;
  int context;     // keys attended per sequence (context_lens = context - 1)
  int window = 0;  // sliding window (0: every key)
};

struct Result {
  std::string variant;
  bool fp8;  // KV cache format: e4m3 pools (else bf16)
  Shape shape;
  float ms;
  double tbs;
  int splits;
  int ctas;
  float max_err;
  float rel_err;
  float graph_ms;             // per launch inside a captured graph, PDL off (0 = not measured)
  float graph_pdl_ms;         // same, PDL on
  float fp8_over_bf16 = 0.f;  // fp8 only: ms / the same variant's bf16 ms (0 = no bf16 run)
};

// Query heads, KV heads and head_dim (--heads, --kv-heads, --head-dim; default Llama-3-8B's).
int kHeads = 32, kKvHeads = 8, kHeadDim = 128;
int kBlock = 16;        // tokens per KV page (--block-size)
bool g_ragged = false;  // --ragged

// One shape: `sets` disjoint KV sets in one pool, each with its own shuffled block table.
struct Problem {
  Shape shape;
  bool fp8 = false;  // e4m3 pools (1 B per element) instead of bf16 (2 B)
  int sets = 1;
  int64_t blocks_per_seq = 0;
  PagedKvLayout layout;
  void* k = nullptr;
  void* v = nullptr;
  void* q = nullptr;          // [sets, batch, heads, hd]
  void* out = nullptr;        // [batch, heads, hd]
  int32_t* tables = nullptr;  // [sets, batch, blocks_per_seq]
  int32_t* ctx = nullptr;
  int32_t* cu = nullptr;
  std::vector<int32_t> host_tables;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  int64_t total_keys = 0;  // keys attended over by the batch (--ragged: fewer than batch × C)
  std::vector<int32_t> host_ctx;  // context_lens of every sequence
  llm::cuda::DecodeKernelChoice choice = llm::cuda::DecodeKernelChoice::kCta;

  int ElemBytes() const { return fp8 ? 1 : 2; }

  Problem(Shape s, int64_t min_bytes, bool fp8_cache) : shape(s), fp8(fp8_cache) {
    // Bytes one launch reads (with a window, only the window's keys): the rotation below.
    const int read_keys = s.window > 0 ? std::min(s.context, s.window) : s.context;
    const double kv_bytes = double(s.batch) * read_keys * kKvHeads * kHeadDim * ElemBytes() * 2;
    sets = std::max<int>(1, int(std::ceil(double(min_bytes) / kv_bytes)));
    blocks_per_seq = (s.context + kBlock - 1) / kBlock;
    const int64_t num_blocks = int64_t(sets) * s.batch * blocks_per_seq;
    layout = PagedKvLayout{num_blocks, kBlock, kKvHeads, kHeadDim};
    LLM_CUDA_CHECK(cudaMalloc(&k, layout.pool_elements() * ElemBytes()));
    LLM_CUDA_CHECK(cudaMalloc(&v, layout.pool_elements() * ElemBytes()));
    if (fp8) {
      FillE4m3(k, layout.pool_elements(), 1, kKScale);
      FillE4m3(v, layout.pool_elements(), 2, kVScale);
    } else {
      Fill(k, layout.pool_elements(), 1);
      Fill(v, layout.pool_elements(), 2);
    }
    const size_t q_elems = size_t(sets) * s.batch * kHeads * kHeadDim;
    LLM_CUDA_CHECK(cudaMalloc(&q, q_elems * 2));
    Fill(q, q_elems, 3);
    LLM_CUDA_CHECK(cudaMalloc(&out, size_t(s.batch) * kHeads * kHeadDim * 2));
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(42);
    std::shuffle(perm.begin(), perm.end(), rng);
    host_tables = perm;  // [sets][batch][blocks_per_seq]
    LLM_CUDA_CHECK(cudaMalloc(&tables, host_tables.size() * 4));
    LLM_CUDA_CHECK(
        cudaMemcpy(tables, host_tables.data(), host_tables.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> h_ctx(s.batch, s.context - 1), h_cu(s.batch + 1);
    std::mt19937 len_rng(7);
    for (int i = 1; g_ragged && i < s.batch; ++i)
      h_ctx[i] -= int32_t(len_rng() % uint32_t(std::max(1, s.context / 4)));
    for (int32_t c : h_ctx) total_keys += s.window > 0 ? std::min(c + 1, s.window) : c + 1;
    host_ctx = h_ctx;
    std::iota(h_cu.begin(), h_cu.end(), 0);
    LLM_CUDA_CHECK(cudaMalloc(&ctx, h_ctx.size() * 4));
    LLM_CUDA_CHECK(cudaMalloc(&cu, h_cu.size() * 4));
    LLM_CUDA_CHECK(cudaMemcpy(ctx, h_ctx.data(), h_ctx.size() * 4, cudaMemcpyHostToDevice));
    LLM_CUDA_CHECK(cudaMemcpy(cu, h_cu.data(), h_cu.size() * 4, cudaMemcpyHostToDevice));
    ws_bytes = llm::cuda::DecodeWorkspaceBytes(s.batch, kHeads, kHeadDim, 128);
    LLM_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    LLM_CUDA_CHECK(cudaMemset(ws, 0, ws_bytes));  // the split counters start at zero (once)
  }
  ~Problem() {
    for (void* p : {k, v, q, out, static_cast<void*>(tables), static_cast<void*>(ctx),
                    static_cast<void*>(cu), ws})
      cudaFree(p);
  }

  llm::cuda::AttentionParams Params(int set) const {
    llm::cuda::AttentionParams p;
    p.q = static_cast<const uint16_t*>(q) + size_t(set) * shape.batch * kHeads * kHeadDim;
    p.out = out;
    p.kv = PagedKvView<const void>{k, v, layout};
    p.batch = AttentionBatch{shape.batch, cu, ctx,
                             tables + int64_t(set) * shape.batch * blocks_per_seq, blocks_per_seq};
    p.batch.sliding_window = shape.window;
    p.num_heads = kHeads;
    p.scale = 1.f / std::sqrt(float(kHeadDim));
    p.dtype = llm::DType::kBF16;
    p.kv_format = KvFormat(fp8);
    p.max_q_len = 1;
    p.max_num_keys = shape.context;
    return p;
  }

  // Sequences 0 and batch - 1 of set 0 (with --ragged the last one is shorter than C) against
  // the CPU reference: (max abs err, max |ref|) of the one with the larger ratio.
  std::pair<float, float> Check(int splits) {
    llm::cuda::PagedDecodeAttention(Params(0), splits, ws, ws_bytes, nullptr, nullptr, choice);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    const size_t row = size_t(kHeads) * kHeadDim;
    std::vector<uint16_t> got(size_t(shape.batch) * row), qh(size_t(shape.batch) * row);
    LLM_CUDA_CHECK(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost));
    LLM_CUDA_CHECK(cudaMemcpy(qh.data(), q, qh.size() * 2, cudaMemcpyDeviceToHost));
    std::pair<float, float> worst{0.f, 0.f};
    for (const int seq : {0, shape.batch - 1}) {
      const auto r = CheckSequence(seq, got.data() + seq * row, qh.data() + seq * row);
      if (std::isinf(r.first) || r.first * worst.second >= worst.first * r.second) worst = r;
      if (shape.batch == 1) break;
    }
    return worst;
  }

  // Sequence `seq` of set 0 (its output `got` and query `qh`, kHeads × kHeadDim each).
  std::pair<float, float> CheckSequence(int seq, const uint16_t* got, const uint16_t* qh) {
    // Gather the sequence's blocks into a compact pool (fp32; fp8: the e4m3 codes), blocks
    // renumbered 0..n-1.
    const int32_t num_keys = host_ctx[size_t(seq)] + 1;
    const int64_t n = (num_keys + kBlock - 1) / kBlock;
    const int64_t bstride = layout.block_stride();
    PagedKvLayout small{n, kBlock, kKvHeads, kHeadDim};
    std::vector<float> kf, vf;
    std::vector<uint8_t> kc, vc;
    if (fp8) {
      kc.resize(small.pool_elements());
      vc.resize(small.pool_elements());
    } else {
      kf.resize(small.pool_elements());
      vf.resize(small.pool_elements());
    }
    std::vector<uint16_t> tmp(bstride);
    for (int64_t b = 0; b < n; ++b) {
      const int64_t src = host_tables[size_t(seq * blocks_per_seq + b)];
      for (int kv = 0; kv < 2; ++kv) {
        if (fp8) {
          const uint8_t* pool = static_cast<const uint8_t*>(kv == 0 ? k : v);
          uint8_t* dst = (kv == 0 ? kc.data() : vc.data()) + b * bstride;
          LLM_CUDA_CHECK(cudaMemcpy(dst, pool + src * bstride, bstride, cudaMemcpyDeviceToHost));
          continue;
        }
        const uint16_t* pool = static_cast<const uint16_t*>(kv == 0 ? k : v);
        LLM_CUDA_CHECK(
            cudaMemcpy(tmp.data(), pool + src * bstride, bstride * 2, cudaMemcpyDeviceToHost));
        float* dst = (kv == 0 ? kf.data() : vf.data()) + b * bstride;
        for (int64_t i = 0; i < bstride; ++i) dst[i] = llm::Bf16ToF32(tmp[i]);
      }
    }
    const size_t row = size_t(kHeads) * kHeadDim;
    std::vector<int32_t> table(n), ctx_h{num_keys - 1}, cu_h{0, 1};
    std::iota(table.begin(), table.end(), 0);
    std::vector<float> qf(row), ref(row);
    for (size_t i = 0; i < row; ++i) qf[i] = llm::Bf16ToF32(qh[i]);
    AttentionBatch b{1, cu_h.data(), ctx_h.data(), table.data(), n};
    b.sliding_window = shape.window;
    if (fp8) {
      llm::cpu::PagedDecodeAttention(
          qf.data(), PagedKvView<const uint8_t>{kc.data(), vc.data(), small}, CpuScales(), b,
          kHeads, 1.f / std::sqrt(float(kHeadDim)), ref.data(), 1);
    } else {
      llm::cpu::PagedDecodeAttention(qf.data(),
                                     PagedKvView<const float>{kf.data(), vf.data(), small}, b,
                                     kHeads, 1.f / std::sqrt(float(kHeadDim)), ref.data(), 1);
    }
    float err = 0, mx = 0;
    for (size_t i = 0; i < row; ++i) {
      const float g = llm::Bf16ToF32(got[i]);
      err = std::isnan(g) ? INFINITY : std::max(err, std::fabs(g - ref[i]));
      mx = std::max(mx, std::fabs(ref[i]));
    }
    return {err, mx};
  }

  // Per launch inside a CUDA graph of `n` launches over the rotating sets (median of `reps`
  // replays), with PDL on or off.
  float GraphTime(int splits, bool pdl, int n, int reps) {
    const bool saved = llm::cuda::ProgrammaticLaunch();
    llm::cuda::SetProgrammaticLaunch(pdl);
    cudaStream_t stream;
    LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; ++i)
      llm::cuda::PagedDecodeAttention(Params(i % sets), splits, ws, ws_bytes, stream, nullptr,
                                      choice);
    LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    LLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    LLM_CUDA_CHECK(cudaEventCreate(&e0));
    LLM_CUDA_CHECK(cudaEventCreate(&e1));
    LLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      LLM_CUDA_CHECK(cudaEventRecord(e0, stream));
      LLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      LLM_CUDA_CHECK(cudaEventRecord(e1, stream));
      LLM_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      LLM_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t / n);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    llm::cuda::SetProgrammaticLaunch(saved);
    return Median(ms);
  }

  Result Time(const std::string& variant, int splits, int iters = 30, bool graphs = true) {
    cudaEvent_t e0, e1;
    LLM_CUDA_CHECK(cudaEventCreate(&e0));
    LLM_CUDA_CHECK(cudaEventCreate(&e1));
    llm::cuda::DecodeLaunchInfo info;
    for (int i = 0; i < 5; ++i)
      llm::cuda::PagedDecodeAttention(Params(i % sets), splits, ws, ws_bytes, nullptr, &info,
                                      choice);
    std::vector<float> ms;
    for (int i = 0; i < iters; ++i) {
      const auto p = Params((i + 5) % sets);
      LLM_CUDA_CHECK(cudaEventRecord(e0));
      llm::cuda::PagedDecodeAttention(p, splits, ws, ws_bytes, nullptr, nullptr, choice);
      LLM_CUDA_CHECK(cudaEventRecord(e1));
      LLM_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      LLM_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    const float med = Median(ms);
    // K + V bytes actually read: 2 B per element for bf16, 1 B for fp8.
    const double bytes = double(total_keys) * kKvHeads * kHeadDim * ElemBytes() * 2;
    const float g = graphs ? GraphTime(splits, false, 30, 5) : 0.f;
    const float gp = graphs ? GraphTime(splits, true, 30, 5) : 0.f;
    const auto [err, mx] = Check(splits);
    return Result{variant,
                  fp8,
                  shape,
                  med,
                  bytes / (med * 1e-3) / 1e12,
                  info.num_splits,
                  info.num_ctas,
                  err,
                  mx > 0 ? err / mx : err,
                  g,
                  gp};
  }
};

// Small ragged validation against the CPU on every element (splits 1, auto, 8); fp8: e4m3
// pools of F32ToE4m3(normal / scale) against the CPU fp8 reference.
bool Validate(bool fp8) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::vector<int32_t> keys = {1000, 37, 2500};
  const int64_t ns = keys.size();
  int64_t maxb = 0, total = 0;
  for (int32_t n : keys) {
    maxb = std::max<int64_t>(maxb, (n + kBlock - 1) / kBlock);
    total += (n + kBlock - 1) / kBlock;
  }
  PagedKvLayout layout{total, kBlock, kKvHeads, kHeadDim};
  std::vector<int32_t> perm(total), tables(ns * maxb, 0), ctx(ns), cu(ns + 1);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (int64_t s = 0; s < ns; ++s) {
    ctx[s] = keys[s] - 1;
    cu[s] = int32_t(s);
    for (int64_t b = 0; b < (keys[s] + kBlock - 1) / kBlock; ++b)
      tables[s * maxb + b] = perm[next++];
  }
  cu[ns] = int32_t(ns);
  const size_t pool = size_t(layout.pool_elements());
  std::vector<uint16_t> kb, vb, qb(ns * kHeads * kHeadDim);
  std::vector<uint8_t> kc, vc;  // fp8 pools
  std::vector<float> kf, vf, qf(qb.size()), ref(qb.size());
  if (fp8) {
    kc.resize(pool);
    vc.resize(pool);
    for (size_t i = 0; i < pool; ++i) {
      kc[i] = E4m3Code(normal(rng) / kKScale);
      vc[i] = E4m3Code(normal(rng) / kVScale);
    }
  } else {
    kb.resize(pool);
    vb.resize(pool);
    kf.resize(pool);
    vf.resize(pool);
    for (size_t i = 0; i < pool; ++i) {
      kb[i] = llm::F32ToBf16(normal(rng));
      vb[i] = llm::F32ToBf16(normal(rng));
      kf[i] = llm::Bf16ToF32(kb[i]);
      vf[i] = llm::Bf16ToF32(vb[i]);
    }
  }
  for (size_t i = 0; i < qb.size(); ++i) {
    qb[i] = llm::F32ToBf16(normal(rng));
    qf[i] = llm::Bf16ToF32(qb[i]);
  }
  const float scale = 1.f / std::sqrt(float(kHeadDim));
  AttentionBatch hb{ns, cu.data(), ctx.data(), tables.data(), maxb};
  if (fp8) {
    llm::cpu::PagedDecodeAttention(qf.data(),
                                   PagedKvView<const uint8_t>{kc.data(), vc.data(), layout},
                                   CpuScales(), hb, kHeads, scale, ref.data(), 1);
  } else {
    llm::cpu::PagedDecodeAttention(qf.data(),
                                   PagedKvView<const float>{kf.data(), vf.data(), layout}, hb,
                                   kHeads, scale, ref.data(), 1);
  }
  auto up = [](const auto& h) {
    void* d = nullptr;
    LLM_CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(h[0])));
    LLM_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(h[0]), cudaMemcpyHostToDevice));
    return d;
  };
  void *dk = fp8 ? up(kc) : up(kb), *dv = fp8 ? up(vc) : up(vb), *dq = up(qb), *dt = up(tables),
       *dc = up(ctx), *du = up(cu);
  void* dout = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&dout, qb.size() * 2));
  const size_t ws_bytes = llm::cuda::DecodeWorkspaceBytes(ns, kHeads, kHeadDim, 8);
  void* ws = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  LLM_CUDA_CHECK(cudaMemset(ws, 0, ws_bytes));  // the split counters start at zero (once)
  llm::cuda::AttentionParams p;
  p.q = dq;
  p.out = dout;
  p.kv = PagedKvView<const void>{dk, dv, layout};
  p.batch = AttentionBatch{ns, static_cast<int32_t*>(du), static_cast<int32_t*>(dc),
                           static_cast<int32_t*>(dt), maxb};
  p.num_heads = kHeads;
  p.scale = scale;
  p.dtype = llm::DType::kBF16;
  p.kv_format = KvFormat(fp8);
  p.max_q_len = 1;
  p.max_num_keys = 2500;
  float mx = 0;
  for (float r : ref) mx = std::max(mx, std::fabs(r));
  bool ok = true;
  // splits 1, auto, 8 on the CTA kernel with its original step (kCta); fp8 also the default
  // (kAuto: the transposed step) at splits 1, auto, 8 and the warp-item kernels (a grid of one
  // CTA, 4 warps walking the 24 items, and of 2 CTAs), original and transposed step.
  using Choice = llm::cuda::DecodeKernelChoice;
  struct Run {
    Choice choice;
    int splits;
    int max_ctas;  // warp-item kernels' grid cap
  };
  std::vector<Run> runs = {{Choice::kCta, 1, 0}, {Choice::kCta, 0, 0}, {Choice::kCta, 8, 0}};
  if (fp8 || kHeadDim == 256) {  // kAuto: the transposed step (fp8, or 2-byte caches at 256)
    runs.insert(runs.end(), {{Choice::kAuto, 1, 0}, {Choice::kAuto, 0, 0}, {Choice::kAuto, 8, 0}});
  }
  if (fp8 && kHeadDim != 256) {  // the warp-item kernels take head_dim 64 / 128
    runs.insert(runs.end(), {{Choice::kWarpItems, 0, 1},
                             {Choice::kWarpItems, 0, 2},
                             {Choice::kWarpItemsT, 0, 1},
                             {Choice::kWarpItemsT, 0, 2}});
  }
  for (const Run& run : runs) {
    LLM_CUDA_CHECK(cudaMemset(dout, 0xff, qb.size() * 2));  // NaN poison
    llm::cuda::DecodeLaunchInfo info;
    llm::cuda::PagedDecodeAttention(p, run.splits, ws, ws_bytes, nullptr, &info, run.choice,
                                    run.max_ctas);
    std::vector<uint16_t> got(qb.size());
    LLM_CUDA_CHECK(cudaMemcpy(got.data(), dout, got.size() * 2, cudaMemcpyDeviceToHost));
    float err = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float g = llm::Bf16ToF32(got[i]);
      err = std::isnan(g) ? INFINITY : std::max(err, std::fabs(g - ref[i]));
    }
    const bool pass = err <= 2e-2f * mx;
    ok = ok && pass;
    std::printf("validate kv=%s %s%s splits=%d (used %d): max_err %.3g, max|ref| %.3g: %s\n",
                KvName(fp8), info.warp_items ? "warp-items" : "cta",
                info.transposed_step ? " transposed" : "", run.splits, info.num_splits, err, mx,
                pass ? "ok" : "FAIL");
  }
  for (void* d : {dk, dv, dq, dt, dc, du, dout, ws}) cudaFree(d);
  return ok;
}

// One result line. `bf16`: the same shape and variant timed with the bf16 cache (fp8 lines
// then carry the fp8 / bf16 time ratios), or null.
void PrintJson(const Result& r, int sets, double copy_tbs, bool pass, const Result* bf16) {
  std::string extra;
  if (r.fp8 && bf16 != nullptr && bf16->ms > 0) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), ",\"time_ratio_fp8_bf16\":%.3f", r.ms / bf16->ms);
    extra += buf;
    if (r.graph_pdl_ms > 0 && bf16->graph_pdl_ms > 0) {
      std::snprintf(buf, sizeof(buf), ",\"graph_ratio_fp8_bf16\":%.3f",
                    r.graph_pdl_ms / bf16->graph_pdl_ms);
      extra += buf;
    }
  }
  std::printf(
      "JSON {\"kind\":\"decode\",\"variant\":\"%s\",\"batch\":%d,\"context\":%d,"
      "\"num_heads\":%d,\"num_kv_heads\":%d,\"head_dim\":%d,\"dtype\":\"bf16\",\"kv\":\"%s\","
      "\"block_size\":%d,\"ms\":%.4f,\"tb_per_s\":%.3f,\"copy_tb_per_s\":%.3f,\"ratio_to_copy\":%."
      "3f,\"splits\":%d,"
      "\"ctas\":%d,\"graph_us\":%.2f,\"graph_pdl_us\":%.2f,\"sliding_window\":%d,"
      "\"max_err\":%.3g,\"rel_err\":%.3g,\"sets\":%d%s%s%s}\n",
      r.variant.c_str(), r.shape.batch, r.shape.context, kHeads, kKvHeads, kHeadDim, KvName(r.fp8),
      kBlock, r.ms, r.tbs, copy_tbs, r.tbs / copy_tbs, r.splits, r.ctas, r.graph_ms * 1e3,
      r.graph_pdl_ms * 1e3, r.shape.window, r.max_err, r.rel_err, sets, extra.c_str(),
      g_ragged ? ",\"ragged\":true" : "", pass ? "" : ",\"ok\":false");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool sanitize_small = false;
  int window = 0;                         // --window
  std::vector<bool> kvs = {false, true};  // KV formats, in run order: bf16, then fp8
  std::vector<Shape> shapes = {{1, 4096},  {1, 32768},  {16, 4096},
                               {64, 4096}, {64, 16384}, {256, 2048}};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--sanitize-small") == 0) {
      sanitize_small = true;
    } else if (std::strcmp(argv[i], "--kv") == 0 && i + 1 < argc) {
      const char* kv = argv[++i];
      if (std::strcmp(kv, "both") == 0) {
        kvs = {false, true};
      } else if (std::strcmp(kv, "bf16") == 0) {
        kvs = {false};
      } else if (std::strcmp(kv, "fp8") == 0) {
        kvs = {true};
      } else {
        std::fprintf(stderr, "bad --kv '%s' (fp8, bf16 or both)\n", kv);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--ragged") == 0) {
      g_ragged = true;
    } else if (std::strcmp(argv[i], "--window") == 0 && i + 1 < argc) {
      window = std::atoi(argv[++i]);
      if (window < 1) {
        std::fprintf(stderr, "bad --window\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--block-size") == 0 && i + 1 < argc) {
      kBlock = std::atoi(argv[++i]);
      if (kBlock < 1) {
        std::fprintf(stderr, "bad --block-size\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--head-dim") == 0 && i + 1 < argc) {
      kHeadDim = std::atoi(argv[++i]);
      if (kHeadDim != 64 && kHeadDim != 128 && kHeadDim != 256) {
        std::fprintf(stderr, "bad --head-dim (64, 128 or 256)\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--heads") == 0 && i + 1 < argc) {
      kHeads = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--kv-heads") == 0 && i + 1 < argc) {
      kKvHeads = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      shapes.clear();  // BxC[,BxC...]: batch × context
      for (const char* q = argv[++i]; *q;) {
        Shape sh{};
        int used = 0;
        if (std::sscanf(q, "%dx%d%n", &sh.batch, &sh.context, &used) != 2 || sh.batch <= 0 ||
            sh.context <= 0) {
          std::fprintf(stderr, "bad --shapes entry at '%s'\n", q);
          return 2;
        }
        shapes.push_back(sh);
        q += used;
        if (*q == ',') ++q;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--sanitize-small] [--shapes BxC[,BxC...]] [--kv fp8|bf16|both] "
                   "[--block-size N] [--ragged] [--window W] [--head-dim D] [--heads H] "
                   "[--kv-heads K]\n",
                   argv[0]);
      return 2;
    }
  }
  if (kHeads <= 0 || kKvHeads <= 0 || kHeads % kKvHeads != 0 || kHeads / kKvHeads > 16) {
    std::fprintf(stderr, "bad --heads / --kv-heads (a multiple, at most 16 per KV head)\n");
    return 2;
  }
  std::printf("device: %s\n", llm::cuda::DeviceDescription().c_str());
  std::printf("heads %d, kv heads %d, head_dim %d, block size %d\n", kHeads, kKvHeads, kHeadDim,
              kBlock);
  // A format that fails validation is not timed (the other still is); the exit status is 1.
  bool ok = true;
  {
    std::vector<bool> passed;
    for (const bool fp8 : kvs) {
      if (Validate(fp8)) {
        passed.push_back(fp8);
      } else {
        std::printf("validation FAILED (kv=%s)\n", KvName(fp8));
        ok = false;
      }
    }
    kvs = passed;
  }
  if (kvs.empty()) return 1;
  if (sanitize_small) {  // one small shape, a few launches per variant, checks on
    for (const bool fp8 : kvs) {
      Problem prob(Shape{2, 1000}, 0, fp8);
      // v3: the CTA kernel's original step at automatic / no / 7 splits; fp8 also the warp-item
      // kernels and the default (kAuto: the transposed step) at 7 / automatic / no splits.
      using Choice = llm::cuda::DecodeKernelChoice;
      struct Run {
        const char* name;
        Choice choice;
        int splits;
      };
      std::vector<Run> runs = {
          {"v3", Choice::kCta, 0}, {"v3", Choice::kCta, 1}, {"v3", Choice::kCta, 7}};
      if (fp8 && kHeadDim != 256) {
        runs.insert(runs.end(),
                    {{"v4-items", Choice::kWarpItems, 0}, {"v4-itemsT", Choice::kWarpItemsT, 0}});
      }
      if (fp8 || kHeadDim == 256) {
        runs.insert(
            runs.end(),
            {{"auto", Choice::kAuto, 7}, {"auto", Choice::kAuto, 0}, {"auto", Choice::kAuto, 1}});
      }
      for (const Run& run : runs) {
        prob.choice = run.choice;
        const Result r = prob.Time(run.name, run.splits, 2, false);
        const bool pass = r.rel_err <= 2e-2f;
        ok = ok && pass;
        std::printf("sanitize-small 2x1000 kv=%s %s splits=%d (used %d): rel_err %.3g: %s\n",
                    KvName(fp8), r.variant.c_str(), run.splits, r.splits, r.rel_err,
                    pass ? "ok" : "FAIL");
      }
    }
    return ok ? 0 : 1;
  }
  if (window > 0) {  // each shape, then the same with the window
    std::vector<Shape> both;
    for (const Shape& s : shapes) {
      both.push_back(s);
      both.push_back(Shape{s.batch, s.context, window});
    }
    shapes = both;
  }
  const double copy_tbs = CopyBandwidthTBs();
  std::printf("copy bandwidth (cudaMemcpy D2D 2 GiB, read+write): %.3f TB/s\n", copy_tbs);
  std::vector<Result> results;
  for (const Shape& s : shapes) {
    std::vector<Result> bf16_here;  // this shape's bf16 results, for the fp8 / bf16 ratios
    for (const bool fp8 : kvs) {
      Problem prob(s, int64_t(512) << 20, fp8);
      auto run = [&](const std::string& name, int splits,
                     llm::cuda::DecodeKernelChoice choice = llm::cuda::DecodeKernelChoice::kCta) {
        prob.choice = choice;
        Result r = prob.Time(name, splits);
        const Result* base = nullptr;
        if (fp8)
          for (const Result& b : bf16_here)
            if (b.variant == r.variant) base = &b;
        if (base != nullptr && base->ms > 0) r.fp8_over_bf16 = r.ms / base->ms;
        const bool pass = r.rel_err <= 2e-2f;
        ok = ok && pass;
        PrintJson(r, prob.sets, copy_tbs, pass, base);
        results.push_back(r);
        if (!fp8) bf16_here.push_back(r);
        return r;
      };
      const bool sw = s.window > 0;
      const Result v3 = run(sw ? "v3-sw" : "v3", 0);
      // bf16: as before, from the selector; fp8: from the split count v3 actually used (the
      // fp8 config's occupancy differs from the bf16 one DecodeAutoSplits assumes).
      const bool split = fp8 ? v3.splits > 1
                             : llm::cuda::DecodeAutoSplits(s.batch, kKvHeads, s.context, kHeadDim,
                                                           128, 2, s.window) > 1;
      if (split) run(sw ? "v3-sw-nosplit" : "v3-nosplit", 1);
      if (fp8 && sw) {
        run("auto-sw", 0, llm::cuda::DecodeKernelChoice::kAuto);  // (no window on warp items)
      } else if (kHeadDim == 256) {  // bf16 at 256: kAuto takes the transposed step (g <= 8)
        run(sw ? "auto-sw" : "auto", 0, llm::cuda::DecodeKernelChoice::kAuto);
      } else if (fp8 && kHeadDim == 256) {
        run("auto", 0, llm::cuda::DecodeKernelChoice::kAuto);
      } else if (fp8) {
        run("auto", 0, llm::cuda::DecodeKernelChoice::kAuto);
        run("v4-items", 1, llm::cuda::DecodeKernelChoice::kWarpItems);
        run("v4-itemsT", 1, llm::cuda::DecodeKernelChoice::kWarpItemsT);
      }
    }
  }
  std::printf("\n%-13s %4s %6s %7s %6s %7s %6s %9s %8s %7s %9s %9s %9s %9s\n", "variant", "kv",
              "batch", "context", "window", "splits", "ctas", "ms", "TB/s", "ratio", "graph_us",
              "g+pdl_us", "rel_err", "fp8/bf16");
  for (const Result& r : results) {
    char vs[16] = "";
    if (r.fp8_over_bf16 > 0) std::snprintf(vs, sizeof(vs), "%.3f", r.fp8_over_bf16);
    std::printf("%-13s %4s %6d %7d %6d %7d %6d %9.4f %8.3f %7.3f %9.2f %9.2f %9.2e %9s\n",
                r.variant.c_str(), KvName(r.fp8), r.shape.batch, r.shape.context, r.shape.window,
                r.splits, r.ctas, r.ms, r.tbs, r.tbs / copy_tbs, r.graph_ms * 1e3,
                r.graph_pdl_ms * 1e3, r.rel_err, vs);
  }
  std::printf("copy %.3f TB/s\n", copy_tbs);
  return ok ? 0 : 1;
}
