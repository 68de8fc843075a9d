// What the HTTP and the gRPC front ends share, so that they serve as one server: one
// admission count (`--max-queued-requests`, `--max-queued-prompt-tokens`; beyond them HTTP
// answers 429 with Retry-After and gRPC RESOURCE_EXHAUSTED, whichever front end holds the
// slots) and one Metrics (GET /metrics counts the requests of both). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include "engine/engine.h"
#include "server/metrics.h"

namespace llm::server {

struct AdmissionLimits {
  int64_t max_queued_requests = 256;  // beyond the engine's running sequences
  // Prompt tokens of every admitted request together, running or queued.
  int64_t max_queued_prompt_tokens = 1 << 20;
};

class FrontEnd;

// a == b in time that depends only on the lengths (an API key check leaks nothing about how
// much of a guess was right).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// One request's place in the admission count, from admission until its response is over.
// Released by Release() or by its destructor; empty (false) when the request was refused.
class AdmissionSlot {
 public:
  AdmissionSlot() = default;
  AdmissionSlot(AdmissionSlot&& other) noexcept;
  AdmissionSlot& operator=(AdmissionSlot&& other) noexcept;
  ~AdmissionSlot() { Release(); }

  explicit operator bool() const { return front_end_ != nullptr; }
  void Release();

 private:
  friend class FrontEnd;
  AdmissionSlot(FrontEnd* front_end, int64_t num_prompt_tokens)
      : front_end_(front_end), num_prompt_tokens_(num_prompt_tokens) {}

  FrontEnd* front_end_ = nullptr;
  int64_t num_prompt_tokens_ = 0;
};

// The live OutputWakers of a front end's responses: detached all at once when it stops, so
// that the engine thread never posts to an event loop that is going away. Thread-safe.
class WakerSet {
 public:
  void Add(const std::shared_ptr<OutputWaker>& waker);  // detached at once after DetachAll
  void Remove(const std::shared_ptr<OutputWaker>& waker);
  void DetachAll();

 private:
  std::mutex mu_;
  std::unordered_set<std::shared_ptr<OutputWaker>> wakers_;
  bool detached_ = false;
};

class FrontEnd {
 public:
  // Admits up to engine.config().max_num_seqs + limits.max_queued_requests requests at once.
  FrontEnd(const Engine& engine, std::string model_name, AdmissionLimits limits = {});

  // Reserves room for a request of `num_prompt_tokens`; an empty slot when the server is at
  // capacity. The room is taken before it is checked (fetch_add), so simultaneous requests
  // cannot all pass a check that only one of them fits.
  AdmissionSlot Admit(int64_t num_prompt_tokens);
  int64_t num_in_flight() const { return num_in_flight_.load(); }  // admitted, not released
  // Every admission slot taken: a new request would get 429 / RESOURCE_EXHAUSTED now.
  bool at_capacity() const { return num_in_flight_.load() >= max_in_flight_; }

  // A request's last event: its metrics and its log line (`api`: "http" or "grpc").
  void RecordFinished(const std::string& id, const char* api, const RequestOutput& last);
  // A request whose client went away before its last event: finish reason "abort".
  void RecordAborted(const std::string& id, const char* api, int64_t num_prompt_tokens);
  Metrics& metrics() { return metrics_; }

 private:
  friend class AdmissionSlot;
  void Release(int64_t num_prompt_tokens);

  const int64_t max_in_flight_;
  const int64_t max_prompt_tokens_;
  std::atomic<int64_t> num_in_flight_{0};
  std::atomic<int64_t> num_in_flight_prompt_tokens_{0};
  Metrics metrics_;
};

}  // namespace llm::server
