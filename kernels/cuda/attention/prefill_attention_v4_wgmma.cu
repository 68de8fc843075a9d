// Prefill attention, rung 4 (v4_wgmma): Hopper warpgroup MMA fed by TMA — the FlashAttention-3
// recipe (sm_90a), as far as this rung takes it.
//
// Algorithm: a persistent grid of CTAs (one per SM; in cluster mode as many pairs as the GPCs
// hold), 3 warpgroups (384 threads) each; a CTA
// walks its share of the (128-row query tile, head, sequence) work items in a snake order over
// the CTAs (GetWorkSplit / GetItemCoords below), query tiles heaviest first over the (sequence,
// head) pairs of an L2 section: as many pairs as have their K/V in half the L2, when there are
// more than half as many (sequence, KV head) pairs as SMs, else one section (the launcher;
// kV4AllPairs: always one). kV4NoPersist launches one CTA per item instead (2-5% slower).
//  - Producer warpgroup 0 gives its registers away (setmaxnreg.dec 40); its first warp streams
//    128-key K and V tiles into a 3-stage ring: lane i issues the TMA boxes of page i of the
//    tile (a page's block_size rows of one KV head are contiguous in the pool): K as one
//    cp.async.bulk.tensor.3d box per 64-column panel, V as one 4-D box of both panels (below),
//    all completing on the stage's "full" mbarrier (expect_tx = bytes of the pages that exist). It
//    refills a stage once every consumer warp has arrived on its "empty" mbarrier. The ring runs on
//    from one item to the next, so the next item's first tiles load while the consumers finish the
//    last one.
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
//    Production (kV4Auto) uses none at head_dim 128: with block size 16 the load traffic is
//    what the math waits on, and the schedules that hide the softmax gain no more than they
//    cost (within ±1.6% on an H100, 2026-12-06); at head_dim 64 (half the math per key tile)
//    it runs ping-pong, 7-12% faster. The cluster loads faster but its pairs wait for each
//    other (RESULTS.md, "Prefill v4: where the time goes"). Production's two candidates
//    (kV4Default, kV4NoOverlap) are compiled with their bits as constants (kFixed below): the
//    other schedules' code is left out (a third of the instructions), the steady loop needs one
//    P register set, and the next item's loop scalars ride in registers from its Q prefetch.
//    Every other schedule runs on the runtime-bit kernel (kV4Generic forces it).
//  - Sliding window (PrefillArgs::sliding_window): an item's key tiles start at the one holding
//    its first row's first visible key (slot j = key tile first_tile + j; the tiles left of it
//    are never loaded), and rows whose window starts inside a tile get a left mask there (a
//    warp-uniform branch, never taken without a window). The cluster mode multicasts nothing
//    with a window (the pair's tiles start at different keys).
//  - Keys past the sequence end in the last tile: their pages are not loaded, and those V rows
//    are zeroed by the consumers (stale slots may hold NaN, and 0·NaN = NaN).
// Shared memory (head_dim 128): Q 32 KiB + 3 stages × (K 32 + V 32) KiB = 224 KiB, 1 CTA/SM.
// Test:  ninja -C build prefill_attention_gpu_test &&
//        (cd build && ctest -L gpu -R prefill_attention)
//        e4m3 caches: the kv_fp8*_gpu_test targets, then ctest -L gpu -R kv_fp8
// Bench: ninja -C build bench_prefill_attention_gpu && ./build/bench_prefill_attention_gpu
//        (--kv fp8: e4m3 caches, through the copy of prefill_attention_fp8.cu)
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
// a TMA store of O. Tried and dropped (bench/NOTEBOOK.md, 2026-12-06 evening): the next item's
// first S issued under this item's epilogue (-7% at head_dim 64, ±2% at 128).
// One file for one kernel: PrefillWgmmaKernel's 20 instantiations ({bf16, fp16} × {64, 128} ×
// {no window: runtime bits, kV4Default, kV4NoOverlap; sliding window: runtime bits,
// production's}),
// the device helpers only it uses (work split, wgmma descriptors) and its host launcher (tensor
// maps, persistent grid); the instructions themselves are kernels/cuda/common/ptx.cuh's.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/prefill_item_order.h"

