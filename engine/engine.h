// The engine: one thread owns the scheduler, the KV cache and the model. Every step it
// schedules, builds one batch (decodes and prefill chunks mixed), runs the model, samples,
// and streams each request's new tokens and text to its channel.
//
// Any thread may call AddRequest, Cancel, Stats and the health calls; only the engine thread
// (the one running Step(), usually started by Start()) touches sequences, blocks and the model.
//
// A step that throws (the executor: std::bad_alloc, a CUDA error, any exception) does not end
// the engine: none of the KV that step was computing enters the prefix cache, and every
// request outside it goes on. When the step failed at launch and held several requests, they
// are retried one request per step (isolate_failed_requests): the one that fails alone ends
// with finish reason "error", the others go on as if nothing had happened (an out-of-memory
// step, or one poisoned request, fails that request only). Otherwise (one request, n > 1, a
// failure only seen when waiting for an asynchronous step) the step's requests end with
// "error" and their blocks are freed. A FatalExecutorError, or max_consecutive_step_failures failed
// steps in a row, turns the engine unhealthy for good: every request then fails, AddRequest throws
// EngineUnavailableError, and the front ends report it (HTTP /health 503, gRPC NOT_SERVING)
// so that an orchestrator restarts the process. An exception from the engine's own code (not
// the executor's: a bug, host memory exhaustion) cannot be pinned on a step: the engine thread
// catches it, turns the engine unhealthy ("engine error: ...") and fails every request, rather
// than letting it end the process.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/kv_cache.h"
#include "engine/executor.h"
#include "engine/request.h"
#include "engine/sched/block_manager.h"
#include "engine/sched/scheduler.h"
#include "engine/sequence.h"
#include "engine/tokenizer/tokenizer.h"

namespace llm {

struct EngineConfig {
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;  // 0: from kv_cache_bytes
  int64_t kv_cache_bytes = 1 << 30;
  // The CPU backend's KV element type (--kv-cache-dtype): fp32, or fp8 e4m3 (4× the tokens in
  // the same bytes). Used where the engine builds its CpuExecutor itself.
  KvCacheDType kv_cache_dtype = KvCacheDType::kF32;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
  // Admission's KV headroom (engine/sched/scheduler.h): the share of the running sequences'
  // remaining tokens kept free, at start and at most (--kv-reserve-ratio; 0: admit whenever the
  // prompt fits, as vLLM does), and the least it goes to as finished sequences show they stop
  // early (--kv-reserve-min-ratio).
  double kv_reserve_ratio = 1.0;
  double kv_reserve_min_ratio = 0.1;
  int max_n = 16;  // largest n (completions per request) accepted
  bool enable_prefix_caching = true;
  // Every token's logits bit-identical whatever the batch, chunking or preemption (decode
  // tokens take the prefill kernel's path; no split-KV). The CPU backend's default: exactness
  // is the promise, and split-KV buys little on a few cores.
  bool batch_invariant = true;
  // This many failed steps in a row (no successful step between them) turn the engine
  // unhealthy: the device is failing every step. 0: never (only a FatalExecutorError does).
  int max_consecutive_step_failures = 5;
  // A step that fails at launch holding several requests: requeue them (recomputing what they
  // had, as after a preemption) and run each alone, one step, before it rejoins the batch, so
  // that only a request that fails by itself ends with "error". false: the step's requests all
  // end with "error" (the behaviour before).
  bool isolate_failed_requests = true;
  // vLLM's --async-scheduling: step N+1 is scheduled and launched while the executor runs
  // step N, and only then are N's tokens processed (see engine_step.cc). Outputs are the
  // same tokens as without it; off by default until measured on the GPU.
  bool async_scheduling = false;
};

// A consistent snapshot for metrics and tests.
struct EngineStats {
  // Requests (vLLM's vllm:num_requests_running / _waiting): running = at least one of its
  // sequences is in the running batch; waiting = queued or preempted, not finished.
  int64_t num_running = 0, num_waiting = 0;
  int64_t num_running_seqs = 0, num_waiting_seqs = 0;  // sequences (an n > 1 request counts n)
  int64_t num_kv_blocks = 0, num_free_kv_blocks = 0, num_cached_kv_blocks = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t window_released_kv_blocks = 0;  // given back by the sliding window (every layer slides)
  int64_t num_preemptions = 0, num_steps = 0;
  int64_t num_prompt_tokens_computed = 0, num_generated_tokens = 0;
  int64_t num_finished_requests = 0;
  int64_t num_failed_steps = 0;      // steps whose executor call threw
  int64_t num_failed_requests = 0;   // requests ended with "error" (failed step, unhealthy)
  int64_t num_isolated_retries = 0;  // requests of failed steps requeued to run alone
  bool is_healthy = true;
};

// Sees every step the engine thread runs, once it is scheduled: an injected interface (the
// engine's tests make it throw, as a bug in the engine's own code would:
// engine/testing/fault_injection.h). Called on the engine thread.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Once per Step(), after scheduling and before the step's executor calls; `sched` may be
  // empty. What it throws escapes Step(), as an exception from the engine's own code does.
  virtual void OnScheduled(const SchedulerOutput& sched) = 0;
};

