// The GPU sampler (interface: kernels/cuda/ops/model_ops.h, SampleTokens). CPU twin and
// specification: Sampler::Sample in engine/sample/sampler.{h,cc}; same steps in the same order.
// One file for one kernel: SampleKernel and the block reductions, radix searches and filters
// only it calls.
// Test:  ninja -C build sampling_gpu_test sampling_gumbel_gpu_test &&
//        (cd build && ctest -L gpu -R sampling)
// Bench: ninja -C build bench_sampling_gpu && ./build/bench_sampling_gpu
//
// One CTA of 1024 threads per sampled row; nothing is sorted. Per row:
//  1. Rows with LogitAdjust entries: copy pass, logits row -> workspace row (float4 where
//     aligned), keeping per thread an online (max, sum of exp) of the RAW logits (for the
//     logprobs). Then the row's sparse LogitAdjust entries are applied to the copy, one
//     thread per entry (a row's entries must name distinct tokens), with the CPU's float
//     operations in the CPU's order: + bias, / or * repetition, - subtract. Entries the
//     CPU does not have are neutral exactly (x + 0, x / 1, x * 1, x - 0). Rows with an
//     allowed-token mask (mask_row >= 0: structured outputs) take the copy pass too, which
//     writes -inf for every disallowed id (the CPU masks first; bias and penalties keep -inf
//     at -inf, so a disallowed id's entry is skipped), and the raw statistics still read the
//     raw row: logprobs are of the unmasked distribution, as the CPU's (a mask that allows
//     nothing leaves all -inf: step 2's fallback returns id 0, as the CPU's argmax). Rows
//     without entries or a mask are processed in place: the processed row is the raw one.
//  1b. Temperature alone (no top-k, top-p or min-p: the whole vocabulary is kept), the
//     common sampled-decode case: the Gumbel-max draw, in the same single pass as step 2's
//     argmax: token = argmax_i (l_i / T + G_i), G_i = -log(-log(u_i)) with u_i uniform in
//     (0, 1) from Philox4x32-10 keyed by seed, counter (i / 4, offset), scores in double; a
//     sample of softmax(l / T) (the argmax of Gumbel-perturbed logits is distributed as the
//     softmax; exact up to the noise's 32-bit range, below)
//     with one read of the row instead of steps 3-4's passes. The noise is bounded above, so an
//     element whose score cannot reach the best one found so far skips its three logs (exact
//     pruning, step 2 in the kernel: the token is the unpruned draw's, bit for bit).
//  2. Block argmax of the processed row (ties -> lowest id: the reduction compares
//     (value, id) pairs). Greedy (temperature < 1e-5, top_k == 1) or a non-finite maximum
//     (the CPU's fallback) returns it.
//  3. Otherwise thresholds replace the CPU's sorts. Candidate order is the CPU's ByLogit:
//     logit descending, ties by id ascending. With key(l) the order-preserving uint32 of the
//     float, every kept set the CPU builds is a prefix of that order, i.e.
//         { key > kappa } ∪ { key == kappa and id < cutoff }
//     so a filter is one (kappa, cutoff) pair:
//       - top-k: kappa is found by a radix search over the key's 8 nibbles (8 passes over
//         the row; a pass block-reduces, for 15 edges lo + j·16^s, the number of elements
//         with key >= edge: registers and a fixed-order block reduction, no atomics), the
//         cutoff by one id-ordered pass (each thread owns a contiguous id range; a block
//         scan of the per-thread tie counts finds the (k - count(key > kappa))-th tie).
//       - top-p: the same radix search on the mass (sum of weights of top-k candidates with
//         key >= edge) for the key where the mass from the top first reaches
//         top_p · total; the ties at that key are taken in id order until the mass reaches
//         it: n = ceil((target - mass above) / w) of them (equal logits, equal weights).
//       - min-p: weight >= min_p (weights are relative to the maximum, whose weight is 1).
//     weight(l) = exp((l - max) / T) in fp32, as the CPU's float weights.
//  4. One draw: u in (0, 1] from Philox4x32-10 (curand) keyed by (seed, subsequence =
//     offset), x = u · total kept mass, inverse CDF over the kept set in id order (id-ordered
//     pass: block exclusive scan of per-thread masses, the thread whose range holds x walks
//     it; rounding at range edges is settled by atomicMin over claims, so the result is
//     deterministic). An exact sample of the renormalised distribution, like the CPU's walk
//     in candidate order (which is a different map from u to tokens: same distribution,
//     different token for the same u).
//  5. logprobs: lse of the raw row from the per-thread online states; the top N (<= 20) by
//     a threshold: the N-th largest of the 32 warp maxima bounds the N-th largest logit from
//     below, the (few) raw logits >= it are compacted into shared memory and ranked exactly
//     (value desc, id asc). If more than kTopCap pass (massive ties), N rounds of block argmax
//     over the row instead.
// Everything reduces in a fixed order, so a row's result depends only on its inputs, seed
// and offset (never on timing). Differences from the CPU, all at the rounding level:
//  - masses are fp32 block sums (CPU: double sums of the float weights), the temperature is
//    a float (CPU: double), so a top-p boundary within ~1e-6 relative of a cumulative mass,
//    or a weight within an ulp of min_p, may fall on the other side;
//  - the CPU throws on NaN logits; here NaN never wins an argmax and has no defined effect;
//  - the Gumbel draw (1b): its 32-bit uniforms bound the noise to [-3.13, 22.87], so a token
//    more than 26 nats (of l / T) below the maximum is never drawn (at most vocab · e^-26 of
//    mass, 6.5e-7 at a 128k vocabulary; the CPU's float weights drop tokens 87 nats below).
// Cost: the argmax pass always (with the Gumbel draw in it for temperature-only rows), the copy
// pass for rows with adjustments or a mask; top-k and top-p add 9 passes each over the row
// (L2-resident: a 256k-vocab row is 1 MiB); the draw adds 2 id-ordered passes. The Gumbel draw
// costs one Philox call per 4 ids (always made: it overlaps the logits' load) and the three
// logs of the noise only for the elements that can still win: l / T + bound(r) below the best
// score found so far in the CTA prunes an element, bound(r) = 5.5625 / 11.125 / 23 by r's leading
// ones (< 8 / < 16 / any): most of a row once a good score is known. With it, T=1 took 46 /
// 165 / 318 us at 1 / 512 / 1024 rows (bench_sampling_gpu on an H200, 2026-11-30; the numbers
// below were taken before the pruning; in-process A/B: 318 -> 164 us at 512 rows). Measured on an
// H200 (bench_sampling_gpu, 2026-11-30), vocab 128256, random logits, per launch: 1 row:
// greedy 14 us, T=1 80 us, top_k=50 245 us, top_p=0.95 405 us; 512 rows: 79 / 306 / 1263 /
// 1871 us; 1024 rows: 0.15 / 0.60 / 2.45 / 3.70 ms (before the Gumbel pass and the in-place
// rows, 1024 rows took 0.46 / 1.07 / 2.8 / 4.0 ms). Masked rows (half the ids allowed; H200,
// 2026-12-02) pay the copy pass: greedy 36 / 244 / 478 us, T=1 69 / 320 / 625 us at 1 / 512 /
// 1024 rows, as a row with one bias entry (same run, unmasked: greedy 15 / 80 / 148 us, T=1 46 /
// 166 / 319 us, top_k 240 / 1247 / 2419 us, top_p 407 / 1882 / 3725 us). The radix passes are
// latency-bound (one CTA per row); the next rung would cut the candidates to a shared-memory list
// after the first pass (most of the row is below any top-k / top-p threshold) and split big
// batches' rows over fewer threads.
#include <curand_kernel.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/model_ops.h"

