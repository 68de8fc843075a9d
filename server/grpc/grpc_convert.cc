#include "server/grpc/grpc_convert.h"

#include <string>

namespace llm::server {
namespace {

using grammar::StructuredSpec;

// The proto field of a specification kind, for error messages.
std::string FieldName(StructuredSpec::Kind kind) {
  switch (kind) {
    case StructuredSpec::Kind::kJsonSchema:
      return "sampling.structured.json_schema";
    case StructuredSpec::Kind::kJsonObject:
      return "sampling.structured.json_object";
    case StructuredSpec::Kind::kRegex:
      return "sampling.structured.regex";
    case StructuredSpec::Kind::kChoice:
      return "sampling.structured.choice";
    case StructuredSpec::Kind::kGrammar:
      return "sampling.structured.grammar";
    case StructuredSpec::Kind::kToolCalls:  // chat tools (HTTP only)
      break;
  }
  return "sampling.structured";
}

grpc::Status Invalid(const std::string& message) {
  return {grpc::StatusCode::INVALID_ARGUMENT, message};
}

}  // namespace

SamplingParams ToSampling(const v1::SamplingParams& p) {
  SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) s.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) s.frequency_penalty = p.frequency_penalty();
  s.max_tokens = p.max_tokens() > 0 ? p.max_tokens() : 16;
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  if (p.has_seed()) s.seed = p.seed();
  if (p.has_logprobs()) s.logprobs = p.logprobs();
  for (const auto& [id, bias] : p.logit_bias()) s.logit_bias[id] = bias;
  return s;
}

std::vector<int> ToPromptIds(const v1::GenerateRequest& req, const Tokenizer& tokenizer) {
  if (req.has_token_ids()) {
    return std::vector<int>(req.token_ids().ids().begin(), req.token_ids().ids().end());
  }
  return tokenizer.EncodePrompt(req.text());
}

Request ToRequest(const v1::GenerateRequest& req, const Tokenizer& tokenizer,
                  double default_timeout_seconds) {
  Request request;
  request.prompt_ids = ToPromptIds(req, tokenizer);
  request.sampling = ToSampling(req.sampling());
  const double timeout =
      req.timeout_seconds() > 0 ? req.timeout_seconds() : default_timeout_seconds;
  if (timeout > 0) {
    request.deadline = DeadlineAfter(timeout);
  }
  return request;
}

grpc::Status ToStructuredSpec(const v1::SamplingParams& p, std::optional<StructuredSpec>* spec) {
  spec->reset();
  if (!p.has_structured()) return grpc::Status::OK;
  const v1::StructuredOutput& so = p.structured();
  if (so.strict() && so.kind_case() != v1::StructuredOutput::kJsonSchema) {
    return Invalid("sampling.structured.strict applies to json_schema only");
  }
  StructuredSpec s;
  switch (so.kind_case()) {
    case v1::StructuredOutput::kJsonSchema:
      s.kind = StructuredSpec::Kind::kJsonSchema;
      s.text = so.json_schema();
      s.strict = so.strict();
      break;
    case v1::StructuredOutput::kJsonObject:
      if (!so.json_object()) return grpc::Status::OK;
      s.kind = StructuredSpec::Kind::kJsonObject;
      break;
    case v1::StructuredOutput::kRegex:
      s.kind = StructuredSpec::Kind::kRegex;
      s.text = so.regex();
      break;
    case v1::StructuredOutput::kChoice:
      // HTTP's wording for structured_outputs.choice.
      if (so.choice().choices().empty()) {
        return Invalid("sampling.structured.choice must be a non-empty list of strings");
      }
      s.kind = StructuredSpec::Kind::kChoice;
      s.choices.assign(so.choice().choices().begin(), so.choice().choices().end());
      break;
    case v1::StructuredOutput::kGrammar:
      s.kind = StructuredSpec::Kind::kGrammar;
      s.text = so.grammar();
      break;
    case v1::StructuredOutput::KIND_NOT_SET:
      return grpc::Status::OK;
  }
  *spec = std::move(s);
  return grpc::Status::OK;
}

grpc::Status CompileStructured(const StructuredSpec& spec, grammar::GrammarCompiler& grammars,
                               std::shared_ptr<const grammar::CompiledGrammar>* grammar) {
  try {
    *grammar = grammars.Compile(spec);
  } catch (const grammar::GrammarError& e) {
    // The compiler's text, as HTTP's 400 gives it, after the field it is about.
    return Invalid(FieldName(spec.kind) + ": " + e.what());
  } catch (const std::exception& e) {  // a compiler bug: this call fails, the server goes on
    return {grpc::StatusCode::INTERNAL, FieldName(spec.kind) + ": compiling failed: " + e.what()};
  }
  return grpc::Status::OK;
}

}  // namespace llm::server
