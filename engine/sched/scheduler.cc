#include "engine/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace llm {
namespace {

bool Contains(const SchedulerOutput& out, const Sequence* seq) {
  return std::any_of(out.chunks.begin(), out.chunks.end(),
                     [&](const ScheduledChunk& c) { return c.seq == seq; });
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager* blocks)
    : config_(config), blocks_(blocks) {
  if (config.max_num_batched_tokens < 1 || config.max_num_seqs < 1) {
    throw std::invalid_argument("scheduler budgets must be positive");
  }
  if (!(config.kv_reserve_ratio >= 0 && config.kv_reserve_ratio <= 1) ||
      !(config.kv_reserve_min_ratio >= 0 &&
        config.kv_reserve_min_ratio <= config.kv_reserve_ratio) ||
      config.kv_reserve_clip_tokens < 1) {
    throw std::invalid_argument(
        "the KV reserve needs 0 <= min ratio <= ratio <= 1 and clip tokens >= 1");
  }
  expected_share_ = config.kv_reserve_ratio;
}

double Scheduler::kv_reserve_ratio() const {
  if (config_.kv_reserve_ratio <= 0) return 0;
  return std::clamp(expected_share_, config_.kv_reserve_min_ratio, config_.kv_reserve_ratio);
}

int64_t Scheduler::ReserveBlocks(const Sequence* seq, double ratio) const {
  int64_t left = seq->request->request.sampling.max_tokens - seq->num_output_tokens();
  left = std::min(left, config_.kv_reserve_clip_tokens);
  // A sliding-window pool holds a sequence's window, however long it grows.
  if (blocks_->sliding_window() > 0) left = std::min(left, blocks_->sliding_window());
  if (left <= 0) return 0;
  // Whole blocks: ceil of where it ends minus ceil of where it is (its last block may be
  // partly free), so that a ratio of 1 covers every block the sequence can still take.
  const int64_t bs = blocks_->block_size(), now = seq->num_tokens();
  const auto end = now + static_cast<int64_t>(std::ceil(ratio * double(left)));
  return (end + bs - 1) / bs - (now + bs - 1) / bs;
}

bool Scheduler::KeepsHeadroom(const Sequence* seq, double ratio, int64_t running_blocks) const {
  if (ratio <= 0 || running_.empty()) return true;
  const int64_t bs = blocks_->block_size();
  // Its own blocks (prefix-cache hits ignored: they only leave more room).
  const int64_t prompt_blocks = (seq->num_tokens() + bs - 1) / bs;
  return blocks_->num_free_blocks() - prompt_blocks >= running_blocks + ReserveBlocks(seq, ratio);
}

void Scheduler::AddWaiting(Sequence* seq) {
  seq->status = SeqStatus::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::AddRunning(Sequence* seq) {
  seq->status = SeqStatus::kRunning;
  seq->admit_order = next_admit_order_++;
  running_.push_back(seq);
}

void Scheduler::Remove(Sequence* seq) {
  if (seq->finish_reason == FinishReason::kStop || seq->finish_reason == FinishReason::kLength) {
    // The share of its (clipped) budget it used, into a moving average over ~32 sequences.
    constexpr double kWeight = 1.0 / 32;
    const int64_t budget = std::min<int64_t>(seq->request->request.sampling.max_tokens,
                                             config_.kv_reserve_clip_tokens);
    const double used = std::min(1.0, double(seq->num_output_tokens()) / double(budget));
    expected_share_ += kWeight * (used - expected_share_);
  }
  std::erase(running_, seq);
  std::erase(waiting_, seq);
  if (blocks_->Has(seq->id)) blocks_->Free(seq->id);
}

void Scheduler::Requeue(Sequence* seq) {
  std::erase(running_, seq);
  std::erase(waiting_, seq);
  if (blocks_->Has(seq->id)) blocks_->Free(seq->id);
  seq->num_computed_tokens = 0;
  ++seq->allocation;
  seq->status = SeqStatus::kWaiting;
  waiting_.push_front(seq);
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  focus_ = nullptr;
  for (const Sequence* s : running_) {
    if (s->request->isolated) {
      focus_ = s->request;
      break;
    }
  }
  for (auto it = waiting_.begin(); focus_ == nullptr && it != waiting_.end(); ++it) {
    if ((*it)->request->isolated) focus_ = (*it)->request;
  }
  ScheduleDecodes(&out, &budget);
  SchedulePrefills(&out, &budget);
  if (focus_ != nullptr) {
    AdmitIsolated(&out, &budget);
  } else {
    Admit(&out, &budget);
  }
  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return out;
}

// The most recently admitted running sequence not scheduled this step, preferring one that may
// not be scheduled this step anyway (isolation: another request's), so that an isolated
// request does not preempt itself while others sit idle.
Sequence* Scheduler::PickVictim(const SchedulerOutput& out) const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (!Eligible(*it) && !Contains(out, *it)) return *it;
  }
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (!Contains(out, *it)) return *it;
  }
  return nullptr;
}

void Scheduler::Preempt(Sequence* seq, SchedulerOutput* out) {
  Requeue(seq);
  out->preempted.push_back(seq);
  ++num_preemptions_;
  // The headroom was too thin: halfway back to the full ratio.
  if (config_.kv_reserve_ratio > 0) {
    const double now = kv_reserve_ratio();
    expected_share_ = now + (config_.kv_reserve_ratio - now) / 2;
  }
}

