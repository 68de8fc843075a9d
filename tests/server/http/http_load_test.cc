// The event-driven HTTP front end under load and abuse, in-process on loopback: thousands of
// concurrent streams from one client thread (asio), idle sockets, slow heads and bodies, a
// client that stops reading, the connection limit, size limits, 100-continue, HEAD.
#include <sys/resource.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include "tests/server/http/http_test_fixture.h"

namespace llm::server {
namespace {

using nlohmann::json;
using testing_http::ConnectLoopback;
using testing_http::HttpServerTest;
using testing_http::ReadStream;
namespace asio = boost::asio;
using SteadyClock = std::chrono::steady_clock;

// Raw HTTP exchanges on many sockets at once, from one thread: each connects, sends its
// bytes and reads until the server closes. Returns every response as received ("" when the
// connection failed).
std::vector<std::string> RunConcurrently(int port, const std::vector<std::string>& requests) {
  struct Exchange {
    explicit Exchange(asio::io_context& ioc) : socket(ioc) {}
    void Read() {
      socket.async_read_some(asio::buffer(buf), [this](boost::system::error_code ec, size_t n) {
        response.append(buf.data(), n);
        if (!ec) Read();
      });
    }
    asio::ip::tcp::socket socket;
    std::string response;
    std::array<char, 16384> buf;
  };
  asio::io_context ioc;
  const asio::ip::tcp::endpoint server(asio::ip::make_address("127.0.0.1"),
                                       static_cast<uint16_t>(port));
  std::vector<std::unique_ptr<Exchange>> exchanges;
  for (const std::string& request : requests) {
    exchanges.push_back(std::make_unique<Exchange>(ioc));
    Exchange* x = exchanges.back().get();
    x->socket.async_connect(server, [x, &request](boost::system::error_code ec) {
      if (ec) return;
      asio::async_write(x->socket, asio::buffer(request),
                        [x](boost::system::error_code write_ec, size_t) {
                          if (!write_ec) x->Read();
                        });
    });
  }
  ioc.run();
  std::vector<std::string> out;
  for (auto& x : exchanges) out.push_back(std::move(x->response));
  return out;
}

std::string PostRequest(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// The body of a raw HTTP/1.1 response, de-chunked when it was sent chunked.
std::string BodyOf(const std::string& raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return "";
  std::string head = raw.substr(0, head_end);
  std::transform(head.begin(), head.end(), head.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  std::string body = raw.substr(head_end + 4);
  if (head.find("transfer-encoding: chunked") == std::string::npos) return body;
  std::string out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t len = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    if (len == 0) break;
    out += body.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return out;
}

// The soft file limit raised to the hard one; false when that is still below `needed`.
bool RaiseFileLimit(rlim_t needed) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur >= needed;
}

// Reads from `fd` until the peer closes or `limit` passes: what came, and whether it closed.
std::pair<std::string, bool> ReadUntilClosed(int fd, std::chrono::milliseconds limit) {
  timeval timeout{.tv_sec = 0, .tv_usec = 50'000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const auto end = SteadyClock::now() + limit;
  std::string got;
  char buf[4096];
  while (SteadyClock::now() < end) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return {got, true};
    if (n > 0) {
      got.append(buf, static_cast<size_t>(n));
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return {got, true};  // reset
    }
  }
  return {got, false};
}

class HttpLoadTest : public HttpServerTest {};

// 2,000 streams at once (a sanitizer build: 400) from one client thread: every one completes
// with the text of the same request run alone, and the server holds them with a handful of
// threads (the thread-per-stream server had one per stream, and the engine saw at most 128).
TEST_F(HttpLoadTest, TwoThousandConcurrentStreamsMatchTheirSoloText) {
  const int n = test::Scaled(2000, 400);
  ASSERT_TRUE(RaiseFileLimit(static_cast<rlim_t>(2 * n + 256)))
      << "the test needs " << 2 * n + 256 << " file descriptors (ulimit -Hn)";
  limits_.max_queued_requests = 2 * n;
  Start({}, {.num_kv_blocks = 4096, .max_num_seqs = 256});
  const char* prompts[] = {"Once upon a time", "The little dog", "Tom had a", "Lily saw",
                           "One day, a",       "The sun was",    "Sam and",   "In the park"};
  auto request = [](const char* prompt) {
    return json{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"stream", true}}
        .dump();
  };
  std::vector<std::string> solo;
  for (const char* p : prompts) {
    const std::string raw = RunConcurrently(port_, {PostRequest("/v1/completions", request(p))})[0];
    const auto [text, done] = ReadStream(BodyOf(raw));
    ASSERT_TRUE(done) << raw.substr(0, 300);
    solo.push_back(text);
  }
  std::vector<std::string> requests;
  for (int i = 0; i < n; ++i)
    requests.push_back(PostRequest("/v1/completions", request(prompts[i % 8])));
  std::atomic<bool> running{true};
  std::atomic<int> max_threads{0}, max_running{0};
  std::thread watcher([&] {
    while (running) {
      max_threads = std::max(max_threads.load(), test::ThreadsOfThisProcess());
      max_running =
          std::max<int>(max_running.load(), static_cast<int>(engine_->Stats().num_running));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const std::vector<std::string> responses = RunConcurrently(port_, requests);
  running = false;
  watcher.join();
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    const auto [text, done] = ReadStream(BodyOf(responses[i]));
    if (!done || text != solo[i % 8]) {
      if (++mismatches <= 3) {
        ADD_FAILURE() << "request " << i << ": " << responses[i].substr(0, 300);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(max_running.load(), 128) << "more requests running than the old 128-thread pool held";
  // The engine's OpenMP team, 4 I/O + 2 parse threads, this test's own: far fewer than n.
  EXPECT_LT(max_threads.load(), 64) << "threads seen while " << n << " streams were open";
}

// With 1,000 sockets open and silent, /health (a new connection each time, as a kubelet
// probe) answers within 100 ms at p99: idle sockets cost no thread.
TEST_F(HttpLoadTest, HealthAnswersWithAThousandIdleSocketsOpen) {
  ASSERT_TRUE(RaiseFileLimit(2400)) << "the test needs 2,400 file descriptors (ulimit -Hn)";
  Start({.header_timeout_seconds = 600});
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    const int fd = ConnectLoopback(port_);
    ASSERT_GE(fd, 0) << i;
    idle.push_back(fd);
  }
  const auto until = SteadyClock::now() + std::chrono::seconds(10);
  while (server_->num_connections() < 1000 && SteadyClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->num_connections(), 1000);
  std::vector<double> ms;
  for (int i = 0; i < 200; ++i) {
    const auto start = SteadyClock::now();
    auto r = Client().Get("/health");
    ms.push_back(std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms[ms.size() * 99 / 100], 100.0) << "p99 of 200 probes, ms (p50 " << ms[100] << ")";
  for (int fd : idle) close(fd);
}

// Slowloris: a connection that never finishes its head is closed after the head deadline,
// from its first byte however slowly it drips; so is one that sends nothing, a keep-alive
// connection left idle, and a body that stops arriving.
TEST_F(HttpLoadTest, SlowHeadsIdleConnectionsAndStalledBodiesAreClosed) {
  Start({.header_timeout_seconds = 0.3, .body_timeout_seconds = 0.3, .idle_timeout_seconds = 0.3});
  const int silent = ConnectLoopback(port_);
  const int partial = ConnectLoopback(port_);
  const std::string head_start = "GET /health HTTP/1.1\r\nHost: x\r\n";
  ASSERT_EQ(send(partial, head_start.data(), head_start.size(), 0), ssize_t(head_start.size()));
  const int drip = ConnectLoopback(port_);
  const int stalled_body = ConnectLoopback(port_);
  const std::string body_start =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
  ASSERT_GT(send(stalled_body, body_start.data(), body_start.size(), 0), 0);
  const auto start = SteadyClock::now();
  std::thread dripper([drip] {
    for (char c :
         std::string("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")) {
      if (send(drip, &c, 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  for (int fd : {silent, partial, drip, stalled_body}) {
    const auto [got, closed] = ReadUntilClosed(fd, std::chrono::seconds(5 * test::SlowFactor()));
    EXPECT_TRUE(closed) << "fd " << fd;
    EXPECT_EQ(got, "") << "nothing is answered to an unfinished request";
  }
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(3 * test::SlowFactor()))
      << "the drip's deadline runs from its first byte, not its last";
  dripper.join();
  // Keep-alive: a full request is answered and the connection stays open, then goes idle.
  const int kept = ConnectLoopback(port_);
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(kept, health.data(), health.size(), 0), ssize_t(health.size()));
  const auto [reply, closed] = ReadUntilClosed(kept, std::chrono::seconds(5 * test::SlowFactor()));
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK", 0), 0u) << reply;
  EXPECT_TRUE(closed) << "an idle keep-alive connection is closed after its timeout";
  for (int fd : {silent, partial, drip, stalled_body, kept}) close(fd);
}

// A client that stops reading a long stream (a small receive window, nothing read) is cut
// off at the write deadline: its request is cancelled in the engine and its blocks freed,
// long before the generation would have ended.
TEST_F(HttpLoadTest, ClientThatStopsReadingIsCutOffAndItsBlocksFreed) {
  // 16 choices with 20 logprobs each: ~1.2 KB per token and choice, 8,000 tokens. The kernel's
  // buffers (autotuned, MBs) fill after about half of them; the deadline cuts soon after.
  Start({.write_timeout_seconds = 0.05}, {.num_kv_blocks = 1100, .max_n = 16});
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int window = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &window, sizeof(window));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string req = PostRequest("/v1/completions", json{{"prompt", "Once upon a time"},
                                                              {"max_tokens", 500},
                                                              {"ignore_eos", true},
                                                              {"n", 16},
                                                              {"logprobs", 20},
                                                              {"stream", true}}
                                                             .dump());
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), ssize_t(req.size()));
  const auto until = SteadyClock::now() + std::chrono::seconds(10 * test::SlowFactor());
  while (engine_->Stats().num_running == 0 && SteadyClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GT(engine_->Stats().num_running, 0) << "the request never started";
  EXPECT_TRUE(AllBlocksFreeWithin(std::chrono::seconds(30 * test::SlowFactor())))
      << "the stalled client's request still holds blocks";
  EXPECT_LT(engine_->Stats().num_generated_tokens, 16 * 500) << "cancelled, not finished";
  const std::string metrics = Client().Get("/metrics")->body;
  EXPECT_NE(metrics.find("finished_reason=\"abort\"} 1"), std::string::npos) << metrics;
  const auto [got, closed] = ReadUntilClosed(fd, std::chrono::seconds(10 * test::SlowFactor()));
  EXPECT_TRUE(closed);
  EXPECT_EQ(got.find("data: [DONE]"), std::string::npos) << "the stream was cut, not finished";
  close(fd);
}

// --max-connections: past it, a new connection gets a 503 in OpenAI's shape and is closed;
// once one closes, a new one is served again.
TEST_F(HttpLoadTest, MaxConnectionsAnswers503AndCloses) {
  Start({.header_timeout_seconds = 600, .max_connections = 4});
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(ConnectLoopback(port_));
  const auto until = SteadyClock::now() + std::chrono::seconds(5);
  while (server_->num_connections() < 4 && SteadyClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const int extra = ConnectLoopback(port_);
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  send(extra, health.data(), health.size(), MSG_NOSIGNAL);
  const auto [got, closed] = ReadUntilClosed(extra, std::chrono::seconds(5));
  EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_NE(got.find("\"too_many_connections\""), std::string::npos) << got;
  EXPECT_TRUE(closed);
  close(extra);
  close(held[0]);
  const auto free_until = SteadyClock::now() + std::chrono::seconds(5);
  while (server_->num_connections() >= 4 && SteadyClock::now() < free_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(Client().Get("/health")->status, 200);
  for (size_t i = 1; i < held.size(); ++i) close(held[i]);
}

// A head over --max-header-bytes is a 431 and a declared body over --max-body-bytes a 413
// before its bytes are sent (even with Expect: 100-continue); a body sent after 100 Continue
// is served; HEAD gets the head of GET's response and no body.
TEST_F(HttpLoadTest, SizeLimitsContinueAndHead) {
  Start({.max_body_bytes = 4096});
  const std::string big_header =
      "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') +
      "\r\nConnection: close\r\n\r\n";
  std::string raw = RunConcurrently(port_, {big_header})[0];
  EXPECT_EQ(raw.rfind("HTTP/1.1 431", 0), 0u) << raw.substr(0, 200);
  EXPECT_NE(raw.find("\"header_too_large\""), std::string::npos);
  for (const char* expect : {"", "Expect: 100-continue\r\n"}) {
    const int fd = ConnectLoopback(port_);
    const std::string head = std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\n") + expect +
                             "Content-Length: 1000000\r\n\r\n";
    send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    const auto [got, closed] = ReadUntilClosed(fd, std::chrono::seconds(5));
    EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << expect << got;
    EXPECT_NE(got.find("\"payload_too_large\""), std::string::npos);
    EXPECT_TRUE(closed);
    close(fd);
  }
  const int fd = ConnectLoopback(port_);
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":4,"temperature":0})";
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
      "Connection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  char buf[256];
  timeval timeout{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  send(fd, body.data(), body.size(), MSG_NOSIGNAL);
  const auto [got, closed] = ReadUntilClosed(fd, std::chrono::seconds(10));
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK", 0), 0u) << got;
  const std::string text = json::parse(BodyOf(got))["choices"][0]["text"];
  EXPECT_EQ(text.rfind(", there", 0), 0u) << text;
  close(fd);
  raw = RunConcurrently(port_,
                        {"HEAD /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"})[0];
  EXPECT_EQ(raw.rfind("HTTP/1.1 200 OK", 0), 0u) << raw;
  EXPECT_NE(raw.find("Content-Length: "), std::string::npos) << raw;
  EXPECT_EQ(BodyOf(raw), "") << "HEAD has no body";
}

// The Kubernetes probes: liveness stays 200 while the server is full or draining (restarting it
// would lose its requests); readiness turns 503 when every admission slot is taken or it
// drains, so a Service sends new work to other replicas; /health keeps its old meaning.
TEST_F(HttpLoadTest, LivenessAndReadinessProbes) {
  limits_.max_queued_requests = 0;
  Start({}, {.num_kv_blocks = 256, .max_num_seqs = 1}, /*slow=*/true);
  auto c = Client();
  EXPECT_EQ(c.Get("/health/ready")->status, 200);
  std::thread busy([this] {
    const json req = {
        {"prompt", "Once"}, {"max_tokens", test::Scaled(200, 60)}, {"ignore_eos", true}};
    Client().Post("/v1/completions", req.dump(), "application/json");
  });
  const auto until = SteadyClock::now() + std::chrono::seconds(10 * test::SlowFactor());
  while (!front_end_->at_capacity() && SteadyClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto ready = c.Get("/health/ready");
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(json::parse(ready->body)["status"], "at_capacity");
  EXPECT_EQ(c.Get("/health/live")->status, 200);
  EXPECT_EQ(c.Get("/health")->status, 200);
  server_->BeginDrain();
  EXPECT_EQ(json::parse(c.Get("/health/ready")->body)["status"], "draining");
  EXPECT_EQ(c.Get("/health/live")->status, 200) << "a draining server is alive";
  EXPECT_EQ(c.Get("/health")->status, 503);
  busy.join();
}

}  // namespace
}  // namespace llm::server
