// CPU attention micro-benchmark: naive (cpu::AttentionPlain, full-row softmax over a
// contiguous cache) against the tiled paged kernels (kernels/cpu/flash_attention.h).
// Every variant is validated against the naive one on the same inputs before it is timed.
// Prefill reports tokens/s and GFLOP/s (4·L²·head_dim·num_heads / 2 causal, plus the
// context's pairs in chunked prefill); decode
// reports tokens/s and GB/s of K+V read (2 · context · num_kv_heads · head_dim · 4 bytes per
// sequence; 1 byte per element for the fp8 (e4m3) variants, which are validated against the
// naive fp32 kernel with e4m3's rounding allowed). Prints a table and one JSON line per
// measurement.
//   ninja -C build bench_attention_cpu && ./build/bench_attention_cpu [repeats=5] [prefill|decode]
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/fp8.h"

namespace {

using llm::AttentionBatch;
using llm::PagedKvLayout;

// A pool buffer on 2 MiB-aligned memory, advised as huge pages when kHugePages (the pools
// are scattered 4-8 KiB tiles: with 4 KiB pages nearly every block is a TLB miss).
bool g_huge_pages = false;
struct Pool {
  explicit Pool(size_t n) : size(n) {
    const size_t bytes = (n * sizeof(float) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    data = static_cast<float*>(std::aligned_alloc(2u << 20, bytes));
    if (g_huge_pages) madvise(data, bytes, MADV_HUGEPAGE);
  }
  ~Pool() { std::free(data); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  float& operator[](size_t i) { return data[i]; }
  float* data;
  size_t size;
};

struct Shape {
  int64_t num_seqs, q_len, context, num_heads, num_kv_heads, head_dim, block_size;
};

// Contiguous per-sequence caches [keys, num_kv_heads, head_dim] for the naive kernel and the
// same values in a paged pool with shuffled block tables for the tiled kernels.
struct Inputs {
  std::vector<std::vector<float>> k_seq, v_seq;
  std::vector<float> q;
  std::unique_ptr<Pool> k_pool, v_pool;
  std::vector<int32_t> cu_seqlens_q, context_lens, block_tables;
  PagedKvLayout layout;
  AttentionBatch batch;
};

Inputs MakeInputs(const Shape& s, std::mt19937& rng) {
  Inputs in;
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t keys = s.context + s.q_len, kv_dim = s.num_kv_heads * s.head_dim;
  const int64_t blocks_per_seq = (keys + s.block_size - 1) / s.block_size;
  in.layout = {s.num_seqs * blocks_per_seq, s.block_size, s.num_kv_heads, s.head_dim};
  in.k_pool = std::make_unique<Pool>(in.layout.pool_elements());
  in.v_pool = std::make_unique<Pool>(in.layout.pool_elements());
  std::vector<int32_t> ids(in.layout.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  in.block_tables = ids;
  for (int64_t i = 0; i < s.num_seqs; ++i) {
    std::vector<float> k(keys * kv_dim), v(keys * kv_dim);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    const int32_t* table = in.block_tables.data() + i * blocks_per_seq;
    for (int64_t p = 0; p < keys; ++p) {
      for (int64_t h = 0; h < s.num_kv_heads; ++h) {
        const int64_t at = in.layout.Offset(table[p / s.block_size], h, p % s.block_size);
        std::copy_n(&k[(p * s.num_kv_heads + h) * s.head_dim], s.head_dim, &(*in.k_pool)[at]);
        std::copy_n(&v[(p * s.num_kv_heads + h) * s.head_dim], s.head_dim, &(*in.v_pool)[at]);
      }
    }
    in.k_seq.push_back(std::move(k));
    in.v_seq.push_back(std::move(v));
    in.cu_seqlens_q.push_back(static_cast<int32_t>(i * s.q_len));
    in.context_lens.push_back(static_cast<int32_t>(s.context));
  }
  in.cu_seqlens_q.push_back(static_cast<int32_t>(s.num_seqs * s.q_len));
  in.q.resize(s.num_seqs * s.q_len * s.num_heads * s.head_dim);
  for (float& x : in.q) x = dist(rng);
  in.batch = {s.num_seqs, in.cu_seqlens_q.data(), in.context_lens.data(), in.block_tables.data(),
              blocks_per_seq};
  return in;
}

// Wall times of `repeats` runs after one warm-up: the best and the median. This 2-core VM is
// shared (other builds preempt an OpenMP thread for a 4 ms scheduler tick), so the rates use
// the best run, the kernel's own speed; the median shows the noise.
struct Timing {
  double best = 0, median = 0;
};
Timing TimeIt(const std::function<void()>& fn, int repeats) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0, mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max<double>(err, std::isnan(got[i]) ? INFINITY : std::abs(got[i] - ref[i]));
    mx = std::max<double>(mx, std::abs(ref[i]));
  }
  return err / mx;
}

void Report(const char* kind, const char* variant, const Shape& s, Timing t, double err,
            int64_t splits, int kv_bytes_per_element = 4) {
  const double tokens = double(s.num_seqs * s.q_len);
  const bool is_prefill = std::string(kind) == "prefill";
  // Prefill: 4·head_dim·num_heads FLOPs per visible (query, key) pair; query r of a sequence
  // sees context + r + 1 keys, so with no context this is 4·L²·head_dim·num_heads / 2.
  const double num_pairs = double(s.q_len) * s.context + double(s.q_len) * (s.q_len + 1) / 2;
  const double work = is_prefill ? 4.0 * num_pairs * s.head_dim * s.num_heads * s.num_seqs
                                 : 2.0 * (s.context + 1) * s.num_kv_heads * s.head_dim *
                                       kv_bytes_per_element * s.num_seqs;  // K and V bytes read
  const double rate = work / t.best / 1e9;                                 // GFLOP/s or GB/s
  char shape[96];
  std::snprintf(shape, sizeof(shape), "%lldx%lld ctx %lld h %lld/%lld hd %lld",
                (long long)s.num_seqs, (long long)s.q_len, (long long)s.context,
                (long long)s.num_heads, (long long)s.num_kv_heads, (long long)s.head_dim);
  std::printf("%-8s %-17s %-32s %9.3f %9.3f %10.0f %8.2f %-7s %3lld  %.1e\n", kind, variant, shape,
              t.best * 1e3, t.median * 1e3, tokens / t.best, rate, is_prefill ? "GFLOP/s" : "GB/s",
              (long long)splits, err);
  std::printf(
      "JSON {\"kind\": \"%s\", \"variant\": \"%s\", \"num_seqs\": %lld, \"q_len\": %lld, "
      "\"context\": %lld, \"num_heads\": %lld, \"num_kv_heads\": %lld, \"head_dim\": %lld, "
      "\"block_size\": %lld, \"best_ms\": %.4f, \"median_ms\": %.4f, \"tokens_per_s\": %.1f, "
      "\"%s\": %.3f, \"max_rel_err_vs_naive\": %.3g, \"num_splits\": %lld, \"threads\": %d}\n",
      kind, variant, (long long)s.num_seqs, (long long)s.q_len, (long long)s.context,
      (long long)s.num_heads, (long long)s.num_kv_heads, (long long)s.head_dim,
      (long long)s.block_size, t.best * 1e3, t.median * 1e3, tokens / t.best,
      is_prefill ? "gflop_per_s" : "gb_per_s", rate, err, (long long)splits, omp_get_max_threads());
}

// Naive reference for the whole batch: AttentionPlain per sequence.
void RunNaive(const Shape& s, const Inputs& in, std::vector<float>& out) {
  const int64_t row = s.num_heads * s.head_dim;
  for (int64_t i = 0; i < s.num_seqs; ++i) {
    llm::cpu::AttentionPlain(in.q.data() + i * s.q_len * row, in.k_seq[i].data(),
                             in.v_seq[i].data(), out.data() + i * s.q_len * row, s.q_len, s.context,
                             s.num_heads, s.num_kv_heads, s.head_dim);
  }
}

// Validates every variant against naive, then times them all.
void Bench(const char* kind, const Shape& s, int repeats, const std::string& only) {
  if (!only.empty() && only != kind) return;
  std::mt19937 rng(42);
  const Inputs in = MakeInputs(s, rng);
  const llm::PagedKvView<const float> kv{in.k_pool->data, in.v_pool->data, in.layout};
  const float scale = 1.f / std::sqrt(float(s.head_dim));
  std::vector<float> ref(in.q.size()), out(in.q.size());
  RunNaive(s, in, ref);
  Report(kind, "naive", s, TimeIt([&] { RunNaive(s, in, out); }, repeats), 0, 0);
  struct Variant {
    const char* name;
    int64_t splits;  // decode only; -1: prefill kernel
    bool fp8 = false;
  };
  std::vector<Variant> variants;
  if (std::string(kind) == "prefill") {
    variants = {{"tiled_paged", -1}, {"tiled_paged_fp8", -1, true}};
  } else {
    variants = {{"paged_split1", 1}, {"paged_split_auto", 0}, {"paged_fp8_split_auto", 0, true}};
  }
  // The same pools in e4m3 (scales of 1: the values have stddev 1).
  std::vector<uint8_t> k8(in.layout.pool_elements()), v8(in.layout.pool_elements());
  for (size_t i = 0; i < k8.size(); ++i) {
    k8[i] = llm::F32ToE4m3(in.k_pool->data[i]);
    v8[i] = llm::F32ToE4m3(in.v_pool->data[i]);
  }
  const llm::PagedKvView<const uint8_t> kv8{k8.data(), v8.data(), in.layout};
  for (const Variant& v : variants) {
    llm::cpu::AttentionStats stats;
    const auto run = [&] {
      if (v.splits < 0 && v.fp8) {
        llm::cpu::PagedPrefillAttention(in.q.data(), kv8, {}, in.batch, s.num_heads, scale,
                                        out.data(), &stats);
      } else if (v.splits < 0) {
        llm::cpu::PagedPrefillAttention(in.q.data(), kv, in.batch, s.num_heads, scale, out.data(),
                                        &stats);
      } else if (v.fp8) {
        llm::cpu::PagedDecodeAttention(in.q.data(), kv8, {}, in.batch, s.num_heads, scale,
                                       out.data(), v.splits, &stats);
      } else {
        llm::cpu::PagedDecodeAttention(in.q.data(), kv, in.batch, s.num_heads, scale, out.data(),
                                       v.splits, &stats);
      }
    };
    std::fill(out.begin(), out.end(), NAN);
    run();
    const double err = MaxRelDiff(out, ref);
    if (!(err < (v.fp8 ? 0.25 : 1e-4))) {  // fp8: e4m3 keeps 3 mantissa bits
      std::printf("VALIDATION FAILED: %s %s max rel err %.3g\n", kind, v.name, err);
      std::exit(1);
    }
    Report(kind, v.name, s, TimeIt(run, repeats), err, stats.num_splits, v.fp8 ? 1 : 4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  const std::string only = argc > 2 ? argv[2] : "";
  g_huge_pages = std::getenv("BENCH_HUGE_PAGES") != nullptr;  // "prefill" or "decode": only those
  std::printf("threads: %d; rates from the best of the repeats (see TimeIt)\n",
              omp_get_max_threads());
  std::printf("%-8s %-17s %-32s %9s %9s %10s %8s %-7s %3s  %s\n", "kind", "variant", "shape",
              "best_ms", "median_ms", "tok/s", "rate", "unit", "spl", "err_vs_naive");
  // {num_seqs, q_len, context, num_heads, num_kv_heads, head_dim, block_size}
  Bench("prefill", {1, 2048, 0, 8, 2, 64, 16}, repeats, only);
  Bench("prefill", {1, 2048, 0, 32, 4, 64, 16}, repeats, only);  // TinyLlama-shaped heads
  Bench("prefill", {1, 1024, 0, 8, 8, 128, 16}, repeats, only);
  Bench("prefill", {4, 512, 512, 8, 2, 64, 16}, repeats, only);  // chunked prefill
  Bench("decode", {1, 1, 4096, 8, 2, 64, 16}, repeats * 10, only);
  Bench("decode", {8, 1, 4096, 8, 2, 64, 16}, repeats * 10, only);
  Bench("decode", {1, 1, 4096, 32, 4, 64, 16}, repeats * 10, only);
  Bench("decode", {8, 1, 4096, 32, 8, 128, 16}, repeats * 4, only);
  // One KV head, one sequence: without splits only one thread has work.
  Bench("decode", {1, 1, 16384, 8, 1, 64, 16}, repeats * 10, only);
  return 0;
}
