// FlashAttention on the CPU over the paged KV cache (fp32): ragged prefill with cached
// context (chunked prefill), split-KV decode (flash-decoding) and KV append. These are the
// references the CUDA kernels are tested against, and the CPU model's attention.
//
// Algorithm (FlashAttention-2 in the log2 domain, kernels/online_softmax.h): a work item is
// one query tile — up to kTileRows rows = tokens × the query heads of ONE KV group, so each
// K/V tile is read once per group — against a range of keys. Q is copied once, pre-scaled by
// scale·log2(e). For each key tile of kTileKeys keys (gathered through the block table with
// PagedKvLayout, crossing block boundaries freely):
//     S = Q·Kᵀ (log2 domain),  masked to -inf right of the causal diagonal (only the
//     diagonal tiles need it; tiles wholly right of the last query row are never visited),
//     per row: alpha = online-softmax update of S into P, acc = alpha·acc + P·V.
// Prefill finalizes acc / l per row. Decode splits each sequence's keys into chunks
// processed in parallel, each leaving a partial (m, l, acc), merged with OnlineSoftmax::Merge.
// Work items (sequence, kv head, query tile or split) form a flat list run by OpenMP with a
// dynamic schedule; per-thread scratch is a fixed O(tile) set of buffers.
//
// Test and benchmark:
//   ninja -C build flash_attention_test bench_attention_cpu &&
//   (cd build && ctest -R flash_attention --output-on-failure) && ./build/bench_attention_cpu
#include "kernels/cpu/flash_attention.h"

#include <omp.h>
#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/fp8.h"
#include "kernels/online_softmax.h"

