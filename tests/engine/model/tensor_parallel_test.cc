// engine/tensor_parallel: the split's validation, that the ranks' slices partition every split
// weight (keeping each query head's KV head local), CopySlice, and that the ranks' partial MLP /
// attention outputs sum to the unsplit layer's (what the all-reduce after each relies on).
#include "engine/model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "kernels/cpu/matmul.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using test::ExpectError;

// The split weights of one layer, indexing the test's matrices; their splits and shapes come
// from the architecture registry (the Llama spec), as the CUDA loader takes them.
enum class TpWeight { kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj };
constexpr TpWeight kSplitWeights[] = {TpWeight::kQProj,   TpWeight::kKProj,    TpWeight::kVProj,
                                      TpWeight::kOProj,   TpWeight::kGateProj, TpWeight::kUpProj,
                                      TpWeight::kDownProj};
constexpr WeightRole kRoles[] = {WeightRole::kQProj,   WeightRole::kKProj,    WeightRole::kVProj,
                                 WeightRole::kOProj,   WeightRole::kGateProj, WeightRole::kUpProj,
                                 WeightRole::kDownProj};
const WeightSpec& Spec(TpWeight w) {
  return WeightOf(*FindArchitecture("LlamaForCausalLM"), kRoles[int(w)]);
}
TpSlice SliceOf(const TensorParallelShard& s, TpWeight w) { return s.Slice(Spec(w).tp); }
constexpr int kSizes[] = {1, 2, 4, 8};
constexpr int64_t kNumTokens = 3;

ModelConfig Config(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                   int64_t intermediate) {
  ModelConfig c;
  std::tie(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size) =
      std::tuple(hidden, num_heads, num_kv_heads, head_dim, intermediate);
  return c;
}
ModelConfig Llama3_8B() { return Config(4096, 32, 8, 128, 14336); }
ModelConfig Tiny() { return Config(64, 8, 4, 8, 96); }

// Whether [a, a + na) and [b, b + nb) intersect.
bool Meet(int64_t a, int64_t na, int64_t b, int64_t nb) { return a < b + nb && b < a + na; }

// The full checkpoint tensor's Hugging Face [out, in] shape.
std::pair<int64_t, int64_t> FullShape(const ModelConfig& c, TpWeight w) {
  const std::vector<int64_t> shape = WeightShape(Spec(w), c);
  return {shape[0], shape[1]};
}

// A row-major fp32 matrix [rows, cols].
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<float> v = std::vector<float>(size_t(rows * cols));
  float& at(int64_t r, int64_t c) { return v[size_t(r * cols + c)]; }
  float at(int64_t r, int64_t c) const { return v[size_t(r * cols + c)]; }
  void operator+=(const Mat& o) {
    for (size_t i = 0; i < v.size(); ++i) v[i] += o.v[i];
  }
};

// One layer's split weights: whole, or a rank's slices of them.
struct Layer {
  std::vector<Mat> w;  // indexed by TpWeight
  const Mat& operator[](TpWeight t) const { return w[size_t(t)]; }
};

// Entries uniform in ±1/sqrt(cols), so that products stay of order 1.
Mat Random(int64_t rows, int64_t cols, std::mt19937& rng) {
  Mat m{rows, cols};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& e : m.v) e = dist(rng) / std::sqrt(float(cols));
  return m;
}

Mat Cut(const Mat& m, const TpSlice& s) {
  Mat out{s.num_rows, s.num_cols};
  CopySlice(m.v.data(), m.cols, s, sizeof(float), out.v.data());
  return out;
}

Layer RandomLayer(const ModelConfig& c, std::mt19937& rng) {
  Layer layer;
  for (TpWeight w : kSplitWeights) {
    const auto [rows, cols] = FullShape(c, w);
    layer.w.push_back(Random(rows, cols, rng));
  }
  return layer;
}

