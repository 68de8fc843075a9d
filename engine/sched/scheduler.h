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
//     be allocated and the KV headroom holds (below). Prompt tokens found in the prefix
//     cache are not recomputed and do not count against the token budget.
// KV headroom (SchedulerConfig::kv_reserve_*): admitting a sequence whose prompt fits is not
// enough. Every running sequence still grows, up to its max_tokens, and when the pool runs dry
// the newest are preempted and later recomputed: work thrown away, so that a larger
// max_num_seqs could lose throughput to its own preemptions (measured on the H200: 256 -> 512
// lost 11%). So a waiting sequence is admitted only while the blocks left free after its
// prompt cover the blocks that the running sequences and it would take by generating `ratio`
// of the tokens each may still generate (max_tokens left, clipped at kv_reserve_clip_tokens as
// SGLang clips its estimate: a chat whose max_tokens defaults to the whole context would
// otherwise reserve all of it). `ratio` is the share of its token budget a sequence is
// expected to use: it starts at kv_reserve_ratio (1: nothing admitted can run the pool dry,
// TensorRT-LLM's GUARANTEED_NO_EVICT), follows the share that finished sequences used (a
// moving average; chats that stop early lower it, towards kv_reserve_min_ratio) and moves
// halfway back to kv_reserve_ratio at each preemption. A lone sequence is always admitted
// (nothing deadlocks). kv_reserve_ratio 0: admit whenever the prompt fits (vLLM's policy; the
// tests that drive preemption use it).
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
  // KV headroom at admission (see above). kv_reserve_ratio 0 turns it off.
  double kv_reserve_ratio = 1.0;
  double kv_reserve_min_ratio = 0.1;
  int64_t kv_reserve_clip_tokens = 4096;
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
  // Drops the sequence (finished, aborted) and frees its blocks. A sequence that finished
  // (finish_reason stop or length) tells the headroom what share of its budget it used.
  void Remove(Sequence* seq);
  // Back to the FRONT of the waiting queue without its blocks, to be recomputed (a preemption
  // the engine asks for: the sequence's step failed and it will be retried alone).
  void Requeue(Sequence* seq);

  SchedulerOutput Schedule();

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // The share of the running sequences' remaining tokens that admission reserves now (0: off).
  double kv_reserve_ratio() const;

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
  // The blocks `seq` would add by generating `ratio` of the tokens it may still generate
  // (max_tokens left, clipped).
  int64_t ReserveBlocks(const Sequence* seq, double ratio) const;
  // Whether the pool keeps the headroom with `seq` admitted; `running_blocks`: the running
  // sequences' ReserveBlocks, summed.
  bool KeepsHeadroom(const Sequence* seq, double ratio, int64_t running_blocks) const;
  Sequence* PickVictim(const SchedulerOutput& out) const;

  SchedulerConfig config_;
  BlockManager* blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order
  int64_t next_admit_order_ = 0;
  int64_t num_preemptions_ = 0;
  double expected_share_ = 0;            // the headroom's ratio before its bounds (see above)
  const RequestState* focus_ = nullptr;  // the isolated request this step runs, if any
};

}  // namespace llm
