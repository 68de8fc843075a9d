// The gRPC front end in-process with a real gRPC client: token streaming, health, errors,
// cancellation freeing KV blocks, draining.
#include "server/grpc/grpc_server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <future>

#include "engine/cpu/cpu_executor.h"
#include "engine/testing/fault_injection.h"
#include "llm.grpc.pb.h"
#include "tests/test_util.h"

namespace llm::server {
namespace {

class GrpcServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = &test::StoriesModel();
    tokenizer_ = &test::StoriesTokenizer();
  }
  void SetUp() override {
    engine_ = std::make_unique<Engine>(*model_, *tokenizer_, EngineConfig{.num_kv_blocks = 256});
    Serve();
  }
  // Replaces the engine with one whose steps fail as `plan` says
  // (engine/testing/fault_injection.h).
  void RestartFaulty(FaultPlan plan) {
    TearDown();
    server_.reset();  // before the engine and the front end it refers to
    auto cpu = std::make_unique<CpuExecutor>(*model_, 256, 16);
    engine_ = std::make_unique<Engine>(
        std::make_unique<FaultInjectingExecutor>(std::move(cpu), std::move(plan)), *tokenizer_,
        EngineConfig{});
    Serve();
  }
  void Serve(GrpcConfig config = {.port = 0}) {
    front_end_ = std::make_unique<FrontEnd>(*engine_, "stories260K", limits_);
    server_ = std::make_unique<GrpcServer>(*engine_, *front_end_, *tokenizer_,
                                           ModelInfo{"stories260K", 512, 512}, config);
    port_ = server_->Start();
    engine_->Start();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Llm::NewStub(channel_);
  }
  // Runs a Generate call to its end: its status and the text it streamed.
  std::pair<grpc::Status, std::string> Generate(const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse msg;
    std::string text;
    while (reader->Read(&msg)) text += msg.text();
    return {reader->Finish(), text};
  }
  void TearDown() override {
    server_->Stop();
    engine_->Stop();
  }
  // grpc.health.v1.Health/Check for the whole server, through a generic stub: the request
  // is empty; the response's field 1 is the status (1 = SERVING, 2 = NOT_SERVING).
  int HealthStatus() {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    grpc::ByteBuffer request, response;
    grpc::Slice empty("");
    request = grpc::ByteBuffer(&empty, 1);
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) { done.set_value(s); });
    if (!done.get_future().get().ok()) return -1;
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    std::string bytes;
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -2;
  }

  // Replaces the server (and engine) with one made from `config` and `engine_config`.
  void Restart(GrpcConfig config, EngineConfig engine_config) {
    TearDown();
    server_.reset();
    engine_ = std::make_unique<Engine>(*model_, *tokenizer_, engine_config);
    Serve(config);
  }

  static const CpuModel* model_;
  static const Tokenizer* tokenizer_;
  AdmissionLimits limits_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<FrontEnd> front_end_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Llm::Stub> stub_;
  int port_ = 0;
};
const CpuModel* GrpcServerTest::model_ = nullptr;
const Tokenizer* GrpcServerTest::tokenizer_ = nullptr;

