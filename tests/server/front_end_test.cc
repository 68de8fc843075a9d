// The HTTP and the gRPC front ends over one engine and one FrontEnd (server/front_end.h), as
// `llm serve` runs them, driven by a real HTTP client and a real gRPC client: gRPC calls are
// counted in GET /metrics, and requests of either front end hold admission slots that the
// other's requests are refused for (429 over HTTP, RESOURCE_EXHAUSTED over gRPC).
#include "server/front_end.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <thread>

#include "engine/cpu/cpu_executor.h"
#include "llm.grpc.pb.h"
#include "server/grpc/grpc_server.h"
#include "server/http/http_server.h"
#include "tests/test_util.h"

namespace llm::server {
namespace {

using nlohmann::json;

TEST(FrontEndAdmissionTest, AdmitsUpToTheLimitsAndSlotsGiveTheirRoomBack) {
  const Engine engine(test::StoriesModel(), test::StoriesTokenizer(),
                      EngineConfig{.num_kv_blocks = 16, .max_num_seqs = 2});
  FrontEnd front_end(engine, "m", {.max_queued_requests = 1, .max_queued_prompt_tokens = 100});
  AdmissionSlot a = front_end.Admit(10), b = front_end.Admit(10), c = front_end.Admit(10);
  EXPECT_TRUE(a && b && c);  // 2 running + 1 queued
  EXPECT_FALSE(front_end.Admit(1));
  EXPECT_EQ(front_end.num_in_flight(), 3);  // the refused request took nothing
  AdmissionSlot moved = std::move(c);
  EXPECT_FALSE(c);
  moved.Release();
  moved.Release();  // once only
  EXPECT_EQ(front_end.num_in_flight(), 2);
  EXPECT_FALSE(front_end.Admit(81)) << "10 + 10 + 81 prompt tokens > 100";
  AdmissionSlot d = front_end.Admit(80);
  EXPECT_TRUE(d);
  a = AdmissionSlot();  // assigning over a slot gives its room back
  EXPECT_EQ(front_end.num_in_flight(), 2);
}

// Every step takes 5 ms more than the model's: a request with many tokens to go holds its
// admission slot while the test sends others beside it.
class SlowExecutor final : public ForwardingExecutor {
 public:
  using ForwardingExecutor::ForwardingExecutor;
  std::vector<SampleResult> ForwardAndSample(const ForwardBatch& batch,
                                             std::span<const SampleTask> tasks) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return ForwardingExecutor::ForwardAndSample(batch, tasks);
  }
};

// Sends a streamed completion on a raw socket and returns the socket once the response has
// started (its first bytes came): the request is admitted and generating until it is closed.
int OpenHttpStream(int port, const json& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string payload = body.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: " +
                          std::string("application/json\r\nContent-Length: ") +
                          std::to_string(payload.size()) + "\r\n\r\n" + payload;
  EXPECT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  timeval timeout{.tv_sec = 10 * test::SlowFactor(), .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char buf[256];
  EXPECT_GT(recv(fd, buf, sizeof(buf), 0), 0);
  return fd;
}

class HttpAndGrpcTest : public ::testing::Test {
 protected:
  // Both servers over one engine (one running sequence at most) and one front end.
  void Start(AdmissionLimits limits) {
    auto cpu = std::make_unique<CpuExecutor>(test::StoriesModel(), 256, 16);
    engine_ = std::make_unique<Engine>(std::make_unique<SlowExecutor>(std::move(cpu)),
                                       test::StoriesTokenizer(), EngineConfig{.max_num_seqs = 1});
    const ModelConfig& model = test::StoriesModel().config();
    const ModelInfo info{"stories260K", model.max_position_embeddings, model.vocab_size};
    front_end_ = std::make_unique<FrontEnd>(*engine_, info.id, limits);
    http_ = std::make_unique<HttpServer>(*engine_, *front_end_, test::StoriesTokenizer(), info,
                                         ServerConfig{.port = 0, .probe_interval_seconds = 0.01});
    http_port_ = http_->Bind();
    grpc_ = std::make_unique<GrpcServer>(*engine_, *front_end_, test::StoriesTokenizer(), info,
                                         GrpcConfig{.port = 0});
    const int grpc_port = grpc_->Start();
    engine_->Start();
    http_thread_ = std::thread([this] { http_->Serve(); });
    stub_ = v1::Llm::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port),
                                                 grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (grpc_) grpc_->Stop();
    if (http_) http_->Stop();
    if (http_thread_.joinable()) http_thread_.join();
    if (engine_) engine_->Stop();
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", http_port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  // Runs a Generate call to its end: its status and how many tokens it streamed.
  std::pair<grpc::Status, int> Generate(const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse msg;
    int num_tokens = 0;
    while (reader->Read(&msg)) num_tokens += msg.token_ids_size();
    return {reader->Finish(), num_tokens};
  }
  // Waits until no request of either front end holds an admission slot.
  bool NothingInFlightWithin(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (front_end_->num_in_flight() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  static v1::GenerateRequest GrpcRequest(int max_tokens) {
    v1::GenerateRequest req;
    req.set_text("Once upon a time");  // 5 prompt tokens
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    return req;
  }
  // A streamed completion that generates for seconds (480 tokens, 5 ms each at least).
  static json LongHttpRequest() {
    return {{"prompt", "Once upon a time"},
            {"max_tokens", 480},
            {"ignore_eos", true},
            {"stream", true}};
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<FrontEnd> front_end_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<GrpcServer> grpc_;
  std::thread http_thread_;
  int http_port_ = 0;
  std::unique_ptr<v1::Llm::Stub> stub_;
};

// A finished gRPC stream and a cancelled one are in GET /metrics: request counts by finish
// reason, time to first token, end-to-end latency, lengths; an HTTP request adds to the same.
TEST_F(HttpAndGrpcTest, GrpcCallsAreCountedInTheMetrics) {
  Start({});
  const auto [status, num_tokens] = Generate(GrpcRequest(8));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(num_tokens, 8);
  {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, GrpcRequest(480));
    v1::GenerateResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_TRUE(NothingInFlightWithin(std::chrono::seconds(5 * test::SlowFactor())));
  auto c = Client();
  std::string metrics = c.Get("/metrics")->body;
  const std::string labels = "{model_name=\"stories260K\"}";
  for (const std::string& line : std::vector<std::string>{
           "vllm:request_success_total{model_name=\"stories260K\",finished_reason=\"length\"} 1",
           "vllm:request_success_total{model_name=\"stories260K\",finished_reason=\"abort\"} 1",
           "vllm:time_to_first_token_seconds_count" + labels + " 1",  // the abort has no TTFT
           "vllm:e2e_request_latency_seconds_count" + labels + " 2",
           "vllm:request_prompt_tokens_sum" + labels + " 10",
           "vllm:request_generation_tokens_sum" + labels + " 8"}) {
    EXPECT_NE(metrics.find(line + "\n"), std::string::npos) << line << "\n" << metrics;
  }
  EXPECT_EQ(metrics.find("vllm:inter_token_latency_seconds_count" + labels + " 0\n"),
            std::string::npos)
      << "the streamed tokens' gaps are observed";
  auto r =
      c.Post("/v1/completions",
             json{{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"ignore_eos", true}}.dump(),
             "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  metrics = c.Get("/metrics")->body;
  for (const std::string& line : std::vector<std::string>{
           "vllm:request_success_total{model_name=\"stories260K\",finished_reason=\"length\"} 2",
           "vllm:time_to_first_token_seconds_count" + labels + " 2",
           "vllm:request_generation_tokens_sum" + labels + " 12"}) {
    EXPECT_NE(metrics.find(line + "\n"), std::string::npos) << line << "\n" << metrics;
  }
}

// --max-queued-requests 0 with one running sequence: one request at a time, whichever front
// end it came through. An HTTP stream holds the slot: a gRPC call is RESOURCE_EXHAUSTED; once
// the HTTP client has gone, the gRPC call is served.
TEST_F(HttpAndGrpcTest, HttpRequestsHoldTheSlotsGrpcIsAdmittedBy) {
  Start({.max_queued_requests = 0});
  const int fd = OpenHttpStream(http_port_, LongHttpRequest());
  EXPECT_EQ(front_end_->num_in_flight(), 1);
  const auto [refused, num_refused_tokens] = Generate(GrpcRequest(4));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_EQ(num_refused_tokens, 0);
  close(fd);  // the HTTP client leaves: its request is cancelled and its slot goes back
  ASSERT_TRUE(NothingInFlightWithin(std::chrono::seconds(5 * test::SlowFactor())));
  const auto [served, num_tokens] = Generate(GrpcRequest(4));
  EXPECT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(num_tokens, 4);
}

// The reverse: a gRPC stream holds the slot, an HTTP request gets 429 with Retry-After; once
// the gRPC call is cancelled, the HTTP request is served.
TEST_F(HttpAndGrpcTest, GrpcRequestsHoldTheSlotsHttpIsAdmittedBy) {
  Start({.max_queued_requests = 0});
  const json small = {{"prompt", "Once upon a time"}, {"max_tokens", 4}};
  auto c = Client();
  {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, GrpcRequest(480));
    v1::GenerateResponse msg;
    ASSERT_TRUE(reader->Read(&msg));  // admitted and generating
    auto r = c.Post("/v1/completions", small.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 429) << r->body;
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "overloaded");
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_TRUE(NothingInFlightWithin(std::chrono::seconds(5 * test::SlowFactor())));
  auto r = c.Post("/v1/completions", small.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// --max-queued-prompt-tokens counts both front ends' prompts: with 5 of 8 taken by a gRPC
// stream, another 5-token prompt is refused, over HTTP (429) and over gRPC; once the stream
// is gone, it is served.
TEST_F(HttpAndGrpcTest, PromptTokenLimitIsSharedToo) {
  Start({.max_queued_requests = 8, .max_queued_prompt_tokens = 8});
  auto c = Client();
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, GrpcRequest(480));
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  auto r =
      c.Post("/v1/completions", json{{"prompt", "Once upon a time"}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  const auto [refused, num_refused_tokens] = Generate(GrpcRequest(4));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(NothingInFlightWithin(std::chrono::seconds(5 * test::SlowFactor())));
  r = c.Post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 2}}.dump(),
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

}  // namespace
}  // namespace llm::server
