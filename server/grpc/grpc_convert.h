// llm.v1 protos (proto/llm.proto) -> the engine's request fields. Plain conversion, no
// validation: the engine's AddRequest validates (the same rules as HTTP).
// Fuzzed by tests/fuzz/grpc_request_fuzz.cc.
#pragma once

#include <vector>

#include "engine/request.h"
#include "engine/sample/sampler.h"
#include "engine/tokenizer/tokenizer.h"
#include "llm.pb.h"

namespace llm::server {

// The engine's sampling parameters from the proto's (unset optional fields: defaults).
SamplingParams ToSampling(const v1::SamplingParams& p);

// The prompt's token ids: `token_ids` as given, else `text` encoded as a prompt (BOS/EOS as
// the tokenizer's config says).
std::vector<int> ToPromptIds(const v1::GenerateRequest& req, const Tokenizer& tokenizer);

// The engine request of a Generate call: prompt, sampling and deadline (`timeout_seconds`, or
// `default_timeout_seconds` when that is 0; none when both are 0). request_id is left empty.
Request ToRequest(const v1::GenerateRequest& req, const Tokenizer& tokenizer,
                  double default_timeout_seconds);

}  // namespace llm::server
