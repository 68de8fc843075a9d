// The HTTP front end in-process on loopback (stories260K, CPU engine thread), driven by a
// real HTTP client: completions streamed and not, errors, limits, auth, disconnects,
// timeouts, draining, 64 concurrent streams.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "engine/cpu/cpu_executor.h"
#include "engine/loader/make_model.h"
#include "engine/testing/fault_injection.h"
#include "tests/server/http/http_test_fixture.h"
#include "tests/test_util.h"

namespace llm::server {
namespace {

using nlohmann::json;

using testing_http::HttpServerTest;
using testing_http::ModelDir;
using testing_http::ReadStream;

// Sends a POST, reads for `wait`, then hangs up: a client that goes away mid-response.
// `before_hang_up` runs once the response has started, before the socket closes (after it the
// server may cancel the request at once, so what must hold while the client is there is
// checked here).
void PostAndHangUp(int port, const std::string& path, const std::string& body,
                   std::chrono::milliseconds wait,
                   const std::function<void()>& before_hang_up = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: " +
                          "application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\n\r\n" + body;
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::this_thread::sleep_for(wait);
  // The response has started (probes or tokens): a slow (sanitizer) build may take longer
  // than `wait` to get there, so wait for its first bytes, up to a bound.
  timeval timeout{.tv_sec = 5 * test::SlowFactor(), .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char buf[256];
  ASSERT_GT(recv(fd, buf, sizeof(buf), 0), 0);
  if (before_hang_up) before_hang_up();
  close(fd);
}

TEST_F(HttpServerTest, StreamedAndNonStreamedCarryTheSameText) {
  Start();
  auto c = Client();
  const json req = {{"model", "stories260K"},
                    {"prompt", "Once upon a time"},
                    {"max_tokens", 40},
                    {"temperature", 0}};
  auto plain = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  const json r = Body(plain);
  const std::string text = r["choices"][0]["text"];
  EXPECT_EQ(text.rfind(", there was a little girl named Lily.", 0), 0u) << text;
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);
  json streamed_req = req;
  streamed_req["stream"] = true;
  streamed_req["stream_options"] = {{"include_usage", true}};
  auto streamed = c.Post("/v1/completions", streamed_req.dump(), "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  json usage;
  const auto [stream_text, done] = ReadStream(streamed->body, &usage);
  EXPECT_EQ(stream_text, text);
  EXPECT_TRUE(done);
  EXPECT_EQ(usage["completion_tokens"], r["usage"]["completion_tokens"]);
}

// Chat through a real template (Zephyr's, as TinyLlama-Chat ships it) from a model folder's
// tokenizer_config.json: the same text streamed and not, the role first in the stream.
TEST_F(HttpServerTest, ChatCompletionsThroughTheModelsTemplate) {
  test::TempDir dir;
  json config =
      json::parse(test::ReadFile(test::SharedDir() / "models/stories260K/tokenizer_config.json"));
  config["chat_template"] =
      test::ReadFile(test::SourceDir() / "tests/data/chat_templates/zephyr-7b-beta.jinja");
  test::WriteFile(dir.path() / "tokenizer_config.json", config.dump());
  Start({}, {.num_kv_blocks = 256}, false, MakeChatRenderer(dir.path().string(), *tokenizer_));
  auto c = Client();
  json req = {{"messages",
               {{{"role", "system"}, {"content", "You tell stories."}},
                {{"role", "user"}, {"content", "Tell me a story"}}}},
              {"max_tokens", 20},
              {"temperature", 0}};
  auto plain = c.Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_EQ(plain->status, 200) << plain->body;
  const json r = Body(plain);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  const std::string text = r["choices"][0]["message"]["content"];
  // "<|system|>\nYou tell stories.</s>\n<|user|>\n...": </s> is EOS's id, not text.
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), 20);
  req["stream"] = true;
  auto streamed = c.Post("/v1/chat/completions", req.dump(), "application/json");
  std::string joined, first_role;
  size_t pos = 0;
  while ((pos = streamed->body.find("data: {", pos)) != std::string::npos) {
    const size_t end = streamed->body.find("\n\n", pos);
    const json chunk = json::parse(streamed->body.substr(pos + 6, end - pos - 6));
    pos = end;
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("role") && first_role.empty()) first_role = delta["role"];
    joined += delta.value("content", "");
  }
  EXPECT_EQ(first_role, "assistant");
  EXPECT_EQ(joined, text);
}