namespace llm::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kEdges = 16;     // one nibble of the key per radix pass
constexpr int kTopCap = 2048;  // top-N candidates ranked in shared memory
constexpr unsigned kFull = 0xffffffffu;
static_assert(kWarps == 32, "the warp-maxima threshold assumes 32 warps (N <= 20 < 32)");
static_assert(kMaxTopLogprobs < kWarps, "top-N threshold needs N <= the number of warps");

struct SampleSmem {
  alignas(8) float red_f[kWarps * kEdges];  // also kWarps doubles (BlockArgmax of ArgBestD)
  int red_i[kWarps * kEdges];
  float bcast_f[kEdges];
  int bcast_i[kEdges];
  float wmax[kWarps];
  float top_val[kTopCap];
  int top_id[kTopCap];
  int top_count;
  int claim;
  float thr;
  double u;
  unsigned long long gumbel_known;  // DKey of the best Gumbel score computed so far (1b)
};

// Order-preserving key: a < b (floats) <=> Key(a) < Key(b); -0 and +0 map to the same key
// (x + 0.f turns -0 into +0), as the CPU's == treats them.
__device__ __forceinline__ uint32_t Key(float x) {
  const uint32_t b = __float_as_uint(x + 0.f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float KeyToFloat(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
}
// The same for doubles (the Gumbel draw's scores): a < b <=> DKey(a) < DKey(b) (not NaN).
__device__ __forceinline__ unsigned long long DKey(double x) {
  const auto b = static_cast<unsigned long long>(__double_as_longlong(x));
  return (b >> 63) ? ~b : (b | (1ull << 63));
}
__device__ __forceinline__ double DKeyToDouble(unsigned long long k) {
  return __longlong_as_double(static_cast<long long>((k >> 63) ? (k ^ (1ull << 63)) : ~k));
}

// ---- block-wide primitives (all threads call them; results are in every thread) ------------
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// (value, id) with the CPU's order: larger value first, ties -> lower id; NaN never wins.
// V = float for logits; double for the Gumbel draw's scores (l / T rounded to float would tie
// distinct logits at small T: |l| / T ~ 2e5 at T = 1e-4 has a float ulp of 0.016; and
// overflow for huge logits).
template <typename V>
struct ArgBestT {
  V v;
  int id;
};
using ArgBest = ArgBestT<float>;
using ArgBestD = ArgBestT<double>;
template <typename V>
__device__ __forceinline__ ArgBestT<V> Better(ArgBestT<V> a, ArgBestT<V> b) {
  return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
}
template <typename V>
__device__ ArgBestT<V> BlockArgmax(ArgBestT<V> x, SampleSmem& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    x = Better(x, ArgBestT<V>{__shfl_xor_sync(kFull, x.v, o), __shfl_xor_sync(kFull, x.id, o)});
  }
  V* red_v = reinterpret_cast<V*>(s.red_f);  // kWarps values (floats or doubles) fit in red_f
  if (threadIdx.x % 32 == 0) red_v[threadIdx.x / 32] = x.v, s.red_i[threadIdx.x / 32] = x.id;
  __syncthreads();
  ArgBestT<V> r{red_v[0], s.red_i[0]};
  for (int w = 1; w < kWarps; ++w) r = Better(r, ArgBestT<V>{red_v[w], s.red_i[w]});
  __syncthreads();
  return r;
}

__device__ int BlockMaxInt(int v, SampleSmem& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFull, v, o));
  if (threadIdx.x % 32 == 0) s.red_i[threadIdx.x / 32] = v;
  __syncthreads();
  int r = s.red_i[0];
  for (int w = 1; w < kWarps; ++w) r = max(r, s.red_i[w]);
  __syncthreads();
  return r;
}

