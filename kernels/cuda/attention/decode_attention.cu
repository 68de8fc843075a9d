// Paged decode attention on the GPU (flash-decoding), bf16 / fp16, head_dim 64, 128 and 256
// (Gemma 3), over bf16 / fp16 or e4m3 caches.
// One query token per sequence; sequence i attends over context_lens[i] + 1 keys gathered
// through its block table (layout: kernels/paged_kv.h, HND per block). CPU twin and
// specification: cpu::PagedDecodeAttention (kernels/cpu/flash_attention.h).
//
// Decode is memory-bound (~1 FLOP per byte of K/V even with GQA 8), so the design is about
// reading every K/V byte exactly once at full HBM bandwidth:
//  - One CTA = one (sequence, KV head, key split): all G = num_heads / num_kv_heads query heads
//    of the KV group ride along, so each K/V row is read once for the G heads.
//  - CTA = 4 warps; the CTA walks its key range in tiles of 64 keys; warp w owns keys
//    [16w, 16w + 16) of each tile and keeps its own online-softmax state (m, l) and fp32
//    accumulator for the 16 (padded) query rows; the 4 warp states merge at the end.
//  - Tensor cores, the FlashAttention-2 fragment trick: S[16 rows, 16 keys] = Q·Kᵀ with
//    mma.m16n8k16 (A = Q, query rows padded to 16 with zeros, held in registers for the whole
//    CTA; B = K through ldmatrix), softmax in the log2 domain on the accumulator fragment, then
//    O[16, D] += P·V with P re-packed from the S accumulators as the A operand and V through
//    ldmatrix.trans. Padding rows cost tensor-core time only, which decode has to spare.
//  - Loads: cp.async 16-byte copies (L2-only .cg), kStages-deep shared-memory pipeline over the
//    64-key tiles (one commit group per tile), rows XOR-swizzled in 16-byte chunks so that
//    ldmatrix reads are bank-conflict free. Out-of-range rows are zero-filled (src-size 0).
//  - Page indices are staged in shared memory by the same cp.async pipeline, one tile ahead
//    of the K/V loads that need them (4-byte cp.async into a ring of 2·kStages slots), so no
//    thread ever waits on a block-table load before issuing its K/V copies.
//  - Split-KV: when num_seqs × num_kv_heads CTAs cannot fill the SMs, each sequence's tiles
//    are split into num_splits contiguous chunks (balanced: chunk sizes differ by at most one
//    tile; the non-empty chunks are the first min(num_splits, tiles) ones). Each CTA writes its
//    unnormalised partial (acc[D], m, l) per query head to the workspace, fences, and counts
//    itself in by an atomic on its (sequence, KV head) counter; the CTA that arrives last
//    merges all the partials with the OnlineSoftmax::Merge math (kernels/online_softmax.h) in
//    one parallel pass, writes the output and resets the counter to 0 (v3: no second launch;
//    v1/v2 had a separate combine kernel). With one split the kernel normalises and writes the
//    output itself (no workspace).
//  - Sliding window (AttentionBatch::sliding_window W > 0): a sequence's key range is the
//    window's, [VisibleKeyBegin(context_len, W), context_len] (kernels/paged_kv.h), in the
//    64-key tiles from the one holding its first key; the tiles left of it are never read, and
//    splits divide the window's tiles only. The keys left of the window in its first tile are
//    masked by a warp-uniform branch taken in that tile alone (so W = 0 runs today's code).
//    The selector sizes splits by the window's tiles (KeysRead: a function of max_num_keys and
//    W, so the grid is fixed for a captured shape).
//  - SelectSplits picks the split count from the batch shape, the SM count and the occupancy
//    of the config: the count with the smallest estimated time waves × (tiles per split +
//    per-CTA overhead), ties to more splits, so few-CTA shapes fill every resident slot (or
//    whole waves) while each split keeps >= 2 tiles.
//  - Programmatic dependent launch (kernels/cuda/common/launch.h): the kernel triggers its
//    dependents first thing. The CTA kernel then runs its prologue (context length, page
//    indices, the first kStages - 1 tiles' K/V rows except the sequence's newest key) before
//    PdlWait, so those round trips overlap the previous kernel's tail (batch-1 decode: the
//    q|k|v GEMV's); after the wait it loads Q and copies the newest key's row (launch.h's named
//    exception; SetDecodeKvBeforeWait(false): it waits first). The
//    warp-item kernels wait before their first global read.
//  - Prologue: the context length, then the page indices of the first kStages - 1 tiles as ONE
//    cp.async group (v2 loaded them with plain loads tile by tile, dependent round trips before
//    the first K/V copy could be issued), then those tiles' copies, then the Q fragment.
// FP8 (e4m3) caches (KvCacheFormat::fp8, kFp8): the same kernel reading half the bytes. The
// tiles stay e4m3 in shared memory; ldmatrix fragments are converted in registers (exact: every
// e4m3 value is an fp16 value) and the tensor cores run in fp16 (q converted once, saturating);
// k_scale is folded into the softmax scale, v_scale into the output normalisation. Each warp
// streams its own 16 keys of a tile with its own page indices and warp barriers only, and 4
// CTAs share an SM (3 stages, registers capped at 128). The ladder that got here (bench/
// RESULTS.md, "FP8 KV cache on the H200"): a dequantize pass into an fp16 tile behind CTA
// barriers ran at the bf16 time (1.00x: instruction- and latency-bound, not memory-bound);
// registers-only conversion 0.66-0.76x; cvt fed register halves + lazy rescale 0.58-0.61x.
// FP8 with GQA groups <= 8 (the default there): the transposed per-warp step (WarpKeysStepT):
// keys on the mma's M = 16 rows and the query heads on its N = 8 columns (S^T = K·Q^T, P^T
// transposed into the B operand by movmatrix, O^T = V^T·P^T), half the mma instructions and fp32
// accumulators of the step above, whose padded query rows wasted >= half of M. The fp8 decode was
// bound by the per-warp instruction chain, not by bytes in flight (Nsight Compute; bench/
// RESULTS.md "Decode attention v4 / v4T"): 64 × 16k went from 0.89 to 1.00 of copy, 512 × 1k
// from 0.79 to 0.92.
// head_dim 256 (Gemma 3): the same kernel with 3 stages of 64 KiB (bf16 / fp16: 192 KiB, 1 CTA
// per SM) or 32 KiB (fp8: 2 CTAs per SM; its steps as at 128, 144 registers transposed). With
// 2-byte caches the original step keeps the Q fragment (64 registers) and O (128) in registers
// (255 registers, no spills) and reaches only 0.71 of copy bandwidth at 64 × 8k: each SM's 4
// warps, one per scheduler, run 64 mma per 16 keys with nothing to hide their latency. For GQA
// groups <= 8 (kAuto) the default is the transposed step over the 2-byte tiles
// (WarpKeysStepT16: keys as the mma's M, heads as its N, half the mma) on 8 warps: two per 16
// keys of a tile, each computing S and the softmax state for them and P·V for half of the
// head dims (DecodeTraits' kDimSplit = 2; 149 registers): 1.04 / 1.05 of copy at 64 × 8k / 32k
// (bench/results/hd256-h200/). The warp-item kernels stay at 64 / 128.
// Instantiations: DecodeKernel {bf16, fp16} × {64, 128, 256} × {cache dtype, fp8, fp8
// transposed} + {bf16, fp16} × 256 transposed = 20, DecodeItemsKernel {bf16, fp16} × {64, 128} ×
// {original, transposed step} = 8. One file for one kernel family: both kernels' instantiations
// share the per-warp steps (WarpKeysStep, WarpKeysStepT), the copies (StagePages, IssueKvRows), the
// fragment loads and the swizzle, and the host side (SelectSplits, LaunchDecode) picks among them;
// split, those device functions would move to a header that only this family includes.
//
// Test:  ninja -C build decode_attention_gpu_test &&
//        (cd build && ctest -L gpu -R decode_attention)
//        e4m3 caches: the kv_fp8*_gpu_test targets, then ctest -L gpu -R kv_fp8
// Bench: ninja -C build bench_decode_attention_gpu && ./build/bench_decode_attention_gpu
//        (bf16 and e4m3 caches: --kv both, the default)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/online_softmax.h"

namespace llm::cuda {
namespace {

constexpr int kMaxSplits = 128;  // split cap

// Tile configuration per head_dim and cache format (kFp8: e4m3 pools, 1 byte per element).
// kDimSplit: warps that share each warp's 16 keys, each computing S for them and P·V for 1 /
// kDimSplit of the head dims (2: the transposed 2-byte step at head_dim 256, 8 warps).
template <int kHeadDim, bool kFp8 = false, int kDimSplit = 1>
struct DecodeTraits {
  static constexpr int kKeyWarps = 4;  // warps along a tile's keys
  static constexpr int kDimSplits = kDimSplit;
  static constexpr int kWarps = kKeyWarps * kDimSplit;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeysPerWarp = 16;                     // one k16 step of P·V per tile
  static constexpr int kTileKeys = kKeyWarps * kKeysPerWarp;  // 64 keys per pipeline stage
  static_assert(kMaxKeyTile % kTileKeys == 0,
                "FirstKeyRead (kernels/paged_kv.h): every key tile divides the widest");
  static constexpr int kElemBytes = kFp8 ? 1 : 2;  // bytes per cached element
  // K+V stages in flight: 96 KiB / 64 KiB (bf16, hd 128 / 64: 2 / 3 CTAs per SM); fp8 4 / 6
  // stages of half the bytes (64 / 48 KiB: 3 CTAs per SM, what its registers allow).
  // head_dim 256: 3 stages of 64 KiB (192 KiB, 1 CTA per SM; 128 KiB in flight per SM, far
  // above what the SM's share of HBM bandwidth needs); fp8 3 of 32 KiB (2 CTAs per SM).
  static constexpr int kStages = kFp8 ? (kHeadDim == 64 ? 6 : 3) : (kHeadDim == 64 ? 4 : 3);
  // __launch_bounds__: fp8 caps registers at 128 (4 CTAs per SM) up to head_dim 128; at 256 its
  // accumulators need more (2 CTAs per SM, which its shared memory allows anyway).
  static constexpr int kMinCtasPerSm = kFp8 ? (kHeadDim == 256 ? 2 : 4) : 1;
  static constexpr int kChunksPerRow = kHeadDim * kElemBytes / 16;  // 16-byte copies per row
  static constexpr int kChunkElems = 16 / kElemBytes;               // elements per copy
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kPasses = kTileKeys / kRowsPerPass;  // cp.async per thread per K tile
  static constexpr int kTileElems = kTileKeys * kHeadDim;   // one K (or V) tile
  static constexpr size_t kStageBytes = size_t(2) * kTileElems * kElemBytes;  // K + V as cached
  static constexpr int kKSteps = kHeadDim / 16;        // k16 steps of Q·Kᵀ
  static constexpr int kNTiles = kHeadDim / 8;         // n8 tiles of the output
  static constexpr int kPageSlots = 2 * kStages;       // page-index ring (see kernel)
  static constexpr int kPageSlotInts = kTileKeys + 2;  // pages one tile can touch (bs>=1)
  static constexpr int kRows = 16;                     // mma M: query rows, padded
  static constexpr int kRedStride = kHeadDim + 8;  // fp32 epilogue row, padded vs bank conflicts
  static constexpr size_t kKvSmemBytes = size_t(kStages) * kStageBytes;
  // fp8: every warp streams only its own 16 keys of each tile (its rows of the stages, of the
  // fp16 tile and its own page-index ring), so the main loop needs no CTA barrier.
  static constexpr int kWarpRowsPerPass = 32 / kChunksPerRow;  // fp8: rows per warp-wide pass
  static constexpr int kWarpPageInts = kKeysPerWarp + 2;       // pages 16 keys can touch
  static constexpr size_t kPageBytes = kFp8 ? size_t(kWarps) * kPageSlots * kWarpPageInts * 4
                                            : size_t(kPageSlots) * kPageSlotInts * 4;
  static constexpr size_t kSmemBytes = kKvSmemBytes + kPageBytes;
  // Epilogue reuse of the K/V stages: the 4 key warps' fp32 accumulators for the cross-warp
  // merge (the dim-split warps of one key warp write disjoint dims of its row).
  static constexpr size_t kRedBytes = size_t(kKeyWarps) * kRows * kRedStride * 4;

