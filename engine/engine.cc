#include "engine/engine.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

#include "engine/cpu/cpu_executor.h"
#include "engine/error.h"

namespace llm {

// Requests and cancellations from other threads, taken by the engine thread each step.
struct Engine::Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<Request, std::shared_ptr<OutputChannel>>> requests;
  std::vector<std::string> cancels;
  std::unordered_set<std::string> live_ids;  // queued or running request ids
  uint64_t next_id = 0;
};

namespace {

int64_t NumBlocks(const ModelConfig& model, const EngineConfig& c) {
  if (c.num_kv_blocks > 0) return c.num_kv_blocks;
  return KvCachePool::NumBlocksForBytes(model, c.block_size, c.kv_cache_bytes, c.kv_cache_dtype);
}

}  // namespace

Engine::Engine(const CpuModel& model, const Tokenizer& tokenizer, const EngineConfig& config,
               StepObserver* observer)
    : Engine(std::make_unique<CpuExecutor>(model, NumBlocks(model.config(), config),
                                           config.block_size, config.kv_cache_dtype),
             tokenizer, config, observer) {}

Engine::Engine(std::unique_ptr<ModelExecutor> executor, const Tokenizer& tokenizer,
               const EngineConfig& config, StepObserver* observer)
    : executor_(std::move(executor)),
      tokenizer_(tokenizer),
      config_(config),
      observer_(observer),
      num_blocks_(executor_->num_kv_blocks()),
      blocks_(num_blocks_, config.block_size,
              BlockManagerOptions{.enable_prefix_caching = config.enable_prefix_caching,
                                  .sliding_window = executor_->config().UniformSlidingWindow(),
                                  .max_step_tokens = config.max_num_batched_tokens}),
      scheduler_(
          {.max_num_batched_tokens = config.max_num_batched_tokens,
           .max_num_seqs = config.max_num_seqs,
           .kv_reserve_ratio = config.kv_reserve_ratio,
           .kv_reserve_min_ratio = std::min(config.kv_reserve_min_ratio, config.kv_reserve_ratio)},
          &blocks_),
      inbox_(std::make_unique<Inbox>()) {
  if (executor_->block_size() != config_.block_size) {
    throw Error("the executor's KV block size " + std::to_string(executor_->block_size()) +
                " differs from the engine's " + std::to_string(config_.block_size));
  }
  PublishStats();
}

Engine::~Engine() { Stop(); }

std::shared_ptr<OutputChannel> Engine::AddRequest(Request request) {
  if (!is_healthy_) {
    throw EngineUnavailableError("the engine is unhealthy (" + UnhealthyReason() +
                                 ") and accepts no requests until the server restarts");
  }
  const ModelConfig& mc = executor_->config();
  const SamplingParams& sp = request.sampling;
  if (const std::string problem = sp.Validate(mc.vocab_size); !problem.empty())
    throw Error(problem);
  if (sp.grammar && !executor_->applies_token_masks()) {
    throw Error("structured outputs are not supported on this backend (" + executor_->Describe() +
                ") yet");
  }
  if (sp.n > config_.max_n) {
    throw Error("n must be between 1 and " + std::to_string(config_.max_n));
  }
  const int64_t num_prompt = std::ssize(request.prompt_ids);
  if (num_prompt == 0) throw Error("the prompt is empty");
  for (int id : request.prompt_ids) {
    if (id < 0 || id >= mc.vocab_size) {
      throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(mc.vocab_size) + ")");
    }
  }
  const int64_t total = num_prompt + sp.max_tokens;
  if (total > mc.max_position_embeddings) {
    throw Error("the prompt (" + std::to_string(num_prompt) + " tokens) plus max_tokens (" +
                std::to_string(sp.max_tokens) + ") exceeds the model's context of " +
                std::to_string(mc.max_position_embeddings) + " tokens");
  }
  // Worst case: the prompt's blocks plus each completion's own blocks and one copied block
  // (a sliding-window pool: each sequence's window of blocks).
  const int64_t bs = config_.block_size;
  const int64_t worst = blocks_.MaxBlocksPerSequence(total) +
                        (sp.n - 1) * (blocks_.MaxBlocksPerSequence(sp.max_tokens) + 1);
  if (worst > num_blocks_) {
    throw Error("the request needs up to " + std::to_string(worst * bs) +
                " tokens of KV cache; the server has " + std::to_string(num_blocks_ * bs));
  }
  auto channel = std::make_shared<OutputChannel>();
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    if (request.request_id.empty()) request.request_id = "req-" + std::to_string(inbox_->next_id++);
    if (!inbox_->live_ids.insert(request.request_id).second) {
      throw Error("request id '" + request.request_id + "' is already in use");
    }
    inbox_->requests.emplace_back(std::move(request), channel);
  }
  inbox_->cv.notify_all();
  return channel;
}

