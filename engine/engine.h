// The engine: one thread owns the scheduler, the KV cache and the model. Every step it
// schedules, builds one batch (decodes and prefill chunks mixed), runs the model, samples,
// and streams each request's new tokens and text to its channel.
//
// Any thread may call AddRequest, Cancel and Stats; only the engine thread (the one running
// Step(), usually started by Start()) touches sequences, blocks and the model.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/executor.h"
#include "engine/llama_model.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/tokenizer.h"

namespace llm {

struct EngineConfig {
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;  // 0: from kv_cache_bytes
  int64_t kv_cache_bytes = 1 << 30;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
  int max_n = 16;  // largest n (completions per request) accepted
  bool enable_prefix_caching = true;
  // Every token's logits bit-identical whatever the batch, chunking or preemption (decode
  // tokens take the prefill kernel's path; no split-KV). The CPU backend's default: exactness
  // is the promise, and split-KV buys little on a few cores.
  bool batch_invariant = true;
};

// A consistent snapshot for metrics and tests.
struct EngineStats {
  // Requests (vLLM's vllm:num_requests_running / _waiting): running = at least one of its
  // sequences is in the running batch; waiting = queued or preempted, not finished.
  int64_t num_running = 0, num_waiting = 0;
  int64_t num_running_seqs = 0, num_waiting_seqs = 0;  // sequences (an n > 1 request counts n)
  int64_t num_kv_blocks = 0, num_free_kv_blocks = 0, num_cached_kv_blocks = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t num_preemptions = 0, num_steps = 0;
  int64_t num_prompt_tokens_computed = 0, num_generated_tokens = 0;
  int64_t num_finished_requests = 0;
};

class Engine {
 public:
  // The CPU backend over `model` (not owned), with a KV pool sized by `config`.
  Engine(const LlamaModel& model, const Tokenizer& tokenizer, const EngineConfig& config);
  // Any backend; the executor's KV pool decides num_kv_blocks (config.block_size must match).
  Engine(std::unique_ptr<ModelExecutor> executor, const Tokenizer& tokenizer,
         const EngineConfig& config);
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
  const EngineConfig& config() const { return config_; }
  const ModelExecutor& executor() const { return *executor_; }
  int64_t kv_capacity_tokens() const { return num_blocks_ * config_.block_size; }

 private:
  struct Inbox;
  void DrainInbox();
  void ReleaseId(const std::string& request_id);  // a finished request's id may be reused
  void ExpireDeadlines();
  ForwardBatch BuildBatch(const SchedulerOutput& sched) const;
  // Advances the chunks' sequences, forks n > 1 requests and lists what to sample.
  // task_seqs[i] is the sequence of task i.
  std::vector<SampleTask> PrepareSampling(const SchedulerOutput& sched,
                                          std::vector<Sequence*>* task_seqs);
  void Emit(std::span<Sequence* const> task_seqs, std::span<const SampleResult> results);
  void AppendToken(Sequence* seq, const SampleResult& sample, RequestOutput* out);
  void ForkChildren(RequestState* req, Sequence* parent);
  void FinishSequence(Sequence* seq, FinishReason reason, RequestOutput* out);
  void FinishRequest(RequestState* req, FinishReason reason, const std::string& error = "");
  void EmitLastIfDone(RequestState* req, RequestOutput* out);
  Sequence* NewSequence(RequestState* req, int index, std::vector<int> tokens);
  void PublishStats();

  std::unique_ptr<ModelExecutor> executor_;
  const Tokenizer& tokenizer_;
  EngineConfig config_;
  int64_t num_blocks_ = 0;
  BlockManager blocks_;
  Scheduler scheduler_;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  SeqId next_seq_id_ = 0;
  EngineStats counters_;  // engine thread's running totals

  std::unique_ptr<Inbox> inbox_;
  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace llm
