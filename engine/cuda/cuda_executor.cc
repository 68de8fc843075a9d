#include "engine/cuda/cuda_executor.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#if defined(LLM_HAS_NCCL)
#include <nccl.h>
#endif

#include "engine/loader/checkpoint_check.h"
#include "engine/model/architecture.h"
#include "engine/model/rope.h"
#include "engine/cuda/gemm.h"
#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "engine/loader/safetensors.h"
#include "engine/model/tensor_parallel.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/all_reduce/all_reduce.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/common/fill.h"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/cuda/attention/prefill_attention.h"

namespace llm {

static_assert(sizeof(TokenAdjust) == sizeof(cuda::LogitAdjust) &&
                  offsetof(TokenAdjust, token) == offsetof(cuda::LogitAdjust, token) &&
                  offsetof(TokenAdjust, bias) == offsetof(cuda::LogitAdjust, bias) &&
                  offsetof(TokenAdjust, repetition) == offsetof(cuda::LogitAdjust, repetition) &&
                  offsetof(TokenAdjust, subtract) == offsetof(cuda::LogitAdjust, subtract),
              "the host's TokenAdjust is copied to the device as LogitAdjust");

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kDecodeWorkspaceBytes = size_t{64} << 20;  // split counters + partials (any batch)
constexpr int64_t kMinTableWidth = 16;

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / double(int64_t{1} << 30));
  return buf;
}

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

