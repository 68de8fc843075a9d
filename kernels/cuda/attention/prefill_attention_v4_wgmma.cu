// Prefill attention, rung 4 (v4_wgmma): Hopper warpgroup MMA fed by TMA — the FlashAttention-3
// recipe (sm_90a), as far as this rung takes it.
//
// Algorithm: a persistent grid of CTAs (one per SM; in cluster mode as many pairs as the GPCs
// hold), 3 warpgroups (384 threads) each; a CTA
// walks its share of the (128-row query tile, head, sequence) work items, heaviest first in a
// snake order over the CTAs (GetWorkSplit / GetItemCoords below); kV4NoPersist launches one
// CTA per item instead (the earlier form, 2-5% slower: RESULTS.md).
//  - Producer warpgroup 0 gives its registers away (setmaxnreg.dec 40); its first warp streams
//    128-key K and V tiles into a 3-stage ring: lane i issues the TMA boxes of page i of the
//    tile (a page's block_size rows of one KV head are contiguous in the pool): K as one
//    cp.async.bulk.tensor.3d box per 64-column panel, V as one 4-D box of both panels (below),
//    all completing on the stage's "full" mbarrier (expect_tx = bytes of the pages that exist). It refills a stage once every
//    consumer warp has arrived on its "empty" mbarrier. The ring runs on from one item to the
//    next, so the next item's first tiles load while the consumers finish the last one.
//  - Consumer warpgroups 1 and 2 (setmaxnreg.inc 232) own 64 query rows each. Their Q rows
//    arrive by cp.async into 128-byte-swizzled shared memory at the start of each item. Per
//    key tile j:
//      S_j = Q·K_j^T    wgmma m64n128k16, A and B from shared memory (K-major, 128B swizzle)
//      O += P_{j-1}·V_{j-1}  wgmma m64n{d}k16, P from registers (bf16/fp16), V from shared
//                       memory read N-major (transposed B; V tiles [page][panel][key][64])
//    both issued as one batch, then mask (causal: diagonal tiles; non-causal: the last,
//    partial tile) and online softmax of S_j in
//    registers (exp2, scale·log2e folded into one FMA; row max and sum as 4-chain trees), O
//    rescaled only when some row's maximum moved (warp-uniform test), P_j packed. The wgmma
//    descriptors are built once and offset by one 32-bit add.
//  - Schedules (runtime knobs, prefill_attention.h kV4*; the test runs all of them):
//      ping-pong: named barriers 3/4 hand the "issue GEMMs" turn between the two consumer
//        warpgroups, so one's softmax runs while the other's GEMMs occupy the tensor cores;
//      overlap: wait only for S_j (wgmma.wait_group 1), run its softmax while P_{j-1}·V_{j-1}
//        still accumulates (two P register sets), rescale O after it lands;
//      cluster (kV4Cluster): 2-CTA clusters of neighbouring query tiles multicast the K/V
//        tiles both read (half the L2 -> SM traffic).
//    Production (kV4Default) uses none: with block size 16 the load traffic is what the math
//    waits on, and the schedules that hide the softmax lose more to it than they gain; the
//    cluster loads faster but its pairs wait for each other (RESULTS.md, "Prefill v4: where
//    the time goes").
//  - Keys past the sequence end in the last tile: their pages are not loaded, and those V rows
//    are zeroed by the consumers (stale slots may hold NaN, and 0·NaN = NaN).
// Shared memory (head_dim 128): Q 32 KiB + 3 stages × (K 32 + V 32) KiB = 224 KiB, 1 CTA/SM.
// Test:  ctest -L gpu -R prefill_attention     Bench: ./build/bench_prefill_attention_gpu
// Profile: scripts/gpu_prefill_profile.sh (ablations: loads alone, math alone; ncu)
// Change from v3: wgmma (64-row warpgroup MMAs, operands straight from shared memory, async)
// instead of mma.sync + ldmatrix; TMA + mbarriers instead of cp.async; warp specialisation
// with register reallocation; 128 × 128 tiles instead of 64 × 64.
// V tiles are [page][panel][key in page][64]: each page's V is ONE TMA box (a 4-D tensor map
// over both 64-column panels), and the P·V descriptor steps page by page (LBO = the panel
// stride in a page, bs·128; SBO = 1024, or one page at block size 8). K cannot do the same:
// S = Q·Kᵀ needs one uniform 8-row stride over all 128 keys of a panel, so K stays a box per
// page and panel. At head_dim 128 and block size 16 that is 24 boxes per tile instead of 32
// (the loads alone took 0.64 of the kernel's time there). kV4PanelBoxV restores the previous
// [panel][key][64] V layout for comparison.
// Not yet (the next rung, RESULTS.md): Q as a register operand (less shared-memory traffic),
// a TMA store of O.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/attention/prefill_attention.h"

