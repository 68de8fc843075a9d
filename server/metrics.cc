#include "server/metrics.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace llm::server {
namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

const std::vector<double> kLatencyBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                             0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                             7.5,   10.0,  20.0, 40.0, 80.0};
const std::vector<double> kTokenBuckets = {1,   2,    5,    10,   20,    50,    100,   200,
                                           500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};

}  // namespace

void LogRequestFinished(const std::string& id, const char* front_end, const RequestOutput& last,
                        FinishReason reason) {
  const nlohmann::json line = {{"event", "request_finished"},
                               {"id", id},
                               {"api", front_end},
                               {"finish_reason", FinishReasonName(reason)},
                               {"prompt_tokens", last.usage.prompt_tokens},
                               {"completion_tokens", last.usage.completion_tokens},
                               {"cached_prompt_tokens", last.usage.cached_prompt_tokens},
                               {"queue_s", last.queue_seconds},
                               {"ttft_s", last.first_token_seconds},
                               {"e2e_s", last.total_seconds}};
  std::fputs((line.dump() + "\n").c_str(), stderr);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                       bounds_.begin());
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? Num(bounds_[i]) : "+Inf";
    *out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_sum{" + labels + "} " + Num(sum_) + "\n";
  *out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

Metrics::Metrics(std::string model_name)
    : model_name_(std::move(model_name)),
      ttft_(kLatencyBuckets),
      itl_(kLatencyBuckets),
      e2e_(kLatencyBuckets),
      queue_(kLatencyBuckets),
      prompt_len_(kTokenBuckets),
      gen_len_(kTokenBuckets) {}

void Metrics::set_model_name(std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  model_name_ = std::move(name);
}

void Metrics::RequestFinished(const RequestOutput& last, FinishReason reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_by_reason_[FinishReasonName(reason)];
  if (last.first_token_seconds > 0) ttft_.Observe(last.first_token_seconds);
  e2e_.Observe(last.total_seconds);
  queue_.Observe(last.queue_seconds);
  prompt_len_.Observe(static_cast<double>(last.usage.prompt_tokens));
  gen_len_.Observe(static_cast<double>(last.usage.completion_tokens));
}

void Metrics::InterTokenGap(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.Observe(seconds);
}

void Metrics::HttpResponse(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_by_status_[status];
}

std::string Metrics::Render(const EngineStats& s) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string labels = "model_name=\"" + model_name_ + "\"";
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    out += std::string(name) + "{" + labels + "} " + Num(value) + "\n";
  };
  const double usage =
      s.num_kv_blocks > 0 ? 1.0 - double(s.num_free_kv_blocks) / double(s.num_kv_blocks) : 0.0;
  metric("vllm:num_requests_running", "gauge", "Requests in the running batch.", s.num_running);
  metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", s.num_waiting);
  metric("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV cache blocks in use (0-1).", usage);
  metric("vllm:gpu_cache_usage_perc", "gauge", "Same as vllm:kv_cache_usage_perc (old name).",
         usage);
  metric("vllm:prompt_tokens_total", "counter", "Prompt tokens computed.",
         double(s.num_prompt_tokens_computed));
  metric("vllm:generation_tokens_total", "counter", "Tokens generated.",
         double(s.num_generated_tokens));
  metric("vllm:num_preemptions_total", "counter", "Sequences preempted.",
         double(s.num_preemptions));
  metric("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the cache.",
         double(s.prefix_query_tokens));
  metric("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the cache.",
         double(s.prefix_hit_tokens));
  metric("llm:kv_window_released_blocks_total", "counter",
         "KV blocks given back once every layer's sliding window had left them.",
         double(s.window_released_kv_blocks));
  metric("llm:engine_failed_steps_total", "counter",
         "Engine steps whose model execution threw (their requests failed, or were retried "
         "one at a time).",
         double(s.num_failed_steps));
  metric("llm:engine_isolated_retries_total", "counter",
         "Requests of failed steps requeued to run alone (isolation) instead of failing.",
         double(s.num_isolated_retries));
  metric("llm:engine_failed_requests_total", "counter",
         "Requests the engine ended with an error (a failed step, or the engine unhealthy).",
         double(s.num_failed_requests));
  metric("llm:engine_healthy", "gauge",
         "1 while the engine serves; 0 once it is unhealthy (the process needs a restart).",
         s.is_healthy ? 1.0 : 0.0);
  out +=
      "# HELP vllm:request_success_total Finished requests by finish reason.\n"
      "# TYPE vllm:request_success_total counter\n";
  for (const auto& [reason, n] : finished_by_reason_) {
    out += "vllm:request_success_total{" + labels + ",finished_reason=\"" + reason + "\"} " +
           std::to_string(n) + "\n";
  }
  auto hist = [&](const char* name, const char* help, const Histogram& h) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    h.Render(name, labels, &out);
  };
  hist("vllm:time_to_first_token_seconds", "Time to first token.", ttft_);
  hist("vllm:inter_token_latency_seconds", "Time between streamed tokens.", itl_);
  hist("vllm:e2e_request_latency_seconds", "End-to-end request latency.", e2e_);
  hist("vllm:request_queue_time_seconds", "Time waiting before first scheduled.", queue_);
  hist("vllm:request_prompt_tokens", "Prompt length of finished requests.", prompt_len_);
  hist("vllm:request_generation_tokens", "Generated tokens of finished requests.", gen_len_);
  out +=
      "# HELP llm:http_responses_total HTTP responses by status.\n"
      "# TYPE llm:http_responses_total counter\n";
  for (const auto& [status, n] : http_by_status_) {
    out += "llm:http_responses_total{" + labels + ",status=\"" + std::to_string(status) + "\"} " +
           std::to_string(n) + "\n";
  }
  return out;
}

}  // namespace llm::server
