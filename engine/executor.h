// Where the model runs. The engine schedules and streams; an executor owns the KV cache's
// storage and the weights' device, runs one step of the model over a ForwardBatch and
// samples the next tokens. Two implementations:
//   CpuExecutor   (engine/cpu/cpu_executor.h)   CpuModel + KvCachePool, sampling on the host
//   CudaExecutor  (engine/cuda/cuda_executor.h) bf16 weights and KV on the GPU, cuBLASLt,
//                                              fused kernels, CUDA graphs, sampling on device
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/forward_batch.h"
#include "engine/model/model_config.h"
#include "engine/sample/sampler.h"
#include "engine/sched/block_manager.h"

namespace llm {

// One token to sample: which logits row (an index into batch.logits_indices) and the
// sampler of the sequence that gets the token (an n > 1 request samples one row n times).
struct SampleTask {
  int64_t logits_row = 0;
  Sampler* sampler = nullptr;
};

// Thrown by an executor when a failed step left the device unusable: a sticky CUDA error (an
// illegal address, a kernel fault, a launch failure), after which every later call fails too.
// The engine then fails every request and reports itself unhealthy at once, so that the
// process is restarted. Any other exception from a step (std::bad_alloc, a
// cudaErrorMemoryAllocation, an llm::Error) fails only the requests in that step.
class FatalExecutorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A launched step (ModelExecutor::Launch); Wait for it to get its results.
struct StepHandle {
  int64_t id = -1;
};

// A step (CopyBlocks, Forward, ForwardAndSample, Launch, Wait) may throw: the engine survives it.
// What the step was writing into the KV cache is then treated as garbage (its blocks are never
// offered to the prefix cache), and its requests end with finish reason "error".
class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;

  virtual const ModelConfig& config() const = 0;
  // For logs: "cpu, bf16 weights" / "cuda: NVIDIA H200, sm_90, 139 GiB, bf16".
  virtual std::string Describe() const = 0;
  virtual int64_t num_kv_blocks() const = 0;
  virtual int64_t block_size() const = 0;

  // Performs the block manager's copy-on-write copies, in every layer.
  virtual void CopyBlocks(std::span<const BlockCopy> copies) = 0;

  // Runs one step (appending the batch's keys and values to the cache) and returns the
  // logits of batch.logits_indices, [logits_indices.size(), vocab]. Throws llm::Error for a
  // token id outside the vocabulary.
  virtual std::vector<float> Forward(const ForwardBatch& batch) = 0;

  // Runs one step and samples one token per task, advancing each task's sampler exactly as
  // Sampler::Sample does (the default: Forward, then Sample on the host).
  virtual std::vector<SampleResult> ForwardAndSample(const ForwardBatch& batch,
                                                     std::span<const SampleTask> tasks);
  // Whether sampling honours Sampler::AllowedTokens (structured outputs). The host sampler
  // does; an executor that samples elsewhere says so itself. The engine refuses a request
  // with a grammar when false.
  virtual bool applies_token_masks() const { return true; }
  // Whether a step with a grammar task may be launched while the step before it is in flight
  // (async scheduling): its masks need that step's tokens, so the executor must record them
  // in the samplers before it reads Sampler::AllowedTokens. The default Launch samples
  // inside Launch (every earlier step's tokens are recorded by then); an executor that
  // records tokens at Wait says itself whether it does. False: the engine waits for the
  // previous step first, as for penalties.
  virtual bool applies_token_masks_in_flight() const { return true; }

  // ---- Asynchronous steps (the engine's async scheduling) ----------------------------------
  // Launch starts the same step as ForwardAndSample and returns without waiting where the
  // backend can (CUDA: the device runs it while the host schedules the next step); Wait
  // returns its results. Steps are waited for in launch order; at most two are in flight.
  // A token with batch.prev_sample_rows[t] = r >= 0 is the token sampled by task r of the
  // previously launched step (filled on the device, or from the host's copy of the results).
  // Samplers: each task's draw is taken at Launch (seeded streams stay exact); the sampled
  // token is recorded for the penalties at Launch (CPU) or at Wait (CUDA; or at the next
  // Launch when that one has a grammar task), so a step whose
  // samplers apply repetition / presence / frequency penalties must be launched only after
  // the previous step of the same sequences was waited for (the engine does so).
  // A Launch or ForwardAndSample that throws leaves every task's sampler as it was: draws it
  // took are given back (Sampler::UndoDraws), so a request retried after the failure (the
  // engine's isolation) draws exactly the numbers it would have drawn.
  // The default runs ForwardAndSample inside Launch (synchronous) and keeps its results.
  virtual StepHandle Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks);
  virtual std::vector<SampleResult> Wait(StepHandle step);

 protected:
  // `batch` with every fed token (prev_sample_rows) replaced by the token it names in
  // `previous` (the previous step's sampled ids). Throws std::logic_error for a bad row.
  static ForwardBatch ResolveFedTokens(const ForwardBatch& batch, std::span<const int> previous);

 private:
  int64_t next_step_id_ = 0;
  std::deque<std::pair<int64_t, std::vector<SampleResult>>> done_;  // the default's results
  std::vector<int> last_tokens_;  // the last launched step's sampled ids (the default's)
};

// Passes every call to another executor: the base of wrappers that change one behaviour
// (FaultInjectingExecutor, the tests' executors), each overriding only what it changes.
class ForwardingExecutor : public ModelExecutor {
 public:
  explicit ForwardingExecutor(std::unique_ptr<ModelExecutor> inner) : inner_(std::move(inner)) {}

  const ModelConfig& config() const override { return inner_->config(); }
  std::string Describe() const override { return inner_->Describe(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int64_t block_size() const override { return inner_->block_size(); }
  void CopyBlocks(std::span<const BlockCopy> copies) override { inner_->CopyBlocks(copies); }
  std::vector<float> Forward(const ForwardBatch& batch) override { return inner_->Forward(batch); }
  std::vector<SampleResult> ForwardAndSample(const ForwardBatch& batch,
                                             std::span<const SampleTask> tasks) override {
    return inner_->ForwardAndSample(batch, tasks);
  }
  StepHandle Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) override {
    return inner_->Launch(batch, tasks);
  }
  std::vector<SampleResult> Wait(StepHandle step) override { return inner_->Wait(step); }
  bool applies_token_masks() const override { return inner_->applies_token_masks(); }
  bool applies_token_masks_in_flight() const override {
    return inner_->applies_token_masks_in_flight();
  }

 protected:
  ModelExecutor& inner() { return *inner_; }
  const ModelExecutor& inner() const { return *inner_; }

 private:
  std::unique_ptr<ModelExecutor> inner_;
};

}  // namespace llm
