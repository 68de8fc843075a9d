// `llm serve` as a process: the shutdown contract. SIGTERM stops accepting (503), lets the
// in-flight request finish, exits 0; a second signal exits at once. And failed engine steps
// through the test-only hook LLM_TEST_FAIL_FORWARD_ON_TOKEN (server/cli/backend.cc).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/test_util.h"

namespace {

// A started `llm serve`. A test that stops early (a failed ASSERT) must not leave it running:
// it would keep ctest's output pipe open and ctest would wait for it until its timeout.
struct Process {
  pid_t pid = -1;
  int port = 0;
  Process() = default;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  Process(Process&& other) noexcept : pid(std::exchange(other.pid, -1)), port(other.port) {}
  ~Process() {
    if (pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// Starts `llm serve` on free ports (with `env` added to its environment) and waits for its
// "listening on" log line.
// Extra flags: `probe_interval` is --disconnect-probe-interval (a non-streamed request that
// fails within it gets its 5xx status; after it the status is already 200).
Process StartServer(const std::vector<std::pair<std::string, std::string>>& env = {},
                    const char* probe_interval = "1") {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const std::string llm = (llm::test::BuildDir() / "llm").string();
  const std::string model = (llm::test::SharedDir() / "models" / "stories260K").string();
  Process p;
  p.pid = fork();
  if (p.pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    execl(llm.c_str(), llm.c_str(), "serve", "--model", model.c_str(), "--port", "0", "--grpc-port",
          "0", "--shutdown-timeout", "60", "--kv-cache-mb", "64", "--disconnect-probe-interval",
          probe_interval, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  FILE* log = fdopen(fds[0], "r");
  char line[512];
  while (fgets(line, sizeof(line), log) != nullptr) {
    const std::string s = line;
    const size_t at = s.find("listening on http://127.0.0.1:");
    if (at != std::string::npos) {
      p.port = std::stoi(s.substr(at + 30));
      break;
    }
  }
  // Keep draining the log in the background so the server never blocks on stderr.
  std::thread([log] {
    char buf[512];
    while (fgets(buf, sizeof(buf), log) != nullptr) {
    }
    fclose(log);
  }).detach();
  return p;
}

int WaitExit(pid_t pid, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -2;
}

TEST(ServeProcess, SigtermDrainsInFlightThenExitsZero) {
  Process p = StartServer();
  ASSERT_GT(p.port, 0);
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(30, 0);
  ASSERT_EQ(c.Get("/health")->status, 200);
  std::string finish;
  std::thread inflight([&] {
    httplib::Client c2("127.0.0.1", p.port);
    // Long enough to be in flight while /health turns 503 (~0.3 s on an idle 2-core machine),
    // short enough to finish within the drain deadline on a loaded one: 16 × 500 tokens once
    // took more than the 20 s the deadline was with the machine's 2 cores shared by builds.
    c2.set_read_timeout(60, 0);
    auto r = c2.Post("/v1/completions",
                     R"({"prompt":"Once upon a time","max_tokens":300,"ignore_eos":true,"n":4})",
                     "application/json");
    if (r && r->status == 200)
      finish = nlohmann::json::parse(r->body)["choices"][0]["finish_reason"];
  });
  // Signal only once the request is running (a loaded machine may take a while to admit it).
  for (int i = 0; i < 1000; ++i) {
    auto m = c.Get("/metrics");
    if (m && m->body.find("vllm:num_requests_running{model_name=\"stories260K\"} 0") ==
                 std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(p.pid, SIGTERM);
  // Draining: /health turns 503 while the request is still generating.
  int health = 0;
  for (int i = 0; i < 1000 && health != 503; ++i) {
    auto during = c.Get("/health");
    ASSERT_TRUE(during) << "the server must still be up while it drains";
    health = during->status;
    if (health != 503) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(health, 503);
  inflight.join();
  EXPECT_EQ(finish, "length");  // the in-flight request completed normally
  EXPECT_EQ(WaitExit(p.pid, std::chrono::seconds(60)), 0);
}

TEST(ServeProcess, SecondSignalExitsAtOnce) {
  Process p = StartServer();
  ASSERT_GT(p.port, 0);
  std::thread inflight([&] {
    httplib::Client c("127.0.0.1", p.port);
    c.set_read_timeout(5, 0);
    c.Post("/v1/completions", R"({"prompt":"Once","max_tokens":480,"ignore_eos":true,"n":16})",
           "application/json");
  });
  // The request must be in flight before the first signal (slower in a sanitizer build).
  std::this_thread::sleep_for(std::chrono::milliseconds(20 * llm::test::SlowFactor()));
  kill(p.pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill(p.pid, SIGTERM);
  EXPECT_EQ(WaitExit(p.pid, std::chrono::seconds(5)), 1);
  inflight.join();
}

// A step holding the poisoned token throws, as an out-of-memory step would: that request gets
// a 500 in OpenAI's shape (streamed: an error event, then [DONE]); the next request succeeds,
// /health stays 200, and SIGTERM still drains and exits 0.
TEST(ServeProcess, FailedStepGives500AndTheServerGoesOn) {
  // A step slower than the probe interval (a loaded machine) would have sent 200 already.
  Process p = StartServer({{"LLM_TEST_FAIL_FORWARD_ON_TOKEN", "7"}}, "60");
  ASSERT_GT(p.port, 0);
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(30, 0);
  const std::string poisoned = R"({"prompt":[1,403,407,7],"max_tokens":8})";
  auto failed = c.Post("/v1/completions", poisoned, "application/json");
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->status, 500) << failed->body;
  const nlohmann::json error = nlohmann::json::parse(failed->body)["error"];
  EXPECT_EQ(error["code"], "engine_step_failed");
  EXPECT_NE(error["message"].get<std::string>().find("injected failure"), std::string::npos);
  auto streamed =
      c.Post("/v1/completions", R"({"prompt":[1,403,407,7],"max_tokens":8,"stream":true})",
             "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  EXPECT_NE(streamed->body.find("data: {\"error\":"), std::string::npos) << streamed->body;
  EXPECT_TRUE(streamed->body.ends_with("\n\ndata: [DONE]\n\n")) << streamed->body;
  auto ok =
      c.Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":16,"temperature":0})",
             "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  const std::string text = nlohmann::json::parse(ok->body)["choices"][0]["text"];
  EXPECT_EQ(text.rfind(", there was a little girl named Lily.", 0), 0u) << text;
  EXPECT_EQ(c.Get("/health")->status, 200);
  kill(p.pid, SIGTERM);
  EXPECT_EQ(WaitExit(p.pid, std::chrono::seconds(20)), 0);
}

// LLM_TEST_FAIL_FORWARD_FATAL=1: the failure is fatal (a sticky CUDA error): /health turns
// 503 so that an orchestrator restarts the process, and new requests get 503s.
TEST(ServeProcess, FatalStepFailureTurnsHealth503) {
  Process p = StartServer(
      {{"LLM_TEST_FAIL_FORWARD_ON_TOKEN", "7"}, {"LLM_TEST_FAIL_FORWARD_FATAL", "1"}}, "60");
  ASSERT_GT(p.port, 0);
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(30, 0);
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto failed =
      c.Post("/v1/completions", R"({"prompt":[1,403,7],"max_tokens":8})", "application/json");
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->status, 503) << failed->body;
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(nlohmann::json::parse(health->body)["status"], "unhealthy");
  auto refused = c.Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":4})",
                        "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(nlohmann::json::parse(refused->body)["error"]["code"], "engine_unhealthy");
  kill(p.pid, SIGTERM);
  EXPECT_EQ(WaitExit(p.pid, std::chrono::seconds(20)), 0);
}

}  // namespace
