// One completion being generated: its tokens, how many of them have KV in the cache, and
// its per-sequence sampling, detokenization and stop state. Owned by the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/sample/sampler.h"
#include "engine/sched/block_manager.h"
#include "engine/stop_strings.h"
#include "engine/tokenizer/tokenizer.h"

namespace llm {

struct RequestState;

enum class SeqStatus { kWaiting, kRunning, kFinished };

// Async scheduling: the id in token_ids of a token sampled by a launched step whose results
// are not back yet (a placeholder, vLLM's "output placeholder").
constexpr int kPendingToken = -1;

struct Sequence {
  SeqId id = 0;
  RequestState* request = nullptr;
  int index = 0;               // completion index within the request (n > 1)
  std::vector<int> token_ids;  // prompt + generated; the last num_pending are kPendingToken
  int64_t num_prompt_tokens = 0;
  // Tokens whose K/V are in the cache, or will be once the launched steps complete (the
  // engine commits them to the block manager when a step's results are back).
  int64_t num_computed_tokens = 0;
  SeqStatus status = SeqStatus::kWaiting;
  int64_t admit_order = 0;  // larger = admitted more recently (preempted first)
  // Async scheduling: sampled tokens not back on the host yet (0, 1, or 2 while the step
  // after is launched), the launched step that samples the newest one and its task index.
  int64_t num_pending = 0;
  int64_t pending_step = -1;
  int32_t pending_task = -1;
  // Bumped when the sequence loses its blocks (preemption): KV that a launched step computes
  // for an older allocation is never committed.
  int64_t allocation = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<IncrementalDecoder> decoder;
  std::unique_ptr<StopStringMatcher> stop;
  FinishReason finish_reason = FinishReason::kNone;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  int64_t num_known_tokens() const { return num_tokens() - num_pending; }  // no placeholders
  bool has_output() const { return num_output_tokens() > 0; }
  // Tokens still to compute before the next token can be sampled.
  int64_t num_uncomputed() const { return num_tokens() - num_computed_tokens; }
  // A decode step: exactly the last sampled token is pending and its context is cached.
  bool is_decode() const {
    return num_computed_tokens > 0 && num_uncomputed() == 1 && has_output();
  }
  // Where a prefill stops: a fresh prompt runs to its end (and samples); a sequence
  // recomputed after preemption stops one short, so its pending token goes through the
  // decode path exactly as it would have without preemption (batch invariance).
  int64_t prefill_target() const { return has_output() ? num_tokens() - 1 : num_tokens(); }
};

// A request: its n sequences, its channel and its bookkeeping. Owned by the engine thread.
struct RequestState {
  Request request;
  std::shared_ptr<OutputChannel> channel;
  std::vector<Sequence*> seqs;  // index order; child sequences appear after the fork
  int num_finished = 0;
  int64_t cached_prompt_tokens = 0;
  bool is_forked = false;  // n > 1: children created after the prompt was computed
  // Its last step failed at launch together with other requests: it runs alone (the
  // scheduler schedules no other request beside it) until a step that samples for it succeeds.
  bool isolated = false;
  int num_isolations = 0;  // times requeued so; bounded (kMaxIsolations), so retries end
  Clock::time_point arrival, first_scheduled, first_token;
  bool has_first_scheduled = false, has_first_token = false;
};

}  // namespace llm