int64_t NextPow2(int64_t x) {
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
#define LLM_NCCL_CHECK(expr)                                                              \
  do {                                                                                    \
    ncclResult_t llm_nccl_ = (expr);                                                      \
    if (llm_nccl_ != ncclSuccess) {                                                       \
      throw Error(std::string("NCCL: ") + #expr + ": " + ncclGetErrorString(llm_nccl_)); \
    }                                                                                     \
  } while (0)
using NcclComm = ncclComm_t;
#else
using NcclComm = void*;
#endif

}  // namespace

struct CudaExecutor::Impl {
  ModelConfig config;
  CudaExecutorOptions opt;
  DType dtype = DType::kBF16;
  size_t esize = 2;
  bool fp8 = false;    // --quantization fp8: e4m3 linear weights with per-row scales
  size_t wesize = 2;   // bytes per linear-layer weight element: esize, or 1 for fp8
  size_t kv_esize = 2;               // bytes per KV cache element: esize, or 1 for fp8
  cuda::KvCacheFormat kv_format;     // fp8 (e4m3) or the model dtype
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
  std::vector<void*> allocations;
  int64_t allocated_bytes = 0;
  std::string device_name;

  // Tensor parallelism: this Impl is rank `shard.rank` of shard.size, on GPU `device`.
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
  void SetupP2P(const std::vector<Impl*>& ranks);
  int64_t kv_budget_blocks = 0;  // what this GPU's memory holds (Setup)

  void Configure(const ModelConfig& c, const CudaExecutorOptions& options, int rank, int world);
  void Setup(const std::string& model_path);
  void Finish(int64_t num_blocks);

  // Sizes (this rank's: heads, q_dim, kv_dim, qkv_dim and inter are its shard's).
  int64_t heads = 0, kv_heads = 0;
  int64_t hidden = 0, q_dim = 0, kv_dim = 0, qkv_dim = 0, inter = 0, vocab = 0;
  int64_t max_tokens = 0, max_seqs = 0, max_rows = 0, table_cap = 0;
  bool decode_kernel_ok = true;  // head_dim 64 / 128
  bool gemv_ok = true;           // every GEMM's k % 8 == 0: small steps take the fused GEMV

  // Weights.
  struct Layer {
    void *qkv = nullptr, *o = nullptr, *gate_up = nullptr, *down = nullptr;
    float *input_norm = nullptr, *post_norm = nullptr;
    // fp8: one scale per output row of each matrix.
    float *qkv_s = nullptr, *o_s = nullptr, *gate_up_s = nullptr, *down_s = nullptr;
  };
  std::vector<Layer> layers;
  void *embed = nullptr, *lm_head = nullptr;
  float *final_norm = nullptr, *inv_freq = nullptr;
  int64_t weight_bytes = 0;

  // KV cache.
  PagedKvLayout layout;
  std::vector<void*> k_pool, v_pool;  // per layer
  int64_t kv_bytes = 0;

  // Activations.
  float* x = nullptr;  // fp32 residual [T, hidden]
  void *normed = nullptr, *qkv = nullptr, *q = nullptr, *attn = nullptr;
  void *gate_up = nullptr, *act = nullptr, *rows_normed = nullptr;
  float* rms_partials = nullptr;  // [kGemvMaxTokens, hidden / 4]: the folded RMSNorm
  // fp8: the next GEMM's input as e4m3 codes [T, max(hidden, q_dim, inter)] and its per-token
  // scales [T].
  uint8_t* act8 = nullptr;
  float* act8_scale = nullptr;
  float* logits = nullptr;  // [S, vocab]
  void* decode_ws = nullptr;
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
  void* sample_ws = nullptr;
  cuda::SampleOutputs d_out;
  // Where a step's sampled ids and logprobs come back, and the events around its device
  // work: two, since an async step is launched before the one before it is waited for.
  struct OutSlot {
    Pinned<int32_t> token, top_ids;
    Pinned<float> logprob, top_lp;
    cudaEvent_t start = nullptr, stop = nullptr;
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
    bool has_results = false;           // sampled synchronously (more tasks than max_seqs)
    std::vector<SampleResult> results;
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

  ~Impl();
  void StopPeers();
  // Frees everything this rank holds, on its GPU (idempotent; the caller's device is kept).
  // After a failed tensor-parallel rank (comms_aborted) it frees nothing: this rank's stream
  // may hold a collective that never completes, and every free would wait for it. The
  // engine is unhealthy by then and the process is meant to be restarted.
  void Release() {
    if (comms_aborted) {
      LeakDeviceState();
      return;
    }
    int caller_device = 0;
    cudaGetDevice(&caller_device);
    cudaSetDevice(device);
    if (stream) cudaStreamSynchronize(stream);  // a launched step may still use the buffers
    for (auto& [key, g] : graphs) cudaGraphExecDestroy(g);
    graphs.clear();
    gemm.reset();
    for (void* p : allocations) cudaFree(p);
    for (OutSlot& o : out) {
      if (o.start) cudaEventDestroy(o.start);
      if (o.stop) cudaEventDestroy(o.stop);
    }
    if (ev_inputs) cudaEventDestroy(ev_inputs);
    if (ev_sync) cudaEventDestroy(ev_sync);
    ev_sync = nullptr;
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
  void LeakDeviceState() {
    for (auto* pinned : {&h_tokens, &h_positions, &h_cu, &h_cu_prefill, &h_ctx, &h_tables,
                         &h_rows, &h_feed}) {
      pinned->p = nullptr;
    }
    h_slots.p = nullptr;
    h_params.p = nullptr;
    h_stage.p = nullptr;
    h_adjust.p = nullptr;
    for (OutSlot& o : out) {
      o.token.p = o.top_ids.p = nullptr;
      o.logprob.p = o.top_lp.p = nullptr;
      o.start = o.stop = nullptr;
    }
    (void)gemm.release();
    graphs.clear();
    allocations.clear();
    stream = nullptr;
    ev_inputs = ev_sync = nullptr;
    comm = nullptr;
  }

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

  void Log(const std::string& line) const {
    if (!opt.log) return;
    if (shard.size > 1) {
      std::fprintf(stderr, "[cuda %d/%d] %s\n", shard.rank, shard.size, line.c_str());
    } else {
      std::fprintf(stderr, "[cuda] %s\n", line.c_str());
    }
  }

  // ---- weights -----------------------------------------------------------------------
  // Converts `count` elements of a checkpoint tensor to `to` (f32 or dtype) on the host in
  // chunks and uploads them to dst.
  void Upload(const TensorView& t, int64_t count, DType to, void* dst) {
    if (t.dtype == to) {
      LLM_CUDA_CHECK(
          cudaMemcpy(dst, t.data, size_t(count) * DTypeSize(to), cudaMemcpyHostToDevice));
      return;
    }
    constexpr int64_t kChunk = int64_t{1} << 22;
    std::vector<float> f(size_t(std::min(count, kChunk)));
    std::vector<uint16_t> h(f.size());
    for (int64_t begin = 0; begin < count; begin += kChunk) {
      const int64_t len = std::min(kChunk, count - begin);
      const cpu::WeightMatrix m{t.dtype, t.data + begin * int64_t(DTypeSize(t.dtype)), 1, len};
      cpu::LoadRow(m, 0, f.data());
      std::byte* out = static_cast<std::byte*>(dst) + begin * int64_t(DTypeSize(to));
      if (to == DType::kF32) {
        LLM_CUDA_CHECK(cudaMemcpy(out, f.data(), size_t(len) * 4, cudaMemcpyHostToDevice));
        continue;
      }
      for (int64_t i = 0; i < len; ++i)
        h[size_t(i)] = to == DType::kBF16 ? F32ToBf16(f[size_t(i)]) : F32ToF16(f[size_t(i)]);
      LLM_CUDA_CHECK(cudaMemcpy(out, h.data(), size_t(len) * 2, cudaMemcpyHostToDevice));
    }
  }

  // Uploads `slice` of a checkpoint matrix with `cols` columns (the whole tensor at N = 1).
  void UploadSlice(const TensorView& t, int64_t cols, const TpSlice& sl, DType to, void* dst) {
    const int64_t count = sl.num_rows * sl.num_cols;
    if (count == t.num_elements()) return Upload(t, count, to, dst);
    const size_t es = DTypeSize(t.dtype);
    if (t.dtype == to) {
      LLM_CUDA_CHECK(cudaMemcpy2D(dst, size_t(sl.num_cols) * es,
                                  t.data + (size_t(sl.row_begin) * size_t(cols) +
                                            size_t(sl.col_begin)) * es,
                                  size_t(cols) * es, size_t(sl.num_cols) * es,
                                  size_t(sl.num_rows), cudaMemcpyHostToDevice));
      return;
    }
    std::vector<std::byte> host(size_t(count) * es);
    CopySlice(t.data, cols, sl, es, host.data());
    TensorView part = t;
    part.data = host.data();
    Upload(part, count, to, dst);
  }

  void AllocWeights() {
    const ModelConfig& c = config;
    auto vec = [&](int64_t n) {
      weight_bytes += n * 4;
      return Alloc<float>(n * 4);
    };
    auto matrix = [&](int64_t rows, int64_t cols, size_t es) {
      weight_bytes += rows * cols * int64_t(es);
      return Alloc(rows * cols * int64_t(es));
    };
    // A linear layer's matrix (e4m3 under fp8, with its row scales).
    auto linear = [&](int64_t rows, int64_t cols, float** scales) {
      if (fp8) *scales = vec(rows);
      return matrix(rows, cols, wesize);
    };
    embed = matrix(vocab, hidden, esize);
    lm_head = c.tie_word_embeddings ? embed : nullptr;
    final_norm = vec(hidden);
    layers.resize(size_t(c.num_layers));
    for (Layer& l : layers) {
      l.input_norm = vec(hidden);
      l.post_norm = vec(hidden);
      l.qkv = linear(qkv_dim, hidden, &l.qkv_s);
      l.o = linear(hidden, q_dim, &l.o_s);
      l.gate_up = linear(2 * inter, hidden, &l.gate_up_s);
      l.down = linear(hidden, inter, &l.down_s);
    }
    const std::vector<float> freqs = RopeInvFreq(c);
    inv_freq = Alloc<float>(int64_t(freqs.size()) * 4);
    LLM_CUDA_CHECK(cudaMemcpy(inv_freq, freqs.data(), freqs.size() * 4, cudaMemcpyHostToDevice));
  }

  // fp8 KV: prefill attention on the wgmma rung over a bf16/fp16 copy of each step's prefill
  // pages (cuda::PrefillScratch) instead of the mma.sync rung that reads e4m3 directly.
  bool Fp8PrefillCopies() const {
    return kv_format.fp8 && opt.fp8_prefill_wgmma && decode_kernel_ok &&
           cuda::PrefillWgmmaTakesBlockSize(opt.block_size);
  }

  std::string WeightsName() const {
    return fp8 ? "fp8 e4m3 linear layers with per-row scales, " + std::string(DTypeName(dtype)) +
                     " embeddings"
               : std::string(DTypeName(dtype));
  }

  // --quantization fp8 at load: a staging buffer for one weight in its source precision and
  // the device-side check that it is finite (one flag per tensor, read back after each).
  struct Fp8Stage {
    Impl& m;
    void* buf = nullptr;
    int64_t bytes = 0;
    int* bad = nullptr;
    explicit Fp8Stage(Impl& impl) : m(impl) {}
    Fp8Stage(const Fp8Stage&) = delete;
    Fp8Stage& operator=(const Fp8Stage&) = delete;
    ~Fp8Stage() {
      cudaFree(buf);
      cudaFree(bad);
    }
    void* Get(int64_t need) {
      if (need > bytes) {
        LLM_CUDA_CHECK(cudaDeviceSynchronize());  // the previous quantization may still read it
        cudaFree(buf);
        buf = nullptr;
        bytes = 0;
        if (cudaMalloc(&buf, size_t(need)) != cudaSuccess) {
          cudaGetLastError();
          throw Error("--quantization fp8: no GPU memory for a " + Gib(double(need)) +
                      " staging buffer to quantize the weights on GPU " + std::to_string(m.device));
        }
        bytes = need;
      }
      return buf;
    }
    // codes/scales of `rows` rows quantized from `src`; throws Error(what + ...) when a weight
    // is NaN or infinite (the CPU backend's check).
    void Quantize(const void* src, DType from, int64_t rows, int64_t cols, void* codes,
                  float* scales, const std::string& what) {
      // A checkpoint's upload ran on the legacy stream (it may still be landing).
      LLM_CUDA_CHECK(cudaDeviceSynchronize());
      if (!bad) LLM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&bad), sizeof(int)));
      LLM_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), m.stream));
      cuda::QuantizeRowsE4m3(src, from, rows, cols, static_cast<uint8_t*>(codes), scales, bad,
                             m.stream);
      int h = 0;
      LLM_CUDA_CHECK(cudaMemcpyAsync(&h, bad, sizeof(int), cudaMemcpyDeviceToHost, m.stream));
      LLM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
      if (h != 0) {
        throw Error(what + " holds a NaN or infinite weight (--quantization fp8 cannot scale it; " +
                    std::to_string(h) + " rows affected)");
      }
    }
  };

  // Where the registry's per-layer weights live on the device: a (fused) matrix with its fp8 row
  // scales, and the norm vectors (the CUDA backend's layer skeleton fuses q|k|v and gate|up).
  struct DeviceMatrix {
    void* data = nullptr;
    float* scales = nullptr;
  };
  static DeviceMatrix MatrixOf(Layer& l, const FusedMatrix& m) {
    switch (m.slot) {
      case FusedSlot::kQkv:
        return {l.qkv, l.qkv_s};
      case FusedSlot::kGateUp:
        return {l.gate_up, l.gate_up_s};
      case FusedSlot::kNone:
        break;
    }
    switch (m.members.front()->role) {
      case WeightRole::kOProj:
        return {l.o, l.o_s};
      case WeightRole::kDownProj:
        return {l.down, l.down_s};
      default:
        throw std::logic_error("CUDA executor: no device matrix for weight " +
                               std::string(m.members.front()->name));
    }
  }
  static float* VectorOf(Layer& l, WeightRole role) {
    switch (role) {
      case WeightRole::kInputNorm:
        return l.input_norm;
      case WeightRole::kPostAttentionNorm:
        return l.post_norm;
      default:
        throw std::logic_error("CUDA executor: no device vector for weight role " +
                               std::to_string(int(role)));
    }
  }

  void LoadCheckpoint(const std::string& dir) {
    std::unique_ptr<Checkpoint> ckpt = Checkpoint::Open(dir);
    ValidateCheckpoint(config, *ckpt);
    const ModelConfig& c = config;
    const ArchitectureSpec& spec = ArchitectureOf(c);
    const std::string head_name = WeightName(WeightOf(spec, WeightRole::kLmHead), -1);
    const bool has_head = ckpt->Find(head_name) != nullptr;
    const bool head_here = shard.rank == 0;  // the other ranks compute no logits
    AllocWeights();
    if (!lm_head && head_here) lm_head = has_head ? Alloc(vocab * hidden * int64_t(esize)) : embed;
    if (lm_head && lm_head != embed) weight_bytes += vocab * hidden * int64_t(esize);
    auto put = [&](const std::string& name, std::vector<int64_t> shape, DType to, void* dst) {
      const TensorView& t = ckpt->GetWithShape(name, shape);
      Upload(t, t.num_elements(), to, dst);
    };
    // A linear layer's weight: this rank's slice of the full [rows, cols] checkpoint tensor,
    // at row `row0` of the (fused) matrix `base`. fp8: uploaded as it is stored (bf16, fp16 or
    // fp32; anything else converted to fp32) into a staging buffer and quantized on the device
    // into codes and row scales: the values the CPU backend quantizes (widening is exact), by
    // its rule (cpu::QuantizeFp8Rows), so at one GPU the codes are the CPU's bit for bit.
    Fp8Stage stage(*this);
    auto put_part = [&](const std::string& name, int64_t rows, int64_t cols, const TpSlice& sl,
                        void* base, float* scales, int64_t row0) {
      const TensorView& t = ckpt->GetWithShape(name, {rows, cols});
      if (!fp8) {
        UploadSlice(t, cols, sl, dtype,
                    static_cast<std::byte*>(base) + row0 * sl.num_cols * int64_t(esize));
        return;
      }
      const DType from =
          t.dtype == DType::kBF16 || t.dtype == DType::kF16 ? t.dtype : DType::kF32;
      void* src = stage.Get(sl.num_rows * sl.num_cols * int64_t(DTypeSize(from)));
      UploadSlice(t, cols, sl, from, src);
      stage.Quantize(src, from, sl.num_rows, sl.num_cols,
                     static_cast<std::byte*>(base) + row0 * sl.num_cols, scales + row0,
                     t.file + ": tensor " + name);
    };
    const WeightSpec& embed_w = WeightOf(spec, WeightRole::kEmbed);
    put(WeightName(embed_w, -1), WeightShape(embed_w, c), dtype, embed);
    if (lm_head && lm_head != embed) put(head_name, {vocab, hidden}, dtype, lm_head);
    const WeightSpec& norm_w = WeightOf(spec, WeightRole::kFinalNorm);
    put(WeightName(norm_w, -1), WeightShape(norm_w, c), DType::kF32, final_norm);
    const std::vector<FusedMatrix> matrices = LayerLinearMatrices(spec);
    const auto start = Clock::now();
    for (int64_t i = 0; i < c.num_layers; ++i) {
      Layer& l = layers[size_t(i)];
      for (const FusedMatrix& m : matrices) {
        const DeviceMatrix d = MatrixOf(l, m);
        int64_t row0 = 0;  // members stack by rows: q|k|v, gate|up
        for (const WeightSpec* w : m.members) {
          const std::vector<int64_t> shape = WeightShape(*w, c);
          const TpSlice sl = shard.Slice(*w, c);
          put_part(WeightName(*w, i), shape[0], shape[1], sl, d.data, d.scales, row0);
          row0 += sl.num_rows;
        }
      }
      for (const WeightSpec& w : spec.weights) {
        if (w.per_layer && !w.is_linear) {
          put(WeightName(w, i), WeightShape(w, c), DType::kF32, VectorOf(l, w.role));
        }
      }
      if (opt.log && head_here && isatty(fileno(stderr))) {
        std::fprintf(stderr, "\r[cuda] loading weights: layer %lld/%lld", (long long)(i + 1),
                     (long long)c.num_layers);
        if (i + 1 == c.num_layers) std::fprintf(stderr, "\n");
      }
    }
    // The uploads ran on the legacy stream (a pageable cudaMemcpy may return before its DMA
    // lands); the kernels run on `stream`, which does not wait for it.
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    Log("weights: " + Gib(double(weight_bytes)) + " (" + WeightsName() + ") loaded from " + dir +
        " in " + std::to_string(secs).substr(0, 5) + " s");
  }

  void FillDummy() {
    const ModelConfig& c = config;
    const ArchitectureSpec& spec = ArchitectureOf(c);
    const bool head_here = shard.rank == 0;  // the other ranks compute no logits
    AllocWeights();
    if (!lm_head && head_here) {
      lm_head = Alloc(vocab * hidden * int64_t(esize));
      weight_bytes += vocab * hidden * int64_t(esize);
    }
    uint64_t seed = opt.dummy_seed * 1000003 + 1;
    auto rnd = [&](void* p, int64_t count) {
      // vLLM's dummy range: small uniform values keep activations finite at any depth.
      cuda::FillUniform(p, dtype, count, 1e-3f, seed++, stream);
    };
    auto ones = [&](float* p) { cuda::FillConstant(p, DType::kF32, hidden, 1.f, stream); };
    // A split weight: the full (fused) tensor with the seed it has at N = 1, generated into a
    // scratch buffer, of which this rank keeps its blocks (concatenated by rows, as the fused
    // q|k|v and gate|up weights are). One seed per device matrix, in the registry's order.
    const std::vector<FusedMatrix> matrices = LayerLinearMatrices(spec);
    struct Plan {
      int64_t rows = 0, cols = 0;            // the full fused tensor
      int64_t rows_here = 0, cols_here = 0;  // this rank's matrix
      std::vector<TpSlice> parts;            // this rank's blocks of the full tensor
    };
    std::vector<Plan> plans;
    int64_t most = 0;
    for (const FusedMatrix& m : matrices) {
      Plan p;
      for (const WeightSpec* w : m.members) {
        const std::vector<int64_t> shape = WeightShape(*w, c);
        TpSlice sl = shard.Slice(*w, c);
        p.rows_here += sl.num_rows;
        p.cols_here = sl.num_cols;
        sl.row_begin += p.rows;  // the member's rows within the fused tensor
        p.parts.push_back(sl);
        p.rows += shape[0];
        p.cols = shape[1];
      }
      most = std::max(most, p.rows * p.cols);
      plans.push_back(std::move(p));
    }
    std::byte* scratch = nullptr;
    if (shard.size > 1) {
      LLM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch), size_t(most) * esize));
    }
    auto rnd_parts = [&](void* dst, const Plan& p) {
      if (!scratch) return rnd(dst, p.rows * p.cols);
      cuda::FillUniform(scratch, dtype, p.rows * p.cols, 1e-3f, seed++, stream);
      auto* out = static_cast<std::byte*>(dst);
      for (const TpSlice& sl : p.parts) {
        LLM_CUDA_CHECK(cudaMemcpy2DAsync(
            out, size_t(sl.num_cols) * esize,
            scratch + (size_t(sl.row_begin) * size_t(p.cols) + size_t(sl.col_begin)) * esize,
            size_t(p.cols) * esize, size_t(sl.num_cols) * esize, size_t(sl.num_rows),
            cudaMemcpyDeviceToDevice, stream));
        out += size_t(sl.num_rows * sl.num_cols) * esize;
      }
    };
    rnd(embed, vocab * hidden);
    if (lm_head != embed) {
      if (lm_head) {
        rnd(lm_head, vocab * hidden);
      } else {
        ++seed;  // rank > 0: no lm_head, the same seeds for the layers
      }
    }
    ones(final_norm);
    // fp8: this rank's matrix is generated in dtype into a staging buffer, then quantized.
    Fp8Stage stage(*this);
    for (Layer& l : layers) {
      for (const WeightSpec& w : spec.weights) {
        if (w.per_layer && !w.is_linear) ones(VectorOf(l, w.role));
      }
      for (size_t k = 0; k < matrices.size(); ++k) {
        const DeviceMatrix d = MatrixOf(l, matrices[k]);
        const Plan& p = plans[k];
        if (!fp8) {
          rnd_parts(d.data, p);
          continue;
        }
        void* buf = stage.Get(p.rows_here * p.cols_here * int64_t(esize));
        rnd_parts(buf, p);
        stage.Quantize(buf, dtype, p.rows_here, p.cols_here, d.data, d.scales, "dummy weight");
      }
    }
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (scratch) cudaFree(scratch);
    Log("weights: " + Gib(double(weight_bytes)) + " of dummy values (" + WeightsName() +
        ") generated on the device (seed " + std::to_string(opt.dummy_seed) + ")");
  }

  // ---- buffers -----------------------------------------------------------------------
  void AllocActivations() {
    const int64_t before = allocated_bytes;
    const int64_t T = max_tokens, S = max_seqs;
    x = Alloc<float>(T * hidden * 4);
    normed = Alloc(T * hidden * int64_t(esize));
    qkv = Alloc(T * qkv_dim * int64_t(esize));
    q = Alloc(T * q_dim * int64_t(esize));
    attn = Alloc(T * q_dim * int64_t(esize));
    gate_up = Alloc(T * 2 * inter * int64_t(esize));
    act = Alloc(T * inter * int64_t(esize));
    rows_normed = Alloc(max_rows * hidden * int64_t(esize));
    // The folded RMSNorm's sums of squares: one per token per 4-row group of the residual.
    rms_partials = Alloc<float>(cuda::kGemvMaxTokens * ((hidden + 3) / 4) * 4);
    if (fp8) {
      act8 = Alloc<uint8_t>(T * std::max({hidden, q_dim, inter}));
      act8_scale = Alloc<float>(T * 4);
    }
    logits = Alloc<float>(max_rows * vocab * 4);
    decode_ws = Alloc(int64_t(kDecodeWorkspaceBytes));
    // Zeroed once: its split arrival counters must start at zero, and every decode attention
    // call leaves them zero (kernels/cuda/attention/decode_attention.h), graph replays included.
    LLM_CUDA_CHECK(cudaMemsetAsync(decode_ws, 0, kDecodeWorkspaceBytes, stream));
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
      prefill_scratch_bytes = cuda::PrefillFp8ScratchBytes(
          PagedKvLayout{1, bs, kv_heads, config.head_dim}, dtype, S, table_cap,
          prefill_scratch_pages);
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
      stage_cap = 3 * pad(T * 4) + pad(T * 8) + pad((std::max(S, T) + 1) * 4) +
                  pad((S + 1) * 4) + pad(S * 4) + pad(S * table_cap * 4) + pad(max_rows * 4) +
                  pad(S * int64_t(sizeof(cuda::SampleRowParams)));
      h_stage.Alloc(stage_cap);
      d_stage = Alloc<std::byte>(stage_cap);
    }
    ReserveAdjust(4096);
    activation_bytes = allocated_bytes - before;
  }

  void ReserveAdjust(int64_t count) {
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

  void AllocKv(int64_t num_blocks) {
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

  void FreeKv() {
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

  int64_t BytesPerBlock() const {
    return 2 * config.num_layers * kv_heads * opt.block_size * config.head_dim *
           int64_t(kv_esize);
  }

  // ---- one step ------------------------------------------------------------------------
  // Fills the input buffers for `b`. padded > 0: a decode graph's batch of `padded` rows
  // (the extra rows attend to key 0 of block 0, write no KV and their logits are ignored).
  // wait_inputs false: the caller waited for the previous step's copies already (Launch).
  Shape Upload(const ForwardBatch& b, int64_t padded, int64_t width, bool wait_inputs = true) {
    if (wait_inputs) WaitInputsCopied();
    Shape s;
    const int64_t n = b.num_tokens(), ns = b.num_seqs();
    // Decode rows take the split-KV decode kernel unless the batch asks for batch-invariant
    // routing or the head_dim has no decode kernel (then the prefill kernel takes them).
    const bool decode_kernel = decode_kernel_ok && !b.is_batch_invariant;
    s.num_tokens = padded > 0 ? padded : n;
    s.num_seqs = padded > 0 ? padded : ns;
    s.num_rows = padded > 0 ? padded : int64_t(b.logits_indices.size());
    s.num_decode = !decode_kernel ? 0 : padded > 0 ? padded : b.num_decode_seqs;
    s.width = width;
    if (s.num_tokens > max_tokens || s.num_seqs > max_seqs || s.num_rows > max_rows ||
        width > table_cap) {
      throw Error("CUDA executor: a step of " + std::to_string(n) + " tokens, " +
                  std::to_string(ns) + " sequences, " + std::to_string(s.num_rows) +
                  " logits rows and " + std::to_string(width) +
                  " blocks per sequence exceeds what was sized at start-up (" +
                  std::to_string(max_tokens) + ", " + std::to_string(max_seqs) + ", " +
                  std::to_string(max_rows) + ", " + std::to_string(table_cap) + ")");
    }
    s.has_feed = b.has_fed_tokens();
    for (int64_t t = 0; t < s.num_tokens; ++t) {
      const bool real = t < n;
      const int id = real ? b.token_ids[size_t(t)] : 0;
      if (s.has_feed) {
        const int32_t row = real ? b.prev_sample_rows[size_t(t)] : -1;
        if (shard.rank == 0 && row >= num_last_sampled) {  // (rank 0 validated it for the rest)
          throw std::logic_error("CUDA executor: token " + std::to_string(t) +
                                 " is fed from task " + std::to_string(row) +
                                 " of the previous step, which sampled " +
                                 std::to_string(num_last_sampled) + " tokens");
        }
        h_feed.p[t] = row;
      }
      if (id < 0 || id >= vocab) {
        throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                    std::to_string(vocab) + ")");
      }
      h_tokens.p[t] = id;
      h_positions.p[t] = real ? b.positions[size_t(t)] : 0;
      h_slots.p[t] = real ? b.slot_mapping[size_t(t)] : -1;
    }
    for (int64_t i = 0; i <= s.num_seqs; ++i) {
      h_cu.p[i] = padded > 0 ? int32_t(i) : b.cu_seqlens_q[size_t(i)];  // decode rows: cu = i
    }
    const int64_t nd = s.num_decode;
    for (int64_t i = nd; i <= s.num_seqs; ++i) h_cu_prefill.p[i - nd] = h_cu.p[i] - h_cu.p[nd];
    for (int64_t i = 0; i < s.num_seqs; ++i) {
      int32_t* row = h_tables.p + i * width;
      if (i < ns) {
        const int32_t* src = b.block_tables.data() + i * b.max_blocks_per_seq;
        const int64_t len = std::min(width, b.max_blocks_per_seq);
        std::copy(src, src + len, row);
        std::fill(row + len, row + width, -1);
        const int32_t ctx = b.context_lens[size_t(i)];
        h_ctx.p[i] = ctx;
        const int32_t q_len = h_cu.p[i + 1] - h_cu.p[i];
        if (i < nd) {
          s.max_keys_decode = std::max<int64_t>(s.max_keys_decode, ctx + 1);
        } else {
          s.max_q_len = std::max<int64_t>(s.max_q_len, q_len);
          s.max_keys_prefill = std::max<int64_t>(s.max_keys_prefill, ctx + q_len);
        }
      } else {
        row[0] = 0;
        std::fill(row + 1, row + width, -1);
        h_ctx.p[i] = 0;
        if (i >= nd) {
          s.max_q_len = std::max<int64_t>(s.max_q_len, 1);
          s.max_keys_prefill = std::max<int64_t>(s.max_keys_prefill, 1);
        }
      }
    }
    // fp8 KV: group the prefill sequences by the pages the scratch holds (eager steps only:
    // a graph replays its capture's launches; batch-invariant steps keep one rung for every
    // row, as the graphs do).
    if (prefill_scratch != nullptr && padded == 0 && !b.is_batch_invariant) {
      Shape::PrefillGroup g{nd, nd, 0};
      for (int64_t i = nd; i < s.num_seqs; ++i) {
        const int64_t pages = cuda::PrefillPagesNeeded(h_cu.p + i, h_ctx.p + i, 1, opt.block_size);
        if (g.pages + pages > prefill_scratch_pages && i > g.begin) {
          g.end = i;
          s.prefill_groups.push_back(g);
          g = {i, i, 0};
        }
        g.pages += pages;
      }
      g.end = s.num_seqs;
      if (g.end > g.begin) s.prefill_groups.push_back(g);
    }
    for (int64_t r = 0; r < s.num_rows; ++r) {
      h_rows.p[r] = padded > 0 ? int32_t(r) : b.logits_indices[size_t(r)];
    }
    s.max_keys_decode = std::max<int64_t>(s.max_keys_decode, 1);
    if (nd > 0) {
      const size_t per_split =
          size_t(nd) * size_t(heads) * size_t(config.head_dim + 2) * sizeof(float);
      s.splits = cuda::DecodeAutoSplits(nd, kv_heads, s.max_keys_decode, config.head_dim,
                                        int64_t(kDecodeWorkspaceBytes / per_split),
                                        opt.decode_min_tiles_per_split);
    }
    CopyIn(d_tokens, h_tokens.p, s.num_tokens * 4);
    CopyIn(d_positions, h_positions.p, s.num_tokens * 4);
    CopyIn(d_slots, h_slots.p, s.num_tokens * 8);
    CopyIn(d_cu, h_cu.p, (s.num_seqs + 1) * 4);
    CopyIn(d_cu_prefill, h_cu_prefill.p, (s.num_seqs - nd + 1) * 4);
    CopyIn(d_ctx, h_ctx.p, s.num_seqs * 4);
    CopyIn(d_tables, h_tables.p, s.num_seqs * width * 4);
    CopyIn(d_rows, h_rows.p, s.num_rows * 4);
    if (s.has_feed) CopyIn(d_feed, h_feed.p, s.num_tokens * 4);
    FlushStaged();
    LLM_CUDA_CHECK(cudaEventRecord(ev_inputs, stream));
    return s;
  }

  // A step input to the device: staged into the packed upload (FlushStaged sends it), or its
  // own copy.
  void CopyIn(void* dst, const void* src, int64_t bytes) {
    if (bytes <= 0) return;
    if (!opt.packed_step_inputs) {
      LLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, stream));
      return;
    }
    const int64_t off = (staged_bytes + 15) / 16 * 16;
    if (off + bytes > stage_cap || int(staged.size()) == cuda::kMaxCopySegments ||
        bytes % 4 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0) {
      throw std::logic_error("CUDA executor: a packed step input does not fit its staging");
    }
    std::memcpy(h_stage.p + off, src, size_t(bytes));
    staged.push_back({off, dst, bytes});
    staged_bytes = off + bytes;
  }
  void FlushStaged() {
    if (staged.empty()) return;
    const std::vector<cuda::CopySegment> segs = std::move(staged);
    const int64_t bytes = staged_bytes;
    DiscardStaged();  // (also when the copy or the scatter throws)
    LLM_CUDA_CHECK(cudaMemcpyAsync(d_stage, h_stage.p, size_t(bytes), cudaMemcpyHostToDevice,
                                   stream));
    cuda::ScatterCopies(d_stage, segs.data(), int(segs.size()), stream);
    ++stats.packed_uploads;
  }
  void DiscardStaged() {
    staged.clear();
    staged_bytes = 0;
  }

  // The block manager's copy-on-write copies, in every layer of this rank's KV pool.
  void CopyBlocks(std::span<const BlockCopy> copies) {
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

  PagedKvView<void> Kv(int64_t layer) const {
    return {k_pool[size_t(layer)], v_pool[size_t(layer)], layout};
  }

  void Attention(int64_t layer, const Shape& s) {
    cuda::AttentionParams p;
    const PagedKvView<void> kv = Kv(layer);
    p.kv = {kv.k, kv.v, kv.layout};
    p.num_heads = heads;
    p.scale = 1.f / std::sqrt(float(config.head_dim));
    p.dtype = dtype;
    p.kv_format = kv_format;
    const int64_t nd = s.num_decode;
    if (nd > 0) {
      p.q = q;
      p.out = attn;
      p.batch = {nd, d_cu, d_ctx, d_tables, s.width};
      p.max_q_len = 1;
      p.max_num_keys = s.max_keys_decode;
      cuda::PagedDecodeAttention(p, s.splits, decode_ws, kDecodeWorkspaceBytes, stream);
    }
    if (s.num_seqs > nd) {
      const int64_t offset = nd * q_dim * int64_t(esize);
      p.q = static_cast<const std::byte*>(q) + offset;
      p.out = static_cast<std::byte*>(attn) + offset;
      p.batch = {s.num_seqs - nd, d_cu_prefill, d_ctx + nd, d_tables + nd * s.width, s.width};
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
        // A group of one sequence with more pages than the scratch holds runs on the mma.sync
        // kernel (no scratch), even where the table's slack would hold its pages.
        const cuda::PrefillScratch scratch{prefill_scratch, prefill_scratch_bytes, g.pages};
        const bool fits = g.pages <= prefill_scratch_pages;
        if (cuda::PagedPrefillAttention(p, stream, cuda::PrefillVariant::kBest,
                                        fits ? &scratch : nullptr) ==
            cuda::PrefillVariant::kWgmma) {
          ++stats.fp8_prefill_copies;
        }
      }
    }
  }

  // One linear layer of a small step on the GEMV kernel (kernels/cuda/gemv/gemv.h); with `norm`,
  // `in` is the fp32 residual and the RMSNorm runs in the GEMV's prologue.
  // fp8: w_scale is the matrix's row scales (e4m3 weights, bf16/fp16 activations).
  cuda::GemvArgs SmallArgs(cuda::GemvEpilogue epilogue, const void* in, const float* norm,
                           const void* w, const float* w_scale, void* out, int64_t n, int64_t m,
                           int64_t k) const {
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
    return g;
  }
  void SmallLinear(cuda::GemvEpilogue epilogue, const void* in, const float* norm, const void* w,
                   const float* w_scale, void* out, int64_t n, int64_t m, int64_t k) {
    cuda::Gemv(SmallArgs(epilogue, in, norm, w, w_scale, out, n, m, k), stream);
  }

  // Moves the RMSNorm of the fp32 residual `resid` (weight `norm`) into g's prologue when the
  // executor's option allows it and the GEMV supports it; false: g still reads `normed`, which
  // a separate AddRmsNorm must write.
  bool FuseNorm(cuda::GemvArgs& g, const float* resid, const float* norm) const {
    if (!opt.gemv_norm_prologue) return false;
    cuda::GemvArgs fused = g;
    fused.x = resid;
    fused.norm_weight = norm;
    if (!cuda::GemvSupports(fused)) return false;
    g = fused;
    return true;
  }

  // The RMSNorm (weight) of the residual x before GEMV g, which reads `normed`: folded (the
  // GEMV before g wrote `normed` and x's sums of squares: GemvArgs::rms_partials), in g's
  // prologue (FuseNorm), or its own kernel.
  void NormBefore(cuda::GemvArgs& g, bool folded_in, const float* weight, int64_t n) {
    if (folded_in) {
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

  // g (a residual GEMV) also writes the folded RMSNorm's input for the GEMV after it: `normed`
  // = dtype(weight ⊙ x) and rms_partials (GemvArgs::rms_partials).
  void FoldInto(cuda::GemvArgs& g, const float* weight) const {
    g.rms_weight = weight;
    g.rms_x = normed;
    g.rms_partials = rms_partials;
  }

  bool SmallStep(int64_t rows) const {
    return gemv_ok && rows <= std::min<int64_t>(cuda::kGemvMaxTokens, opt.gemv_max_tokens);
  }

  // Every kernel of one step, on `stream` (capturable: no sync, no allocation).
  void RunModel(const Shape& s) {
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
    const bool fold = small && opt.gemv_fold_norm && dtype == DType::kBF16 && shard.size == 1 &&
                      rms_partials != nullptr;
    bool folded = false;  // normed and rms_partials hold x's folded RMSNorm for q|k|v
    cuda::EmbeddingGather(embed, dtype, d_tokens, n, hidden, x, stream);
    for (int64_t i = 0; i < config.num_layers; ++i) {
      if (fp8 && !small) {  // W8A8: the layer's own path
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
                     .inv_freq = inv_freq,
                     .num_heads = int(heads),
                     .num_kv_heads = int(kv_heads),
                     .head_dim = int(config.head_dim),
                     .layout = kv.layout,
                     .k_cache = kv.k,
                     .v_cache = kv.v,
                     .kv_format = kv_format};
      }
      const bool rope_gemv = small && cuda::GemvSupports(rope);
      // The fold needs both GEMVs of each pair; x always holds the whole residual, so a step
      // can fall back to the RMSNorm kernel at any layer.
      const bool fold_here = fold && rope_gemv;
      if (rope_gemv) {
        NormBefore(rope, folded && fold_here, l.input_norm, n);
        cuda::Gemv(rope, stream);
      } else {
        cuda::AddRmsNorm(x, nullptr, l.input_norm, normed, dtype, nullptr, n, hidden, eps, stream);
        if (small) {
          SmallLinear(E::kStore, normed, nullptr, l.qkv, l.qkv_s, qkv, n, qkv_dim, hidden);
        } else {
          gemm->Linear(normed, l.qkv, qkv, n, qkv_dim, hidden, dtype, dtype, false, stream);
        }
        cuda::RopeAppendKv(qkv, d_positions, d_slots, inv_freq, n, int(heads),
                           int(kv_heads), int(config.head_dim), Kv(i), dtype, q, stream,
                           kv_format);
      }
      Attention(i, s);
      // o and down add their output to the residual stream x. Tensor parallel: each rank's is
      // a partial sum; rank 0 adds its partial to x, the others store theirs in x, and the
      // all-reduce leaves x + Σ partials on every rank.
      const bool add = shard.rank == 0;
      const E residual = add ? E::kAccumulateF32 : E::kStoreF32;
      if (small) {
        // o: one CTA per row group, not the persistent wave. The decode attention's CTAs still
        // hold SM slots when o launches (PDL), so some persistent CTAs would start late with a
        // full share of rows each: Llama-2-7B batch 1 4.40 ms/token persistent, 3.90 not
        // (bench/RESULTS.md).
        cuda::GemvArgs o = SmallArgs(residual, attn, nullptr, l.o, l.o_s, x, n, hidden, q_dim);
        o.waves = 0;
        if (fold_here) FoldInto(o, l.post_norm);
        cuda::Gemv(o, stream);
        AllReduceResidual(n);
        cuda::GemvArgs gate_up =
            SmallArgs(E::kSiluMul, normed, nullptr, l.gate_up, l.gate_up_s, act, n, 2 * inter,
                      hidden);
        NormBefore(gate_up, fold_here, l.post_norm, n);
        cuda::Gemv(gate_up, stream);
        cuda::GemvArgs down = SmallArgs(residual, act, nullptr, l.down, l.down_s, x, n, hidden, inter);
        folded = fold_here && i + 1 < config.num_layers;
        if (folded) FoldInto(down, layers[size_t(i + 1)].input_norm);
        cuda::Gemv(down, stream);
      } else {
        gemm->Linear(attn, l.o, x, n, hidden, q_dim, dtype, f32, add, stream);
        AllReduceResidual(n);
        cuda::AddRmsNorm(x, nullptr, l.post_norm, normed, dtype, nullptr, n, hidden, eps, stream);
        gemm->Linear(normed, l.gate_up, gate_up, n, 2 * inter, hidden, dtype, dtype, false, stream);
        cuda::SiluMul(gate_up, act, n, inter, dtype, stream);
        gemm->Linear(act, l.down, x, n, hidden, inter, dtype, f32, add, stream);
      }
      AllReduceResidual(n);
    }
    if (s.num_rows == 0 || shard.rank != 0) return;  // rank 0 alone computes logits
    cuda::AddRmsNorm(x, nullptr, final_norm, rows_normed, dtype, d_rows, s.num_rows, hidden, eps,
                     stream);
    if (SmallStep(s.num_rows)) {
      SmallLinear(E::kStoreF32, rows_normed, nullptr, lm_head, nullptr, logits, s.num_rows, vocab,
                  hidden);
    } else {
      gemm->Linear(rows_normed, lm_head, logits, s.num_rows, vocab, hidden, dtype, f32, false,
                   stream);
    }
  }

  // One layer with fp8 weights (W8A8): each GEMM's input is quantized per token by the kernel
  // that produces it (the RMSNorms and SiLU·mul write e4m3 codes and scales; the attention
  // output takes a quantization pass of its own), and cuBLASLt applies both scale vectors in
  // its FP8 GEMM's epilogue (engine/cuda/gemm.h).
  void RunLayerFp8(int64_t i, const Shape& s) {
    const int64_t n = s.num_tokens;
    const float eps = float(config.rms_norm_eps);
    const DType f32 = DType::kF32;
    const Layer& l = layers[size_t(i)];
    cuda::AddRmsNormE4m3(x, nullptr, l.input_norm, act8, act8_scale, dtype, nullptr, n, hidden,
                         eps, stream);
    gemm->LinearFp8(act8, act8_scale, l.qkv, l.qkv_s, qkv, n, qkv_dim, hidden, dtype, false,
                    stream);
    cuda::RopeAppendKv(qkv, d_positions, d_slots, inv_freq, n, int(heads), int(kv_heads),
                       int(config.head_dim), Kv(i), dtype, q, stream, kv_format);
    Attention(i, s);
    const bool add = shard.rank == 0;  // tensor parallel: see RunModel
    cuda::QuantizeRowsE4m3(attn, dtype, n, q_dim, act8, act8_scale, nullptr, stream);
    gemm->LinearFp8(act8, act8_scale, l.o, l.o_s, x, n, hidden, q_dim, f32, add, stream);
    AllReduceResidual(n);
    cuda::AddRmsNormE4m3(x, nullptr, l.post_norm, act8, act8_scale, dtype, nullptr, n, hidden,
                         eps, stream);
    gemm->LinearFp8(act8, act8_scale, l.gate_up, l.gate_up_s, gate_up, n, 2 * inter, hidden,
                    dtype, false, stream);
    cuda::SiluMulE4m3(gate_up, act8, act8_scale, n, inter, dtype, stream);
    gemm->LinearFp8(act8, act8_scale, l.down, l.down_s, x, n, hidden, inter, f32, add, stream);
    AllReduceResidual(n);
  }

  // ---- tensor parallel collectives (no-ops at N = 1) ---------------------------------------
  void AllReduceResidual(int64_t tokens) {
    if (shard.size == 1) return;
    const int64_t count = tokens * hidden;
    if (p2p_ok && count <= cuda::kP2PFasterThanNccl && count % 4 == 0) {
      cuda::P2PAllReduce(p2p, count, stream);
      return;
    }
#if defined(LLM_HAS_NCCL)
    std::lock_guard<std::timed_mutex> lock(comm_mu);
    ThrowIfAborted();
    LLM_NCCL_CHECK(ncclAllReduce(x, x, size_t(count), ncclFloat32, ncclSum, comm, stream));
#endif
  }

  void ThrowIfAborted() const {
    if (comms_aborted) {
      throw FatalExecutorError("tensor parallel: the communicators were aborted after a failure");
    }
  }

  // The step's token ids, from rank 0 (where async scheduling's fed tokens are gathered).
  void BroadcastTokens(int64_t tokens) {
    if (shard.size == 1) return;
#if defined(LLM_HAS_NCCL)
    std::lock_guard<std::timed_mutex> lock(comm_mu);
    ThrowIfAborted();
    LLM_NCCL_CHECK(ncclBroadcast(d_tokens, d_tokens, size_t(tokens), ncclInt32, 0, comm, stream));
#endif
  }

  // Graph-eligible: decode rows only, each wanting its logits in order.
  bool GraphEligible(const ForwardBatch& b) const {
    if (!opt.cuda_graphs || graph_sizes.empty() || b.is_batch_invariant) return false;
    const int64_t ns = b.num_seqs();
    if (ns == 0 || b.num_decode_seqs != ns || ns > graph_sizes.back()) return false;
    if (int64_t(b.logits_indices.size()) != ns) return false;
    for (int64_t i = 0; i < ns; ++i)
      if (b.logits_indices[size_t(i)] != i) return false;
    return true;
  }

  int64_t PaddedBatch(int64_t ns) const {
    return *std::lower_bound(graph_sizes.begin(), graph_sizes.end(), ns);
  }

  int64_t GraphWidth(int64_t max_blocks) const {
    return std::min(table_cap, std::max(kMinTableWidth, NextPow2(max_blocks)));
  }

  cudaGraphExec_t Capture(const Shape& s) {
    cudaGraph_t graph = nullptr;
    LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    try {
      RunModel(s);
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    LLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    LLM_CUDA_CHECK(cudaGraphDestroy(graph));
    ++stats.graphs_captured;
    return exec;
  }

  // The previous step's host-to-device copies are done: its pinned inputs may be rewritten.
  void WaitInputsCopied() { Sync(ev_inputs); }

  // Runs the model for `b`; the logits of its rows are in `logits` afterwards (on stream).
  // Fed tokens (async) are gathered from d_sampled into d_tokens first, outside any graph:
  // the graph reads d_tokens like any other input buffer.
  // Tensor parallel: rank 0 uploads (and so validates) the batch first, then hands it to the
  // peers, which run the same Run on their GPUs: every rank takes the same graph / eager
  // decision and enqueues the same collectives in the same order.
  void Run(const ForwardBatch& b, bool wait_inputs = true) {
    if (b.num_tokens() == 0) throw Error("Forward: no tokens");
    if (shard.rank > 0 && opt.test_fail_peer_on_token >= 0 &&
        std::count(b.token_ids.begin(), b.token_ids.end(), opt.test_fail_peer_on_token) > 0) {
      throw Error("test: tensor-parallel rank " + std::to_string(shard.rank) +
                  " fails on token " + std::to_string(opt.test_fail_peer_on_token));
    }
    CheckPeers();
    const bool graph = GraphEligible(b);
    const int64_t padded = graph ? PaddedBatch(b.num_seqs()) : 0;
    const int64_t width =
        graph ? GraphWidth(b.max_blocks_per_seq) : std::max<int64_t>(1, b.max_blocks_per_seq);
    const Shape s = Upload(b, padded, width, wait_inputs);
    if (drive_peers) {
      auto copy = std::make_shared<const ForwardBatch>(b);
      PostToPeers([copy](Impl& peer) { peer.Run(*copy); });
      // From here on the peers enqueue this step's collectives: a failure on this rank
      // would leave them unpaired, so it is fatal (and the communicators are aborted).
      try {
        Enqueue(s, graph, padded);
      } catch (const FatalExecutorError&) {
        AbortComms();
        throw;
      } catch (const std::exception& e) {
        AbortComms();
        throw FatalExecutorError(std::string("tensor-parallel rank 0 failed mid-step: ") +
                                 e.what());
      }
    } else {
      Enqueue(s, graph, padded);
    }
    ++stats.steps;
  }

  // The device work of a step uploaded as `s`: the fed tokens' gather (and broadcast), then
  // the decode graph or the eager forward.
  void Enqueue(const Shape& s, bool graph, int64_t padded) {
    if (s.has_feed) {
      if (shard.rank == 0) {
        cuda::FeedSampledTokens(d_tokens, d_feed, d_sampled, s.num_tokens, stream);
      }
      BroadcastTokens(s.num_tokens);
    }
    if (graph) {
      const auto key = std::make_tuple(padded, s.splits, s.width);
      auto it = graphs.find(key);
      if (it == graphs.end()) it = graphs.emplace(key, Capture(s)).first;
      LLM_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
      ++stats.graph_steps;
    } else {
      RunModel(s);
    }
  }

  // ---- tensor parallel: the peers and their worker threads ---------------------------------
  void PostToPeers(std::function<void(Impl&)> job);
  // Runs f on every rank at once (rank 0 here, the peers on their threads) and waits; the
  // first failure is rethrown (after aborting the communicators, so no rank stays blocked in
  // a collective its failed partner never joins).
  void RunOnAllRanks(const std::function<void(Impl&)>& f);
  // Throws FatalExecutorError when a peer's step failed (its communicators are then aborted:
  // the ranks' collectives can no longer pair up).
  void CheckPeers();
  void AbortComms();
  [[noreturn]] void RethrowClassified();
  // Waits for `ev`; with peers, polls, so that a failed peer ends the wait with an error
  // instead of a collective that never completes.
  void Sync(cudaEvent_t ev) {
    if (peers.empty()) {
      LLM_CUDA_CHECK(cudaEventSynchronize(ev));
      return;
    }
    for (;;) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) {
        // Work that completed after a rank failed may have summed garbage (an aborted
        // all-reduce): it is not a result.
        CheckPeers();
        return;
      }
      if (q != cudaErrorNotReady) LLM_CUDA_CHECK(q);
      CheckPeers();
      std::this_thread::yield();
    }
  }
  void SyncStream() {
    if (peers.empty()) {
      LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
      return;
    }
    LLM_CUDA_CHECK(cudaEventRecord(ev_sync, stream));
    Sync(ev_sync);
  }

  // Ends a step's device span (call after its last device-to-host copy is enqueued) and
  // waits for it.
  void StopAndWait(OutSlot& o) {
    LLM_CUDA_CHECK(cudaEventRecord(o.stop, stream));
    Sync(o.stop);
  }

  // Device time of the step between o.start and o.stop (each event completes when the stream
  // reaches it, so an async step's span starts after the step before it: spans never
  // overlap, and their sum over a run's wall time is the device-busy fraction); host time
  // spent inside the executor's calls.
  void FinishTiming(const OutSlot& o, double host_ms) {
    float ms = 0;
    LLM_CUDA_CHECK(cudaEventElapsedTime(&ms, o.start, o.stop));
    stats.device_ms += ms;
    stats.wall_ms += host_ms;
  }

  // Fills and uploads the sampling parameters of tasks [begin, begin + count) (count <=
  // max_seqs), taking each sampler's draw.
  // flush = false: the parameters stay staged (packed inputs) for the step's Upload to send.
  void UploadSampleParams(std::span<const SampleTask> tasks, size_t begin, size_t count,
                          bool wait_inputs = true, bool flush = true) {
    if (wait_inputs) WaitInputsCopied();
    std::vector<TokenAdjust> adjust;
    for (size_t i = 0; i < count; ++i) {
      Sampler& sm = *tasks[begin + i].sampler;
      const SamplingParams& sp = sm.params();
      cuda::SampleRowParams& r = h_params.p[i];
      r.logits_row = int32_t(tasks[begin + i].logits_row);
      r.temperature = float(sp.temperature);
      r.top_k = sp.top_k;
      r.top_p = float(sp.top_p);
      r.min_p = float(sp.min_p);
      r.seed = sm.device_seed();
      r.offset = sm.TakeDraw();
      r.num_logprobs = sp.logprobs ? *sp.logprobs : -1;
      r.adjust_begin = int32_t(adjust.size());
      sm.AppendAdjustments(vocab, &adjust);
      r.adjust_end = int32_t(adjust.size());
    }
    ReserveAdjust(int64_t(adjust.size()));
    for (size_t i = 0; i < adjust.size(); ++i) {
      h_adjust.p[i] = {adjust[i].token, adjust[i].bias, adjust[i].repetition, adjust[i].subtract};
    }
    CopyIn(d_params, h_params.p, int64_t(count * sizeof(cuda::SampleRowParams)));
    if (flush) FlushStaged();
    if (!adjust.empty()) {
      LLM_CUDA_CHECK(cudaMemcpyAsync(d_adjust, h_adjust.p, adjust.size() * sizeof(TokenAdjust),
                                     cudaMemcpyHostToDevice, stream));
    }
    LLM_CUDA_CHECK(cudaEventRecord(ev_inputs, stream));
  }

  // Samples tasks [begin, begin + count) from `logits` (after the forward, on stream): the
  // ids into d_sampled + begin (the next step may be fed from them), everything into `o`.
  // h_params.p[0, count) holds these tasks' parameters (UploadSampleParams just wrote them).
  void EnqueueSample(size_t begin, size_t count, OutSlot& o) {
    cuda::SampleOutputs dst = d_out;
    dst.token = d_sampled + begin;
    cuda::SampleTokens(logits, vocab, d_params, int64_t(count), d_adjust, sample_ws, dst, stream);
    auto back = [&](void* host, const void* src, size_t bytes) {
      LLM_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream));
    };
    back(o.token.p, dst.token, count * 4);
    // The logprob outputs only when a task asked for them (ReadSampleResults reads them only
    // then): one copy back per step instead of four in the common case (~3 µs each).
    bool logprobs = false;
    for (size_t i = 0; i < count; ++i) logprobs |= h_params.p[i].num_logprobs >= 0;
    if (!logprobs) return;
    back(o.logprob.p, d_out.logprob, count * 4);
    back(o.top_ids.p, d_out.top_ids, count * cuda::kMaxTopLogprobs * 4);
    back(o.top_lp.p, d_out.top_logprobs, count * cuda::kMaxTopLogprobs * 4);
  }

  // The results of tasks [begin, begin + count) from `o` (copied back), recorded in their
  // samplers for the penalties (their draws were taken at upload).
  void ReadSampleResults(std::span<const SampleTask> tasks, size_t begin, size_t count,
                         const int32_t* num_logprobs, const OutSlot& o,
                         std::vector<SampleResult>* results) {
    for (size_t i = 0; i < count; ++i) {
      SampleResult& res = (*results)[begin + i];
      res.token = o.token.p[i];
      const int n = num_logprobs[i];
      if (n >= 0) {
        res.logprob = o.logprob.p[i];
        for (int k = 0; k < std::min(n, int(vocab)); ++k) {
          res.top_logprobs.push_back({o.top_ids.p[i * cuda::kMaxTopLogprobs + size_t(k)],
                                      o.top_lp.p[i * cuda::kMaxTopLogprobs + size_t(k)]});
        }
      }
      tasks[begin + i].sampler->Observe(res.token);
    }
  }

  // Samples every task after the forward and waits: in rounds of max_seqs tasks (n > 1 can
  // ask for more), each round's pinned buffers read before the next reuses them.
  std::vector<SampleResult> Sample(std::span<const SampleTask> tasks, OutSlot& o) {
    if (int64_t(tasks.size()) > sampled_cap) {
      throw Error("CUDA executor: " + std::to_string(tasks.size()) +
                  " samples in one step exceed what was sized at start-up (" +
                  std::to_string(sampled_cap) + ")");
    }
    std::vector<SampleResult> results(tasks.size());
    num_last_sampled = int64_t(tasks.size());
    if (tasks.empty()) StopAndWait(o);
    std::vector<int32_t> num_logprobs;
    for (size_t begin = 0; begin < tasks.size(); begin += size_t(max_seqs)) {
      const size_t count = std::min(tasks.size() - begin, size_t(max_seqs));
      UploadSampleParams(tasks, begin, count);
      num_logprobs.resize(count);
      for (size_t i = 0; i < count; ++i) num_logprobs[i] = h_params.p[i].num_logprobs;
      EnqueueSample(begin, count, o);
      if (begin + count == tasks.size()) {
        StopAndWait(o);
      } else {
        SyncStream();  // the pinned buffers are reused
      }
      ReadSampleResults(tasks, begin, count, num_logprobs.data(), o, &results);
    }
    return results;
  }

  // ---- asynchronous steps (Launch / Wait) -------------------------------------------------
  // Order on the stream: sampling parameters and batch inputs (host to device), the fed
  // tokens' gather, the forward (graph or eager), the sampler, the copies back, o.stop.
  // Nothing waits for the device here, except for the previous step's input copies.
  StepHandle Launch(const ForwardBatch& b, std::span<const SampleTask> tasks) {
    const auto host_start = Clock::now();
    if (pending.size() >= 2) {
      throw std::logic_error("CUDA executor: at most two steps in flight (Wait first)");
    }
    PendingStep p;
    p.id = next_step_id++;
    p.slot = pending.empty() ? 0 : 1 - pending.back().slot;
    OutSlot& o = out[p.slot];
    p.tasks.assign(tasks.begin(), tasks.end());
    if (int64_t(tasks.size()) > max_seqs) {  // rounds of max_seqs: synchronous
      LLM_CUDA_CHECK(cudaEventRecord(o.start, stream));
      Run(b);
      p.results = Sample(tasks, o);
      p.has_results = true;
    } else {
      if (b.num_tokens() == 0) throw Error("Forward: no tokens");
      // The one wait of a launch: the previous step's input copies (at the head of what the
      // stream still holds), not its forward. The copies enqueued below may not be waited
      // for again before the forward: they sit behind the previous step's work.
      WaitInputsCopied();
      DiscardStaged();  // (what a failed launch left staged)
      LLM_CUDA_CHECK(cudaEventRecord(o.start, stream));
      if (!tasks.empty()) {
        UploadSampleParams(tasks, 0, tasks.size(), /*wait_inputs=*/false, /*flush=*/false);
      }
      p.num_logprobs.resize(tasks.size());
      for (size_t i = 0; i < tasks.size(); ++i) p.num_logprobs[i] = h_params.p[i].num_logprobs;
      try {
        Run(b, /*wait_inputs=*/false);  // validates fed rows against num_last_sampled
        num_last_sampled = int64_t(tasks.size());
        if (!tasks.empty()) EnqueueSample(0, tasks.size(), o);
        LLM_CUDA_CHECK(cudaEventRecord(o.stop, stream));
      } catch (...) {
        DiscardStaged();
        // Nothing was sampled: give back the draw each task took above (executor.h).
        for (const SampleTask& t : tasks) t.sampler->UndoDraws(1);
        throw;
      }
    }
    pending.push_back(std::move(p));
    stats.wall_ms += std::chrono::duration<double, std::milli>(Clock::now() - host_start).count();
    return {pending.back().id};
  }

  std::vector<SampleResult> Wait(StepHandle step) {
    const auto host_start = Clock::now();
    if (pending.empty() || pending.front().id != step.id) {
      throw std::logic_error("CUDA executor: Wait for step " + std::to_string(step.id) +
                             ", which is not the oldest launched step");
    }
    PendingStep p = std::move(pending.front());
    pending.pop_front();
    OutSlot& o = out[p.slot];
    std::vector<SampleResult> results;
    if (p.has_results) {
      results = std::move(p.results);
    } else {
      Sync(o.stop);
      results.resize(p.tasks.size());
      ReadSampleResults(p.tasks, 0, p.tasks.size(), p.num_logprobs.data(), o, &results);
    }
    const double host_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - host_start).count();
    FinishTiming(o, host_ms);
    return results;
  }

  // The synchronous calls use slot 0; they may not run while async steps are in flight.
  void CheckNothingInFlight(const char* what) const {
    if (!pending.empty()) {
      throw std::logic_error(std::string("CUDA executor: ") + what +
                             " while launched steps are not waited for");
    }
  }

  // The profiling pass: a step of `tokens` fresh tokens in as few sequences as the model's
  // context allows (each over its own blocks), every sequence asking for its last logits.
  void RunPrefillOnly(int64_t tokens) {
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
    LLM_CUDA_CHECK(cudaEventRecord(out[0].start, stream));
    Run(b);
    StopAndWait(out[0]);
  }

  // GEMM tuning at start-up (opt.gemm_autotune): one GPU, on its own stream's passes.
  bool Tuning() const { return opt.gemm_autotune && shard.size == 1; }

  // Captures the decode graphs for short contexts (split count 1, narrowest table). With
  // tuning, each batch size that runs GEMMs first runs once eagerly (the same kernels on the
  // same empty inputs the capture records), timing its GEMM shapes' candidates.
  void CaptureStartupGraphs() {
    if (!opt.cuda_graphs) return;
    const auto start = Clock::now();
    for (int64_t padded : graph_sizes) {
      ForwardBatch empty;
      Shape s = Upload(empty, padded, kMinTableWidth);
      s.splits = 1;
      const auto key = std::make_tuple(padded, s.splits, s.width);
      if (graphs.count(key)) continue;
      if (Tuning() && !SmallStep(padded)) {
        struct TuningOn {  // off again on every path
          cuda::Gemm& g;
          explicit TuningOn(cuda::Gemm& gemm) : g(gemm) { g.set_tuning(true); }
          ~TuningOn() { g.set_tuning(false); }
        } on(*gemm);
        RunModel(s);
      }
      graphs.emplace(key, Capture(s));
    }
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    Log("captured " + std::to_string(graphs.size()) + " decode CUDA graphs (batch 1.." +
        std::to_string(graph_sizes.back()) + ") in " +
        std::to_string(std::chrono::duration<double>(Clock::now() - start).count()).substr(0, 5) +
        " s" +
        (Tuning() ? "; GEMM algorithms timed for " + std::to_string(gemm->num_tuned()) +
                        " shapes, " + std::to_string(gemm->num_retuned()) +
                        " faster than cuBLASLt's first pick"
                  : std::string()));
  }
};