// Online log-sum-exp state (max m, sum s of exp(x - m)); m = -inf means empty (s = 0).
struct Lse {
  float m, s;
};
__device__ __forceinline__ void Push(Lse& a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.f;  // a.m = -inf: 0 * 0 + 1
    a.m = x;
  } else if (x > -INFINITY) {
    a.s += expf(x - a.m);
  }
}
__device__ __forceinline__ Lse Merge(Lse a, Lse b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return Lse{m, 0.f};
  return Lse{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ Lse BlockLse(Lse x, SampleSmem& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    x = Merge(x, Lse{__shfl_xor_sync(kFull, x.m, o), __shfl_xor_sync(kFull, x.s, o)});
  }
  if (threadIdx.x % 32 == 0) s.red_f[threadIdx.x / 32] = x.m;
  if (threadIdx.x % 32 == 0) s.red_f[kWarps + threadIdx.x / 32] = x.s;
  __syncthreads();
  Lse r{s.red_f[0], s.red_f[kWarps]};
  for (int w = 1; w < kWarps; ++w) r = Merge(r, Lse{s.red_f[w], s.red_f[kWarps + w]});
  __syncthreads();
  return r;
}

// Sums a[0..15] over the block, fixed order (deterministic). red: [kWarps * kEdges].
template <typename T>
__device__ void BlockSum16(T (&a)[kEdges], T* red, T* bcast) {
#pragma unroll
  for (int j = 0; j < kEdges; ++j) a[j] = WarpSum(a[j]);
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int j = 0; j < kEdges; ++j) red[(threadIdx.x / 32) * kEdges + j] = a[j];
  }
  __syncthreads();
  if (threadIdx.x < kEdges) {
    T r = 0;
    for (int w = 0; w < kWarps; ++w) r += red[w * kEdges + threadIdx.x];
    bcast[threadIdx.x] = r;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kEdges; ++j) a[j] = bcast[j];
  __syncthreads();  // bcast is rewritten by the next call's first threads
}

// Exclusive prefix sum over threads in thread order; *total = the sum of all. Fixed order.
template <typename T>
__device__ T BlockExclusiveScan(T v, T* warp_totals, T* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  T x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  T excl = __shfl_up_sync(kFull, x, 1);
  if (lane == 0) excl = 0;
  if (lane == 31) warp_totals[warp] = x;
  __syncthreads();
  T base = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) base += warp_totals[w];
    all += warp_totals[w];
  }
  __syncthreads();
  *total = all;
  return base + excl;
}

// Thread t's contiguous id range for the id-ordered passes.
struct Chunk {
  int begin, end;
};
__device__ __forceinline__ Chunk MyChunk(int vocab) {
  const int per = (vocab + kThreads - 1) / kThreads;
  const int b = min(vocab, int(threadIdx.x) * per);
  return Chunk{b, min(vocab, b + per)};
}