namespace llm::cpu {
namespace {

// Compile-time tile choices.
struct TileTraits {
  static constexpr int64_t kTileRows = 64;    // query rows (tokens × group heads) per tile
  static constexpr int64_t kTileKeys = 64;    // keys per tile (4 blocks of 16)
  static constexpr int64_t kSplitKeys = 512;  // decode: automatic split size (keys)
  static constexpr int64_t kMaxSplits = 64;   // decode: most automatic splits
};
static_assert(TileTraits::kTileKeys % 8 == 0, "score rows are whole vectors of 8 keys");
static_assert(TileTraits::kTileRows % 4 == 0, "full tiles are whole 4-row P·V blocks");

constexpr int64_t kRows = TileTraits::kTileRows;
constexpr int64_t kKeys = TileTraits::kTileKeys;

// What every work item of one call shares.
struct Problem {
  const float* q = nullptr;     // [num_tokens, num_heads, head_dim]
  PagedKvView<const float> kv;  // fp32 pools (null with fp8 pools; the layout always)
  // FP8 pools: e4m3 codes, dequantized key tile by key tile through these tables (the code's
  // value times the layer's scale), so the arithmetic after the gather is the fp32 path's.
  const uint8_t* k8 = nullptr;
  const uint8_t* v8 = nullptr;
  float k_lut[256] = {}, v_lut[256] = {};
  float k_scale = 1.f, v_scale = 1.f;
  const AttentionBatch* batch = nullptr;
  int64_t num_heads = 0;
  int64_t group = 0;  // query heads per KV head
  int64_t head_dim = 0;
  float qk_scale = 0;  // scale · log2(e)
  bool is_decode = false;
};

// A query tile of one sequence and KV head against keys [key_begin, key_end).
struct TileWork {
  int64_t seq = 0;
  int64_t kv_head = 0;
  int64_t token_begin = 0;  // first query token (row of q)
  int64_t num_tokens = 0;
  int64_t pos_begin = 0;  // absolute position of the first query token
  int64_t key_begin = 0;
  int64_t key_end = 0;
};

// Per-thread buffers, sized by head_dim and the KV group only (never by sequence length):
// rows = max(kTileRows, group), since one tile holds at least one token's whole group.
struct Scratch {
  Scratch(int64_t head_dim, int64_t group, bool fp8 = false)
      : rows(std::max(kRows, group)),
        q(rows * head_dim),
        acc(rows * head_dim),
        kt(head_dim * kKeys),
        s(rows * kKeys),
        state(rows),
        k_tile(fp8 ? kKeys * head_dim : 0),
        v_tile(fp8 ? kKeys * head_dim : 0) {}
  size_t Bytes() const {
    return (q.size() + acc.size() + kt.size() + s.size() + k_tile.size() + v_tile.size()) *
               sizeof(float) +
           state.size() * sizeof(OnlineSoftmax) + sizeof(k_rows) + sizeof(v_rows);
  }
  int64_t rows;
  std::vector<float> q;               // [rows, head_dim]  pre-scaled queries
  std::vector<float> acc;             // [rows, head_dim]  unnormalised output
  std::vector<float> kt;              // [head_dim, kKeys] the key tile transposed
  std::vector<float> s;               // [rows, kKeys]     scores, then probabilities
  std::vector<OnlineSoftmax> state;   // [rows]
  std::vector<float> k_tile, v_tile;  // fp8 pools: [kKeys, head_dim] the dequantized tile
  const float* k_rows[kKeys];         // the key tile's rows in the paged pool (or k_tile)
  const float* v_rows[kKeys];
};

int64_t RowsOf(const Problem& p, const TileWork& w) { return w.num_tokens * p.group; }

// Copies the tile's queries (row r = token r / group, head kv_head·group + r % group),
// scaled into the log2 domain, and resets acc and the softmax states.
void LoadQueries(const Problem& p, const TileWork& w, Scratch& sc) {
  const int64_t hd = p.head_dim;
  for (int64_t r = 0; r < RowsOf(p, w); ++r) {
    const int64_t token = w.token_begin + r / p.group;
    const int64_t head = w.kv_head * p.group + r % p.group;
    const float* __restrict src = p.q + (token * p.num_heads + head) * hd;
    float* __restrict dst = sc.q.data() + r * hd;
    for (int64_t d = 0; d < hd; ++d) dst[d] = src[d] * p.qk_scale;
    std::fill_n(sc.acc.data() + r * hd, hd, 0.f);
    sc.state[r] = OnlineSoftmax{};
  }
}

// Calls fn(j, offset) with the pool offset of key key0 + j of the work item's sequence and
// KV head, j = 0 .. n - 1, walking the block table: one division per call, not per key.
template <typename Fn>
void ForEachKey(const Problem& p, const TileWork& w, int64_t key0, int64_t n, Fn&& fn) {
  const PagedKvLayout& layout = p.kv.layout;
  const int32_t* table = p.batch->block_tables + w.seq * p.batch->max_blocks_per_seq;
  int64_t block = key0 / layout.block_size;
  int64_t slot = key0 % layout.block_size;
  int64_t base = layout.Offset(table[block], w.kv_head, 0);
  for (int64_t j = 0; j < n; ++j) {
    fn(j, base + slot * layout.head_dim);
    if (++slot == layout.block_size && j + 1 < n) {
      slot = 0;
      base = layout.Offset(table[++block], w.kv_head, 0);
    }
  }
}

// dst[0, n) = E4m3ToF32(src[i]) · scale, exactly (the table holds E4m3ToF32(c) · scale).
// With AVX2 + F16C, 8 codes at a time: an e4m3 code's bits, moved into an f16's
// (sign << 8 | (code & 0x7f) << 7), are the same value times 2^-8 (f16's exponent bias is 8
// more, its subnormals cover e4m3's), so f16 -> f32 and a multiplication by 2^8 are exact;
// S.1111.111 is patched to NaN; then the scale, as the table does it.
void DequantizeRow(const uint8_t* __restrict src, int64_t n, const float* __restrict table,
                   float scale, float* __restrict dst) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  const __m256 two8 = _mm256_set1_ps(256.f), vscale = _mm256_set1_ps(scale);
  const __m256 nan = _mm256_set1_ps(NAN);
  const __m128i low7 = _mm_set1_epi16(0x7f), sign = _mm_set1_epi16(0x80);
  for (; i + 8 <= n; i += 8) {
    const __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    const __m128i em = _mm_and_si128(c, low7);
    const __m128i h =
        _mm_or_si128(_mm_slli_epi16(em, 7), _mm_slli_epi16(_mm_and_si128(c, sign), 8));
    __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), two8);
    const __m256 is_nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(em, low7)));
    f = _mm256_blendv_ps(f, nan, is_nan);
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(f, vscale));
  }