TEST_F(HttpServerTest, TokenIdPromptsAndTokenizeRoundTrip) {
  Start();
  auto c = Client();
  auto tok = c.Post("/tokenize", R"({"prompt": "Once upon a time"})", "application/json");
  ASSERT_EQ(tok->status, 200);
  const json ids = Body(tok)["tokens"];
  EXPECT_EQ(ids, json({1, 403, 407, 261, 378}));
  auto by_ids =
      c.Post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0}}.dump(),
             "application/json");
  ASSERT_EQ(by_ids->status, 200) << by_ids->body;
  auto detok = c.Post("/detokenize", json{{"tokens", ids}}.dump(), "application/json");
  EXPECT_EQ(Body(detok)["prompt"], "Once upon a time");
}

TEST_F(HttpServerTest, BadRequestsGetOpenAiShapedErrors) {
  Start({.max_body_bytes = 4096});
  auto c = Client();
  auto expect_error = [](const httplib::Result& r, int status, const std::string& param) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    const json e = json::parse(r->body)["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_TRUE(e.contains("type") && e.contains("param") && e.contains("code"));
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param);
    }
    EXPECT_LT(r->body.size(), 1500u);  // bounded, never the whole input echoed
  };
  expect_error(c.Post("/v1/completions", "{not json", "application/json"), 400, "");
  expect_error(c.Post("/v1/completions", R"({"prompt":"x","top_p":1.5})", "application/json"), 400,
               "top_p");
  expect_error(c.Post("/v1/completions", R"({"prompt":"x","max_tokens":-1})", "application/json"),
               400, "max_tokens");
  expect_error(
      c.Post("/v1/completions", R"({"prompt":"x","max_tokens":100000})", "application/json"), 400,
      "max_tokens");
  expect_error(c.Post("/v1/completions", R"({"prompt":"x","n":"two"})", "application/json"), 400,
               "n");
  expect_error(c.Post("/v1/completions", R"({"max_tokens":3})", "application/json"), 400, "prompt");
  expect_error(c.Post("/v1/completions", R"({"prompt":[1, 99999]})", "application/json"), 400,
               "prompt");
  expect_error(c.Post("/v1/completions", std::string(8000, ' '), "application/json"), 413, "");
  expect_error(c.Get("/v1/completions"), 405, "");
  expect_error(c.Get("/v2/nothing"), 404, "");
  expect_error(c.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})",
                      "application/json"),
               400, "messages");
}

TEST_F(HttpServerTest, ApiKeyGuardsEverythingButHealth) {
  Start({.api_key = "sekret"});
  auto c = Client();
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(json::parse(c.Get("/metrics")->body)["error"]["code"], "invalid_api_key");
  httplib::Headers auth = {{"Authorization", "Bearer sekret"}};
  EXPECT_EQ(c.Get("/v1/models", auth)->status, 200);
  httplib::Headers wrong = {{"Authorization", "Bearer nope"}};
  EXPECT_EQ(c.Post("/v1/completions", wrong, R"({"prompt":"x"})", "application/json")->status, 401);
}

