// Tests of the CPU flash-attention kernels (kernels/cpu/flash_attention.h) and the online
// softmax state (kernels/online_softmax.h) against a naive float64 full-row softmax reference
// that reads K/V through the same block tables. Caches use random, shuffled, non-contiguous
// block assignments and unused blocks hold random values, so an addressing bug cannot hide.
//
// Error bound: fp32 inputs, fp32 accumulation, errors measured as max |got - ref| / max |ref|
// per case. Each output is a convex combination of V rows; its error comes from rounding the
// scores (dot products of <= 256 terms; |scaled score| up to ~10 here, so an absolute error
// of ~1e-6 in s is a relative 1e-6 in p), from the exp (Exp2 is within 1e-7 relative) and
// from sums of <= 16k terms in l and acc. The naive fp32 kernel (cpu::AttentionPlain) shows
// ~2e-6 on a 1k-key case (ErrorIsCloseToNaiveFp32Error); the tiled kernels measure
// 3e-7..2e-6 and must stay within 4× the naive error there. kMaxRelError = 1e-5 (5× the
// naive fp32 error) fails on any real bug: a wrong key, mask or rescale is a 1e-2..1 error.
#include "kernels/cpu/flash_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/fp8.h"
#include "kernels/online_softmax.h"
#include "tests/test_util.h"

namespace llm::cpu {
namespace {

constexpr double kMaxRelError = 1e-5;

// A ragged batch over a randomly laid out paged cache (one layer).
struct PagedCase {
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  int64_t block_size = 16;
  std::vector<int32_t> q_lens;
  std::vector<int32_t> context_lens;
  int64_t sliding_window = 0;
};

struct PagedData {
  PagedKvLayout layout;
  std::vector<float> k, v;  // pools [num_blocks, num_kv_heads, block_size, head_dim]
  std::vector<float> q;     // [num_tokens, num_heads, head_dim]
  std::vector<int32_t> cu_seqlens_q, context_lens, block_tables;
  AttentionBatch batch;
  int64_t num_tokens = 0;
  PagedKvView<const float> View() const { return {k.data(), v.data(), layout}; }
};

std::vector<float> RandomVector(size_t n, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// Builds the cache: every sequence owns ceil(keys / block_size) blocks drawn from a shuffled
// pool with spare blocks, so neighbours in a table are rarely neighbours in memory.
PagedData MakePagedData(const PagedCase& c, std::mt19937& rng) {
  PagedData d;
  const int64_t num_seqs = static_cast<int64_t>(c.q_lens.size());
  int64_t max_blocks = 1, total_blocks = 0;
  d.cu_seqlens_q.push_back(0);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t keys = c.context_lens[i] + c.q_lens[i];
    const int64_t blocks = (keys + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
    d.cu_seqlens_q.push_back(d.cu_seqlens_q.back() + c.q_lens[i]);
  }
  d.num_tokens = d.cu_seqlens_q.back();
  d.layout = {total_blocks + 7, c.block_size, c.num_kv_heads, c.head_dim};
  std::vector<int32_t> ids(d.layout.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  d.block_tables.assign(num_seqs * max_blocks, -1);
  int64_t next = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t keys = c.context_lens[i] + c.q_lens[i];
    for (int64_t b = 0; b < (keys + c.block_size - 1) / c.block_size; ++b) {
      d.block_tables[i * max_blocks + b] = ids[next++];
    }
  }
  d.k = RandomVector(d.layout.pool_elements(), 1.f, rng);
  d.v = RandomVector(d.layout.pool_elements(), 1.f, rng);
  d.q = RandomVector(d.num_tokens * c.num_heads * c.head_dim, 2.f, rng);
  d.context_lens = c.context_lens;
  d.batch = {num_seqs,   d.cu_seqlens_q.data(), d.context_lens.data(), d.block_tables.data(),
             max_blocks, c.sliding_window};
  return d;
}

// float64 reference of one query row (token t of sequence seq, head h) into out[head_dim]:
// the plain definition, cpu::PagedAttentionReferenceRow (causal).
void ReferenceRow(const PagedData& d, int64_t num_heads, int64_t seq, int64_t t, int64_t h,
                  double* out) {
  cpu::PagedAttentionReferenceRow(d.q.data(), d.View(), d.batch, num_heads,
                                  1.f / std::sqrt(float(d.layout.head_dim)), seq, t, h,
                                  /*causal=*/true, out);
}

// max |got - ref| / max |ref| over the given (token, head) rows; NaN propagates as +inf.
double RelError(const PagedData& d, int64_t num_heads, const std::vector<float>& got,
                const std::vector<std::pair<int64_t, int64_t>>& rows) {
  const int64_t hd = d.layout.head_dim;
  double max_err = 0, max_ref = 0;
#pragma omp parallel for schedule(dynamic) reduction(max : max_err, max_ref)
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto [t, h] = rows[r];
    const int64_t seq = std::upper_bound(d.cu_seqlens_q.begin(), d.cu_seqlens_q.end(), t) -
                        d.cu_seqlens_q.begin() - 1;
    std::vector<double> ref(hd);
    ReferenceRow(d, num_heads, seq, t, h, ref.data());
    for (int64_t i = 0; i < hd; ++i) {
      const double g = got[(t * num_heads + h) * hd + i];
      const double err =
          std::isnan(g) ? std::numeric_limits<double>::infinity() : std::abs(g - ref[i]);
      max_err = std::max(max_err, err);
      max_ref = std::max(max_ref, std::abs(ref[i]));
    }
  }
  return max_err / max_ref;
}

std::vector<std::pair<int64_t, int64_t>> AllRows(int64_t num_tokens, int64_t num_heads) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < num_heads; ++h) rows.emplace_back(t, h);
  }
  return rows;
}