#endif
  (void)scale;
  for (; i < n; ++i) dst[i] = table[src[i]];
}

// Points k_rows / v_rows at keys key0 .. key0 + n - 1 (fp8: at their rows dequantized into
// the scratch tile).
void GatherKeyRows(const Problem& p, const TileWork& w, int64_t key0, int64_t n, Scratch& sc) {
  if (p.k8 == nullptr) {
    ForEachKey(p, w, key0, n, [&](int64_t j, int64_t offset) {
      sc.k_rows[j] = p.kv.k + offset;
      sc.v_rows[j] = p.kv.v + offset;
    });
    return;
  }
  const int64_t hd = p.head_dim;
  ForEachKey(p, w, key0, n, [&](int64_t j, int64_t offset) {
    float* __restrict k = sc.k_tile.data() + j * hd;
    float* __restrict v = sc.v_tile.data() + j * hd;
    const uint8_t* __restrict k8 = p.k8 + offset;
    const uint8_t* __restrict v8 = p.v8 + offset;
    DequantizeRow(k8, hd, p.k_lut, p.k_scale, k);
    DequantizeRow(v8, hd, p.v_lut, p.v_scale, v);
    sc.k_rows[j] = k;
    sc.v_rows[j] = v;
  });
}

// Asks for the K and V rows of keys key0 .. key0 + n - 1 ahead of use: a key tile spans
// several blocks scattered over the pool, which the hardware prefetcher cannot follow.
void PrefetchKeys(const Problem& p, const TileWork& w, int64_t key0, int64_t n) {
  const bool fp8 = p.k8 != nullptr;
  const int64_t row_bytes = p.head_dim * static_cast<int64_t>(fp8 ? 1 : sizeof(float));
  ForEachKey(p, w, key0, n, [&](int64_t, int64_t offset) {
    const char* k = fp8 ? reinterpret_cast<const char*>(p.k8 + offset)
                        : reinterpret_cast<const char*>(p.kv.k + offset);
    const char* v = fp8 ? reinterpret_cast<const char*>(p.v8 + offset)
                        : reinterpret_cast<const char*>(p.kv.v + offset);
    for (int64_t b = 0; b < row_bytes; b += 64) {
      __builtin_prefetch(k + b);
      __builtin_prefetch(v + b);
    }
  });
}

// S[r][0..kKeys) = q_r · Kᵀ through a transposed copy of the tile, so that the inner loop
// runs over kKeys contiguous keys (whole vectors); keys >= n are zero columns.
void ScoresTransposed(int64_t rows, int64_t n, int64_t hd, Scratch& sc) {
  float* __restrict kt = sc.kt.data();
  for (int64_t j = 0; j < kKeys; ++j) {
    if (j < n) {
      const float* __restrict k = sc.k_rows[j];
      for (int64_t d = 0; d < hd; ++d) kt[d * kKeys + j] = k[d];
    } else {
      for (int64_t d = 0; d < hd; ++d) kt[d * kKeys + j] = 0.f;
    }
  }
  tiles::ScoresFromTransposed<kKeys>(sc.q.data(), rows, hd, kt, sc.s.data());
}

// S[r][j] = q_r · k_j by dot products straight from the pool (few rows, e.g. decode: a
// transposed copy would cost more than the product).
void ScoresDot(int64_t rows, int64_t n, int64_t hd, Scratch& sc) {
  tiles::ScoresFromRows(sc.q.data(), rows, hd, sc.k_rows, n, sc.s.data(), kKeys);
}

