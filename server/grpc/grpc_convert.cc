#include "server/grpc/grpc_convert.h"

namespace llm::server {

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

}  // namespace llm::server
