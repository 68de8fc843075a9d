// The forward pass of one step on the worker's stream: every layer's kernels (RMSNorm, q|k|v,
// RoPE + KV append, attention, o, gate|up, SiLU·mul, down) on the GEMV kernel for small steps
// or cuBLASLt (fp8: W8A8), then the logits of the rows that need them.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "engine/cuda/cuda_worker.h"
#include "kernels/cuda/attention/prefill_attention.h"

namespace llm {

PagedKvView<void> CudaWorker::Kv(int64_t layer) const {
  return {k_pool[size_t(layer)], v_pool[size_t(layer)], layout};
}

cuda::AttentionParams CudaWorker::AttentionParamsOf(int64_t layer) const {
  cuda::AttentionParams p;
  const PagedKvView<void> kv = Kv(layer);
  p.kv = {kv.k, kv.v, kv.layout};
  p.num_heads = heads;
  p.scale = config.AttentionScale();
  p.dtype = dtype;
  p.kv_format = kv_format;
  return p;
}

CudaWorker::RowSlice CudaWorker::AllRows(int64_t n) const {
  return {0, n, stream, gemm.get(), decode_ws, act8};
}

void CudaWorker::DecodeAttention(int64_t layer, const Shape& s, const RowSlice& r) {
  cuda::AttentionParams p = AttentionParamsOf(layer);
  const int64_t offset = r.off * q_dim * int64_t(esize);
  p.q = static_cast<const std::byte*>(q) + offset;
  p.out = static_cast<std::byte*>(attn) + offset;
  p.batch = {r.n, d_cu, d_ctx + r.off, d_tables + r.off * s.width, s.width};
  p.batch.sliding_window = config.SlidingWindowOf(layer);  // 0: full causal
  p.max_q_len = 1;
  p.max_num_keys = s.max_keys_decode;
  cuda::PagedDecodeAttention(p, s.splits, r.decode_ws, kDecodeWorkspaceBytes, r.stream);
}

void CudaWorker::Attention(int64_t layer, const Shape& s) {
  cuda::AttentionParams p = AttentionParamsOf(layer);
  // This layer's sliding window (0: full causal), set on every batch below.
  const int64_t window = config.SlidingWindowOf(layer);
  const int64_t nd = s.num_decode;
  if (nd > 0) DecodeAttention(layer, s, AllRows(nd));
  if (s.num_seqs > nd) {
    const int64_t offset = nd * q_dim * int64_t(esize);
    p.q = static_cast<const std::byte*>(q) + offset;
    p.out = static_cast<std::byte*>(attn) + offset;
    p.batch = {s.num_seqs - nd, d_cu_prefill, d_ctx + nd, d_tables + nd * s.width, s.width};
    p.batch.sliding_window = window;
    p.max_q_len = s.max_q_len;
    p.max_num_keys = s.max_keys_prefill;
    if (s.prefill_groups.empty()) {
      cuda::PagedPrefillAttention(p, stream);
    }
    // fp8 KV: v4 over a copy of each group's pages (cu_prefill indexes q from the first
    // prefill token, so a group keeps q and out and offsets the per-sequence arrays).
    for (const Shape::PrefillGroup& g : s.prefill_groups) {
      p.batch = {g.end - g.begin, d_cu_prefill + (g.begin - nd), d_ctx + g.begin,
                 d_tables + g.begin * s.width, s.width};
      p.batch.sliding_window = window;
      // A group of one sequence with more pages than the scratch holds runs on the mma.sync
      // kernel (no scratch), even where the table's slack would hold its pages.
      const cuda::PrefillScratch scratch{prefill_scratch, prefill_scratch_bytes, g.pages};
      const bool fits = g.pages <= prefill_scratch_pages;
      if (cuda::PagedPrefillAttention(p, stream, cuda::PrefillVariant::kBest,
                                      fits ? &scratch : nullptr) == cuda::PrefillVariant::kWgmma) {
        ++stats.fp8_prefill_copies;
      }
    }
  }
}

// One linear layer of a small step on the GEMV kernel (kernels/cuda/gemv/gemv.h); with `norm`,
// `in` is the fp32 residual and the RMSNorm runs in the GEMV's prologue.
// fp8: w_scale is the matrix's row scales (e4m3 weights, bf16/fp16 activations).
cuda::GemvArgs CudaWorker::SmallArgs(cuda::GemvEpilogue epilogue, const void* in, const float* norm,
                                     const void* w, const float* w_scale, void* out, int64_t n,
                                     int64_t m, int64_t k) const {
  cuda::GemvArgs g;
  g.w_scale = w_scale;
  g.epilogue = epilogue;
  g.x = in;
  g.norm_weight = norm;
  g.eps = float(config.rms_norm_eps);
  g.w = w;
  g.y = out;
  g.n = n;
  g.m = m;
  g.k = k;
  g.dtype = dtype;
  g.ring = opt.gemv_ring && norm == nullptr;
  g.ring_kib = opt.gemv_ring_kib;
  g.balanced = opt.gemv_balanced_grid;
  return g;
}

void CudaWorker::SmallLinear(cuda::GemvEpilogue epilogue, const void* in, const float* norm,
                             const void* w, const float* w_scale, void* out, int64_t n, int64_t m,
                             int64_t k) {
  cuda::Gemv(SmallArgs(epilogue, in, norm, w, w_scale, out, n, m, k), stream);
}

// Moves the RMSNorm of the fp32 residual `resid` (weight `norm`) into g's prologue when the
// executor's option allows it and the GEMV supports it; false: g still reads `normed`, which
// a separate AddRmsNorm must write.
bool CudaWorker::FuseNorm(cuda::GemvArgs& g, const float* resid, const float* norm) const {
  if (!opt.gemv_norm_prologue) return false;
  cuda::GemvArgs fused = g;
  fused.x = resid;
  fused.norm_weight = norm;
  fused.ring = false;  // the ring kernel has no prologue
  if (!cuda::GemvSupports(fused)) return false;
  g = fused;
  return true;
}

// The RMSNorm (weight) of the residual x before GEMV g, which reads `normed`: folded (the
// GEMV before g wrote `normed` and x's sums of squares: GemvArgs::rms_partials), in g's
// prologue (FuseNorm), or its own kernel.
void CudaWorker::NormBefore(cuda::GemvArgs& g, bool folded_in, const float* weight, int64_t n) {
  if (combine_pending) {  // the sum's fused RMSNorm kernel (no fold or prologue reads it)
    ResidualNorm(weight, normed, nullptr, n, n);
    return;
  }
  if (folded_in) {
    g.ring = false;  // nor the fold
    g.rms_partials = rms_partials;
    g.rms_num_partials = (hidden + 3) / 4;  // the producer's row groups
    ++stats.gemv_folded_norms;
    return;
  }
  if (FuseNorm(g, x, weight)) {
    ++stats.gemv_prologue_norms;
    return;
  }
  cuda::AddRmsNorm(x, nullptr, weight, normed, dtype, nullptr, n, hidden,
                   float(config.rms_norm_eps), stream);
}

void CudaWorker::ResidualNorm(const float* weight, void* out, const int32_t* rows, int64_t num_rows,
                              int64_t n) {
  const float eps = float(config.rms_norm_eps);
  // A gathered norm (the final one: rows the scheduler picked, distinct or not) adds the sum
  // by MoeCombine first, so that no row's residual is updated twice.
  if (rows != nullptr) FlushCombine(n);
  if (combine_pending) {
    cuda::MoeCombineRmsNorm(x, moe_down, routing, int(top_k), weight, out, dtype, rows, num_rows,
                            hidden, eps, stream);
    combine_pending = false;
    return;
  }
  cuda::AddRmsNorm(x, nullptr, weight, out, dtype, rows, num_rows, hidden, eps, stream);
}

void CudaWorker::FlushCombine(int64_t n) {
  if (!combine_pending) return;
  cuda::MoeCombine(moe_down, routing, n, int(top_k), hidden, x, /*accumulate=*/true, stream);
  combine_pending = false;
}

// g (a residual GEMV) also writes the folded RMSNorm's input for the GEMV after it: `normed`
// = dtype(weight ⊙ x) and rms_partials (GemvArgs::rms_partials).
void CudaWorker::FoldInto(cuda::GemvArgs& g, const float* weight) const {
  g.rms_weight = weight;
  g.rms_x = normed;
  g.rms_partials = rms_partials;
  g.ring = false;  // the ring kernel does not fold
}

// o (folded into: GemvArgs::rms_partials), gate|up and down of layer i in one kernel
// (cuda::GemvChain, opt.gemv_chain); down folds the next layer's input RMSNorm (after the last
// layer the final norm's weight: its own kernel reads x, the fold's outputs go unread; there
// the fold path's last down adds with RED, which flushes subnormals, so the two paths agree bit
// for bit except on subnormal residuals). False (nothing enqueued) where the chain cannot run
// the shapes.
bool CudaWorker::ChainMlp(const cuda::GemvArgs& o, const Layer& l, int64_t i, int64_t n) {
  using E = cuda::GemvEpilogue;
  cuda::GemvChainArgs c;
  c.phase[0] = o;
  c.phase[1] =
      SmallArgs(E::kSiluMul, normed, nullptr, l.gate_up, l.gate_up_s, act, n, 2 * inter, hidden);
  c.phase[1].rms_partials = rms_partials;
  c.phase[1].rms_num_partials = (hidden + 3) / 4;
  c.phase[2] = SmallArgs(E::kAccumulateF32, act, nullptr, l.down, l.down_s, x, n, hidden, inter);
  FoldInto(c.phase[2], i + 1 < config.num_layers ? layers[size_t(i + 1)].input_norm : final_norm);
  c.sync = chain_sync;
  for (cuda::GemvArgs& g : c.phase) g.ring = false;
  if (chain_sync == nullptr || !cuda::GemvChainSupports(c)) return false;
  cuda::GemvChain(c, stream);
  ++stats.gemv_folded_norms;  // gate|up's
  ++stats.gemv_chains;
  return true;
}

cuda::QkvPrologue CudaWorker::Prologue(const Layer& l) const {
  cuda::QkvPrologue pre{l.qkv_bias, l.q_norm, l.k_norm, float(config.rms_norm_eps)};
  pre.head_warps = opt.rope_head_warps;
  return pre;
}

bool CudaWorker::SmallStep(int64_t rows) const {
  return gemv_ok && rows <= std::min<int64_t>(cuda::kGemvMaxTokens, opt.gemv_max_tokens);
}

// Every kernel of one step, on `stream` (capturable: no sync, no allocation).
void CudaWorker::RunModel(const Shape& s) {
  const int64_t n = s.num_tokens;
  const float eps = float(config.rms_norm_eps);
  const DType f32 = DType::kF32;
  // Steps of at most gemv_max_tokens tokens (decode at small batch) run every linear layer
  // on the GEMV kernel, which streams the weights at close to the copy bandwidth where
  // cuBLASLt's n = 1 kernels reach 1.5-2 TB/s on 4096-wide matrices; its epilogues carry
  // RoPE + KV append (q|k|v), the residual add (o, down) and SiLU·mul (gate|up): per layer
  // RMSNorm, q|k|v, attention, o, RMSNorm, gate|up, down. Two opt-in alternatives for the
  // RMSNorms, both measured slower on the H200 (bench/RESULTS.md): opt.gemv_fold_norm folds
  // them into the GEMVs (GemvArgs::rms_partials: o and down also write the next RMSNorm's
  // input dtype(weight ⊙ x) into `normed` and its sums of squares, gate|up and the next
  // layer's q|k|v scale their sums by 1 / rms; layer 0's input RMSNorm stays a kernel), and
  // opt.gemv_norm_prologue normalizes in each GEMV's prologue (FuseNorm). With both, the
  // fold wins where it applies and the prologue takes layer 0's q|k|v.
  const bool small = SmallStep(n);
  using E = cuda::GemvEpilogue;
  const bool fold = small && (opt.gemv_fold_norm || opt.gemv_chain) && dtype == DType::kBF16 &&
                    shard.size == 1 && rms_partials != nullptr && num_experts == 0;
  bool folded = false;  // normed and rms_partials hold x's folded RMSNorm for q|k|v
  combine_pending = false;
  cuda::EmbeddingGather(embed, dtype, d_tokens, n, hidden, x, stream, embed_scale);
  const bool sandwich = features.sandwich_norms;  // Gemma: o and down outputs normalized
  const bool gelu = features.mlp == MlpKind::kGeGluTanh;
  const bool overlapped = OverlapStep(s);
  if (overlapped) RunLayersOverlapped(s);  // every layer, as two halves
  for (int64_t i = 0; i < config.num_layers && !overlapped; ++i) {
    if (fp8 && !small) {  // W8A8: the layer's own path
      FlushCombine(n);    // (only small steps defer the MoE sum)
      RunLayerFp8(i, s);
      continue;
    }
    const Layer& l = layers[size_t(i)];
    // Small steps: q|k|v, RoPE and the KV append in one GEMV where it takes the head layout.
    cuda::GemvArgs rope =
        SmallArgs(E::kRopeAppendKv, normed, nullptr, l.qkv, l.qkv_s, q, n, qkv_dim, hidden);
    if (small) {
      const PagedKvView<void> kv = Kv(i);
      rope.rope = {.positions = d_positions,
                   .slot_mapping = d_slots,
                   .inv_freq = l.inv_freq,
                   .num_heads = int(heads),
                   .num_kv_heads = int(kv_heads),
                   .head_dim = int(config.head_dim),
                   .layout = kv.layout,
                   .k_cache = kv.k,
                   .v_cache = kv.v,
                   .kv_format = kv_format};
    }
    // The GEMV's RoPE epilogue has no q/k/v bias or q/k norm: those layers store q|k|v and
    // run RopeAppendKv with its prologue.
    const cuda::QkvPrologue pre = Prologue(l);
    const bool rope_gemv = small && !pre.any() && cuda::GemvSupports(rope);
    // The fold needs both GEMVs of each pair; x always holds the whole residual, so a step
    // can fall back to the RMSNorm kernel at any layer.
    const bool fold_here = fold && rope_gemv;
    if (rope_gemv) {
      NormBefore(rope, folded && fold_here, l.input_norm, n);
      cuda::Gemv(rope, stream);
    } else {
      ResidualNorm(l.input_norm, normed, nullptr, n, n);
      if (small) {
        SmallLinear(E::kStore, normed, nullptr, l.qkv, l.qkv_s, qkv, n, qkv_dim, hidden);
      } else {
        gemm->Linear(normed, l.qkv, qkv, n, qkv_dim, hidden, dtype, dtype, false, stream);
      }
      cuda::RopeAppendKv(qkv, d_positions, d_slots, l.inv_freq, n, int(heads), int(kv_heads),
                         int(config.head_dim), Kv(i), dtype, q, stream, kv_format, pre);
    }
    Attention(i, s);
    // o and down add their output to the residual stream x. Tensor parallel: each rank's is
    // a partial sum; rank 0 adds its partial to x, the others store theirs in x, and the
    // all-reduce leaves x + Σ partials on every rank.
    const bool add = shard.rank == 0;
    const E residual = add ? E::kAccumulateF32 : E::kStoreF32;
    // Sandwich norms (one GPU: CudaExecutor::Create refuses them with tensor parallelism):
    // o and down store their output in `delta`, whose RMSNorm AddNormedDelta adds to x.
    const E out_epilogue = sandwich ? E::kStore : residual;
    void* const out = sandwich ? delta : static_cast<void*>(x);
    auto add_out = [&](const float* norm) {
      if (sandwich) cuda::AddNormedDelta(x, delta, norm, dtype, n, hidden, eps, stream);
    };
    if (small) {
      // o: one CTA per row group, not the persistent wave. The decode attention's CTAs still
      // hold SM slots when o launches (PDL), so some persistent CTAs would start late with a
      // full share of rows each: Llama-2-7B batch 1 4.40 ms/token persistent, 3.90 not
      // (bench/RESULTS.md).
      cuda::GemvArgs o = SmallArgs(out_epilogue, attn, nullptr, l.o, l.o_s, out, n, hidden, q_dim);
      o.waves = 0;
      if (fold_here) FoldInto(o, l.post_norm);
      if (fold_here && opt.gemv_chain && !sandwich && !gelu && !l.moe && ChainMlp(o, l, i, n)) {
        folded = i + 1 < config.num_layers;
        continue;
      }
      cuda::Gemv(o, stream);
      add_out(l.attn_out_norm);
      AllReduceResidual(n);
      if (l.moe) {
        cuda::AddRmsNorm(x, nullptr, l.post_norm, normed, dtype, nullptr, n, hidden, eps, stream);
        MoeMlp(l, i, n);
        AllReduceResidual(n);
        continue;
      }
      // GeGLU: gate|up stored, then the activation (the GEMV's epilogue is SiLU's).
      cuda::GemvArgs gu = SmallArgs(gelu ? E::kStore : E::kSiluMul, normed, nullptr, l.gate_up,
                                    l.gate_up_s, gelu ? gate_up : act, n, 2 * inter, hidden);
      NormBefore(gu, fold_here, l.post_norm, n);
      cuda::Gemv(gu, stream);
      if (gelu) cuda::GeluTanhMul(gate_up, act, n, inter, dtype, stream);
      cuda::GemvArgs down =
          SmallArgs(out_epilogue, act, nullptr, l.down, l.down_s, out, n, hidden, inter);
      folded = fold_here && i + 1 < config.num_layers;
      if (folded) FoldInto(down, layers[size_t(i + 1)].input_norm);
      cuda::Gemv(down, stream);
      add_out(l.mlp_out_norm);
    } else {
      gemm->Linear(attn, l.o, out, n, hidden, q_dim, dtype, sandwich ? dtype : f32,
                   add && !sandwich, stream);
      add_out(l.attn_out_norm);
      AllReduceResidual(n);
      cuda::AddRmsNorm(x, nullptr, l.post_norm, normed, dtype, nullptr, n, hidden, eps, stream);
      if (l.moe) {
        MoeMlp(l, i, n);
        AllReduceResidual(n);
        continue;
      }
      gemm->Linear(normed, l.gate_up, gate_up, n, 2 * inter, hidden, dtype, dtype, false, stream);
      if (gelu) {
        cuda::GeluTanhMul(gate_up, act, n, inter, dtype, stream);
      } else {
        cuda::SiluMul(gate_up, act, n, inter, dtype, stream);
      }
      gemm->Linear(act, l.down, out, n, hidden, inter, dtype, sandwich ? dtype : f32,
                   add && !sandwich, stream);
      add_out(l.mlp_out_norm);
    }
    AllReduceResidual(n);
  }
  if (s.num_rows == 0 || shard.rank != 0) return;  // rank 0 alone computes logits
  ResidualNorm(final_norm, rows_normed, d_rows, s.num_rows, n);
  if (SmallStep(s.num_rows)) {
    SmallLinear(E::kStoreF32, rows_normed, nullptr, lm_head, nullptr, logits, s.num_rows, vocab,
                hidden);
  } else {
    gemm->Linear(rows_normed, lm_head, logits, s.num_rows, vocab, hidden, dtype, f32, false,
                 stream);
  }
}

// The router's logits (fp32, on the GEMV kernel for small steps), the routing and grouping,
// gate|up over each pair's token through its expert, SiLU·mul, down (fp32), and the weighted
// sum added to x (kernels/cuda/moe/moe.h). fp8 experts: weight-only on the GEMV for small steps
// (as the dense layers), W8A8 otherwise (`normed` and the activations quantized per row).
// Tensor parallel: every rank routes alike (the router is whole on each) through its slice of
// each expert; rank 0 adds its partial sum to x, the others store theirs, and the caller's
// all-reduce sums them (as the dense down projection). No MoE architecture has sandwich norms.
void CudaWorker::MoeMlp(const Layer& l, int64_t layer, int64_t n) {
  const int64_t pairs = n * top_k;
  const int e = int(num_experts), k = int(top_k);
  const auto kernels = static_cast<cuda::MoeKernels>(opt.moe_kernels - 1);  // 1 .. 5: kV1 .. kV5
  const bool small = SmallStep(n);
  if (small) {
    SmallLinear(cuda::GemvEpilogue::kStoreF32, normed, nullptr, l.router, nullptr, router_logits, n,
                num_experts, hidden);
  } else {
    gemm->Linear(normed, l.router, router_logits, n, num_experts, hidden, dtype, DType::kF32, false,
                 stream);
  }
  cuda::MoeRoute(router_logits, n, e, k, config.norm_topk_prob, routing, stream, kernels);
  if (moe_routing_log) {  // a copy node in captured graphs too
    LLM_CUDA_CHECK(cudaMemcpyAsync(moe_routing_log + layer * max_tokens * top_k, routing.experts,
                                   size_t(pairs) * 4, cudaMemcpyDeviceToDevice, stream));
  }
  const bool w8a8 = fp8 && !small;
  if (w8a8) {
    cuda::QuantizeRowsE4m3(normed, dtype, n, hidden, act8, act8_scale, nullptr, stream);
  }
  cuda::MoeGemm g;
  g.x = w8a8 ? static_cast<const void*>(act8) : normed;
  g.x_scale = w8a8 ? act8_scale : nullptr;
  g.gather = true;
  g.top_k = k;
  g.w = l.experts_gate_up;
  g.w_scale = l.experts_gate_up_s;  // null unless fp8
  g.dtype = dtype;
  g.out = moe_gate_up;
  g.n = 2 * moe_inter;
  g.k = hidden;
  g.num_pairs = pairs;
  g.num_experts = e;
  // kV3's GEMV writes SiLU(gate) · up itself (small steps, bf16 / fp16 or weight-only fp8).
  g.silu_mul = cuda::MoeFusesSiluMul(g, kernels);
  if (g.silu_mul) g.out = moe_act;
  cuda::MoeGroupedGemm(g, routing, stream, kernels);
  if (g.silu_mul) {
    g.silu_mul = false;
  } else if (w8a8) {
    cuda::SiluMulE4m3(moe_gate_up, static_cast<uint8_t*>(moe_act), moe_act8_scale, pairs, moe_inter,
                      dtype, stream);
  } else {
    cuda::SiluMul(moe_gate_up, moe_act, pairs, moe_inter, dtype, stream);
  }
  g.x = moe_act;
  g.x_scale = w8a8 ? moe_act8_scale : nullptr;
  g.gather = false;
  g.w = l.experts_down;
  g.w_scale = l.experts_down_s;
  g.out = moe_down;
  g.out_f32 = true;
  g.n = hidden;
  g.k = moe_inter;
  cuda::MoeGroupedGemm(g, routing, stream, kernels);
  if (small && shard.size == 1 && opt.moe_combine_in_norm) {  // the next RMSNorm adds it
    combine_pending = true;
    return;
  }
  cuda::MoeCombine(moe_down, routing, n, k, hidden, x, /*accumulate=*/shard.rank == 0, stream);
}

// One layer with fp8 weights (W8A8): each GEMM's input is quantized per token by the kernel
// that produces it (the RMSNorms and SiLU·mul write e4m3 codes and scales; the attention
// output takes a quantization pass of its own), and cuBLASLt applies both scale vectors in
// its FP8 GEMM's epilogue (engine/cuda/gemm.h).
void CudaWorker::RunLayerFp8(int64_t i, const Shape& s) {
  const int64_t n = s.num_tokens;
  const float eps = float(config.rms_norm_eps);
  const Layer& l = layers[size_t(i)];
  const RowSlice all = AllRows(n);
  LayerFp8Qkv(i, all);
  Attention(i, s);
  LayerFp8O(i, all);
  AllReduceResidual(n);
  if (l.moe) {  // the router reads `normed` in dtype; MoeMlp quantizes it for the experts
    cuda::AddRmsNorm(x, nullptr, l.post_norm, normed, dtype, nullptr, n, hidden, eps, stream);
    MoeMlp(l, i, n);
    AllReduceResidual(n);
    return;
  }
  LayerFp8Mlp(i, all);
  AllReduceResidual(n);
}

// The slice's rows of the step's buffers (x, act8_scale, qkv, q, attn, gate_up: one row per
// token at a fixed width; act8: the slice's own base, r.act8).
void CudaWorker::LayerFp8Qkv(int64_t i, const RowSlice& r) {
  const Layer& l = layers[size_t(i)];
  float* const xr = x + r.off * hidden;
  float* const scale = act8_scale + r.off;
  std::byte* const qkv_r = static_cast<std::byte*>(qkv) + r.off * qkv_dim * int64_t(esize);
  std::byte* const q_r = static_cast<std::byte*>(q) + r.off * q_dim * int64_t(esize);
  cuda::AddRmsNormE4m3(xr, nullptr, l.input_norm, r.act8, scale, dtype, nullptr, r.n, hidden,
                       float(config.rms_norm_eps), r.stream);
  r.gemm->LinearFp8(r.act8, scale, l.qkv, l.qkv_s, qkv_r, r.n, qkv_dim, hidden, dtype, false,
                    r.stream);
  cuda::RopeAppendKv(qkv_r, d_positions + r.off, d_slots + r.off, l.inv_freq, r.n, int(heads),
                     int(kv_heads), int(config.head_dim), Kv(i), dtype, q_r, r.stream, kv_format,
                     Prologue(l));
}

void CudaWorker::LayerFp8O(int64_t i, const RowSlice& r) {
  const Layer& l = layers[size_t(i)];
  const bool add = shard.rank == 0;  // tensor parallel: see RunModel
  float* const scale = act8_scale + r.off;
  const std::byte* const attn_r = static_cast<std::byte*>(attn) + r.off * q_dim * int64_t(esize);
  cuda::QuantizeRowsE4m3(attn_r, dtype, r.n, q_dim, r.act8, scale, nullptr, r.stream);
  r.gemm->LinearFp8(r.act8, scale, l.o, l.o_s, x + r.off * hidden, r.n, hidden, q_dim, DType::kF32,
                    add, r.stream);
}

void CudaWorker::LayerFp8Mlp(int64_t i, const RowSlice& r) {
  const Layer& l = layers[size_t(i)];
  const bool add = shard.rank == 0;
  float* const xr = x + r.off * hidden;
  float* const scale = act8_scale + r.off;
  std::byte* const gu = static_cast<std::byte*>(gate_up) + r.off * 2 * inter * int64_t(esize);
  cuda::AddRmsNormE4m3(xr, nullptr, l.post_norm, r.act8, scale, dtype, nullptr, r.n, hidden,
                       float(config.rms_norm_eps), r.stream);
  r.gemm->LinearFp8(r.act8, scale, l.gate_up, l.gate_up_s, gu, r.n, 2 * inter, hidden, dtype, false,
                    r.stream);
  cuda::SiluMulE4m3(gu, r.act8, scale, r.n, inter, dtype, r.stream);
  r.gemm->LinearFp8(r.act8, scale, l.down, l.down_s, xr, r.n, hidden, inter, DType::kF32, add,
                    r.stream);
}

// --decode-overlap: whether step s runs as two halves (CudaExecutorOptions::decode_overlap).
// overlap_stream exists only for a model that can (Setup: fp8 weights, one GPU, dense layers,
// no sandwich norms); the rest is the step's: decode rows only, and enough of them for cuBLASLt.
bool CudaWorker::OverlapStep(const Shape& s) const {
  return overlap_stream != nullptr && s.num_seqs == s.num_decode && s.num_tokens == s.num_seqs &&
         s.num_tokens >= kDecodeOverlapMinRows && !SmallStep(s.num_tokens);
}

// Every layer of a decode step as two halves of its rows, the first on `stream`, the second
// on overlap_stream, half a layer apart: a half's q|k|v waits until the other half's q|k|v of
// the layer before (first half) or of this layer (second half) has run, so each half's
// attention (memory-bound) runs beside the other half's GEMMs (compute-bound). The halves
// share nothing but the weights (each row's math is its own; the KV appends and reads are the
// half's own sequences'): own GEMM objects (workspaces), decode workspaces and e4m3 codes.
// Capturable: the fork and the join are events, so a graph captured on `stream` takes in
// overlap_stream's kernels.
void CudaWorker::RunLayersOverlapped(const Shape& s) {
  const int64_t n = s.num_tokens;
  const int64_t na = std::min(n - 1, (n / 2 + 7) / 8 * 8);  // a multiple of 8 rows first
  const int64_t widest = std::max({hidden, q_dim, inter});  // act8's row width at most
  const RowSlice half[2] = {
      {0, na, stream, overlap_gemm[0].get(), decode_ws, act8},
      {na, n - na, overlap_stream, overlap_gemm[1].get(), overlap_decode_ws, act8 + na * widest}};
  LLM_CUDA_CHECK(cudaEventRecord(overlap_fork, stream));  // after the embedding
  LLM_CUDA_CHECK(cudaStreamWaitEvent(overlap_stream, overlap_fork));
  auto join = [&] {
    LLM_CUDA_CHECK(cudaEventRecord(overlap_join, overlap_stream));
    LLM_CUDA_CHECK(cudaStreamWaitEvent(stream, overlap_join));
  };
  try {
    for (int64_t i = 0; i < config.num_layers; ++i) {
      for (int h = 0; h < 2; ++h) {
        const RowSlice& r = half[h];
        if (h == 1 || i > 0) LLM_CUDA_CHECK(cudaStreamWaitEvent(r.stream, overlap_qkv[1 - h]));
        LayerFp8Qkv(i, r);
        LLM_CUDA_CHECK(cudaEventRecord(overlap_qkv[h], r.stream));
        DecodeAttention(i, s, r);
        LayerFp8O(i, r);
        LayerFp8Mlp(i, r);
      }
    }
  } catch (...) {  // (a GEMM without an algorithm): no stream capture may end forked
    cudaEventRecord(overlap_join, overlap_stream);
    cudaStreamWaitEvent(stream, overlap_join);
    throw;
  }
  join();
}

}  // namespace llm