// Sets S[r][j] = -inf where key key0 + j lies right of row r's causal limit, left of its
// sliding window (VisibleKeyBegin, kernels/paged_kv.h) or j >= n.
void MaskScores(const Problem& p, const TileWork& w, int64_t key0, int64_t n, Scratch& sc) {
  const int64_t window = p.batch->sliding_window;
  for (int64_t r = 0; r < RowsOf(p, w); ++r) {
    const int64_t pos = w.pos_begin + r / p.group;
    const int64_t num_visible = std::clamp<int64_t>(pos + 1 - key0, 0, n);
    const int64_t num_hidden =
        std::clamp<int64_t>(VisibleKeyBegin(pos, window) - key0, 0, num_visible);
    float* row = sc.s.data() + r * kKeys;
    std::fill(row, row + num_hidden, -INFINITY);
    std::fill(row + num_visible, row + kKeys, -INFINITY);
  }
}

// Per row: online-softmax update of the score row into P and acc *= alpha; then
// acc += P·V for all rows (masked keys have p = 0).
void SoftmaxTimesV(int64_t rows, int64_t n, int64_t hd, Scratch& sc) {
  for (int64_t r = 0; r < rows; ++r) {
    const float alpha = sc.state[r].Update(sc.s.data() + r * kKeys, kKeys);
    if (alpha != 1.f) {
      float* __restrict acc = sc.acc.data() + r * hd;
      for (int64_t d = 0; d < hd; ++d) acc[d] *= alpha;
    }
  }
  tiles::AccumulatePV(sc.s.data(), kKeys, rows, sc.v_rows, n, sc.acc.data(), hd);
}

// Runs one work item: leaves acc and state[] for its rows in the scratch.
void AttendTile(const Problem& p, const TileWork& w, Scratch& sc) {
  LoadQueries(p, w, sc);
  const int64_t rows = RowsOf(p, w);
  const int64_t last_pos = w.pos_begin + w.num_tokens - 1;
  const int64_t key_limit = std::min(w.key_end, last_pos + 1);  // causal: nothing beyond
  if (w.key_begin + kKeys < key_limit) {  // the loop prefetches two tiles ahead
    PrefetchKeys(p, w, w.key_begin + kKeys, std::min(kKeys, key_limit - w.key_begin - kKeys));
  }
  for (int64_t key0 = w.key_begin; key0 < key_limit; key0 += kKeys) {
    const int64_t n = std::min(kKeys, key_limit - key0);
    GatherKeyRows(p, w, key0, n, sc);
    const int64_t ahead = key0 + 2 * kKeys;  // two tiles ahead
    if (ahead < key_limit) PrefetchKeys(p, w, ahead, std::min(kKeys, key_limit - ahead));
    // One score path per kernel, whatever the number of rows: a query row's result must not
    // depend on how its sequence was chunked or what else is in the batch (batch invariance).
    if (p.is_decode) {
      ScoresDot(rows, n, p.head_dim, sc);
    } else {
      ScoresTransposed(rows, n, p.head_dim, sc);
    }
    const bool is_diagonal = key0 + kKeys - 1 > w.pos_begin;  // some row may not see a key
    // ... or, with a sliding window, the last row may no longer see the tile's first key.
    const bool leaves_window = key0 < VisibleKeyBegin(last_pos, p.batch->sliding_window);
    if (is_diagonal || leaves_window || n < kKeys) MaskScores(p, w, key0, n, sc);
    SoftmaxTimesV(rows, n, p.head_dim, sc);
  }
}

Problem MakeProblem(const float* q, PagedKvView<const float> kv, const AttentionBatch& batch,
                    int64_t num_heads, float scale) {
  assert(kv.layout.num_kv_heads > 0 && num_heads % kv.layout.num_kv_heads == 0);
  Problem p;
  p.q = q;
  p.kv = kv;
  p.batch = &batch;
  p.num_heads = num_heads;
  p.group = num_heads / kv.layout.num_kv_heads;
  p.head_dim = kv.layout.head_dim;
  p.qk_scale = scale * kLog2e;
  return p;
}