TEST_F(HttpServerTest, TimeoutFinishesWithReasonTimeout) {
  Start();
  auto c = Client();
  auto r = c.Post("/v1/completions",
                  R"({"prompt":"Once","max_tokens":400,"ignore_eos":true,"timeout":0.01})",
                  "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Body(r)["choices"][0]["finish_reason"], "timeout");
  EXPECT_TRUE(AllBlocksFreeWithin(std::chrono::seconds(2)));
}

// A client that goes away mid-generation, streamed or not: the request is cancelled and its
// KV blocks are freed (watched through the engine's KV usage).
TEST_F(HttpServerTest, DisconnectCancelsAndFreesBlocks) {
  Start({.probe_interval_seconds = 0.01}, {.num_kv_blocks = 256}, /*slow=*/true);
  for (const bool stream : {true, false}) {
    const json req = {{"prompt", "Once upon a time"},
                      {"max_tokens", 3000},
                      {"ignore_eos", true},
                      {"stream", stream}};
    // Checked while the client is still connected: once it hangs up the server may cancel the
    // request before this thread runs again (seen in CI under load).
    PostAndHangUp(port_, "/v1/completions", req.dump(), std::chrono::milliseconds(200), [&] {
      const EngineStats st = engine_->Stats();
      EXPECT_GT(st.num_running + st.num_waiting, 0) << "still in the engine when the client left";
    });
    EXPECT_TRUE(AllBlocksFreeWithin(std::chrono::seconds(2))) << "stream=" << stream;
  }
  const std::string metrics = Client().Get("/metrics")->body;
  EXPECT_NE(metrics.find("finished_reason=\"abort\"} 2"), std::string::npos) << metrics;
}

// The same during a long prefill (2,000 prompt tokens in 16-token chunks): nothing but
// probes has been written when the client leaves, and the request is still prefilling.
TEST_F(HttpServerTest, DisconnectDuringPrefillCancelsAndFreesBlocks) {
  Start({.probe_interval_seconds = 0.01}, {.num_kv_blocks = 256, .max_num_batched_tokens = 16},
        /*slow=*/true);
  json prompt = json::array();
  for (int i = 0; i < 2000; ++i) prompt.push_back(3 + i % 500);
  for (const bool stream : {true, false}) {
    const json req = {{"prompt", prompt}, {"max_tokens", 8}, {"stream", stream}};
    PostAndHangUp(port_, "/v1/completions", req.dump(), std::chrono::milliseconds(100));
    const EngineStats s = engine_->Stats();
    EXPECT_EQ(s.num_generated_tokens, 0) << "the prompt should still be prefilling";
    EXPECT_TRUE(AllBlocksFreeWithin(std::chrono::seconds(2))) << "stream=" << stream;
  }
}

TEST_F(HttpServerTest, OverloadGets429WithRetryAfter) {
  limits_.max_queued_requests = 0;
  Start({}, {.num_kv_blocks = 256, .max_num_seqs = 1}, /*slow=*/true);
  std::thread slow([this] {
    // Busy for the whole test; a sanitizer build's slower steps need fewer tokens for that.
    const json req = {
        {"prompt", "Once"}, {"max_tokens", test::Scaled(600, 150)}, {"ignore_eos", true}};
    httplib::Client c("127.0.0.1", port_);
    c.Post("/v1/completions", req.dump(), "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100 * test::SlowFactor()));
  auto r = Client().Post("/v1/completions", R"({"prompt":"x","max_tokens":2})", "application/json");
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  slow.join();
}

TEST_F(HttpServerTest, DrainingRefusesNewWorkAndFinishesOld) {
  Start();
  std::string old_status;
  std::thread inflight([&] {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Post("/v1/completions", R"({"prompt":"Once","max_tokens":200,"ignore_eos":true})",
                    "application/json");
    old_status = r ? std::to_string(r->status) : "none";
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30 * test::SlowFactor()));
  server_->BeginDrain();
  auto c = Client();
  EXPECT_EQ(c.Get("/health")->status, 503);
  EXPECT_EQ(c.Post("/v1/completions", R"({"prompt":"x"})", "application/json")->status, 503);
  inflight.join();
  EXPECT_EQ(old_status, "200");
}

TEST_F(HttpServerTest, SixtyFourConcurrentStreamsAllComplete) {
  Start({}, {.num_kv_blocks = 512, .max_num_seqs = 64});
  const char* prompts[] = {"Once upon a time", "The little dog", "Tom had a", "Lily saw"};
  std::vector<std::string> expected;
  for (const char* p : prompts) {
    auto r = Client().Post("/v1/completions",
                           json{{"prompt", p}, {"max_tokens", 24}, {"temperature", 0}}.dump(),
                           "application/json");
    expected.push_back(Body(r)["choices"][0]["text"]);
  }
  std::vector<std::string> got(64);
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", port_);
      c.set_read_timeout(60, 0);
      json req = {
          {"prompt", prompts[i % 4]}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}};
      auto r = c.Post("/v1/completions", req.dump(), "application/json");
      if (r && r->status == 200) {
        got[static_cast<size_t>(i)] = ReadStream(r->body).first;
      } else {
        got[static_cast<size_t>(i)] = r ? "status " + std::to_string(r->status) + " " + r->body
                                        : "error " + httplib::to_string(r.error());
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], expected[i % 4]) << i;
  EXPECT_TRUE(AllBlocksFreeWithin(std::chrono::seconds(2)) ||
              engine_->Stats().num_cached_kv_blocks > 0);
  const std::string metrics = Client().Get("/metrics")->body;
  for (const char* name : {"vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_running",
                           "vllm:e2e_request_latency_seconds_count", "vllm:kv_cache_usage_perc",
                           "vllm:generation_tokens_total"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name;
  }
}

// The `data:` payloads of an SSE body, in order.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

// Sends a POST on a raw socket and returns every byte the server sends until it closes.
std::string RawPost(int port, const std::string& path, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string req =
      "POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
      "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  EXPECT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  timeval timeout{.tv_sec = 60, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(fd);
  return got;
}

constexpr int kPoison = 7;  // a byte-fallback piece: in no test prompt, never sampled here

// A step that throws (an out-of-memory step): the request in it gets a 500 with an OpenAI
// error body, or in a stream an error event and a clean [DONE]; the server goes on serving
// (the next request's text is the usual one), /health stays 200, the metrics count it.
TEST_F(HttpServerTest, FailedStepGives5xxAndTheServerGoesOn) {
  StartFaulty({.fail_on_token = kPoison});
  auto c = Client();
  const json poisoned = {{"prompt", {1, 403, 407, kPoison}}, {"max_tokens", 8}};
  auto plain = c.Post("/v1/completions", poisoned.dump(), "application/json");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 500) << plain->body;
  const json e = Body(plain)["error"];
  EXPECT_NE(e["message"].get<std::string>().find("the model step running this request failed"),
            std::string::npos)
      << e;
  EXPECT_EQ(e["type"], "server_error");
  EXPECT_EQ(e["code"], "engine_step_failed");
  EXPECT_TRUE(e.contains("param"));

  json streamed_req = poisoned;
  streamed_req["stream"] = true;
  auto streamed = c.Post("/v1/completions", streamed_req.dump(), "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  const std::vector<std::string> events = SseData(streamed->body);
  ASSERT_EQ(events.size(), 2u) << streamed->body;
  const json event = json::parse(events[0]);
  EXPECT_EQ(event["error"]["code"], "engine_step_failed") << event;
  EXPECT_TRUE(event["error"]["message"].is_string());
  EXPECT_EQ(events[1], "[DONE]");

  auto next =
      c.Post("/v1/completions",
             json{{"prompt", "Once upon a time"}, {"max_tokens", 20}, {"temperature", 0}}.dump(),
             "application/json");
  ASSERT_EQ(next->status, 200) << next->body;
  const std::string text = Body(next)["choices"][0]["text"];
  EXPECT_EQ(text.rfind(", there was a little girl named Lily.", 0), 0u) << text;
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_TRUE(AllBlocksFreeWithin(std::chrono::seconds(2 * test::SlowFactor())));
  const std::string metrics = c.Get("/metrics")->body;
  for (const char* line :
       {"llm:engine_failed_steps_total{model_name=\"stories260K\"} 2",
        "llm:engine_failed_requests_total{model_name=\"stories260K\"} 2",
        "llm:engine_isolated_retries_total{model_name=\"stories260K\"} 0",
        "llm:engine_healthy{model_name=\"stories260K\"} 1", "finished_reason=\"error\"} 2",
        "llm:http_responses_total{model_name=\"stories260K\",status=\"500\"} 1"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "\n" << metrics;
  }
}

// A non-streamed request whose step fails after its 200 went out (the status is held back
// one probe interval, 10 ms here; the failure comes ~50 steps in): the error object is sent
// and the chunked body is cut off (no last chunk), so no client takes it for a success.
TEST_F(HttpServerTest, NonStreamedFailureAfterTheStatusBreaksTheBody) {
  StartFaulty({.fail_steps = {50}}, {.probe_interval_seconds = 0.01}, /*slow=*/true);
  const std::string raw = RawPost(
      port_, "/v1/completions",
      json{{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}}.dump());
  EXPECT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw.substr(0, 200);
  EXPECT_NE(raw.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(raw.find("\"engine_step_failed\""), std::string::npos) << raw;
  EXPECT_EQ(raw.find("\r\n0\r\n\r\n"), std::string::npos) << "the body must not end cleanly";
  EXPECT_TRUE(AllBlocksFreeWithin(std::chrono::seconds(2 * test::SlowFactor())));
}

// A fatal failure (a sticky CUDA error): /health turns 503 (an orchestrator restarts the
// process), the failed request and every new one get a 503 in OpenAI's shape.
TEST_F(HttpServerTest, FatalStepFailureTurnsHealthAndNewRequestsTo503) {
  StartFaulty({.fail_on_token = kPoison, .kind = FaultPlan::Kind::kFatal});
  auto c = Client();
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto failed =
      c.Post("/v1/completions", json{{"prompt", {1, 403, kPoison}}, {"max_tokens", 8}}.dump(),
             "application/json");
  EXPECT_EQ(failed->status, 503) << failed->body;
  EXPECT_EQ(Body(failed)["error"]["code"], "engine_unhealthy");
  auto health = c.Get("/health");
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(Body(health)["status"], "unhealthy");
  EXPECT_NE(Body(health)["reason"].get<std::string>().find("fatal"), std::string::npos);
  for (const bool stream : {false, true}) {
    auto refused =
        c.Post("/v1/completions",
               json{{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"stream", stream}}.dump(),
               "application/json");
    EXPECT_EQ(refused->status, 503) << refused->body;
    EXPECT_EQ(Body(refused)["error"]["code"], "engine_unhealthy");
    EXPECT_EQ(Body(refused)["error"]["type"], "server_error");
  }
  EXPECT_NE(c.Get("/metrics")->body.find("llm:engine_healthy{model_name=\"stories260K\"} 0"),
            std::string::npos);
  EXPECT_TRUE(AllBlocksFreeWithin(std::chrono::seconds(2 * test::SlowFactor())));
}

}  // namespace
}  // namespace llm::server