Layer Shard(const Layer& full, const TensorParallelShard& s) {
  Layer layer;
  for (TpWeight w : kSplitWeights) layer.w.push_back(Cut(full[w], SliceOf(s, w)));
  return layer;
}

// y = x · wᵀ: x [tokens, in], w [out, in] -> [tokens, out].
Mat Linear(const Mat& x, const Mat& w) {
  Mat y{x.rows, w.rows};
  cpu::Linear(x.v.data(), {DType::kF32, w.v.data(), w.rows, w.cols}, y.v.data(), x.rows);
  return y;
}

// down( silu(gate x) * up x )
Mat Mlp(const Mat& x, const Layer& l) {
  Mat h = Linear(x, l[TpWeight::kGateProj]);
  const Mat u = Linear(x, l[TpWeight::kUpProj]);
  for (size_t i = 0; i < h.v.size(); ++i) h.v[i] = h.v[i] / (1.0f + std::exp(-h.v[i])) * u.v[i];
  return Linear(h, l[TpWeight::kDownProj]);
}

// Causal GQA attention of x [tokens, hidden] over s's heads: the per-head outputs before o_proj
// [tokens, num_heads·head_dim]; query head h reads KV head h / (num_heads / num_kv_heads).
Mat Attention(const Mat& x, const Layer& l, const TensorParallelShard& s) {
  const Mat q = Linear(x, l[TpWeight::kQProj]), k = Linear(x, l[TpWeight::kKProj]),
            v = Linear(x, l[TpWeight::kVProj]);
  Mat out{x.rows, s.q_dim()};
  for (int64_t h = 0; h < s.num_heads; ++h) {
    const int64_t qo = h * s.head_dim, kvo = h / (s.num_heads / s.num_kv_heads) * s.head_dim;
    for (int64_t t = 0; t < x.rows; ++t) {
      std::vector<double> acc(size_t(s.head_dim));
      double sum = 0;  // the scores are of order 1: exp needs no max subtracted
      for (int64_t u = 0; u <= t; ++u) {
        double dot = 0;
        for (int64_t d = 0; d < s.head_dim; ++d) dot += double(q.at(t, qo + d)) * k.at(u, kvo + d);
        const double p = std::exp(dot / std::sqrt(double(s.head_dim)));
        sum += p;
        for (int64_t d = 0; d < s.head_dim; ++d) acc[size_t(d)] += p * v.at(u, kvo + d);
      }
      for (int64_t d = 0; d < s.head_dim; ++d) out.at(t, qo + d) = float(acc[size_t(d)] / sum);
    }
  }
  return out;
}

// max |got - want| <= 1e-5 · max |want|
void ExpectClose(const Mat& got, const Mat& want) {
  ASSERT_TRUE(got.rows == want.rows && got.cols == want.cols);
  double max_err = 0, max_abs = 0;
  for (size_t i = 0; i < want.v.size(); ++i) {
    max_err = std::max(max_err, double(std::abs(got.v[i] - want.v[i])));
    max_abs = std::max(max_abs, double(std::abs(want.v[i])));
  }
  EXPECT_LE(max_err, 1e-5 * max_abs) << "max |want| " << max_abs;
}