std::vector<float> Poisoned(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

std::string Describe(const PagedCase& c) {
  char buf[180];
  std::snprintf(buf, sizeof(buf), "seqs=%zu heads=%lld/%lld hd=%lld bs=%lld tokens=%d%s",
                c.q_lens.size(), (long long)c.num_heads, (long long)c.num_kv_heads,
                (long long)c.head_dim, (long long)c.block_size,
                std::accumulate(c.q_lens.begin(), c.q_lens.end(), 0),
                c.sliding_window > 0 ? (" W=" + std::to_string(c.sliding_window)).c_str() : "");
  return buf;
}

double RunPrefillCase(const PagedCase& c, std::mt19937& rng) {
  const PagedData d = MakePagedData(c, rng);
  std::vector<float> out = Poisoned(d.q.size());
  AttentionStats stats;
  PagedPrefillAttention(d.q.data(), d.View(), d.batch, c.num_heads,
                        1.f / std::sqrt(float(c.head_dim)), out.data(), &stats);
  const double err = RelError(d, c.num_heads, out, AllRows(d.num_tokens, c.num_heads));
  std::printf("prefill %-58s max rel err %.3g\n", Describe(c).c_str(), err);
  EXPECT_LE(err, kMaxRelError) << Describe(c);
  EXPECT_LT(stats.scratch_bytes_per_thread, size_t{1} << 20);
  return err;
}

PagedCase RandomCase(std::mt19937& rng, int max_q_len, int max_context) {
  const int64_t head_dims[] = {8, 64, 80, 128, 256};
  const int64_t groups[] = {1, 2, 4, 8};
  const int64_t block_sizes[] = {1, 8, 16, 32};
  PagedCase c;
  c.head_dim = head_dims[rng() % 5];
  c.num_kv_heads = 1 + rng() % 2;
  c.num_heads = c.num_kv_heads * groups[rng() % 4];
  c.block_size = block_sizes[rng() % 4];
  const int num_seqs = 1 + rng() % 8;
  for (int i = 0; i < num_seqs; ++i) {
    c.q_lens.push_back(1 + rng() % max_q_len);
    c.context_lens.push_back(rng() % 3 == 0 ? 0 : rng() % (max_context + 1));
  }
  return c;
}

TEST(OnlineSoftmaxTest, Exp2MatchesLibm) {
  double max_rel = 0;
  for (float x = -126.f; x <= 0.f; x += 0.0137f) {
    max_rel = std::max(max_rel, std::abs(Exp2(x) - std::exp2(double(x))) / std::exp2(double(x)));
  }
  std::printf("Exp2 max relative error %.3g\n", max_rel);
  EXPECT_LT(max_rel, 5e-7);
  EXPECT_EQ(Exp2(-INFINITY), 0.f);
  EXPECT_EQ(Exp2(-200.f), 0.f);
  EXPECT_EQ(Exp2(0.f), 1.f);
  EXPECT_TRUE(std::isnan(Exp2(NAN)));
}

// Feeds scores s (log2 domain) with values v [n, dim] into a state in tiles of `tile`.
OnlineSoftmax Feed(std::vector<float> s, const std::vector<float>& v, int64_t dim, int64_t tile,
                   std::vector<float>& acc) {
  OnlineSoftmax st;
  acc.assign(dim, 0.f);
  for (size_t j0 = 0; j0 < s.size(); j0 += tile) {
    const int64_t n = std::min<int64_t>(tile, s.size() - j0);
    const float alpha = st.Update(s.data() + j0, n);
    for (int64_t i = 0; i < dim; ++i) acc[i] *= alpha;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < dim; ++i) acc[i] += s[j0 + j] * v[(j0 + j) * dim + i];
    }
  }
  return st;
}

TEST(OnlineSoftmaxTest, MergeOfHalvesEqualsOnePass) {
  std::mt19937 rng(1);
  const int64_t n = 300, dim = 5;
  std::vector<float> s = RandomVector(n, 8.f, rng), v = RandomVector(n * dim, 1.f, rng);
  for (int j = 0; j < n; j += 7) s[j] = -INFINITY;  // some masked keys
  std::vector<float> acc_all, acc_a, acc_b;
  const OnlineSoftmax all = Feed(s, v, dim, 64, acc_all);
  OnlineSoftmax a =
      Feed({s.begin(), s.begin() + 123}, {v.begin(), v.begin() + 123 * dim}, dim, 16, acc_a);
  const OnlineSoftmax b =
      Feed({s.begin() + 123, s.end()}, {v.begin() + 123 * dim, v.end()}, dim, 32, acc_b);
  a.Merge(acc_a.data(), b, acc_b.data(), dim);
  EXPECT_FLOAT_EQ(a.m, all.m);
  EXPECT_NEAR(a.l, all.l, 1e-5 * all.l);
  std::vector<float> o_all(dim), o_merged(dim);
  all.Finalize(acc_all.data(), o_all.data(), dim);
  a.Finalize(acc_a.data(), o_merged.data(), dim);
  // Against float64 softmax.
  double m = -INFINITY, l = 0;
  for (float x : s) m = std::max<double>(m, x);
  std::vector<double> ref(dim, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const double p = std::exp2(s[j] - m);
    l += p;
    for (int64_t i = 0; i < dim; ++i) ref[i] += p * v[j * dim + i];
  }
  for (int64_t i = 0; i < dim; ++i) {
    EXPECT_NEAR(o_merged[i], o_all[i], 1e-6);
    EXPECT_NEAR(o_all[i], ref[i] / l, 1e-6);
  }
  EXPECT_NEAR(all.Lse(), (m + std::log2(l)) * std::log(2.0), 1e-5);
}

