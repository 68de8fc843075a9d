// The facade: CudaExecutor::Create (checks, the ranks' workers, start-up), the ModelExecutor calls
// on rank 0's worker, and the classification of errors (RethrowClassified).
#include "engine/cuda/cuda_executor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/cuda_worker.h"
#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "engine/model/architecture.h"
#include "engine/model/tensor_parallel.h"
#include "kernels/cuda/common/cuda_check.h"

namespace llm {

CudaExecutor::CudaExecutor(std::unique_ptr<CudaWorker> worker) : worker_(std::move(worker)) {}
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

std::unique_ptr<CudaExecutor> CudaExecutor::Create(
    const std::string& model_path, const CudaExecutorOptions& options,
    [[maybe_unused]] std::shared_ptr<PeerStepObserver> peer_step_observer) {
  std::string why;
  if (!cuda::DeviceAvailable(&why)) throw Error("--device cuda: " + why);
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF16) {
    throw Error("the CUDA backend runs bf16 or f16 (got " + std::string(DTypeName(options.dtype)) +
                ")");
  }
  if (options.gpu_memory_utilization <= 0 || options.gpu_memory_utilization > 1) {
    throw Error("--gpu-memory-utilization must be in (0, 1]");
  }
  if (options.moe_kernels < 1 || options.moe_kernels > 5) {
    throw Error("--moe-kernels must be v1, v2, v3, v4 or v5 (got " +
                std::to_string(options.moe_kernels) + ")");
  }
  if (options.gemv_ring_kib < 1 || options.gemv_ring_kib > cuda::kGemvMaxRingKib) {
    throw Error("--gemv-ring-kib must be in [1, " + std::to_string(cuda::kGemvMaxRingKib) +
                "] (got " + std::to_string(options.gemv_ring_kib) + ")");
  }
  const ModelConfig config = LoadConfig(model_path);
  if (config.head_dim > 128 && config.head_dim != 256) {
    throw Error("the CUDA backend supports head_dim up to 128, and 256 (the model has " +
                std::to_string(config.head_dim) + ")");
  }
  RequireBackendSupport(config, kCudaBackendSupport);
  const int world = options.tensor_parallel_size;
  MakeTensorParallelShard(config, 0, world);  // validates the split
  const ArchitectureFeatures& features = ArchitectureOf(config).features;
  if (world > 1 && (features.packed_projections || features.sandwich_norms)) {
    throw Error("--tensor-parallel-size " + std::to_string(world) + ": " + config.architecture +
                (features.sandwich_norms
                     ? "'s norms of the attention and MLP outputs need the all-reduced sums, "
                       "which the tensor-parallel layer does not do yet"
                     : "'s packed qkv_proj / gate_up_proj tensors are not split across GPUs yet"));
  }
  if (features.moe) {
    // kernels/cuda/moe/moe.h's limits (each expert's width per GPU: CudaWorker::Configure).
    if (config.num_experts > cuda::kMoeMaxExperts ||
        config.num_experts_per_tok > cuda::kMoeMaxTopK || config.hidden_size % 8 != 0) {
      throw Error(config.architecture + ": " + std::to_string(config.num_experts) + " experts, " +
                  std::to_string(config.num_experts_per_tok) + " per token, hidden size " +
                  std::to_string(config.hidden_size) +
                  ": the CUDA backend's mixture-of-experts kernels take up to " +
                  std::to_string(cuda::kMoeMaxExperts) + " experts, " +
                  std::to_string(cuda::kMoeMaxTopK) +
                  " per token, and hidden sizes that are multiples of 8");
    }
  }
  if (options.fp8_weights && (features.sandwich_norms || features.mlp != MlpKind::kSwiGlu)) {
    throw Error("--quantization fp8: " + config.architecture +
                "'s layer (GeGLU, sandwich norms) has no fp8 path on the CUDA backend yet");
  }
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
  auto impl = std::make_unique<CudaWorker>();
  CudaWorker& m = *impl;
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
    auto peer = std::make_unique<CudaWorker::Peer>();
    peer->impl = std::make_unique<CudaWorker>();
    peer->impl->Configure(config, options, r, world);
    peer->impl->comm = comms[size_t(r)];
    peer->impl->peer_step_observer = peer_step_observer;
    CudaWorker::Peer* raw = peer.get();
    peer->thread = std::thread([raw] { raw->Loop(); });
    m.peers.push_back(std::move(peer));
  }
  m.RunOnAllRanks([&](CudaWorker& rank) { rank.Setup(model_path); });
  if (options.custom_all_reduce) {  // before any graph is captured
    std::vector<CudaWorker*> ranks = {&m};
    for (const auto& p : m.peers) ranks.push_back(p->impl.get());
    m.SetupP2P(ranks);
  }
  int64_t blocks = m.kv_budget_blocks;
  for (const auto& p : m.peers) blocks = std::min(blocks, p->impl->kv_budget_blocks);
  m.RunOnAllRanks([blocks](CudaWorker& rank) { rank.Finish(blocks); });
  LLM_CUDA_CHECK(cudaSetDevice(0));
  m.drive_peers = true;
  m.Log("tensor parallel over " + std::to_string(world) + " GPUs (NCCL " +
        std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) +
        "): " + std::to_string(m.heads) + " query / " + std::to_string(m.kv_heads) +
        " KV heads and " + std::to_string(m.inter) + " MLP features per GPU, " +
        std::to_string(blocks) + " KV blocks each; all-reduce: " +
        (m.p2p_ok ? "one-shot over peer access up to " +
                        std::to_string(cuda::kP2PFasterThanNccl / m.hidden) + " tokens, NCCL above"
                  : std::string("NCCL")));
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
#else
  throw Error("--tensor-parallel-size needs a build with NCCL");
