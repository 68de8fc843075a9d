// Iteration-level scheduling (continuous batching) with chunked prefill and preemption.
//
// Policy, every step, within max_num_batched_tokens and max_num_seqs:
//  1. Running decodes, oldest admission first, one token each. A decode that needs a new
//     KV block when the pool is empty preempts the most recently admitted running sequence
//     that is not yet scheduled this step (possibly itself): its blocks are freed and it
//     returns to the FRONT of the waiting queue, to be recomputed later with the tokens it
//     already generated.
//  2. Running prefills (prompts admitted earlier, partly computed), oldest first, each a
//     chunk of what budget is left (chunked prefill: a long prompt never stalls decodes).
//  3. Waiting sequences, first come first served (strict FCFS: the head of the queue is
//     not overtaken when it does not fit), admitted while blocks for ALL their tokens can
//     be allocated. Prompt tokens found in the prefix cache are not recomputed and do not
//     count against the token budget.
// Async scheduling (a step is scheduled while the previous one runs): a running sequence
// whose last token is still pending (Sequence::num_pending) decodes it like any token (its id
// is fed on the device); one whose pending token reaches max_tokens is not scheduled; a
// preempted one is not readmitted before its pending token is known.
// Isolation (RequestState::isolated, set by the engine after a failed step): while such a
// request exists, a step holds only its sequences (the first isolated request running, else
// the first waiting); running sequences of other requests are preempted if it needs their
// blocks to be admitted.
// Sliding-window pools (BlockManager's sliding-window mode): blocks are reserved chunk by chunk;
// a prefill chunk that cannot get its blocks preempts as a decode does.
// Requests that could never fit (prompt + max_tokens beyond the pool) are rejected by the
// engine before they get here, so a lone sequence always fits and nothing deadlocks.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/sched/block_manager.h"
#include "engine/sequence.h"

namespace llm {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t num_tokens = 0;  // tokens computed this step, from seq->num_computed_tokens
  bool is_decode = false;
  bool samples = false;  // after this chunk every token is computed: sample the next one
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::vector<BlockCopy> copies;       // copy-on-write copies to do before the forward
  std::vector<Sequence*> preempted;
  int64_t num_batched_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager* blocks);

  void AddWaiting(Sequence* seq);  // a new sequence joins the back of the queue
  void AddRunning(Sequence* seq);  // a forked child whose blocks the manager already holds
  // Drops the sequence (finished, aborted) and frees its blocks.
  void Remove(Sequence* seq);
  // Back to the FRONT of the waiting queue without its blocks, to be recomputed (a preemption
  // the engine asks for: the sequence's step failed and it will be retried alone).
  void Requeue(Sequence* seq);

  SchedulerOutput Schedule();

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }

 private:
  void ScheduleDecodes(SchedulerOutput* out, int64_t* budget);
  void SchedulePrefills(SchedulerOutput* out, int64_t* budget);
  void Admit(SchedulerOutput* out, int64_t* budget);
  void AdmitIsolated(SchedulerOutput* out, int64_t* budget);
  // Admits `seq` (already out of the queue): blocks for all its tokens, its first chunk.
  void Start(Sequence* seq, SchedulerOutput* out, int64_t* budget);
  // Whether `seq` may be scheduled this step (all, or only the isolated request's).
  bool Eligible(const Sequence* seq) const { return focus_ == nullptr || seq->request == focus_; }
  void Preempt(Sequence* seq, SchedulerOutput* out);
  Sequence* PickVictim(const SchedulerOutput& out) const;

  SchedulerConfig config_;
  BlockManager* blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order
  int64_t next_admit_order_ = 0;
  int64_t num_preemptions_ = 0;
  const RequestState* focus_ = nullptr;  // the isolated request this step runs, if any
};

}  // namespace llm
