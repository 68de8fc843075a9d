// The plain definition of paged attention (kernels/cpu/flash_attention.h): every query row's
// softmax(q·kᵀ·scale)·v in double precision over its sequence's keys through the block table,
// causal (with the batch's sliding window) or not. What the flash kernels, CPU and CUDA, are
// tested against; kept apart from them so that no kernel code is shared with the reference.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/flash_attention.h"

namespace llm::cpu {

void PagedAttentionReferenceRow(const float* q, PagedKvView<const float> kv,
                                const AttentionBatch& batch, int64_t num_heads, float scale,
                                int64_t seq, int64_t t, int64_t h, bool causal, double* out) {
  const PagedKvLayout& l = kv.layout;
  const int64_t hd = l.head_dim, kv_head = h / (num_heads / l.num_kv_heads);
  const int64_t q0 = batch.cu_seqlens_q[seq], q_len = batch.cu_seqlens_q[seq + 1] - q0;
  const int64_t ctx = batch.context_lens[seq];
  const int64_t keys = causal ? ctx + (t - q0) + 1 : ctx + q_len;
  // With a sliding window (causal only) the row's first visible key.
  const int64_t first = causal ? VisibleKeyBegin(keys - 1, batch.sliding_window) : 0;
  const int32_t* table = batch.block_tables + seq * batch.max_blocks_per_seq;
  const float* qr = q + (t * num_heads + h) * hd;
  auto offset = [&](int64_t key) {
    return l.Offset(table[key / l.block_size], kv_head, key % l.block_size);
  };
  std::vector<double> s(static_cast<size_t>(keys));
  double mx = -INFINITY;
  for (int64_t key = first; key < keys; ++key) {
    const float* k = kv.k + offset(key);
    double dot = 0;
    for (int64_t d = 0; d < hd; ++d) dot += double(qr[d]) * k[d];
    s[size_t(key)] = dot * scale;
    mx = std::max(mx, s[size_t(key)]);
  }
  double sum = 0;
  std::fill(out, out + hd, 0.0);
  for (int64_t key = first; key < keys; ++key) {
    const double w = std::exp(s[size_t(key)] - mx);
    sum += w;
    const float* v = kv.v + offset(key);
    for (int64_t d = 0; d < hd; ++d) out[d] += w * v[d];
  }
  for (int64_t d = 0; d < hd; ++d) out[d] /= sum;
}

void PagedAttentionReference(const float* q, PagedKvView<const float> kv,
                             const AttentionBatch& batch, int64_t num_heads, float scale,
                             float* out, bool causal) {
  const int64_t hd = kv.layout.head_dim;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    std::vector<double> row(static_cast<size_t>(hd));
    for (int64_t t = batch.cu_seqlens_q[s]; t < batch.cu_seqlens_q[s + 1]; ++t) {
      for (int64_t h = 0; h < num_heads; ++h) {
        PagedAttentionReferenceRow(q, kv, batch, num_heads, scale, s, t, h, causal, row.data());
        float* o = out + (t * num_heads + h) * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = static_cast<float>(row[size_t(d)]);
      }
    }
  }
}

}  // namespace llm::cpu