// Another rank: its Impl, driven by a worker thread of its own that runs the jobs rank 0
// posts (steps, block copies, start-up phases) in order, on the rank's GPU.
struct CudaExecutor::Impl::Peer {
  std::unique_ptr<Impl> impl;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void(Impl&)>> jobs;  // guarded by mu
  bool quit = false;                            // guarded by mu
  std::exception_ptr error;                     // the first failed job (guarded by mu)

  void Post(std::function<void(Impl&)> job) {
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
      std::function<void(Impl&)> job;
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

CudaExecutor::Impl::~Impl() {
  // The peers drain their queues and release their resources while this rank releases its
  // own: each NCCL communicator is destroyed by its own thread, all at once.
  for (auto& p : peers) {
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->quit = true;
    }
    p->cv.notify_one();
  }
  Release();
  for (auto& p : peers) {
    if (p->thread.joinable()) p->thread.join();
  }
  if (!comms_aborted) cuda::DestroyP2PAllReduce(p2p_group);  // every stream is idle by now
}

void CudaExecutor::Impl::PostToPeers(std::function<void(Impl&)> job) {
  for (auto& p : peers) p->Post(job);
}

void CudaExecutor::Impl::RunOnAllRanks(const std::function<void(Impl&)>& f) {
  std::vector<std::shared_ptr<std::promise<void>>> done;
  for (auto& p : peers) {
    auto promise = std::make_shared<std::promise<void>>();
    done.push_back(promise);
    p->Post([f, promise](Impl& peer) {
      try {
        f(peer);
        promise->set_value();
      } catch (...) {
        promise->set_exception(std::current_exception());
        throw;  // recorded by the worker too: rank 0's waits see it (CheckPeers) and abort
      }
    });
  }
  std::exception_ptr first;
  try {
    f(*this);
  } catch (...) {
    first = std::current_exception();
    AbortComms();
  }
  for (size_t i = 0; i < done.size(); ++i) {
    std::future<void> fut = done[i]->get_future();
    // A failed rank leaves the others waiting in a collective: abort them all.
    while (!first && fut.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
      for (auto& p : peers) {
        if (p->Failure()) AbortComms();
      }
    }
    try {
      fut.get();
    } catch (...) {
      if (!first) first = std::current_exception();
      AbortComms();
    }
  }
  if (first) std::rethrow_exception(first);
}

// The one-shot all-reduce's buffers on every rank (kernels/cuda/all_reduce/all_reduce.h), or NCCL only
// where a pair of GPUs has no peer access. Rank 0 owns them (p2p_group) and frees them last.
void CudaExecutor::Impl::SetupP2P(const std::vector<Impl*>& ranks) {
  p2p_group = cuda::CreateP2PAllReduce(int(ranks.size()));
  if (p2p_group.empty()) {
    Log("no peer access between every pair of GPUs: every all-reduce over NCCL");
    return;
  }
  for (Impl* m : ranks) {
    m->p2p = p2p_group[size_t(m->shard.rank)];
    m->p2p.buf = m->x;
    m->p2p_ok = true;
  }
}

void CudaExecutor::Impl::AbortComms() {
  if (comms_aborted.exchange(true)) return;
  // Every rank leaves its device state alone from now on (Release), and no rank's thread
  // starts another NCCL call (ThrowIfAborted under comm_mu).
  for (auto& p : peers) p->impl->comms_aborted = true;
  cuda::AbortP2PAllReduce(p2p_group);
#if defined(LLM_HAS_NCCL)
  std::vector<Impl*> ranks = {this};
  for (auto& p : peers) ranks.push_back(p->impl.get());
  for (Impl* r : ranks) {
    std::unique_lock<std::timed_mutex> lock(r->comm_mu, std::defer_lock);
    const bool idle = lock.try_lock_for(std::chrono::seconds(1));
    if (r->comm) ncclCommAbort(r->comm);  // also releases a call blocked inside NCCL
    if (idle) r->comm = nullptr;  // else its thread owns the pointer; teardown leaks it
  }
#endif
}

void CudaExecutor::Impl::CheckPeers() {
  for (auto& p : peers) {
    std::exception_ptr e = p->Failure();
    if (!e) continue;
    AbortComms();
    throw FatalExecutorError("tensor-parallel rank " + std::to_string(p->impl->shard.rank) +
                             " failed: " + ExceptionMessage(e));
  }
}

CudaExecutor::CudaExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaExecutor::~CudaExecutor() = default;

bool CudaBackendAvailable(std::string* why_not) { return cuda::DeviceAvailable(why_not); }

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool CudaTensorParallelAvailable() {
#if defined(LLM_HAS_NCCL)
  return true;
#else
  return false;
#endif
}

namespace {

ModelConfig LoadConfig(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(path)) return ModelConfig::FromJson(ReadJsonFile(path), path);
  return ModelConfig::Load(path);
}

}  // namespace