  static_assert(kHeadDim % 64 == 0, "the XOR swizzle permutes 8 chunks of 16 bytes per row");
  static_assert(kThreads % kChunksPerRow == 0 && kTileKeys % kRowsPerPass == 0,
                "a K/V tile is a whole number of cp.async passes");
  static_assert(kStages >= 2, "the pipeline keeps kStages - 1 tiles in flight");
  static_assert(kRedBytes <= kKvSmemBytes,
                "the epilogue reuses the K/V stages for the cross-warp merge");
  static_assert(kHeadDim % 4 == 0, "the split merge works in float4s");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM's shared memory");
  static_assert(!kFp8 || kMinCtasPerSm * (kSmemBytes + 1024 + 640) <= 228 * 1024,
                "fp8: kMinCtasPerSm CTAs per SM");
  static_assert(!kFp8 || kWarpRowsPerPass * kPasses == kKeysPerWarp,
                "fp8: a warp's passes cover exactly its 16 keys");
  static_assert(kDimSplit == 1 || (!kFp8 && kHeadDim % (16 * kDimSplit) == 0),
                "dim split: 2-byte tiles, whole m16 tiles of O^T per warp");
};

// The CTA kernel's dim split: 2 for the transposed step over 2-byte tiles (head_dim 256), else 1.
template <bool kFp8, bool kT>
inline constexpr int kDecodeDimSplit = !kFp8 && kT ? 2 : 1;

struct KernelArgs {
  const void* q;  // [num_seqs, num_heads, D]
  void* out;      // [num_seqs, num_heads, D]
  const void* k;  // pools [num_blocks, num_kv_heads, block_size, D]
  const void* v;
  const int32_t* context_lens;  // [num_seqs]
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq;
  int64_t block_stride;  // elements
  int64_t head_stride;   // elements
  int block_size;
  int block_shift;  // log2(block_size) when a power of two, else -1
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int group;
  int num_splits;
  int sliding_window;  // AttentionBatch::sliding_window (0: every key; CTA kernel only)
  float scale_log2;    // scale · log2(e) (fp8: · k_scale)
  float out_scale;     // 1, or the fp8 cache's v_scale
  float* part_acc;     // [num_seqs, num_heads, num_splits, D] (num_splits > 1)
  float* part_ml;      // [num_seqs, num_heads, num_splits, 2]  (m, l)
  unsigned* counters;  // [num_seqs * num_kv_heads] arrivals, zero between calls (num_splits > 1)
  int kv_before_wait;  // SetDecodeKvBeforeWait: the prologue's copies before PdlWait
};

// ---- the instructions (kernels/cuda/common/ptx.cuh) and conversions (vec.cuh) ----------
using ptx::CpAsync16;  // 16-byte global -> shared copy through L2; 0 source bytes zero-fill
using ptx::CpAsync4;
using ptx::CpAsyncCommit;
using ptx::CpAsyncWait;
using ptx::LdMatrixX4;
using ptx::LdMatrixX4Trans;
using ptx::Mma16816;  // D[16x8] += A[16x16] · B[16x8], fp32 accumulation
using ptx::MovMatrixTrans;
using ptx::PrefetchL2;
using ptx::SmemAddr;
using vec::E4m3x4ToHalf2x2;  // e4m3 codes -> fp16 pairs, exactly (kernels/cuda/common/vec.cuh)
using vec::PackPair;   // two fp32 -> a packed pair (lo in the low half, as mma fragments expect)
using vec::ToMmaPair;  // a packed pair of T as one of the mma type (fp8: fp16, saturated)

// Two transposed fp8 V matrices of one chunk (ldmatrix.trans: t0 = keys 2c, 2c + 1 and t1 =
// keys 8 + 2c, 8 + 2c + 1, each × dims 2g, 2g + 1, low key first) as fp16 key pairs: one byte
// permute per matrix makes the even-dim pair (bytes 0, 2) the low half and the odd-dim pair
// (bytes 1, 3) the high half, then an exact e4m3 -> fp16 conversion.
__device__ __forceinline__ void VPairsFp8(uint32_t t0, uint32_t t1, uint32_t& even0, uint32_t& odd0,
                                          uint32_t& even1, uint32_t& odd1) {
  E4m3x4ToHalf2x2(__byte_perm(t0, 0u, 0x3120u), even0, odd0);
  E4m3x4ToHalf2x2(__byte_perm(t1, 0u, 0x3120u), even1, odd1);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled fp8 tile (defined below).
template <int D>
__device__ __forceinline__ int SwizzledOffsetFp8(int row, int chunk);

// The 16-byte chunks (16 head dims) of a warp's 16 rows of an fp8 K or V tile, two per x4
// ldmatrix (kTrans: .trans), lanes 8i..8i+7 addressing rows (keys 0-7, 8-15, 0-7, 8-15) at
// `row8` of chunk pair j: f(chunk, {keys 0-7 matrix, keys 8-15 matrix}) for each chunk in turn.
template <int D, bool kTrans, typename F>
__device__ __forceinline__ void ForEachChunkFp8(uint32_t tile, int row8, int lane, F&& f) {
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    uint32_t b[4];
    if constexpr (kTrans) {
      LdMatrixX4Trans(b, tile + SwizzledOffsetFp8<D>(row8, 2 * j + (lane >> 4)));
    } else {
      LdMatrixX4(b, tile + SwizzledOffsetFp8<D>(row8, 2 * j + (lane >> 4)));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t t[2] = {b[2 * h], b[2 * h + 1]};
      f(2 * j + h, t);
    }
  }
}

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows, D] tile: chunks
// are XOR-permuted by row % 8 so that 8 consecutive rows at one logical chunk (an ldmatrix
// 8x8 matrix) hit 8 different 16-byte bank groups.
template <int D>
__device__ __forceinline__ int SwizzledOffset(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled fp8 [rows, D] tile (D bytes
// per row: 16 chunks at D = 256, 8 at D = 128, 4 at D = 64), such that the 8 rows one ldmatrix
// 8x8 matrix reads (8 consecutive rows, one logical chunk) hit 8 different 16-byte bank groups.
template <int D>
__device__ __forceinline__ int SwizzledOffsetFp8(int row, int chunk) {
  if constexpr (D >= 128) {
    return row * D + ((chunk ^ (row & 7)) << 4);
  } else {
    return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
  }
}

// ---- the pipeline's copies -----------------------------------------------------------------
__device__ __forceinline__ int PageOf(const KernelArgs& a, int key) {
  return a.block_shift >= 0 ? key >> a.block_shift : key / a.block_size;
}

// The page indices of keys k0 .. k1 (k1 < k0: none) of the sequence whose block-table row is
// `table` -> slot[0 ..], by cp.async (4 bytes each), thread `me` of `threads`.
// l2_only: plain loads that bypass L1 (ld.global.cg) and shared stores instead, for the reads
// before PdlWait (L1 is not coherent; the step's inputs change every step).
__device__ __forceinline__ void StagePages(const KernelArgs& a, const int32_t* table, int k0,
                                           int k1, int* slot, int me, int threads, bool l2_only) {
  if (k1 < k0) return;
  const int first = PageOf(a, k0);
  const int count = PageOf(a, k1) - first + 1;
  for (int i = me; i < count; i += threads) {
    if (l2_only) {
      slot[i] = __ldcg(table + first + i);
    } else {
      CpAsync4(SmemAddr(slot + i), table + first + i);
    }
  }
}

// K and V rows of one pipeline stage by cp.async, straight into the swizzled tiles at k_dst /
// v_dst that ldmatrix reads: thread `me` copies 16-byte chunk me % kChunksPerRow of tile rows
// row0 + me / kChunksPerRow + step·p (step: kRowsPerPass for a CTA-wide copy from row0 = 0,
// kWarpRowsPerPass for fp8's per-warp copy of its 16 rows from row0 = 16·warp), key k0 + row;
// keys >= key_end are zero-filled. slot holds the page indices from page first_page on.
// The row of key `newest` (>= 0) is left out (kKvAllRows) or is the only one issued
// (kKvNewestRow): before PdlWait the kernel before this one may still be writing it.
enum KvRows { kKvAllRows, kKvNewestRow };
template <typename T, int D, bool kFp8, typename Tr = DecodeTraits<D, kFp8>>
__device__ __forceinline__ void IssueKvRows(const KernelArgs& a, const unsigned char* k_head,
                                            const unsigned char* v_head, const int* slot,
                                            int first_page, int k0, int key_end, int row0, int me,
                                            uint32_t k_dst, uint32_t v_dst, int newest = -1,
                                            KvRows rows = kKvAllRows) {
  constexpr int kStep = kFp8 ? Tr::kWarpRowsPerPass : Tr::kRowsPerPass;
  const int chunk = me % Tr::kChunksPerRow;
#pragma unroll
  for (int p = 0; p < Tr::kPasses; ++p) {
    const int row = row0 + me / Tr::kChunksPerRow + p * kStep;
    const int key = k0 + row;
    if ((key == newest) != (rows == kKvNewestRow)) continue;
    const bool valid = key < key_end;
    int64_t off = 0;
    if (valid) {
      const int page = PageOf(a, key);
      const int64_t block = slot[page - first_page];
      off = (block * a.block_stride + int64_t(key - page * a.block_size) * D +
             chunk * Tr::kChunkElems) *
            Tr::kElemBytes;
    }
    const uint32_t dst_off = kFp8 ? uint32_t(SwizzledOffsetFp8<D>(row, chunk))
                                  : SwizzledOffset<D>(row, chunk) * uint32_t(sizeof(T));
    CpAsync16(k_dst + dst_off, k_head + off, valid ? 16 : 0);
    CpAsync16(v_dst + dst_off, v_head + off, valid ? 16 : 0);
  }
}

// Q fragment (A operand, rows = query heads of the group, padded with zeros to 16):
//   qa[s] = {Q[g][16s+2c..], Q[g+8][16s+2c..], Q[g][16s+8+2c..], Q[g+8][16s+8+2c..]}
// with g = lane / 4, c = lane % 4 (fp8: the permuted head dims, see DecodeKernel), converted
// to the tensor-core type.
template <typename T, int D, bool kFp8>
__device__ __forceinline__ void LoadQFragment(const KernelArgs& a, int seq, int kv_head, int lane,
                                              uint32_t (&qa)[D / 16][4]) {
  using M = std::conditional_t<kFp8, __half, T>;
  const int g = lane >> 2;
  const int c = lane & 3;
  const T* q_group =
      static_cast<const T*>(a.q) + (int64_t(seq) * a.num_heads + kv_head * a.group) * D;
  const uint32_t* row0 = reinterpret_cast<const uint32_t*>(q_group + g * D);
  const uint32_t* row1 = reinterpret_cast<const uint32_t*>(q_group + (g + 8) * D);
  const bool has0 = g < a.group;
  const bool has1 = g + 8 < a.group;
  // fp8: the permuted head dims: logical 2c.. -> 16s + 4c, 2c+8.. -> 16s + 4c + 2.
  constexpr int kLo = kFp8 ? 4 : 2, kHi = kFp8 ? 2 : 8;
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    const int lo = (16 * s + kLo * c) / 2, hi = (16 * s + kLo * c + kHi) / 2;
    qa[s][0] = has0 ? ToMmaPair<T, M>(row0[lo]) : 0u;
    qa[s][1] = has1 ? ToMmaPair<T, M>(row1[lo]) : 0u;
    qa[s][2] = has0 ? ToMmaPair<T, M>(row0[hi]) : 0u;
    qa[s][3] = has1 ? ToMmaPair<T, M>(row1[hi]) : 0u;
  }
}

// One warp's 16 keys of a tile (rows warp_row .. warp_row + 15 of the K and V tiles at
// k_tile / v_tile, keys warp_key0 .. warp_key0 + 15; those >= key_end, and with a sliding
// window those < key_lo, are masked): S = Q·Kᵀ, the online-softmax update of (m, l) and
// O += P·V, on the fragments DecodeKernel describes. Shared by DecodeKernel and
// DecodeItemsKernel. key_lo > warp_key0 only in the window's first tile (a warp-uniform
// branch; never taken without a window, key_lo = 0); a warp whose 16 keys are all left of the
// window keeps m = -inf and adds nothing (online_softmax.h's conventions).
template <typename T, int D, bool kFp8>
__device__ __forceinline__ void WarpKeysStep(const uint32_t (&qa)[D / 16][4], uint32_t k_tile,
                                             uint32_t v_tile, int lane, int warp_row, int warp_key0,
                                             int key_end, float scale_log2, float (&m)[2],
                                             float (&l)[2], float (&o)[D / 8][4], int key_lo = 0) {
  using Tr = DecodeTraits<D, kFp8>;
  using M = std::conditional_t<kFp8, __half, T>;
  const int c = lane & 3;
  // ldmatrix row addressing: lanes 8i..8i+7 give the rows of 8x8 matrix i.
  // K (non-transposed): matrices {keys 0-7, keys 0-7, keys 8-15, keys 8-15} × {chunk, chunk+1}.
  const int k_row = warp_row + ((lane >> 4) << 3) + (lane & 7);
  const int k_chunk_lo = (lane >> 3) & 1;
  // V (transposed): matrices {keys 0-7, keys 8-15, keys 0-7, keys 8-15} × {chunk, chunk, +1, +1}.
  const int v_row = warp_row + (((lane >> 3) & 1) << 3) + (lane & 7);
  const int v_chunk_lo = lane >> 4;
  // fp8 tiles: lanes 8i..8i+7 address rows (keys 0-7, 8-15, 0-7, 8-15) of the warp's 16.
  const int k8_row = warp_row + (((lane >> 3) & 1) << 3) + (lane & 7);
  const int v8_row = k8_row;

  // S = Q·Kᵀ: s[n] covers keys 8n..8n+7 of this warp's 16; fp32.
  float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  if constexpr (kFp8) {
    // Chunk = k16 step (16 codes); t[n] = keys 8n..8n+7.
    ForEachChunkFp8<D, false>(k_tile, k8_row, lane, [&](int ks, const uint32_t(&t)[2]) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        uint32_t b0, b1;
        E4m3x4ToHalf2x2(t[n], b0, b1);
        Mma16816<M>(s[n], qa[ks], b0, b1);
      }
    });
  } else {
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks) {
      uint32_t b[4];
      LdMatrixX4(b, k_tile + SwizzledOffset<D>(k_row, 2 * ks + k_chunk_lo) * sizeof(M));
      Mma16816<M>(s[0], qa[ks], b[0], b[1]);
      Mma16816<M>(s[1], qa[ks], b[2], b[3]);
    }
  }

  // Online softmax (log2 domain), mirroring OnlineSoftmax::Update per row.
  const int key0 = warp_key0 + 2 * c;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool visible = key0 + 8 * n + (e & 1) < key_end;
      s[n][e] = visible ? s[n][e] * scale_log2 : -INFINITY;
    }
  }
  if (warp_key0 < key_lo) {  // the sliding window's first tile: keys left of it
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (key0 + 8 * n + (e & 1) < key_lo) s[n][e] = -INFINITY;
  }
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e >> 1] = Max(tile_max[e >> 1], s[n][e]);
  }
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = Max(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = Max(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float m_new = Max(m[r], tile_max[r]);
    alpha[r] = m_new == -INFINITY ? 1.f : exp2f(m[r] - m_new);
    m[r] = m_new;
    l[r] *= alpha[r];
  }
  const float offset[2] = {m[0] == -INFINITY ? 0.f : m[0], m[1] == -INFINITY ? 0.f : m[1]};
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = exp2f(s[n][e] - offset[e >> 1]);
      l[e >> 1] += s[n][e];
    }
  }
  // Rescale the accumulators only when some row's max moved in this warp (alpha != 1; once
  // the max has settled, most tiles skip these kNTiles × 4 multiplies; multiplying by 1 is
  // exact, so the result is the same either way).
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int n = 0; n < Tr::kNTiles; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
  }

  // O += P·V: P is the A operand straight from the S accumulators (rows g / g+8, keys
  // 2c.., 8+2c..); V through ldmatrix.trans, two n8 tiles of head_dim per x4.
  const uint32_t pa[4] = {PackPair<M>(s[0][0], s[0][1]), PackPair<M>(s[0][2], s[0][3]),
                          PackPair<M>(s[1][0], s[1][1]), PackPair<M>(s[1][2], s[1][3])};
  if constexpr (kFp8) {
    // Transposed chunks (VPairsFp8); output tile 2ch + p is (chunk ch, parity p).
    ForEachChunkFp8<D, true>(v_tile, v8_row, lane, [&](int ch, const uint32_t(&t)[2]) {
      uint32_t even0, odd0, even1, odd1;  // keys 2c.. (t[0]) and 8 + 2c.. (t[1])
      VPairsFp8(t[0], t[1], even0, odd0, even1, odd1);
      Mma16816<M>(o[2 * ch], pa, even0, even1);
      Mma16816<M>(o[2 * ch + 1], pa, odd0, odd1);
    });
  } else {
#pragma unroll
    for (int n2 = 0; n2 < Tr::kNTiles / 2; ++n2) {
      uint32_t b[4];
      LdMatrixX4Trans(b, v_tile + SwizzledOffset<D>(v_row, 2 * n2 + v_chunk_lo) * sizeof(M));
      Mma16816<M>(o[2 * n2], pa, b[0], b[1]);
      Mma16816<M>(o[2 * n2 + 1], pa, b[2], b[3]);
    }
  }
}