namespace llm::cuda::detail {
namespace {

template <int HD>
struct WgmmaTraits {
  static constexpr int kConsumers = 2;  // consumer warpgroups
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBr = 64 * kConsumers;  // query rows per CTA (64 per warpgroup)
  static constexpr int kBc = 128;              // keys per tile (the S wgmma's N)
  static constexpr int kStages = 3;            // K/V ring depth: a tile's loads get two iterations
  static constexpr int kHalves = HD / 64;      // 64-column (128-byte) swizzle panels
  static constexpr uint32_t kQHalfBytes = kBr * 128;  // one panel: kBr rows × 128 B
  static constexpr uint32_t kQBytes = kHalves * kQHalfBytes;
  static constexpr uint32_t kKvHalfBytes = kBc * 128;
  static constexpr uint32_t kKvBytes = kHalves * kKvHalfBytes;  // one K (or V) stage
  static constexpr uint32_t kBarBytes = 128;  // 3 · kStages mbarriers of 8 bytes
  static_assert(kBarBytes >= 3 * kStages * 8, "full K, full V and empty barrier per stage");
  static constexpr size_t kSmemBytes = 1024 + kQBytes + 2 * kStages * kKvBytes + kBarBytes;
  static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
  static_assert(kBc == 128, "S = Q K^T is one m64n128k16 chain");
  static_assert(kQHalfBytes % 1024 == 0 && kKvHalfBytes % 1024 == 0, "1024-byte swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM");
  // setmaxnreg: the consumers' increase must come out of what the producer gives back (the
  // CTA holds its launch allocation, 65536 / kThreads rounded down to 8 per thread; an
  // increase the pool cannot cover blocks forever — 32 / 240 hung the kernel).
  static constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static_assert((kEntryRegs - kProducerRegs) * 128 >= (kConsumerRegs - kEntryRegs) * 128 * kConsumers,
                "setmaxnreg budget");
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void MbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits for the phase with parity `parity` to complete. A wait that never ends (a pipeline
// bug) traps after a few seconds instead of hanging the GPU.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  for (uint32_t i = 0;; ++i) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return;
    if (i > (1u << 24)) __trap();
  }
}
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void TmaLoad4d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void TmaLoad4dMulticast(uint32_t dst, const CUtensorMap* map, int c0,
                                                   int c1, int c2, int c3, uint32_t bar,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar),
      "h"(mask)
      : "memory");
}
// The same box multicast to the CTAs of `mask` in the cluster: each receives it at this CTA-relative
// shared address and signals its own mbarrier at the same offset.
__device__ __forceinline__ void TmaLoad3dMulticast(uint32_t dst, const CUtensorMap* map, int c0,
                                                   int c1, int c2, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void ClusterArrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void ClusterWait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrives on the mbarrier at the same offset in CTA `cta` of the cluster.
__device__ __forceinline__ void MbarArriveRemote(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
__device__ __forceinline__ void MbarArriveCount(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of wgmma accumulators across the async window.
template <int N>
__device__ __forceinline__ void FenceRegs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle. K-major operands: 8-row groups SBO apart
// (LBO unused); N-major (transposed) V: 64-column panels LBO apart, 8-key groups SBO apart.
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (1ull << 62);
}
// A descriptor as two 32-bit words, built once per kernel: the start address (bits 0-13, in
// 16-byte units) of every later operand is this base plus an offset, one 32-bit add on the low
// word (shared memory ends below 2^18 bytes, so the field never carries). Rebuilding each
// descriptor from its address cost ~20% of the consumers' instructions (ncu, RESULTS.md).
struct DescBase {
  uint32_t lo, hi;
};
__device__ __forceinline__ DescBase MakeDescBase(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  const uint64_t d = Desc(addr, lbo, sbo);
  return {uint32_t(d), uint32_t(d >> 32)};
}
__device__ __forceinline__ uint64_t DescAt(DescBase b, uint32_t byte_offset) {
  return (uint64_t(b.hi) << 32) | (b.lo + (byte_offset >> 4));
}

// ---- wgmma wrappers (generated: 64 or 32 accumulator registers per thread) ----
// D[64×128] (+)= A[64×16] (smem, K-major) · B[16×128] (smem, K-major), bf16.
__device__ __forceinline__ void WgmmaSS128(float (&d)[64], uint64_t da, uint64_t db, int accumulate,
                                           __nv_bfloat16) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}
// D[64×128] += A[64×16] (registers) · B[16×128] (smem, MN-major: transposed), bf16.
__device__ __forceinline__ void WgmmaRS128(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                           __nv_bfloat16) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// D[64×64] += A[64×16] (registers) · B[16×64] (smem, MN-major: transposed), bf16.
__device__ __forceinline__ void WgmmaRS64(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                          __nv_bfloat16) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// D[64×128] (+)= A[64×16] (smem, K-major) · B[16×128] (smem, K-major), f16.
__device__ __forceinline__ void WgmmaSS128(float (&d)[64], uint64_t da, uint64_t db, int accumulate,
                                           __half) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}
// D[64×128] += A[64×16] (registers) · B[16×128] (smem, MN-major: transposed), f16.
__device__ __forceinline__ void WgmmaRS128(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                           __half) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// D[64×64] += A[64×16] (registers) · B[16×64] (smem, MN-major: transposed), f16.
__device__ __forceinline__ void WgmmaRS64(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                          __half) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "
      "%28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