// ---- start-up ------------------------------------------------------------------------------
// Sizes and options of rank `rank` of `world` (no device work).
void CudaExecutor::Impl::Configure(const ModelConfig& c, const CudaExecutorOptions& options,
                                   int rank, int world) {
  opt = options;
  config = c;
  shard = MakeTensorParallelShard(c, rank, world);
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
  decode_kernel_ok = c.head_dim == 64 || c.head_dim == 128;
  fp8 = options.fp8_weights;
  wesize = fp8 ? 1 : esize;
  // fp8: small steps take the GEMV with e4m3 weights and bf16/fp16 activations (weight-only
  // quantization, as the CPU backend; k % 16 == 0, checked below), larger ones the W8A8 GEMMs.
  gemv_ok = hidden % 8 == 0 && q_dim % 8 == 0 && inter % 8 == 0;
  if (fp8 && (hidden % 16 != 0 || q_dim % 16 != 0 || inter % 16 != 0)) {
    throw Error("--quantization fp8 on cuda needs every linear layer's input width to be a "
                "multiple of 16 (cuBLASLt's FP8 GEMMs): hidden_size " + std::to_string(hidden) +
                ", attention width " + std::to_string(q_dim) + ", intermediate_size " +
                std::to_string(inter) + (shard.size > 1 ? " per GPU" : ""));
  }
  table_cap = (c.max_position_embeddings + options.block_size - 1) / options.block_size;
}