// ---- the transposed per-warp step (fp8, GQA groups <= 8) ---------------------------------
// S^T[16 keys × 8 heads] = K · Q^T and O^T[D × 8 heads] += V^T · P^T: the keys (and head dims)
// take the mma's M = 16 rows and the query heads its N = 8 columns, so a group of <= 8 heads
// pads to 8 instead of 16: per 16 keys 8 + 8 mma instead of 16 + 16 (head_dim 128), 32 fp32
// accumulators instead of 64 and a 16-register Q^T fragment instead of 32.
//  - A = K from the same ldmatrix (non-transposed, fp8 pairs) as WarpKeysStep: thread (g, c)
//    gets key g (and g + 8) × codes 4c..4c+3 of a 16-dim chunk, i.e. with the permuted head
//    dims (logical 2c, 2c+1 = physical 4c, 4c+1; 2c+8, 2c+9 = 4c+2, 4c+3) exactly the A
//    fragment {key g lo, key g+8 lo, key g hi, key g+8 hi}.
//  - B = Q^T: b0 / b1 = Q[head g][physical 16ks + 4c + {0,1} / {2,3}] (0 for heads >= group).
//  - S^T accumulators: keys g / g + 8 × heads 2c, 2c + 1. The softmax state is per head: m, l
//    for heads 2c and 2c + 1, reduced over the keys across lanes of equal c (xor 4, 8, 16).
//  - P^T as the B operand of the second mma: the 8x8 blocks {keys 0-7, 8-15} × heads, packed to
//    fp16 pairs, are transposed in registers by movmatrix: thread (g, c) then holds keys 2c,
//    2c+1 (+ 8) of head g, the B fragment.
//  - A = V^T from WarpKeysStep's ldmatrix.trans + byte permute: rows g / g + 8 of the m16 tile
//    of chunk h are its dims 2g / 2g + 1 (even / odd), keys 2c.. / 2c+8.. as k.
//  - O^T accumulators o[h]: dims 16h + 2g (elements 0, 1) and 16h + 2g + 1 (2, 3) × heads 2c,
//    2c + 1 (elements 0, 2 / 1, 3).

// The transposed step's per-head sums: x over the 8 lanes of equal c (the keys g of a tile).
__device__ __forceinline__ float SumOverKeyLanes(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

template <typename T, int D>
__device__ __forceinline__ void LoadQTFragment(const KernelArgs& a, int seq, int kv_head, int lane,
                                               uint32_t (&qb)[D / 16][2]) {
  const int g = lane >> 2;
  const int c = lane & 3;
  const T* q_head =
      static_cast<const T*>(a.q) + (int64_t(seq) * a.num_heads + kv_head * a.group + g) * D;
  const uint32_t* row = reinterpret_cast<const uint32_t*>(q_head);
  const bool has = g < a.group;
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    qb[s][0] = has ? ToMmaPair<T, __half>(row[(16 * s + 4 * c) / 2]) : 0u;
    qb[s][1] = has ? ToMmaPair<T, __half>(row[(16 * s + 4 * c + 2) / 2]) : 0u;
  }
}

// The transposed steps' online softmax (WarpKeysStepT, WarpKeysStepT16): S^T's accumulator holds
// heads 2c, 2c + 1 (r = 0, 1) × keys g (s[r]) and g + 8 (s[2 + r]) of the warp's 16 keys from
// warp_key0; keys outside [key_lo, key_end) (key_lo: the sliding window's first key, masked in
// its first tile only) are masked; s becomes P, (m, l) move on, alpha[r] is head r's rescale of
// O. Returns whether any lane must rescale.
__device__ __forceinline__ bool TransposedSoftmax(float (&s)[4], float (&m)[2], float (&l)[2],
                                                  float (&alpha)[2], int g, int warp_key0,
                                                  int key_lo, int key_end, float scale_log2) {
  bool vis0 = warp_key0 + g < key_end, vis1 = warp_key0 + g + 8 < key_end;
  if (warp_key0 < key_lo) {  // the sliding window's first tile (as WarpKeysStep)
    vis0 = vis0 && warp_key0 + g >= key_lo;
    vis1 = vis1 && warp_key0 + g + 8 >= key_lo;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    s[r] = vis0 ? s[r] * scale_log2 : -INFINITY;
    s[2 + r] = vis1 ? s[2 + r] * scale_log2 : -INFINITY;
    float t = Max(s[r], s[2 + r]);
    t = Max(t, __shfl_xor_sync(0xffffffffu, t, 4));
    t = Max(t, __shfl_xor_sync(0xffffffffu, t, 8));
    t = Max(t, __shfl_xor_sync(0xffffffffu, t, 16));
    const float m_new = Max(m[r], t);
    alpha[r] = m_new == -INFINITY ? 1.f : exp2f(m[r] - m_new);
    m[r] = m_new;
    const float off = m_new == -INFINITY ? 0.f : m_new;
    s[r] = exp2f(s[r] - off);
    s[2 + r] = exp2f(s[2 + r] - off);
    l[r] = l[r] * alpha[r] + s[r] + s[2 + r];
  }
  return __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f);
}

