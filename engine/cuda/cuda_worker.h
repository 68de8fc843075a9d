// One rank of the CUDA backend: the worker that owns one GPU (engine/cuda/cuda_executor.h
// describes the backend). CudaExecutor holds rank 0's worker; at tensor parallel N > 1 rank 0
// also drives N - 1 peers, each a worker of its own on a thread of its own (Peer, below).
// Internal to engine/cuda/: the member functions are defined by job across the folder,
//   cuda_worker.cc    the lifecycle: configure, set up (weights, activations, the profiling pass
//                     and the memory plan), finish (the KV pool, the start-up graphs), release
//   weights.cc        the weights: checkpoint upload, fp8 quantization at load, dummy weights
//   step_inputs.cc    a step's inputs, packed and copied to the device
//   forward.cc        the forward pass: every kernel of a step (attention, norms, GEMV / GEMM)
//   graphs.cc         the decode CUDA graphs: eligibility, capture, start-up capture
//   sampler_io.cc     the GPU sampler's parameters in and results out
//   step_runner.cc    a step end to end: Run / Enqueue, async Launch / Wait, timing
//   tp_group.cc       the tensor-parallel group: peers, collectives, aborts, polling waits
//   cuda_executor.cc  the facade (CudaExecutor) and the classification of errors
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if defined(LLM_HAS_NCCL)
#include <nccl.h>
#endif

#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/gemm.h"
#include "engine/error.h"
#include "engine/loader/safetensors.h"
#include "engine/model/architecture.h"
#include "engine/model/tensor_parallel.h"
#include "kernels/cuda/all_reduce/all_reduce.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/ops/model_ops.h"

namespace llm {

// Shared by the worker's files (file-local to cuda_executor.cc before the split).
using Clock = std::chrono::steady_clock;
inline constexpr size_t kDecodeWorkspaceBytes = size_t{64}
                                                << 20;  // split counters + partials (any batch)
inline constexpr int64_t kMinTableWidth = 16;

inline std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / double(int64_t{1} << 30));
  return buf;
}

inline int64_t NextPow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Host memory the device reads asynchronously (pinned, so copies do not stage).
template <typename T>
struct Pinned {
  T* p = nullptr;
  void Alloc(int64_t count) {
    LLM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p),
                                 std::max<size_t>(1, size_t(count)) * sizeof(T),
                                 cudaHostAllocDefault));
  }
  void Free() {
    if (p) cudaFreeHost(p);
    p = nullptr;
  }
  ~Pinned() { Free(); }
};