// The Gumbel noise -log(-log(u)) of u = (r + 0.5) / 2^32 in (0, 1), precise at both ends: -log(u)
// from u itself below 1/2 and from 1 - u = (~r + 0.5) / 2^32 (exact in the integer) above, so
// no u rounds to 1 and every noise value is finite (at most ~22.9: the 32-bit uniform's edge).
__device__ __forceinline__ float Gumbel(uint32_t r) {
  const float e = r < 0x80000000u ? -logf((float(r) + 0.5f) * 0x1p-32f)
                                  : -log1pf(-((float(~r) + 0.5f) * 0x1p-32f));
  return -logf(e);
}
// Philox stream of the Gumbel draws (the counter's last word), apart from step 4's curand
// stream of the same (seed, offset).
constexpr uint32_t kGumbelStream = 0x6a09e667u;

// Upper bounds of Gumbel(r), for pruning the draw (1b) without changing it. With w = 1 - u,
// -log(u) = -log1p(-w) >= w, so Gumbel <= -log(w). For r >= 2^31 (the log1pf branch)
// w = (float(~r) + 0.5f) * 2^-32 >= 2^-33, and float(~r) >= 2^(31 - j) (a power of 2: the
// rounding cannot go below it) when r < 2^32 - 2^(31 - j), i.e. r has at most j leading ones:
// then w >= 2^-(j + 1) and Gumbel <= (j + 1) ln 2. For r < 2^31, u <= ~1/2 and Gumbel <=
// -log(log 2) = 0.37. So Gumbel(r) <= 33 ln 2 = 22.874 for every r (r = 0xFFFFFFFF), <= 16 ln 2
// = 11.090 for r < 0xFFFF0000 (at most 15 leading ones), <= 8 ln 2 = 5.545 for r < 0xFF000000
// (at most 7). The float evaluation (correctly rounded casts, logf / log1pf within 1-2 ulp) moves
// these by < 1e-5; the constants below add margins of 0.13, 0.035 and 0.017. Checked
// exhaustively over all 2^32 r on an H200 (sm_90a): the largest Gumbel(r) in the three ranges is
// 22.87386 / 11.09034 / 5.54322.
constexpr double kGumbelMax = 23.0;            // every r
constexpr uint32_t kGumbelMidR = 0xFFFF0000u;  // r below it: Gumbel(r) <= kGumbelMidMax
constexpr double kGumbelMidMax = 11.125;
constexpr uint32_t kGumbelLowR = 0xFF000000u;  // r below it: Gumbel(r) <= kGumbelLowMax
constexpr double kGumbelLowMax = 5.5625;

// Pruning cut of the draw: a float c such that every float v <= c (-inf included) has
// fma(double(v), inv_t, bound) < thr, or NaN (prunes nothing: v <= NaN is false) when none is
// found. fma(double(v), inv_t, bound) is nondecreasing in v (inv_t >= 0), so checking c itself
// suffices; the estimate (thr - bound) * t (t = 1 / inv_t up to rounding) is rounded down and,
// if the check fails by rounding, stepped down once. inv_t = 0 (T = inf): only -inf's score
// fma(-inf, 0, g) is NaN, which never wins an argmax anyway; NaN inv_t or thr: no cut.
__device__ __forceinline__ float PruneCut(double thr, double inv_t, double t, double bound) {
  float c = __double2float_rd((thr - bound) * t);
  if (fma(double(c), inv_t, bound) < thr) return c;
  c = nextafterf(c, -INFINITY);
  return fma(double(c), inv_t, bound) < thr ? c : NAN;
}

