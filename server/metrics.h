// Prometheus text exposition with vLLM-compatible metric names (vllm:*), so dashboards and
// autoscalers written for vLLM work unchanged. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace llm::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends "name_bucket{le=...}", "_sum", "_count" lines with the given labels.
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// One structured log line per finished request on stderr (JSON: id, tokens, timings,
// finish reason), written with a single fputs so lines from threads never interleave.
void LogRequestFinished(const std::string& id, const char* front_end, const RequestOutput& last,
                        FinishReason reason);

class Metrics {
 public:
  explicit Metrics(std::string model_name = "");
  void set_model_name(std::string name);

  // One finished request, as the front end saw it.
  void RequestFinished(const RequestOutput& last, FinishReason reason);
  void InterTokenGap(double seconds);
  void HttpResponse(int status);

  std::string Render(const EngineStats& stats) const;

 private:
  mutable std::mutex mu_;
  std::string model_name_;
  Histogram ttft_, itl_, e2e_, queue_, prompt_len_, gen_len_;
  std::map<std::string, uint64_t> finished_by_reason_;
  std::map<int, uint64_t> http_by_status_;
};

}  // namespace llm::server
