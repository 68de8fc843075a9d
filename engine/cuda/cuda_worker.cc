// The worker's lifecycle on its GPU: Configure (sizes), Setup (stream, weights, activations,
// the profiling pass and the KV budget), Finish (the KV pool, the start-up graphs), Release;
// the activation buffers and the KV pool of the memory plan.
#include "engine/cuda/cuda_worker.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/launch.h"

namespace llm {

namespace {

// Padded batch sizes with captured graphs: 1, 2, 4, 8, then steps of 8 to 64, then of 16.
std::vector<int64_t> GraphBatchSizes(int64_t max_batch) {
  std::vector<int64_t> sizes;
  for (int64_t b : {1, 2, 4}) {
    if (b <= max_batch) sizes.push_back(b);
  }
  for (int64_t b = 8; b <= max_batch; b += b < 64 ? 8 : 16) sizes.push_back(b);
  if (sizes.empty() || sizes.back() < max_batch) sizes.push_back(max_batch);
  return sizes;
}

}  // namespace

// Frees everything this rank holds, on its GPU (idempotent; the caller's device is kept).
// After a failed tensor-parallel rank (comms_aborted) it frees nothing: this rank's stream
// may hold a collective that never completes, and every free would wait for it. The
// engine is unhealthy by then and the process is meant to be restarted.
void CudaWorker::Release() {
  if (comms_aborted) {
    LeakDeviceState();
    return;
  }
  int caller_device = 0;
  cudaGetDevice(&caller_device);
  cudaSetDevice(device);
  if (stream) cudaStreamSynchronize(stream);  // a launched step may still use the buffers
  if (mask_stream) cudaStreamSynchronize(mask_stream);
  if (overlap_stream) cudaStreamSynchronize(overlap_stream);
  for (auto& [key, g] : graphs) cudaGraphExecDestroy(g);
  graphs.clear();
  gemm.reset();
  for (auto& g : overlap_gemm) g.reset();
  for (cudaEvent_t* e : {&overlap_fork, &overlap_join, &overlap_qkv[0], &overlap_qkv[1]}) {
    if (*e) cudaEventDestroy(*e);
    *e = nullptr;
  }
  if (overlap_stream) cudaStreamDestroy(overlap_stream);
  overlap_stream = nullptr;
  for (void* p : allocations) cudaFree(p);
  for (OutSlot& o : out) {
    if (o.start) cudaEventDestroy(o.start);
    if (o.stop) cudaEventDestroy(o.stop);
  }
  if (ev_inputs) cudaEventDestroy(ev_inputs);
  if (ev_sync) cudaEventDestroy(ev_sync);
  ev_sync = nullptr;
  if (ev_masks) cudaEventDestroy(ev_masks);
  if (ev_masks_read) cudaEventDestroy(ev_masks_read);
  ev_masks = ev_masks_read = nullptr;
  if (mask_stream) cudaStreamDestroy(mask_stream);
  mask_stream = nullptr;
#if defined(LLM_HAS_NCCL)
  if (comm) ncclCommDestroy(comm);
#endif
  comm = nullptr;
  if (stream) cudaStreamDestroy(stream);
  stream = nullptr;
  allocations.clear();
  for (OutSlot& o : out) o.start = o.stop = nullptr;
  ev_inputs = nullptr;
  cudaSetDevice(caller_device);
}

// Forgets every device and pinned allocation, stream, event and handle without freeing it.
void CudaWorker::LeakDeviceState() {
  for (auto* pinned :
       {&h_tokens, &h_positions, &h_cu, &h_cu_prefill, &h_ctx, &h_tables, &h_rows, &h_feed}) {
    pinned->p = nullptr;
  }
  h_slots.p = nullptr;
  h_params.p = nullptr;
  h_stage.p = nullptr;
  h_adjust.p = nullptr;
  h_masks.p = nullptr;
  for (OutSlot& o : out) {
    o.token.p = o.top_ids.p = nullptr;
    o.logprob.p = o.top_lp.p = nullptr;
    o.start = o.stop = nullptr;
  }
  (void)gemm.release();
  for (auto& g : overlap_gemm) (void)g.release();
  graphs.clear();
  allocations.clear();
  stream = mask_stream = overlap_stream = nullptr;
  overlap_fork = overlap_join = overlap_qkv[0] = overlap_qkv[1] = nullptr;
  ev_inputs = ev_sync = ev_masks = ev_masks_read = nullptr;
  comm = nullptr;
}

void CudaWorker::Log(const std::string& line) const {
  if (!opt.log) return;
  if (shard.size > 1) {
    std::fprintf(stderr, "[cuda %d/%d] %s\n", shard.rank, shard.size, line.c_str());
  } else {
    std::fprintf(stderr, "[cuda] %s\n", line.c_str());
  }
}

// fp8 KV: prefill attention on the wgmma rung over a bf16/fp16 copy of each step's prefill
// pages (cuda::PrefillScratch) instead of the mma.sync rung that reads e4m3 directly.
bool CudaWorker::Fp8PrefillCopies() const {
  // (v4 takes head_dim 64 and 128; at 256 prefill runs on v3, which reads e4m3 directly.)
  return kv_format.fp8 && opt.fp8_prefill_wgmma && decode_kernel_ok && config.head_dim != 256 &&
         cuda::PrefillWgmmaTakesBlockSize(opt.block_size);
}

void CudaWorker::AllocActivations() {
  const int64_t before = allocated_bytes;
  const int64_t T = max_tokens, S = max_seqs;
  x = Alloc<float>(T * hidden * 4);
  normed = Alloc(T * hidden * int64_t(esize));
  qkv = Alloc(T * qkv_dim * int64_t(esize));
  q = Alloc(T * q_dim * int64_t(esize));
  attn = Alloc(T * q_dim * int64_t(esize));
  bool dense_mlp = false;  // a mixture-of-experts model's MoE layers need neither
  for (int64_t i = 0; i < config.num_layers; ++i) dense_mlp = dense_mlp || !config.IsMoeLayer(i);
  if (dense_mlp) {
    gate_up = Alloc(T * 2 * inter * int64_t(esize));
    act = Alloc(T * inter * int64_t(esize));
  }
  if (features.sandwich_norms) delta = Alloc(T * hidden * int64_t(esize));
  rows_normed = Alloc(max_rows * hidden * int64_t(esize));
  // The folded RMSNorm's sums of squares: one per token per 4-row group of the residual.
  rms_partials = Alloc<float>(cuda::kGemvMaxTokens * ((hidden + 3) / 4) * 4);
  if (opt.gemv_chain) {  // zero once; shared by the layers' chains, one at a time
    chain_sync = Alloc<unsigned>(cuda::kGemvChainSyncWords * 4);
    LLM_CUDA_CHECK(cudaMemsetAsync(chain_sync, 0, size_t(cuda::kGemvChainSyncWords) * 4, stream));
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  if (fp8) {
    act8 = Alloc<uint8_t>(T * std::max({hidden, q_dim, inter}));
    act8_scale = Alloc<float>(T * 4);
  }
  logits = Alloc<float>(max_rows * vocab * 4);
  if (num_experts > 0) {
    const int64_t P = T * top_k, E = num_experts, tiles = cuda::MoeMaxTiles(P, E);
    router_logits = Alloc<float>(T * E * 4);
    routing.experts = Alloc<int32_t>(P * 4);
    routing.weights = Alloc<float>(P * 4);
    routing.offsets = Alloc<int32_t>((E + 1) * 4);
    routing.sorted_pairs = Alloc<int32_t>(P * 4);
    routing.pair_rows = Alloc<int32_t>(P * 4);
    routing.tile_expert = Alloc<int32_t>(tiles * 4);
    routing.tile_begin = Alloc<int32_t>(tiles * 4);
    routing.num_tiles = Alloc<int32_t>(4);
    moe_gate_up = Alloc(P * 2 * moe_inter * int64_t(esize));
    moe_act = Alloc(P * moe_inter * int64_t(esize));  // also the W8A8 codes (1 byte each)
    if (fp8) moe_act8_scale = Alloc<float>(P * 4);
    moe_down = Alloc<float>(P * hidden * 4);
    if (opt.record_moe_routing) moe_routing_log = Alloc<int32_t>(config.num_layers * P * 4);
  }
  decode_ws = Alloc(int64_t(kDecodeWorkspaceBytes));
  // Zeroed once: its split arrival counters must start at zero, and every decode attention
  // call leaves them zero (kernels/cuda/attention/decode_attention.h), graph replays included.
  LLM_CUDA_CHECK(cudaMemsetAsync(decode_ws, 0, kDecodeWorkspaceBytes, stream));
  if (overlap_stream != nullptr) {  // the second half's (--decode-overlap), the same way
    overlap_decode_ws = Alloc(int64_t(kDecodeWorkspaceBytes));
    LLM_CUDA_CHECK(cudaMemsetAsync(overlap_decode_ws, 0, kDecodeWorkspaceBytes, stream));
  }
  if (Fp8PrefillCopies()) {
    // A maximum-length sequence's pages, plus a step's new tokens in max_seqs sequences:
    // every step's prefill sequences fit in one launch unless their cached context adds up
    // past one maximum-length sequence (then they run as several launches; Upload). At most
    // 1 GiB of pages (Llama-3.1-8B's 128k context takes ~0.6; the block table copy adds
    // S × table_cap × 4 bytes): a longer sequence's chunks run on the mma.sync kernel, which
    // reads the e4m3 cache directly.
    const int64_t bs = opt.block_size;
    const int64_t step_pages = (T + bs - 1) / bs + S;
    const int64_t page_bytes = 2 * kv_heads * bs * config.head_dim * int64_t(esize);
    const int64_t most = std::max((int64_t{1} << 30) / page_bytes, step_pages);
    prefill_scratch_pages = opt.fp8_prefill_scratch_pages > 0
                                ? opt.fp8_prefill_scratch_pages
                                : std::min(table_cap + step_pages, most);
    prefill_scratch_bytes =
        cuda::PrefillFp8ScratchBytes(PagedKvLayout{1, bs, kv_heads, config.head_dim}, dtype, S,
                                     table_cap, prefill_scratch_pages);
    prefill_scratch = Alloc(int64_t(prefill_scratch_bytes));
    if (shard.rank == 0) {
      Log("fp8 KV cache: prefill attention on the wgmma kernel over a " +
          std::string(DTypeName(dtype)) + " copy of each step's prefill pages (scratch " +
          Gib(double(prefill_scratch_bytes)) + ", " + std::to_string(prefill_scratch_pages) +
          " pages)");
    }
  }

  d_tokens = Alloc<int32_t>(T * 4);
  d_positions = Alloc<int32_t>(T * 4);
  d_slots = Alloc<int64_t>(T * 8);
  d_cu = Alloc<int32_t>((std::max(S, T) + 1) * 4);
  d_cu_prefill = Alloc<int32_t>((S + 1) * 4);
  d_ctx = Alloc<int32_t>(S * 4);
  d_tables = Alloc<int32_t>(S * table_cap * 4);
  d_rows = Alloc<int32_t>(max_rows * 4);
  h_tokens.Alloc(T);
  h_positions.Alloc(T);
  h_slots.Alloc(T);
  h_cu.Alloc(std::max(S, T) + 1);
  h_cu_prefill.Alloc(S + 1);
  h_ctx.Alloc(S);
  h_tables.Alloc(S * table_cap);
  h_rows.Alloc(max_rows);

  d_params = Alloc<cuda::SampleRowParams>(S * int64_t(sizeof(cuda::SampleRowParams)));
  h_params.Alloc(S);
  sample_ws = Alloc(int64_t(cuda::SampleWorkspaceBytes(S, vocab)));
  d_masks = Alloc<uint32_t>(S * cuda::SampleMaskWords(vocab) * 4);
  h_masks.Alloc(S * cuda::SampleMaskWords(vocab));
  d_out.token = Alloc<int32_t>(S * 4);
  d_out.logprob = Alloc<float>(S * 4);
  d_out.top_ids = Alloc<int32_t>(S * cuda::kMaxTopLogprobs * 4);
  d_out.top_logprobs = Alloc<float>(S * cuda::kMaxTopLogprobs * 4);
  for (OutSlot& o : out) {
    o.token.Alloc(S);
    o.logprob.Alloc(S);
    o.top_ids.Alloc(S * cuda::kMaxTopLogprobs);
    o.top_lp.Alloc(S * cuda::kMaxTopLogprobs);
  }
  sampled_cap = max_rows * SamplingParams::kMaxN;  // every row sampled n times at most
  d_sampled = Alloc<int32_t>(sampled_cap * 4);
  d_feed = Alloc<int32_t>(T * 4);
  h_feed.Alloc(T);
  if (opt.packed_step_inputs) {  // every staged array at its largest, each padded to 16 bytes
    auto pad = [](int64_t bytes) { return (bytes + 15) / 16 * 16; };
    stage_cap = 3 * pad(T * 4) + pad(T * 8) + pad((std::max(S, T) + 1) * 4) + pad((S + 1) * 4) +
                pad(S * 4) + pad(S * table_cap * 4) + pad(max_rows * 4) +
                pad(S * int64_t(sizeof(cuda::SampleRowParams)));
    h_stage.Alloc(stage_cap);
    d_stage = Alloc<std::byte>(stage_cap);
  }
  ReserveAdjust(4096);
  activation_bytes = allocated_bytes - before;
}

void CudaWorker::ReserveAdjust(int64_t count) {
  if (count <= adjust_capacity) return;
  const int64_t cap = NextPow2(count);
  if (d_adjust) {
    SyncStream();
    auto it = std::find(allocations.begin(), allocations.end(), static_cast<void*>(d_adjust));
    if (it != allocations.end()) allocations.erase(it);
    cudaFree(d_adjust);
    allocated_bytes -= adjust_capacity * int64_t(sizeof(cuda::LogitAdjust));
    h_adjust.Free();
  }
  d_adjust = Alloc<cuda::LogitAdjust>(cap * int64_t(sizeof(cuda::LogitAdjust)));
  h_adjust.Alloc(cap);
  adjust_capacity = cap;
}

void CudaWorker::AllocKv(int64_t num_blocks) {
  layout = {num_blocks, opt.block_size, kv_heads, config.head_dim};
  const int64_t pool_bytes = layout.pool_elements() * int64_t(kv_esize);
  k_pool.clear();
  v_pool.clear();
  for (int64_t l = 0; l < config.num_layers; ++l) {
    k_pool.push_back(Alloc(pool_bytes));
    v_pool.push_back(Alloc(pool_bytes));
  }
  kv_bytes = 2 * config.num_layers * pool_bytes;
}

void CudaWorker::FreeKv() {
  SyncStream();
  for (auto* pools : {&k_pool, &v_pool}) {
    for (void* p : *pools) {
      allocations.erase(std::find(allocations.begin(), allocations.end(), p));
      cudaFree(p);
    }
    pools->clear();
  }
  allocated_bytes -= kv_bytes;
  kv_bytes = 0;
}

int64_t CudaWorker::BytesPerBlock() const {
  return 2 * config.num_layers * kv_heads * opt.block_size * config.head_dim * int64_t(kv_esize);
}

// The block manager's copy-on-write copies, in every layer of this rank's KV pool.
void CudaWorker::CopyBlocks(std::span<const BlockCopy> copies) {
  const size_t block_bytes = size_t(layout.block_stride()) * kv_esize;
  for (const BlockCopy& c : copies) {
    for (int64_t l = 0; l < config.num_layers; ++l) {
      for (void* pool : {k_pool[size_t(l)], v_pool[size_t(l)]}) {
        auto* base = static_cast<std::byte*>(pool);
        LLM_CUDA_CHECK(cudaMemcpyAsync(base + size_t(c.dst_block) * block_bytes,
                                       base + size_t(c.src_block) * block_bytes, block_bytes,
                                       cudaMemcpyDeviceToDevice, stream));
      }
    }
  }
}

// The profiling pass: a step of `tokens` fresh tokens in as few sequences as the model's
// context allows (each over its own blocks), every sequence asking for its last logits.
void CudaWorker::RunPrefillOnly(int64_t tokens) {
  ForwardBatch b;
  const int64_t per_seq = std::min(tokens, table_cap * opt.block_size);
  int64_t block = 0;
  for (int64_t done = 0; done < tokens && b.num_seqs() < max_seqs; done += per_seq) {
    const int64_t len = std::min(per_seq, tokens - done);
    const int64_t blocks = (len + opt.block_size - 1) / opt.block_size;
    std::vector<int> ids(static_cast<size_t>(len), 0);
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::vector<int64_t> slots(static_cast<size_t>(len));
    for (int64_t i = 0; i < blocks; ++i) table[size_t(i)] = int32_t(block + i);
    for (int64_t i = 0; i < len; ++i) slots[size_t(i)] = block * opt.block_size + i;
    b.AddSequence(ids, 0, table, slots, /*wants_logits=*/true, /*is_decode=*/false);
    block += blocks;
  }
  StartTiming(out[0], b);
  Run(b);
  StopAndWait(out[0]);
}

// ---- start-up ------------------------------------------------------------------------------
// Sizes and options of rank `rank` of `world` (no device work).
void CudaWorker::Configure(const ModelConfig& c, const CudaExecutorOptions& options, int rank,
                           int world) {
  opt = options;
  config = c;
  shard = MakeTensorParallelShard(c, rank, world);
  features = ArchitectureOf(c).features;
  device = rank;
  dtype = options.dtype;
  esize = DTypeSize(dtype);
  kv_format.fp8 = opt.kv_cache_fp8;
  kv_esize = opt.kv_cache_fp8 ? 1 : esize;
  heads = shard.num_heads;
  kv_heads = shard.num_kv_heads;
  hidden = c.hidden_size;
  q_dim = shard.q_dim();
  kv_dim = shard.kv_dim();
  qkv_dim = q_dim + 2 * kv_dim;
  inter = shard.intermediate;
  vocab = c.vocab_size;
  max_tokens = std::max<int64_t>(options.max_num_batched_tokens, 1);
  max_seqs = std::max<int64_t>(options.max_num_seqs, 1);
  max_rows = std::max(max_seqs, options.max_logits_rows);
  // The decode kernel's head_dims: 64, 128 and 256 (Gemma 3).
  decode_kernel_ok = c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256;
  fp8 = options.fp8_weights;
  wesize = fp8 ? 1 : esize;
  // fp8: small steps take the GEMV with e4m3 weights and bf16/fp16 activations (weight-only
  // quantization, as the CPU backend; k % 16 == 0, checked below), larger ones the W8A8 GEMMs.
  gemv_ok = hidden % 8 == 0 && q_dim % 8 == 0 && inter % 8 == 0;
  num_experts = c.num_experts;
  top_k = c.num_experts_per_tok;
  moe_inter = shard.moe_intermediate;
  if (num_experts > 0 && moe_inter % (fp8 ? 16 : 8) != 0) {
    throw Error(
        "the CUDA backend's mixture-of-experts kernels need each expert's width to be a "
        "multiple of " +
        std::string(fp8 ? "16 under --quantization fp8" : "8") + ": moe_intermediate_size " +
        std::to_string(c.moe_intermediate_size) +
        (shard.size > 1 ? ", " + std::to_string(moe_inter) + " per GPU" : ""));
  }
  if (fp8 && (hidden % 16 != 0 || q_dim % 16 != 0 || inter % 16 != 0)) {
    throw Error(
        "--quantization fp8 on cuda needs every linear layer's input width to be a "
        "multiple of 16 (cuBLASLt's FP8 GEMMs): hidden_size " +
        std::to_string(hidden) + ", attention width " + std::to_string(q_dim) +
        ", intermediate_size " + std::to_string(inter) + (shard.size > 1 ? " per GPU" : ""));
  }
  table_cap = (c.max_position_embeddings + options.block_size - 1) / options.block_size;
}

// Everything up to the KV pool: stream, weights, activations and the profiling pass (which
// holds collectives: at N > 1 every rank runs Setup at once). Sets kv_budget_blocks.
void CudaWorker::Setup(const std::string& model_path) {
  LLM_CUDA_CHECK(cudaSetDevice(device));
  if (shard.rank == 0 && !decode_kernel_ok) {
    Log("head_dim " + std::to_string(config.head_dim) +
        ": decode attention on the naive prefill kernel (the tuned kernels take 64, 128 and 256)");
  }
  device_name = cuda::DeviceDescription(device);
  {
    int major = 0;
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cuda::SetProgrammaticLaunch(opt.programmatic_launch && major >= 9);
    cuda::SetDecodeKvBeforeWait(opt.decode_kv_before_wait);
  }
  LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (OutSlot& o : out) {
    LLM_CUDA_CHECK(cudaEventCreate(&o.start));
    LLM_CUDA_CHECK(cudaEventCreate(&o.stop));
  }
  LLM_CUDA_CHECK(cudaEventCreateWithFlags(&ev_inputs, cudaEventDisableTiming));
  LLM_CUDA_CHECK(cudaEventCreateWithFlags(&ev_sync, cudaEventDisableTiming));
  LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&mask_stream, cudaStreamNonBlocking));
  LLM_CUDA_CHECK(cudaEventCreateWithFlags(&ev_masks, cudaEventDisableTiming));
  LLM_CUDA_CHECK(cudaEventCreateWithFlags(&ev_masks_read, cudaEventDisableTiming));
  gemm = std::make_unique<cuda::Gemm>();
  gemm->set_fast_accum(opt.fp8_fast_accum);
  allocated_bytes += int64_t{32} << 20;
  // OverlapStep's conditions that do not depend on the step: the stream exists only here.
  const bool overlap_model = fp8 && shard.size == 1 && num_experts == 0 && !features.sandwich_norms;
  if (opt.decode_overlap && !overlap_model && shard.rank == 0) {
    Log("--decode-overlap takes dense models with fp8 weights (--quantization fp8) on one GPU; "
        "this one's decode steps run whole");
  }
  if (opt.decode_overlap && overlap_model) {
    LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&overlap_stream, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&overlap_fork, &overlap_join, &overlap_qkv[0], &overlap_qkv[1]}) {
      LLM_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
    for (auto& g : overlap_gemm) {
      g = std::make_unique<cuda::Gemm>();
      g->set_fast_accum(opt.fp8_fast_accum);
      g->set_sm_count_target(opt.decode_overlap_gemm_sms);
      allocated_bytes += int64_t{32} << 20;
    }
  }

  if (opt.dummy_weights) {
    FillDummy();
  } else {
    LoadCheckpoint(model_path);
  }
  AllocActivations();

  // Profiling pass: the largest step over a temporary KV pool, so that lazily loaded kernels,
  // cuBLASLt's plans and the driver's own allocations are in place before we measure.
  AllocKv((max_tokens + opt.block_size - 1) / opt.block_size);
  RunPrefillOnly(max_tokens);
  FreeKv();

  size_t free_bytes = 0, total_bytes = 0;
  LLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t in_use = int64_t(total_bytes) - int64_t(free_bytes);
  const int64_t budget = int64_t(opt.gpu_memory_utilization * double(total_bytes)) - in_use -
                         (int64_t{256} << 20);  // graphs, cuBLAS and sampler reserve
  kv_budget_blocks = opt.num_kv_blocks > 0 ? opt.num_kv_blocks : budget / BytesPerBlock();
  if (kv_budget_blocks < 1) {
    throw Error("not enough GPU memory for the KV cache on GPU " + std::to_string(device) + ": " +
                Gib(double(total_bytes)) + " total, " + Gib(double(in_use)) +
                " in use after loading the model and profiling a " + std::to_string(max_tokens) +
                "-token step; raise --gpu-memory-utilization (" +
                std::to_string(opt.gpu_memory_utilization) + ") or lower --max-num-batched-tokens");
  }
}

