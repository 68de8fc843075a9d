// What crosses threads between the front ends and the engine: plain data only. A front end
// builds a Request, hands it to Engine::AddRequest and reads RequestOutputs from the
// returned channel; it never sees sequences, blocks or the model.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/sample/sampler.h"

namespace llm {

using Clock = std::chrono::steady_clock;

struct Request {
  std::string request_id;
  std::vector<int> prompt_ids;                // the text path tokenizes before it
  SamplingParams sampling;                    // includes max_tokens, n, stop, logprobs, ...
  std::optional<Clock::time_point> deadline;  // finish reason "timeout" once passed
  // The output text leaves special tokens out (vLLM's skip_special_tokens); false keeps them
  // (a tool-call parser that reads Mistral's [TOOL_CALLS] marker).
  bool skip_special_tokens = true;
};

// Clock::now() + `seconds` (> 0) for Request::deadline. Timeouts come from clients as any
// double: they are capped at kMaxTimeoutSeconds (~31 years), so that the conversion to
// Clock ticks cannot overflow (1e40 or inf seconds were undefined behaviour).
constexpr double kMaxTimeoutSeconds = 1e9;
Clock::time_point DeadlineAfter(double seconds);

enum class FinishReason { kNone, kStop, kLength, kAbort, kTimeout, kError };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", ... ("" for kNone)

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;     // summed over the n completions
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
};

// A generated token's logprob under the model's raw distribution, with the top-N
// alternatives when requested.
struct OutputLogprob {
  int token = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

// One event on a request's channel: new tokens of completion `index` (and their text), or
// the end of that completion (finish_reason != kNone). A request with n completions gets n
// finishing events; the last one of them also carries the request's usage (is_last).
struct RequestOutput {
  int index = 0;
  std::vector<int> token_ids;
  std::string text;                     // UTF-8-safe delta; stop strings excluded
  std::vector<OutputLogprob> logprobs;  // one per token when logprobs were requested
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;     // for kError
  bool is_last = false;  // no further events for this request
  Usage usage;           // set when is_last
  // Timings (set when is_last): seconds from arrival.
  double queue_seconds = 0, first_token_seconds = 0, total_seconds = 0;
};

// How an event-driven reader learns that its channel has something: the channel calls Wake()
// after each Push (on the pushing thread, the engine's, outside the channel's lock), so that no
// thread has to wait in Pop. `wake` must be cheap and must not block or call back into the
// channel (the front ends post a task to their I/O threads). Detach() is the reader's way out:
// once it returns, `wake` never runs again (it waits for a Wake() already running).
class OutputWaker {
 public:
  explicit OutputWaker(std::function<void()> wake) : wake_(std::move(wake)) {}
  void Wake();
  void Detach();

 private:
  std::mutex mu_;
  std::function<void()> wake_;  // empty once detached
};

// A thread-safe queue of outputs, written by the engine thread, read by one reader: a thread
// that blocks in Pop, or an event loop woken through its OutputWaker.
class OutputChannel {
 public:
  void Push(RequestOutput output);
  // Blocks until an output is available (true) or the timeout passes (false).
  bool Pop(RequestOutput* out, std::chrono::milliseconds timeout = std::chrono::hours(24));
  bool TryPop(RequestOutput* out);
  bool closed() const;  // the last output has been pushed
  // Wakes `waker` after every later Push, and once now if outputs are already queued (so a
  // reader that sets it after AddRequest misses nothing). Null: no more wakes from here.
  void SetWaker(std::shared_ptr<OutputWaker> waker);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool closed_ = false;
  std::shared_ptr<OutputWaker> waker_;
};

}  // namespace llm