TEST(OnlineSoftmaxTest, EmptyAndMaskedStatesAreNanFree) {
  const int64_t dim = 3;
  std::vector<float> masked(10, -INFINITY), v(10 * dim, 1.f), acc;
  OnlineSoftmax st = Feed(masked, v, dim, 4, acc);
  EXPECT_EQ(st.m, -INFINITY);
  EXPECT_EQ(st.l, 0.f);
  for (float x : acc) EXPECT_EQ(x, 0.f);
  std::vector<float> out(dim, NAN);
  st.Finalize(acc.data(), out.data(), dim);
  for (float x : out) EXPECT_EQ(x, 0.f);  // documented: no visible key -> zeros
  EXPECT_EQ(st.Lse(), -INFINITY);
  // Empty + empty stays empty; empty + real equals real.
  OnlineSoftmax empty;
  std::vector<float> acc_empty(dim, 0.f);
  st.Merge(acc.data(), empty, acc_empty.data(), dim);
  EXPECT_EQ(st.m, -INFINITY);
  std::vector<float> s = {1.f, 2.f, -INFINITY}, v3 = {1, 2, 3, 4, 5, 6, 7, 8, 9}, acc_real;
  const OnlineSoftmax real = Feed(s, v3, dim, 2, acc_real);
  empty.Merge(acc_empty.data(), real, acc_real.data(), dim);
  EXPECT_EQ(empty.m, real.m);
  EXPECT_EQ(empty.l, real.l);
  for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(acc_empty[i], acc_real[i]);
  for (float x : acc_empty) EXPECT_FALSE(std::isnan(x));
}

// Every head_dim × GQA ratio × block size, small ragged batches with cached context.
TEST(PagedPrefillTest, AllShapesMatchReference) {
  std::mt19937 rng(7);
  double worst = 0;
  for (int64_t hd : {8, 64, 80, 128, 256}) {
    for (int64_t group : {1, 2, 4, 8}) {
      for (int64_t bs : {1, 8, 16, 32}) {
        PagedCase c;
        c.head_dim = hd;
        c.num_kv_heads = 2;
        c.num_heads = 2 * group;
        c.block_size = bs;
        c.q_lens = {int32_t(1 + rng() % 70), 1, int32_t(1 + rng() % 20)};
        c.context_lens = {0, int32_t(rng() % 90), int32_t(rng() % 40)};
        worst = std::max(worst, RunPrefillCase(c, rng));
      }
    }
  }
  std::printf("all shapes: worst max rel err %.3g (bound %.0e)\n", worst, kMaxRelError);
}

// cpu::PagedAttentionReference, the plain definition the GPU tests and benches compare with:
// causal, it equals the flash kernel; non-causal, each query sees its whole sequence, so the
// last query of a sequence is unchanged (bit for bit: the same keys in the same order) and an
// earlier one is not.
TEST(PagedAttentionReferenceTest, CausalIsTheFlashResultNonCausalSeesTheWholeSequence) {
  std::mt19937 rng(5);
  PagedCase c;
  c.q_lens = {37, 1, 20};
  c.context_lens = {0, 50, 13};
  const PagedData d = MakePagedData(c, rng);
  const size_t n = d.q.size();
  const float scale = 1.f / std::sqrt(float(c.head_dim));
  std::vector<float> flash(n), causal(n), full(n);
  cpu::PagedPrefillAttention(d.q.data(), d.View(), d.batch, c.num_heads, scale, flash.data());
  cpu::PagedAttentionReference(d.q.data(), d.View(), d.batch, c.num_heads, scale, causal.data());
  cpu::PagedAttentionReference(d.q.data(), d.View(), d.batch, c.num_heads, scale, full.data(),
                               /*causal=*/false);
  double err = 0, mx = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(double(flash[i]) - causal[i]));
    mx = std::max(mx, std::fabs(double(causal[i])));
  }
  EXPECT_LE(err / mx, kMaxRelError);
  const int64_t row = c.num_heads * c.head_dim;  // one token's outputs
  for (size_t s = 0; s < c.q_lens.size(); ++s) {
    const int64_t last = d.cu_seqlens_q[s + 1] - 1;
    for (int64_t i = 0; i < row; ++i) {
      ASSERT_EQ(full[size_t(last * row + i)], causal[size_t(last * row + i)]) << "sequence " << s;
    }
  }
  double first_diff = 0;  // token 0 of sequence 0: 1 key causal, 37 non-causal
  for (int64_t i = 0; i < row; ++i) {
    first_diff = std::max(first_diff, std::fabs(double(full[size_t(i)]) - causal[size_t(i)]));
  }
  EXPECT_GT(first_diff, 0.05);
}

