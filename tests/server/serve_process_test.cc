// `llm serve` as a process: the shutdown contract. SIGTERM stops accepting (503), lets the
// in-flight request finish, exits 0; a second signal exits at once.
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

#include "tests/test_util.h"

namespace {

struct Process {
  pid_t pid = -1;
  int port = 0;
};

// Starts `llm serve` on free ports and waits for its "listening on" log line.
Process StartServer() {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const std::string llm = (llm::test::BuildDir() / "llm").string();
  const std::string model = (llm::test::SharedDir() / "models" / "stories260K").string();
  Process p;
  p.pid = fork();
  if (p.pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    execl(llm.c_str(), llm.c_str(), "serve", "--model", model.c_str(), "--port", "0", "--grpc-port",
          "0", "--shutdown-timeout", "20", "--kv-cache-mb", "64", static_cast<char*>(nullptr));
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
    c2.set_read_timeout(30, 0);
    auto r = c2.Post("/v1/completions",
                     R"({"prompt":"Once upon a time","max_tokens":500,"ignore_eos":true,"n":16})",
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
  EXPECT_EQ(WaitExit(p.pid, std::chrono::seconds(20)), 0);
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

}  // namespace