class Engine {
 public:
  // The CPU backend over `model` (not owned), with a KV pool sized by `config`. `observer`
  // (not owned, may be null) outlives the engine.
  Engine(const CpuModel& model, const Tokenizer& tokenizer, const EngineConfig& config,
         StepObserver* observer = nullptr);
  // Any backend; the executor's KV pool decides num_kv_blocks (config.block_size must match).
  Engine(std::unique_ptr<ModelExecutor> executor, const Tokenizer& tokenizer,
         const EngineConfig& config, StepObserver* observer = nullptr);
  ~Engine();  // stops the thread; unfinished requests get finish reason "abort"

  // Validates and queues a request. Returns its channel; a request that is invalid or can
  // never fit (prompt + max_tokens beyond the model's context or the KV pool) throws
  // llm::Error with a message for the user, before anything is queued.
  std::shared_ptr<OutputChannel> AddRequest(Request request);
  // Aborts a request at the next step (finish reason "abort"); unknown ids are ignored.
  void Cancel(const std::string& request_id);

  void Start();  // runs Step() on an engine thread until Stop()
  void Stop();
  // One iteration (engine thread only). Returns false when there was nothing to do.
  bool Step();
  // Runs Step() until every request has finished (tests, offline use; no engine thread).
  void RunUntilIdle();

  EngineStats Stats() const;

  // False once the engine has turned unhealthy (see the top of this file); never true again.
  bool IsHealthy() const { return is_healthy_.load(); }
  std::string UnhealthyReason() const;  // "" while healthy
  // `listener` runs once, when the engine turns unhealthy (on the engine thread, holding a
  // lock: it must not call back into the engine's health functions), or at once on this
  // thread when it already is. After RemoveHealthListener(handle) returns it never runs.
  int AddHealthListener(std::function<void()> listener);
  void RemoveHealthListener(int handle);

  const EngineConfig& config() const { return config_; }
  const ModelExecutor& executor() const { return *executor_; }
  int64_t kv_capacity_tokens() const { return num_blocks_ * config_.block_size; }