// Random ragged batches (1-8 sequences), a few long sequences among many short ones.
TEST(PagedPrefillTest, RandomRaggedBatchesMatchReference) {
  std::mt19937 rng(11);
  double worst = 0;
  for (int i = 0; i < test::Scaled(24, 6); ++i)
    worst = std::max(worst, RunPrefillCase(RandomCase(rng, 60, 200), rng));
  for (int i = 0; i < test::Scaled(6, 2); ++i)
    worst = std::max(worst, RunPrefillCase(RandomCase(rng, 400, 500), rng));
  PagedCase long_case;  // q lengths up to 2,000 with chunked-prefill context
  long_case.num_heads = 4;
  long_case.num_kv_heads = 1;
  long_case.head_dim = 64;
  long_case.block_size = 16;
  long_case.q_lens = {2000, 3, 700};
  long_case.context_lens = {0, 1500, 333};
  worst = std::max(worst, RunPrefillCase(long_case, rng));
  long_case.head_dim = 128;
  long_case.num_heads = 8;
  long_case.num_kv_heads = 4;
  long_case.block_size = 32;
  long_case.q_lens = {1, 1500, 17};
  long_case.context_lens = {2000, 0, 1000};
  worst = std::max(worst, RunPrefillCase(long_case, rng));
  std::printf("random batches: worst max rel err %.3g (bound %.0e)\n", worst, kMaxRelError);
}

// The fp32 naive kernel (cpu::AttentionPlain, full-row softmax over a contiguous copy of the
// cache) against the same float64 reference: the error scale of fp32 attention itself.
// The tiled kernel must stay within a small multiple of it, and kMaxRelError above both.
TEST(PagedPrefillTest, ErrorIsCloseToNaiveFp32Error) {
  std::mt19937 rng(21);
  PagedCase c;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.block_size = 16;
  c.q_lens = {700};
  c.context_lens = {333};
  const PagedData d = MakePagedData(c, rng);
  const int64_t num_keys = 1033, kv_dim = c.num_kv_heads * c.head_dim;
  std::vector<float> k(num_keys * kv_dim), v(num_keys * kv_dim);
  for (int64_t j = 0; j < num_keys; ++j) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int64_t at = d.layout.Offset(d.block_tables[j / 16], h, j % 16);
      std::copy_n(d.k.data() + at, c.head_dim, k.data() + (j * c.num_kv_heads + h) * c.head_dim);
      std::copy_n(d.v.data() + at, c.head_dim, v.data() + (j * c.num_kv_heads + h) * c.head_dim);
    }
  }
  std::vector<float> naive = Poisoned(d.q.size()), flash = Poisoned(d.q.size());
  AttentionPlain(d.q.data(), k.data(), v.data(), naive.data(), 700, 333, c.num_heads,
                 c.num_kv_heads, c.head_dim);
  PagedPrefillAttention(d.q.data(), d.View(), d.batch, c.num_heads,
                        1.f / std::sqrt(float(c.head_dim)), flash.data());
  const auto rows = AllRows(d.num_tokens, c.num_heads);
  const double naive_err = RelError(d, c.num_heads, naive, rows);
  const double flash_err = RelError(d, c.num_heads, flash, rows);
  std::printf("max rel err vs float64: naive fp32 %.3g, tiled paged %.3g\n", naive_err, flash_err);
  EXPECT_LE(flash_err, 4 * naive_err);
  EXPECT_LE(naive_err, kMaxRelError);
}

// Runs decode with `splits` into a poisoned output and checks it against the reference.
std::vector<float> RunDecode(const PagedData& d, const PagedCase& c, int64_t splits,
                             AttentionStats* stats) {
  std::vector<float> out = Poisoned(d.q.size());
  PagedDecodeAttention(d.q.data(), d.View(), d.batch, c.num_heads,
                       1.f / std::sqrt(float(c.head_dim)), out.data(), splits, stats);
  const double err = RelError(d, c.num_heads, out, AllRows(d.num_tokens, c.num_heads));
  std::printf("decode splits=%lld (used %lld) %-50s max rel err %.3g\n", (long long)splits,
              (long long)stats->num_splits, Describe(c).c_str(), err);
  EXPECT_LE(err, kMaxRelError) << Describe(c) << " splits " << splits;
  return out;
}

