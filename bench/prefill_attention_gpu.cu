// Paged prefill attention on the GPU: every rung of kernels/cuda/attention/prefill_attention.h,
// validated against the CPU reference on a small ragged shape, then timed.
//
// Timed shapes (DESIGN.md's attention ceilings use the same): bf16, 16 query heads = 16 KV
// heads, head_dim 128 and 64, batch × length = 16k tokens for lengths 512 … 16k, causal (and
// non-causal for v4, FLOPs 4·B·H·L²·d, against cpu::PagedAttentionReference), paged
// with block size 16 and a shuffled block table. FLOPs = 4·B·H·L²·d / 2 (causal). Q, K, V and O
// are 4 × 64 MiB at head_dim 128 (L2 is 50 MB), so no launch finds its inputs in L2 (K/V tiles
// are still re-read through L2 by the query tiles of a head, as in any flash kernel); two input
// sets alternate. CUDA events around each launch, launches queued back to back (the host's
// work overlaps the previous launch, as torch's calls are timed); 2 warm-ups, median of 10 (v1:
// 5 at long lengths); "v4/synced" is v4 timed with a wait after every launch (the method before
// 2026-12-06). v4 is also timed under its other schedules (ping-pong, intra-warpgroup
// overlap) and, as a profiling ablation with wrong output, without exp2.
// Prints one JSON line per (variant, shape) and a table last.
//   ninja -C build bench_prefill_attention_gpu && ./build/bench_prefill_attention_gpu
// Options (for profiling one shape): --shapes HD:L[,HD:L...] (default every hd × length of
// 128 and 64; head_dim 256 (Gemma 3) only when named, e.g. --shapes 128:4096,256:4096: it runs
// on v1_naive and v3_mma, and the table's last lines give each 256 shape's TFLOP/s as a ratio
// to the same length's at 128),
// --block-size N (default 16), --variants v1,v2,v3,v4 (default all), --no-ablations,
// --reps N (default 10), --serving / --no-serving (the serving-shaped chunked-prefill batch,
// ServingBatch below; by default only when no --shapes are named), --kv fp8 (e4m3 pools, scales 1:
// the codes of the same random values; v3_mma reads them directly, v4_wgmma over a bf16 copy of the
// pages made by the dequantizing pass, which the timings include; validated against the CPU's fp8
// reference).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/dtype.h"
#include "kernels/fp8.h"

namespace {

using llm::AttentionBatch;
using llm::DType;
using llm::PagedKvLayout;
using llm::cuda::PrefillVariant;

constexpr PrefillVariant kVariants[] = {PrefillVariant::kNaive, PrefillVariant::kSmem,
                                        PrefillVariant::kMma, PrefillVariant::kWgmma};

// One paged problem on the device (bf16, or e4m3 pools with `fp8`), host copies kept.
struct Problem {
  bool fp8 = false;
  std::vector<uint8_t> k8, v8;  // fp8: the pools' codes (host)
  void* dscratch = nullptr;     // fp8: the v4 rung's scratch (a copy of every page)
  llm::cuda::PrefillScratch scratch;
  int num_seqs = 0, num_heads = 0, head_dim = 0, block_size = 16, max_q = 0, max_blocks = 0;
  int num_tokens = 0;
  PagedKvLayout layout;
  std::vector<int32_t> cu, ctx, tables;
  std::vector<uint16_t> q, k, v;  // host (bf16 bits)
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* dout = nullptr;
  int32_t *dcu = nullptr, *dctx = nullptr, *dtab = nullptr;