template <typename T, int HD>
__device__ __forceinline__ void WgmmaPV(float (&o)[HD / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (HD == 128) {
    WgmmaRS128(o, a, db, T{});
  } else {
    WgmmaRS64(o, a, db, T{});
  }
}

// The work: items of kPair neighbouring query tiles of one (sequence, head) — a 2-CTA cluster
// (kV4Cluster) takes one item per trip, its CTA of rank r the tile p·kPair + r counted from the
// last (heaviest) tile of the sequence; a lone CTA, one tile. Items run heaviest first: item
// i = p · (sequences · heads) + sequence · heads + head. A persistent grid (the default) has
// as many units (CTAs or clusters) as fit on the GPU at once, and unit u takes items
// r·U + u for even r and r·U + U-1-u for odd r (a snake order, which evens out the causal
// tiles' unequal work); kV4NoPersist launches one unit per item instead.
struct ItemCoords {
  TileCoords c;
  int n_tiles;  // K/V tiles this CTA reads in this item (0: its query tile is past the chunk)
  int n_slots;  // pipeline slots of the item, the same in both CTAs of a pair: max of theirs
  int common;   // tiles 0 … common-1 are read by both CTAs of a pair: loaded once, multicast
};
struct WorkSplit {
  int kpair, units, unit, items;
  uint32_t rank;
  __device__ __forceinline__ int Item(int trip) const {
    const int i = trip * units + ((trip & 1) ? units - 1 - unit : unit);
    return i < items ? i : -1;
  }
};
template <int kBr>
__device__ __forceinline__ WorkSplit GetWorkSplit(const PrefillArgs& a, bool cluster,
                                                  bool persist) {
  WorkSplit w;
  w.kpair = cluster ? 2 : 1;
  w.rank = cluster ? ClusterCtaRank() : 0;
  w.units = gridDim.x / w.kpair;
  w.unit = blockIdx.x / w.kpair;
  const int ny = (a.max_q_len + kBr - 1) / kBr;
  w.items = a.num_seqs * a.num_heads * ((ny + w.kpair - 1) / w.kpair);
  if (!persist) w.items = min(w.items, w.units);  // one item per unit (the grid covers all)
  return w;
}
template <int kBr, int kBc>
__device__ __forceinline__ ItemCoords GetItemCoords(const PrefillArgs& a, const WorkSplit& w,
                                                    int item) {
  ItemCoords ic;
  TileCoords& c = ic.c;
  const int bh = item % (a.num_seqs * a.num_heads), p = item / (a.num_seqs * a.num_heads);
  c.seq = bh / a.num_heads;
  c.head = bh % a.num_heads;
  c.kv_head = c.head / a.group;
  c.q_start = a.cu_seqlens_q[c.seq];
  c.q_len = a.cu_seqlens_q[c.seq + 1] - c.q_start;
  c.ctx = a.context_lens[c.seq];
  c.num_keys = c.ctx + c.q_len;
  const int ny = (a.max_q_len + kBr - 1) / kBr;
  // Causal: a query tile sees keys up to its last row's position; otherwise all of them.
  auto tiles = [&](int q0) {
    if (q0 < 0 || q0 >= c.q_len) return 0;
    return ((a.causal ? min(c.num_keys, c.ctx + q0 + kBr) : c.num_keys) + kBc - 1) / kBc;
  };
  const int first = (ny - 1 - p * w.kpair) * kBr;  // rank 0's (the heavier) tile
  c.q0 = first - int(w.rank) * kBr;
  ic.n_tiles = tiles(c.q0);
  if (w.kpair == 2) {
    const int peer_tiles = tiles(w.rank == 0 ? first - kBr : first);
    ic.common = min(ic.n_tiles, peer_tiles);
    ic.n_slots = max(ic.n_tiles, peer_tiles);
  } else {
    ic.common = 0;
    ic.n_slots = ic.n_tiles;
  }
  return ic;
}

template <typename T, int HD>
__global__ void __launch_bounds__(WgmmaTraits<HD>::kThreads, 1)
    PrefillWgmmaKernel(const __grid_constant__ CUtensorMap tmap_k,
                       const __grid_constant__ CUtensorMap tmap_v, const PrefillArgs a) {
  using Tr = WgmmaTraits<HD>;
  constexpr int kBr = Tr::kBr, kBc = Tr::kBc, kStages = Tr::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t sQ = (raw + 1023) & ~1023u;  // swizzle atoms need 1024-byte alignment
  const uint32_t sK = sQ + Tr::kQBytes;
  const uint32_t sV = sK + kStages * Tr::kKvBytes;
  const uint32_t bars = sV + kStages * Tr::kKvBytes;
  auto full_k = [&](int s) { return bars + 8 * s; };
  auto full_v = [&](int s) { return bars + 8 * (kStages + s); };
  auto empty = [&](int s) { return bars + 8 * (2 * kStages + s); };

  // The K/V ring runs through all of a CTA's items: slot g (the g-th K/V tile the CTA handles,
  // counted over its items) uses stage g % kStages with parity (g / kStages) & 1, so the
  // producer streams the next item's first tiles while the consumers finish the last one.
  // Cluster mode (kV4Cluster): the pair's CTAs share the K/V tiles both read: each loads half of
  // every such tile's boxes and multicasts it to both, halving the L2 -> SM traffic
  // (RESULTS.md). A stage is refilled once the consumer warps of both CTAs gave it back: each
  // empty barrier counts 16 arrivals, 8 local + 8 from the peer (alone: 8 local arrivals of
  // 2). The lighter CTA of a pair passes the heavier's extra slots as empty slots (its
  // producer completes their full barriers without data), so both walk the same slots.
  const bool cluster = a.v4_flags & kV4Cluster;
  const bool persist = !(a.v4_flags & kV4NoPersist);
  const bool compute_only = a.v4_flags & kV4ComputeOnly;
  // V tile layout: [page][panel][key in page][64] (one box per page, the default) or
  // [panel][key][64] (kV4PanelBoxV: a box per page and panel, like K).
  const bool page_v = !(a.v4_flags & kV4PanelBoxV);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full_k(s), 1);
      MbarInit(full_v(s), 1);
      MbarInit(empty(s), 2 * 4 * Tr::kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (cluster) {  // the peer's barriers are initialised before anything is multicast to them
    ClusterArrive();
    ClusterWait();
  }
  // Warp-uniform by construction (the shuffle tells the compiler so): the descriptors derived
  // from it then live in uniform registers instead of being moved there before every wgmma.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);

  if (wg == 0) {  // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tr::kProducerRegs));
    if (threadIdx.x >= 32) return;
    const WorkSplit ws = GetWorkSplit<kBr>(a, cluster, persist);
    const int lane = threadIdx.x;
    const int bs = a.block_size, pages_per_tile = kBc / bs;
    uint32_t g = 0;  // slots so far
    for (int trip = 0;; ++trip) {
      const int item = ws.Item(trip);
      if (item < 0) break;
      const ItemCoords ic = GetItemCoords<kBr, kBc>(a, ws, item);
      const TileCoords& c = ic.c;
      const int32_t* table = a.block_tables + c.seq * a.max_blocks_per_seq;
      for (int j = 0; j < ic.n_slots; ++j, ++g) {
        const int st = g % kStages, use = g / kStages, k0 = j * kBc;
        if (use > 0) MbarWait(empty(st), (use - 1) & 1);
        if (j >= ic.n_tiles || (compute_only && g >= kStages)) {
          if (lane == 0) {  // no data: complete the stage's phase (profiling: no more loads)
            MbarArrive(full_k(st));
            MbarArrive(full_v(st));
          }
          continue;
        }
        const bool mine = lane < pages_per_tile && k0 + lane * bs < c.num_keys;
        const int box = mine ? table[k0 / bs + lane] * a.num_kv_heads + c.kv_head : 0;
        const int valid_pages = min(pages_per_tile, (c.num_keys - k0 + bs - 1) / bs);
        const uint32_t bytes = uint32_t(valid_pages) * bs * HD * 2;
        if (lane == 0) {
          MbarExpectTx(full_k(st), bytes);
          MbarExpectTx(full_v(st), bytes);
        }
        __syncwarp();
        if (mine) {
          const bool shared_tile = j < ic.common;
#pragma unroll
          for (int h = 0; h < Tr::kHalves; ++h) {
            const uint32_t off = st * Tr::kKvBytes + h * Tr::kKvHalfBytes + lane * bs * 128;
            const bool v_too = !page_v;
            if (!shared_tile) {
              TmaLoad3d(sK + off, &tmap_k, h * 64, 0, box, full_k(st));
              if (v_too) TmaLoad3d(sV + off, &tmap_v, h * 64, 0, box, full_v(st));
            } else if (((lane * Tr::kHalves + h) & 1) == int(ws.rank)) {  // boxes alternate
              TmaLoad3dMulticast(sK + off, &tmap_k, h * 64, 0, box, full_k(st), 3);
              if (v_too) TmaLoad3dMulticast(sV + off, &tmap_v, h * 64, 0, box, full_v(st), 3);
            }
          }
          if (page_v) {  // the page's V, both panels, in one box: [panel][key in page][64]
            const uint32_t off = st * Tr::kKvBytes + lane * Tr::kHalves * bs * 128;
            if (!shared_tile) {
              TmaLoad4d(sV + off, &tmap_v, 0, 0, 0, box, full_v(st));
            } else if ((lane & 1) == int(ws.rank)) {  // pages alternate between the pair
              TmaLoad4dMulticast(sV + off, &tmap_v, 0, 0, 0, box, full_v(st), 3);
            }
          }
        }
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tr::kConsumerRegs));
  const int w = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g4 = lane / 4, t = lane % 4;
  const uint32_t q_base = sQ + w * 64 * 128;
  float o[HD / 2];
  float m[2], l[2];  // l: this thread's partial sums
  float s[64];       // S of the current tile (64 × 128 per warpgroup)
  uint32_t pa0[kBc / 16][4], pa1[kBc / 16][4];  // P of two tiles: register A operands of P·V
  float alpha[2];  // O's rescale factor for the current tile (rows row0, +8)
  const bool ping_pong = !(a.v4_flags & kV4NoPingPong);
  const bool overlap = !(a.v4_flags & kV4NoOverlap);
  const bool skip_exp = a.v4_flags & kV4SkipExp;
  const bool loads_only = a.v4_flags & kV4LoadsOnly;
  // Per-item values the main loop reads, as plain scalars (the item's other coordinates are
  // recomputed for the epilogue: a persistent loop must not hold more registers than one tile).
  uint32_t g0 = 0;  // slots before this item
  int diag = 0;     // ctx + this warpgroup's first row: key > diag + r masks row r (causal)
  int last_key = 0;  // the sequence's last key: key > last_key masks every row (non-causal)
  const uint32_t peer = cluster ? ClusterCtaRank() ^ 1 : 0;
  // A warp gives slot j of the item (stage st) back once its wgmmas that read it have
  // completed (wait_group is per warp): one elected arrival per warp.
  // In a cluster every slot is given back to both CTAs, shared or not: the peer's producer
  // may multicast its next shared tile into this stage only once this CTA is done with
  // whatever the stage held (a tile of its own included). Alone: one arrival of 2.
  auto release = [&](int st, int j) {
    __syncwarp();
    if (lane == 0) {
      if (cluster) {
        MbarArrive(empty(st));
        MbarArriveRemote(empty(st), peer);
      } else {
        MbarArriveCount(empty(st), 2);
      }
    }
  };
  auto stage = [&](int j) { return int((g0 + j) % kStages); };
  auto parity = [&](int j) { return ((g0 + j) / kStages) & 1; };
  auto wait_full = [&](uint32_t bar, int j) { MbarWait(bar, parity(j)); };

  // Ping-pong: a warpgroup issues its GEMMs only on its turn (named barrier 3 + w), then hands
  // the turn over (arrive on 3 + other), so one warpgroup's softmax runs under the other's
  // GEMMs. Warpgroup 0 starts; warpgroup 1's last hand-over is taken up by warpgroup 0 at
  // the end of the kernel.
  auto take_turn = [&] {
    if (ping_pong) NamedBarrier(3 + w, 256);
  };
  auto pass_turn = [&] {
    if (ping_pong) NamedBarrierArrive(3 + (1 - w), 256);
  };
  if (ping_pong && w == 1) NamedBarrierArrive(3, 256);

  const DescBase dq = MakeDescBase(q_base, 16, 1024);
  const DescBase dk = MakeDescBase(sK, 16, 1024);
  // V, N-major: LBO = the panel stride, SBO = the 8-key group stride. Page layout: panels
  // bs·128 bytes apart within a page; at block size 8 a k16 step spans two pages, so its
  // second 8-key group is one page (kHalves·8·128 bytes) further.
  const int bs = a.block_size;
  const DescBase dv = page_v ? MakeDescBase(sV, uint32_t(bs) * 128,
                                            bs >= 16 ? 1024u : uint32_t(Tr::kHalves) * 1024u)
                             : MakeDescBase(sV, Tr::kKvHalfBytes, 1024);
  const int bs_shift = 31 - __clz(bs);  // block sizes are powers of two (PrefillArgs)
  // Byte offset in a V stage of keys [16kk, 16kk + 16).
  auto v_off = [&](int kk) -> uint32_t {
    if (!page_v) return uint32_t(kk) * 16 * 128;
    const int key0 = 16 * kk;
    return uint32_t((key0 >> bs_shift) * Tr::kHalves * bs + (key0 & (bs - 1))) * 128;
  };
  auto issue_s = [&](int j) {  // S = Q K_j^T: d/16 wgmmas, K-steps of 32 bytes in a panel
    const uint32_t k_stage = stage(j) * Tr::kKvBytes;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const uint32_t off = (kk / 4) * Tr::kQHalfBytes + (kk % 4) * 32;
      const uint32_t koff = (kk / 4) * Tr::kKvHalfBytes + (kk % 4) * 32;
      WgmmaSS128(s, DescAt(dq, off), DescAt(dk, k_stage + koff), kk > 0, T{});
    }
  };
  // O += P V_j: 8 wgmmas of 16 keys, V read N-major.
  auto issue_pv = [&](int j, const uint32_t(&p)[kBc / 16][4]) {
    const uint32_t v_stage = stage(j) * Tr::kKvBytes;
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) WgmmaPV<T, HD>(o, p[kk], DescAt(dv, v_stage + v_off(kk)));
  };
  // Mask (diagonal tiles) and online softmax of S_j; P_j packed into p; alpha for O. O itself
  // is not touched (a P·V may still be accumulating into it).
  auto softmax = [&](int j, uint32_t(&p)[kBc / 16][4]) {
    const int k0 = j * kBc;
    if (a.causal ? k0 + kBc - 1 > diag : k0 + kBc - 1 > last_key) {
      // key - k0 - 2t > lim (+ 8 for row0 + 8 when causal): masked
      const int lim = a.causal ? diag + warp * 16 + g4 - k0 - 2 * t : last_key - k0 - 2 * t;
      const int row8 = a.causal ? 8 : 0;
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (n * 8 + (e & 1) > lim + (e >> 1) * row8) s[n * 4 + e] = -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // h = 0: row0, h = 1: row0 + 8; a row lives in 4 threads
      // Max and sum as trees of 4 independent chains (a single chain of 32 dependent
      // FMNMX / FADD was the consumers' most-stalled code: ncu, RESULTS.md).
      float mq[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) mq[i] = fmaxf(s[i * 4 + 2 * h], s[i * 4 + 2 * h + 1]);
#pragma unroll
      for (int n = 4; n < kBc / 8; ++n)
        mq[n % 4] = fmaxf(mq[n % 4], fmaxf(s[n * 4 + 2 * h], s[n * 4 + 2 * h + 1]));
      float mx = fmaxf(fmaxf(mq[0], mq[1]), fmaxf(mq[2], mq[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx * a.scale_log2);
      const float offset = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = FastExp2(m[h] - offset);
      m[h] = m_new;
      float sq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const float x = fmaf(s[n * 4 + e], a.scale_log2, -offset);
          s[n * 4 + e] = skip_exp ? x : FastExp2(x);
          sq[(n % 2) * 2 + (e - 2 * h)] += s[n * 4 + e];
        }
      }
      l[h] = l[h] * alpha[h] + ((sq[0] + sq[1]) + (sq[2] + sq[3]));
    }
    // The S accumulator of keys 16kk … 16kk+15, packed in pairs, is the m64k16 A fragment.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      p[kk][0] = PackPair<T>(s[8 * kk + 0], s[8 * kk + 1]);
      p[kk][1] = PackPair<T>(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = PackPair<T>(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = PackPair<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  auto rescale_o = [&] {
    // Lazy: once the running maxima settle most tiles leave every alpha of the warp at exactly
    // 1, and multiplying by 1 changes nothing, so the 64 FMULs are skipped (warp-uniform).
    if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n * 4 + 0] *= alpha[0];
      o[n * 4 + 1] *= alpha[0];
      o[n * 4 + 2] *= alpha[1];
      o[n * 4 + 3] *= alpha[1];
    }
  };
  auto fence_p = [](uint32_t(&p)[kBc / 16][4]) {  // keep P live until its wgmma is done
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(p[kk][i])::"memory");
  };
  // One steady-state step: S_j and P_{j-1}·V_{j-1} issued together on this warpgroup's turn.
  // With overlap, the softmax of S_j runs while P_{j-1}·V_{j-1} is still accumulating (two P
  // register sets, cur / prev); O is rescaled once that GEMM has landed.
  auto step = [&](int j, uint32_t(&cur)[kBc / 16][4], uint32_t(&prev)[kBc / 16][4]) {
    const int pst = stage(j - 1);
    wait_full(full_k(stage(j)), j);
    wait_full(full_v(pst), j - 1);  // tile j-1 < n_tiles-1: never partial
    take_turn();
    WgmmaFence();
    issue_s(j);
    WgmmaCommit();
    issue_pv(j - 1, prev);
    WgmmaCommit();
    pass_turn();
    if (overlap) {
      WgmmaWait<1>();  // S_j landed; P_{j-1}·V_{j-1} may still run
      FenceRegs(s);
      softmax(j, cur);
      WgmmaWait<0>();
      FenceRegs(o);
      fence_p(prev);
      release(pst, j - 1);  // this warp is done with stage j-1 (K and V)
      rescale_o();
    } else {
      WgmmaWait<0>();
      FenceRegs(s);
      FenceRegs(o);
      fence_p(prev);
      release(pst, j - 1);
      softmax(j, cur);
      rescale_o();
    }
  };

  for (int trip = 0;; ++trip) {
    int item, n_tiles, n_slots;
    {
      const WorkSplit ws = GetWorkSplit<kBr>(a, cluster, persist);
      item = ws.Item(trip);
      if (item < 0) break;
      const ItemCoords ic = GetItemCoords<kBr, kBc>(a, ws, item);
      n_tiles = loads_only ? 0 : ic.n_tiles;
      n_slots = ic.n_slots;
      diag = ic.c.ctx + ic.c.q0 + w * 64;
      last_key = ic.c.num_keys - 1;
    }
    if (n_tiles > 0) {
      const WorkSplit ws = GetWorkSplit<kBr>(a, cluster, persist);
      const TileCoords c = GetItemCoords<kBr, kBc>(a, ws, item).c;
      const int wq0 = c.q0 + w * 64;  // this warpgroup's first query row
      // Q rows by cp.async (this warpgroup's own 64 rows: its last S GEMM of the previous item
      // has completed).
      const T* q = static_cast<const T*>(a.q);
      constexpr int kChunks = HD / 8;
#pragma unroll
      for (int i = 0; i < 64 * kChunks / 128; ++i) {
        const int idx = tid + i * 128, r = idx / kChunks, ch = idx % kChunks;
        const bool ok = wq0 + r < c.q_len;
        const T* src =
            q + (int64_t(c.q_start + (ok ? wq0 + r : 0)) * a.num_heads + c.head) * HD + ch * 8;
        const uint32_t dst =
            sQ + (ch / 8) * Tr::kQHalfBytes + (w * 64 + r) * 128 + (((ch % 8) ^ (r & 7)) << 4);
        CpAsync16(dst, src, ok ? 16 : 0);
      }
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      FenceProxyAsync();  // generic-proxy writes, read next by wgmma (async proxy)
      NamedBarrier(1 + w, 128);
#pragma unroll
      for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.f;

      // Tile 0: S only.
      wait_full(full_k(stage(0)), 0);
      take_turn();
      WgmmaFence();
      issue_s(0);
      WgmmaCommit();
      pass_turn();
      WgmmaWait<0>();
      FenceRegs(s);
      softmax(0, pa0);  // O is zero: no rescale needed
      // Steady state, two tiles per trip so that each P register set has a fixed name.
      for (int j = 1; j < n_tiles; j += 2) {
        step(j, pa1, pa0);
        if (j + 1 < n_tiles) step(j + 1, pa0, pa1);
      }
      // Last P·V.
      {
        const int j = n_tiles - 1, st = stage(j), k0 = j * kBc;
        const int num_keys =
            GetItemCoords<kBr, kBc>(a, GetWorkSplit<kBr>(a, cluster, persist), item).c.num_keys;
        wait_full(full_v(st), j);
        if (k0 + kBc > num_keys) {
          // Rows past the sequence: zero them (stale or never-loaded V would give 0·NaN). Both
          // warpgroups write the same zeros; each fences and syncs before its own wgmma.
          const uint32_t v_base = sV + st * Tr::kKvBytes;
          const int first = num_keys - k0;
          const int total = (kBc - first) * Tr::kHalves * 8;
          for (int idx = tid; idx < total; idx += 128) {
            const int r = first + idx / (Tr::kHalves * 8), rem = idx % (Tr::kHalves * 8);
            const int h = rem / 8;  // panel
            const uint32_t row_off =
                page_v ? uint32_t(((r >> bs_shift) * Tr::kHalves + h) * bs + (r & (bs - 1))) * 128
                       : h * Tr::kKvHalfBytes + r * 128;
            const uint32_t addr = v_base + row_off + (rem % 8) * 16;
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0)
                         : "memory");
          }
          FenceProxyAsync();
          NamedBarrier(1 + w, 128);
        }
        const bool odd = j & 1;  // P_j lives in pa1 for odd j: select it into pa0 (no branch
#pragma unroll                   // around a wgmma, which would make ptxas inject fences)
        for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
          for (int i = 0; i < 4; ++i) pa0[kk][i] = odd ? pa1[kk][i] : pa0[kk][i];
        take_turn();
        WgmmaFence();
        issue_pv(j, pa0);
        WgmmaCommit();
        pass_turn();
        WgmmaWait<0>();
        FenceRegs(o);
        fence_p(pa0);
        fence_p(pa1);
        release(st, j);
      }

      // Normalise and store (rows past the chunk are dropped).
      const WorkSplit ws2 = GetWorkSplit<kBr>(a, cluster, persist);
      const TileCoords c2 = GetItemCoords<kBr, kBc>(a, ws2, item).c;
      const int row0 = c2.q0 + w * 64 + warp * 16 + g4;  // this thread's rows: row0, row0 + 8
      T* out = static_cast<T*>(a.out);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float lt = l[h];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        // out_scale: v_scale when the pages are a copy of an fp8 cache (1 otherwise: exact).
        const float inv = (lt > 0.f ? 1.f / lt : 0.f) * a.out_scale;
        const int row = row0 + h * 8;
        if (row < c2.q_len) {
          T* dst = out + (int64_t(c2.q_start + row) * a.num_heads + c2.head) * HD + 2 * t;
#pragma unroll
          for (int n = 0; n < HD / 8; ++n) {
            *reinterpret_cast<uint32_t*>(dst + n * 8) =
                PackPair<T>(o[n * 4 + 2 * h] * inv, o[n * 4 + 2 * h + 1] * inv);
          }
        }
      }
    }
    // Slots without a tile of this CTA (the heavier peer's extra ones; profiling: every slot
    // in a loads-only run): wait for the stage's phase and give it back.
    for (int j = n_tiles; j < n_slots; ++j) {
      wait_full(full_k(stage(j)), j);
      wait_full(full_v(stage(j)), j);
      release(stage(j), j);
    }
    g0 += n_slots;
  }
  if (ping_pong && w == 0) NamedBarrier(3, 256);  // warpgroup 1's last hand-over
  if (cluster) {  // the peer no longer multicasts to nor arrives on this CTA's barriers
    ClusterArrive();
    ClusterWait();
  }
}