// Everything up to the KV pool: stream, weights, activations and the profiling pass (which
// holds collectives: at N > 1 every rank runs Setup at once). Sets kv_budget_blocks.
void CudaExecutor::Impl::Setup(const std::string& model_path) {
  LLM_CUDA_CHECK(cudaSetDevice(device));
  if (shard.rank == 0 && !decode_kernel_ok) {
    Log("head_dim " + std::to_string(config.head_dim) +
        ": attention on the naive prefill kernel (the tuned kernels take 64 and 128)");
  }
  device_name = cuda::DeviceDescription(device);
  {
    int major = 0;
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cuda::SetProgrammaticLaunch(opt.programmatic_launch && major >= 9);
  }
  LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (OutSlot& o : out) {
    LLM_CUDA_CHECK(cudaEventCreate(&o.start));
    LLM_CUDA_CHECK(cudaEventCreate(&o.stop));
  }
  LLM_CUDA_CHECK(cudaEventCreateWithFlags(&ev_inputs, cudaEventDisableTiming));
  LLM_CUDA_CHECK(cudaEventCreateWithFlags(&ev_sync, cudaEventDisableTiming));
  gemm = std::make_unique<cuda::Gemm>();
  gemm->set_fast_accum(opt.fp8_fast_accum);
  allocated_bytes += int64_t{32} << 20;

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
void CudaExecutor::Impl::Finish(int64_t num_blocks) {
  AllocKv(num_blocks);
  size_t free_bytes = 0, total_bytes = 0;
  LLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  stats.peak_device_bytes = int64_t(total_bytes) - int64_t(free_bytes);
  stats.weight_bytes = weight_bytes;
  stats.weight_bytes_per_token =
      weight_bytes - (lm_head && lm_head != embed ? vocab * hidden * int64_t(esize) : 0);
  stats.kv_cache_bytes = kv_bytes;
  stats.activation_bytes = activation_bytes;
  Log(device_name + ": weights " + Gib(double(weight_bytes)) + ", activations " +
      Gib(double(activation_bytes)) + ", KV cache " + (kv_format.fp8 ? "(fp8 e4m3) " : "") +
      Gib(double(kv_bytes)) + " = " +
      std::to_string(num_blocks * opt.block_size) + " tokens (" + std::to_string(num_blocks) +
      " blocks of " + std::to_string(opt.block_size) +
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
  stats.steps = stats.graph_steps = stats.fp8_prefill_copies = 0;  // (the profiling pass's)
  stats.device_ms = stats.wall_ms = 0;
}

std::unique_ptr<CudaExecutor> CudaExecutor::Create(const std::string& model_path,
                                                   const CudaExecutorOptions& options) {
  std::string why;
  if (!cuda::DeviceAvailable(&why)) throw Error("--device cuda: " + why);
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF16) {
    throw Error("the CUDA backend runs bf16 or f16 (got " + std::string(DTypeName(options.dtype)) +
                ")");
  }
  if (options.gpu_memory_utilization <= 0 || options.gpu_memory_utilization > 1) {
    throw Error("--gpu-memory-utilization must be in (0, 1]");
  }
  const ModelConfig config = LoadConfig(model_path);
  if (config.head_dim > 128) {
    throw Error("the CUDA backend supports head_dim up to 128 (the model has " +
                std::to_string(config.head_dim) + ")");
  }
  RequireBackendSupport(config, kCudaBackendSupport);
  const int world = options.tensor_parallel_size;
  MakeTensorParallelShard(config, 0, world);  // validates the split
  if (world > 1) {
    if (!CudaTensorParallelAvailable()) {
      throw Error("--tensor-parallel-size " + std::to_string(world) +
                  ": this build has no NCCL (configure with NCCL installed)");
    }
    if (CudaDeviceCount() < world) {
      throw Error("--tensor-parallel-size " + std::to_string(world) + " needs " +
                  std::to_string(world) + " GPUs; this process sees " +
                  std::to_string(CudaDeviceCount()));
    }
  }
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.Configure(config, options, 0, world);
  if (world == 1) {
    m.Setup(model_path);
    m.Finish(m.kv_budget_blocks);
    return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
  }
#if defined(LLM_HAS_NCCL)
  // NVLink multicast (NVLS) stays off: on shared hosts it can take the GPUs out of service.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::vector<ncclComm_t> comms(static_cast<size_t>(world), nullptr);
  std::vector<int> devices(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) devices[size_t(r)] = r;
  LLM_NCCL_CHECK(ncclCommInitAll(comms.data(), world, devices.data()));
  LLM_CUDA_CHECK(cudaSetDevice(0));
  m.comm = comms[0];
  for (int r = 1; r < world; ++r) {
    auto peer = std::make_unique<Impl::Peer>();
    peer->impl = std::make_unique<Impl>();
    peer->impl->Configure(config, options, r, world);
    peer->impl->comm = comms[size_t(r)];
    Impl::Peer* raw = peer.get();
    peer->thread = std::thread([raw] { raw->Loop(); });
    m.peers.push_back(std::move(peer));
  }
  m.RunOnAllRanks([&](Impl& rank) { rank.Setup(model_path); });
  if (options.custom_all_reduce) {  // before any graph is captured
    std::vector<Impl*> ranks = {&m};
    for (const auto& p : m.peers) ranks.push_back(p->impl.get());
    m.SetupP2P(ranks);
  }
  int64_t blocks = m.kv_budget_blocks;
  for (const auto& p : m.peers) blocks = std::min(blocks, p->impl->kv_budget_blocks);
  m.RunOnAllRanks([blocks](Impl& rank) { rank.Finish(blocks); });
  LLM_CUDA_CHECK(cudaSetDevice(0));
  m.drive_peers = true;
  m.Log("tensor parallel over " + std::to_string(world) + " GPUs (NCCL " +
        std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "): " +
        std::to_string(m.heads) + " query / " + std::to_string(m.kv_heads) + " KV heads and " +
        std::to_string(m.inter) + " MLP features per GPU, " + std::to_string(blocks) +
        " KV blocks each; all-reduce: " +
        (m.p2p_ok ? "one-shot over peer access up to " +
                        std::to_string(cuda::kP2PFasterThanNccl / m.hidden) +
                        " tokens, NCCL above"
                  : std::string("NCCL")));
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
#else
  throw Error("--tensor-parallel-size needs a build with NCCL");
#endif
}

const ModelConfig& CudaExecutor::config() const { return impl_->config; }

std::string CudaExecutor::Describe() const {
  const int tp = impl_->shard.size;
  const std::string dt(DTypeName(impl_->dtype));
  return "cuda: " + impl_->device_name + ", " + impl_->WeightsName() + " weights, " +
         (impl_->kv_format.fp8 ? std::string("fp8 (e4m3)") : dt) + " KV cache" +
         (tp > 1 ? ", tensor parallel over " + std::to_string(tp) + " GPUs" : std::string());
}

int64_t CudaExecutor::num_kv_blocks() const { return impl_->layout.num_blocks; }
int64_t CudaExecutor::block_size() const { return impl_->layout.block_size; }

// Rethrows the exception in flight, as FatalExecutorError when the CUDA context is poisoned: a
// sticky error (cudaErrorIllegalAddress, a launch failure, a kernel fault) makes every later
// call fail, so the engine must report itself unhealthy and the process be restarted. Other
// errors (cudaErrorMemoryAllocation, a bad token id) pass unchanged: they fail only the step.
// Tensor parallel: a fatal error aborts the communicators (no rank may wait for this one),
// and the device is polled rather than synchronised (a peer may have failed meanwhile).
void CudaExecutor::Impl::RethrowClassified() {
  try {
    throw;
  } catch (const FatalExecutorError&) {
    if (!peers.empty()) AbortComms();
    throw;
  } catch (...) {
  }
  cudaGetLastError();  // clears a non-sticky error; a sticky one stays, and shows again here:
  cudaError_t sticky = cudaSuccess;
  if (peers.empty()) {
    sticky = cudaDeviceSynchronize();
  } else {
    sticky = cudaEventRecord(ev_sync, stream);
    while (sticky == cudaSuccess && (sticky = cudaEventQuery(ev_sync)) == cudaErrorNotReady) {
      CheckPeers();  // a failed peer: FatalExecutorError (communicators aborted)
      std::this_thread::yield();
      sticky = cudaSuccess;
    }
  }
  if (sticky == cudaSuccess) throw;
  if (!peers.empty()) AbortComms();
  throw FatalExecutorError(ExceptionMessage(std::current_exception()) +
                           " (the CUDA context is unusable: " + cudaGetErrorString(sticky) + ")");
}

void CudaExecutor::CopyBlocks(std::span<const BlockCopy> copies) try {
  Impl& m = *impl_;
  m.CheckPeers();
  if (m.drive_peers && !copies.empty()) {
    auto list = std::make_shared<const std::vector<BlockCopy>>(copies.begin(), copies.end());
    m.PostToPeers([list](Impl& peer) { peer.CopyBlocks(*list); });
  }
  m.CopyBlocks(copies);
} catch (...) {
  impl_->RethrowClassified();
}

std::vector<float> CudaExecutor::Forward(const ForwardBatch& batch) try {
  Impl& m = *impl_;
  m.CheckNothingInFlight("Forward");
  const auto start = Clock::now();
  LLM_CUDA_CHECK(cudaEventRecord(m.out[0].start, m.stream));
  m.Run(batch);
  const size_t rows = batch.logits_indices.size();
  std::vector<float> out(rows * size_t(m.vocab));
  LLM_CUDA_CHECK(
      cudaMemcpyAsync(out.data(), m.logits, out.size() * 4, cudaMemcpyDeviceToHost, m.stream));
  m.StopAndWait(m.out[0]);
  m.FinishTiming(m.out[0], std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return out;
} catch (...) {
  impl_->RethrowClassified();
}

std::vector<SampleResult> CudaExecutor::ForwardAndSample(const ForwardBatch& batch,
                                                         std::span<const SampleTask> tasks) try {
  Impl& m = *impl_;
  m.CheckNothingInFlight("ForwardAndSample");
  const auto start = Clock::now();
  LLM_CUDA_CHECK(cudaEventRecord(m.out[0].start, m.stream));
  m.Run(batch);
  std::vector<SampleResult> results = m.Sample(tasks, m.out[0]);
  m.FinishTiming(m.out[0], std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return results;
} catch (...) {
  impl_->RethrowClassified();
}

StepHandle CudaExecutor::Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) try {
  return impl_->Launch(batch, tasks);
} catch (...) {
  impl_->RethrowClassified();
}

std::vector<SampleResult> CudaExecutor::Wait(StepHandle step) try {
  return impl_->Wait(step);
} catch (...) {
  impl_->RethrowClassified();
}

CudaExecutorStats CudaExecutor::stats() const { return impl_->stats; }

void CudaExecutor::ResetStats() {
  CudaExecutorStats& s = impl_->stats;
  s.steps = s.graph_steps = s.fp8_prefill_copies = 0;
  s.device_ms = s.wall_ms = 0;
}

}  // namespace llm
