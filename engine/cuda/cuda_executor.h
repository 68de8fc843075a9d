// The CUDA backend: the Llama forward pass of engine/cpu/cpu_model.h on one GPU.
//
//   bf16 (or fp16) weights, activations and paged KV cache; fp32 residual stream and fp32
//   accumulation everywhere. Per layer:
//     AddRmsNorm -> QKV GEMM (one fused [q|k|v] weight) -> RopeAppendKv (RoPE fused with the
//     paged KV append) -> flash attention (split-KV decode kernel for decode rows, tiled
//     prefill kernel for chunks) -> O GEMM with the residual add in its epilogue
//     -> AddRmsNorm -> gate|up GEMM (one fused weight) -> SiluMul -> down GEMM (+ residual)
//   then the final norm gathers only the rows that need logits, the lm_head GEMM writes fp32
//   logits, and the GPU sampler returns token ids (and requested logprobs) to the host.
//   GEMMs: cuBLASLt (engine/cuda/gemm.h); fused ops and sampler: kernels/cuda/ops/model_ops.h;
//   attention: kernels/cuda/attention/{prefill,decode}_attention.h.
//
// Tensor parallelism (options.tensor_parallel_size = N > 1; engine/model/tensor_parallel.h): one
// worker (engine/cuda/cuda_worker.h) per GPU 0..N-1 holding its shard (heads, MLP features, KV
// heads), rank 0 driven by the caller's thread and each other rank by a worker thread of its own. A
// step is uploaded and validated by rank 0 first, then handed to the workers (the batch broadcast),
// which upload and enqueue the same step on their GPUs; the ranks meet only on the device, in NCCL:
// the tokens that async scheduling feeds from rank 0's sampler are broadcast from rank 0, and the
// partial outputs of o_proj and down_proj are all-reduced (fp32, in place on the residual
// stream: rank 0 adds its partial to the residual, the others store theirs). Rank 0 alone
// computes the logits and samples. Decode graphs are captured on every rank, NCCL calls
// included.
//
// Memory: weights first (from safetensors, converted on the host when the checkpoint's dtype
// differs, uploaded layer by layer; or generated on the device for --load-format dummy), then
// every activation buffer for the largest step (max_num_batched_tokens tokens, max_num_seqs
// sequences), then a profiling pass of that step; the KV pool takes
// gpu_memory_utilization × total memory minus what is in use after it. Nothing is allocated
// per step, so a step never runs out of memory.
//
// Async scheduling (Launch / Wait): a step's decode tokens may be "the id the previous step
// sampled for task r" (ForwardBatch::prev_sample_rows); a small kernel copies them from the
// sampler's output buffer into the token-id input buffer before the graph (or eager forward)
// runs, so the host never waits for them.
//
// CUDA graphs: decode-only steps run as graphs captured per (padded batch size, decode split
// count, block-table width bucket); batch sizes 1, 2, 4, 8, 16, 24, 32, … (steps of 8, then
// 16 past 64) up to max_graph_batch, captured on first use and at start-up for the split
// count of short contexts. Prefill and mixed steps run eagerly.
#pragma once

#include <memory>
#include <string>

#include "engine/executor.h"
#include "kernels/dtype.h"