namespace llm::cuda::detail {
namespace {

template <int HD>
struct WgmmaTraits {
  static constexpr int kConsumers = 2;  // consumer warpgroups
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBr = 64 * kConsumers;  // query rows per CTA (64 per warpgroup)
  static constexpr int kBc = 128;              // keys per tile (the S wgmma's N)
  static_assert(kMaxKeyTile % kBc == 0,
                "FirstKeyRead (kernels/paged_kv.h): every key tile divides the widest");
  static constexpr int kStages = 3;        // K/V ring depth: a tile's loads get two iterations
  static constexpr int kHalves = HD / 64;  // 64-column (128-byte) swizzle panels
  static constexpr uint32_t kQHalfBytes = kBr * 128;  // one panel: kBr rows × 128 B
  static constexpr uint32_t kQBytes = kHalves * kQHalfBytes;
  static constexpr uint32_t kKvHalfBytes = kBc * 128;
  static constexpr uint32_t kKvBytes = kHalves * kKvHalfBytes;  // one K (or V) stage
  static constexpr uint32_t kBarBytes = 128;                    // 3 · kStages mbarriers of 8 bytes
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
  static_assert((kEntryRegs - kProducerRegs) * 128 >=
                    (kConsumerRegs - kEntryRegs) * 128 * kConsumers,
                "setmaxnreg budget");
};

// The instructions (kernels/cuda/common/ptx.cuh): cp.async for Q, TMA + mbarriers for K/V,
// cluster and named barriers, register reallocation, wgmma.
using ptx::ClusterArrive;
using ptx::ClusterCtaRank;
using ptx::ClusterWait;
using ptx::CpAsync16;
using ptx::CpAsyncWaitAll;
using ptx::FastExp2;
using ptx::FenceProxyAsync;  // generic-proxy shared writes -> later wgmma / TMA reads
using ptx::FenceRegs;
using ptx::MbarArrive;
using ptx::MbarArriveCount;
using ptx::MbarArriveRemote;
using ptx::MbarExpectTx;
using ptx::MbarInit;
using ptx::MbarInitFence;
using ptx::MbarWait;  // traps after ~2^24 polls instead of hanging the GPU
using ptx::NamedBarrier;
using ptx::NamedBarrierArrive;
using ptx::SetMaxNRegDec;
using ptx::SetMaxNRegInc;
using ptx::SmemAddr;
using ptx::StoreSharedZero16;
using ptx::TmaLoad3d;
using ptx::TmaLoad3dMulticast;
using ptx::TmaLoad4d;
using ptx::TmaLoad4dMulticast;
using ptx::WgmmaCommit;
using ptx::WgmmaFence;
using ptx::WgmmaRS128;  // D[64×128] += A (registers) · B (smem, transposed)
using ptx::WgmmaRS64;   // D[64×64] += A (registers) · B (smem, transposed)
using ptx::WgmmaSS128;  // D[64×128] (+)= A (smem) · B (smem), both K-major
using ptx::WgmmaWait;

using ptx::DescAt;  // shared-memory matrix descriptors, 128-byte swizzle
using ptx::DescBase;
using ptx::MakeDescBase;

// a[i] for a runtime i in [0, 4), as selects (no local-memory indexing).
__device__ __forceinline__ uint32_t Pick4(const uint32_t (&a)[4], int i) {
  return i == 0 ? a[0] : i == 1 ? a[1] : i == 2 ? a[2] : a[3];
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
  int first_tile;  // the item's first key tile (> 0 only with a sliding window): slot j of the
                   // item holds key tile first_tile + j
  int n_tiles;     // K/V tiles this CTA reads in this item (0: its query tile is past the chunk)
  int n_slots;     // pipeline slots of the item, the same in both CTAs of a pair: max of theirs
  int common;      // tiles 0 … common-1 are read by both CTAs of a pair: loaded once, multicast
};
struct WorkSplit {
  int kpair, units, unit, items;
  int ny2;  // items (query tiles or pairs of them) per (sequence, head)
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
  w.ny2 = (ny + w.kpair - 1) / w.kpair;
  w.items = a.num_seqs * a.num_heads * w.ny2;
  if (!persist) w.items = min(w.items, w.units);  // one item per unit (the grid covers all)
  return w;
}
template <int kBr, int kBc, bool kWindow>
__device__ __forceinline__ ItemCoords GetItemCoords(const PrefillArgs& a, const WorkSplit& w,
                                                    int item) {
  ItemCoords ic;
  TileCoords& c = ic.c;
  // L2 sections of a.item_section (sequence, head) pairs (kernels/prefill_item_order.h).
  const PrefillItem it = PrefillItemAt(item, a.num_seqs * a.num_heads, w.ny2, a.item_section);
  const int bh = it.pair, p = it.tile_from_last;
  c.seq = bh / a.num_heads;
  c.head = bh % a.num_heads;
  c.kv_head = c.head / a.group;
  c.q_start = a.cu_seqlens_q[c.seq];
  c.q_len = a.cu_seqlens_q[c.seq + 1] - c.q_start;
  c.ctx = a.context_lens[c.seq];
  c.num_keys = c.ctx + c.q_len;
  const int ny = (a.max_q_len + kBr - 1) / kBr;
  // Causal: a query tile sees keys up to its last row's position; otherwise all of them. With
  // a sliding window, from the tile holding its first row's first visible key (the key tiles
  // left of it are skipped).
  auto first_tile = [&](int q0) {
    if constexpr (!kWindow) return 0;
    return q0 < 0 ? 0 : int(VisibleKeyBegin(c.ctx + q0, a.sliding_window)) / kBc;
  };
  auto tiles = [&](int q0) {
    if (q0 < 0 || q0 >= c.q_len) return 0;
    return ((a.causal ? min(c.num_keys, c.ctx + q0 + kBr) : c.num_keys) + kBc - 1) / kBc -
           first_tile(q0);
  };
  const int first = (ny - 1 - p * w.kpair) * kBr;  // rank 0's (the heavier) tile
  c.q0 = first - int(w.rank) * kBr;
  ic.first_tile = first_tile(c.q0);
  ic.n_tiles = tiles(c.q0);
  if (w.kpair == 2) {
    const int peer_tiles = tiles(w.rank == 0 ? first - kBr : first);
    // A window starts the pair's tiles at different keys, so slot j is not the same tile in
    // both: nothing is multicast then (each CTA loads its own; the slots stay in step).
    ic.common = kWindow ? 0 : min(ic.n_tiles, peer_tiles);
    ic.n_slots = max(ic.n_tiles, peer_tiles);
  } else {
    ic.common = 0;
    ic.n_slots = ic.n_tiles;
  }
  return ic;
}

// kWindow: a.sliding_window > 0 (the launcher picks it), so that without a window the kernel is
// compiled exactly as before the window existed (the window's scalars cost v4 ~1% at hd 128).
// kFixed: the schedule bits as a compile-time constant (production's, ResolveV4Flags), so the
// other schedules' code is not compiled in; kRuntimeFlags: a.v4_flags decides at run time.
constexpr int kRuntimeFlags = -1;
template <typename T, int HD, bool kWindow, int kFixed>
__global__ void __launch_bounds__(WgmmaTraits<HD>::kThreads, 1)
    PrefillWgmmaKernel(const __grid_constant__ CUtensorMap tmap_k,
                       const __grid_constant__ CUtensorMap tmap_v, const PrefillArgs a) {
  using Tr = WgmmaTraits<HD>;
  // (the runtime bits are read where used, from the parameter bank: held in a register, they
  // made the sliding-window kernel spill)
  auto flag = [&](int bit) { return ((kFixed == kRuntimeFlags ? a.v4_flags : kFixed) & bit) != 0; };
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
  // (the cluster bit stays a runtime one: known false, it let ptxas hoist more into the
  // producer's 40 registers, which spilled 160 bytes at head_dim 64)
  const bool cluster = a.v4_flags & kV4Cluster;
  const bool persist = !flag(kV4NoPersist);
  const bool compute_only = flag(kV4ComputeOnly);
  // V tile layout: [page][panel][key in page][64] (one box per page, the default) or
  // [panel][key][64] (kV4PanelBoxV: a box per page and panel, like K).
  const bool page_v = !flag(kV4PanelBoxV);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full_k(s), 1);
      MbarInit(full_v(s), 1);
      MbarInit(empty(s), 2 * 4 * Tr::kConsumers);
    }
    MbarInitFence();
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
    SetMaxNRegDec<Tr::kProducerRegs>();
    if (threadIdx.x >= 32) return;
    const WorkSplit ws = GetWorkSplit<kBr>(a, cluster, persist);
    const int lane = threadIdx.x;
    const int bs = a.block_size, pages_per_tile = kBc / bs;
    uint32_t g = 0;  // slots so far
    for (int trip = 0;; ++trip) {
      const int item = ws.Item(trip);
      if (item < 0) break;
      const ItemCoords ic = GetItemCoords<kBr, kBc, kWindow>(a, ws, item);
      const TileCoords& c = ic.c;
      const int32_t* table = a.block_tables + c.seq * a.max_blocks_per_seq;
      for (int j = 0; j < ic.n_slots; ++j, ++g) {
        const int st = g % kStages, use = g / kStages, k0 = (kWindow ? ic.first_tile + j : j) * kBc;
        const bool no_data = j >= ic.n_tiles || (compute_only && g >= kStages);
        // This lane's page, read from the block table before the wait for the stage, so the
        // table's latency is not added to the loads of a stage just given back.
        const bool mine = !no_data && lane < pages_per_tile && k0 + lane * bs < c.num_keys;
        const int box = mine ? table[k0 / bs + lane] * a.num_kv_heads + c.kv_head : 0;
        if (use > 0) MbarWait(empty(st), (use - 1) & 1);
        if (no_data) {
          if (lane == 0) {  // no data: complete the stage's phase (profiling: no more loads)
            MbarArrive(full_k(st));
            MbarArrive(full_v(st));
          }
          continue;
        }
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
  SetMaxNRegInc<Tr::kConsumerRegs>();
  const int w = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g4 = lane / 4, t = lane % 4;
  const uint32_t q_base = sQ + w * 64 * 128;
  float o[HD / 2];
  float m[2], l[2];                             // l: this thread's partial sums
  float s[64];                                  // S of the current tile (64 × 128 per warpgroup)
  uint32_t pa0[kBc / 16][4], pa1[kBc / 16][4];  // P of two tiles: register A operands of P·V
  float alpha[2];  // O's rescale factor for the current tile (rows row0, +8)
  const bool ping_pong = !flag(kV4NoPingPong);
  const bool overlap = !flag(kV4NoOverlap);
  const bool skip_exp = flag(kV4SkipExp);
  const bool loads_only = flag(kV4LoadsOnly);
  // Per-item values the main loop reads, as plain scalars (the item's other coordinates are
  // recomputed for the epilogue: a persistent loop must not hold more registers than one tile).
  uint32_t g0 = 0;   // slots before this item
  int diag = 0;      // ctx + this warpgroup's first row: key > diag + r masks row r (causal)
  int last_key = 0;  // the sequence's last key: key > last_key masks every row (non-causal)
  int kt0 = 0;       // the item's first key tile (sliding window; slot j is key tile kt0 + j)
  const int window = kWindow ? a.sliding_window : 0;  // key <= diag + r - window masks row r
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
    const int k0 = (kWindow ? kt0 + j : j) * kBc;
    // The window's left edge: only in tiles where some row of the warpgroup (the last is
    // diag + 63) still has keys left of its window.
    if (kWindow && k0 + window <= diag + 63) {
      // key - k0 - 2t <= llim (+ 8 for row0 + 8): left of the row's window, masked
      const int llim = diag + warp * 16 + g4 - window - k0 - 2 * t;
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (n * 8 + (e & 1) <= llim + (e >> 1) * 8) s[n * 4 + e] = -INFINITY;
    }
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
    for (int kk = 0; kk < kBc / 16; ++kk) FenceRegs(p[kk]);
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

  // Q rows of an item by cp.async into this warpgroup's 64 rows of the Q tile (no wait).
  auto load_q = [&](const TileCoords& c) {
    const int wq0 = c.q0 + w * 64;  // this warpgroup's first query row
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
  };
  // Q prefetch: once an item's last S = Q·Kᵀ has completed in all four warps, the next item's
  // Q rows are requested, so their latency hides under the last P·V and the epilogue instead
  // of opening the next item (kV4NoQPrefetch: load at the item's start).
  const bool q_prefetch = !flag(kV4NoQPrefetch);
  const bool narrow_stores = flag(kV4NarrowStores);
  bool q_pending = false;  // this item's Q is already in flight
  // The next item's loop scalars, read where its Q is prefetched: its start then loads nothing
  // (there, its coordinate loads queued behind the last tile's output stores: 14% of the stall
  // samples at 512 tokens, ncu 2026-12-06). Compile-time schedules only (they have the
  // registers: one P set; the runtime-bit kernel spilled 20-36 bytes carrying them).
  constexpr bool kCarry = kFixed != kRuntimeFlags;
  struct {
    int n_tiles, n_slots, diag, last_key, kt0;
  } nx = {0, 0, 0, 0, 0};
  for (int trip = 0;; ++trip) {
    int item, n_tiles, n_slots;
    {
      const WorkSplit ws = GetWorkSplit<kBr>(a, cluster, persist);
      item = ws.Item(trip);
      if (item < 0) break;
      if (kCarry && q_pending) {  // read at the prefetch, before the last tile's stores
        n_tiles = nx.n_tiles;
        n_slots = nx.n_slots;
        diag = nx.diag;
        last_key = nx.last_key;
        kt0 = nx.kt0;
      } else {
        const ItemCoords ic = GetItemCoords<kBr, kBc, kWindow>(a, ws, item);
        n_tiles = loads_only ? 0 : ic.n_tiles;
        n_slots = ic.n_slots;
        diag = ic.c.ctx + ic.c.q0 + w * 64;
        last_key = ic.c.num_keys - 1;
        kt0 = kWindow ? ic.first_tile : 0;
      }
    }
    if (n_tiles > 0) {
      // This warpgroup's 64 Q rows, unless the previous item already prefetched them.
      if (!q_pending) {
        const WorkSplit ws = GetWorkSplit<kBr>(a, cluster, persist);
        load_q(GetItemCoords<kBr, kBc, kWindow>(a, ws, item).c);
      }
      q_pending = false;
      CpAsyncWaitAll();
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
      // Steady state. With overlap, two tiles per trip so that each P register set has a fixed
      // name (P_j is written while P_{j-1}·V_{j-1} may still read the other set). Without, the
      // P·V has landed before the softmax writes P_j: one set, one step per trip (half the
      // loop's code), in the compile-time schedules (the runtime-bit kernel keeps the two-set
      // loop for every schedule: with both loops its sliding-window form spilled 20 bytes).
      const bool two_sets = overlap || kFixed == kRuntimeFlags;
      if (two_sets) {
        for (int j = 1; j < n_tiles; j += 2) {
          step(j, pa1, pa0);
          if (j + 1 < n_tiles) step(j + 1, pa0, pa1);
        }
      } else {
        for (int j = 1; j < n_tiles; ++j) step(j, pa0, pa0);
      }
      if (q_prefetch) {
        const WorkSplit ws = GetWorkSplit<kBr>(a, cluster, persist);
        const int next = ws.Item(trip + 1);
        if (next >= 0) {
          const ItemCoords nic = GetItemCoords<kBr, kBc, kWindow>(a, ws, next);
          if (nic.n_tiles > 0 && !loads_only) {
            NamedBarrier(1 + w, 128);  // every warp's last S (which reads Q) has completed
            load_q(nic.c);
            q_pending = true;
            nx = {nic.n_tiles, nic.n_slots, nic.c.ctx + nic.c.q0 + w * 64, nic.c.num_keys - 1,
                  kWindow ? nic.first_tile : 0};
          }
        }
      }
      // Last P·V.
      {
        const int j = n_tiles - 1, st = stage(j), k0 = (kWindow ? kt0 + j : j) * kBc;
        const int num_keys =
            GetItemCoords<kBr, kBc, kWindow>(a, GetWorkSplit<kBr>(a, cluster, persist), item)
                .c.num_keys;
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
            StoreSharedZero16(addr);
          }
          FenceProxyAsync();
          NamedBarrier(1 + w, 128);
        }
        // With two sets, P_j lives in pa1 for odd j: select it into pa0 (no branch around a
        // wgmma, which would make ptxas inject fences). With one, it is in pa0.
        const bool odd = two_sets && (j & 1);
#pragma unroll
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

      // Normalise and store (rows past the chunk are dropped). A thread holds 2 columns of
      // each 8-column chunk of its rows; a 4 x 4 transpose inside each quad (three shuffles
      // per 4 chunks) gives it whole chunks instead (chunk 4i + t of the quad's row), so a
      // row goes out in 16-byte stores: a quarter of the store instructions, each touching as
      // many 128-byte lines as a 4-byte one did (kV4NarrowStores: the 4-byte stores).
      const WorkSplit ws2 = GetWorkSplit<kBr>(a, cluster, persist);
      const TileCoords c2 = GetItemCoords<kBr, kBc, kWindow>(a, ws2, item).c;
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
        T* dst = out + (int64_t(c2.q_start + row) * a.num_heads + c2.head) * HD;
        if (narrow_stores) {
          if (row < c2.q_len) {
#pragma unroll
            for (int n = 0; n < HD / 8; ++n) {
              *reinterpret_cast<uint32_t*>(dst + n * 8 + 2 * t) =
                  PackPair<T>(o[n * 4 + 2 * h] * inv, o[n * 4 + 2 * h + 1] * inv);
            }
          }
          continue;
        }
#pragma unroll
        for (int i = 0; i < HD / 32; ++i) {
          // p[j]: this thread's pair of chunk 4i + j. Thread u of the quad wants pair u of
          // every thread's p[u]: in round k it receives p[t] of thread t ^ k.
          uint32_t p[4], r[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int n = 4 * i + j;
            p[j] = PackPair<T>(o[n * 4 + 2 * h] * inv, o[n * 4 + 2 * h + 1] * inv);
          }
          r[0] = Pick4(p, t);
#pragma unroll
          for (int k = 1; k < 4; ++k) r[k] = __shfl_xor_sync(0xffffffffu, Pick4(p, t ^ k), k);
          // Columns 2u, 2u + 1 of chunk 4i + t came from thread u: r[u ^ t].
          const uint4 v = {Pick4(r, t), Pick4(r, 1 ^ t), Pick4(r, 2 ^ t), Pick4(r, 3 ^ t)};
          if (row < c2.q_len) *reinterpret_cast<uint4*>(dst + (4 * i + t) * 8) = v;
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

template <typename T, int HD, bool kWindow>
void Launch(const PrefillArgs& a, cudaStream_t stream) {
  using Tr = WgmmaTraits<HD>;
  constexpr int kProduction = ResolveV4Flags(kV4Auto, HD);
  static_assert(!(kProduction & kV4Generic), "production runs the compile-time schedule");
  // The two schedules production picks between (kV4Default, ping-pong = kV4NoOverlap) are
  // compiled as constants, the other without a window only; every other schedule runs on the
  // runtime-bit kernel.
  constexpr int kOther = kProduction == kV4Default ? kV4NoOverlap : kV4Default;
  const int sched = a.v4_flags & ~(kV4AllPairs | kV4TinySections);  // host-side bits (the order)
  auto kernel = PrefillWgmmaKernel<T, HD, kWindow, kRuntimeFlags>;
  if (sched == kProduction) kernel = PrefillWgmmaKernel<T, HD, kWindow, kProduction>;
  if constexpr (!kWindow) {
    if (sched == kOther) kernel = PrefillWgmmaKernel<T, HD, kWindow, kOther>;
  }
  LLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  // V: the page-box map (default) or the panel-box map (kV4PanelBoxV); only the one in use is
  // encoded.
  const CUtensorMap mk = PoolMap(a.k, a);
  const CUtensorMap mv = (a.v4_flags & kV4PanelBoxV) ? PoolMap(a.v, a) : PagePoolMap(a.v, a);
  const bool cluster = a.v4_flags & kV4Cluster;
  const int kpair = cluster ? 2 : 1;
  const int ny = (a.max_q_len + Tr::kBr - 1) / Tr::kBr;
  const int pairs = a.num_seqs * a.num_heads;  // (sequence, head)
  const int items = pairs * ((ny + kpair - 1) / kpair);
  // Counted once per instantiation (thread-safe static initialisation: tensor-parallel ranks
  // launch from their own threads; their GPUs are of one kind).
  static const int sms = std::max(NumSms(), 1);
  static const int64_t l2 = std::max(L2CacheBytes(), 1 << 20);
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
    // GPCs hold.
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
  // The item order's L2 sections (kernels/prefill_item_order.h: PrefillItemSection).
  PrefillArgs ka = a;
  const int64_t keys =
      a.max_num_keys > 0 ? a.max_num_keys : a.max_blocks_per_seq * int64_t(a.block_size);
  ka.item_section = (a.v4_flags & kV4AllPairs) ? pairs
                    : (a.v4_flags & kV4TinySections)
                        ? std::min(3 * a.group, pairs)
                        : PrefillItemSection(a.num_seqs, a.num_heads, a.group, keys,
                                             int64_t(HD) * 2 * 2, l2, sms);
  ka.item_section = std::max(ka.item_section, 1);
  LLM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, mk, mv, ka));
}

template <typename T>
void LaunchDims(const PrefillArgs& a, cudaStream_t stream) {
  if (a.sliding_window > 0) {
    a.head_dim == 64 ? Launch<T, 64, true>(a, stream) : Launch<T, 128, true>(a, stream);
  } else {
    a.head_dim == 64 ? Launch<T, 64, false>(a, stream) : Launch<T, 128, false>(a, stream);
  }
}

}  // namespace

void LaunchPrefillWgmma(const PrefillArgs& a, cudaStream_t stream) {
  if (a.is_bf16) {
    LaunchDims<__nv_bfloat16>(a, stream);
  } else {
    LaunchDims<__half>(a, stream);
  }
}

}  // namespace llm::cuda::detail