template <int D>
__device__ __forceinline__ void WarpKeysStepT(const uint32_t (&qb)[D / 16][2], uint32_t k_tile,
                                              uint32_t v_tile, int lane, int warp_row,
                                              int warp_key0, int key_end, float scale_log2,
                                              float (&m)[2], float (&l)[2], float (&o)[D / 16][4],
                                              int key_lo = 0) {
  const int g = lane >> 2;
  const int row8 = warp_row + (((lane >> 3) & 1) << 3) + (lane & 7);  // as WarpKeysStep's k8_row
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  // (Explicit loops, not ForEachChunkFp8: through it ptxas schedules this step differently,
  // and the measured binary is this one.)
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    uint32_t b[4];
    LdMatrixX4(b, k_tile + SwizzledOffsetFp8<D>(row8, 2 * j + (lane >> 4)));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t lo0, hi0, lo1, hi1;
      E4m3x4ToHalf2x2(b[2 * h], lo0, hi0);      // key g
      E4m3x4ToHalf2x2(b[2 * h + 1], lo1, hi1);  // key g + 8
      const uint32_t ka[4] = {lo0, lo1, hi0, hi1};
      Mma16816<__half>(s, ka, qb[2 * j + h][0], qb[2 * j + h][1]);
    }
  }
  float alpha[2];
  if (TransposedSoftmax(s, m, l, alpha, g, warp_key0, key_lo, key_end, scale_log2)) {
#pragma unroll
    for (int h = 0; h < D / 16; ++h) {
      o[h][0] *= alpha[0];
      o[h][1] *= alpha[1];
      o[h][2] *= alpha[0];
      o[h][3] *= alpha[1];
    }
  }
  const uint32_t pb0 = MovMatrixTrans(PackPair<__half>(s[0], s[1]));  // keys 2c, 2c+1 of head g
  const uint32_t pb1 = MovMatrixTrans(PackPair<__half>(s[2], s[3]));  // keys 2c+8, 2c+9
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    uint32_t b[4];
    LdMatrixX4Trans(b, v_tile + SwizzledOffsetFp8<D>(row8, 2 * j + (lane >> 4)));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t even0, odd0, even1, odd1;  // keys 2c.. (b[2h]) and 8 + 2c.. (b[2h + 1])
      VPairsFp8(b[2 * h], b[2 * h + 1], even0, odd0, even1, odd1);
      const uint32_t va[4] = {even0, odd0, even1, odd1};
      Mma16816<__half>(o[2 * j + h], va, pb0, pb1);
    }
  }
}

// ---- the transposed step over 2-byte caches (bf16 / fp16, head_dim 256, groups <= 8) -------
// WarpKeysStepT's layout without the fp8 permutations: S^T[16 keys × 8 heads] = K · Q^T with K
// as the A operand straight from a non-transposed ldmatrix of the swizzled tile (matrices {keys
// 0-7, 8-15} × {chunk 2ks, 2ks + 1}), Q^T as B (b0 / b1 = Q[head g][16ks + 2c.. / 16ks + 2c +
// 8..]); P^T by movmatrix as in WarpKeysStepT; O^T[D × 8 heads] += V^T · P^T with V^T as the A
// operand from ldmatrix.trans (matrices {keys 0-7, 8-15} × {chunk 2h, 2h + 1}, giving thread (g,
// c) dims 16h + g (+ 8) × keys 2c.. (+ 8)). Accumulators o[h]: dims 16h + g (elements 0, 1) and
// 16h + 8 + g (2, 3) × heads 2c, 2c + 1. At head_dim 256 this halves the original step's mma
// (16 + 16 per 16 keys instead of 32 + 32), its O registers (64 instead of 128) and Q's (32
// instead of 64); the Q·K^T chain runs on two accumulators (even / odd k16 steps) for ILP.
template <typename T, int D>
__device__ __forceinline__ void LoadQTFragment16(const KernelArgs& a, int seq, int kv_head,
                                                 int lane, uint32_t (&qb)[D / 16][2]) {
  const int g = lane >> 2;
  const int c = lane & 3;
  const T* q_head =
      static_cast<const T*>(a.q) + (int64_t(seq) * a.num_heads + kv_head * a.group + g) * D;
  const uint32_t* row = reinterpret_cast<const uint32_t*>(q_head);
  const bool has = g < a.group;
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    qb[s][0] = has ? row[(16 * s + 2 * c) / 2] : 0u;
    qb[s][1] = has ? row[(16 * s + 2 * c + 8) / 2] : 0u;
  }
}

