#include "server/front_end.h"

#include <algorithm>
#include <utility>

namespace llm::server {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is read, whatever matches; volatile keeps the loop whole.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

void WakerSet::Add(const std::shared_ptr<OutputWaker>& waker) {
  std::lock_guard<std::mutex> lock(mu_);
  if (detached_) {
    waker->Detach();
    return;
  }
  wakers_.insert(waker);
}

void WakerSet::Remove(const std::shared_ptr<OutputWaker>& waker) {
  std::lock_guard<std::mutex> lock(mu_);
  wakers_.erase(waker);
}

void WakerSet::DetachAll() {
  std::lock_guard<std::mutex> lock(mu_);
  detached_ = true;
  for (const auto& waker : wakers_) waker->Detach();
  wakers_.clear();
}

AdmissionSlot::AdmissionSlot(AdmissionSlot&& other) noexcept
    : front_end_(std::exchange(other.front_end_, nullptr)),
      num_prompt_tokens_(other.num_prompt_tokens_) {}

AdmissionSlot& AdmissionSlot::operator=(AdmissionSlot&& other) noexcept {
  if (this != &other) {
    Release();
    front_end_ = std::exchange(other.front_end_, nullptr);
    num_prompt_tokens_ = other.num_prompt_tokens_;
  }
  return *this;
}

void AdmissionSlot::Release() {
  if (front_end_ != nullptr) std::exchange(front_end_, nullptr)->Release(num_prompt_tokens_);
}

FrontEnd::FrontEnd(const Engine& engine, std::string model_name, AdmissionLimits limits)
    : max_in_flight_(engine.config().max_num_seqs + limits.max_queued_requests),
      max_prompt_tokens_(limits.max_queued_prompt_tokens),
      metrics_(std::move(model_name)) {}

AdmissionSlot FrontEnd::Admit(int64_t num_prompt_tokens) {
  const int64_t slots_before = num_in_flight_.fetch_add(1);
  const int64_t tokens_before = num_in_flight_prompt_tokens_.fetch_add(num_prompt_tokens);
  AdmissionSlot slot(this, num_prompt_tokens);
  if (slots_before >= max_in_flight_ || tokens_before + num_prompt_tokens > max_prompt_tokens_) {
    return AdmissionSlot();  // `slot` gives the room back
  }
  return slot;
}

void FrontEnd::Release(int64_t num_prompt_tokens) {
  num_in_flight_ -= 1;
  num_in_flight_prompt_tokens_ -= num_prompt_tokens;
}

void FrontEnd::RecordFinished(const std::string& id, const char* api, const RequestOutput& last) {
  metrics_.RequestFinished(last, last.finish_reason);
  LogRequestFinished(id, api, last, last.finish_reason);
}

void FrontEnd::RecordAborted(const std::string& id, const char* api, int64_t num_prompt_tokens) {
  RequestOutput aborted;
  aborted.usage.prompt_tokens = num_prompt_tokens;
  metrics_.RequestFinished(aborted, FinishReason::kAbort);
  LogRequestFinished(id, api, aborted, FinishReason::kAbort);
}

}  // namespace llm::server