// The KV pool (the same block count on every rank) and the start-up graphs.
void CudaWorker::Finish(int64_t num_blocks) {
  AllocKv(num_blocks);
  size_t free_bytes = 0, total_bytes = 0;
  LLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  stats.peak_device_bytes = int64_t(total_bytes) - int64_t(free_bytes);
  stats.weight_bytes = weight_bytes;
  stats.weight_bytes_per_token =
      weight_bytes - (lm_head && lm_head != embed ? vocab * hidden * int64_t(esize) : 0);
  // A mixture-of-experts layer: a token reads its top_k experts, not the others (fp8: codes
  // and row scales).
  for (const Layer& l : layers) {
    if (l.moe) {
      stats.weight_bytes_per_token -=
          (num_experts - top_k) *
          (3 * moe_inter * hidden * int64_t(wesize) + (fp8 ? (2 * moe_inter + hidden) * 4 : 0));
    }
  }
  stats.kv_cache_bytes = kv_bytes;
  stats.kv_bytes_per_token = BytesPerBlock() / opt.block_size;
  stats.activation_bytes = activation_bytes;
  Log(device_name + ": weights " + Gib(double(weight_bytes)) + ", activations " +
      Gib(double(activation_bytes)) + ", KV cache " + (kv_format.fp8 ? "(fp8 e4m3) " : "") +
      Gib(double(kv_bytes)) + " = " + std::to_string(num_blocks * opt.block_size) + " tokens (" +
      std::to_string(num_blocks) + " blocks of " + std::to_string(opt.block_size) +
      (shard.size > 1 ? ", " + std::to_string(kv_heads) + " KV heads per GPU" : std::string()) +
      ")");
  if (opt.cuda_graphs) {
    const int64_t max_graph =
        std::min(max_seqs, opt.max_graph_batch > 0 ? opt.max_graph_batch : max_seqs);
    graph_sizes = GraphBatchSizes(std::min(max_graph, max_tokens));
    CaptureStartupGraphs();
  }
  stats.gemm_tuned_shapes = gemm->num_tuned();
  stats.gemm_retuned_shapes = gemm->num_retuned();
  stats.steps = stats.graph_steps = stats.fp8_prefill_copies = stats.decode_overlap_steps =
      0;  // (the profiling pass's)
  stats.device_ms = stats.wall_ms = 0;
  stats.decode_steps = stats.decode_seq_steps = stats.decode_kv_tokens_read = 0;
  stats.decode_device_ms = 0;
}

}  // namespace llm