 private:
  struct Inbox;
  void DrainInbox();
  void ReleaseId(const std::string& request_id);  // a finished request's id may be reused
  void ExpireDeadlines();
  ForwardBatch BuildBatch(const SchedulerOutput& sched) const;
  // What a step samples, made before its forward.
  struct SamplingPlan {
    std::vector<SampleTask> tasks;
    std::vector<Sequence*> task_seqs;  // task i samples the next token of task_seqs[i]
    std::vector<Sequence*> forked;     // n > 1 parents whose children were created this step
  };
  // Lists what to sample; creates the children of n > 1 requests whose prompt completes.
  SamplingPlan PrepareSampling(const SchedulerOutput& sched);
  // A launched step, until its results are processed (engine_step.cc).
  struct InFlightStep {
    int64_t id = 0;
    SchedulerOutput sched;
    SamplingPlan plan;
    StepHandle handle;
    bool has_results = false;  // synchronous: ForwardAndSample's results are in `results`
    std::vector<SampleResult> results;
    std::vector<int64_t> computed_after;  // per chunk: its sequence's computed tokens after it
    std::vector<int64_t> allocations;     // per chunk: its sequence's allocation at launch
    bool needs_sync = false;              // the next step must not be scheduled before these tokens
  };
  // Runs the executor on `sched` (Launch, or ForwardAndSample when synchronous). False when
  // it threw: the steps in flight are finished first, then this step fails (FailStep).
  bool LaunchStep(SchedulerOutput sched);
  // Throws std::logic_error when `results` break the executor's contract for `plan`.
  void CheckResults(const SamplingPlan& plan, std::span<const SampleResult> results) const;
  // Sequences advance as if the step had run: computed tokens, a placeholder per sample.
  void MarkLaunched(InFlightStep* step);
  // Waits for the oldest launched step and processes its tokens (or its failure).
  void FinishOldestStep();
  // After a successful forward: the chunks' KV exists now, so their full blocks enter the
  // prefix cache; new children share their parent's blocks.
  void CommitComputed(const InFlightStep& step);
  void Emit(std::span<Sequence* const> task_seqs, std::span<const SampleResult> results);
  // A finished request's objects live on until no launched step can refer to them.
  void Bury(RequestState* req);
  void CollectGraves();
  void AppendToken(Sequence* seq, const SampleResult& sample, RequestOutput* out);
  void CreateChildren(RequestState* req, Sequence* parent);
  void StartChildren(Sequence* parent);
  // A step's executor call threw `error`: its requests fail, or (at_launch: nothing of the
  // step ran, nothing is in flight; several requests) are requeued to run alone; maybe the
  // engine turns unhealthy.
  void FailStep(const SchedulerOutput& sched, std::exception_ptr error, bool at_launch);
  void MarkUnhealthy(const std::string& reason);
  // The engine thread caught `what` escaping Step(): unhealthy, every request fails.
  void OnEngineError(const std::string& what);
  void FailAllRequests();  // an unhealthy engine ends everything it holds with "error"
  void FinishSequence(Sequence* seq, FinishReason reason, RequestOutput* out);
  void FinishRequest(RequestState* req, FinishReason reason, const std::string& error = "");
  void EmitLastIfDone(RequestState* req, RequestOutput* out);
  Sequence* NewSequence(RequestState* req, int index, std::vector<int> tokens);
  void PublishStats();

  std::unique_ptr<ModelExecutor> executor_;
  const Tokenizer& tokenizer_;
  EngineConfig config_;
  StepObserver* observer_ = nullptr;
  int64_t num_blocks_ = 0;
  BlockManager blocks_;
  Scheduler scheduler_;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  SeqId next_seq_id_ = 0;
  EngineStats counters_;  // engine thread's running totals
  int num_consecutive_step_failures_ = 0;
  std::deque<InFlightStep> in_flight_;  // launched, results not processed (at most 2)
  int64_t next_step_id_ = 0;
  struct Grave {
    int64_t last_step = 0;  // the newest step launched when the request ended
    std::unique_ptr<RequestState> request;
    std::vector<std::unique_ptr<Sequence>> seqs;
  };
  std::deque<Grave> graves_;

  std::unique_ptr<Inbox> inbox_;
  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  std::atomic<bool> is_healthy_{true};
  mutable std::mutex health_mu_;  // guards unhealthy_reason_ and the listeners
  std::string unhealthy_reason_;
  std::unordered_map<int, std::function<void()>> health_listeners_;
  int next_listener_ = 0;
};

}  // namespace llm
