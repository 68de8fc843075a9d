// Structured outputs over gRPC (sampling.structured, proto/llm.proto) in-process with a real
// gRPC client on stories260K at temperature 1: a regex's streamed text matches, a choice is one
// of the choices, a json_schema's output parses in the schema's key order; bad specifications
// are INVALID_ARGUMENT naming the field and the problem, the compile deadline applies, a server
// without a compiler answers FAILED_PRECONDITION, and repeated schemas hit the shared cache.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "engine/grammar/compiler.h"
#include "llm.grpc.pb.h"
#include "server/grpc/grpc_server.h"
#include "tests/test_util.h"

namespace llm::server {
namespace {

struct Result {
  grpc::Status status;
  std::string text;
  std::string finish_reason;
  int num_messages = 0;
};

class GrpcStructuredTest : public ::testing::Test {
 protected:
  void SetUp() override { Serve({}); }
  void TearDown() override { Shutdown(); }
  void Shutdown() {
    if (!server_) return;
    server_->Stop();
    engine_->Stop();
    server_.reset();
  }
  // A server whose compiler has `options`; `with_compiler` false: none (no vocabulary).
  void Serve(grammar::CompilerOptions options, bool with_compiler = true) {
    Shutdown();
    const Tokenizer& tok = test::StoriesTokenizer();
    const CpuModel& model = test::StoriesModel();
    engine_ = std::make_unique<Engine>(model, tok, EngineConfig{.num_kv_blocks = 256});
    front_end_ = std::make_unique<FrontEnd>(*engine_, "stories260K");
    ModelInfo info{"stories260K", 512, 512};
    if (with_compiler) {
      grammars_ = std::make_shared<grammar::GrammarCompiler>(
          grammar::TokenVocabulary::FromTokenizer(tok, {tok.eos_id()}, 512), options);
      info.grammars = grammars_;
    }
    server_ = std::make_unique<GrpcServer>(*engine_, *front_end_, tok, info, GrpcConfig{.port = 0});
    const int port = server_->Start();
    engine_->Start();
    stub_ = v1::Llm::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                 grpc::InsecureChannelCredentials()));
  }
  // A sampled (temperature 1) request for `prompt`; the caller sets sampling.structured.
  static v1::GenerateRequest Make(const std::string& prompt, uint64_t seed) {
    v1::GenerateRequest req;
    req.set_text(prompt);
    req.mutable_sampling()->set_temperature(1.0);
    req.mutable_sampling()->set_seed(seed);
    req.mutable_sampling()->set_max_tokens(256);
    return req;
  }
  Result Generate(const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse msg;
    Result r;
    while (reader->Read(&msg)) {
      ++r.num_messages;
      r.text += msg.text();
      if (!msg.finish_reason().empty()) r.finish_reason = msg.finish_reason();
    }
    r.status = reader->Finish();
    return r;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<FrontEnd> front_end_;
  std::shared_ptr<grammar::GrammarCompiler> grammars_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::Llm::Stub> stub_;
};

TEST_F(GrpcStructuredTest, RegexStreamedTextMatches) {
  const std::string pattern = "(yes|no), [a-z]{2,8}( [a-z]{2,8}){0,3}\\.";
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    v1::GenerateRequest req = Make("Once upon a time", seed);
    req.mutable_sampling()->mutable_structured()->set_regex(pattern);
    const Result r = Generate(req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_TRUE(std::regex_match(r.text, std::regex(pattern))) << r.text;
    EXPECT_EQ(r.finish_reason, "stop") << r.text;
    EXPECT_GT(r.num_messages, 1) << "streamed, not one message";
  }
}

TEST_F(GrpcStructuredTest, ChoiceIsOneOfTheChoicesAndTheCacheIsShared) {
  const std::vector<std::string> choices = {"red", "green", "blue", "a little dog"};
  const size_t hits_before = grammars_->cache_hits();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    v1::GenerateRequest req = Make("The color was", seed);
    for (const std::string& c : choices) {
      req.mutable_sampling()->mutable_structured()->mutable_choice()->add_choices(c);
    }
    const Result r = Generate(req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_NE(std::find(choices.begin(), choices.end(), r.text), choices.end()) << r.text;
    EXPECT_EQ(r.finish_reason, "stop");
  }
  // One compile, then the server's compiler (the one HTTP gets too) answers from its cache.
  EXPECT_EQ(grammars_->cache_hits() - hits_before, 5u);
}

TEST_F(GrpcStructuredTest, JsonSchemaOutputParsesInTheSchemaOrder) {
  // "name" is listed after "age": the output keeps the text's order, not an alphabetical one.
  const std::string schema = R"({"type": "object", "properties": {
      "zeta": {"type": "integer", "minimum": 0, "maximum": 150},
      "name": {"type": "string", "maxLength": 12},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
      "required": ["zeta", "name", "tags"], "additionalProperties": false})";
  // The requests run together: the compile pool and the engine batch them.
  std::vector<Result> results(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req = Make("A person:", 10 + i);
      req.mutable_sampling()->mutable_structured()->set_json_schema(schema);
      req.mutable_sampling()->mutable_structured()->set_strict(true);
      results[i] = Generate(req);
    });
  }
  for (auto& t : threads) t.join();
  for (const Result& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.finish_reason, "stop") << r.text;
    const auto j = nlohmann::ordered_json::parse(r.text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.text;
    ASSERT_EQ(j.size(), 3u) << r.text;
    EXPECT_EQ(j.begin().key(), "zeta") << r.text;
    ASSERT_TRUE(j["zeta"].is_number_integer()) << r.text;
    EXPECT_GE(j["zeta"].get<int>(), 0);
    EXPECT_LE(j["zeta"].get<int>(), 150);
    ASSERT_TRUE(j["name"].is_string()) << r.text;
    EXPECT_LE(j["name"].get<std::string>().size(), 12u * 4) << r.text;  // 12 code points
    ASSERT_TRUE(j["tags"].is_array()) << r.text;
    EXPECT_LE(j["tags"].size(), 3u);
  }
}

