// CUDA paged decode attention (flash-decoding over the paged KV cache) and KV append.
// CPU twins (the specification): cpu::PagedDecodeAttention and cpu::AppendKv in
// kernels/cpu/flash_attention.h. Layout: kernels/paged_kv.h. Softmax math:
// kernels/online_softmax.h. Implementation and design notes: decode_attention.cu.
// Test: tests/kernels/decode_attention_gpu_test.cc (ctest -L gpu -R decode_attention);
// bench: bench/decode_attention_gpu.cu (./build/bench_decode_attention_gpu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention/attention.h"
#include "kernels/dtype.h"
#include "kernels/paged_kv.h"

namespace llm::cuda {

// What the selector chose for a call (for benches and tests).
struct DecodeLaunchInfo {
  int num_splits = 0;            // key chunks per (sequence, kv head); 1 = no split, no merge
  int ctas_per_sm = 0;           // resident CTAs per SM of the chosen config (occupancy)
  int num_ctas = 0;              // grid size of the attention kernel (its only launch)
  bool warp_items = false;       // the persistent warp-item kernel ran (fp8; see below)
  bool transposed_step = false;  // the transposed step ran (fp8 or head_dim 256, groups <= 8)
};

// Which decode kernel runs. kAuto: the CTA-per-(sequence, KV head, split) kernel
// (DecodeKernel); for fp8 caches with GQA groups <= 8 its warps use the transposed step (keys as
// the mma's 16 rows, <= 8 query heads as its columns: half the mma instructions and
// accumulators of the original step, which puts queries on the rows padded to 16); so do bf16 /
// fp16 caches at head_dim 256 (WarpKeysStepT16 on 8 warps, decode_attention.cu: 1.04 of copy
// bandwidth at 64 × 8k on the H200, where the original step reaches 0.71). kCta: the same
// kernel with the original step always. kWarpItems / kWarpItemsT (fp8 only, never split): the
// persistent warp-item kernel (v4, decode_attention.cu), every warp walking whole (sequence, KV
// head) items through one pipeline across item boundaries, with the original / transposed step
// (kWarpItemsT with a group above 8 runs kWarpItems). Both are correct and tested but slower than
// kAuto on every shape measured (bench/RESULTS.md), so only a caller that asks gets them.
enum class DecodeKernelChoice { kAuto, kCta, kWarpItems, kWarpItemsT };

// The split workspace. Its first kDecodeCounterBytes hold one uint32 arrival counter per
// (sequence, KV head) (at most kDecodeMaxCounters of them, so a split call needs
// num_seqs * num_kv_heads <= kDecodeMaxCounters); the rest holds the fp32 partials (acc[head_dim],
// m, l) per (sequence, query head, split), overwritten by every call. The counters MUST be zero
// before the first call: whoever allocates a workspace zeroes it once (cudaMemset of the whole
// buffer), and every call leaves the counters zero again (the last CTA of each (sequence, KV
// head) to finish resets its counter), so CUDA graph replays need no memset node. The counters
// sit at fixed offsets, independent of the call's shape, so calls of different batch sizes can
// share one workspace. Calls that share a workspace must be stream-ordered (one stream, or
// events): two concurrent calls on one workspace would corrupt each other's counters.
inline constexpr int64_t kDecodeMaxCounters = 16384;
inline constexpr size_t kDecodeCounterBytes = size_t(kDecodeMaxCounters) * sizeof(uint32_t);

// Bytes of workspace PagedDecodeAttention needs for up to `max_splits` splits: the counters
// plus max_splits fp32 partials per (sequence, query head). 0 when max_splits <= 1 (no split,
// no workspace).
size_t DecodeWorkspaceBytes(int64_t num_seqs, int64_t num_heads, int64_t head_dim,
                            int64_t max_splits);

// Decode: exactly one query token per sequence (cu_seqlens_q[i] = i; q and out rows are the
// sequence index), attending over context_lens[i] + 1 keys through the block table; with
// p.batch.sliding_window W > 0 over the last W of them, keys [VisibleKeyBegin(context_lens[i],
// W), context_lens[i]] (kernels/paged_kv.h): only the window's 64-key tiles are read and split
// (a 32k context with W = 4096 reads ~4096 keys), and the split count and grid depend on the
// shape (max_num_keys, W) alone, so a captured graph stays valid as the contexts grow.
//   p.dtype kBF16 or kF16; p.kv_format.fp8: e4m3 pools (the tensor-core math then runs in fp16:
//   q is converted to fp16 saturating at ±65504, K/V dequantize exactly, P is rounded to fp16;
//   the output is written in p.dtype); head_dim 64, 128 or 256 (the warp-item kernels: 64 or 128);
//   num_heads a multiple of num_kv_heads with at most 16 query heads per KV head; p.max_num_keys >=
//   every context_lens[i] + 1 (it sizes the split selector's choice; the kernel reads the true
//   lengths on the device).
// num_splits: 0 = automatic (from the batch shape and the SM count), 1 = no split, n = n key
// chunks per sequence, capped by the tiles of the longest sequence, by 128 and by what the
// workspace holds (see above; a null or too small workspace runs fewer splits, down to 1);
// info->num_splits reports the count used (with a window, capped by the window's tiles). With
// splits > 1 the last CTA of each (sequence, KV head) merges the partials in the same kernel (one
// launch either way). Launched through cuda::Launch (kernels/cuda/common/launch.h): with
// programmatic dependent launch on, the kernel waits (PdlWait) before reading q, the newest key's
// K/V row or the workspace and before writing anything, so results are bit-identical with it on
// or off. Its prologue (context lengths, block-table rows, the first tiles' other K/V rows) runs
// before the wait unless SetDecodeKvBeforeWait(false) (launch.h's named exception).
// Unsupported dtype / head_dim / group, a negative window, or a window with the warp-item
// kernels (kWarpItems / kWarpItemsT, which have none): std::invalid_argument naming the value.
// Asynchronous on `stream`.
// Process-wide (as SetProgrammaticLaunch): whether the CTA kernel's prologue copies run before
// its PdlWait (the default) or after it (llm --no-decode-kv-before-wait; the tests compare the
// two bit for bit). Read at each launch: a
// captured graph keeps the setting it was captured with.
void SetDecodeKvBeforeWait(bool on);
bool DecodeKvBeforeWait();

void PagedDecodeAttention(const AttentionParams& p, int num_splits, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream,
                          DecodeLaunchInfo* info = nullptr,
                          DecodeKernelChoice choice = DecodeKernelChoice::kAuto,
                          int items_max_ctas = 0);

// The split count the automatic selector picks for a batch shape (exposed for tests/benches);
// every split gets at least min_tiles_per_split tiles of 64 keys of the longest sequence (2:
// each CTA pipelines its tiles, as PagedDecodeAttention's num_splits = 0 picks; 1: short
// contexts at small batch split further, each CTA one tile, which the executor uses). With a
// sliding window the tiles counted are the window's (as PagedDecodeAttention reads them).
int DecodeAutoSplits(int64_t num_seqs, int64_t num_kv_heads, int64_t max_num_keys, int64_t head_dim,
                     int64_t max_splits, int64_t min_tiles_per_split = 2,
                     int64_t sliding_window = 0);

// Writes new keys and values (same semantics as cpu::AppendKv):
//   k, v: [num_tokens, num_kv_heads, head_dim] of `dtype` (device)
//   slot_mapping: [num_tokens] device int64 flat slots (block * block_size + offset); < 0 skips
//   kv: the layer's pools (device), same dtype; with format.fp8 e4m3 pools, each element
//       written as F32ToE4m3(float(x) / scale) (kernels/fp8.h, as cpu::AppendKv's fp8 overload).
void AppendKv(const void* k, const void* v, const int64_t* slot_mapping, int64_t num_tokens,
              PagedKvView<void> kv, DType dtype, cudaStream_t stream,
              const KvCacheFormat& format = {});

}  // namespace llm::cuda