TEST(PagedDecodeTest, SplitsMatchReferenceAndEachOther) {
  std::mt19937 rng(5);
  for (int i = 0; i < 24; ++i) {
    PagedCase c = RandomCase(rng, 1, i < 6 ? 4000 : 600);
    std::fill(c.q_lens.begin(), c.q_lens.end(), 1);  // decode: one query per sequence
    const PagedData d = MakePagedData(c, rng);
    AttentionStats s1, s_auto, s7;
    const std::vector<float> one = RunDecode(d, c, 1, &s1);
    const std::vector<float> autos = RunDecode(d, c, 0, &s_auto);
    const std::vector<float> seven = RunDecode(d, c, 7, &s7);
    EXPECT_EQ(s1.num_splits, 1);
    EXPECT_GE(s_auto.num_splits, 1);
    const int32_t max_keys = *std::max_element(c.context_lens.begin(), c.context_lens.end()) + 1;
    EXPECT_EQ(s7.num_splits, std::min(7, max_keys));
    double max_abs = 0, max_diff = 0;
    for (size_t j = 0; j < one.size(); ++j) {
      max_abs = std::max<double>(max_abs, std::abs(one[j]));
      max_diff = std::max<double>(max_diff, std::abs(one[j] - seven[j]));
      max_diff = std::max<double>(max_diff, std::abs(one[j] - autos[j]));
    }
    EXPECT_LE(max_diff, kMaxRelError * max_abs);  // split == non-split within fp32 tolerance
  }
}

// Sliding windows (Mistral, Gemma 3): windows of one key, smaller than, equal to and larger
// than a 64-key tile and than the sequences, over ragged, chunked (context offsets), GQA
// batches of every block size: prefill and decode (split and not) against the reference.
TEST(SlidingWindowTest, PrefillAndDecodeMatchReference) {
  std::mt19937 rng(27);
  double worst = 0;
  for (int64_t window : {1, 5, 16, 63, 64, 65, 100, 1000, 5000}) {
    for (int i = 0; i < test::Scaled(6, 2); ++i) {
      PagedCase c = RandomCase(rng, i % 2 ? 200 : 30, 900);
      c.sliding_window = window;
      worst = std::max(worst, RunPrefillCase(c, rng));
      std::fill(c.q_lens.begin(), c.q_lens.end(), 1);
      const PagedData d = MakePagedData(c, rng);
      AttentionStats stats;
      for (int64_t splits : {0, 1, 3}) RunDecode(d, c, splits, &stats);
    }
  }
  std::printf("sliding windows: worst prefill max rel err %.3g\n", worst);
}

// The reference's window is the definition: W = 1 returns each query's own value row; a
// window at least as long as the sequence is full causal attention, bit for bit.
TEST(SlidingWindowTest, ReferenceDefinition) {
  std::mt19937 rng(28);
  PagedCase c;
  c.q_lens = {30, 7};
  c.context_lens = {0, 41};
  PagedData d = MakePagedData(c, rng);
  const float scale = 1.f / std::sqrt(float(c.head_dim));
  const size_t n = d.q.size();
  std::vector<float> full(n), wide(n), one(n);
  cpu::PagedAttentionReference(d.q.data(), d.View(), d.batch, c.num_heads, scale, full.data());
  d.batch.sliding_window = 48;  // = the longest sequence
  cpu::PagedAttentionReference(d.q.data(), d.View(), d.batch, c.num_heads, scale, wide.data());
  EXPECT_EQ(full, wide);
  d.batch.sliding_window = 1;
  cpu::PagedAttentionReference(d.q.data(), d.View(), d.batch, c.num_heads, scale, one.data());
  const int64_t hd = c.head_dim, group = c.num_heads / c.num_kv_heads;
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t t = d.cu_seqlens_q[s]; t < d.cu_seqlens_q[s + 1]; ++t) {
      const int64_t pos = c.context_lens[s] + t - d.cu_seqlens_q[s];
      for (int64_t h = 0; h < c.num_heads; ++h) {
        const float* v =
            d.v.data() +
            d.layout.Offset(d.block_tables[s * d.batch.max_blocks_per_seq + pos / c.block_size],
                            h / group, pos % c.block_size);
        for (int64_t i = 0; i < hd; ++i) {
          ASSERT_NEAR(one[(t * c.num_heads + h) * hd + i], v[i], 1e-6);
        }
      }
    }
  }
}

// Tiles left of the window are not visited: decode at 4,000 keys with W = 100 walks at most
// the window plus a tile per KV head, and prefill a small multiple of the window per tile.
TEST(SlidingWindowTest, KeysLeftOfTheWindowAreSkipped) {
  std::mt19937 rng(29);
  PagedCase c;
  c.q_lens = {1, 1};
  c.context_lens = {3999, 2500};
  c.sliding_window = 100;
  const PagedData d = MakePagedData(c, rng);
  AttentionStats stats;
  RunDecode(d, c, 0, &stats);
  EXPECT_EQ(stats.keys_visited, 2 * c.num_kv_heads * 100);
  c.q_lens = {640};
  c.context_lens = {3000};
  const PagedData p = MakePagedData(c, rng);
  std::vector<float> out(p.q.size());
  PagedPrefillAttention(p.q.data(), p.View(), p.batch, c.num_heads,
                        1.f / std::sqrt(float(c.head_dim)), out.data(), &stats);
  const int64_t tiles = 640 / (64 / (c.num_heads / c.num_kv_heads)) * c.num_kv_heads;
  EXPECT_GT(stats.keys_visited, 0);
  EXPECT_LE(stats.keys_visited, tiles * (100 + 32 + 64));  // window + tile rows + alignment
  c.sliding_window = 0;
  const PagedData f = MakePagedData(c, rng);
  PagedPrefillAttention(f.q.data(), f.View(), f.batch, c.num_heads,
                        1.f / std::sqrt(float(c.head_dim)), out.data(), &stats);
  EXPECT_GT(stats.keys_visited, tiles * 3000);
}