  Problem(std::vector<int> q_lens, std::vector<int> ctx_lens, int heads, int hd, int bs,
          uint32_t seed, bool fp8_pools = false) {
    fp8 = fp8_pools;
    num_seqs = static_cast<int>(q_lens.size());
    num_heads = heads;
    head_dim = hd;
    block_size = bs;
    cu = {0};
    ctx.assign(ctx_lens.begin(), ctx_lens.end());
    int total_blocks = 0;
    for (int i = 0; i < num_seqs; ++i) {
      cu.push_back(cu.back() + q_lens[i]);
      max_q = std::max(max_q, q_lens[i]);
      const int nb = (ctx[i] + q_lens[i] + bs - 1) / bs;
      max_blocks = std::max(max_blocks, nb);
      total_blocks += nb;
    }
    num_tokens = cu.back();
    std::mt19937 rng(seed);
    std::vector<int32_t> perm(total_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    tables.assign(size_t(num_seqs) * max_blocks, 0);
    int next = 0;
    for (int i = 0; i < num_seqs; ++i)
      for (int b = 0; b < (ctx[i] + q_lens[i] + bs - 1) / bs; ++b)
        tables[size_t(i) * max_blocks + b] = perm[next++];
    layout = PagedKvLayout{total_blocks, bs, heads, hd};
    // Random bf16 bits from a cheap generator (normal-ish: sum of two uniforms).
    auto fill = [&](std::vector<uint16_t>& x, size_t n, float amp) {
      x.resize(n);
      uint32_t s = seed * 2654435761u + 1;
      for (auto& e : x) {
        s = s * 1664525u + 1013904223u;
        const float u1 = (s >> 8) * (1.f / 16777216.f);
        s = s * 1664525u + 1013904223u;
        const float u2 = (s >> 8) * (1.f / 16777216.f);
        e = llm::F32ToBf16(amp * (u1 + u2 - 1.f) * 2.45f);
      }
    };
    fill(q, size_t(num_tokens) * heads * hd, 1.5f);
    fill(k, layout.pool_elements(), 1.f);
    fill(v, layout.pool_elements(), 1.f);
    auto up = [](const void* src, size_t bytes) {
      void* d = nullptr;
      LLM_CUDA_CHECK(cudaMalloc(&d, bytes));
      LLM_CUDA_CHECK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
      return d;
    };
    dq = up(q.data(), q.size() * 2);
    if (fp8) {
      auto codes = [](const std::vector<uint16_t>& x) {
        std::vector<uint8_t> c(x.size());
        for (size_t i = 0; i < x.size(); ++i) c[i] = llm::F32ToE4m3(llm::Bf16ToF32(x[i]));
        return c;
      };
      k8 = codes(k);
      v8 = codes(v);
      dk = up(k8.data(), k8.size());
      dv = up(v8.data(), v8.size());
      scratch.num_pages = total_blocks;
      scratch.bytes = llm::cuda::PrefillFp8ScratchBytes(layout, DType::kBF16, num_seqs, max_blocks,
                                                        total_blocks);
      LLM_CUDA_CHECK(cudaMalloc(&dscratch, scratch.bytes));
      scratch.data = dscratch;
    } else {
      dk = up(k.data(), k.size() * 2);
      dv = up(v.data(), v.size() * 2);
    }
    LLM_CUDA_CHECK(cudaMalloc(&dout, q.size() * 2));
    dcu = static_cast<int32_t*>(up(cu.data(), cu.size() * 4));
    dctx = static_cast<int32_t*>(up(ctx.data(), ctx.size() * 4));
    dtab = static_cast<int32_t*>(up(tables.data(), tables.size() * 4));
  }
  ~Problem() {
    for (void* p : {dq, dk, dv, dout, (void*)dcu, (void*)dctx, (void*)dtab, dscratch}) cudaFree(p);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  llm::cuda::AttentionParams Params() const {
    llm::cuda::AttentionParams p;
    p.q = dq;
    p.out = dout;
    p.kv = llm::PagedKvView<const void>{dk, dv, layout};
    p.batch = AttentionBatch{num_seqs, dcu, dctx, dtab, max_blocks};
    p.num_heads = num_heads;
    p.scale = 1.f / std::sqrt(float(head_dim));
    p.dtype = DType::kBF16;
    p.kv_format.fp8 = fp8;
    p.max_q_len = max_q;
    int mk = 0;
    for (int i = 0; i < num_seqs; ++i) mk = std::max(mk, ctx[i] + cu[i + 1] - cu[i]);
    p.max_num_keys = mk;
    return p;
  }
};

// Max |gpu - cpu| / max |cpu| of one rung on a small ragged problem (non-causal: v4 against
// cpu::PagedAttentionReference).
float Validate(PrefillVariant v, int hd, int bs, int v4_flags = llm::cuda::detail::kV4Default,
               bool causal = true, bool fp8 = false) {
  Problem pr({300, 77, 1, 129}, {0, 40, 500, 16}, 8, hd, bs, 99 + hd, fp8);
  std::vector<float> qf(pr.q.size()), kf(pr.k.size()), vf(pr.v.size()), ref(pr.q.size());
  for (size_t i = 0; i < qf.size(); ++i) qf[i] = llm::Bf16ToF32(pr.q[i]);
  for (size_t i = 0; i < kf.size(); ++i) kf[i] = llm::Bf16ToF32(pr.k[i]);
  for (size_t i = 0; i < vf.size(); ++i) vf[i] = llm::Bf16ToF32(pr.v[i]);
  AttentionBatch hb{pr.num_seqs, pr.cu.data(), pr.ctx.data(), pr.tables.data(), pr.max_blocks};
  const llm::PagedKvView<const float> kv{kf.data(), vf.data(), pr.layout};
  if (fp8) {
    llm::cpu::PagedPrefillAttention(
        qf.data(), llm::PagedKvView<const uint8_t>{pr.k8.data(), pr.v8.data(), pr.layout},
        llm::cpu::Fp8KvScales{1.f, 1.f}, hb, pr.num_heads, 1.f / std::sqrt(float(hd)), ref.data());
  } else if (causal) {
    llm::cpu::PagedPrefillAttention(qf.data(), kv, hb, pr.num_heads, 1.f / std::sqrt(float(hd)),
                                    ref.data());
  } else {
    llm::cpu::PagedAttentionReference(qf.data(), kv, hb, pr.num_heads, 1.f / std::sqrt(float(hd)),
                                      ref.data(), /*causal=*/false);
  }
  LLM_CUDA_CHECK(cudaMemset(pr.dout, 0xff, pr.q.size() * 2));  // NaN poison
  auto params = pr.Params();
  params.causal = causal;
  llm::cuda::PagedPrefillAttention(params, nullptr, v, &pr.scratch, v4_flags);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> got(pr.q.size());
  LLM_CUDA_CHECK(cudaMemcpy(got.data(), pr.dout, got.size() * 2, cudaMemcpyDeviceToHost));
  float err = 0.f, mx = 0.f;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = llm::Bf16ToF32(got[i]);
    if (std::isnan(g)) return INFINITY;
    err = std::max(err, std::fabs(g - ref[i]));
    mx = std::max(mx, std::fabs(ref[i]));
  }
  return err / mx;
}

// Median ms of `reps` launches (after 2 warm-ups), input sets a and b alternating. Launches are
// queued back to back, each between its own pair of events, and the stream is synchronized once
// at the end (as bench/attention_torch.py times torch's calls): the host's work for a launch
// (tensor maps, launch) overlaps the previous launch instead of being timed with it. `synced`
// waits for every launch before the next one's start event (the method before 2026-12-06: the
// host's work shows in the time).
double MedianMs(const Problem& a, const Problem& b, PrefillVariant v, int v4_flags, bool causal,
                bool synced, int reps) {
  std::vector<float> ms;
  std::vector<cudaEvent_t> e0(reps + 2), e1(reps + 2);
  for (int it = 0; it < reps + 2; ++it) {
    LLM_CUDA_CHECK(cudaEventCreate(&e0[it]));
    LLM_CUDA_CHECK(cudaEventCreate(&e1[it]));
  }
  for (int it = 0; it < reps + 2; ++it) {
    const Problem& pr = (it & 1) ? b : a;
    auto params = pr.Params();
    params.causal = causal;
    LLM_CUDA_CHECK(cudaEventRecord(e0[it]));
    llm::cuda::PagedPrefillAttention(params, nullptr, v, &pr.scratch, v4_flags);
    LLM_CUDA_CHECK(cudaEventRecord(e1[it]));
    if (synced || it < 2) LLM_CUDA_CHECK(cudaEventSynchronize(e1[it]));
  }
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  for (int it = 2; it < reps + 2; ++it) {
    float t = 0;
    LLM_CUDA_CHECK(cudaEventElapsedTime(&t, e0[it], e1[it]));
    ms.push_back(t);
  }
  for (int it = 0; it < reps + 2; ++it) {
    cudaEventDestroy(e0[it]);
    cudaEventDestroy(e1[it]);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The serving-shaped batch (issue 29, target 1): one chunked-prefill step of 16 prompts of 512
// new tokens over 0 / 512 / 1024 / 2048 cached tokens (4 each, interleaved), 16 heads, causal
// from each prompt's context on. FLOPs = sum 4·H·d·(q·ctx + q²/2), as bench/attention_torch.py
// counts the same work for torch (whose SDPA has no ragged form with a cache: one call per
// context length there).
constexpr int kServingQ = 512, kServingHeads = 16;
constexpr int kServingCtx[] = {0, 512, 1024, 2048};
constexpr int kServingPerCtx = 4;

std::pair<std::vector<int>, std::vector<int>> ServingBatch() {
  std::vector<int> q, ctx;
  for (int i = 0; i < kServingPerCtx; ++i)
    for (int c : kServingCtx) {
      q.push_back(kServingQ);
      ctx.push_back(c);
    }
  return {q, ctx};
}

double ServingFlops(int hd) {
  double f = 0;
  for (int c : kServingCtx)
    f += 4.0 * kServingPerCtx * kServingHeads * hd *
         (double(kServingQ) * c + 0.5 * kServingQ * kServingQ);
  return f;
}

// What v4's production schedule is compared with at head_dim hd: the runtime-bit kernel
// (v4/generic), the one-section item order (v4/allpairs) and the other compiled schedule
// (ping-pong at 128, plain at 64).
std::vector<std::pair<int, const char*>> ProductionComparisons(int hd) {
  using namespace llm::cuda::detail;
  const int prod = ResolveV4Flags(kV4Auto, hd);
  const int other = prod == kV4Default ? kV4NoOverlap : kV4Default;
  return {{prod | kV4Generic, "v4/generic"},
          {prod | kV4AllPairs, "v4/allpairs"},
          {other, hd == 128 ? "v4/pp-fixed" : "v4/plain-fixed"}};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int, int>> shapes;  // (head_dim, length); empty: all
  int bs = 16, reps_default = 10;
  bool ablations_on = true, fp8 = false;
  int serving_flag = -1;  // --serving / --no-serving; by default only when no --shapes are named
  std::vector<PrefillVariant> variants(std::begin(kVariants), std::end(kVariants));
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--block-size") == 0 && i + 1 < argc) {
      bs = std::atoi(argv[++i]);
      if (bs < 1) {
        std::fprintf(stderr, "bad --block-size\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps_default = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--no-ablations") == 0) {
      ablations_on = false;
    } else if (std::strcmp(argv[i], "--serving") == 0) {
      serving_flag = 1;
    } else if (std::strcmp(argv[i], "--no-serving") == 0) {
      serving_flag = 0;
    } else if (std::strcmp(argv[i], "--kv") == 0 && i + 1 < argc) {
      fp8 = std::strcmp(argv[++i], "fp8") == 0;
      if (!fp8 && std::strcmp(argv[i], "bf16") != 0) {
        std::fprintf(stderr, "bad --kv (bf16 or fp8)\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      for (const char* q = argv[++i]; *q;) {
        int hd = 0, len = 0, used = 0;
        if (std::sscanf(q, "%d:%d%n", &hd, &len, &used) != 2 || hd <= 0 || len <= 0) {
          std::fprintf(stderr, "bad --shapes entry at '%s' (HD:L)\n", q);
          return 2;
        }
        shapes.emplace_back(hd, len);
        q += used;
        if (*q == ',') ++q;
      }
    } else if (std::strcmp(argv[i], "--variants") == 0 && i + 1 < argc) {
      variants.clear();
      for (const char* q = argv[++i]; *q;) {
        if (q[0] != 'v' || q[1] < '1' || q[1] > '4') {
          std::fprintf(stderr, "bad --variants entry at '%s' (v1..v4)\n", q);
          return 2;
        }
        variants.push_back(kVariants[q[1] - '1']);
        q += 2;
        if (*q == ',') ++q;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--shapes HD:L,...] [--block-size N] [--variants v1,v2,v3,v4] "
                   "[--no-ablations] [--reps N] [--kv bf16|fp8] [--serving|--no-serving]\n",
                   argv[0]);
      return 2;
    }
  }
  const bool serving = serving_flag < 0 ? shapes.empty() : serving_flag == 1;
  auto wanted = [&](int hd, int L) {
    if (shapes.empty()) return true;
    return std::find(shapes.begin(), shapes.end(), std::make_pair(hd, L)) != shapes.end();
  };
  auto hd_wanted = [&](int hd) {
    if (shapes.empty()) return true;
    for (const auto& sh : shapes)
      if (sh.first == hd) return true;
    return false;
  };
  std::string why;
  if (!llm::cuda::DeviceAvailable(&why)) {
    std::printf("no GPU: %s\n", why.c_str());
    return 0;
  }
  std::printf("device: %s\n", llm::cuda::DeviceDescription().c_str());
  if (fp8) {  // the rungs that read e4m3 pools; v4's schedule ablations are bf16 studies
    ablations_on = false;
    variants.erase(std::remove_if(variants.begin(), variants.end(),
                                  [](PrefillVariant v) {
                                    return v != PrefillVariant::kMma && v != PrefillVariant::kWgmma;
                                  }),
                   variants.end());
  }
  const int lengths[] = {512, 1024, 2048, 4096, 8192, 16384};
  const int kTokens = 16384, kHeads = 16;
  std::map<std::pair<int, int>, std::map<std::string, double>> table;  // (hd, L) -> variant
  bool all_ok = true;
  for (int hd : {128, 64, 256}) {
    if (!hd_wanted(hd) || (hd == 256 && shapes.empty())) continue;
    std::map<PrefillVariant, float> errs;
    for (PrefillVariant v : kVariants) errs[v] = INFINITY;
    for (PrefillVariant v : variants) {
      if (hd == 256 && v != PrefillVariant::kNaive && v != PrefillVariant::kMma) {
        std::printf("skip     %-9s hd 256: not built for it\n", llm::cuda::PrefillVariantName(v));
        continue;
      }
      errs[v] = Validate(v, hd, bs, llm::cuda::detail::kV4Auto, true, fp8);
      const bool ok = errs[v] <= 2e-2f;
      all_ok &= ok;
      std::printf("validate %-9s hd %3d: max_err/max|ref| %.3e %s\n",
                  llm::cuda::PrefillVariantName(v), hd, errs[v], ok ? "ok" : "FAILED");
    }
    // Non-causal (v4 only): validated against the plain definition, then timed beside causal.
    const bool want_v4 =
        !fp8 && hd != 256 &&
        std::find(variants.begin(), variants.end(), PrefillVariant::kWgmma) != variants.end();
    const float noncausal_err =
        want_v4 ? Validate(PrefillVariant::kWgmma, hd, bs, llm::cuda::detail::kV4Auto, false)
                : INFINITY;
    if (want_v4) {
      const bool ok = noncausal_err <= 2e-2f;
      all_ok &= ok;
      std::printf("validate v4_wgmma hd %3d non-causal: max_err/max|ref| %.3e %s\n", hd,
                  noncausal_err, ok ? "ok" : "FAILED");
    }
    for (int L : lengths) {
      if (!wanted(hd, L)) continue;
      const int B = kTokens / L;
      // Two input sets alternate (each 4 × 64 MiB at hd 128: far past the 50 MB L2).
      Problem a(std::vector<int>(B, L), std::vector<int>(B, 0), kHeads, hd, bs, 7 + L, fp8);
      Problem b(std::vector<int>(B, L), std::vector<int>(B, 0), kHeads, hd, bs, 8 + L, fp8);
      const double flops = 4.0 * B * kHeads * double(L) * L * hd / 2;
      // profiling: an ablation with wrong output on purpose (no max_err; the report keeps
      // it beside the variants and never counts it as ours or as a failure).
      // Timing: MedianMs.
      auto time_one = [&](PrefillVariant v, int v4_flags, const std::string& name, float err,
                          bool profiling = false, bool causal = true, bool synced = false) {
        const int reps = (v == PrefillVariant::kNaive && L >= 4096) ? 5 : reps_default;
        const double med = MedianMs(a, b, v, v4_flags, causal, synced, reps);
        const double tflops = (causal ? flops : 2 * flops) / (med * 1e-3) / 1e12;
        if (causal) table[{hd, L}][name] = tflops;
        std::printf(
            "JSON {\"kind\":\"prefill\",\"variant\":\"%s\",\"batch\":%d,\"seq_len\":%d,"
            "\"num_heads\":%d,\"head_dim\":%d,\"causal\":%s,\"dtype\":\"bf16\",\"kv\":\"%s\","
            "\"block_size\":%d,\"ms\":%.4f,\"tflops\":%.1f,\"max_err\":%.3e%s}\n",
            name.c_str(), B, L, kHeads, hd, causal ? "true" : "false", fp8 ? "fp8" : "bf16", bs,
            med, tflops, err, profiling ? ",\"profiling\":true" : "");
        std::fflush(stdout);
      };
      for (PrefillVariant v : variants) {
        if (!(errs[v] <= 2e-2f)) continue;
        // production's schedule (kV4Auto: ping-pong at head_dim 64)
        time_one(v, llm::cuda::detail::kV4Auto, llm::cuda::PrefillVariantName(v), errs[v]);
      }
      if (errs[PrefillVariant::kWgmma] <= 2e-2f) {  // the earlier timing method, for comparison
        time_one(PrefillVariant::kWgmma, llm::cuda::detail::kV4Default, "v4/synced",
                 errs[PrefillVariant::kWgmma], false, true, /*synced=*/true);
      }
      if (noncausal_err <= 2e-2f) {  // FLOPs 4·B·H·L²·d: twice the causal count
        time_one(PrefillVariant::kWgmma, llm::cuda::detail::kV4Auto, "v4_wgmma", noncausal_err,
                 false, /*causal=*/false);
      }
      // Production's schedule against ProductionComparisons (timed with --no-ablations too).
      if (errs[PrefillVariant::kWgmma] <= 2e-2f && !fp8) {
        for (const auto& [flags, name] : ProductionComparisons(hd)) {
          const float err = Validate(PrefillVariant::kWgmma, hd, bs, flags);
          all_ok &= err <= 2e-2f;
          if (err <= 2e-2f) time_one(PrefillVariant::kWgmma, flags, name, err);
        }
      }
      // v4 schedule ablations at every length: ping-pong + intra-warpgroup overlap, each
      // alone, and (profiling, wrong output) the production schedule without exp2.
      if (ablations_on && errs[PrefillVariant::kWgmma] <= 2e-2f) {
        using namespace llm::cuda::detail;
        const std::pair<int, const char*> ablations[] = {
            {0, "v4/pp+ovl"},
            {kV4NoPingPong, "v4/ovl"},
            {kV4NoOverlap, "v4/pp"},
            {kV4Default | kV4SkipExp, "v4/noexp"},
            {kV4Default | kV4LoadsOnly, "v4/loads"},
            {kV4Default | kV4ComputeOnly, "v4/compute"},
            {kV4NoOverlap | kV4ComputeOnly, "v4/pp-compute"},
            {kV4ComputeOnly, "v4/ppovl-compute"},
            {kV4Default | kV4NoPersist, "v4/nopersist"},
            {kV4Default | kV4PanelBoxV, "v4/panelv"},
            {kV4Default | kV4NoQPrefetch, "v4/noqpf"},
            {kV4NoQPrefetch, "v4/pp+ovl-noqpf"},
            {kV4Default | kV4NarrowStores, "v4/narrow"},
            {kV4Default | kV4NarrowStores | kV4NoQPrefetch, "v4/before"},
            {kV4NoOverlap | kV4NarrowStores | kV4NoQPrefetch, "v4/pp-before"},
            {kV4Default | kV4Cluster, "v4/cluster"},
            {kV4Cluster, "v4/ppovl-cl"},
            {kV4Default | kV4LoadsOnly | kV4Cluster, "v4/loads-cl"}};
        for (const auto& [flags, name] : ablations) {
          const bool profiling = flags & (kV4SkipExp | kV4LoadsOnly | kV4ComputeOnly);
          const float err = profiling ? NAN : Validate(PrefillVariant::kWgmma, hd, bs, flags);
          if (!profiling && !(err <= 2e-2f)) {
            std::printf("validate %s hd %d: FAILED (%.3e)\n", name, hd, err);
            all_ok = false;
            continue;
          }
          time_one(PrefillVariant::kWgmma, flags, name, err, profiling);
        }
      }
    }
  }
  // The serving-shaped batch: v4 (production) and v4/generic, both input sets validated by
  // the small ragged problem (cached contexts included) at the same head_dim.
  if (serving && !fp8 &&
      std::find(variants.begin(), variants.end(), PrefillVariant::kWgmma) != variants.end()) {
    using namespace llm::cuda::detail;
    const auto [q_lens, ctx_lens] = ServingBatch();
    for (int hd : {128, 64}) {
      Problem a(q_lens, ctx_lens, kServingHeads, hd, bs, 31 + hd);
      Problem b(q_lens, ctx_lens, kServingHeads, hd, bs, 32 + hd);
      auto runs = ProductionComparisons(hd);
      runs.insert(runs.begin(), {kV4Auto, "v4_wgmma"});
      for (const auto& [flags, name] : runs) {
        const float err = Validate(PrefillVariant::kWgmma, hd, bs, flags);
        const bool ok = err <= 2e-2f;
        all_ok &= ok;
        if (!ok) {
          std::printf("validate %s hd %d: FAILED (%.3e)\n", name, hd, err);
          continue;
        }
        const double ms = MedianMs(a, b, PrefillVariant::kWgmma, flags, true, false, reps_default);
        std::printf(
            "JSON {\"kind\":\"serving\",\"variant\":\"%s\",\"prompts\":%zu,\"q_len\":%d,"
            "\"contexts\":[0,512,1024,2048],\"per_context\":%d,\"num_heads\":%d,"
            "\"head_dim\":%d,\"causal\":true,\"dtype\":\"bf16\",\"block_size\":%d,"
            "\"ms\":%.4f,\"tflops\":%.1f,\"max_err\":%.3e}\n",
            name, q_lens.size(), kServingQ, kServingPerCtx, kServingHeads, hd, bs, ms,
            ServingFlops(hd) / (ms * 1e-3) / 1e12, err);
        std::fflush(stdout);
      }
    }
  }
  std::printf(
      "\nprefill TFLOP/s (bf16, %s KV, causal, 16 heads, 16k tokens, paged bs %d; "
      "torch FA2 308 / cuDNN 595 at hd128 8k on this H200)\n",
      fp8 ? "fp8 e4m3" : "bf16", bs);
  std::printf("%4s %6s %9s %9s %9s %9s | v4 ablations: %7s %7s %7s %7s %7s %7s\n", "hd", "L",
              "v1_naive", "v2_smem", "v3_mma", "v4_wgmma", "pp+ovl", "ovl", "pp", "noexp", "loads",
              "compute");
  for (const auto& [key, row] : table) {
    std::printf("%4d %6d", key.first, key.second);
    for (const char* n : {"v1_naive", "v2_smem", "v3_mma", "v4_wgmma", "v4/pp+ovl", "v4/ovl",
                          "v4/pp", "v4/noexp", "v4/loads", "v4/compute"}) {
      auto it = row.find(n);
      const bool abl = n[2] == '/';
      if (std::string(n) == "v4/pp+ovl") std::printf(" |              ");
      if (it == row.end()) {
        std::printf(abl ? " %7s" : " %9s", "-");
      } else {
        std::printf(abl ? " %7.1f" : " %9.1f", it->second);
      }
    }
    std::printf("\n");
  }
  // head_dim 256 against 128 at the same length (TFLOP/s ratio; FLOPs scale with head_dim).
  for (const auto& [key, row] : table) {
    if (key.first != 256) continue;
    auto at = [](const std::map<std::string, double>& r, const char* n) {
      auto it = r.find(n);
      return it == r.end() ? 0.0 : it->second;
    };
    auto base = table.find({128, key.second});
    if (base == table.end()) continue;
    const double v3 = at(row, "v3_mma"), v3_128 = at(base->second, "v3_mma");
    const double best_128 = std::max(v3_128, at(base->second, "v4_wgmma"));
    std::printf(
        "hd256/hd128 L %6d: v3_mma %.1f vs %.1f TFLOP/s (%.3f); vs hd128's best %.1f (%.3f)\n",
        key.second, v3, v3_128, v3_128 > 0 ? v3 / v3_128 : 0.0, best_128,
        best_128 > 0 ? v3 / best_128 : 0.0);
  }
  return all_ok ? 0 : 1;
}
