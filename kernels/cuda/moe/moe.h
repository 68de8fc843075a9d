// Mixture-of-experts kernels (Mixtral, Qwen3-MoE): routing, the permutation of routed tokens by
// expert, one grouped GEMM over every expert's tokens, and the weighted combine. CPU twins:
// kernels/cpu/moe.h (routing, grouping) and CpuModel::MoeMlp (the layer); tests in
// tests/kernels/moe_gpu_test.cc (label gpu).
//
// A MoE MLP on the device, for num_tokens tokens and top_k experts each (num_pairs =
// num_tokens · top_k routed pairs; pair p = token p / top_k, its slot p % top_k):
//
//   logits = router(x)                          cuBLASLt, fp32 [num_tokens, num_experts]
//   MoeRoute(logits)                            experts, weights [num_pairs]; the pairs sorted
//                                               by expert (then pair order), the tile map
//   MoeGroupedGemm(x, gather, W_gate|up)        [num_pairs, 2 · inter], each pair's row through
//                                               its expert's matrix (fp8: e4m3 weights, W8A8
//                                               or weight-only, see MoeGemm)
//   SiluMul                                     [num_pairs, inter]
//   MoeGroupedGemm(act, W_down, fp32 out)       [num_pairs, hidden]
//   MoeCombine                                  residual[t] += Σ_slots weight · row, the slots
//                                               in ascending expert order (as transformers and
//                                               the CPU backend add them)
//
// Every size the device decides (how many pairs each expert has) stays on the device: grids
// are sized by upper bounds from the host's num_tokens, CTAs past the real work exit, and no
// call synchronizes, so a step's MoE layers can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace llm::cuda {

// The rows of the grouped GEMM's tiles: each expert's sorted pairs are cut into tiles of this
// many rows (the last one partial); kV4 / kV5's steps whose experts average at least
// kMoeWideTileRows rows into tiles of that many (MoeTileRows).
inline constexpr int kMoeTileRows = 64;
inline constexpr int kMoeWideTileRows = 128;
// The largest expert count and top k the routing kernel takes.
inline constexpr int kMoeMaxExperts = 256;
inline constexpr int kMoeMaxTopK = 16;

// Which kernels run a step. kV1 (measured on the H200, 2026-12-04): four grouping launches
// (count, scan, place) and every grouped GEMM on 2-stage 64 x 64 mma.sync tiles. kV2: one
// grouping kernel (a single CTA: shared-memory counts, the scan, the placement in pair order by
// warp matching); steps of at most kMoeGemvMaxTokens tokens (every expert then has at most that
// many rows) on a GEMV that streams each chosen expert's weight rows once, larger steps on
// 4-stage tiles. kV3: kV2 with
//   - the routing and the grouping in one kernel (one CTA) for steps of at most
//     kMoeFusedRouteMaxTokens tokens (decode: one launch and one dependent chain fewer); up to
//     32 pairs (batch 1-4 of top 8), a 4-warp kernel whose grouping is one warp's registers;
//   - tiles that skip the 16-row fragments past an expert's last row (no copy, no mma: a decode
//     step of 256 tokens gives an expert of Qwen3-30B-A3B ~16 rows of a 64-row tile, and kV2
//     spent 3/4 of its tensor work and its A copies on padding), with the tile's 4 warps side
//     by side along n (64 x 16 each) when the step averages at most 32 rows per expert;
//   - a GEMV whose lanes stream their 16-byte chunks of two weight rows through their own
//     slots of a 4-stage shared-memory cp.async ring (3 chunks of each row in flight while they
//     multiply one), and which can write SiLU(gate) · up itself (MoeGemm::silu_mul: no gate|up
//     round trip, no SiluMul launch).
// kV4: kV3 with the tiles of steps whose experts average more than 32 rows (prefill-size
// steps, bf16 / fp16 or W8A8) on Hopper warpgroup MMAs (moe_gemm_wgmma.cu: wgmma m64n128 /
// m64n256 from 128B-swizzled shared memory; sm_90a), on 128-row tiles where the experts
// average at least 128 rows (MoeTileRows).
// kV5: kV4 with every tile step on the warpgroup MMAs, also those averaging at most 32 rows per
// expert (decode steps of 9 or more tokens: Qwen3-30B-A3B at 256 tokens gives an expert ~16
// rows, and kV3's mma.sync tiles, whose weight stages are 64 bytes of each row, streamed the
// weights at 0.60 of copy on the H100, slower than cuBLAS's grouped GEMM; the wgmma tiles
// stream 128-byte panels, 0.83-0.91 of copy at 64 or more rows per expert). The wgmma's 64 rows
// are then mostly zeros: tensor work is not what bounds these steps. And the one-CTA routing
// and grouping kernel only for steps one round of its 32 warps routes (kMoeFusedRouteV5Tokens):
// at 64 tokens, two rounds, it took 33 us per call on the H100 where the two kernels (a warp
// per token over many CTAs, then the grouping) took 21 us at 256 tokens.
// All give the same routing and grouping (kV4 / kV5's widest steps in 128-row tiles: MoeRoute
// and MoeGroupedGemm of one step must be called with the same set); the GEMMs agree within
// fp32 rounding.
enum class MoeKernels { kV1, kV2, kV3, kV4, kV5 };