// Prefill work list: every (sequence, kv head, query tile), sorted by cost (keys visited)
// descending so that the dynamic schedule ends with short items.
std::vector<TileWork> PrefillWork(const Problem& p) {
  const AttentionBatch& b = *p.batch;
  const int64_t tile_tokens = std::max<int64_t>(1, kRows / p.group);
  std::vector<TileWork> work;
  for (int64_t seq = 0; seq < b.num_seqs; ++seq) {
    const int64_t q_begin = b.cu_seqlens_q[seq];
    const int64_t q_len = b.cu_seqlens_q[seq + 1] - q_begin;
    const int64_t num_tiles = (q_len + tile_tokens - 1) / tile_tokens;
    for (int64_t tile = num_tiles - 1; tile >= 0; --tile) {
      for (int64_t kv_head = 0; kv_head < p.kv.layout.num_kv_heads; ++kv_head) {
        TileWork w;
        w.seq = seq;
        w.kv_head = kv_head;
        w.token_begin = q_begin + tile * tile_tokens;
        w.num_tokens = std::min(tile_tokens, q_len - tile * tile_tokens);
        w.pos_begin = b.context_lens[seq] + tile * tile_tokens;
        // Key tiles wholly left of the first row's window are skipped; the tiles stay aligned
        // to multiples of kTileKeys whatever the chunking, so that a row sums its keys in the
        // same order in any batch (batch invariance).
        w.key_begin = VisibleKeyBegin(w.pos_begin, b.sliding_window) / kKeys * kKeys;
        w.key_end = b.context_lens[seq] + q_len;
        work.push_back(w);
      }
    }
  }
  std::stable_sort(work.begin(), work.end(), [](const TileWork& a, const TileWork& b) {
    return a.pos_begin + a.num_tokens > b.pos_begin + b.num_tokens;
  });
  return work;
}

// Writes acc / l of the tile's rows to out [num_tokens, num_heads, head_dim].
void StoreRows(const Problem& p, const TileWork& w, const Scratch& sc, float* out) {
  const int64_t hd = p.head_dim;
  for (int64_t r = 0; r < RowsOf(p, w); ++r) {
    const int64_t token = w.token_begin + r / p.group;
    const int64_t head = w.kv_head * p.group + r % p.group;
    sc.state[r].Finalize(sc.acc.data() + r * hd, out + (token * p.num_heads + head) * hd, hd);
  }
}

// Decode plan: one work item per (sequence, kv head, split); items of one (sequence, kv
// head) are consecutive, starting at first_item[seq · num_kv_heads + kv_head].
struct DecodePlan {
  std::vector<TileWork> work;
  std::vector<int64_t> first_item;  // [num_seqs · num_kv_heads + 1]
  int64_t max_splits = 1;
};

// Keys per split for one sequence. Automatic (requested <= 0): splits of kSplitKeys keys
// (at most kMaxSplits), a function of the sequence's own length only, so its result is the
// same whatever else is in the batch and however many threads run (batch invariance).
// requested > 0: that many equal splits.
int64_t SplitChunk(int64_t num_keys, int64_t requested) {
  if (requested > 0) return (num_keys + requested - 1) / requested;
  int64_t chunk = TileTraits::kSplitKeys;
  if ((num_keys + chunk - 1) / chunk > TileTraits::kMaxSplits) {
    chunk = (num_keys + TileTraits::kMaxSplits - 1) / TileTraits::kMaxSplits;
    chunk = (chunk + kKeys - 1) / kKeys * kKeys;  // whole key tiles
  }
  return chunk;
}

DecodePlan PlanDecode(const Problem& p, int64_t requested_splits) {
  const AttentionBatch& b = *p.batch;
  DecodePlan plan;
  for (int64_t seq = 0; seq < b.num_seqs; ++seq) {
    const int64_t num_keys = b.context_lens[seq] + 1;
    // A sliding window: only its keys are split and read.
    const int64_t first_key = VisibleKeyBegin(num_keys - 1, b.sliding_window);
    const int64_t chunk = SplitChunk(num_keys - first_key, requested_splits);
    const int64_t num_chunks = (num_keys - first_key + chunk - 1) / chunk;
    plan.max_splits = std::max(plan.max_splits, num_chunks);
    for (int64_t kv_head = 0; kv_head < p.kv.layout.num_kv_heads; ++kv_head) {
      plan.first_item.push_back(static_cast<int64_t>(plan.work.size()));
      for (int64_t c = 0; c < num_chunks; ++c) {
        TileWork w;
        w.seq = seq;
        w.kv_head = kv_head;
        w.token_begin = b.cu_seqlens_q[seq];
        w.num_tokens = 1;
        w.pos_begin = num_keys - 1;
        w.key_begin = first_key + c * chunk;
        w.key_end = std::min(num_keys, first_key + (c + 1) * chunk);
        plan.work.push_back(w);
      }
    }
  }
  plan.first_item.push_back(static_cast<int64_t>(plan.work.size()));
  return plan;
}