TEST_F(GrpcServerTest, StreamsTokensAndFinishesWithUsage) {
  EXPECT_EQ(HealthStatus(), 1);
  v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(24);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::string text;
  int messages = 0, tokens = 0;
  std::string finish;
  while (reader->Read(&msg)) {
    ++messages;
    text += msg.text();
    tokens += msg.token_ids_size();
    if (!msg.finish_reason().empty()) {
      finish = msg.finish_reason();
      EXPECT_EQ(msg.usage().prompt_tokens(), 5);
      EXPECT_EQ(msg.usage().completion_tokens(), 24);
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_GT(messages, 5);  // streamed, not one message
  EXPECT_EQ(tokens, 24);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(text.rfind(", there was a little girl named Lily.", 0), 0u) << text;
}

TEST_F(GrpcServerTest, TokenizeModelInfoAndInvalidArguments) {
  grpc::ClientContext c1;
  v1::TokenizeRequest treq;
  treq.set_text("Once upon a time");
  v1::TokenizeResponse tres;
  ASSERT_TRUE(stub_->Tokenize(&c1, treq, &tres).ok());
  EXPECT_EQ(std::vector<int>(tres.token_ids().begin(), tres.token_ids().end()),
            (std::vector<int>{1, 403, 407, 261, 378}));
  grpc::ClientContext c2;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(stub_->ModelInfo(&c2, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model(), "stories260K");
  EXPECT_EQ(info.kv_cache_tokens(), 256 * 16);
  v1::GenerateRequest bad;
  bad.set_text("x");
  bad.mutable_sampling()->set_top_p(2.0);
  grpc::ClientContext c3;
  auto reader = stub_->Generate(&c3, bad);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("top_p"), std::string::npos);
}

TEST_F(GrpcServerTest, ClientCancellationAbortsAndFreesBlocks) {
  v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.mutable_sampling()->set_max_tokens(500);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  EngineStats s;
  do {
    s = engine_->Stats();
    if (s.num_free_kv_blocks == s.num_kv_blocks && s.num_running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < end);
  EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks);
}

TEST_F(GrpcServerTest, DrainingAnswersUnavailableAndNotServing) {
  server_->BeginDrain();
  EXPECT_EQ(HealthStatus(), 2);
  v1::GenerateRequest req;
  req.set_text("x");
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

constexpr int kPoison = 7;  // a byte-fallback piece: in no test prompt, never sampled here

// A failed step ends its call with INTERNAL and the step's message; the next call streams
// as usual and health stays SERVING. A fatal one: UNAVAILABLE, NOT_SERVING, new calls refused.
TEST_F(GrpcServerTest, FailedStepEndsTheCallWithAnErrorStatus) {
  for (const auto kind : {FaultPlan::Kind::kRuntimeError, FaultPlan::Kind::kFatal}) {
    const bool is_fatal = kind == FaultPlan::Kind::kFatal;
    RestartFaulty({.fail_on_token = kPoison, .kind = kind});
    EXPECT_EQ(HealthStatus(), 1);
    v1::GenerateRequest poisoned;
    for (int id : {1, 403, 407, kPoison}) poisoned.mutable_token_ids()->add_ids(id);
    poisoned.mutable_sampling()->set_max_tokens(8);
    const auto [status, text] = Generate(poisoned);
    EXPECT_EQ(status.error_code(),
              is_fatal ? grpc::StatusCode::UNAVAILABLE : grpc::StatusCode::INTERNAL);
    EXPECT_NE(status.error_message().find("the model step running this request failed"),
              std::string::npos)
        << status.error_message();
    v1::GenerateRequest normal;
    normal.set_text("Once upon a time");
    normal.mutable_sampling()->set_temperature(0);
    normal.mutable_sampling()->set_max_tokens(20);
    const auto [next_status, next_text] = Generate(normal);
    if (is_fatal) {
      EXPECT_EQ(next_status.error_code(), grpc::StatusCode::UNAVAILABLE);
      EXPECT_EQ(HealthStatus(), 2);
    } else {
      EXPECT_TRUE(next_status.ok()) << next_status.error_message();
      EXPECT_EQ(next_text.rfind(", there was a little girl named Lily.", 0), 0u) << next_text;
      EXPECT_EQ(HealthStatus(), 1);
    }
  }
}

// One streaming call on the callback API: no client thread per call either.
class StreamReader : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  StreamReader(v1::Llm::Stub* stub, v1::GenerateRequest request, std::atomic<int>* done)
      : request_(std::move(request)), done_(done) {
    stub->async()->Generate(&ctx_, &request_, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    text_ += msg_.text();
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_->fetch_add(1);
  }
  const std::string& text() const { return text_; }
  const grpc::Status& status() const { return status_; }

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest request_;
  v1::GenerateResponse msg_;
  std::string text_;
  grpc::Status status_;
  std::atomic<int>* done_;
};

// 1,000 streams at once (a sanitizer build: 200) all complete with their solo text, and the
// process never runs a thread per stream (the pump-thread server had one each).
TEST_F(GrpcServerTest, ThousandConcurrentStreamsWithoutAThreadEach) {
  const int n = test::Scaled(1000, 200);
  limits_.max_queued_requests = 2 * n;
  Restart({.port = 0}, {.num_kv_blocks = 4096, .max_num_seqs = 256});
  const char* prompts[] = {"Once upon a time", "The little dog", "Tom had a", "Lily saw"};
  auto request = [](const char* prompt) {
    v1::GenerateRequest req;
    req.set_text(prompt);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(16);
    return req;
  };
  std::vector<std::string> solo;
  for (const char* p : prompts) {
    const auto [status, text] = Generate(request(p));
    ASSERT_TRUE(status.ok()) << status.error_message();
    solo.push_back(text);
  }
  std::atomic<int> done{0};
  std::vector<std::unique_ptr<StreamReader>> readers;
  int max_threads = 0;
  for (int i = 0; i < n; ++i) {
    readers.push_back(std::make_unique<StreamReader>(stub_.get(), request(prompts[i % 4]), &done));
    if (i % 50 == 0) max_threads = std::max(max_threads, test::ThreadsOfThisProcess());
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (done.load() < n && std::chrono::steady_clock::now() < until) {
    max_threads = std::max(max_threads, test::ThreadsOfThisProcess());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(done.load(), n) << "streams still open after 120 s";
  int failures = 0;
  for (int i = 0; i < n; ++i) {
    const StreamReader& r = *readers[static_cast<size_t>(i)];
    if (!r.status().ok() || r.text() != solo[static_cast<size_t>(i % 4)]) {
      if (++failures <= 3)
        ADD_FAILURE() << i << ": " << r.status().error_message() << " " << r.text();
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_LT(max_threads, 200) << "threads seen while " << n << " streams were open";
}

// With an API key, every call of the Llm service needs metadata `authorization: Bearer KEY`
// (else UNAUTHENTICATED); health stays open for probes.
TEST_F(GrpcServerTest, ApiKeyGuardsTheServiceButNotHealth) {
  Restart({.port = 0, .api_key = "sekret"}, {.num_kv_blocks = 256});
  EXPECT_EQ(HealthStatus(), 1);
  v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.mutable_sampling()->set_max_tokens(4);
  EXPECT_EQ(Generate(req).first.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  for (const char* key : {"Bearer nope", "sekret", "Bearer sekret2"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", key);
    v1::TokenizeRequest treq;
    treq.set_text("x");
    v1::TokenizeResponse tres;
    EXPECT_EQ(stub_->Tokenize(&ctx, treq, &tres).error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << key;
  }
  grpc::ClientContext info_ctx;
  v1::ModelInfoResponse info;
  EXPECT_EQ(stub_->ModelInfo(&info_ctx, v1::ModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer sekret");
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::string text;
  while (reader->Read(&msg)) text += msg.text();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_FALSE(text.empty());
}

}  // namespace
}  // namespace llm::server