void Scheduler::ScheduleDecodes(SchedulerOutput* out, int64_t* budget) {
  const std::vector<Sequence*> snapshot = running_;  // Preempt() edits running_
  for (Sequence* seq : snapshot) {
    if (seq->status != SeqStatus::kRunning || !seq->is_decode() || !Eligible(seq)) continue;
    // Async: a pending token that reaches max_tokens ends the sequence; no step after it.
    if (seq->num_pending > 0 &&
        seq->num_output_tokens() >= seq->request->request.sampling.max_tokens) {
      continue;
    }
    if (*budget == 0 || std::ssize(out->chunks) >= config_.max_num_seqs) break;
    // The token to decode gets a slot (a sliding-window pool may also have to back the
    // tokens a recomputed prefill stopped short of).
    const int64_t num_new = blocks_->NumTokens(seq->id) < seq->num_tokens() ? 1 : 0;
    while (!blocks_->CanAppend(seq->id, num_new)) {
      Sequence* victim = PickVictim(*out);
      Preempt(victim, out);  // victim may be seq itself (the newest unscheduled one)
      if (victim == seq) break;
    }
    if (seq->status != SeqStatus::kRunning) continue;
    const int last[1] = {seq->token_ids.back()};
    blocks_->Append(seq->id, std::span<const int>(last, static_cast<size_t>(num_new)),
                    &out->copies);
    out->chunks.push_back({seq, 1, /*is_decode=*/true, /*samples=*/true});
    --*budget;
  }
}

void Scheduler::SchedulePrefills(SchedulerOutput* out, int64_t* budget) {
  const std::vector<Sequence*> snapshot = running_;  // Preempt() edits running_
  for (Sequence* seq : snapshot) {
    if (seq->status != SeqStatus::kRunning) continue;
    if (seq->is_decode() || Contains(*out, seq) || !Eligible(seq)) continue;
    if (*budget == 0 || std::ssize(out->chunks) >= config_.max_num_seqs) break;
    const int64_t n = std::min(seq->prefill_target() - seq->num_computed_tokens, *budget);
    if (n <= 0) continue;
    // A sliding-window pool gives a prefill its blocks chunk by chunk (else it has them all).
    const int64_t end = seq->num_computed_tokens + n;
    while (!blocks_->CanReserve(seq->id, end)) {
      Sequence* victim = PickVictim(*out);
      Preempt(victim, out);  // as for decodes: the newest unscheduled one, maybe seq itself
      if (victim == seq) break;
    }
    if (seq->status != SeqStatus::kRunning) continue;
    blocks_->Reserve(seq->id, end);
    const bool samples = seq->num_computed_tokens + n == seq->num_tokens();
    out->chunks.push_back({seq, n, /*is_decode=*/false, samples});
    *budget -= n;
  }
}

void Scheduler::Admit(SchedulerOutput* out, int64_t* budget) {
  const double ratio = kv_reserve_ratio();
  int64_t running_blocks = 0;
  if (ratio > 0 && !waiting_.empty()) {  // (a step with nobody waiting admits nobody)
    for (const Sequence* s : running_) running_blocks += ReserveBlocks(s, ratio);
  }
  while (!waiting_.empty() && *budget > 0 && num_running() < config_.max_num_seqs &&
         std::ssize(out->chunks) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    // Preempted with a token still pending (async): it waits for the token, and for room.
    if (seq->num_pending > 0 || !blocks_->CanAllocate(seq->token_ids) ||
        !KeepsHeadroom(seq, ratio, running_blocks)) {
      break;  // FCFS
    }
    waiting_.pop_front();
    if (ratio > 0) running_blocks += ReserveBlocks(seq, ratio);
    Start(seq, out, budget);
  }
}

void Scheduler::Start(Sequence* seq, SchedulerOutput* out, int64_t* budget) {
  const int64_t cached = blocks_->Allocate(seq->id, seq->token_ids);
  seq->num_computed_tokens = cached;
  if (!seq->has_output() && !seq->request->has_first_scheduled) {
    seq->request->cached_prompt_tokens = cached;
  }
  AddRunning(seq);
  const int64_t n = std::min(seq->prefill_target() - cached, *budget);
  if (n <= 0) return;  // a recomputed sequence fully cached: it decodes next step
  blocks_->Reserve(seq->id, cached + n);  // within what Allocate backed (its lookahead)
  const bool samples = cached + n == seq->num_tokens();
  out->chunks.push_back({seq, n, /*is_decode=*/false, samples});
  *budget -= n;
}

// The isolated request's waiting sequences, wherever they are in the queue (requeued at its
// front, though a later preemption may have gone in front of them), ahead of everyone: the
// running sequences of other requests, which are not scheduled meanwhile, are preempted
// (newest first) when their blocks are needed.
void Scheduler::AdmitIsolated(SchedulerOutput* out, int64_t* budget) {
  std::vector<Sequence*> mine;
  for (Sequence* seq : waiting_) {
    if (seq->request == focus_) mine.push_back(seq);
  }
  for (Sequence* seq : mine) {
    if (*budget <= 0 || std::ssize(out->chunks) >= config_.max_num_seqs) break;
    if (seq->num_pending > 0) break;  // async: waits for its pending token
    while (!blocks_->CanAllocate(seq->token_ids) || num_running() >= config_.max_num_seqs) {
      Sequence* victim = PickVictim(*out);
      if (victim == nullptr) return;  // cannot happen: a lone request always fits
      Preempt(victim, out);
    }
    std::erase(waiting_, seq);
    Start(seq, out, budget);
  }
}

}  // namespace llm