// The rows of the tiles MoeRoute cuts for a step of num_pairs pairs (and MoeGroupedGemm reads):
// kMoeWideTileRows on kV4 / kV5 where the experts average at least that many rows, else
// kMoeTileRows.
inline int MoeTileRows(int64_t num_pairs, int num_experts, MoeKernels kernels) {
  return kernels >= MoeKernels::kV4 && num_pairs >= kMoeWideTileRows * int64_t(num_experts)
             ? kMoeWideTileRows
             : kMoeTileRows;
}
inline constexpr int kMoeGemvMaxTokens = 8;
inline constexpr int kMoeFusedRouteMaxTokens = 64;
inline constexpr int kMoeFusedRouteV5Tokens = 32;

// Routing results and the permutation, device arrays the caller allocates for the largest
// step (sizes in brackets; P = num_pairs, E = num_experts, T = MoeMaxTiles(P, E)).
struct MoeRouting {
  int32_t* experts = nullptr;       // [P] the expert of each pair, most probable slot first
  float* weights = nullptr;         // [P] its routing weight
  int32_t* offsets = nullptr;       // [E + 1] expert e's sorted pairs: [offsets[e], offsets[e+1])
  int32_t* sorted_pairs = nullptr;  // [P] the pairs by expert, then by pair index
  int32_t* pair_rows = nullptr;     // [P] the inverse: pair p's row among the sorted pairs
  int32_t* tile_expert = nullptr;   // [T] each tile's expert (tiles of MoeTileRows rows)
  int32_t* tile_begin = nullptr;    // [T] its first sorted row
  int32_t* num_tiles = nullptr;     // [1] how many tiles this step has

  bool complete() const {
    return experts && weights && offsets && sorted_pairs && pair_rows && tile_expert &&
           tile_begin && num_tiles;
  }
};

// The most tiles of tile_rows rows num_pairs pairs over num_experts experts can need (the
// MoeRouting arrays' size: the default, 64-row tiles, bounds both tile sizes).
inline int64_t MoeMaxTiles(int64_t num_pairs, int64_t num_experts,
                           int64_t tile_rows = kMoeTileRows) {
  return (num_pairs + tile_rows - 1) / tile_rows + num_experts;
}

// Per token: softmax of its fp32 logits [num_tokens, num_experts], the top_k experts (equal
// probabilities: the lower index first), their probabilities divided by their sum when
// `normalize` (cpu::MoeRoute's rule); then the pairs grouped by expert (cpu::GroupByExpert's
// order) and the tile map. num_experts <= kMoeMaxExperts, top_k <= min(kMoeMaxTopK,
// num_experts).
void MoeRoute(const float* logits, int64_t num_tokens, int num_experts, int top_k, bool normalize,
              const MoeRouting& r, cudaStream_t stream, MoeKernels kernels = MoeKernels::kV1);