TEST_F(GrpcStructuredTest, JsonObjectAndGrammar) {
  v1::GenerateRequest req = Make("Once upon a time", 3);
  req.mutable_sampling()->mutable_structured()->set_json_object(true);
  req.mutable_sampling()->set_max_tokens(400);
  Result r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  if (r.finish_reason == "stop") {
    EXPECT_TRUE(nlohmann::json::parse(r.text, nullptr, false).is_object()) << r.text;
  } else {
    EXPECT_EQ(r.text.front(), '{') << r.text;  // cut short by max_tokens
  }
  req = Make("Once upon a time", 4);
  req.mutable_sampling()->mutable_structured()->set_grammar(
      "root ::= \"Tom \" verb \" \" (\"fast\" | \"slow\")\nverb ::= \"ran\" | \"sat\"");
  r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_TRUE(std::regex_match(r.text, std::regex("Tom (ran|sat) (fast|slow)"))) << r.text;
  // json_object false: free text, as if unset.
  req = Make("Once upon a time", 5);
  req.mutable_sampling()->mutable_structured()->set_json_object(false);
  req.mutable_sampling()->set_max_tokens(8);
  r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finish_reason, "length");
}

// Each bad specification: INVALID_ARGUMENT, the field, then the compiler's words (as HTTP's 400).
TEST_F(GrpcStructuredTest, BadSpecificationsAreInvalidArgumentNamingTheProblem) {
  struct Case {
    std::function<void(v1::StructuredOutput*)> set;
    std::vector<std::string> want;  // substrings of the status message
  };
  const std::vector<Case> cases = {
      {[](auto* s) { s->set_json_schema(R"({"type": "object", )"); },
       {"sampling.structured.json_schema: ", "not valid JSON"}},
      {[](auto* s) {
         s->set_json_schema(R"({"type": "string", "format": "email"})");
         s->set_strict(true);
       },
       {"sampling.structured.json_schema: ", "format"}},
      {[](auto* s) { s->set_regex("(a|b"); }, {"sampling.structured.regex: "}},
      {[](auto* s) { s->set_regex("(a)\\1"); }, {"sampling.structured.regex: "}},
      {[](auto* s) { s->set_grammar("root ::= root \"a\" | \"b\""); },
       {"sampling.structured.grammar: ", "left-recursive"}},
      {[](auto* s) { s->mutable_choice(); },
       {"sampling.structured.choice must be a non-empty list of strings"}},
      {[](auto* s) {
         s->set_regex("a+");
         s->set_strict(true);
       },
       {"sampling.structured.strict applies to json_schema only"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::GenerateRequest req = Make("x", 1);
    cases[i].set(req.mutable_sampling()->mutable_structured());
    const Result r = Generate(req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "case " << i;
    for (const std::string& want : cases[i].want) {
      EXPECT_NE(r.status.error_message().find(want), std::string::npos)
          << "case " << i << ": " << r.status.error_message();
    }
    EXPECT_EQ(r.num_messages, 0);
  }
  // The schema is still accepted without strict: the unsupported keyword is ignored.
  v1::GenerateRequest req = Make("x", 1);
  req.mutable_sampling()->mutable_structured()->set_json_schema(
      R"({"type": "string", "format": "email", "maxLength": 5})");
  const Result r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_TRUE(nlohmann::json::parse(r.text, nullptr, false).is_string()) << r.text;
}

TEST_F(GrpcStructuredTest, CompileDeadlineApplies) {
  Serve({.timeout_seconds = 1e-9});  // every compile overruns (--structured-output-compile-timeout)
  v1::GenerateRequest req = Make("x", 1);
  req.mutable_sampling()->mutable_structured()->set_regex("[a-z]+ [0-9]+");
  const Result r = Generate(req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("sampling.structured.regex: "), std::string::npos)
      << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("time limit"), std::string::npos)
      << r.status.error_message();
  // Plain requests are unaffected.
  req.mutable_sampling()->clear_structured();
  EXPECT_TRUE(Generate(req).status.ok());
}

TEST_F(GrpcStructuredTest, NoCompilerIsFailedPrecondition) {
  Serve({}, /*with_compiler=*/false);
  v1::GenerateRequest req = Make("x", 1);
  req.mutable_sampling()->mutable_structured()->set_json_object(true);
  const Result r = Generate(req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(r.status.error_message().find("sampling.structured"), std::string::npos)
      << r.status.error_message();
  // An unset kind asks for nothing: served.
  req.mutable_sampling()->mutable_structured()->clear_kind();
  EXPECT_TRUE(Generate(req).status.ok());
}

// A call cancelled while (or before) its grammar compiles ends CANCELLED and frees its slot.
TEST_F(GrpcStructuredTest, CancelledWhileCompilingEndsCancelled) {
  for (int i = 0; i < 8; ++i) {
    grpc::ClientContext ctx;
    v1::GenerateRequest req = Make("x", 1);
    req.mutable_sampling()->mutable_structured()->set_regex("[a-z]{1,5}" + std::to_string(i));
    auto reader = stub_->Generate(&ctx, req);
    ctx.TryCancel();
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) << s.error_message();
  }
  for (int tries = 0; tries < 200 && front_end_->num_in_flight() > 0; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(front_end_->num_in_flight(), 0);
}

}  // namespace
}  // namespace llm::server
