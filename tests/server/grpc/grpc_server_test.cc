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
  void Serve() {
    front_end_ = std::make_unique<FrontEnd>(*engine_, "stories260K");
    server_ =
        std::make_unique<GrpcServer>(*engine_, *front_end_, *tokenizer_,
                                     ModelInfo{"stories260K", 512, 512}, GrpcConfig{.port = 0});
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

  static const CpuModel* model_;
  static const Tokenizer* tokenizer_;
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

}  // namespace
}  // namespace llm::server
