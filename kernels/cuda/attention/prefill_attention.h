// Paged PREFILL flash attention on CUDA: the public entry point and the kernel ladder.
//
//   out[t, h, :] = softmax(scale · q[t, h, :] · K^T) · V over the keys 0 … ctx_i + r of its
//   sequence (causal, with cached context: chunked prefill; AttentionParams::causal = false
//   gives every query all ctx_i + q_len keys, v4 only), K/V read only through the block
//   table of kernels/paged_kv.h. The CPU specification is cpu::PagedPrefillAttention
//   (kernels/cpu/flash_attention.h); the online softmax is kernels/online_softmax.h.
//
// The ladder (each rung kept, tested by tests/kernels/prefill_attention_gpu_test.cc and timed by
// bench/prefill_attention_gpu.cu):
//   kNaive  prefill_attention_v1_naive.cu  one warp per query row, scalar online softmax
//   kSmem   prefill_attention_v2_smem.cu   shared-memory Q/K/V tiles, fp32 FMA
//   kMma    prefill_attention_v3_mma.cu    FA2: mma.sync m16n8k16, cp.async, swizzled smem
//                                          (head_dim 64, 128 and 256)
//   kWgmma  prefill_attention_v4_wgmma.cu  FA3-style: wgmma + TMA per page + mbarriers,
//                                          producer / 2 consumer warpgroups, setmaxnreg;
//                                          fp8 caches through prefill_attention_fp8.cu
//   kBest   the fastest rung that supports the shape (prefill_attention.cu: the selector)
//
// Test:  ninja -C build prefill_attention_gpu_test && (cd build && ctest -L gpu -R prefill)
// Bench: ninja -C build bench_prefill_attention_gpu && ./build/bench_prefill_attention_gpu
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/attention/attention.h"