// ---- the filters ----------------------------------------------------------------------------
// Radix search over keys, in the order key descending: finds kappa with
//   S(key >= kappa) >= target > S(key > kappa),   S(...) = sum of value(i, l, key)
// where target = target_of(S(all)). Returns kappa; *above = S(key > kappa), *target_out.
// value >= 0. 8 passes, one nibble each; a pass reduces S(key >= lo + j·step), j = 1..15 (and
// j = 0 slot: S(key >= lo), which in the first pass is S(all)).
template <typename T, typename ValueFn, typename TargetFn>
__device__ uint32_t RadixSearch(const float* row, int vocab, ValueFn value, TargetFn target_of,
                                T* red, T* bcast, T* above, T* target_out) {
  uint32_t lo = 0;
  T sum_hi = 0;  // S(key >= lo + 16·step), 0 for the full range
  T target = 0;
  for (int shift = 28; shift >= 0; shift -= 4) {
    T acc[kEdges];
#pragma unroll
    for (int j = 0; j < kEdges; ++j) acc[j] = 0;
    T above_range = 0;
    auto visit = [&](int i, float l) {
      const uint32_t key = Key(l);
      if (key < lo) return;  // below the range: counts for no edge
      const T v = value(i, l, key);
      const uint32_t digit = (key - lo) >> shift;
      if (digit >= uint32_t(kEdges)) {
        above_range += v;
      } else {
        acc[0] += v;
#pragma unroll
        for (int j = 1; j < kEdges; ++j) acc[j] += digit >= uint32_t(j) ? v : T(0);
      }
    };
    // float4 loads where aligned: four independent loads in flight per thread (the pass is
    // bound by L2 latency, not bandwidth, with one CTA per row).
    int tail = 0;
    if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
      for (int c = threadIdx.x; c < vocab / 4; c += kThreads) {
        const float4 q = reinterpret_cast<const float4*>(row)[c];
        visit(4 * c, q.x), visit(4 * c + 1, q.y), visit(4 * c + 2, q.z), visit(4 * c + 3, q.w);
      }
      tail = vocab / 4 * 4;
    }
    for (int i = tail + threadIdx.x; i < vocab; i += kThreads) visit(i, row[i]);
#pragma unroll
    for (int j = 0; j < kEdges; ++j) acc[j] += above_range;
    BlockSum16(acc, red, bcast);
    if (shift == 28) target = target_of(acc[0]);
    // The largest j with S(>= edge j) >= target (S is monotone in j), and S(>= edge j + 1).
    // Unrolled selects: a runtime index into acc would put it in local memory.
    int sel = 0;
#pragma unroll
    for (int j = 1; j < kEdges; ++j) sel = acc[j] >= target ? j : sel;
    T next = sum_hi;
#pragma unroll
    for (int j = 0; j + 1 < kEdges; ++j) next = sel == j ? acc[j + 1] : next;
    sum_hi = next;
    lo += uint32_t(sel) << shift;
  }
  *above = sum_hi;
  *target_out = target;
  return lo;
}

// The id cutoff c such that the elements with pred(i, l) and id < c are the first n of them
// in id order (vocab when fewer than n exist). One id-ordered pass.
template <typename Pred>
__device__ int NthIdCutoff(const float* row, int vocab, Pred pred, int64_t n, SampleSmem& s) {
  const Chunk ch = MyChunk(vocab);
  int count = 0;
  for (int i = ch.begin; i < ch.end; ++i) count += pred(i, row[i]) ? 1 : 0;
  int total;
  const int excl = BlockExclusiveScan(count, s.red_i, &total);
  if (n >= total) return vocab;  // uniform: total is the same in every thread
  if (excl < n && n <= excl + count) {
    int r = excl;
    for (int i = ch.begin; i < ch.end; ++i) {
      if (pred(i, row[i]) && ++r == n) {
        s.bcast_i[0] = i + 1;
        break;
      }
    }
  }
  __syncthreads();
  const int c = s.bcast_i[0];
  __syncthreads();
  return c;
}

// Steps 5-9 of Sampler::Sample on the processed row (max > -inf and finite): the token.
__device__ int SampleFiltered(const float* proc, int vocab, const SampleRowParams& p,
                              float max_logit, SampleSmem& s) {
  const float inv_t = 1.f / p.temperature;
  auto weight = [=](float l) { return expf((l - max_logit) * inv_t); };

  // top-k: candidates are key > kk, or key == kk and id < ck (defaults: everything).
  uint32_t kk = 0;
  int ck = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    int above, target;
    kk = RadixSearch<int>(
        proc, vocab, [](int, float, uint32_t) { return 1; }, [&](int) { return p.top_k; }, s.red_i,
        s.bcast_i, &above, &target);
    ck = NthIdCutoff(
        proc, vocab, [=](int, float l) { return Key(l) == kk; }, int64_t(p.top_k) - above, s);
  }
  auto cand_k = [=](int i, uint32_t key) { return key > kk || (key == kk && i < ck); };

  // top-p over the top-k candidates, in the same order.
  uint32_t kp = 0;
  int cp = vocab;
  if (p.top_p < 1.f) {
    float above, target;
    kp = RadixSearch<float>(
        proc, vocab, [=](int i, float l, uint32_t key) { return cand_k(i, key) ? weight(l) : 0.f; },
        [&](float total) { return p.top_p * total; }, s.red_f, s.bcast_f, &above, &target);
    const float w = weight(KeyToFloat(kp));
    // The ties at kp all weigh w; the CPU adds them in id order until the mass reaches target.
    int64_t need = 1;
    if (w > 0.f) {
      const double n = ceil(double(target - above) / double(w));
      need = n < 1.0 ? 1 : (n > double(vocab) ? int64_t(vocab) : int64_t(n));
    }
    cp = NthIdCutoff(
        proc, vocab,
        [=](int i, float l) {
          const uint32_t key = Key(l);
          return key == kp && cand_k(i, key);
        },
        need, s);
  }
  // The kept weight of element i (0: not kept). min-p last, as the CPU.
  auto kept = [=](int i, float l) {
    const uint32_t key = Key(l);
    if (!cand_k(i, key) || !(key > kp || (key == kp && i < cp))) return 0.f;
    const float w = weight(l);
    return w >= p.min_p ? w : 0.f;
  };

  // The draw: inverse CDF over the kept set in id order.
  if (threadIdx.x == 0) {
    curandStatePhilox4_32_10_t state;
    curand_init(p.seed, p.offset, 0, &state);
    s.u = curand_uniform_double(&state);  // (0, 1]
    s.claim = INT_MAX;
  }
  const Chunk ch = MyChunk(vocab);
  float mass = 0.f;
  int last = -1;
  for (int i = ch.begin; i < ch.end; ++i) {
    const float w = kept(i, proc[i]);
    if (w > 0.f) mass += w, last = i;
  }
  float total;
  const float prefix = BlockExclusiveScan(mass, s.red_f, &total);  // its barriers publish s.u
  const int last_kept = BlockMaxInt(last, s);
  const double x = s.u * double(total);
  if (mass > 0.f && double(prefix) < x) {
    double acc = prefix;
    for (int i = ch.begin; i < ch.end; ++i) {
      const float w = kept(i, proc[i]);
      if (w > 0.f) {
        acc += w;
        if (x <= acc) {
          atomicMin(&s.claim, i);
          break;
        }
      }
    }
  }
  __syncthreads();
  const int token = s.claim == INT_MAX ? last_kept : s.claim;  // x past the end by rounding
  __syncthreads();
  return token;
}