namespace llm {

struct CudaExecutorOptions {
  DType dtype = DType::kBF16;  // weights, activations and KV cache (kBF16 / kF16)
  // --kv-cache-dtype fp8: the KV cache holds FP8 E4M3 codes (kernels/cuda/attention/attention.h,
  // KvCacheFormat; per-tensor scales of 1), half the bytes of bf16: twice the tokens in the
  // same memory, half the bytes decode attention streams.
  bool kv_cache_fp8 = false;
  // fp8 KV cache: prefill and mixed steps' attention runs the wgmma kernel over an exact
  // bf16/fp16 copy of the step's prefill pages, made by one memory-bound pass into a scratch
  // sized at start-up for a maximum-length sequence
  // (kernels/cuda/attention/prefill_attention_fp8.cu), instead of the mma.sync kernel that reads
  // e4m3 directly (--no-fp8-prefill-wgmma).
  bool fp8_prefill_wgmma = true;
  // The scratch's pages (0: a maximum-length sequence's plus a step's new tokens); tests set it
  // small so that a step's prefill sequences run as several launches.
  int64_t fp8_prefill_scratch_pages = 0;
  // --quantization fp8: the linear layers' weights (q|k|v, o, gate|up, down) become e4m3 codes
  // with one fp32 scale per output row, quantized on the device at load (as
  // cpu::QuantizeFp8Rows, bit for bit at one GPU; tensor parallel, each rank scales the rows of
  // its own slice, so the column-split o and down get per-rank row scales); activations are
  // quantized per token on the fly (fused into the RMSNorm and SiLU·mul kernels) and the GEMMs run
  // on cuBLASLt's FP8 path (W8A8, engine/cuda/gemm.h). Embeddings and lm_head stay dtype. Needs
  // every linear layer's input width (hidden, q_dim, intermediate per GPU) to be a multiple of 16.
  bool fp8_weights = false;
  // fp8: the GEMMs' accumulation on the tensor cores' fast path (CUBLASLT_MATMUL_DESC_FAST_ACCUM,
  // what vLLM's and TensorRT-LLM's FP8 kernels use) rather than cuBLASLt's periodic promotion
  // to fp32 (its default; --fp8-precise-accum). Accuracy of both:
  // tests/kernels/fp8_linear_gpu_test.
  bool fp8_fast_accum = true;
  // cuBLASLt algorithms tuned at start-up (cuda::Gemm::set_tuning): one eager pass per
  // captured decode batch size (above gemv_max_tokens) times the heuristic's candidates for
  // every GEMM shape it runs and keeps the fastest. Prefill-sized shapes (thousands of tokens)
  // keep the heuristic: their tuned picks measured slower. One GPU only (tensor parallel keeps
  // the heuristic's picks). Off (--gemm-autotune): end to end it measured +0.2-0.3% on the
  // H200 (Llama-3-8B throughput, three same-call A/Bs) for ~3 s of start-up, although in one
  // of two GEMM bench calls the 512-row shapes gained 12-14% (bench/RESULTS.md); timed picks
  // may also differ between two executors of one process, which some tests' bit-for-bit
  // comparisons rely on.
  bool gemm_autotune = false;
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 8192;  // the largest step: sizes the activation buffers
  int64_t max_num_seqs = 256;
  // Most rows of logits one step returns (0: max_num_seqs, which is what the engine asks
  // for; tests asking for every position's logits raise it). Costs rows × vocab × 4 bytes.
  int64_t max_logits_rows = 0;
  double gpu_memory_utilization = 0.90;
  int64_t num_kv_blocks = 0;  // > 0: exactly this many (tests); 0: from memory
  bool cuda_graphs = true;
  // Steps of at most this many tokens (<= 8) run their linear layers on the GEMV kernel
  // (kernels/cuda/gemv/gemv.h) instead of cuBLASLt; 0 = never.
  int64_t gemv_max_tokens = 8;
  // Mixture-of-experts layers on kernels/cuda/moe/moe.h's MoeKernels kV1 .. kV5 (1 .. 5).
  // kV2 (one grouping kernel, a GEMV for steps of at most 8 tokens, 4-stage tiles) measured
  // faster than kV1 on the H200; kV3 (routing and grouping in one kernel for small steps, tiles
  // that skip empty fragments, a GEMV streaming through a shared-memory ring and writing
  // SiLU·mul itself) faster than kV2 on the H100 (Qwen3-30B-A3B batch 1 4.091 ms/token against
  // 4.189; throughput equal: bench/RESULTS.md). kV4 (kV3 with the expert GEMMs of steps whose
  // experts average more than 32 rows on warpgroup MMAs, sm_90a, 128-row tiles from 128 rows)
  // H100, Qwen3-30B-A3B TTFT of 4,096 tokens 76.3 ms against 157.5, throughput 1.035x, batch 1
  // equal. kV5 (kV4 with every tile step on the warpgroup MMAs, decode steps of 9 or more
  // tokens too) the default since 2026-12-06: H100, Qwen3-30B-A3B 200 x (1,000 + 1,000)
  // 1.375x kV4 in bf16, 1.088x in fp8; TTFT and batch 1 equal.
  int moe_kernels = 5;
  // Mixture of experts, small steps on one GPU: the experts' weighted sum added to the residual
  // by the next RMSNorm (cuda::MoeCombineRmsNorm) instead of a MoeCombine launch of its own.
  // Off: measured no faster (Qwen3-30B-A3B batch 1 3.826 ms/token against 3.800, H100,
  // 2026-12-06): the norm's one CTA per token does the sum's loads as well.
  bool moe_combine_in_norm = false;
  // Mixture of experts: keep every MoE layer's routing of the last step on the device, for
  // LastMoeRouting (tests: where the GPU routes a token differently from the CPU's fp32).
  bool record_moe_routing = false;
  // A step's inputs reach the device in one packed copy and one scatter kernel instead of
  // one copy per input array (~10 per step): Llama-2-7B batch 1, 128 + 256 tokens 3.667
  // ms/token against 3.685 (H200, same call, bench/RESULTS.md).
  bool packed_step_inputs = true;
  // Structured outputs under async scheduling: a grammar step is launched with the step
  // before it in flight and computes its masks while its forward runs (step_runner.cc:
  // Launch). false (--no-async-masks, the baseline before 2026-12-02): the engine waits for
  // the step before a grammar step, whose masks are then computed before its forward is
  // enqueued.
  bool async_masks = true;
  // The decode attention's split selector: at least this many 64-key tiles per split
  // (cuda::DecodeAutoSplits). 1: at small batch a short context splits down to one tile per
  // CTA (Llama-2-7B batch 1, 128 + 256 tokens: 3.697 ms/token against 3.768 with 2, H200).
  int64_t decode_min_tiles_per_split = 1;
  // GEMV steps, bf16, one GPU: the RMSNorms folded into the GEMVs around them (the residual
  // projections write the next RMSNorm's input and sums of squares; q|k|v and gate|up scale
  // by 1 / rms): no RMSNorm kernel inside the layer stack (kernels/cuda/gemv/gemv.h). Off: measured
  // slower end to end on the H200 (bench/RESULTS.md).
  bool gemv_fold_norm = false;
  // The fold (implied) and o, gate|up and down of each dense layer in one persistent
  // kernel with grid barriers between them (cuda::GemvChain): 3 kernels per layer instead of 5.
  // Off: its first version measured slower (H100, bench/RESULTS.md).
  bool gemv_chain = false;
  // GEMV steps: persistent grids of equal shares (cuda::GemvArgs::balanced).
  bool gemv_balanced_grid = false;
  // Two-batch overlap of decode steps (forward.cc, RunLayersOverlapped): a decode-only step of
  // at least kDecodeOverlapMinRows rows with fp8 weights (W8A8) on one GPU, no MoE layer and no
  // sandwich norms runs its rows as two halves on two streams, half a layer apart, so that one
  // half's decode attention (bound by memory) runs beside the other half's GEMMs (bound by
  // compute). decode_overlap_gemm_sms > 0: the halves' GEMMs are chosen and sized for that
  // many SMs (cuBLASLt's SM count target), leaving the rest to the attention beside them.
  // The halves' GEMMs keep cuBLASLt's heuristic picks (gemm_autotune times the one-stream
  // path's). Off: not yet measured.
  bool decode_overlap = false;
  int decode_overlap_gemm_sms = 0;
  // Per-head q/k norms (Qwen3) at head_dim 64 / 128 / 256: RopeAppendKv with one warp per head
  // (cuda::QkvPrologue::head_warps) instead of one CTA per token: Qwen3-30B-A3B batch 1 3.962
  // ms/token against 4.091 (H100, 2026-12-06, bench/RESULTS.md).
  bool rope_head_warps = true;
  // GEMV steps: the RMSNorm before q|k|v and gate|up in the GEMV's prologue (each CTA
  // normalizes the residual row into shared memory) instead of its own kernel. Off: measured
  // slower end to end on the H200 (bench/RESULTS.md).
  bool gemv_norm_prologue = false;
  // GEMV steps: the ring kernel (cuda::GemvArgs::ring: weights through shared memory, filled
  // from the kernel's start, one CTA per SM, so that the next GEMV streams beside the RMSNorm
  // or attention before it). Same bits as the register kernel. Off: measured slower on the
  // H100 (bench/NOTEBOOK.md), e4m3 weights 2x.
  bool gemv_ring = false;
  int gemv_ring_kib = 96;  // its size per CTA (cuda::GemvArgs::ring_kib)
  // Programmatic dependent launch between our kernels (kernels/cuda/common/launch.h) on sm_90+:
  // each kernel launches while its predecessor finishes (a GEMV streams its weights early).
  // Process-wide: the last executor created decides.
  bool programmatic_launch = true;
  // The decode attention's prologue copies (context lengths, page indices, the first tiles'
  // K/V rows but the newest) before its PdlWait, under the previous kernel's tail
  // (cuda::SetDecodeKvBeforeWait); measured 0.4-0.6% faster at batch 1 (H100), bit for bit the
  // same logits and tokens (bf16 and fp8 KV). Process-wide as above.
  bool decode_kv_before_wait = true;
  int64_t max_graph_batch = 0;  // 0: max_num_seqs
  bool dummy_weights = false;   // --load-format dummy: random weights on the device
  uint64_t dummy_seed = 0;
  // The dummy weights' range: uniform in ±dummy_range (vLLM's 1e-3, which keeps activations
  // finite at any depth; tests raise it so that every layer's output shows in the logits).
  float dummy_range = 1e-3f;
  // GPUs 0..N-1 of this process (CUDA_VISIBLE_DEVICES picks them), one shard each, over
  // NCCL; needs a build with NCCL. Dummy weights are the same values as at N = 1 (each rank
  // generates the full tensor and keeps its slice), so N = 1 and N > 1 compare exactly.
  int tensor_parallel_size = 1;
  // N > 1: all-reduce small steps (<= cuda::kP2PFasterThanNccl values) with our one-shot
  // kernel over peer access (kernels/cuda/all_reduce/all_reduce.h) instead of NCCL; vLLM's custom
  // all-reduce. --disable-custom-all-reduce turns it off.
  bool custom_all_reduce = true;
  bool log = true;  // progress and the memory plan on stderr
};

// What the executor measured (the benchmarks read it).
struct CudaExecutorStats {
  int64_t steps = 0, graph_steps = 0, graphs_captured = 0;
  double device_ms = 0;  // CUDA-event time of the device work of all steps (never overlapping)
  double wall_ms = 0;    // host wall time inside ForwardAndSample / Forward / Launch / Wait
  int64_t weight_bytes = 0, kv_cache_bytes = 0, activation_bytes = 0;
  // Weight bytes a decode step of one token streams: every layer and lm_head (the embedding
  // table only when tied to lm_head; otherwise one row per token); of a mixture-of-experts
  // layer, the router and num_experts_per_tok experts.
  int64_t weight_bytes_per_token = 0;
  // Bytes of K and V one token occupies in this rank's KV cache, all layers (the KV pool's
  // bytes per block / block_size; fp8 KV: 1 byte an element).
  int64_t kv_bytes_per_token = 0;
  // Decode-only steps (every sequence of the batch feeds exactly one token), for the decode
  // memory floor: such a step reads weight_bytes_per_token of weights once and the KV of
  // every key its sequences attend to. decode_device_ms is their share of device_ms (the same
  // CUDA-event spans), decode_seq_steps the sum of their batch sizes, decode_kv_tokens_read
  // the sum over their sequences of the keys each attends to per layer (context_len + 1), so
  // that decode_kv_tokens_read × kv_bytes_per_token is the KV they read. Sliding-window
  // layers read at most the window: a model with such layers counts each sequence's keys
  // averaged over its layers (rounded to the nearest token).
  int64_t decode_steps = 0, decode_seq_steps = 0, decode_kv_tokens_read = 0;
  double decode_device_ms = 0;
  int64_t peak_device_bytes = 0;  // total - free after the KV pool (what this process holds)
  // GEMVs enqueued (eagerly or into a captured graph) with their RMSNorm folded in
  // (gemv_fold_norm: consumers) or in their prologue (gemv_norm_prologue): the options' paths
  // taken, not a fallback to the RMSNorm kernel.
  int64_t gemv_folded_norms = 0, gemv_prologue_norms = 0;
  int64_t gemv_chains = 0;     // gemv_chain: the chained MLPs enqueued
  int64_t packed_uploads = 0;  // packed_step_inputs: the packed copies + scatters enqueued
  // fp8 KV: prefill attention launches that ran the wgmma kernel over a copy of the pages.
  int64_t fp8_prefill_copies = 0;
  // decode_overlap: steps run as two halves on two streams (graph replays and eager steps).
  int64_t decode_overlap_steps = 0;
  // gemm_autotune: GEMM shapes timed at start-up, and how many of them chose another algorithm
  // than cuBLASLt's heuristic.
  int64_t gemm_tuned_shapes = 0, gemm_retuned_shapes = 0;
  // Structured outputs: host time computing and packing the allowed-token masks (UploadMasks,
  // on its threads: wall time) and the mask rows uploaded.
  double mask_ms = 0;
  int64_t mask_rows = 0;
};

// Tensor parallel: told of every step a rank > 0 is about to run, on that rank's worker thread,
// before the rank uploads or enqueues any of it (rank 0 has handed the step over and enqueues
// its own side meanwhile). Throwing fails the rank mid-step, as a device fault would: rank 0's
// next wait sees it, aborts the communicators and fails with FatalExecutorError. Tests inject
// a failed rank this way (tests/engine/cuda/cuda_tp_gpu_test.cc).
class PeerStepObserver {
 public:
  virtual ~PeerStepObserver() = default;
  virtual void BeforeStep(int rank, const ForwardBatch& batch) = 0;
};

struct CudaWorker;  // one rank's device state (engine/cuda/cuda_worker.h)

class CudaExecutor final : public ModelExecutor {
 public:
  // model_path: a Hugging Face model folder; with options.dummy_weights, a folder holding a
  // config.json or a config .json file. Throws llm::Error (bad checkpoint, no GPU, too
  // little memory for the KV cache) with a message naming what is wrong.
  // peer_step_observer: see PeerStepObserver (ignored at tensor_parallel_size 1).
  static std::unique_ptr<CudaExecutor> Create(
      const std::string& model_path, const CudaExecutorOptions& options,
      std::shared_ptr<PeerStepObserver> peer_step_observer = nullptr);
  ~CudaExecutor() override;