// kParts > 1: this warp's P·V covers dims [part · D / kParts, (part + 1) · D / kParts) only
// (o[h] is m16 tile h of that range); S and the softmax state are computed whole by each part.
template <typename T, int D, int kParts>
__device__ __forceinline__ void WarpKeysStepT16(const uint32_t (&qb)[D / 16][2], uint32_t k_tile,
                                                uint32_t v_tile, int lane, int warp_row,
                                                int warp_key0, int key_end, float scale_log2,
                                                float (&m)[2], float (&l)[2],
                                                float (&o)[D / 16 / kParts][4], int key_lo,
                                                int part) {
  constexpr int kOTiles = D / 16 / kParts;
  const int g = lane >> 2;
  const int k_row = warp_row + (((lane >> 3) & 1) << 3) + (lane & 7);
  const int k_chunk_hi = lane >> 4;
  const int v_row = warp_row + ((lane >> 4) << 3) + (lane & 7);
  const int v_chunk_lo = (lane >> 3) & 1;
  float s[4] = {0.f, 0.f, 0.f, 0.f}, s_odd[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t ka[4];
    LdMatrixX4(ka, k_tile + SwizzledOffset<D>(k_row, 2 * ks + k_chunk_hi) * sizeof(T));
    Mma16816<T>((ks & 1) ? s_odd : s, ka, qb[ks][0], qb[ks][1]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) s[e] += s_odd[e];
  float alpha[2];
  if (TransposedSoftmax(s, m, l, alpha, g, warp_key0, key_lo, key_end, scale_log2)) {
#pragma unroll
    for (int h = 0; h < kOTiles; ++h) {
      o[h][0] *= alpha[0];
      o[h][1] *= alpha[1];
      o[h][2] *= alpha[0];
      o[h][3] *= alpha[1];
    }
  }
  const uint32_t pb0 = MovMatrixTrans(PackPair<T>(s[0], s[1]));  // keys 2c, 2c+1 of head g
  const uint32_t pb1 = MovMatrixTrans(PackPair<T>(s[2], s[3]));  // keys 2c+8, 2c+9
  const int chunk0 = 2 * kOTiles * part + v_chunk_lo;
#pragma unroll
  for (int h = 0; h < kOTiles; ++h) {
    uint32_t va[4];
    LdMatrixX4Trans(va, v_tile + SwizzledOffset<D>(v_row, chunk0 + 2 * h) * sizeof(T));
    Mma16816<T>(o[h], va, pb0, pb1);
  }
}

// ---- the attention kernel ---------------------------------------------------------------
// Tiles [begin, begin + count) of `total` that split `split` of `splits` owns: balanced, the
// first total % splits splits take one tile more, so chunk sizes differ by at most one and the
// non-empty chunks are exactly splits 0 .. min(splits, total) - 1 (the merge reads those).
__device__ __forceinline__ void SplitTiles(int total, int splits, int split, int& begin,
                                           int& count) {
  const int base = total / splits;
  const int extra = total % splits;
  begin = split * base + min(split, extra);
  count = base + (split < extra ? 1 : 0);
}

// Grid: num_seqs × num_kv_heads × num_splits CTAs (flattened, split fastest); 128 threads.
// kFp8: e4m3 pools, read as they are: the tiles stay e4m3 in shared memory (half the bytes)
// and the tensor cores run in fp16 on fragments converted in registers (exact; q converted
// once, saturating; P rounded to fp16). ldmatrix moves 16-bit units, i.e. pairs of codes:
//  - K: a non-transposed 8x8 matrix of 8 keys × 16 bytes gives thread (g, c) key g, codes
//    4c..4c+3 of that 16-dim chunk. The head dimensions are permuted (identically in Q, which
//    is loaded once): k16 step ks's logical dims {2c, 2c+1} and {2c+8, 2c+9} are the physical
//    dims 16ks + 4c + {0, 1} and + {2, 3}, so b0 / b1 are the low / high code pairs.
//  - V: a transposed 8x8 matrix gives thread (g, c) keys 2c, 2c+1 × dims 2g, 2g+1 of the
//    chunk; a byte permute regroups them into {key 2c, key 2c+1} pairs for dim 2g (an "even"
//    n8 tile of the output) and for dim 2g + 1 (an "odd" one). The output columns are thus
//    permuted as well: tile (chunk h, parity p) column n is dim 16h + 2n + p; the epilogue
//    undoes it.
// kT (fp8, GQA groups <= 8): each warp's 16 keys go through WarpKeysStepT (keys as the mma's M,
// the heads as its N); its state is per head (2c, 2c + 1) and its accumulators O^T.
template <typename T, int D, bool kFp8, bool kT = false>
__global__ void __launch_bounds__(DecodeTraits<D, kFp8, kDecodeDimSplit<kFp8, kT>>::kThreads,
                                  DecodeTraits<D, kFp8>::kMinCtasPerSm)
    DecodeKernel(const __grid_constant__ KernelArgs a) {
  static_assert(!kT || kFp8 || D == 256, "the transposed step: fp8 tiles, or 2-byte ones at 256");
  using Tr = DecodeTraits<D, kFp8, kDecodeDimSplit<kFp8, kT>>;
  using M = std::conditional_t<kFp8, __half, T>;  // the tensor-core operand type
  extern __shared__ __align__(128) unsigned char smem[];
  // Stage s: K at s·kStageBytes, V after it (cached element type).
  unsigned char* kv_smem = smem;
  int* page_smem = reinterpret_cast<int*>(smem + Tr::kKvSmemBytes);  // [kPageSlots][slot ints]

  // PDL: let the next kernel start launching now (its PdlWait still waits for our completion).
  // With kv_before_wait the wait (a no-op without PDL) comes after the prologue's copies: the
  // context length, the block table and every key but the sequence's newest are the step's
  // inputs or earlier steps' rows, complete before the kernel before this one could launch us
  // (launch.h's named exception); q and the newest key's K/V row (the q|k|v projection's
  // append) are read after it, and nothing is written before it. Without it, first thing.
  PdlTrigger();
  const bool early = a.kv_before_wait != 0;
  if (!early) PdlWait();

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int split = blockIdx.x % a.num_splits;
  const int seq_head = blockIdx.x / a.num_splits;
  const int kv_head = seq_head % a.num_kv_heads;
  const int seq = seq_head / a.num_kv_heads;

  // Warm L2 with this CTA's share of the sequence's block-table row (the row's 128-byte lines
  // spread evenly over the splits): the page indices are read right after the context length
  // arrives, so they come from L2 instead of a second DRAM round trip in the prologue's chain
  // (context length -> page indices -> K/V).
  const int32_t* table = a.block_tables + seq * a.max_blocks_per_seq;
  {
    const int row_lines = int((a.max_blocks_per_seq * 4 + 127) / 128);
    const int per_split = (row_lines + a.num_splits - 1) / a.num_splits;
    const int line = split * per_split + tid;
    if (tid < per_split && line < row_lines) PrefetchL2(table + line * 32);
  }

  // This CTA's key range: whole 64-key tiles [tile_begin, tile_begin + num_tiles). With a
  // sliding window only the window's keys [first_key, num_keys) are split: its tiles start at
  // the one holding first_key (tiles stay 64-aligned; the keys left of first_key in that tile
  // are read and masked), the tiles left of it are never touched.
  const int num_keys = __ldcg(a.context_lens + seq) + 1;  // L2: may be before PdlWait
  const int first_key = int(VisibleKeyBegin(num_keys - 1, a.sliding_window));  // 0: no window
  const int first_tile = first_key / Tr::kTileKeys;
  const int total_tiles = (num_keys + Tr::kTileKeys - 1) / Tr::kTileKeys - first_tile;
  int tile_begin, num_tiles;
  SplitTiles(total_tiles, a.num_splits, split, tile_begin, num_tiles);
  const int key_begin = (first_tile + tile_begin) * Tr::kTileKeys;
  const int key_end = min(num_keys, key_begin + num_tiles * Tr::kTileKeys);

  // Byte pointers to this KV head's rows (element offsets × kElemBytes).
  const unsigned char* k_head =
      static_cast<const unsigned char*>(a.k) + kv_head * a.head_stride * Tr::kElemBytes;
  const unsigned char* v_head =
      static_cast<const unsigned char*>(a.v) + kv_head * a.head_stride * Tr::kElemBytes;
  // Who streams what. bf16 / fp16: the CTA streams each tile together (thread tid copies chunk
  // tid % kChunks of rows tid / kChunks + kRowsPerPass·p) and CTA barriers order the pipeline.
  // fp8: warp w streams only keys [16w, 16w + 16) of each tile, the keys it computes on (lane
  // copies chunk lane % kChunks of rows 16w + lane / kChunks + kWarpRowsPerPass·p), stages its
  // own page indices, and orders its pipeline with warp barriers: the warps run decoupled,
  // hiding each other's latency (the fp8 tile streams in half the bf16 time, so a CTA-wide
  // lockstep of copy, dequantize and compute would bound the kernel instead of the memory).
  constexpr int kGroupKeys = kFp8 ? Tr::kKeysPerWarp : Tr::kTileKeys;
  constexpr int kSlotInts = kFp8 ? Tr::kWarpPageInts : Tr::kPageSlotInts;
  // Key warp (its 16 keys of each tile) and dim part (Tr::kDimSplits > 1: which V dims).
  // (Spelled out for kDimSplits == 1 so that those kernels compile exactly as before the split.)
  const int key_warp = Tr::kDimSplits == 1 ? warp : warp % Tr::kKeyWarps;
  const int dim_part = Tr::kDimSplits == 1 ? 0 : warp / Tr::kKeyWarps;
  const int group_key0 = kFp8 ? key_warp * Tr::kKeysPerWarp : 0;  // the group's first key
  const int me = kFp8 ? lane : tid;                               // index within the group
  constexpr int kGroupThreads = kFp8 ? 32 : Tr::kThreads;
  int* group_pages = page_smem + (kFp8 ? key_warp * Tr::kPageSlots * Tr::kWarpPageInts : 0);
  auto pipeline_sync = [] {
    if constexpr (kFp8) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  };

  // Page indices of the group's keys of tile j (relative to tile_begin) -> ring slot
  // j % kPageSlots of the group's ring.
  auto stage_pages_async = [&](int j, bool l2_only = false) {
    if (j >= num_tiles) return;
    const int k0 = key_begin + j * Tr::kTileKeys + group_key0;
    StagePages(a, table, k0, min(key_end, k0 + kGroupKeys) - 1,
               group_pages + (j % Tr::kPageSlots) * kSlotInts, me, kGroupThreads, l2_only);
  };
  // The group's K and V rows of tile j -> pipeline stage `stage`: kPasses 16-byte copies per
  // thread each for K and for V.
  auto issue_tile = [&](int j, int stage, int newest = -1, KvRows rows = kKvAllRows) {
    if (j >= num_tiles) return;
    const int k0 = key_begin + j * Tr::kTileKeys;
    const uint32_t k_dst = SmemAddr(kv_smem + stage * Tr::kStageBytes);
    IssueKvRows<T, D, kFp8, Tr>(a, k_head, v_head, group_pages + (j % Tr::kPageSlots) * kSlotInts,
                                PageOf(a, k0 + group_key0), k0, key_end, group_key0, me, k_dst,
                                k_dst + Tr::kTileElems * Tr::kElemBytes, newest, rows);
  };
  // Page indices of the first kStages - 1 tiles: one cp.async group (all in flight together),
  // waited for here since the first K/V copies need them.
  for (int j = 0; j < Tr::kStages - 1; ++j) stage_pages_async(j, early);
  CpAsyncCommit();
  CpAsyncWait<0>();
  pipeline_sync();

  // Prologue: tiles 0..kStages-2 in flight, all but the newest key's row (issued after the
  // wait, below). Commit group j holds K/V of tile j and the page indices of tile
  // j + kStages - 1 (needed when that tile is issued, after group j landed).
  const int newest = early ? num_keys - 1 : -1;
#pragma unroll
  for (int j = 0; j < Tr::kStages - 1; ++j) {
    issue_tile(j, j, newest, kKvAllRows);
    stage_pages_async(j + Tr::kStages - 1, early);
    CpAsyncCommit();
  }
  if (early) PdlWait();  // q and the newest key's row: the previous kernel's writes

  const int g = lane >> 2;
  const int c = lane & 3;
  uint32_t qa[Tr::kKSteps][kT ? 2 : 4];
  if constexpr (kT && kFp8) {
    LoadQTFragment<T, D>(a, seq, kv_head, lane, qa);
  } else if constexpr (kT) {
    LoadQTFragment16<T, D>(a, seq, kv_head, lane, qa);
  } else {
    LoadQFragment<T, D, kFp8>(a, seq, kv_head, lane, qa);
  }
  // The newest key's row, when a prologue tile holds it: its own commit group, newer than the
  // prologue's, so that tile's wait below is for every group (CpAsyncWait<0>).
  const int newest_tile =
      newest >= key_begin && newest < key_end ? (newest - key_begin) / Tr::kTileKeys : -1;
  const bool newest_late = newest_tile >= 0 && newest_tile < Tr::kStages - 1;
  if (newest_late) {
    issue_tile(newest_tile, newest_tile, newest, kKvNewestRow);
    CpAsyncCommit();
  }

  // Per-warp online-softmax state for rows g (r = 0) and g + 8 (r = 1); l is this thread's
  // partial sum over its key columns (the quad's partials are added at the end).
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  constexpr int kOTiles = kT ? D / 16 / Tr::kDimSplits : Tr::kNTiles;
  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  const int warp_row = key_warp * Tr::kKeysPerWarp;

  for (int i = 0; i < num_tiles; ++i) {
    if (newest_late && i == newest_tile) {
      CpAsyncWait<0>();  // tile i's group and the newest row's, committed after it
    } else {
      CpAsyncWait<Tr::kStages - 2>();  // this thread's copies of tile i (group i) landed
    }
    pipeline_sync();  // the group's landed; the group finished tile i - 1
    issue_tile(i + Tr::kStages - 1, (i + Tr::kStages - 1) % Tr::kStages);
    stage_pages_async(i + 2 * Tr::kStages - 2);
    CpAsyncCommit();

    const int stage = i % Tr::kStages;
    const uint32_t k_tile = SmemAddr(kv_smem + stage * Tr::kStageBytes);
    const uint32_t v_tile = k_tile + Tr::kTileElems * Tr::kElemBytes;

    if constexpr (kT && kFp8) {
      WarpKeysStepT<D>(qa, k_tile, v_tile, lane, warp_row, key_begin + i * Tr::kTileKeys + warp_row,
                       key_end, a.scale_log2, m, l, o, first_key);
    } else if constexpr (kT) {
      WarpKeysStepT16<T, D, Tr::kDimSplits>(qa, k_tile, v_tile, lane, warp_row,
                                            key_begin + i * Tr::kTileKeys + warp_row, key_end,
                                            a.scale_log2, m, l, o, first_key, dim_part);
    } else {
      WarpKeysStep<T, D, kFp8>(qa, k_tile, v_tile, lane, warp_row,
                               key_begin + i * Tr::kTileKeys + warp_row, key_end, a.scale_log2, m,
                               l, o, first_key);
    }
  }

  // ---- epilogue: merge the 4 warps' states, then write the output or the split partial ----
  CpAsyncWait<0>();
  __syncthreads();  // the K/V stages are free: reuse them for the cross-warp merge
  __shared__ float red_m[Tr::kKeyWarps][Tr::kRows];
  __shared__ float red_l[Tr::kKeyWarps][Tr::kRows];
  float* red_o = reinterpret_cast<float*>(smem);  // [kWarps][kRows][kRedStride]
  float* my_o = red_o + key_warp * Tr::kRows * Tr::kRedStride;
  if constexpr (kT) {
    // Heads 2c + r (rows of the merge): l summed over the keys' lanes (xor 4, 8, 16); o[h][r]
    // and o[h][2 + r] are dims 16h + 2g and 16h + 2g + 1. Rows 8..15 stay unwritten (group <= 8).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = SumOverKeyLanes(l[r]);
      if (g == 0 && dim_part == 0) {  // (every dim part holds the same m, l)
        red_m[key_warp][2 * c + r] = m[r];
        red_l[key_warp][2 * c + r] = l[r];
      }
#pragma unroll
      for (int h = 0; h < D / 16; ++h) {
        if constexpr (kFp8) {
          *reinterpret_cast<float2*>(my_o + (2 * c + r) * Tr::kRedStride + 16 * h + 2 * g) =
              make_float2(o[h][r], o[h][2 + r]);
        } else {  // WarpKeysStepT16: dims 16h + g and 16h + 8 + g of this dim part
          float* dst = my_o + (2 * c + r) * Tr::kRedStride + 16 * (kOTiles * dim_part + h) + g;
          dst[0] = o[h][r];
          dst[8] = o[h][2 + r];
        }
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (c == 0) {
      red_m[key_warp][g] = m[0];
      red_l[key_warp][g] = l[0];
      red_m[key_warp][g + 8] = m[1];
      red_l[key_warp][g + 8] = l[1];
    }
    if constexpr (kFp8) {
      // Undo the output permutation: tiles 2h and 2h + 1 (chunk h, parity 0 / 1) hold dims
      // 16h + 4c + {0, 2} and + {1, 3} of rows g (elements 0, 1) and g + 8 (2, 3).
#pragma unroll
      for (int h = 0; h < Tr::kNTiles / 2; ++h) {
        const float* e = o[2 * h];
        const float* f = o[2 * h + 1];
        *reinterpret_cast<float4*>(my_o + g * Tr::kRedStride + 16 * h + 4 * c) =
            make_float4(e[0], f[0], e[1], f[1]);
        *reinterpret_cast<float4*>(my_o + (g + 8) * Tr::kRedStride + 16 * h + 4 * c) =
            make_float4(e[2], f[2], e[3], f[3]);
      }
    } else {
#pragma unroll
      for (int n = 0; n < Tr::kNTiles; ++n) {
        *reinterpret_cast<float2*>(my_o + g * Tr::kRedStride + 8 * n + 2 * c) =
            make_float2(o[n][0], o[n][1]);
        *reinterpret_cast<float2*>(my_o + (g + 8) * Tr::kRedStride + 8 * n + 2 * c) =
            make_float2(o[n][2], o[n][3]);
      }
    }
  }
  __syncthreads();

  // A CTA with no tiles (a short sequence has fewer tiles than splits) writes no partial: the
  // merge reads only the non-empty splits 0 .. min(num_splits, total_tiles) - 1.
  if (a.num_splits == 1 || num_tiles > 0) {
    for (int idx = tid; idx < a.group * D; idx += Tr::kThreads) {
      const int row = idx / D;
      const int d = idx % D;
      float m_cta = -INFINITY;
#pragma unroll
      for (int w = 0; w < Tr::kKeyWarps; ++w) m_cta = Max(m_cta, red_m[w][row]);
      float acc = 0.f, l_cta = 0.f;
      if (m_cta != -INFINITY) {  // as OnlineSoftmax::Merge: each side scaled by 2^(m_w - m)
#pragma unroll
        for (int w = 0; w < Tr::kKeyWarps; ++w) {
          const float scale = exp2f(red_m[w][row] - m_cta);
          acc += scale * red_o[(w * Tr::kRows + row) * Tr::kRedStride + d];
          l_cta += scale * red_l[w][row];
        }
      }
      const int64_t head = int64_t(seq) * a.num_heads + kv_head * a.group + row;
      if (a.num_splits == 1) {
        const float inv_l = l_cta > 0.f ? 1.f / l_cta : 0.f;  // OnlineSoftmax::Finalize
        const float o_scale = kFp8 ? inv_l * a.out_scale : inv_l;
        static_cast<T*>(a.out)[head * D + d] = vec::FromF32<T>(acc * o_scale);
      } else {
        const int64_t part = head * a.num_splits + split;
        a.part_acc[part * D + d] = acc;
        if (d == 0) *reinterpret_cast<float2*>(a.part_ml + part * 2) = make_float2(m_cta, l_cta);
      }
    }
  }
  if (a.num_splits == 1) return;

  // ---- split arrival: the last CTA of this (sequence, KV head) merges ---------------------
  // The pattern of cooperative groups' grid sync: the barrier orders every thread's partial
  // stores before thread 0's fence, whose release is cumulative over them, then its atomic
  // (release). Thread 0 of the last arrival fences again after reading the count (acquire:
  // every other CTA's fence preceded its increment), the barrier passes that on, and the
  // partials are read with ld.global.cg (L2, the point of coherence; never a stale L1 line).
  // The last arrival resets the counter: all num_splits increments of this call are in, and
  // the next call on this workspace is stream-ordered after this kernel's completion (PDL's
  // wait included), so it starts from 0.
  __shared__ int is_last;
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    const unsigned arrived = atomicAdd(a.counters + seq_head, 1u) + 1u;
    const bool last = arrived == unsigned(a.num_splits);
    if (last) {
      atomicExch(a.counters + seq_head, 0u);
      __threadfence();
    }
    is_last = last ? 1 : 0;
  }
  __syncthreads();
  if (!is_last) return;

  // Merge: the OnlineSoftmax::Merge math over the non-empty splits 0..n_active-1, in order.
  // Each thread owns one float4 of one query row's output and walks the splits in chunks of
  // kChunk: a chunk's (m, l) pairs and acc float4s are loaded together (one L2 round trip per
  // chunk: 1×32k's 33 splits take 3, where v2's combine kernel took a weight pass plus one
  // round trip per 8 splits), then folded in with the chunk's max:
  //   M' = max(M, max_s m_s), acc = acc·2^(M - M') + Σ_s 2^(m_s - M')·acc_s, l likewise
  // (2^(x - M') taken as 0 while M' is -inf; a single chunk is exactly the one-pass formula
  // m = max_s m_s, w_s = 2^(m_s - m)). out = acc / l (0 when l == 0, as Finalize).
  constexpr int kChunk = 16;
  constexpr int kVecs = D / 4;  // float4s per row
  const int n_active = min(a.num_splits, total_tiles);
  for (int idx = tid; idx < a.group * kVecs; idx += Tr::kThreads) {
    const int row = idx / kVecs;
    const int v4 = idx % kVecs;
    const int64_t head = int64_t(seq) * a.num_heads + kv_head * a.group + row;
    const float2* ml = reinterpret_cast<const float2*>(a.part_ml) + head * a.num_splits;
    const float4* src =
        reinterpret_cast<const float4*>(a.part_acc) + head * a.num_splits * kVecs + v4;
    float m_run = -INFINITY, l_run = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < n_active; s0 += kChunk) {
      float2 part_ml[kChunk];
      float4 part_acc[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const int s = s0 + k;
        part_ml[k] = s < n_active ? __ldcg(ml + s) : make_float2(-INFINITY, 0.f);
        part_acc[k] =
            s < n_active ? __ldcg(src + int64_t(s) * kVecs) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float m_new = m_run;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) m_new = Max(m_new, part_ml[k].x);
      if (m_new == -INFINITY) continue;          // nothing visible yet (acc, l stay 0)
      const float alpha = exp2f(m_run - m_new);  // 0 while m_run was -inf
      acc.x *= alpha;
      acc.y *= alpha;
      acc.z *= alpha;
      acc.w *= alpha;
      l_run *= alpha;
      m_run = m_new;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const float w = exp2f(part_ml[k].x - m_run);  // 0 for the -inf padding
        acc.x += w * part_acc[k].x;
        acc.y += w * part_acc[k].y;
        acc.z += w * part_acc[k].z;
        acc.w += w * part_acc[k].w;
        l_run += w * part_ml[k].y;
      }
    }
    const float inv_l = (l_run > 0.f ? 1.f / l_run : 0.f) * (kFp8 ? a.out_scale : 1.f);
    uint2 packed;
    packed.x = PackPair<T>(acc.x * inv_l, acc.y * inv_l);
    packed.y = PackPair<T>(acc.z * inv_l, acc.w * inv_l);
    *reinterpret_cast<uint2*>(static_cast<T*>(a.out) + head * D + 4 * v4) = packed;
  }
}