// top_ids / top_logprobs [kMaxTopLogprobs] of the raw row: the n best, value desc, id asc.
__device__ void TopLogprobs(const float* raw, int vocab, int n, float thread_max, float lse,
                            int32_t* top_ids, float* top_logprobs, SampleSmem& s) {
  // Threshold: the n-th largest warp maximum. The n warps ranked above it each hold an element
  // >= it, so at least n elements are >= thr (thr = -inf, empty warps, when vocab is small).
  float wm = thread_max;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) wm = fmaxf(wm, __shfl_xor_sync(kFull, wm, o));
  if (threadIdx.x % 32 == 0) s.wmax[threadIdx.x / 32] = wm;
  if (threadIdx.x == 0) s.top_count = 0, s.thr = -INFINITY;
  __syncthreads();
  if (threadIdx.x < kWarps) {
    const float v = s.wmax[threadIdx.x];
    int rank = 0;
    for (int w = 0; w < kWarps; ++w) {
      const float o = s.wmax[w];
      rank += (o > v || (o == v && w < int(threadIdx.x))) ? 1 : 0;
    }
    if (rank == n - 1) s.thr = v;
  }
  __syncthreads();
  const float thr = s.thr;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = raw[i];
    if (v >= thr) {
      const int pos = atomicAdd(&s.top_count, 1);
      if (pos < kTopCap) s.top_val[pos] = v, s.top_id[pos] = i;
    }
  }
  __syncthreads();
  const int count = s.top_count;
  if (count <= kTopCap) {  // rank each candidate exactly (the order is strict: ids differ)
    for (int c = threadIdx.x; c < count; c += kThreads) {
      const ArgBest me{s.top_val[c], s.top_id[c]};
      int rank = 0;
      for (int o = 0; o < count; ++o) {
        const ArgBest other{s.top_val[o], s.top_id[o]};
        rank += (other.v > me.v || (other.v == me.v && other.id < me.id)) ? 1 : 0;
      }
      if (rank < n) top_ids[rank] = me.id, top_logprobs[rank] = me.v - lse;
    }
    return;
  }
  // Massive ties: n rounds of block argmax, each over the elements after the previous pick.
  ArgBest prev{INFINITY, -1};
  for (int r = 0; r < n; ++r) {
    ArgBest best{-INFINITY, INT_MAX};
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = raw[i];
      if (v < prev.v || (v == prev.v && i > prev.id)) best = Better(best, ArgBest{v, i});
    }
    prev = BlockArgmax(best, s);
    if (threadIdx.x == 0) top_ids[r] = prev.id, top_logprobs[r] = prev.v - lse;
  }
}