// Blocks wholly left of FirstKeyRead (kernels/paged_kv.h) of a sequence's first query are never
// read, by prefill (any chunk) or decode, so the KV cache may give them back (BlockManager's
// sliding-window mode): filled with NaN, they change nothing.
TEST(SlidingWindowTest, BlocksLeftOfTheFirstKeyReadAreNeverRead) {
  std::mt19937 rng(30);
  int64_t num_poisoned = 0;
  for (int64_t window : {1, 37, 100, 300}) {
    for (int i = 0; i < test::Scaled(6, 2); ++i) {
      PagedCase c = RandomCase(rng, i % 2 ? 200 : 30, 900);
      c.sliding_window = window;
      for (bool decode : {false, true}) {
        if (decode) std::fill(c.q_lens.begin(), c.q_lens.end(), 1);
        PagedData d = MakePagedData(c, rng);
        const int64_t bs = c.block_size, width = d.batch.max_blocks_per_seq;
        for (size_t s = 0; s < c.q_lens.size(); ++s) {
          const int64_t given_back = FirstKeyRead(c.context_lens[s], window) / bs;
          for (int64_t b = 0; b < given_back; ++b) {
            const int32_t block = d.block_tables[s * width + b];
            for (int64_t h = 0; h < c.num_kv_heads; ++h) {
              const int64_t at = d.layout.Offset(block, h, 0);
              std::fill_n(d.k.begin() + at, bs * c.head_dim, std::nanf(""));
              std::fill_n(d.v.begin() + at, bs * c.head_dim, std::nanf(""));
            }
            ++num_poisoned;
          }
        }
        if (decode) {
          AttentionStats stats;
          for (int64_t splits : {0, 1, 3}) RunDecode(d, c, splits, &stats);
          continue;
        }
        std::vector<float> out = Poisoned(d.q.size());
        PagedPrefillAttention(d.q.data(), d.View(), d.batch, c.num_heads,
                              1.f / std::sqrt(float(c.head_dim)), out.data());
        EXPECT_LE(RelError(d, c.num_heads, out, AllRows(d.num_tokens, c.num_heads)), kMaxRelError)
            << Describe(c);
      }
    }
  }
  EXPECT_GT(num_poisoned, 0);
}

// One token per sequence appended through slot_mapping lands where the layout says, and
// negative slots leave the cache untouched.
TEST(AppendKvTest, RoundTripThroughSlots) {
  std::mt19937 rng(3);
  PagedKvLayout layout{13, 8, 3, 80};
  std::vector<float> k_pool(layout.pool_elements(), 0.f), v_pool(layout.pool_elements(), 0.f);
  const int64_t num_tokens = 40;
  std::vector<int64_t> slots(layout.num_blocks * layout.block_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(num_tokens);
  for (int64_t t = 0; t < num_tokens; t += 9) slots[t] = -1;
  const std::vector<float> k = RandomVector(num_tokens * 3 * 80, 1.f, rng);
  const std::vector<float> v = RandomVector(num_tokens * 3 * 80, 1.f, rng);
  AppendKv(k.data(), v.data(), slots.data(), num_tokens, {k_pool.data(), v_pool.data(), layout});
  size_t num_written = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t i = 0; i < 80; ++i) {
        const int64_t at = layout.Offset(slots[t] / 8, h, slots[t] % 8) + i;
        ASSERT_EQ(k_pool[at], k[(t * 3 + h) * 80 + i]);
        ASSERT_EQ(v_pool[at], v[(t * 3 + h) * 80 + i]);
        num_written += 2;
      }
    }
  }
  // Nothing else was written: count the nonzeros in the pools.
  const auto nonzero = [](const std::vector<float>& x) {
    return static_cast<size_t>(std::count_if(x.begin(), x.end(), [](float f) { return f != 0.f; }));
  };
  EXPECT_EQ(nonzero(k_pool) + nonzero(v_pool), num_written);
}

// A 16k-token prefill: scratch per thread is O(tile) (the same as for a 100-token prefill,
// under 1 MiB), and sampled query rows match the float64 reference.
TEST(PagedPrefillTest, LongSequenceScratchIsConstant) {
  std::mt19937 rng(99);
  PagedCase c;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.block_size = 16;
  c.q_lens = {100};
  c.context_lens = {0};
  AttentionStats short_stats, long_stats;
  {
    const PagedData d = MakePagedData(c, rng);
    std::vector<float> out(d.q.size());
    PagedPrefillAttention(d.q.data(), d.View(), d.batch, c.num_heads, 0.125f, out.data(),
                          &short_stats);
  }
  const int num_long = test::Scaled(16384, 4096);  // far beyond any tile either way
  c.q_lens = {num_long};
  const PagedData d = MakePagedData(c, rng);
  std::vector<float> out = Poisoned(d.q.size());
  PagedPrefillAttention(d.q.data(), d.View(), d.batch, c.num_heads, 0.125f, out.data(),
                        &long_stats);
  std::printf("scratch per thread: %zu bytes at 100 tokens, %zu bytes at %lld tokens\n",
              short_stats.scratch_bytes_per_thread, long_stats.scratch_bytes_per_thread,
              static_cast<long long>(num_long));
  EXPECT_EQ(long_stats.scratch_bytes_per_thread, short_stats.scratch_bytes_per_thread);
  EXPECT_LT(long_stats.scratch_bytes_per_thread, size_t{1} << 20);
  std::vector<std::pair<int64_t, int64_t>> rows = {
      {0, 0}, {num_long - 1, 3}, {num_long / 2 - 1, 1}};
  for (int i = 0; i < 61; ++i) rows.emplace_back(int64_t(rng() % uint64_t(num_long)), rng() % 4);
  const double err = RelError(d, c.num_heads, out, rows);
  std::printf("long prefill, %zu sampled rows: max rel err %.3g\n", rows.size(), err);
  EXPECT_LE(err, kMaxRelError);
  size_t num_nan = 0;
  for (float x : out) num_nan += std::isnan(x);
  EXPECT_EQ(num_nan, 0u);
}