// ---- v4: the persistent warp-item kernel (fp8 caches; opt-in, kWarpItems) ----------------
// Written for many medium-length sequences (512 × ~1k keys, a throughput run's decode steps),
// where DecodeKernel runs ~8 waves of CTAs that start and end together, so that every wave
// boundary drains and refills every pipeline of an SM at once. Here every WARP is an
// independent flash-decoding worker over whole items (sequence, KV head): warp w of the
// W = gridDim.x · kWarps resident warps takes items w, w + W, w + 2W, ... and streams their keys
// 16 at a time (4 KiB of e4m3 K+V per stage) through ONE cp.async pipeline that runs across item
// boundaries: the next item's page indices and first K/V rows are in flight while the current
// item's last keys compute, its context length was loaded one item ahead, and its output
// (normalised in registers; no cross-warp merge, the warp owns all of the item's keys) is
// written with plain stores. The warp-level math is DecodeKernel's fp8 path (WarpKeysStep).
// Measured on the H200 (bench/RESULTS.md, "Decode attention v4 / v4T"): correct, but with
// WarpKeysStep slower than DecodeKernel on every shape (512 × 1k: 0.68 of copy vs 0.80).
// Nsight Compute showed both bound by per-warp instruction latency at 12-16 warps per SM (58%
// SM throughput, 35% fixed-latency dependency stalls), not by bytes in flight; this kernel's
// three cursors cost registers (4 CTAs per SM spill 232 bytes: 0.55 of copy; so it runs 3).
// That led to the transposed step (WarpKeysStepT, kT here: 112 registers at 4 CTAs per SM),
// which lifted this kernel to 0.82-0.92 of copy, and DecodeKernel with the same step to
// 0.92-0.97 on the same shapes: the wave boundaries this kernel removes cost little once the
// step is lean. So both warp-item configurations are opt-in rungs (kWarpItems, kWarpItemsT).

// A pipeline cursor over one warp's items: item (>= num_items: past the end), its key count,
// the 16-key chunk within it, and the next item's key count, loaded one item ahead.
struct ItemCursor {
  int item;
  int num_keys;
  int chunk;
  int next_keys;
};

__device__ __forceinline__ int ItemKeys(const KernelArgs& a, int item, int num_items) {
  return item < num_items ? a.context_lens[item / a.num_kv_heads] + 1 : 0;
}

__device__ __forceinline__ void AdvanceCursor(const KernelArgs& a, ItemCursor& cur, int stride,
                                              int num_items, int chunk_keys) {
  if (cur.item >= num_items) return;
  if (++cur.chunk * chunk_keys < cur.num_keys) return;
  cur.item += stride;
  cur.chunk = 0;
  cur.num_keys = cur.next_keys;
  cur.next_keys = ItemKeys(a, cur.item + stride, num_items);
}

// The warp-item kernel's configuration: kWarpsPerCta warps per CTA (each its own 16 rows of
// every stage and its own page ring, as DecodeKernel's fp8 warps) and kStagesArg pipeline
// stages of 16 keys per warp (kStagesArg - 1 in flight); the kernel's __launch_bounds__ take
// the occupancy. kWarpItems launches 4 warps × 3 CTAs per SM × 3 stages (ItemsCfg<T, D, 4, 3,
// 3, false>: up to 168 registers, no spills), kWarpItemsT 4 × 4 × 3 (the transposed step: 112
// registers). Measured and dropped for the original step (bench/RESULTS.md): 4 CTAs per SM (the
// 128-register cap spills 232 bytes at head_dim 128: 0.55 of copy), 1 CTA of 12 warps (all KV
// heads of a sequence on one SM) and 4 stages (3 in flight per warp): no better.
template <int D, int kWarpsPerCta, int kStagesArg>
struct ItemsTraits : DecodeTraits<D, true> {
  static constexpr int kWarps = kWarpsPerCta;
  static constexpr int kStages = kStagesArg;
  static constexpr int kPageSlots = 2 * kStages;  // page-index ring (as DecodeKernel's)
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTileBytes = kWarps * 16 * D;  // one stage's K (or V) rows, e4m3
  static constexpr size_t kStageBytes = size_t(2) * kTileBytes;
  static constexpr size_t kKvSmemBytes = size_t(kStages) * kStageBytes;
  static constexpr size_t kSmemBytes =
      kKvSmemBytes + size_t(kWarps) * kPageSlots * DecodeTraits<D, true>::kWarpPageInts * 4;
  static_assert(kStages >= 2, "the pipeline keeps kStages - 1 stages in flight");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM's shared memory");
};