#endif
}

const ModelConfig& CudaExecutor::config() const { return worker_->config; }

std::string CudaExecutor::Describe() const {
  const int tp = worker_->shard.size;
  const std::string dt(DTypeName(worker_->dtype));
  return "cuda: " + worker_->device_name + ", " + worker_->WeightsName() + " weights, " +
         (worker_->kv_format.fp8 ? std::string("fp8 (e4m3)") : dt) + " KV cache" +
         (tp > 1 ? ", tensor parallel over " + std::to_string(tp) + " GPUs" : std::string());
}

int64_t CudaExecutor::num_kv_blocks() const { return worker_->layout.num_blocks; }
int64_t CudaExecutor::block_size() const { return worker_->layout.block_size; }

// Rethrows the exception in flight, as FatalExecutorError when the CUDA context is poisoned: a
// sticky error (cudaErrorIllegalAddress, a launch failure, a kernel fault) makes every later
// call fail, so the engine must report itself unhealthy and the process be restarted. Other
// errors (cudaErrorMemoryAllocation, a bad token id) pass unchanged: they fail only the step.
// Tensor parallel: a fatal error aborts the communicators (no rank may wait for this one),
// and the device is polled rather than synchronised (a peer may have failed meanwhile).
void CudaWorker::RethrowClassified() {
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
  CudaWorker& m = *worker_;
  m.CheckPeers();
  if (m.drive_peers && !copies.empty()) {
    auto list = std::make_shared<const std::vector<BlockCopy>>(copies.begin(), copies.end());
    m.PostToPeers([list](CudaWorker& peer) { peer.CopyBlocks(*list); });
  }
  m.CopyBlocks(copies);
} catch (...) {
  worker_->RethrowClassified();
}

std::vector<float> CudaExecutor::Forward(const ForwardBatch& batch) try {
  CudaWorker& m = *worker_;
  m.CheckNothingInFlight("Forward");
  const auto start = Clock::now();
  m.StartTiming(m.out[0], batch);
  m.Run(batch);
  const size_t rows = batch.logits_indices.size();
  std::vector<float> out(rows * size_t(m.vocab));
  LLM_CUDA_CHECK(
      cudaMemcpyAsync(out.data(), m.logits, out.size() * 4, cudaMemcpyDeviceToHost, m.stream));
  m.StopAndWait(m.out[0]);
  m.FinishTiming(m.out[0], std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return out;
} catch (...) {
  worker_->RethrowClassified();
}

std::vector<SampleResult> CudaExecutor::ForwardAndSample(const ForwardBatch& batch,
                                                         std::span<const SampleTask> tasks) try {
  CudaWorker& m = *worker_;
  m.CheckNothingInFlight("ForwardAndSample");
  const auto start = Clock::now();
  m.StartTiming(m.out[0], batch);
  m.Run(batch);
  std::vector<SampleResult> results = m.Sample(tasks, m.out[0]);
  m.FinishTiming(m.out[0], std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return results;
} catch (...) {
  worker_->RethrowClassified();
}

StepHandle CudaExecutor::Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) try {
  return worker_->Launch(batch, tasks);
} catch (...) {
  worker_->RethrowClassified();
}

std::vector<SampleResult> CudaExecutor::Wait(StepHandle step) try {
  return worker_->Wait(step);
} catch (...) {
  worker_->RethrowClassified();
}

bool CudaExecutor::applies_token_masks_in_flight() const { return worker_->opt.async_masks; }

CudaExecutorStats CudaExecutor::stats() const { return worker_->stats; }

std::vector<std::vector<int32_t>> CudaExecutor::LastMoeRouting() const {
  const CudaWorker& m = *worker_;
  std::vector<std::vector<int32_t>> out;
  if (!m.moe_routing_log) return out;
  LLM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  const int64_t count = m.last_step_tokens * m.top_k;
  for (int64_t i = 0; i < m.config.num_layers; ++i) {
    if (!m.layers[size_t(i)].moe) continue;
    std::vector<int32_t>& layer = out.emplace_back(size_t(count));
    LLM_CUDA_CHECK(cudaMemcpy(layer.data(), m.moe_routing_log + i * m.max_tokens * m.top_k,
                              size_t(count) * 4, cudaMemcpyDeviceToHost));
  }
  return out;
}

void CudaExecutor::ResetStats() {
  CudaExecutorStats& s = worker_->stats;
  s.steps = s.graph_steps = s.fp8_prefill_copies = s.decode_overlap_steps = 0;
  s.device_ms = s.wall_ms = 0;
  s.decode_steps = s.decode_seq_steps = s.decode_kv_tokens_read = 0;
  s.decode_device_ms = 0;
  s.mask_ms = 0;
  s.mask_rows = 0;
}

}  // namespace llm
