// The engine's failure handling: a step whose executor call throws fails only its own
// requests; a fatal error, or too many failed steps in a row, turns the engine unhealthy.
//
// Isolation (EngineConfig::isolate_failed_requests): a step that failed at launch, holding
// several requests, does not fail them. Nothing of it ran and nothing is in flight (LaunchStep
// finished the steps before it first), so each of its requests is requeued, like a preempted
// one (its blocks freed, what it had recomputed, the prefix cache serving what earlier steps
// committed), and marked isolated: the scheduler runs it alone until it has sampled alone (a
// step that samples for it succeeded: its whole prompt, or its last token and its sampling,
// ran with nothing beside it). Draws the failed launch took from its samplers were given back
// by the executor (executor.h), so a seeded request draws the same stream. A request whose
// lone step fails is the culprit and ends with "error"; the others continue with the tokens
// they would have had (a transient failure such as an out-of-memory step fails nobody). Lone
// steps do not reset the count of failed steps in a row; a request is isolated at most
// kMaxIsolations times. Not retried: n > 1 requests (children may exist already), failures
// seen only when waiting for an asynchronous step (a later step was launched over its
// placeholders), fatal errors.
//
// What a failed step leaves behind: its sequences' new tokens were never marked computed
// (CommitComputed runs only after a successful forward), so none of the blocks it was
// writing has a prefix-cache hash; finishing its requests frees those blocks as plain free
// blocks. Blocks computed by earlier, successful steps keep their hashes: their KV is sound.
#include <algorithm>
#include <cstdio>

#include "engine/engine.h"
#include "engine/error.h"

namespace llm {
namespace {

// How often one request may be requeued by isolation: a bound on retries whatever happens
// (a request that keeps sharing failing steps ends with "error" after this many).
constexpr int kMaxIsolations = 3;

void Log(const std::string& line) { std::fprintf(stderr, "[llm] engine: %s\n", line.c_str()); }

// The request ids of a failed step for the log: the first few, then how many more.
std::string DescribeRequests(const std::vector<RequestState*>& reqs) {
  constexpr size_t kMaxListed = 8;
  std::string out;
  for (size_t i = 0; i < std::min(reqs.size(), kMaxListed); ++i) {
    out += (i ? ", " : "") + reqs[i]->request.request_id;
  }
  if (reqs.size() > kMaxListed) out += " and " + std::to_string(reqs.size() - kMaxListed) + " more";
  return out;
}

}  // namespace

void Engine::FailStep(const SchedulerOutput& sched, std::exception_ptr error, bool at_launch) {
  std::string what = "unknown exception";
  bool is_fatal = false;
  try {
    std::rethrow_exception(error);
  } catch (const FatalExecutorError& e) {
    what = e.what();
    is_fatal = true;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  ++counters_.num_failed_steps;
  ++num_consecutive_step_failures_;
  // Each request once (n > 1 has several chunks). in_step also counts the requests that
  // finished meanwhile (async, or the drain before this): with two or more in the step, the one
  // left may be innocent, so it is retried too. failed: those still open.
  std::vector<const RequestState*> in_step;
  std::vector<RequestState*> failed;
  auto add_once = [](auto& list, RequestState* req) {
    if (std::find(list.begin(), list.end(), req) == list.end()) list.push_back(req);
  };
  for (const ScheduledChunk& c : sched.chunks) {
    add_once(in_step, c.seq->request);
    // A sequence that finished after the launch (its request may be gone) is done.
    if (c.seq->status != SeqStatus::kFinished) add_once(failed, c.seq->request);
  }
  std::vector<RequestState*> retried;
  if (at_launch && !is_fatal && config_.isolate_failed_requests && in_step.size() > 1) {
    for (RequestState* req : failed) {
      if (req->request.sampling.n == 1 && req->num_isolations < kMaxIsolations) {
        retried.push_back(req);
      }
    }
    std::erase_if(failed, [&](RequestState* r) {
      return std::find(retried.begin(), retried.end(), r) != retried.end();
    });
  }
  Log("step failed (" + std::to_string(failed.size() + retried.size()) +
      " requests: " + DescribeRequests(failed.empty() ? retried : failed) + "; " +
      std::to_string(sched.num_batched_tokens) + " tokens" + (is_fatal ? "; fatal" : "") +
      "): " + what +
      (retried.empty() ? std::string()
                       : "; " + std::to_string(retried.size()) +
                             " requests requeued to run one at a time (isolation)"));
  // Unhealthy before the step's requests end: a front end that reads their error then sees
  // the engine's state too (a 503 for them, not a 500).
  const int max_failures = config_.max_consecutive_step_failures;
  if (is_fatal) {
    MarkUnhealthy("fatal executor error: " + what);
  } else if (max_failures > 0 && num_consecutive_step_failures_ >= max_failures) {
    MarkUnhealthy(std::to_string(num_consecutive_step_failures_) +
                  " steps in a row failed, the last with: " + what);
  }
  for (RequestState* req : failed) {
    FinishRequest(req, FinishReason::kError, "the model step running this request failed: " + what);
  }
  counters_.num_failed_requests += std::ssize(failed);
  // Backwards, so that they keep their order at the front of the queue.
  for (auto it = retried.rbegin(); it != retried.rend(); ++it) {
    (*it)->isolated = true;
    ++(*it)->num_isolations;
    for (Sequence* seq : (*it)->seqs) {
      if (seq->status != SeqStatus::kFinished) scheduler_.Requeue(seq);
    }
  }
  counters_.num_isolated_retries += std::ssize(retried);
}

void Engine::MarkUnhealthy(const std::string& reason) {
  std::lock_guard<std::mutex> lock(health_mu_);
  if (!is_healthy_) return;
  unhealthy_reason_ = reason;
  is_healthy_ = false;
  Log("UNHEALTHY, every request will fail until the process restarts: " + reason);
  for (auto& [handle, listener] : health_listeners_) listener();
}

void Engine::OnEngineError(const std::string& what) {
  Log("engine error outside the model step: " + what);
  MarkUnhealthy("engine error: " + what);
  // What the throw left half done cannot be trusted: end every request now (a second throw
  // is logged and the next Step() tries again).
  try {
    FailAllRequests();
  } catch (const std::exception& e) {
    Log("failing the requests after an engine error threw too: " + std::string(e.what()));
  } catch (...) {
    Log("failing the requests after an engine error threw too");
  }
}

void Engine::FailAllRequests() {
  std::vector<RequestState*> all;
  for (auto& [id, req] : requests_) all.push_back(req.get());
  const std::string message = "the engine is unhealthy (" + UnhealthyReason() + ")";
  for (RequestState* req : all) FinishRequest(req, FinishReason::kError, message);
  counters_.num_failed_requests += std::ssize(all);
}

std::string Engine::UnhealthyReason() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return unhealthy_reason_;
}

int Engine::AddHealthListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(health_mu_);
  if (!is_healthy_) listener();
  health_listeners_.emplace(next_listener_, std::move(listener));
  return next_listener_++;
}

void Engine::RemoveHealthListener(int handle) {
  std::lock_guard<std::mutex> lock(health_mu_);
  health_listeners_.erase(handle);
}

}  // namespace llm