// Merges the split partials of one (sequence, kv head) and writes the group's rows of out.
void MergeSplits(const Problem& p, const DecodePlan& plan, int64_t seq_head,
                 std::vector<float>& partial_acc, std::vector<OnlineSoftmax>& partial_state,
                 float* out) {
  const int64_t hd = p.head_dim;
  const int64_t first = plan.first_item[seq_head];
  const int64_t end = plan.first_item[seq_head + 1];
  const TileWork& w = plan.work[first];
  for (int64_t g = 0; g < p.group; ++g) {
    OnlineSoftmax state = partial_state[first * p.group + g];
    float* acc = partial_acc.data() + (first * p.group + g) * hd;
    for (int64_t item = first + 1; item < end; ++item) {
      const int64_t row = item * p.group + g;
      state.Merge(acc, partial_state[row], partial_acc.data() + row * hd, hd);
    }
    const int64_t head = w.kv_head * p.group + g;
    state.Finalize(acc, out + (w.token_begin * p.num_heads + head) * hd, hd);
  }
}

// The fp8 pools' problem: the fp32 one over the same layout, with the dequantization tables.
Problem MakeFp8Problem(const float* q, PagedKvView<const uint8_t> kv, Fp8KvScales scales,
                       const AttentionBatch& batch, int64_t num_heads, float scale) {
  Problem p = MakeProblem(q, {nullptr, nullptr, kv.layout}, batch, num_heads, scale);
  p.k8 = kv.k;
  p.v8 = kv.v;
  p.k_scale = scales.k;
  p.v_scale = scales.v;
  for (int c = 0; c < 256; ++c) {
    p.k_lut[c] = E4m3ToF32(uint8_t(c)) * scales.k;
    p.v_lut[c] = E4m3ToF32(uint8_t(c)) * scales.v;
  }
  return p;
}

// The keys AttendTile walks for a work item (its loop's range).
int64_t KeysWalked(const TileWork& w) {
  return std::max<int64_t>(0, std::min(w.key_end, w.pos_begin + w.num_tokens) - w.key_begin);
}

int64_t KeysWalked(const std::vector<TileWork>& work) {
  int64_t keys = 0;
  for (const TileWork& w : work) keys += KeysWalked(w);
  return keys;
}

void RunPrefill(const Problem& p, float* out, AttentionStats* stats) {
  const std::vector<TileWork> work = PrefillWork(p);
  size_t scratch_bytes = 0;
#pragma omp parallel
  {
    Scratch sc(p.head_dim, p.group, p.k8 != nullptr);
#pragma omp single nowait
    scratch_bytes = sc.Bytes();
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < work.size(); ++i) {
      AttendTile(p, work[i], sc);
      StoreRows(p, work[i], sc, out);
    }
  }
  if (stats != nullptr) {
    stats->scratch_bytes_per_thread = scratch_bytes;
    stats->num_splits = 0;
    stats->keys_visited = KeysWalked(work);
  }
}