// kT: the transposed step (WarpKeysStepT; GQA groups <= 8), else WarpKeysStep.
template <typename T, int D, int kWarpsPerCta, int kCtasPerSm, int kStages, bool kT>
__global__ void __launch_bounds__(32 * kWarpsPerCta, kCtasPerSm)
    DecodeItemsKernel(const __grid_constant__ KernelArgs a) {
  using Tr = ItemsTraits<D, kWarpsPerCta, kStages>;
  constexpr int kKeys = Tr::kKeysPerWarp;  // keys per pipeline stage of a warp
  extern __shared__ __align__(128) unsigned char smem[];
  PdlTrigger();
  PdlWait();

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_items = a.num_seqs * a.num_kv_heads;
  const int stride = int(gridDim.x) * Tr::kWarps;
  const int first = int(blockIdx.x) * Tr::kWarps + warp;
  if (first >= num_items) return;  // (no CTA barrier below: the warps are independent)

  // This warp's rows of every stage (the same layout as DecodeKernel's fp8 path) and its own
  // page-index ring.
  const int warp_row = warp * kKeys;
  int* pages =
      reinterpret_cast<int*>(smem + Tr::kKvSmemBytes) + warp * Tr::kPageSlots * Tr::kWarpPageInts;
  auto stage_k = [&](int t) { return SmemAddr(smem + (t % Tr::kStages) * Tr::kStageBytes); };
  auto slot_of = [&](int t) { return pages + (t % Tr::kPageSlots) * Tr::kWarpPageInts; };

  // Three cursors walk the same chunk sequence (t counts chunks across items): `pc` stages the
  // page indices of chunk t + 2·kStages - 2, `ic` issues the K/V of chunk t + kStages - 1 and
  // `cc` computes chunk t (DecodeKernel's schedule, per warp).
  ItemCursor pc{first, ItemKeys(a, first, num_items), 0, ItemKeys(a, first + stride, num_items)};
  ItemCursor ic = pc, cc = pc;
  auto stage_pages = [&](int pt) {
    if (pc.item < num_items) {
      const int k0 = pc.chunk * kKeys;
      StagePages(a, a.block_tables + int64_t(pc.item / a.num_kv_heads) * a.max_blocks_per_seq, k0,
                 min(pc.num_keys, k0 + kKeys) - 1, slot_of(pt), lane, 32, false);
    }
    AdvanceCursor(a, pc, stride, num_items, kKeys);
  };
  auto issue = [&](int it) {
    if (ic.item < num_items) {
      const int64_t head_off = int64_t(ic.item % a.num_kv_heads) * a.head_stride;
      const int k0 = ic.chunk * kKeys;
      const uint32_t k_dst = stage_k(it);
      // Rows warp_row.. of the stage hold keys k0..: IssueKvRows's key = (k0 - warp_row) + row.
      IssueKvRows<T, D, true>(a, static_cast<const unsigned char*>(a.k) + head_off,
                              static_cast<const unsigned char*>(a.v) + head_off, slot_of(it),
                              PageOf(a, k0), k0 - warp_row, ic.num_keys, warp_row, lane, k_dst,
                              k_dst + Tr::kTileBytes);
    }
    AdvanceCursor(a, ic, stride, num_items, kKeys);
  };

  for (int j = 0; j < Tr::kStages - 1; ++j) stage_pages(j);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncwarp();
#pragma unroll
  for (int j = 0; j < Tr::kStages - 1; ++j) {
    issue(j);
    stage_pages(j + Tr::kStages - 1);
    CpAsyncCommit();
  }

  const int g = lane >> 2;
  const int c = lane & 3;
  constexpr int kOTiles = kT ? D / 16 : Tr::kNTiles;
  uint32_t qa[Tr::kKSteps][kT ? 2 : 4];
  float m[2], l[2], o[kOTiles][4];
  auto begin_item = [&] {
    if constexpr (kT) {
      LoadQTFragment<T, D>(a, cc.item / a.num_kv_heads, cc.item % a.num_kv_heads, lane, qa);
    } else {
      LoadQFragment<T, D, true>(a, cc.item / a.num_kv_heads, cc.item % a.num_kv_heads, lane, qa);
    }
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  };
  begin_item();

  for (int t = 0; cc.item < num_items; ++t) {
    CpAsyncWait<Tr::kStages - 2>();  // this lane's copies of chunk t landed
    __syncwarp();                    // everyone's landed; the warp finished chunk t - 1
    issue(t + Tr::kStages - 1);
    stage_pages(t + 2 * Tr::kStages - 2);
    CpAsyncCommit();

    const uint32_t k_tile = stage_k(t);
    if constexpr (kT) {
      WarpKeysStepT<D>(qa, k_tile, k_tile + Tr::kTileBytes, lane, warp_row, cc.chunk * kKeys,
                       cc.num_keys, a.scale_log2, m, l, o);
    } else {
      WarpKeysStep<T, D, true>(qa, k_tile, k_tile + Tr::kTileBytes, lane, warp_row,
                               cc.chunk * kKeys, cc.num_keys, a.scale_log2, m, l, o);
    }
    if ((cc.chunk + 1) * kKeys < cc.num_keys) {
      ++cc.chunk;
      continue;
    }
    // The item's last chunk: normalise and write its query rows g and g + 8 (those < group).
    // Tiles 2h and 2h + 1 hold dims 16h + 4c + {0, 2} and + {1, 3} (DecodeKernel's fp8
    // output permutation) of rows g (elements 0, 1) and g + 8 (2, 3).
    const int seq = cc.item / a.num_kv_heads;
    T* out = static_cast<T*>(a.out) +
             (int64_t(seq) * a.num_heads + (cc.item % a.num_kv_heads) * a.group) * D;
    if constexpr (kT) {
      // Heads 2c + r: o[h][r] (dim 16h + 2g) and o[h][2 + r] (dim 16h + 2g + 1).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[r] = SumOverKeyLanes(l[r]);
        const int head = 2 * c + r;
        if (head >= a.group) continue;
        const float scale = (l[r] > 0.f ? 1.f / l[r] : 0.f) * a.out_scale;
#pragma unroll
        for (int h = 0; h < D / 16; ++h) {
          *reinterpret_cast<uint32_t*>(out + head * D + 16 * h + 2 * g) =
              PackPair<T>(o[h][r] * scale, o[h][2 + r] * scale);
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = g + 8 * r;
        if (row >= a.group) continue;
        const float scale = (l[r] > 0.f ? 1.f / l[r] : 0.f) * a.out_scale;
#pragma unroll
        for (int h = 0; h < Tr::kNTiles / 2; ++h) {
          const float* e = o[2 * h];
          const float* f = o[2 * h + 1];
          uint2 packed;
          packed.x = PackPair<T>(e[2 * r] * scale, f[2 * r] * scale);
          packed.y = PackPair<T>(e[2 * r + 1] * scale, f[2 * r + 1] * scale);
          *reinterpret_cast<uint2*>(out + row * D + 16 * h + 4 * c) = packed;
        }
      }
    }
    AdvanceCursor(a, cc, stride, num_items, kKeys);
    if (cc.item < num_items) begin_item();
  }
  CpAsyncWait<0>();  // (nothing is left in flight past the last item; leave no copy pending)
}

// ---- host side ---------------------------------------------------------------------------
struct KernelInfo {
  int ctas_per_sm = 0;
};

// The CTA kernel's launch configuration (PrepareKernel's Cfg; ItemsCfg is the warp-item one).
template <typename T, int D, bool kFp8, bool kT = false>
struct CtaCfg {
  using Tr = DecodeTraits<D, kFp8, kDecodeDimSplit<kFp8, kT>>;
  static constexpr auto kKernel = DecodeKernel<T, D, kFp8, kT>;
};
template <typename T, int D, int kWarps, int kCtas, int kStages, bool kT>
struct ItemsCfg {
  using Tr = ItemsTraits<D, kWarps, kStages>;
  static constexpr auto kKernel = DecodeItemsKernel<T, D, kWarps, kCtas, kStages, kT>;
};

// Opts the kernel of Cfg into its dynamic shared memory once per device (a function attribute
// belongs to the device's context: tensor parallelism launches on several) and caches its
// occupancy.
template <typename Cfg>
const KernelInfo& PrepareKernel() {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static KernelInfo info[kMaxDevices];
  int device = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kMaxDevices) throw std::runtime_error("decode attention: device id over 63");
  std::call_once(once[device], [device] {
    using Tr = typename Cfg::Tr;
    LLM_CUDA_CHECK(cudaFuncSetAttribute(Cfg::kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(Tr::kSmemBytes)));
    KernelInfo& k = info[device];
    LLM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k.ctas_per_sm, Cfg::kKernel,
                                                                 Tr::kThreads, Tr::kSmemBytes));
    k.ctas_per_sm = std::max(1, k.ctas_per_sm);
  });
  return info[device];
}

// Launches the kernel of Cfg on `ctas` CTAs.
template <typename Cfg>
void LaunchCfg(const KernelArgs& args, int64_t ctas, cudaStream_t stream) {
  using Tr = typename Cfg::Tr;
  Launch(Cfg::kKernel, dim3(static_cast<unsigned>(ctas)), dim3(Tr::kThreads), Tr::kSmemBytes,
         stream, args);
}

constexpr int kTileKeys = DecodeTraits<128>::kTileKeys;
static_assert(DecodeTraits<64>::kTileKeys == kTileKeys &&
                  DecodeTraits<64, true>::kTileKeys == kTileKeys &&
                  DecodeTraits<128, true>::kTileKeys == kTileKeys &&
                  DecodeTraits<256, false, 2>::kTileKeys == kTileKeys,
              "one tile size for the split math");

// Per-CTA fixed cost in units of one tile's streaming time, for the split selector: the
// prologue (context length, then page indices, then the first K/V round trip) and the
// epilogue (partial write, fence, arrival; the merge for the last CTA) take about two tiles'
// worth of time of a CTA that streams a 32 KiB tile per ~1.5-2 µs.
constexpr int64_t kCtaOverheadTiles = 2;

// Split count for `base` = num_seqs × num_kv_heads CTAs per split and `slots` = SMs × resident
// CTAs per SM. base ≥ 80% of the slots: no split (the large batches, at the read bandwidth
// already). Otherwise s splits run base·s CTAs in ceil(base·s / slots) waves of
// ceil(tiles / s) + overhead tiles each; the s with the smallest estimate wins, ties to the
// larger s (more CTAs, so every resident slot streams: 1×32k on 264 slots takes 33 splits,
// 264 CTAs of 15-16 tiles, where v2's "smallest s within 85% wave efficiency" took 29, 232
// CTAs). s ≤ tiles / min_tiles (2 by default: each CTA still pipelines its tiles), s ≤
// max_splits (what the workspace holds) and s ≤ kMaxSplits.
int SelectSplits(int64_t base, int64_t max_num_keys, int slots, int64_t max_splits,
                 int64_t min_tiles = 2) {
  const int64_t tiles = (std::max<int64_t>(max_num_keys, 1) + kTileKeys - 1) / kTileKeys;
  const int64_t limit =
      std::min<int64_t>({max_splits, tiles / std::max<int64_t>(min_tiles, 1), kMaxSplits});
  if (limit <= 1 || base <= 0 || base * 5 >= int64_t(slots) * 4) return 1;
  int64_t best_s = 1, best_cost = -1;
  for (int64_t s = 1; s <= limit; ++s) {
    const int64_t waves = (base * s + slots - 1) / slots;
    const int64_t cost = waves * ((tiles + s - 1) / s + kCtaOverheadTiles);
    if (best_cost < 0 || cost <= best_cost) {
      best_cost = cost;
      best_s = s;
    }
  }
  return static_cast<int>(best_s);
}

bool IsWarpItems(DecodeKernelChoice c) {
  return c == DecodeKernelChoice::kWarpItems || c == DecodeKernelChoice::kWarpItemsT;
}