// Rejects what cannot be split, naming the number; splits Llama-3-8B into the right local counts.
TEST(TensorParallelTest, ValidatesAndCountsLocally) {
  const ModelConfig c = Llama3_8B();
  ExpectError([&] { MakeTensorParallelShard(c, 0, 3); }, {"3", "attention heads", "(32)"});
  ExpectError([&] { MakeTensorParallelShard(Config(768, 12, 3, 64, 3072), 0, 2); },
              {"2", "key-value heads", "(3)"});
  // 16 ranks over 8 KV heads: each rank holds one, each KV head on two ranks, and a rank's
  // two query heads are both in that KV head's group.
  for (int rank = 0; rank < 16; ++rank) {
    const TensorParallelShard s = MakeTensorParallelShard(c, rank, 16);
    EXPECT_EQ(std::tuple(s.num_heads, s.num_kv_heads, s.kv_head_begin), std::tuple(2, 1, rank / 2));
    const TpSlice k = SliceOf(s, TpWeight::kKProj);
    EXPECT_EQ(std::tuple(k.row_begin, k.num_rows), std::tuple(int64_t(rank / 2) * 128, 128));
    const int64_t first_q = SliceOf(s, TpWeight::kQProj).row_begin / 128;
    EXPECT_EQ(first_q / 4, rank / 2);
    EXPECT_EQ((first_q + 1) / 4, rank / 2);
  }
  ExpectError([&] { MakeTensorParallelShard(Config(4096, 32, 8, 128, 14340), 0, 8); },
              {"intermediate size", "(14340)"});
  ExpectError([&] { MakeTensorParallelShard(c, 4, 4); }, {"rank 4", "[0, 4)"});
  ExpectError([&] { MakeTensorParallelShard(c, -1, 2); }, {"rank -1", "[0, 2)"});
  ExpectError([&] { MakeTensorParallelShard(c, 0, 0); }, {"tensor-parallel-size", "at least 1"});
  for (int size : kSizes) {
    for (int rank = 0; rank < size; ++rank) {
      const TensorParallelShard s = MakeTensorParallelShard(c, rank, size);
      EXPECT_EQ(std::tuple(s.rank, s.size, s.num_heads, s.num_kv_heads, s.intermediate, s.head_dim,
                           s.hidden, s.q_dim(), s.kv_dim()),
                std::tuple(rank, size, 32 / size, 8 / size, 14336 / size, 128, 4096, 4096 / size,
                           1024 / size));
    }
  }
}

// For every split of both models: each split weight's slices lie inside the full tensor, are
// pairwise disjoint and their areas add up to it (an exact cover); K and V split alike; and
// local query head j's KV head under the local ratio, j / (local H / local KV), is its global
// KV head, global q head / (H / KV), less the rank's first KV head.
TEST(TensorParallelTest, SlicesPartitionWeightsAndKeepKvHeadsLocal) {
  for (const ModelConfig& c : {Llama3_8B(), Tiny()}) {
    for (int size : kSizes) {
      if (c.num_kv_heads % size != 0) continue;
      SCOPED_TRACE(testing::Message() << "hidden " << c.hidden_size << ", size " << size);
      for (TpWeight w : kSplitWeights) {
        const auto [rows, cols] = FullShape(c, w);
        std::vector<TpSlice> slices;
        int64_t area = 0;
        for (int rank = 0; rank < size; ++rank) {
          const TpSlice s = SliceOf(MakeTensorParallelShard(c, rank, size), w);
          EXPECT_TRUE(s.row_begin >= 0 && s.num_rows > 0 && s.row_begin + s.num_rows <= rows);
          EXPECT_TRUE(s.col_begin >= 0 && s.num_cols > 0 && s.col_begin + s.num_cols <= cols);
          for (const TpSlice& o : slices) {
            EXPECT_FALSE(Meet(s.row_begin, s.num_rows, o.row_begin, o.num_rows) &&
                         Meet(s.col_begin, s.num_cols, o.col_begin, o.num_cols))
                << "weight " << int(w) << ": rank " << rank << " overlaps another";
          }
          slices.push_back(s);
          area += s.num_rows * s.num_cols;
        }
        EXPECT_EQ(area, rows * cols) << "weight " << int(w);
      }
      for (int rank = 0; rank < size; ++rank) {
        const TensorParallelShard s = MakeTensorParallelShard(c, rank, size);
        const TpSlice k = SliceOf(s, TpWeight::kKProj), v = SliceOf(s, TpWeight::kVProj);
        EXPECT_TRUE(k.row_begin == v.row_begin && k.num_rows == v.num_rows);
        const int64_t first_q = SliceOf(s, TpWeight::kQProj).row_begin / c.head_dim;
        const int64_t first_kv = k.row_begin / c.head_dim;
        for (int64_t j = 0; j < s.num_heads; ++j) {
          EXPECT_EQ(j / (s.num_heads / s.num_kv_heads),
                    (first_q + j) / (c.num_heads / c.num_kv_heads) - first_kv)
              << "rank " << rank << " local head " << j;
        }
      }
    }
  }
}