// ---- FP8 (e4m3) KV cache ------------------------------------------------------------------

// Every code decodes to sign · (e == 0 ? m/8 · 2^-6 : (1 + m/8) · 2^(e-7)), S.1111.111 to NaN,
// and encoding a decoded value gives the code back.
TEST(Fp8Test, E4m3DecodesEveryCodeAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const float got = E4m3ToF32(uint8_t(c));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << c;
      EXPECT_TRUE(std::isnan(E4m3ToF32(F32ToE4m3(got))));
      continue;
    }
    const double mag =
        e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
    EXPECT_EQ(double(got), (c & 0x80) ? -mag : mag) << c;
    EXPECT_EQ(F32ToE4m3(got), uint8_t(c)) << c;
  }
  EXPECT_EQ(E4m3ToF32(0x7e), 448.f);
  EXPECT_EQ(E4m3ToF32(0x38), 1.f);
  EXPECT_EQ(E4m3ToF32(0x01), std::ldexp(1.f, -9));
}

// Encoding is the nearest code (ties to the even code), found here by search over all finite
// codes of the value's sign, for random values over the whole range, the exact midpoints
// between neighbouring codes, and saturation.
TEST(Fp8Test, E4m3EncodesToNearestEvenAndSaturates) {
  auto nearest = [](float x) {
    int best = -1;
    double best_err = 1e30;
    for (int c = 0; c < 128; ++c) {
      if (c == 0x7f) continue;
      const double err = std::abs(double(E4m3ToF32(uint8_t(c))) - std::abs(double(x)));
      if (err < best_err || (err == best_err && (c & 1) == 0)) {
        best = c;
        best_err = err;
      }
    }
    return uint8_t(best | (std::signbit(x) ? 0x80 : 0));
  };
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> exponent(-12.f, 9.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(exponent(rng)) * (rng() % 2 ? 1.f : -1.f);
    ASSERT_EQ(F32ToE4m3(x), nearest(x)) << x;
  }
  for (int c = 0; c < 0x7e; ++c) {  // midpoints: the even neighbour wins
    const float mid = (E4m3ToF32(uint8_t(c)) + E4m3ToF32(uint8_t(c + 1))) / 2;
    ASSERT_EQ(F32ToE4m3(mid), uint8_t((c & 1) ? c + 1 : c)) << mid;
    ASSERT_EQ(F32ToE4m3(-mid), uint8_t(0x80 | ((c & 1) ? c + 1 : c))) << -mid;
  }
  EXPECT_EQ(F32ToE4m3(448.f), 0x7e);
  EXPECT_EQ(F32ToE4m3(470.f), 0x7e);
  EXPECT_EQ(F32ToE4m3(1e9f), 0x7e);
  EXPECT_EQ(F32ToE4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(F32ToE4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_TRUE(std::isnan(E4m3ToF32(F32ToE4m3(std::nanf("")))));
  EXPECT_EQ(F32ToE4m3(std::ldexp(1.f, -11)), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(F32ToE4m3(-0.f), 0x80);
}

// The kernels' dequantization (vectorized where the CPU allows) equals E4m3ToF32 · scale bit
// for bit, for every code (NaN included), at every offset of the vector loop and its tail.
TEST(Fp8Test, DequantizationEqualsTheScalarDecodeForEveryCode) {
  std::vector<uint8_t> codes(256 * 3 + 5);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i * 7 + i / 256);
  for (const float scale : {1.f, 0.37f, 3.1f}) {
    for (size_t offset = 0; offset < 9; ++offset) {
      const int64_t n = int64_t(codes.size() - offset);
      std::vector<float> got(static_cast<size_t>(n));
      DequantizeE4m3(codes.data() + offset, n, scale, got.data());
      for (int64_t i = 0; i < n; ++i) {
        const float want = E4m3ToF32(codes[offset + size_t(i)]) * scale;
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[size_t(i)])) << int(codes[offset + size_t(i)]);
        } else {
          ASSERT_EQ(std::memcmp(&got[size_t(i)], &want, 4), 0)
              << "code " << int(codes[offset + size_t(i)]) << " scale " << scale;
        }
      }
    }
  }
}

// The data's pools quantized with `scales`: the e4m3 codes, and the fp32 pools holding the
// values those codes stand for.
struct QuantizedPools {
  std::vector<uint8_t> k8, v8;
  PagedData dequantized;
};