namespace llm::cuda {

enum class PrefillVariant : uint8_t { kNaive, kSmem, kMma, kWgmma, kBest };

// "v1_naive", "v2_smem", "v3_mma", "v4_wgmma", "best".
const char* PrefillVariantName(PrefillVariant v);

// Device scratch that lets kWgmma run over an fp8 (e4m3) cache (prefill_attention_fp8.cu): a
// pass copies the batch's pages, exactly, into a pool of the attention dtype inside `data`,
// and v4 reads that copy. num_pages: at least the pages the batch's sequences span,
// PrefillPagesNeeded(...) of the same lengths (host arrays; pages past num_pages would read as
// zeros: the scratch is never written out of bounds); bytes: at least
// PrefillFp8ScratchBytes(layout, dtype, num_seqs, max_blocks_per_seq, num_pages); `data`
// 256-byte aligned (cudaMalloc's). One launch at a time per scratch (stream order).
struct PrefillScratch {
  void* data = nullptr;
  size_t bytes = 0;
  int64_t num_pages = 0;
};
// Σ over the sequences of ceil((context_lens[s] + q_len[s]) / block_size), from host arrays.
int64_t PrefillPagesNeeded(const int32_t* cu_seqlens_q, const int32_t* context_lens,
                           int64_t num_seqs, int64_t block_size);
size_t PrefillFp8ScratchBytes(const PagedKvLayout& layout, DType dtype, int64_t num_seqs,
                              int64_t max_blocks_per_seq, int64_t num_pages);

// The rung kBest (or `requested`) resolves to for these parameters, or throws
// std::invalid_argument (unsupported dtype / head_dim, or a rung that cannot run the shape,
// e.g. kWgmma with a block size that is not a multiple of 8 dividing 128). fp8 caches resolve
// to kWgmma (over a copy of the pages) only with a `scratch` that fits.
PrefillVariant ResolvePrefillVariant(const AttentionParams& p,
                                     PrefillVariant requested = PrefillVariant::kBest,
                                     const PrefillScratch* scratch = nullptr);

// Whether v4_wgmma takes this page size: whole pages per 128-key tile, 8-row TMA swizzle atoms
// (block_size a multiple of 8 dividing 128).
bool PrefillWgmmaTakesBlockSize(int64_t block_size);

namespace detail {

// v4 schedule knobs (runtime bits of one kernel, PagedPrefillAttention's v4_flags): the test
// runs every combination, the bench times them. Production's pick is kV4Auto below.
inline constexpr int kV4NoPingPong = 1;  // consumer warpgroups issue GEMMs without taking turns
inline constexpr int kV4NoOverlap = 2;   // wait for P·V before the softmax (no intra-WG overlap)
inline constexpr int kV4SkipExp = 4;     // profiling only: P = S·scale - m, no exp2 (wrong output)
// Profiling only (wrong output): the load pipeline alone (consumers wait for each K/V tile and
// give it back, no math), and the math alone (the first kStages tiles are loaded, later tiles
// reuse those stages without waiting for loads).
inline constexpr int kV4LoadsOnly = 8;
inline constexpr int kV4ComputeOnly = 16;
// Pairs neighbouring query tiles in a 2-CTA cluster that multicasts the K/V tiles both read
// (half the L2 -> SM traffic). Off in production: on the H200 the loads alone get 15-25%
// cheaper, but the pair runs in lockstep (the lighter CTA idles through the heavier one's
// extra tile) and the whole kernel is slower, persistent or not (bench/RESULTS.md).
inline constexpr int kV4Cluster = 32;
// One CTA (or cluster) per query tile (pair), launched as a grid of them; the default is a
// persistent grid of as many as fit at once, each walking its share of the tiles heaviest
// first with the K/V ring running on from one tile to the next.
inline constexpr int kV4NoPersist = 64;
// V as two 64-column TMA boxes per page into [panel][key][64] tiles (the layout before
// 2026-11-30), for comparison. The default loads each page's V as ONE box (a 4-D tensor map:
// both panels) into [page][panel][key-in-page][64] tiles, halving V's boxes at head_dim 128;
// the P·V descriptor steps page by page (at head_dim 64 both layouts are the same).
inline constexpr int kV4PanelBoxV = 128;
// Q loaded at the start of each query tile (the form before 2026-12-06), for comparison. The
// default requests the next tile's Q rows as soon as the current tile's last S = Q·Kᵀ has
// completed, hiding their latency under the last P·V and the output stores.
inline constexpr int kV4NoQPrefetch = 256;
// The output written as each thread's 4-byte pairs (the form before 2026-12-06), for
// comparison. The default exchanges pairs inside each quad of lanes so that every thread
// writes whole 16-byte chunks: a quarter of the store instructions.
inline constexpr int kV4NarrowStores = 512;
// The kernel compiled with runtime schedule bits, for comparison. Production's schedule (below)
// runs an instantiation with its bits as compile-time constants: the other schedules' code is
// not in it, a third of the instructions (bench/NOTEBOOK.md, 2026-12-06: the per-tile epilogue
// and item start missed the instruction cache). Any other bits run the runtime-bit kernel.
inline constexpr int kV4Generic = 1024;
// Items in query-tile order over all (sequence, head) pairs at once (the order before
// 2026-12-06 evening), for comparison. The default walks the pairs in sections whose K/V fit
// in half the L2, query tiles heaviest first inside a section, so a pair's K/V tiles are read
// from memory once and re-read by its other query tiles from L2 (at 512 tokens the old order
// read K/V 2.5 times from DRAM: ncu, 71% of DRAM bandwidth).
inline constexpr int kV4AllPairs = 4096;
// Testing: sections of three KV heads' query heads each (many sections at any problem size,
// the last one shorter where the KV heads are not a multiple of three).
inline constexpr int kV4TinySections = 8192;
inline constexpr int kV4Default = kV4NoPingPong | kV4NoOverlap;
// Production's pick (PagedPrefillAttention's default): kV4Default at head_dim 128; at head_dim 64
// the ping-pong schedule (kV4NoOverlap), 7-12% faster there from 512 to 4k tokens on an H100
// (bench/NOTEBOOK.md, 2026-12-06), where at 128 it is within ±1.6%.
inline constexpr int kV4Auto = -1;
constexpr int ResolveV4Flags(int v4_flags, int64_t head_dim) {
  if (v4_flags != kV4Auto) return v4_flags;
  return head_dim == 64 ? kV4NoOverlap : kV4Default;
}

}  // namespace detail

// Causal paged prefill attention (see above). dtype kBF16 or kF16; head_dim 64 or 128 on every
// rung, 256 (Gemma 3) on kMma (kBest's pick) and kNaive, any other head_dim up to 256 on kNaive
// only (kBest picks it); std::invalid_argument otherwise, naming the value. p.kv_format.fp8 (e4m3
// pools) runs on kNaive and kMma, and on kWgmma over an exact bf16 / fp16 copy of the pages when a
// PrefillScratch that fits is given (kBest picks kWgmma then, else kMma for head_dim 64 / 128 /
// 256); kSmem rejects it. v4_flags: kWgmma's schedule (detail::kV4* bits; the other rungs ignore
// it): production's is kV4Auto (detail::ResolveV4Flags), the test and the bench pass the others.
// p.batch.sliding_window W > 0 (causal only; every rung, fp8 included): query row at position p
// sees keys [VisibleKeyBegin(p, W), p] (kernels/paged_kv.h); each rung starts its key loop at the
// (aligned) tile holding the first visible key of its query tile's first row and masks the rest on
// the left; non-causal with a window or a negative window: std::invalid_argument. Asynchronous on
// `stream`. Returns the rung it ran (ResolvePrefillVariant's answer).
PrefillVariant PagedPrefillAttention(const AttentionParams& p, cudaStream_t stream,
                                     PrefillVariant variant = PrefillVariant::kBest,
                                     const PrefillScratch* scratch = nullptr,
                                     int v4_flags = detail::kV4Auto);

namespace detail {

// The flat kernel argument block every rung receives (built once by the selector).
struct PrefillArgs {
  const void* q = nullptr;  // [num_tokens, num_heads, head_dim]
  void* out = nullptr;      // same
  const void* k = nullptr;  // [num_blocks, num_kv_heads, block_size, head_dim]
  const void* v = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks_per_seq = 0;
  int64_t num_blocks = 0;
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int group = 1;  // num_heads / num_kv_heads
  int head_dim = 0;
  int block_size = 0;
  int max_q_len = 0;
  int64_t max_num_keys = 0;  // AttentionParams::max_num_keys (0: unknown)
  float scale_log2 = 0;      // scale · log2(e) (fp8: · k_scale): scores live in the log2 domain
  bool is_bf16 = true;
  bool kv_fp8 = false;        // e4m3 pools (KvCacheFormat): v1_naive, v3_mma, v4 over a copy
  float out_scale = 1.f;      // fp8: v_scale, applied with the final 1 / l
  int v4_flags = kV4Default;  // kV4* bits: PagedPrefillAttention's v4_flags
  bool causal = true;         // AttentionParams::causal (false: v4 only)
  // AttentionBatch::sliding_window (0: full causal; > 0: causal only, every rung): a row at
  // position p sees keys [VisibleKeyBegin(p, W), p]; key tiles left of the window of a query
  // tile's first row are skipped, rows seeing part of a tile get a left mask.
  int sliding_window = 0;
  // v4's item order, set by its launcher: (sequence, head) pairs per L2 section, in [1, pairs]
  // (pairs: one section, query tiles in order over all pairs; kernels/prefill_item_order.h).
  int item_section = 1;
};

// One launcher per rung (each defined in its own prefill_attention_v*.cu).
void LaunchPrefillNaive(const PrefillArgs& a, cudaStream_t stream);
void LaunchPrefillSmem(const PrefillArgs& a, cudaStream_t stream);
void LaunchPrefillMma(const PrefillArgs& a, cudaStream_t stream);
void LaunchPrefillWgmma(const PrefillArgs& a, cudaStream_t stream);
// fp8 pools: the dequantizing copy into `scratch`, then LaunchPrefillWgmma over it.
void LaunchPrefillWgmmaFp8(const PrefillArgs& a, const PrefillScratch& scratch,
                           cudaStream_t stream);

}  // namespace detail
}  // namespace llm::cuda

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/cuda/common/vec.cuh"
#include "kernels/fp8.h"