// From an index-encoded [5, 7] matrix: element (r, c) holds r·7 + c.
template <typename T>
void ExpectCopySliceCopies(const TpSlice& s) {
  constexpr int64_t kCols = 7;
  std::vector<T> src(5 * kCols);
  for (size_t i = 0; i < src.size(); ++i) src[i] = T(i);
  std::vector<T> dst(size_t(s.num_rows * s.num_cols), T(-1));
  CopySlice(src.data(), kCols, s, sizeof(T), dst.data());
  for (int64_t r = 0; r < s.num_rows; ++r) {
    for (int64_t c = 0; c < s.num_cols; ++c) {
      EXPECT_EQ(dst[size_t(r * s.num_cols + c)], T((s.row_begin + r) * kCols + s.col_begin + c))
          << "element size " << sizeof(T) << " at " << r << "," << c;
    }
  }
}

TEST(TensorParallelTest, CopySliceCopiesTheBlock) {
  for (const TpSlice& s : {TpSlice{1, 3, 2, 4}, TpSlice{0, 5, 0, 7}, TpSlice{4, 1, 6, 1},
                           TpSlice{0, 5, 3, 2}, TpSlice{2, 2, 0, 7}}) {
    ExpectCopySliceCopies<uint16_t>(s);
    ExpectCopySliceCopies<uint32_t>(s);
  }
}

TEST(TensorParallelTest, MlpPartialsSumToFullOutput) {
  const ModelConfig c = Tiny();
  std::mt19937 rng(1);
  const Mat x = Random(kNumTokens, c.hidden_size, rng);
  const Layer layer = RandomLayer(c, rng);
  const Mat full = Mlp(x, layer);
  for (int size : {1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << "size " << size);
    Mat sum{full.rows, full.cols};
    for (int rank = 0; rank < size; ++rank) {
      sum += Mlp(x, Shard(layer, MakeTensorParallelShard(c, rank, size)));
    }
    ExpectClose(sum, full);
  }
}

// o(A) = Σ over ranks of (the rank's head columns of A) · (its o_proj columns)ᵀ, for a given A
// and, end to end, for A computed per rank by causal GQA attention from its q/k/v rows.
TEST(TensorParallelTest, AttentionPartialsSumToFullOutput) {
  const ModelConfig c = Tiny();
  std::mt19937 rng(2);
  const Mat x = Random(kNumTokens, c.hidden_size, rng);
  const Layer layer = RandomLayer(c, rng);
  const Mat a_given = Random(kNumTokens, c.num_heads * c.head_dim, rng);
  const Mat a_full = Attention(x, layer, MakeTensorParallelShard(c, 0, 1));
  const Mat o_given = Linear(a_given, layer[TpWeight::kOProj]);
  const Mat o_full = Linear(a_full, layer[TpWeight::kOProj]);
  for (int size : {1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << "size " << size);
    Mat sum_given{o_given.rows, o_given.cols}, sum_full{o_full.rows, o_full.cols};
    for (int rank = 0; rank < size; ++rank) {
      const TensorParallelShard s = MakeTensorParallelShard(c, rank, size);
      const Layer local = Shard(layer, s);
      const TpSlice q = SliceOf(s, TpWeight::kQProj);
      const TpSlice head_cols = {0, kNumTokens, q.row_begin, q.num_rows};  // of A [tokens, H·hd]
      const Mat a_rank = Attention(x, local, s);
      ExpectClose(a_rank, Cut(a_full, head_cols));
      sum_given += Linear(Cut(a_given, head_cols), local[TpWeight::kOProj]);
      sum_full += Linear(a_rank, local[TpWeight::kOProj]);
    }
    ExpectClose(sum_given, o_given);
    ExpectClose(sum_full, o_full);
  }
}