// One grouped GEMM: out[row, :] = in(row) · W[expert(row)]ᵀ for every sorted row of the
// routing's tiles, where in(row) = x[sorted_pairs[row] / top_k] when `gather` (x: the tokens
// [num_tokens, k]) or x[row] (x: already in sorted order [num_pairs, k]). w: [num_experts][n][k]
// (each expert's nn.Linear weight, row-major); out: [num_pairs, n] in dtype, or fp32 when
// out_f32. fp32 accumulation. Rows of no tile are not written.
//
// Weights and inputs (--quantization fp8 keeps the experts as e4m3 codes with one fp32 scale
// per output row, the rule of cuda::QuantizeRowsE4m3 and cpu::QuantizeFp8Rows):
//   w_scale null, x_scale null   w and x in dtype (bf16 / fp16): mma.sync m16n8k16 tiles (kV4's
//                                wider steps, kV5's all: wgmma m64n128k16 / m64n256k16), or
//                                kV2-kV5's GEMV
//                                for steps of at most kMoeGemvMaxTokens tokens
//   w_scale, x_scale null        weight-only fp8: w e4m3 codes, x in dtype; the GEMV (each row
//                                of W read once per kMoeGemvMaxTokens rows of its expert: for
//                                small steps); out = w_scale[e][j] · Σ code · x
//   w_scale, x_scale             W8A8: x e4m3 codes with one scale per row of x (per token when
//                                gathering, per sorted row otherwise); m16n8k32 e4m3 tiles
//                                (kV4's wider steps, kV5's all: wgmma m64n128k32 /
//                                m64n256k32);
//                                out = x_scale · w_scale[e][j] · Σ code · code
// num_pairs / top_k must be the step's token count and each token's experts distinct (as
// MoeRoute makes them): kV2 picks its GEMV by that count, when no expert can have more rows.
// n and k multiples of 8 (16 with fp8 weights); pointers 16-byte aligned.
struct MoeGemm {
  const void* x = nullptr;
  const float* x_scale = nullptr;  // e4m3 x (W8A8): [rows of x]
  bool gather = false;
  int top_k = 1;
  const void* w = nullptr;
  const float* w_scale = nullptr;  // e4m3 w: [num_experts][n]
  DType dtype = DType::kBF16;      // the activations' (x unless x_scale) and out's type
  void* out = nullptr;
  bool out_f32 = false;
  // out[row, j] = SiLU(gate) · up for j < n / 2, gate and up the row's outputs j and n / 2 + j
  // (w: each expert's gate rows, then its up rows), each rounded to dtype first, as a GEMM into
  // dtype followed by cuda::SiluMul; out: [num_pairs, n / 2] in dtype. Only where
  // MoeFusesSiluMul says so (kV3-kV5's GEMV); the call throws otherwise.
  bool silu_mul = false;
  // kV4 / kV5's warpgroup-MMA tiles: a CTA's outputs, 128 or 256 (its rows are the routing tile's:
  // 64 or 128); 0 lets MoeGroupedGemm pick. For benchmarks and tests; ignored by the other
  // paths.
  int wgmma_cols = 0;
  int64_t n = 0, k = 0, num_pairs = 0;
  int num_experts = 0;
};
void MoeGroupedGemm(const MoeGemm& g, const MoeRouting& r, cudaStream_t stream,
                    MoeKernels kernels = MoeKernels::kV1);

// Whether MoeGroupedGemm runs g on its GEMV (kV2-kV5 steps of at most kMoeGemvMaxTokens tokens,
// and every weight-only fp8 call) rather than on tiles.
bool MoeUsesGemv(const MoeGemm& g, MoeKernels kernels);
// Whether MoeGroupedGemm can take g with silu_mul set: kV3-kV5's GEMV, out in dtype, n even.
bool MoeFusesSiluMul(const MoeGemm& g, MoeKernels kernels);
// The outputs per CTA of the warpgroup-MMA tiles MoeGroupedGemm runs g on (kV4's steps whose
// experts average more than 32 rows, kV5's tile steps: g.wgmma_cols, or 128 on 64-row tiles and
// 256 on 128-row ones), or 0 where it takes another path.
int MoeWgmmaCols(const MoeGemm& g, MoeKernels kernels);

// residual[t, :] (+)= Σ over t's slots, by ascending expert, weight · rows[pair_rows[pair], :]
// (the sum starts at 0 and is added to the residual when `accumulate`, else stored).
// rows: fp32 [num_pairs, hidden] in sorted order; residual fp32 [num_tokens, hidden].
void MoeCombine(const float* rows, const MoeRouting& r, int64_t num_tokens, int top_k,
                int64_t hidden, float* residual, bool accumulate, cudaStream_t stream);

}  // namespace llm::cuda
