#include "engine/request.h"

#include <algorithm>

namespace llm {

Clock::time_point DeadlineAfter(double seconds) {
  const double capped = std::min(seconds, kMaxTimeoutSeconds);
  return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(capped * 1000));
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kTimeout:
      return "timeout";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

void OutputWaker::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  if (wake_) wake_();
}

void OutputWaker::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = nullptr;
}

void OutputChannel::Push(RequestOutput output) {
  std::shared_ptr<OutputWaker> waker;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (output.is_last) closed_ = true;
    queue_.push_back(std::move(output));
    waker = waker_;
  }
  cv_.notify_all();
  if (waker) waker->Wake();
}

void OutputChannel::SetWaker(std::shared_ptr<OutputWaker> waker) {
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waker_ = waker;
    pending = !queue_.empty();
  }
  if (waker && pending) waker->Wake();
}

bool OutputChannel::Pop(RequestOutput* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

bool OutputChannel::TryPop(RequestOutput* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

bool OutputChannel::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace llm