#if defined(LLM_HAS_NCCL)
#define LLM_NCCL_CHECK(expr)                                                             \
  do {                                                                                   \
    ncclResult_t llm_nccl_ = (expr);                                                     \
    if (llm_nccl_ != ncclSuccess) {                                                      \
      throw Error(std::string("NCCL: ") + #expr + ": " + ncclGetErrorString(llm_nccl_)); \
    }                                                                                    \
  } while (0)
using NcclComm = ncclComm_t;
#else
using NcclComm = void*;
#endif

struct CudaWorker {
  ModelConfig config;
  CudaExecutorOptions opt;
  DType dtype = DType::kBF16;
  size_t esize = 2;
  bool fp8 = false;               // --quantization fp8: e4m3 linear weights with per-row scales
  size_t wesize = 2;              // bytes per linear-layer weight element: esize, or 1 for fp8
  size_t kv_esize = 2;            // bytes per KV cache element: esize, or 1 for fp8
  cuda::KvCacheFormat kv_format;  // fp8 (e4m3) or the model dtype
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
  std::vector<void*> allocations;
  int64_t allocated_bytes = 0;
  std::string device_name;

  // Tensor parallelism: this CudaWorker is rank `shard.rank` of shard.size, on GPU `device`.
  TensorParallelShard shard;
  int device = 0;
  NcclComm comm = nullptr;
  struct Peer;  // another rank and the worker thread that drives it (rank 0 only)
  std::vector<std::unique_ptr<Peer>> peers;
  bool drive_peers = false;  // rank 0 hands every step to the peers (after start-up)
  // Set (by rank 0's thread) when the ranks' collectives can no longer pair up; read by every
  // rank's thread before each NCCL call (under comm_mu) and at teardown.
  std::atomic<bool> comms_aborted{false};
  // Held around each NCCL call on this rank, so that AbortComms (rank 0's thread) does not
  // free a communicator a worker is about to use; a call blocked inside NCCL is instead
  // released by the abort (ncclCommAbort from another thread is NCCL's way to do that).
  std::timed_mutex comm_mu;
  // The one-shot peer-access all-reduce of small steps (kernels/cuda/all_reduce/all_reduce.h), when
  // every pair of GPUs has peer access and options.custom_all_reduce.
  cuda::P2PAllReduceArgs p2p;
  bool p2p_ok = false;
  std::vector<cuda::P2PAllReduceArgs> p2p_group;  // every rank's (rank 0 owns the buffers)
  int64_t kv_budget_blocks = 0;                   // what this GPU's memory holds (Setup)
  // Ranks > 0: told of each step before the rank runs it (CudaExecutor::Create's argument).
  std::shared_ptr<PeerStepObserver> peer_step_observer;

  // Sizes (this rank's: heads, q_dim, kv_dim, qkv_dim and inter are its shard's).
  int64_t heads = 0, kv_heads = 0;
  int64_t hidden = 0, q_dim = 0, kv_dim = 0, qkv_dim = 0, inter = 0, vocab = 0;
  int64_t max_tokens = 0, max_seqs = 0, max_rows = 0, table_cap = 0;
  bool decode_kernel_ok = true;  // head_dim 64 / 128 / 256
  bool gemv_ok = true;           // every GEMM's k % 8 == 0: small steps take the fused GEMV

  // Weights.
  struct Layer {
    void *qkv = nullptr, *o = nullptr, *gate_up = nullptr, *down = nullptr;
    float *input_norm = nullptr, *post_norm = nullptr;
    // Qwen2: this rank's q|k|v biases (fp32, the rows of qkv); Qwen3: the per-head q/k norms.
    float *qkv_bias = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    // Gemma 3: the sandwich norms of the attention and MLP outputs; every layer: its RoPE
    // table (the sliding layers' own when the config has one).
    float *attn_out_norm = nullptr, *mlp_out_norm = nullptr;
    const float* inv_freq = nullptr;
    // fp8: one scale per output row of each matrix.
    float *qkv_s = nullptr, *o_s = nullptr, *gate_up_s = nullptr, *down_s = nullptr;
    // A mixture-of-experts layer (ModelConfig::IsMoeLayer; gate_up and down stay null): the
    // router [experts, hidden] in dtype (replicated), every expert's gate|up
    // [experts][2 · moe_inter][hidden] (this rank's gate rows, then its up rows) and down
    // [experts][hidden][moe_inter] (its columns), in dtype or, under fp8, e4m3 with one scale per
    // row of each ([experts][2 · moe_inter] and [experts][hidden]).
    bool moe = false;
    void *router = nullptr, *experts_gate_up = nullptr, *experts_down = nullptr;
    float *experts_gate_up_s = nullptr, *experts_down_s = nullptr;
  };
  std::vector<Layer> layers;
  void *embed = nullptr, *lm_head = nullptr;
  float *final_norm = nullptr, *inv_freq = nullptr, *sliding_inv_freq = nullptr;
  ArchitectureFeatures features;  // the architecture's (engine/model/architecture.h)
  float embed_scale = 1.f;        // Gemma: sqrt(hidden) rounded to dtype
  int64_t weight_bytes = 0;

  // KV cache.
  PagedKvLayout layout;
  std::vector<void*> k_pool, v_pool;  // per layer
  int64_t kv_bytes = 0;

  // Activations.
  float* x = nullptr;  // fp32 residual [T, hidden]
  void *normed = nullptr, *qkv = nullptr, *q = nullptr, *attn = nullptr;
  void *gate_up = nullptr, *act = nullptr, *rows_normed = nullptr;
  void* delta = nullptr;           // sandwich norms: o / down output [T, hidden] before its RMSNorm
  float* rms_partials = nullptr;   // [kGemvMaxTokens, hidden / 4]: the folded RMSNorm
  unsigned* chain_sync = nullptr;  // cuda::GemvChain's barrier words (kGemvChainSyncWords)
  // fp8: the next GEMM's input as e4m3 codes [T, max(hidden, q_dim, inter)] and its per-token
  // scales [T].
  uint8_t* act8 = nullptr;
  float* act8_scale = nullptr;
  float* logits = nullptr;  // [S, vocab]
  // Mixture of experts (kernels/cuda/moe/moe.h), for P = T · top_k routed pairs: the router's
  // fp32 logits [T, experts], the routing arrays, and the pairs' gate|up [P, 2 · moe_inter],
  // activations [P, moe_inter] (dtype; fp8's W8A8 steps: e4m3 codes in the same buffer, with
  // moe_act8_scale [P]) and expert outputs [P, hidden] (fp32). moe_inter: each expert's width
  // on this rank.
  int64_t moe_inter = 0, num_experts = 0, top_k = 0;
  float* router_logits = nullptr;
  cuda::MoeRouting routing;
  void *moe_gate_up = nullptr, *moe_act = nullptr;
  float* moe_act8_scale = nullptr;
  float* moe_down = nullptr;
  // options.record_moe_routing: each layer's routing.experts of the last step
  // [num_layers][T · top_k], and the last step's token count.
  int32_t* moe_routing_log = nullptr;
  int64_t last_step_tokens = 0;
  // While a step is enqueued: the last MoE layer's weighted sum (moe_down through `routing`)
  // is not yet in x; the next RMSNorm adds it (ResidualNorm, cuda::MoeCombineRmsNorm).
  bool combine_pending = false;
  void* decode_ws = nullptr;
  // --decode-overlap (opt.decode_overlap; forward.cc's RunLayersOverlapped): the second half's
  // stream, its decode workspace (zeroed once, like decode_ws), each half's GEMMs (own
  // workspaces: the halves' GEMMs run at once; cuBLASLt's SM count target), and the events
  // that fork, pace and join the halves.
  cudaStream_t overlap_stream = nullptr;
  void* overlap_decode_ws = nullptr;
  std::unique_ptr<cuda::Gemm> overlap_gemm[2];
  cudaEvent_t overlap_fork = nullptr, overlap_join = nullptr;
  cudaEvent_t overlap_qkv[2] = {nullptr, nullptr};  // each half's q|k|v issued (attention next)
  static constexpr int64_t kDecodeOverlapMinRows = 64;
  // fp8 KV (opt.fp8_prefill_wgmma): the prefill attention's scratch (cuda::PrefillScratch):
  // room for the bf16/fp16 copy of prefill_scratch_pages pages and a block table over them.
  void* prefill_scratch = nullptr;
  size_t prefill_scratch_bytes = 0;
  int64_t prefill_scratch_pages = 0;
  int64_t activation_bytes = 0;

  // Step inputs (device and pinned host mirrors).
  int32_t *d_tokens = nullptr, *d_positions = nullptr, *d_cu = nullptr, *d_cu_prefill = nullptr,
          *d_ctx = nullptr, *d_tables = nullptr, *d_rows = nullptr;
  int64_t* d_slots = nullptr;
  Pinned<int32_t> h_tokens, h_positions, h_cu, h_cu_prefill, h_ctx, h_tables, h_rows;
  Pinned<int64_t> h_slots;

  // Sampling.
  cuda::SampleRowParams* d_params = nullptr;
  Pinned<cuda::SampleRowParams> h_params;
  cuda::LogitAdjust* d_adjust = nullptr;
  int64_t adjust_capacity = 0;
  Pinned<cuda::LogitAdjust> h_adjust;
  // Allowed-token masks of the tasks with a grammar: [max_seqs, SampleMaskWords(vocab)] words
  // (1/32 of sample_ws), rows packed in task order (SampleRowParams::mask_row). UploadMasks
  // fills h_masks after the step's forward is enqueued and copies it on mask_stream, so the
  // copy runs beside the forward; ev_masks follows that copy (the sampling kernel waits for
  // it on `stream`, and h_masks is rewritten only after it), ev_masks_read follows the last
  // sampling kernel that read d_masks (the next copy into d_masks waits for it).
  uint32_t* d_masks = nullptr;
  Pinned<uint32_t> h_masks;
  cudaStream_t mask_stream = nullptr;
  cudaEvent_t ev_masks = nullptr, ev_masks_read = nullptr;
  int32_t num_mask_rows = 0;  // of the tasks UploadSampleParams last wrote: those with a grammar
  void* sample_ws = nullptr;
  cuda::SampleOutputs d_out;
  // A step's share of the decode-only counters (CudaExecutorStats::decode_*), taken from its
  // batch when its timing starts and added to the stats with its device time.
  struct StepTally {
    bool is_decode_only = false;  // every sequence feeds exactly one token
    int64_t num_seqs = 0;
    int64_t num_kv_tokens_read = 0;  // keys the decode attention reads per layer, all sequences
  };
  // Where a step's sampled ids and logprobs come back, and the events around its device
  // work: two, since an async step is launched before the one before it is waited for.
  struct OutSlot {
    Pinned<int32_t> token, top_ids;
    Pinned<float> logprob, top_lp;
    cudaEvent_t start = nullptr, stop = nullptr;
    StepTally tally;  // of the step timed between start and stop
  };
  OutSlot out[2];

  // Async steps. The sampler writes every step's ids to d_sampled [sampled_cap], which the
  // next step's fed tokens (ForwardBatch::prev_sample_rows, copied to d_feed) read on the
  // device before the embedding. ev_inputs follows a step's host-to-device copies: pinned
  // input buffers are rewritten only after it (the step before may still be copying them).
  int32_t* d_sampled = nullptr;
  int64_t sampled_cap = 0, num_last_sampled = 0;
  int32_t* d_feed = nullptr;
  Pinned<int32_t> h_feed;
  // Packed step inputs (opt.packed_step_inputs): CopyIn() packs each input array's used part
  // into h_stage (16-byte aligned), FlushStaged() moves the pack with one host-to-device copy
  // into d_stage and scatters it to the arrays (cuda::ScatterCopies): one copy and one kernel
  // per step instead of ~10 copies of ~3 µs each on the stream.
  Pinned<std::byte> h_stage;
  std::byte* d_stage = nullptr;
  int64_t stage_cap = 0, staged_bytes = 0;
  std::vector<cuda::CopySegment> staged;
  cudaEvent_t ev_inputs = nullptr;
  cudaEvent_t ev_sync = nullptr;  // SyncStream's
  struct PendingStep {
    int64_t id = 0;
    int slot = 0;
    std::vector<SampleTask> tasks;
    std::vector<int32_t> num_logprobs;  // per task
    // Results read back already: sampled synchronously (more tasks than max_seqs), or
    // read early by ResolvePending because the next launch needed its tokens.
    bool has_results = false;
    std::vector<SampleResult> results;
    std::exception_ptr error;  // reading them back failed (ResolvePending): Wait throws it
  };
  std::deque<PendingStep> pending;
  int64_t next_step_id = 0;

  // Graphs, keyed by (padded batch, decode splits, table width).
  std::map<std::tuple<int64_t, int, int64_t>, cudaGraphExec_t> graphs;
  std::vector<int64_t> graph_sizes;

  CudaExecutorStats stats;

  // What one step runs (sizes on the host; the data is in the d_* buffers).
  struct Shape {
    int64_t num_tokens = 0, num_seqs = 0, num_decode = 0, num_rows = 0, width = 0;
    int64_t max_q_len = 0, max_keys_prefill = 0, max_keys_decode = 0;
    int splits = 1;
    bool has_feed = false;  // some tokens come from the previous step's sampled ids
    // fp8 KV, eager steps: the prefill sequences [begin, end) whose pages fit the prefill
    // scratch together, one v4 attention launch over a bf16 copy of their pages each (empty:
    // the fp8 prefill rung reads the cache directly).
    struct PrefillGroup {
      int64_t begin = 0, end = 0, pages = 0;
    };
    std::vector<PrefillGroup> prefill_groups;
  };

  // ---- lifecycle (cuda_worker.cc; the destructor: tp_group.cc) -----------------------------
  void Configure(const ModelConfig& c, const CudaExecutorOptions& options, int rank, int world);
  void Setup(const std::string& model_path);
  void Finish(int64_t num_blocks);
  ~CudaWorker();
  void StopPeers();
  void Release();
  void LeakDeviceState();
  void Log(const std::string& line) const;

  template <typename T = void>
  T* Alloc(int64_t bytes) {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, size_t(std::max<int64_t>(bytes, 1)));
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw Error("CUDA: out of device memory allocating " + Gib(double(bytes)) + " (" +
                  std::to_string(allocated_bytes >> 20) + " MiB already held by this process)");
    }
    allocations.push_back(p);
    allocated_bytes += bytes;
    return static_cast<T*>(p);
  }

  // ---- buffers, the KV pool, the profiling pass (cuda_worker.cc)
  // ----------------------------------------------------------
  bool Fp8PrefillCopies() const;
  void AllocActivations();
  void ReserveAdjust(int64_t count);
  void AllocKv(int64_t num_blocks);
  void FreeKv();
  int64_t BytesPerBlock() const;
  void CopyBlocks(std::span<const BlockCopy> copies);
  void RunPrefillOnly(int64_t tokens);

  // ---- weights (weights.cc) --------------------------------------------------------------
  void Upload(const TensorView& t, int64_t count, DType to, void* dst);
  void UploadSlice(const TensorView& t, int64_t cols, const TpSlice& sl, DType to, void* dst);
  void AllocWeights();
  std::string WeightsName() const;
  struct Fp8Stage;
  struct DeviceMatrix;
  static DeviceMatrix MatrixOf(Layer& l, const FusedMatrix& m);
  float* VectorOf(Layer& l, WeightRole role) const;  // (biases: this rank's rows)
  // Where expert `expert`'s matrix of `role` (gate, up or down) lies in a MoE layer's arrays:
  // the array with its scales, and the matrix's first row there.
  struct ExpertRows {
    void* data = nullptr;
    float* scales = nullptr;
    int64_t row0 = 0;
  };
  ExpertRows ExpertMatrixOf(Layer& l, WeightRole role, int64_t expert) const;
  void LoadCheckpoint(const std::string& dir);
  void FillDummy();

  // ---- one step: its inputs (step_inputs.cc) ---------------------------------------------
  Shape Upload(const ForwardBatch& b, int64_t padded, int64_t width, bool wait_inputs = true);
  void CopyIn(void* dst, const void* src, int64_t bytes);
  void FlushStaged();
  void DiscardStaged();
  void WaitInputsCopied();

  // ---- one step: the forward (forward.cc) ------------------------------------------------
  PagedKvView<void> Kv(int64_t layer) const;
  void Attention(int64_t layer, const Shape& s);
  // A slice of a step's rows [off, off + n) and where its kernels go: the whole step on
  // `stream` (AllRows), or one half of a --decode-overlap step. act8: the slice's e4m3 codes
  // (its first row's, at each kernel's own row width).
  struct RowSlice {
    int64_t off = 0, n = 0;
    cudaStream_t stream = nullptr;
    cuda::Gemm* gemm = nullptr;
    void* decode_ws = nullptr;
    uint8_t* act8 = nullptr;
  };
  RowSlice AllRows(int64_t n) const;
  cuda::AttentionParams AttentionParamsOf(int64_t layer) const;
  // The decode attention of the slice's rows (all decode rows of s).
  void DecodeAttention(int64_t layer, const Shape& s, const RowSlice& r);
  // W8A8 layer pieces over a slice: the input RMSNorm, q|k|v and RoPE + KV append; the
  // attention output's quantization and o (added to x); the MLP (dense: post-attention
  // RMSNorm, gate|up, SiLU·mul, down added to x).
  void LayerFp8Qkv(int64_t i, const RowSlice& r);
  void LayerFp8O(int64_t i, const RowSlice& r);
  void LayerFp8Mlp(int64_t i, const RowSlice& r);
  bool OverlapStep(const Shape& s) const;
  void RunLayersOverlapped(const Shape& s);
  cuda::GemvArgs SmallArgs(cuda::GemvEpilogue epilogue, const void* in, const float* norm,
                           const void* w, const float* w_scale, void* out, int64_t n, int64_t m,
                           int64_t k) const;
  void SmallLinear(cuda::GemvEpilogue epilogue, const void* in, const float* norm, const void* w,
                   const float* w_scale, void* out, int64_t n, int64_t m, int64_t k);
  bool FuseNorm(cuda::GemvArgs& g, const float* resid, const float* norm) const;
  void NormBefore(cuda::GemvArgs& g, bool folded_in, const float* weight, int64_t n);
  bool ChainMlp(const cuda::GemvArgs& o, const Layer& l, int64_t i, int64_t n);
  void FoldInto(cuda::GemvArgs& g, const float* weight) const;
  bool SmallStep(int64_t rows) const;
  // The layer's q/k/v bias and q/k norms for RopeAppendKv (none: all null).
  cuda::QkvPrologue Prologue(const Layer& l) const;
  void RunModel(const Shape& s);
  void RunLayerFp8(int64_t i, const Shape& s);
  // A mixture-of-experts MLP of n tokens: `normed` (the post-attention RMSNorm of x) through
  // the router, the chosen experts and their weighted sum, added to the residual x (on small
  // steps of one GPU by the next RMSNorm: combine_pending).
  void MoeMlp(const Layer& l, int64_t layer, int64_t n);
  // The RMSNorm (weight) of x's rows (null: the first num_rows) into out, adding a pending
  // MoE sum of the step's n tokens first; FlushCombine adds it alone (before anything else
  // reads x).
  void ResidualNorm(const float* weight, void* out, const int32_t* rows, int64_t num_rows,
                    int64_t n);
  void FlushCombine(int64_t n);

  // ---- decode CUDA graphs (graphs.cc) ----------------------------------------------------
  bool GraphEligible(const ForwardBatch& b) const;
  int64_t PaddedBatch(int64_t ns) const;
  int64_t GraphWidth(int64_t max_blocks) const;
  cudaGraphExec_t Capture(const Shape& s);
  bool Tuning() const;
  void CaptureStartupGraphs();

  // ---- sampling (sampler_io.cc) ----------------------------------------------------------
  void UploadSampleParams(std::span<const SampleTask> tasks, size_t begin, size_t count,
                          bool wait_inputs = true, bool flush = true);
  void UploadMasks(std::span<const SampleTask> tasks, size_t begin, size_t count);
  void EnqueueSample(size_t begin, size_t count, OutSlot& o);
  void ReadSampleResults(std::span<const SampleTask> tasks, size_t begin, size_t count,
                         const int32_t* num_logprobs, const OutSlot& o,
                         std::vector<SampleResult>* results);
  std::vector<SampleResult> Sample(std::span<const SampleTask> tasks, OutSlot& o);

  // ---- a step end to end, and asynchronous steps (Launch / Wait) (step_runner.cc) --------
  void Run(const ForwardBatch& b, bool wait_inputs = true);
  void Enqueue(const Shape& s, bool graph, int64_t padded);
  StepTally Tally(const ForwardBatch& b) const;
  void StartTiming(OutSlot& o, const ForwardBatch& b);
  void StopAndWait(OutSlot& o);
  void FinishTiming(const OutSlot& o, double host_ms);
  StepHandle Launch(const ForwardBatch& b, std::span<const SampleTask> tasks);
  std::vector<SampleResult> Wait(StepHandle step);
  static bool HasGrammar(std::span<const SampleTask> tasks);
  void ResolvePending();
  void CheckNothingInFlight(const char* what) const;

  // ---- tensor parallel collectives (no-ops at N = 1) (tp_group.cc) -----------------------
  void AllReduceResidual(int64_t tokens);
  void ThrowIfAborted() const;
  void BroadcastTokens(int64_t tokens);

  // ---- tensor parallel: the peers and their worker threads (tp_group.cc) -----------------
  void SetupP2P(const std::vector<CudaWorker*>& ranks);
  void PostToPeers(std::function<void(CudaWorker&)> job);
  // Runs f on every rank at once (rank 0 here, the peers on their threads) and waits; the
  // first failure is rethrown (after aborting the communicators, so no rank stays blocked in
  // a collective its failed partner never joins).
  void RunOnAllRanks(const std::function<void(CudaWorker&)>& f);
  // Throws FatalExecutorError when a peer's step failed (its communicators are then aborted:
  // the ranks' collectives can no longer pair up).
  void CheckPeers();
  void AbortComms();
  // Waits on this rank's stream that poll the peers (see Sync).
  void Sync(cudaEvent_t ev);
  void SyncStream();

  // Error classification (cuda_executor.cc).
  [[noreturn]] void RethrowClassified();
};

