// The order in which the persistent prefill kernel (kernels/cuda/attention/
// prefill_attention_v4_wgmma.cu) walks its work items, and the launcher's choice of it: plain
// functions of integers, shared by the kernel, its launcher and the CPU test
// (tests/kernels/prefill_item_order_test.cc).
//
// An item is one query tile (or, in cluster mode, a pair of neighbouring ones) of one
// (sequence, head) pair: pairs = num_seqs · num_heads, pair = sequence · num_heads + head, and
// per_pair items each, counted from the pair's last (heaviest, under a causal mask) tile. The
// pairs are cut into L2 sections of `section` consecutive pairs (the last may be shorter);
// items run section by section, and inside a section query tile first over its pairs, so every
// pair's heaviest tile comes before any pair's next one. With one section (section >= pairs)
// that is the order over all pairs at once.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/host_device.h"

namespace llm {

struct PrefillItem {
  int pair;            // sequence · num_heads + head
  int tile_from_last;  // 0: the pair's last query tile (pair of tiles in cluster mode)
};

// Item `item` in [0, pairs · per_pair); section in [1, pairs] (the caller clamps: section ·
// per_pair must not pass the item count).
LLM_HOST_DEVICE PrefillItem PrefillItemAt(int item, int pairs, int per_pair, int section) {
  const int sec = item / (section * per_pair), first = sec * section;
  const int in_sec = pairs - first < section ? pairs - first : section;
  const int r = item - first * per_pair;
  return PrefillItem{first + r % in_sec, r / in_sec};
}

// Pairs per L2 section, as the launcher picks them: as many pairs as have their K/V (at the
// longest sequence, `max_keys` keys of `kv_bytes_per_key` bytes for K and V together, shared by
// the `group` query heads of a KV head) in half the L2, a multiple of the group, at least one
// group; and only where there are more than half as many (sequence, KV head) pairs as SMs:
// with fewer, one section already runs several query tiles of one pair at once (they stream the
// same K/V through L2), which measured faster (bench/NOTEBOOK.md, 2026-12-06). Returns a value
// in [1, pairs]: pairs itself means one section.
inline int PrefillItemSection(int num_seqs, int num_heads, int group, int64_t max_keys,
                              int64_t kv_bytes_per_key, int64_t l2_bytes, int sms) {
  const int pairs = num_seqs * num_heads;
  if (pairs <= 0) return 1;
  const int64_t kv_pairs = int64_t(num_seqs) * (num_heads / std::max(group, 1));
  if (kv_pairs * 2 <= sms) return pairs;
  const int g = std::max(group, 1);
  const int64_t pair_bytes = std::max<int64_t>(max_keys * kv_bytes_per_key / g, 1);
  const int64_t fit = l2_bytes / 2 / pair_bytes / g * g;
  return int(std::clamp<int64_t>(fit, std::min(g, pairs), pairs));
}

}  // namespace llm