  const ModelConfig& config() const override;
  std::string Describe() const override;
  int64_t num_kv_blocks() const override;
  int64_t block_size() const override;
  void CopyBlocks(std::span<const BlockCopy> copies) override;
  std::vector<float> Forward(const ForwardBatch& batch) override;
  std::vector<SampleResult> ForwardAndSample(const ForwardBatch& batch,
                                             std::span<const SampleTask> tasks) override;
  // The device sampler applies Sampler::AllowedTokens (sampler_io.cc: SampleRowParams::mask_row).
  bool applies_token_masks() const override { return true; }
  // A launch with a grammar task reads the previous step's tokens into the matchers after
  // enqueueing its own forward, then computes its masks (step_runner.cc: Launch).
  bool applies_token_masks_in_flight() const override;
  // Async steps: Launch enqueues the inputs, the fed tokens' gather (from the previous
  // step's sampled ids, on the device), the forward, the sampler and the copies back, and
  // returns; Wait synchronises on the step's end event. Two steps may be in flight; Forward
  // and ForwardAndSample may not run while one is. A step with a grammar task waits, inside
  // its Launch and after its forward is enqueued, for the step before it (its masks need
  // that step's tokens); that step's Wait then returns at once.
  StepHandle Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) override;
  std::vector<SampleResult> Wait(StepHandle step) override;

  CudaExecutorStats stats() const;
  void ResetStats();
  // With options.record_moe_routing: the experts each mixture-of-experts layer chose for the
  // last step's tokens (Forward, ForwardAndSample or Launch; after that step completed), one
  // [tokens · num_experts_per_tok] list per MoE layer in layer order (most probable first); empty
  // without the option.
  std::vector<std::vector<int32_t>> LastMoeRouting() const;

 private:
  explicit CudaExecutor(std::unique_ptr<CudaWorker> worker);
  std::unique_ptr<CudaWorker> worker_;  // rank 0 (it drives the other ranks' workers)
};

// True when the CUDA backend can run here (a device and a driver); otherwise why not.
bool CudaBackendAvailable(std::string* why_not = nullptr);

// How many CUDA devices this process sees (0 without a driver).
int CudaDeviceCount();

// True when this build can run tensor parallelism (it was built with NCCL).
bool CudaTensorParallelAvailable();

}  // namespace llm