// One CTA per sampled row. workspace: [num_rows, vocab] fp32, the processed rows. prune: the
// Gumbel draw's exact pruning (SampleOptions::has_gumbel_pruning; false only in tests).
__global__ void __launch_bounds__(kThreads, 1)
    SampleKernel(const float* __restrict__ logits, int vocab,
                 const SampleRowParams* __restrict__ params, const LogitAdjust* __restrict__ adjust,
                 const uint32_t* __restrict__ masks, float* workspace, SampleOutputs out,
                 bool prune) {
  __shared__ SampleSmem s;
  const int row = blockIdx.x;
  const SampleRowParams p = params[row];
  const float* raw = logits + int64_t(p.logits_row) * vocab;
  float* proc = workspace + int64_t(row) * vocab;

  // 1. Copy + raw statistics, then the adjustments. A row without adjustments or a mask (the
  // common decode case) needs neither the copy nor, without logprobs, the statistics: the
  // processed row is the raw one, and every pass reads it there directly. A masked row's copy
  // writes -inf for the disallowed tokens (mask: SampleMaskWords(vocab) words, bit i % 32 of
  // word i / 32 for id i), so every later step sees them as the CPU's masked row.
  const bool greedy = p.temperature < 1e-5f || p.top_k == 1;
  const bool has_mask = p.mask_row >= 0 && masks != nullptr;
  const bool plain = p.adjust_begin >= p.adjust_end && !has_mask;
  // 1b. Temperature alone keeps every token: the Gumbel-max draw in the argmax pass.
  const bool gumbel =
      !greedy && (p.top_k <= 0 || p.top_k >= vocab) && !(p.top_p < 1.f) && !(p.min_p > 0.f);
  Lse stats{-INFINITY, 0.f};
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(raw) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(proc) % 16 == 0;
  // The raw row's statistics in one fixed order (each thread its float4 or scalar elements),
  // copying it to `proc` when asked, masked when `mask` is not null. (The mask is an argument,
  // not a capture, so that nothing of it stays live past step 1: 64 registers, no spills.)
  auto allowed = [](const uint32_t* mask, int i) {
    return mask == nullptr || ((mask[i / 32] >> (i % 32)) & 1u) != 0;
  };
  auto scan = [&](bool copy, const uint32_t* mask) {
    if (vec) {
      for (int c = threadIdx.x; c < vocab / 4; c += kThreads) {
        const float4 v = reinterpret_cast<const float4*>(raw)[c];
        if (copy) {
          float4 w = v;
          if (mask) {  // ids 4c .. 4c + 3 share one word
            const uint32_t bits = mask[c / 8] >> (4 * c % 32);
            w.x = (bits & 1u) ? w.x : -INFINITY, w.y = (bits & 2u) ? w.y : -INFINITY;
            w.z = (bits & 4u) ? w.z : -INFINITY, w.w = (bits & 8u) ? w.w : -INFINITY;
          }
          reinterpret_cast<float4*>(proc)[c] = w;
        }
        Push(stats, v.x), Push(stats, v.y), Push(stats, v.z), Push(stats, v.w);
      }
    } else {
      for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const float v = raw[i];
        if (copy) proc[i] = allowed(mask, i) ? v : -INFINITY;
        Push(stats, v);
      }
    }
  };
  if (!plain) {
    const int64_t mask_words = (vocab + 31) / 32;  // SampleMaskWords (a host function)
    const uint32_t* mask = has_mask ? masks + p.mask_row * mask_words : nullptr;
    scan(/*copy=*/true, mask);
    __syncthreads();  // the copies are visible to the threads that adjust
    for (int e = p.adjust_begin + threadIdx.x; e < p.adjust_end; e += kThreads) {
      const LogitAdjust a = adjust[e];
      if (a.token < 0 || a.token >= vocab) continue;  // validated by the host; never trusted
      if (!allowed(mask, a.token)) continue;          // masked: stays -inf (as the CPU's)
      float l = proc[a.token] + a.bias;
      l = l > 0 ? l / a.repetition : l * a.repetition;
      proc[a.token] = l - a.subtract;
    }
    __syncthreads();
  }

  // 2. Argmax of the processed row; greedy. With 1b, the Gumbel-perturbed argmax beside it:
  // groups of 4 ids share one Philox call (float4 loads where aligned).
  //   Pruning, exact (the drawn token is the unpruned pass's, bit for bit): `known` is a score
  // that an element of the row has (this thread's `drawn`, or another thread's through
  // s.gumbel_known), so an element whose score is provably below `known` is not the row's
  // maximum, and leaving it out changes no reduction's result: the block reduction's result is
  // the maximum of (score, -id) over the elements with a non-NaN score, whatever the grouping.
  // Provably below: score = fma(double(v), inv_t, double(g)) is rounded once and rounding is
  // monotone, so g <= bound gives score <= fma(double(v), inv_t, bound), which PruneCut's cut
  // compares strictly with `known`. An element whose logit is <= the cut of its r's noise bound
  // (kGumbelLowR / kGumbelMidR / every r) skips the three logs. NaN logits compare false with
  // every cut (never pruned: their NaN score never wins, as before); -inf logits are pruned once
  // known > -inf (their score -inf is below it); ties are never pruned (strictly below only).
  // `best` sees every element. The Philox call is not skipped for pruned groups: it does not
  // depend on the logits, so it runs while their load is in flight (skipping it would wait for
  // the load, and a whole warp's groups are rarely all pruned).
  const float* src = plain ? raw : proc;
  ArgBest best{-INFINITY, INT_MAX};
  ArgBestD drawn{-INFINITY, INT_MAX};
  if (gumbel) {
    const double t = double(p.temperature), inv_t = 1.0 / t;
    const uint2 key = make_uint2(uint32_t(p.seed), uint32_t(p.seed >> 32));
    const bool vec4 = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
    if (threadIdx.x == 0) s.gumbel_known = DKey(-INFINITY);
    __syncthreads();
    volatile unsigned long long* shared_known = &s.gumbel_known;
    double known = -INFINITY;
    float cut_all = NAN, cut_mid = NAN, cut_low = NAN;  // NaN: nothing pruned yet
    auto raise_known = [&](double k) {
      known = k;
      cut_all = PruneCut(k, inv_t, t, kGumbelMax);
      cut_mid = PruneCut(k, inv_t, t, kGumbelMidMax);
      cut_low = PruneCut(k, inv_t, t, kGumbelLowMax);
    };
    for (int c = threadIdx.x; c < (vocab + 3) / 4; c += kThreads) {
      const uint4 r = curand_Philox4x32_10(
          make_uint4(uint32_t(c), uint32_t(p.offset), uint32_t(p.offset >> 32), kGumbelStream),
          key);
      float v[4];
      if (vec4) {
        const float4 q = reinterpret_cast<const float4*>(src)[c];
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = 4 * c + e < vocab ? src[4 * c + e] : -INFINITY;
      }
      const double k = DKeyToDouble(*shared_known);
      if (prune && k > known) raise_known(k);  // (without pruning the cuts stay NaN)
      const uint32_t u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * c + e;
        if (i >= vocab) break;
        best = Better(best, ArgBest{v[e], i});
        if (v[e] <= (u[e] < kGumbelLowR ? cut_low : u[e] < kGumbelMidR ? cut_mid : cut_all)) {
          continue;  // pruned: its score is below `known`
        }
        drawn = Better(drawn, ArgBestD{fma(double(v[e]), inv_t, double(Gumbel(u[e]))), i});
      }
      if (prune && drawn.v > known) {
        raise_known(drawn.v);
        atomicMax(const_cast<unsigned long long*>(shared_known), DKey(drawn.v));
      }
    }
  } else {
    for (int i = threadIdx.x; i < vocab; i += kThreads) best = Better(best, ArgBest{src[i], i});
  }
  best = BlockArgmax(best, s);
  if (best.id == INT_MAX) best.id = 0;  // all NaN (the CPU rejects such rows)
  if (gumbel) drawn = BlockArgmax(drawn, s);
  int token = best.id;
  if (!greedy && isfinite(best.v)) {
    // A non-finite maximum keeps the argmax (the CPU's fallback). With a finite maximum its
    // score is finite, so drawn.id is a real id (the INT_MAX guard is for safety only).
    token = gumbel ? (drawn.id == INT_MAX ? best.id : drawn.id)
                   : SampleFiltered(src, vocab, p, best.v, s);
  }

  // 3. Outputs; logprobs of the raw row.
  if (threadIdx.x == 0) out.token[row] = token;
  if (p.num_logprobs < 0) return;
  if (plain) scan(/*copy=*/false, nullptr);
  const Lse total = BlockLse(stats, s);
  const float lse = isfinite(total.m) ? total.m + logf(total.s) : total.m;
  if (threadIdx.x == 0 && out.logprob) out.logprob[row] = raw[token] - lse;
  const int n = min(min(p.num_logprobs, kMaxTopLogprobs), vocab);
  if (n > 0 && out.top_ids && out.top_logprobs) {
    TopLogprobs(raw, vocab, n, stats.m, lse, out.top_ids + int64_t(row) * kMaxTopLogprobs,
                out.top_logprobs + int64_t(row) * kMaxTopLogprobs, s);
  }
}

}  // namespace

size_t SampleWorkspaceBytes(int64_t num_rows, int64_t vocab) {
  if (num_rows <= 0 || vocab <= 0) return 0;
  return size_t(num_rows) * size_t(vocab) * sizeof(float);
}

void SampleTokens(const float* logits, int64_t vocab, const SampleRowParams* params,
                  int64_t num_rows, const LogitAdjust* adjust, const uint32_t* masks,
                  void* workspace, const SampleOutputs& out, cudaStream_t stream,
                  const SampleOptions& options) {
  if (num_rows <= 0) return;
  if (vocab <= 0 || vocab > INT_MAX / 2) {
    throw std::invalid_argument("SampleTokens: vocab must be in [1, 2^30)");
  }
  SampleKernel<<<unsigned(num_rows), kThreads, 0, stream>>>(
      logits, static_cast<int>(vocab), params, adjust, masks, static_cast<float*>(workspace), out,
      options.has_gumbel_pruning);
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llm::cuda