// Another rank: its CudaWorker, driven by a worker thread of its own that runs the jobs rank 0
// posts (steps, block copies, start-up phases) in order, on the rank's GPU.
struct CudaWorker::Peer {
  std::unique_ptr<CudaWorker> impl;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void(CudaWorker&)>> jobs;  // guarded by mu
  bool quit = false;                                  // guarded by mu
  std::exception_ptr error;                           // the first failed job (guarded by mu)

  void Post(std::function<void(CudaWorker&)> job) {
    {
      std::lock_guard<std::mutex> lock(mu);
      jobs.push_back(std::move(job));
    }
    cv.notify_one();
  }

  std::exception_ptr Failure() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }

  // Runs the jobs until quit (after the queue drains); after a failed job the rest are
  // skipped (rank 0 sees the error and fails). Releases the rank's resources, its NCCL
  // communicator included, in this thread, while rank 0 releases its own.
  void Loop() {
    cudaSetDevice(impl->device);
    for (;;) {
      std::function<void(CudaWorker&)> job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [this] { return quit || !jobs.empty(); });
        if (jobs.empty()) break;
        job = std::move(jobs.front());
        jobs.pop_front();
        if (error) continue;
      }
      try {
        job(*impl);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        error = std::current_exception();
      }
    }
    impl->Release();
  }
};

}  // namespace llm