// Device helpers shared by the rungs (CUDA translation units only).
namespace llm::cuda::detail {

using vec::FromF32;   // bf16 / fp16 <-> fp32 (kernels/cuda/common/vec.cuh)
using vec::PackPair;  // two floats as one packed pair (low half = first), the mma operand format
using vec::ToF32;
// A cached K/V element as fp32: bf16 / fp16, or an e4m3 code (fp8 caches; the scale is applied
// by the caller).
template <typename KV>
__device__ __forceinline__ float KvToF32(KV x) {
  if constexpr (std::is_same_v<KV, uint8_t>) {
    return E4m3ToF32(x);
  } else {
    return ToF32(x);
  }
}

// Where a CTA's (sequence, head, query tile) sits. Query tiles run heaviest-first (the last
// tile of a causal sequence sees the most keys), so blockIdx.y counts down.
struct TileCoords {
  int seq, head, kv_head;
  int q_start, q_len, ctx, num_keys;  // tokens of the chunk, cached context, visible keys
  int q0;                             // first query row of this tile within the chunk
};

__device__ __forceinline__ TileCoords GetTileCoords(const PrefillArgs& a, int rows_per_tile) {
  TileCoords c;
  c.seq = blockIdx.x / a.num_heads;
  c.head = blockIdx.x % a.num_heads;
  c.kv_head = c.head / a.group;
  c.q_start = a.cu_seqlens_q[c.seq];
  c.q_len = a.cu_seqlens_q[c.seq + 1] - c.q_start;
  c.ctx = a.context_lens[c.seq];
  c.num_keys = c.ctx + c.q_len;
  c.q0 = (gridDim.y - 1 - blockIdx.y) * rows_per_tile;
  return c;
}

// Element offset of key `key` (row `key` of the sequence's cache) of KV head kv_head.
__device__ __forceinline__ int64_t KvRowOffset(const PrefillArgs& a, const int32_t* table, int key,
                                               int kv_head) {
  const int block = table[key / a.block_size];
  return ((int64_t(block) * a.num_kv_heads + kv_head) * a.block_size + key % a.block_size) *
         a.head_dim;
}

}  // namespace llm::cuda::detail
#endif