PFN_cuTensorMapEncodeTiled_v12000 EncodeFn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    LLM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                    cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || p == nullptr)
      throw std::runtime_error("cuTensorMapEncodeTiled unavailable");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

std::string MapError(const char* what, CUresult r, const PrefillArgs& a) {
  return std::string("v4_wgmma: cuTensorMapEncodeTiled (") + what + ") failed: CUresult " +
         std::to_string(int(r)) + " (head_dim " + std::to_string(a.head_dim) + ", block_size " +
         std::to_string(a.block_size) + ", " +
         std::to_string(int64_t(a.num_blocks) * a.num_kv_heads) + " pages)";
}

// A pool [num_blocks, num_kv_heads, block_size, head_dim] as a 3-D tensor
// (head_dim, block_size, num_blocks · num_kv_heads); box = one page × 64 columns, 128B swizzle.
CUtensorMap PoolMap(const void* pool, const PrefillArgs& a) {
  CUtensorMap map;
  const cuuint64_t dims[3] = {cuuint64_t(a.head_dim), cuuint64_t(a.block_size),
                              cuuint64_t(a.num_blocks) * a.num_kv_heads};
  const cuuint64_t strides[2] = {cuuint64_t(a.head_dim) * 2,
                                 cuuint64_t(a.head_dim) * 2 * a.block_size};
  const cuuint32_t box[3] = {64, cuuint32_t(a.block_size), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = EncodeFn()(
      &map, a.is_bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(pool), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw std::runtime_error(MapError("panel box", r, a));
  return map;
}

// The same pool as a 4-D tensor (64, block_size, head_dim / 64, num_blocks · num_kv_heads):
// (column in panel, row, panel, page) with the panels 128 bytes apart; box = one whole page,
// landing as [panel][row][64] (128B swizzle).
CUtensorMap PagePoolMap(const void* pool, const PrefillArgs& a) {
  CUtensorMap map;
  const cuuint64_t halves = cuuint64_t(a.head_dim / 64);
  const cuuint64_t dims[4] = {64, cuuint64_t(a.block_size), halves,
                              cuuint64_t(a.num_blocks) * a.num_kv_heads};
  const cuuint64_t strides[3] = {cuuint64_t(a.head_dim) * 2, 128,
                                 cuuint64_t(a.head_dim) * 2 * a.block_size};
  const cuuint32_t box[4] = {64, cuuint32_t(a.block_size), cuuint32_t(halves), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = EncodeFn()(
      &map, a.is_bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(pool), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw std::runtime_error(MapError("page box", r, a));
  return map;
}

template <typename T, int HD>
void Launch(const PrefillArgs& a, cudaStream_t stream) {
  using Tr = WgmmaTraits<HD>;
  auto kernel = PrefillWgmmaKernel<T, HD>;
  LLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  // V: the page-box map (default) or the panel-box map (kV4PanelBoxV); only the one in use is
  // encoded.
  const CUtensorMap mk = PoolMap(a.k, a);
  const CUtensorMap mv = (a.v4_flags & kV4PanelBoxV) ? PoolMap(a.v, a) : PagePoolMap(a.v, a);
  const bool cluster = a.v4_flags & kV4Cluster;
  const int kpair = cluster ? 2 : 1;
  const int ny = (a.max_q_len + Tr::kBr - 1) / Tr::kBr;
  const int items = a.num_seqs * a.num_heads * ((ny + kpair - 1) / kpair);
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(Tr::kThreads);
  cfg.dynamicSmemBytes = Tr::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kpair;  // CTAs 2u, 2u+1: neighbouring query tiles of one head
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster ? 1 : 0;
  int units = items;
  if (!(a.v4_flags & kV4NoPersist)) {
    // As many units as are resident at once: 1 CTA per SM, or as many 2-CTA clusters as the
    // GPCs hold. Counted once per instantiation (thread-safe static initialisation: tensor-
    // parallel ranks launch from their own threads; their GPUs are of one kind).
    static const int sms = std::max(NumSms(), 1);
    int resident = sms;
    if (cluster) {
      static const int clusters = [&] {
        cudaLaunchConfig_t q = cfg;
        q.gridDim = dim3(2 * sms);
        int n = 0;
        LLM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &q));
        return std::max(n, 1);
      }();
      resident = clusters;
    }
    units = std::min(items, resident);
  }
  cfg.gridDim = dim3(units * kpair);
  LLM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, mk, mv, a));
}

}  // namespace

void LaunchPrefillWgmma(const PrefillArgs& a, cudaStream_t stream) {
  if (a.is_bf16) {
    a.head_dim == 64 ? Launch<__nv_bfloat16, 64>(a, stream) : Launch<__nv_bfloat16, 128>(a, stream);
  } else {
    a.head_dim == 64 ? Launch<__half, 64>(a, stream) : Launch<__half, 128>(a, stream);
  }
}

}  // namespace llm::cuda::detail
