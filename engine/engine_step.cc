// The engine's step pipeline: launching a scheduled step on the executor, and processing its
// results once they are back (committing its KV, emitting its tokens).
//
// Synchronous (the default): schedule N, run N (ForwardAndSample), process N, schedule N+1.
//
// Asynchronous (EngineConfig::async_scheduling, vLLM's --async-scheduling): one step stays
// in flight while the host works. Each Step() does
//     schedule N+1 ─ launch N+1 ─ wait for N ─ process N (emit, stop checks, finish, free)
// so the device runs N+1 while this thread processes N and then schedules N+2. To schedule
// N+1 before N's tokens are known, launching N advances its sequences as if it had run
// (MarkLaunched): their computed-token counts move on, and every sampled token gets a
// placeholder (kPendingToken) in Sequence::token_ids. A decode of a placeholder is fed on the
// device from the previous step's sampled ids (ForwardBatch::prev_sample_rows). Processing N
// turns the placeholders into tokens, and only then commits N's KV to the prefix cache (a
// failed step leaves nothing hashed). A sequence that finishes at N was still in N+1: that
// extra token is never emitted, and the blocks it wrote are freed (vLLM does the same).
//
// What still serializes (the step after such a step waits for its tokens: needs_sync):
//   - samplers with repetition / presence / frequency penalties (the device sampler needs
//     every previous token to build the penalty entries);
//   - samplers with a grammar, on an executor without applies_token_masks_in_flight (the
//     CUDA and the default executors have it: the CUDA launch of N+1 enqueues its forward,
//     then reads N's tokens into the matchers and computes N+1's masks while the device runs
//     that forward; engine/cuda/step_runner.cc);
//   - the step that completes the prompt of an n > 1 request (its children are forked from
//     the parent's blocks when that step's results are processed).
// Everything else (greedy, seeded and unseeded sampling, top-k/p, min-p, logit_bias,
// logprobs, stop tokens and strings, max_tokens, chunked prefill, preemption, prefix caching,
// aborts, deadlines, failed steps) keeps one step in flight, and gives the same tokens as
// synchronous scheduling (seeded streams draw one number per step, in order, either way).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/engine.h"

namespace llm {

// The executor's side of the contract, before any of its results is used: one sample per task,
// token ids inside the vocabulary. A violation fails the step like any executor error.
void Engine::CheckResults(const SamplingPlan& plan, std::span<const SampleResult> results) const {
  if (results.size() != plan.tasks.size()) {
    throw std::logic_error("the executor returned " + std::to_string(results.size()) +
                           " samples for " + std::to_string(plan.tasks.size()) + " tasks");
  }
  const int64_t vocab = executor_->config().vocab_size;
  for (const SampleResult& r : results) {
    if (r.token < 0 || r.token >= vocab) {
      throw std::logic_error("the executor sampled token id " + std::to_string(r.token) +
                             " outside the vocabulary (" + std::to_string(vocab) + ")");
    }
  }
}

bool Engine::LaunchStep(SchedulerOutput sched) {
  const ForwardBatch batch = BuildBatch(sched);
  InFlightStep step;
  step.plan = PrepareSampling(sched);
  try {
    executor_->CopyBlocks(sched.copies);
    if (config_.async_scheduling) {
      step.handle = executor_->Launch(batch, step.plan.tasks);
    } else {
      step.results = executor_->ForwardAndSample(batch, step.plan.tasks);
      step.has_results = true;
    }
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    // The step before it first (its tokens come before this failure, as when synchronous).
    // (The executor gave back any draws the failed call took: executor.h.)
    while (!in_flight_.empty()) FinishOldestStep();
    FailStep(sched, error, /*at_launch=*/true);
    return false;
  }
  step.id = next_step_id_++;
  step.sched = std::move(sched);
  MarkLaunched(&step);
  in_flight_.push_back(std::move(step));
  return true;
}

void Engine::MarkLaunched(InFlightStep* step) {
  for (const ScheduledChunk& c : step->sched.chunks) {
    c.seq->num_computed_tokens += c.num_tokens;
    step->computed_after.push_back(c.seq->num_computed_tokens);
    step->allocations.push_back(c.seq->allocation);
  }
  const std::vector<Sequence*>& seqs = step->plan.task_seqs;
  step->needs_sync = !step->plan.forked.empty();
  const bool masks_in_flight = executor_->applies_token_masks_in_flight();
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence* s = seqs[i];
    s->token_ids.push_back(kPendingToken);
    ++s->num_pending;
    s->pending_step = step->id;
    s->pending_task = static_cast<int32_t>(i);
    // A grammar's next mask needs this token too, but the executor reads it in time itself
    // (applies_token_masks_in_flight; CUDA: after the next step's forward is enqueued).
    step->needs_sync = step->needs_sync || s->sampler->has_penalties() ||
                       (s->sampler->has_grammar() && !masks_in_flight);
  }
}

void Engine::FinishOldestStep() {
  InFlightStep step = std::move(in_flight_.front());
  in_flight_.pop_front();
  std::vector<SampleResult> results;
  try {
    results = step.has_results ? std::move(step.results) : executor_->Wait(step.handle);
    CheckResults(step.plan, results);
  } catch (...) {
    FailStep(step.sched, std::current_exception(), /*at_launch=*/false);
    return;
  }
  // A lone step of an isolated request proves little about the device: it does not reset the
  // count of failed steps in a row. Isolation ends once the request has sampled (its whole
  // prompt, or its last token and its sampling, ran alone: what may have failed before).
  bool is_isolation_step = false;
  for (const ScheduledChunk& c : step.sched.chunks) {
    is_isolation_step = is_isolation_step || c.seq->request->isolated;
    if (c.samples) c.seq->request->isolated = false;
  }
  if (!is_isolation_step) num_consecutive_step_failures_ = 0;
  CommitComputed(step);
  Emit(step.plan.task_seqs, results);
  ++counters_.num_steps;
}

// Only here, after the step's results are back, does its KV count as computed: MarkComputed
// offers full blocks to the prefix cache, and a step that throws must leave none of its
// blocks there (a later request with the same prefix would read what the failed step left).
// A sequence that finished or was preempted since the launch has no use for that KV.
void Engine::CommitComputed(const InFlightStep& step) {
  for (size_t i = 0; i < step.sched.chunks.size(); ++i) {
    const ScheduledChunk& c = step.sched.chunks[i];
    if (!c.is_decode) counters_.num_prompt_tokens_computed += c.num_tokens;
    const Sequence* seq = c.seq;
    if (seq->status == SeqStatus::kFinished || seq->allocation != step.allocations[i]) continue;
    blocks_.MarkComputed(seq->id, step.computed_after[i]);
  }
  for (Sequence* parent : step.plan.forked) {
    if (parent->status != SeqStatus::kFinished) StartChildren(parent);
  }
}

void Engine::Bury(RequestState* req) {
  Grave grave;
  grave.last_step = next_step_id_ - 1;
  for (const Sequence* s : req->seqs) {
    auto it = seqs_.find(s->id);
    grave.seqs.push_back(std::move(it->second));
    seqs_.erase(it);
  }
  auto it = requests_.find(req->request.request_id);
  grave.request = std::move(it->second);
  requests_.erase(it);
  graves_.push_back(std::move(grave));
}

void Engine::CollectGraves() {
  while (!graves_.empty() &&
         (in_flight_.empty() || graves_.front().last_step < in_flight_.front().id)) {
    graves_.pop_front();
  }
}

}  // namespace llm