void Engine::ReleaseId(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(inbox_->mu);
  inbox_->live_ids.erase(request_id);
}

void Engine::Cancel(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    inbox_->cancels.push_back(request_id);
  }
  inbox_->cv.notify_all();
}

Sequence* Engine::NewSequence(RequestState* req, int index, std::vector<int> tokens) {
  auto seq = std::make_unique<Sequence>();
  seq->id = next_seq_id_++;
  seq->request = req;
  seq->index = index;
  seq->num_prompt_tokens = std::ssize(req->request.prompt_ids);
  seq->token_ids = std::move(tokens);
  const SamplingParams& sp = req->request.sampling;
  seq->sampler = std::make_unique<Sampler>(sp, req->request.prompt_ids, index);
  seq->decoder = std::make_unique<IncrementalDecoder>(tokenizer_, req->request.prompt_ids,
                                                      req->request.skip_special_tokens);
  seq->stop = std::make_unique<StopStringMatcher>(sp.stop);
  Sequence* raw = seq.get();
  req->seqs.push_back(raw);
  seqs_[raw->id] = std::move(seq);
  return raw;
}

void Engine::DrainInbox() {
  std::vector<std::pair<Request, std::shared_ptr<OutputChannel>>> added;
  std::vector<std::string> cancels;
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    added.swap(inbox_->requests);
    cancels.swap(inbox_->cancels);
  }
  for (auto& [request, channel] : added) {
    auto state = std::make_unique<RequestState>();
    state->request = std::move(request);
    state->channel = std::move(channel);
    state->arrival = Clock::now();
    RequestState* req = state.get();
    requests_[req->request.request_id] = std::move(state);
    scheduler_.AddWaiting(NewSequence(req, 0, req->request.prompt_ids));
  }
  for (const std::string& id : cancels) {
    auto it = requests_.find(id);
    if (it != requests_.end()) FinishRequest(it->second.get(), FinishReason::kAbort);
  }
}

void Engine::ExpireDeadlines() {
  const auto now = Clock::now();
  std::vector<RequestState*> expired;
  for (auto& [id, req] : requests_) {
    if (req->request.deadline && *req->request.deadline <= now) expired.push_back(req.get());
  }
  for (RequestState* req : expired) FinishRequest(req, FinishReason::kTimeout);
}

bool Engine::Step() {
  DrainInbox();
  if (!is_healthy_) FailAllRequests();
  ExpireDeadlines();
  // Penalties and n > 1 forks need the launched step's tokens before the next is scheduled.
  if (!in_flight_.empty() && in_flight_.back().needs_sync) FinishOldestStep();
  bool worked = !in_flight_.empty();
  SchedulerOutput sched = scheduler_.Schedule();
  if (observer_) observer_->OnScheduled(sched);
  bool launched = false;
  if (!sched.empty()) {
    worked = true;
    launched = LaunchStep(std::move(sched));
  }
  // Synchronous: the step just launched is processed before the next is scheduled. Async:
  // it runs while this thread processes the one before it and schedules the next.
  const size_t num_kept = config_.async_scheduling && launched ? 1 : 0;
  while (in_flight_.size() > num_kept) FinishOldestStep();
  CollectGraves();
  PublishStats();
  return worked;
}

