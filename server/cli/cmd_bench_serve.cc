// `llm bench-serve --url URL [--dataset random|FILE.jsonl] [--num-prompts N]
//                  [--request-rate R] [--max-concurrency C] [--input-len L] [--output-len L]`
// A serving benchmark like `vllm bench serve`: requests arrive as a Poisson process of rate R
// (inf = all at once), at most C in flight, each a streamed /v1/completions; it reports TTFT,
// time per output token (TPOT), inter-token latency (ITL) and end-to-end latency (mean, p50,
// p90, p99) with request and token throughput, as text and JSON. While it runs it probes
// /health (its latency on a new connection, as a Kubernetes probe) and samples /metrics'
// running and waiting request gauges.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/error.h"
#include "server/cli/commands.h"

namespace llm::cli {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

struct BenchServeFlags {
  std::string url = "http://127.0.0.1:8000";
  std::string model;
  std::string dataset = "random";
  int num_prompts = 100;
  double request_rate = std::numeric_limits<double>::infinity();
  int max_concurrency = 64;
  int input_len = 128, output_len = 128;
  uint64_t seed = 0;
  std::string json_out;
  std::string api_key;
  double probe_interval = 0.25;  // /health and /metrics sampling during the run (0: off)
};

// What a probe saw while the benchmark ran: /health latency on a new connection each time
// (as a Kubernetes probe connects), and the server's running / waiting request gauges.
struct ProbeSamples {
  std::vector<double> health_latency;
  int64_t health_failures = 0;  // not 200 within 10 s
  std::vector<double> running, waiting;
};

// The value of the first sample of `name` in Prometheus text, or -1.
double GaugeValue(const std::string& text, const std::string& name) {
  size_t at = 0;
  while ((at = text.find(name, at)) != std::string::npos) {
    const bool line_start = at == 0 || text[at - 1] == '\n';
    const size_t after = at + name.size();
    at = after;
    if (!line_start || after >= text.size() || (text[after] != '{' && text[after] != ' ')) continue;
    const size_t space = text.find(' ', text[after] == '{' ? text.find('}', after) : after);
    if (space == std::string::npos) return -1;
    return std::atof(text.c_str() + space + 1);
  }
  return -1;
}

void Probe(const BenchServeFlags& f, const std::atomic<bool>& stop, ProbeSamples* out) {
  const auto interval = std::chrono::duration<double>(f.probe_interval);
  while (!stop.load()) {
    const auto start = SteadyClock::now();
    {
      httplib::Client health(f.url);
      health.set_connection_timeout(10, 0);
      health.set_read_timeout(10, 0);
      auto r = health.Get("/health");
      const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
      if (r && r->status == 200) {
        out->health_latency.push_back(seconds);
      } else {
        ++out->health_failures;
      }
    }
    httplib::Client metrics(f.url);
    metrics.set_read_timeout(10, 0);
    httplib::Headers headers;
    if (!f.api_key.empty()) headers.emplace("Authorization", "Bearer " + f.api_key);
    if (auto m = metrics.Get("/metrics", headers); m && m->status == 200) {
      out->running.push_back(GaugeValue(m->body, "vllm:num_requests_running"));
      out->waiting.push_back(GaugeValue(m->body, "vllm:num_requests_waiting"));
    }
    std::this_thread::sleep_until(start + interval);
  }
}

struct Result {
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

std::vector<json> MakeRequests(const BenchServeFlags& f) {
  std::vector<json> out;
  if (f.dataset != "random") {  // JSONL: {"prompt": ..., "max_tokens": ...} per line
    std::ifstream in(f.dataset);
    if (!in) throw Error(f.dataset + ": cannot open");
    std::string line;
    while (std::getline(in, line) && std::ssize(out) < f.num_prompts) {
      if (line.empty()) continue;
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("prompt"))
        throw Error(f.dataset + ": bad line: " + line.substr(0, 80));
      if (!j.contains("max_tokens")) j["max_tokens"] = f.output_len;
      out.push_back(j);
    }
    return out;
  }
  std::mt19937_64 rng(f.seed);
  for (int i = 0; i < f.num_prompts; ++i) {
    json ids = json::array();
    for (int k = 0; k < f.input_len; ++k)
      ids.push_back(std::uniform_int_distribution<int>(3, 400)(rng));
    out.push_back({{"prompt", ids}, {"max_tokens", f.output_len}, {"ignore_eos", true}});
  }
  return out;
}

// Parses the SSE events in `buffer` (complete ones), updating the result's timings.
void ConsumeEvents(std::string& buffer, SteadyClock::time_point start,
                   SteadyClock::time_point& last, bool& first, Result& r) {
  size_t pos;
  while ((pos = buffer.find("\n\n")) != std::string::npos) {
    const std::string event = buffer.substr(0, pos);
    buffer.erase(0, pos + 2);
    if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
    const json chunk = json::parse(event.substr(6), nullptr, false);
    if (chunk.is_discarded()) continue;
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      r.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
      r.output_tokens = chunk["usage"].value("completion_tokens", 0);
    }
    if (chunk["choices"].empty() || chunk["choices"][0].value("text", "").empty()) continue;
    const auto now = SteadyClock::now();
    if (first) {
      r.ttft = std::chrono::duration<double>(now - start).count();
      first = false;
    } else {
      r.itl.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
  }
}

Result RunOne(const std::string& url, const std::string& api_key, json body) {
  Result r;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  httplib::Client client(url);
  client.set_read_timeout(600, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);
  const auto start = SteadyClock::now();
  auto last = start;
  bool first = true;
  std::string buffer;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    ConsumeEvents(buffer, start, last, first, r);
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  r.e2e = std::chrono::duration<double>(SteadyClock::now() - start).count();
  r.ok = sent && res.status == 200 && r.output_tokens > 0;
  if (!r.ok) r.error = sent ? "HTTP " + std::to_string(res.status) : httplib::to_string(error);
  return r;
}

json Stats(std::vector<double> v) {
  if (v.empty()) return {{"mean", 0}, {"p50", 0}, {"p90", 0}, {"p99", 0}};
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[std::min(v.size() - 1, size_t(p / 100 * v.size()))]; };
  double sum = 0;
  for (double x : v) sum += x;
  return {{"mean", sum / v.size()}, {"p50", pct(50)}, {"p90", pct(90)}, {"p99", pct(99)}};
}