void RunDecode(Problem& p, float* out, int64_t num_splits, AttentionStats* stats) {
  p.is_decode = true;
  const DecodePlan plan = PlanDecode(p, num_splits);
  const int64_t num_items = static_cast<int64_t>(plan.work.size());
  const int64_t hd = p.head_dim;
  // Partials: O(num_seqs · num_kv_heads · splits · group · head_dim), not per thread.
  std::vector<float> partial_acc(num_items * p.group * hd);
  std::vector<OnlineSoftmax> partial_state(num_items * p.group);
  const int64_t num_seq_heads = p.batch->num_seqs * p.kv.layout.num_kv_heads;
  size_t scratch_bytes = 0;
#pragma omp parallel
  {
    Scratch sc(hd, p.group, p.k8 != nullptr);
#pragma omp single nowait
    scratch_bytes = sc.Bytes();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_items; ++i) {
      AttendTile(p, plan.work[i], sc);
      std::copy_n(sc.acc.data(), p.group * hd, partial_acc.data() + i * p.group * hd);
      std::copy_n(sc.state.data(), p.group, partial_state.data() + i * p.group);
    }
#pragma omp for schedule(static)
    for (int64_t sh = 0; sh < num_seq_heads; ++sh) {
      MergeSplits(p, plan, sh, partial_acc, partial_state, out);
    }
  }
  if (stats != nullptr) {
    stats->scratch_bytes_per_thread = scratch_bytes;
    stats->num_splits = plan.max_splits;
    stats->keys_visited = KeysWalked(plan.work);
  }
}

}  // namespace

void PagedPrefillAttention(const float* q, PagedKvView<const float> kv, const AttentionBatch& batch,
                           int64_t num_heads, float scale, float* out, AttentionStats* stats) {
  RunPrefill(MakeProblem(q, kv, batch, num_heads, scale), out, stats);
}

void PagedPrefillAttention(const float* q, PagedKvView<const uint8_t> kv, Fp8KvScales scales,
                           const AttentionBatch& batch, int64_t num_heads, float scale, float* out,
                           AttentionStats* stats) {
  RunPrefill(MakeFp8Problem(q, kv, scales, batch, num_heads, scale), out, stats);
}

void PagedDecodeAttention(const float* q, PagedKvView<const float> kv, const AttentionBatch& batch,
                          int64_t num_heads, float scale, float* out, int64_t num_splits,
                          AttentionStats* stats) {
  Problem p = MakeProblem(q, kv, batch, num_heads, scale);
  RunDecode(p, out, num_splits, stats);
}

void PagedDecodeAttention(const float* q, PagedKvView<const uint8_t> kv, Fp8KvScales scales,
                          const AttentionBatch& batch, int64_t num_heads, float scale, float* out,
                          int64_t num_splits, AttentionStats* stats) {
  Problem p = MakeFp8Problem(q, kv, scales, batch, num_heads, scale);
  RunDecode(p, out, num_splits, stats);
}

namespace {

// Calls store(src, dst) for every appended row: src the element offset of (token t, KV head h)
// in k / v [num_tokens, num_kv_heads, head_dim], dst its offset in the pools; tokens with a
// negative slot (padding, skipped) are left out.
template <typename Store>
void ForEachAppendedRow(const int64_t* slot_mapping, int64_t num_tokens,
                        const PagedKvLayout& layout, Store&& store) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
      store((t * layout.num_kv_heads + h) * layout.head_dim, layout.SlotOffset(slot, h));
    }
  }
}

}  // namespace

void DequantizeE4m3(const uint8_t* src, int64_t n, float scale, float* dst) {
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = E4m3ToF32(uint8_t(c)) * scale;
  DequantizeRow(src, n, table, scale, dst);
}

void AppendKv(const float* k, const float* v, const int64_t* slot_mapping, int64_t num_tokens,
              PagedKvView<float> kv) {
  const size_t row_bytes = size_t(kv.layout.head_dim) * sizeof(float);
  ForEachAppendedRow(slot_mapping, num_tokens, kv.layout, [&](int64_t src, int64_t dst) {
    std::memcpy(kv.k + dst, k + src, row_bytes);
    std::memcpy(kv.v + dst, v + src, row_bytes);
  });
}

void AppendKv(const float* k, const float* v, const int64_t* slot_mapping, int64_t num_tokens,
              PagedKvView<uint8_t> kv, Fp8KvScales scales) {
  const int64_t hd = kv.layout.head_dim;
  ForEachAppendedRow(slot_mapping, num_tokens, kv.layout, [&](int64_t src, int64_t dst) {
    for (int64_t d = 0; d < hd; ++d) {
      kv.k[dst + d] = F32ToE4m3(k[src + d] / scales.k);
      kv.v[dst + d] = F32ToE4m3(v[src + d] / scales.v);
    }
  });
}

}  // namespace llm::cpu