QuantizedPools Quantize(const PagedData& d, Fp8KvScales scales) {
  QuantizedPools q{{}, {}, d};
  for (size_t i = 0; i < d.k.size(); ++i) {
    q.k8.push_back(F32ToE4m3(d.k[i] / scales.k));
    q.v8.push_back(F32ToE4m3(d.v[i] / scales.v));
    q.dequantized.k[i] = E4m3ToF32(q.k8.back()) * scales.k;
    q.dequantized.v[i] = E4m3ToF32(q.v8.back()) * scales.v;
  }
  return q;
}

// Attention over fp8 pools is the fp32 kernel over the dequantized values, bit for bit
// (prefill with cached context, and decode with and without splits); against the unquantized
// pools it differs by e4m3's rounding only (3 mantissa bits: at most 6.25% per element).
TEST(Fp8KvAttentionTest, EqualsFp32OverTheDequantizedPools) {
  std::mt19937 rng(23);
  const Fp8KvScales scales{0.05f, 0.03f};  // values of stddev 1: codes up to ~±100 / ±150
  double worst_vs_unquantized = 0;
  for (int i = 0; i < 12; ++i) {
    PagedCase c = RandomCase(rng, 1 + i % 5, 700);
    const bool decode = i % 2 == 1;
    if (decode) std::fill(c.q_lens.begin(), c.q_lens.end(), 1);
    const PagedData d = MakePagedData(c, rng);
    const QuantizedPools q = Quantize(d, scales);
    const PagedKvView<const uint8_t> fp8{q.k8.data(), q.v8.data(), d.layout};
    const float scale = 1.f / std::sqrt(float(c.head_dim));
    std::vector<float> got(d.q.size()), want(d.q.size()), exact(d.q.size());
    for (int64_t splits : decode ? std::vector<int64_t>{0, 1, 5} : std::vector<int64_t>{-1}) {
      if (decode) {
        PagedDecodeAttention(d.q.data(), fp8, scales, d.batch, c.num_heads, scale, got.data(),
                             splits);
        PagedDecodeAttention(d.q.data(), q.dequantized.View(), d.batch, c.num_heads, scale,
                             want.data(), splits);
        PagedDecodeAttention(d.q.data(), d.View(), d.batch, c.num_heads, scale, exact.data(),
                             splits);
      } else {
        PagedPrefillAttention(d.q.data(), fp8, scales, d.batch, c.num_heads, scale, got.data());
        PagedPrefillAttention(d.q.data(), q.dequantized.View(), d.batch, c.num_heads, scale,
                              want.data());
        PagedPrefillAttention(d.q.data(), d.View(), d.batch, c.num_heads, scale, exact.data());
      }
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << Describe(c) << " splits " << splits;
      double diff = 0, mag = 0;
      for (size_t j = 0; j < got.size(); ++j) {
        diff = std::max(diff, double(std::abs(got[j] - exact[j])));
        mag = std::max(mag, double(std::abs(exact[j])));
      }
      worst_vs_unquantized = std::max(worst_vs_unquantized, diff / mag);
    }
  }
  std::printf("fp8 KV vs fp32 KV attention: worst max|diff|/max|out| %.3g\n", worst_vs_unquantized);
  // Measured 0.12 (q of stddev 2 over up to 256 dims: e4m3's ~3.6% rms error in K moves the
  // scores by ~0.07 before the softmax). A wrong scale or code is an error of order 1.
  EXPECT_LT(worst_vs_unquantized, 0.25);
}

// The fp8 append writes F32ToE4m3(x / scale) where the layout says, and skips negative slots.
TEST(Fp8KvAttentionTest, AppendQuantizesIntoItsSlots) {
  std::mt19937 rng(31);
  PagedKvLayout layout{9, 8, 2, 64};
  std::vector<uint8_t> k_pool(layout.pool_elements(), 0), v_pool(layout.pool_elements(), 0);
  const int64_t num_tokens = 30;
  std::vector<int64_t> slots(layout.num_blocks * layout.block_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(num_tokens);
  for (int64_t t = 0; t < num_tokens; t += 7) slots[t] = -1;
  const std::vector<float> k = RandomVector(num_tokens * 2 * 64, 3.f, rng);
  const std::vector<float> v = RandomVector(num_tokens * 2 * 64, 3.f, rng);
  const Fp8KvScales scales{0.5f, 0.25f};
  AppendKv(k.data(), v.data(), slots.data(), num_tokens, {k_pool.data(), v_pool.data(), layout},
           scales);
  size_t num_written = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 64; ++i) {
        const int64_t at = layout.SlotOffset(slots[t], h) + i;
        ASSERT_EQ(k_pool[at], F32ToE4m3(k[(t * 2 + h) * 64 + i] / scales.k));
        ASSERT_EQ(v_pool[at], F32ToE4m3(v[(t * 2 + h) * 64 + i] / scales.v));
        num_written += (k_pool[at] != 0) + (v_pool[at] != 0);
      }
    }
  }
  const auto nonzero = [](const std::vector<uint8_t>& x) {
    return static_cast<size_t>(std::count_if(x.begin(), x.end(), [](uint8_t b) { return b != 0; }));
  };
  EXPECT_EQ(nonzero(k_pool) + nonzero(v_pool), num_written);  // nothing else was written
}

}  // namespace
}  // namespace llm::cpu