ForwardBatch Engine::BuildBatch(const SchedulerOutput& sched) const {
  ForwardBatch batch;
  batch.is_batch_invariant = config_.batch_invariant;
  for (const ScheduledChunk& c : sched.chunks) {
    const Sequence& seq = *c.seq;
    const int64_t start = seq.num_computed_tokens;
    std::vector<int64_t> slots(static_cast<size_t>(c.num_tokens));
    for (int64_t i = 0; i < c.num_tokens; ++i) {
      slots[static_cast<size_t>(i)] = blocks_.Slot(seq.id, start + i);
    }
    const std::span<const int> tokens(seq.token_ids.data() + start,
                                      static_cast<size_t>(c.num_tokens));
    batch.AddSequence(tokens, start, blocks_.BlockTable(seq.id), slots, c.samples, c.is_decode);
    if (std::find(tokens.begin(), tokens.end(), kPendingToken) == tokens.end()) continue;
    // Async: the token the step in flight samples for this sequence, fed on the device.
    if (!c.is_decode || seq.num_pending != 1 || seq.pending_step != next_step_id_ - 1) {
      throw std::logic_error("Engine: sequence " + std::to_string(seq.id) +
                             " is scheduled with a pending token that is not its last one");
    }
    batch.FeedLastTokenFromPreviousStep(seq.pending_task);
  }
  return batch;
}

void Engine::RunUntilIdle() {
  while (true) {
    const bool worked = Step();
    std::lock_guard<std::mutex> lock(inbox_->mu);
    if (!worked && requests_.empty() && inbox_->requests.empty()) return;
  }
}

void Engine::Start() {
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_) {
      bool worked = false;
      try {
        worked = Step();
      } catch (const std::exception& e) {
        OnEngineError(e.what());
      } catch (...) {
        OnEngineError("unknown exception");
      }
      if (worked) continue;
      std::unique_lock<std::mutex> lock(inbox_->mu);
      // Idle: wake for new work, or every 50 ms to expire deadlines.
      inbox_->cv.wait_for(lock, std::chrono::milliseconds(50), [&] {
        return stop_ || !inbox_->requests.empty() || !inbox_->cancels.empty();
      });
    }
  });
}

void Engine::Stop() {
  stop_ = true;
  inbox_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
  while (!in_flight_.empty()) FinishOldestStep();  // async: the last step's tokens
  DrainInbox();
  std::vector<RequestState*> left;
  for (auto& [id, req] : requests_) left.push_back(req.get());
  for (RequestState* req : left) FinishRequest(req, FinishReason::kAbort);
  CollectGraves();
  PublishStats();
}

EngineStats Engine::Stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s = stats_;
  }
  // The snapshot is published at the end of a step; health is live: a step that turns the
  // engine unhealthy fails its requests before it publishes, and a client that saw its 503
  // must not then read llm:engine_healthy 1 (http_server_test's fatal-failure test did).
  s.is_healthy = IsHealthy();
  return s;
}

void Engine::PublishStats() {
  EngineStats s = counters_;
  const BlockManagerCounters b = blocks_.counters();
  s.num_running_seqs = scheduler_.num_running();
  s.num_waiting_seqs = scheduler_.num_waiting();
  s.num_running = s.num_waiting = 0;
  for (const auto& [id, req] : requests_) {
    bool running = false, open = false;
    for (const Sequence* seq : req->seqs) {
      running = running || seq->status == SeqStatus::kRunning;
      open = open || seq->status != SeqStatus::kFinished;
    }
    if (running) {
      ++s.num_running;
    } else if (open) {
      ++s.num_waiting;
    }
  }
  s.num_kv_blocks = b.num_blocks;
  s.num_free_kv_blocks = b.num_free_blocks;
  s.num_cached_kv_blocks = b.num_cached_blocks;
  s.prefix_query_tokens = b.prefix_query_tokens;
  s.prefix_hit_tokens = b.prefix_hit_tokens;
  s.window_released_kv_blocks = b.window_released_blocks;
  s.num_preemptions = scheduler_.num_preemptions();
  s.is_healthy = is_healthy_;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = s;
}

}  // namespace llm