template <typename T, int D, bool kFp8>
void LaunchDecode(KernelArgs args, int64_t num_seqs, int num_splits, DecodeKernelChoice choice,
                  int items_max_ctas, cudaStream_t stream, DecodeLaunchInfo* info) {
  const int64_t items = num_seqs * args.num_kv_heads;
  bool warp_items = false;
  bool transposed = false;  // WarpKeysStepT ran
  int ctas_per_sm = 0;
  int64_t num_ctas = 0;
  if constexpr (kFp8) {
    // The warp-item kernels only when asked for: DecodeKernel with the same per-warp step is
    // faster on every shape measured (bench/RESULTS.md, "Decode attention v4 / v4T").
    warp_items = D != 256 && IsWarpItems(choice);  // (PagedDecodeAttention refuses them at 256)
    auto launch = [&](auto cfg) {
      using Cfg = decltype(cfg);
      ctas_per_sm = PrepareKernel<Cfg>().ctas_per_sm;
      num_ctas = std::min<int64_t>((items + Cfg::Tr::kWarps - 1) / Cfg::Tr::kWarps,
                                   int64_t(NumSms()) * ctas_per_sm);
      if (items_max_ctas > 0) num_ctas = std::min<int64_t>(num_ctas, items_max_ctas);
      args.num_splits = 1;
      LaunchCfg<Cfg>(args, num_ctas, stream);
    };
    if constexpr (D != 256) {
      if (choice == DecodeKernelChoice::kWarpItemsT && args.group <= 8) {
        launch(ItemsCfg<T, D, 4, 4, 3, true>{});
        transposed = true;
      } else if (warp_items) {
        launch(ItemsCfg<T, D, 4, 3, 3, false>{});
      }
    }
  }
  if (!warp_items) {
    num_ctas = items * num_splits;
    if (num_ctas > 0x7fffffff) throw std::invalid_argument("PagedDecodeAttention: grid too large");
    args.num_splits = num_splits;
    auto launch = [&](auto cfg) {
      using Cfg = decltype(cfg);
      ctas_per_sm = PrepareKernel<Cfg>().ctas_per_sm;
      LaunchCfg<Cfg>(args, num_ctas, stream);
    };
    // fp8, groups <= 8: the transposed step (0.92-1.00 of copy at 64-1024 sequences × 1-16k
    // keys, where the original reached 0.78-0.89), unless kCta asks for the original one.
    if constexpr (kFp8) {
      if (args.group <= 8 && choice != DecodeKernelChoice::kCta) {
        launch(CtaCfg<T, D, true, true>{});
        transposed = true;
      } else {
        launch(CtaCfg<T, D, true>{});
      }
    } else if constexpr (D == 256) {
      // head_dim 256, groups <= 8: the transposed step over the 2-byte tiles (WarpKeysStepT16).
      if (args.group <= 8 && choice != DecodeKernelChoice::kCta) {
        launch(CtaCfg<T, D, false, true>{});
        transposed = true;
      } else {
        launch(CtaCfg<T, D, false>{});
      }
    } else {
      launch(CtaCfg<T, D, false>{});
    }
  }
  if (info != nullptr) {
    info->num_splits = warp_items ? 1 : num_splits;
    info->ctas_per_sm = ctas_per_sm;
    info->num_ctas = static_cast<int>(num_ctas);
    info->warp_items = warp_items;
    info->transposed_step = transposed;
  }
}

// The one dispatch from (dtype, head_dim, cache format) to an instantiation: calls
// f.template Run<T, D, kFp8>() (nvcc compiles this file as C++17: no template lambdas).
template <typename T, bool kFp8, typename F>
auto DispatchDim(int64_t head_dim, F& f) {
  if (head_dim == 256) return f.template Run<T, 256, kFp8>();
  return head_dim == 64 ? f.template Run<T, 64, kFp8>() : f.template Run<T, 128, kFp8>();
}
template <typename F>
auto Dispatch(DType dtype, int64_t head_dim, bool fp8, F& f) {
  if (dtype == DType::kF16) {
    return fp8 ? DispatchDim<__half, true>(head_dim, f) : DispatchDim<__half, false>(head_dim, f);
  }
  return fp8 ? DispatchDim<__nv_bfloat16, true>(head_dim, f)
             : DispatchDim<__nv_bfloat16, false>(head_dim, f);
}

struct OccupancyOf {
  template <typename T, int D, bool kFp8>
  int Run() const {
    return PrepareKernel<CtaCfg<T, D, kFp8>>().ctas_per_sm;
  }
};

int CtasPerSm(DType dtype, int64_t head_dim, bool fp8) {
  OccupancyOf f;
  return Dispatch(dtype, head_dim, fp8, f);
}

struct LaunchOf {
  const KernelArgs& args;
  int64_t num_seqs;
  int splits;
  DecodeKernelChoice choice;
  int items_max_ctas;
  cudaStream_t stream;
  DecodeLaunchInfo* info;
  template <typename T, int D, bool kFp8>
  int Run() const {
    LaunchDecode<T, D, kFp8>(args, num_seqs, splits, choice, items_max_ctas, stream, info);
    return 0;
  }
};

// The most keys one sequence's CTAs read: its whole context, or with a sliding window W the
// window's keys in whole 64-key tiles (W keys touch at most ceil((W - 1) / 64) + 1 tiles, the
// tiles of W + 63 keys). A function of the shape alone (max_num_keys, W), so the split count
// and the grid stay fixed for a captured shape while the true lengths vary on the device.
int64_t KeysRead(int64_t max_num_keys, int64_t sliding_window) {
  return sliding_window > 0 ? std::min(max_num_keys, sliding_window + kTileKeys - 1) : max_num_keys;
}

size_t PartialBytesPerSplit(int64_t num_seqs, int64_t num_heads, int64_t head_dim) {
  return size_t(num_seqs) * size_t(num_heads) * size_t(head_dim + 2) * sizeof(float);
}

static_assert(kDecodeCounterBytes % 256 == 0, "the partials after the counters stay aligned");

}  // namespace

size_t DecodeWorkspaceBytes(int64_t num_seqs, int64_t num_heads, int64_t head_dim,
                            int64_t max_splits) {
  if (max_splits <= 1) return 0;
  return kDecodeCounterBytes +
         PartialBytesPerSplit(num_seqs, num_heads, head_dim) * size_t(max_splits);
}

int DecodeAutoSplits(int64_t num_seqs, int64_t num_kv_heads, int64_t max_num_keys, int64_t head_dim,
                     int64_t max_splits, int64_t min_tiles_per_split, int64_t sliding_window) {
  const int slots =
      NumSms() * CtasPerSm(DType::kBF16, head_dim == 64 || head_dim == 256 ? head_dim : 128, false);
  return SelectSplits(num_seqs * num_kv_heads, KeysRead(max_num_keys, sliding_window), slots,
                      max_splits, min_tiles_per_split);
}

static std::atomic<bool>& DecodeKvBeforeWaitFlag() {
  static std::atomic<bool> on{true};
  return on;
}

void SetDecodeKvBeforeWait(bool on) { DecodeKvBeforeWaitFlag().store(on); }
bool DecodeKvBeforeWait() { return DecodeKvBeforeWaitFlag().load(); }

void PagedDecodeAttention(const AttentionParams& p, int num_splits, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream, DecodeLaunchInfo* info,
                          DecodeKernelChoice choice, int items_max_ctas) {
  const PagedKvLayout& layout = p.kv.layout;
  const int64_t head_dim = layout.head_dim;
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16) {
    throw std::invalid_argument("PagedDecodeAttention: unsupported dtype " +
                                std::string(DTypeName(p.dtype)) + " (BF16 or F16)");
  }
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    throw std::invalid_argument("PagedDecodeAttention: unsupported head_dim " +
                                std::to_string(head_dim) + " (64, 128 or 256)");
  }
  if (head_dim == 256 && IsWarpItems(choice)) {
    throw std::invalid_argument(
        "PagedDecodeAttention: the warp-item kernels (kWarpItems, kWarpItemsT) take head_dim 64 "
        "or 128, not 256; kAuto / kCta do");
  }
  if (layout.num_kv_heads <= 0 || p.num_heads % layout.num_kv_heads != 0) {
    throw std::invalid_argument("PagedDecodeAttention: num_heads " + std::to_string(p.num_heads) +
                                " is not a multiple of num_kv_heads " +
                                std::to_string(layout.num_kv_heads));
  }
  const int64_t group = p.num_heads / layout.num_kv_heads;
  if (group > DecodeTraits<128>::kRows) {  // query rows are padded to the mma M of 16
    throw std::invalid_argument("PagedDecodeAttention: unsupported GQA group " +
                                std::to_string(group) + " (at most 16 query heads per KV head)");
  }
  if (layout.block_size <= 0) {
    throw std::invalid_argument("PagedDecodeAttention: block_size " +
                                std::to_string(layout.block_size));
  }
  if (num_splits < 0) {
    throw std::invalid_argument("PagedDecodeAttention: num_splits " + std::to_string(num_splits));
  }
  const bool force_items = IsWarpItems(choice);
  if (force_items && !p.kv_format.fp8) {
    throw std::invalid_argument("PagedDecodeAttention: the warp-item kernel reads fp8 caches only");
  }
  const int64_t window = p.batch.sliding_window;
  if (window < 0) {
    throw std::invalid_argument("PagedDecodeAttention: sliding_window " + std::to_string(window) +
                                " (0 = full attention, or a positive window)");
  }
  if (force_items && window > 0) {
    throw std::invalid_argument(
        "PagedDecodeAttention: the warp-item kernels (kWarpItems, kWarpItemsT) have no sliding "
        "window; kAuto / kCta do");
  }
  const int64_t num_seqs = p.batch.num_seqs;
  if (info != nullptr) *info = DecodeLaunchInfo{};
  if (num_seqs == 0) return;

  // Split count: what the workspace holds (after its counters; one counter per (sequence, KV
  // head) must exist), capped by the tiles of the longest sequence (with a sliding window: of
  // the window, KeysRead) and kMaxSplits.
  const int64_t base = num_seqs * layout.num_kv_heads;
  const size_t per_split = PartialBytesPerSplit(num_seqs, p.num_heads, head_dim);
  int64_t ws_splits = 1;
  if (workspace != nullptr && workspace_bytes > kDecodeCounterBytes && base <= kDecodeMaxCounters)
    ws_splits = std::max<int64_t>(1, int64_t((workspace_bytes - kDecodeCounterBytes) / per_split));
  const int64_t keys_read = KeysRead(p.max_num_keys, window);
  const int64_t tiles = (std::max<int64_t>(keys_read, 1) + kTileKeys - 1) / kTileKeys;
  int splits = num_splits;
  if (splits == 0) {
    const int slots = NumSms() * CtasPerSm(p.dtype, head_dim, p.kv_format.fp8);
    splits = SelectSplits(base, keys_read, slots, ws_splits);
  } else {
    splits = static_cast<int>(std::min<int64_t>({splits, tiles, kMaxSplits, ws_splits}));
  }
  splits = std::max(splits, 1);
  if (force_items) splits = 1;

  KernelArgs args{};
  args.q = p.q;
  args.out = p.out;
  args.k = p.kv.k;
  args.v = p.kv.v;
  args.context_lens = p.batch.context_lens;
  args.block_tables = p.batch.block_tables;
  args.max_blocks_per_seq = p.batch.max_blocks_per_seq;
  args.block_stride = layout.block_stride();
  args.head_stride = layout.head_stride();
  args.block_size = static_cast<int>(layout.block_size);
  args.block_shift = -1;
  for (int s = 0; s < 31; ++s)
    if ((int64_t(1) << s) == layout.block_size) args.block_shift = s;
  args.num_seqs = static_cast<int>(num_seqs);
  args.num_heads = static_cast<int>(p.num_heads);
  args.num_kv_heads = static_cast<int>(layout.num_kv_heads);
  args.group = static_cast<int>(group);
  // A window of 2^31 keys or more covers every sequence (context lengths are int32).
  args.sliding_window = static_cast<int>(std::min<int64_t>(window, 0x7fffffff));
  args.scale_log2 = p.scale * kLog2e * (p.kv_format.fp8 ? p.kv_format.k_scale : 1.f);
  args.out_scale = p.kv_format.fp8 ? p.kv_format.v_scale : 1.f;
  // (Without PDL the wait is a no-op: nothing to overlap.)
  args.kv_before_wait =
      DecodeKvBeforeWaitFlag().load(std::memory_order_relaxed) && ProgrammaticLaunch() ? 1 : 0;
  if (splits > 1) {  // workspace: [counters][part_acc][part_ml]
    unsigned char* ws = static_cast<unsigned char*>(workspace);
    args.counters = reinterpret_cast<unsigned*>(ws);
    args.part_acc = reinterpret_cast<float*>(ws + kDecodeCounterBytes);
    args.part_ml =
        args.part_acc + size_t(num_seqs) * size_t(p.num_heads) * size_t(splits) * size_t(head_dim);
  }

  LaunchOf launch{args, num_seqs, splits, choice, items_max_ctas, stream, info};
  Dispatch(p.dtype, head_dim, p.kv_format.fp8, launch);
}

}  // namespace llm::cuda
