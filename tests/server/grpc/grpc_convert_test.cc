// The gRPC request conversion (server/grpc/grpc_convert.h): the inputs that the fuzzer
// (tests/fuzz/grpc_request_fuzz.cc) found, embedded as serialized GenerateRequests.
#include "server/grpc/grpc_convert.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "tests/test_util.h"

namespace llm::server {
namespace {

std::unique_ptr<Tokenizer> StoriesTokenizer() {
  return Tokenizer::FromFile((test::SharedDir() / "models/stories260K/tokenizer.model").string());
}

TEST(GrpcConvertTest, ConvertsPromptSamplingAndTimeout) {
  const auto tokenizer = StoriesTokenizer();
  v1::GenerateRequest req;
  req.mutable_token_ids()->add_ids(1);
  req.mutable_token_ids()->add_ids(403);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_top_k(40);
  (*req.mutable_sampling()->mutable_logit_bias())[13] = -100;
  req.set_timeout_seconds(30);
  const Request r = ToRequest(req, *tokenizer, 0);
  EXPECT_EQ(r.prompt_ids, (std::vector<int>{1, 403}));
  EXPECT_EQ(r.sampling.temperature, 0);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.max_tokens, 16);  // unset: the default
  EXPECT_EQ(r.sampling.logit_bias.at(13), -100.0f);
  ASSERT_TRUE(r.deadline.has_value());
  EXPECT_LE(*r.deadline, Clock::now() + std::chrono::seconds(30));
  EXPECT_FALSE(ToRequest(v1::GenerateRequest(), *tokenizer, 0).deadline.has_value());
  EXPECT_EQ(ToRequest(v1::GenerateRequest(), *tokenizer, 0).prompt_ids,
            tokenizer->EncodePrompt(""));
}

TEST(GrpcConvertTest, StructuredOutputToSpec) {
  using grammar::StructuredSpec;
  v1::SamplingParams p;
  std::optional<StructuredSpec> spec;
  ASSERT_TRUE(ToStructuredSpec(p, &spec).ok());
  EXPECT_FALSE(spec.has_value());  // unset
  p.mutable_structured();
  ASSERT_TRUE(ToStructuredSpec(p, &spec).ok());
  EXPECT_FALSE(spec.has_value());  // no kind
  p.mutable_structured()->set_json_object(false);
  ASSERT_TRUE(ToStructuredSpec(p, &spec).ok());
  EXPECT_FALSE(spec.has_value());  // json_object false: free text
  p.mutable_structured()->set_json_schema(R"({"type": "object"})");
  p.mutable_structured()->set_strict(true);
  ASSERT_TRUE(ToStructuredSpec(p, &spec).ok());
  ASSERT_TRUE(spec.has_value());
  EXPECT_EQ(spec->kind, StructuredSpec::Kind::kJsonSchema);
  EXPECT_EQ(spec->text, R"({"type": "object"})");
  EXPECT_TRUE(spec->strict);
  p.mutable_structured()->mutable_choice()->add_choices("yes");
  p.mutable_structured()->mutable_choice()->add_choices("no");
  EXPECT_EQ(ToStructuredSpec(p, &spec).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  p.mutable_structured()->set_strict(false);
  ASSERT_TRUE(ToStructuredSpec(p, &spec).ok());
  EXPECT_EQ(spec->kind, StructuredSpec::Kind::kChoice);
  EXPECT_EQ(spec->choices, (std::vector<std::string>{"yes", "no"}));
  EXPECT_FALSE(spec->strict);
  p.mutable_structured()->set_regex("[0-9]+");
  ASSERT_TRUE(ToStructuredSpec(p, &spec).ok());
  EXPECT_EQ(spec->kind, StructuredSpec::Kind::kRegex);
  EXPECT_EQ(spec->text, "[0-9]+");
  EXPECT_TRUE(spec->choices.empty());
  p.mutable_structured()->set_grammar("root ::= \"a\"");
  ASSERT_TRUE(ToStructuredSpec(p, &spec).ok());
  EXPECT_EQ(spec->kind, StructuredSpec::Kind::kGrammar);
}

// Fuzzer: crash-5ad4e0c5 (UBSan: 6.01673e+196 is outside the range of representable values
// of type 'long': timeout_seconds * 1000 cast to int64).
TEST(GrpcConvertTest, HugeTimeoutIsCapped) {
  const unsigned char kCrash[] = {
      0x4a, 0x10, 0x4f, 0x6e, 0x63, 0x65, 0x20, 0x75, 0x70, 0x6f, 0x6e, 0x20, 0x61,
      0x20, 0x74, 0x63, 0x6d, 0x65, 0x1a, 0x29, 0x09, 0x66, 0x66, 0x66, 0xe2, 0x96,
      0x81, 0x54, 0x3f, 0x11, 0xcd, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xec, 0x3f, 0x18,
      0x28, 0x60, 0x08, 0x4a, 0x01, 0x2e, 0x52, 0x01, 0x02, 0x60, 0x2a, 0x68, 0x02,
      0x72, 0x07, 0x08, 0x0d, 0x15, 0x00, 0x00, 0xc8, 0xc2, 0x22, 0x06, 0x73, 0x65,
      0x65, 0x64, 0x2d, 0x31, 0x29, 0x01, 0x2e, 0x52, 0x01, 0x02, 0x60, 0x2a, 0x68};
  v1::GenerateRequest req;
  ASSERT_TRUE(req.ParseFromArray(kCrash, sizeof(kCrash)));
  ASSERT_GT(req.timeout_seconds(), 1e100);
  const auto tokenizer = StoriesTokenizer();
  const Request r = ToRequest(req, *tokenizer, 0);
  ASSERT_TRUE(r.deadline.has_value());
  EXPECT_GT(*r.deadline, Clock::now() + std::chrono::hours(24 * 365));
}

}  // namespace
}  // namespace llm::server
