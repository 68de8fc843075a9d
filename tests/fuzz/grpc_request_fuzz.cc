// Fuzzes the gRPC request conversion: the input is a serialized llm.v1.GenerateRequest; a
// message that parses is converted to an engine Request (server/grpc/grpc_convert.h, prompt text
// through the stories260K tokenizer) and its sampling parameters validated, as Generate
// does before AddRequest. Nothing here may throw: validation reports with a string.
//
//   scripts/fuzz.sh grpc_request
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>

#include "server/grpc/grpc_convert.h"
#include "tests/fuzz/fuzz_util.h"

// Protobuf logs every string field with invalid UTF-8 it refuses: keep the fuzzer's output
// readable.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const llm::Tokenizer& tokenizer = llm::fuzz::StoriesTokenizer();
  llm::v1::GenerateRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  const llm::Request request =
      llm::server::ToRequest(req, tokenizer, /*default_timeout_seconds=*/0);
  const std::string problem = request.sampling.Validate(tokenizer.vocab_size());
  if (!req.has_token_ids()) {
    for (int id : request.prompt_ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();  // the tokenizer's own ids
    }
  }
  return problem.size() == size_t(-1);  // keeps `problem` alive; always 0
}