int RunBenchServe(const BenchServeFlags& f) {
  const std::vector<json> requests = MakeRequests(f);
  std::vector<Result> results(requests.size());
  std::mt19937_64 rng(f.seed + 1);
  std::exponential_distribution<double> gap(std::isinf(f.request_rate) ? 1.0 : f.request_rate);
  std::atomic<int> in_flight{0};
  std::vector<std::thread> threads;
  ProbeSamples probes;
  std::atomic<bool> stop_probe{false};
  std::thread prober;
  if (f.probe_interval > 0)
    prober = std::thread(Probe, std::cref(f), std::cref(stop_probe), &probes);
  const auto start = SteadyClock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!std::isinf(f.request_rate) && i > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(gap(rng)));
    }
    while (in_flight.load() >= f.max_concurrency)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    in_flight += 1;
    threads.emplace_back([&, i] {
      results[i] = RunOne(f.url, f.api_key, requests[i]);
      in_flight -= 1;
    });
  }
  for (auto& t : threads) t.join();
  const double duration = std::chrono::duration<double>(SteadyClock::now() - start).count();
  stop_probe = true;
  if (prober.joinable()) prober.join();
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t ok = 0, in_tokens = 0, out_tokens = 0;
  json errors = json::object();
  for (const Result& r : results) {
    if (!r.ok) {
      errors[r.error] = errors.value(r.error, 0) + 1;
      continue;
    }
    ++ok;
    in_tokens += r.prompt_tokens;
    out_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / double(r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  const json report = {
      {"url", f.url},
      {"num_prompts", requests.size()},
      {"successful_requests", ok},
      {"errors", errors},
      {"request_rate", std::isinf(f.request_rate) ? json("inf") : json(f.request_rate)},
      {"max_concurrency", f.max_concurrency},
      {"duration_s", duration},
      {"request_throughput", ok / duration},
      {"output_token_throughput", out_tokens / duration},
      {"total_token_throughput", (in_tokens + out_tokens) / duration},
      {"total_input_tokens", in_tokens},
      {"total_output_tokens", out_tokens},
      {"ttft_s", Stats(ttft)},
      {"tpot_s", Stats(tpot)},
      {"itl_s", Stats(itl)},
      {"e2el_s", Stats(e2e)},
      {"health_latency_s", Stats(probes.health_latency)},
      {"health_latency_max_s",
       probes.health_latency.empty()
           ? 0.0
           : *std::max_element(probes.health_latency.begin(), probes.health_latency.end())},
      {"health_probes", std::ssize(probes.health_latency) + probes.health_failures},
      {"health_failures", probes.health_failures},
      {"requests_running_max",
       probes.running.empty() ? -1.0
                              : *std::max_element(probes.running.begin(), probes.running.end())},
      {"requests_waiting_max",
       probes.waiting.empty() ? -1.0
                              : *std::max_element(probes.waiting.begin(), probes.waiting.end())}};
  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-40s %d / %zu\n", "Successful requests:", int(ok), requests.size());
  std::printf("%-40s %.2f\n", "Benchmark duration (s):", duration);
  std::printf("%-40s %.2f\n", "Request throughput (req/s):", ok / duration);
  std::printf("%-40s %.2f\n", "Output token throughput (tok/s):", out_tokens / duration);
  std::printf("%-40s %.2f\n",
              "Total token throughput (tok/s):", (in_tokens + out_tokens) / duration);
  for (const char* key : {"ttft_s", "tpot_s", "itl_s", "e2el_s"}) {
    const json& s = report[key];
    std::printf("%-8s mean %8.2f ms  p50 %8.2f ms  p90 %8.2f ms  p99 %8.2f ms\n", key,
                s["mean"].get<double>() * 1e3, s["p50"].get<double>() * 1e3,
                s["p90"].get<double>() * 1e3, s["p99"].get<double>() * 1e3);
  }
  if (f.probe_interval > 0) {
    const json& h = report["health_latency_s"];
    std::printf("%-8s p50 %8.2f ms  p99 %8.2f ms  max %8.2f ms  (%lld probes, %lld failed)\n",
                "health", h["p50"].get<double>() * 1e3, h["p99"].get<double>() * 1e3,
                report["health_latency_max_s"].get<double>() * 1e3,
                static_cast<long long>(report["health_probes"].get<int64_t>()),
                static_cast<long long>(probes.health_failures));
    std::printf("%-40s %.0f / %.0f\n", "Requests running / waiting (max seen):",
                report["requests_running_max"].get<double>(),
                report["requests_waiting_max"].get<double>());
  }
  if (!f.json_out.empty()) std::ofstream(f.json_out) << report.dump(2) << "\n";
  std::printf("JSON %s\n", report.dump().c_str());
  return ok == std::ssize(requests) ? 0 : 1;
}

}  // namespace

Command AddBenchServe(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-serve", "serving benchmark against a running server");
  auto f = std::make_shared<BenchServeFlags>();
  cmd->add_option("--url", f->url, "server base URL")->capture_default_str();
  cmd->add_option("--dataset", f->dataset, "random, or a JSONL file of {prompt, max_tokens}")
      ->capture_default_str();
  cmd->add_option("--num-prompts", f->num_prompts)
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--request-rate", f->request_rate, "requests/s (Poisson); inf = all at once");
  cmd->add_option("--max-concurrency", f->max_concurrency)
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--input-len", f->input_len, "random dataset: prompt tokens")
      ->capture_default_str();
  cmd->add_option("--output-len", f->output_len, "random dataset: output tokens")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed)->capture_default_str();
  cmd->add_option("--json-out", f->json_out, "write the report as JSON");
  cmd->add_option("--api-key", f->api_key)->envname("LLM_API_KEY");
  cmd->add_option("--probe-interval", f->probe_interval,
                  "seconds between /health (latency) and /metrics (running requests) samples "
                  "during the run; 0: none")
      ->capture_default_str();
  return [f] { return RunBenchServe(*f); };
}

}  // namespace llm::cli
