// llm.v1 protos (proto/llm.proto) -> the engine's request fields. Plain conversion: the
// engine's AddRequest validates (the same rules as HTTP); a structured output is checked here
// and compiled with the grammar compiler that HTTP uses (one cache).
// Fuzzed by tests/fuzz/grpc_request_fuzz.cc.
#pragma once

#include <grpcpp/support/status.h>

#include <memory>
#include <optional>
#include <vector>

#include "engine/grammar/compiler.h"
#include "engine/request.h"
#include "engine/sample/sampler.h"
#include "engine/tokenizer/tokenizer.h"
#include "llm.pb.h"

namespace llm::server {

// The engine's sampling parameters from the proto's (unset optional fields: defaults). The
// structured output is not compiled here (see CompileStructured).
SamplingParams ToSampling(const v1::SamplingParams& p);

// The prompt's token ids: `token_ids` as given, else `text` encoded as a prompt (BOS/EOS as
// the tokenizer's config says).
std::vector<int> ToPromptIds(const v1::GenerateRequest& req, const Tokenizer& tokenizer);

// The engine request of a Generate call: prompt, sampling and deadline (`timeout_seconds`, or
// `default_timeout_seconds` when that is 0; none when both are 0). request_id is left empty;
// sampling.grammar too (CompileStructured).
Request ToRequest(const v1::GenerateRequest& req, const Tokenizer& tokenizer,
                  double default_timeout_seconds);

// sampling.structured as the compiler's specification in *spec (nullopt: unset, no kind, or
// json_object false). INVALID_ARGUMENT "sampling.structured.<field>: ..." for an empty choice
// list or strict without json_schema. Cheap: no compiling.
grpc::Status ToStructuredSpec(const v1::SamplingParams& p,
                              std::optional<grammar::StructuredSpec>* spec);

// Compiles `spec` into *grammar with `grammars` (cached: a repeated specification is a lookup).
// INVALID_ARGUMENT "sampling.structured.<field>: <the compiler's message>" when it does not
// compile (syntax, an unsupported keyword under strict, size, the compile deadline). Blocks
// for up to the compiler's deadline: keep it off gRPC's callback threads.
grpc::Status CompileStructured(const grammar::StructuredSpec& spec,
                               grammar::GrammarCompiler& grammars,
                               std::shared_ptr<const grammar::CompiledGrammar>* grammar);

}  // namespace llm::server