// Experts split by their own width (moe_intermediate_size, not intermediate_size): each
// expert's gate / up rows and down columns partition its tensors, and the ranks' partial expert
// MLPs sum to the whole expert's output (the router is replicated: every rank runs the same
// experts). A width the ranks do not divide is refused by name.
TEST(TensorParallelTest, ExpertsSplitByTheirOwnWidth) {
  ModelConfig c = Tiny();
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;  // Qwen3-MoE: not intermediate_size (96)
  const ArchitectureSpec& spec = *FindArchitecture("Qwen3MoeForCausalLM");
  const WeightSpec& gate = WeightOf(spec, WeightRole::kExpertGate);
  const WeightSpec& up = WeightOf(spec, WeightRole::kExpertUp);
  const WeightSpec& down = WeightOf(spec, WeightRole::kExpertDown);
  EXPECT_EQ(WeightShape(gate, c), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(WeightShape(down, c), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(WeightOf(spec, WeightRole::kRouter).tp, TpSplit::kReplicated);
  std::mt19937 rng(3);
  const Mat x = Random(kNumTokens, c.hidden_size, rng);
  Layer expert;  // indexed by TpWeight: only gate, up and down are set
  expert.w.resize(std::size(kSplitWeights));
  expert.w[size_t(TpWeight::kGateProj)] = Random(32, 64, rng);
  expert.w[size_t(TpWeight::kUpProj)] = Random(32, 64, rng);
  expert.w[size_t(TpWeight::kDownProj)] = Random(64, 32, rng);
  const Mat full = Mlp(x, expert);
  for (int size : {1, 2, 4, 8}) {
    SCOPED_TRACE(testing::Message() << "size " << size);
    Mat sum{full.rows, full.cols};
    for (int rank = 0; rank < size; ++rank) {
      const TensorParallelShard s = MakeTensorParallelShard(c, rank, size);
      EXPECT_EQ(s.moe_intermediate, 32 / size);
      EXPECT_EQ(s.intermediate, 96 / size);
      const TpSlice g = s.Slice(gate, c), u = s.Slice(up, c), d = s.Slice(down, c);
      EXPECT_EQ(std::tuple(g.row_begin, g.num_rows, g.col_begin, g.num_cols),
                std::tuple(int64_t(rank) * 32 / size, int64_t(32 / size), int64_t(0), int64_t(64)));
      EXPECT_EQ(std::tuple(u.row_begin, u.num_rows), std::tuple(g.row_begin, g.num_rows));
      EXPECT_EQ(std::tuple(d.row_begin, d.num_rows, d.col_begin, d.num_cols),
                std::tuple(int64_t(0), int64_t(64), g.row_begin, g.num_rows));
      Layer local;
      local.w.resize(std::size(kSplitWeights));
      local.w[size_t(TpWeight::kGateProj)] = Cut(expert[TpWeight::kGateProj], g);
      local.w[size_t(TpWeight::kUpProj)] = Cut(expert[TpWeight::kUpProj], u);
      local.w[size_t(TpWeight::kDownProj)] = Cut(expert[TpWeight::kDownProj], d);
      sum += Mlp(x, local);
    }
    ExpectClose(sum, full);
  }
  c.moe_intermediate_size = 36;
  ExpectError([&] { MakeTensorParallelShard(c, 0, 8); }, {"experts' intermediate size", "(36)"});
  EXPECT_EQ(MakeTensorParallelShard(c, 1, 2).moe_intermediate, 18);
  c.num_experts = 0;  // a dense model: no expert width to split
  EXPECT_EQ(MakeTensorParallelShard(c, 0, 8).moe_intermediate, 0);
}

}  // namespace
}  // namespace llm
