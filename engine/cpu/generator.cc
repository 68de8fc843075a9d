#include "engine/cpu/generator.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "engine/engine.h"
#include "engine/error.h"

namespace llm {

GenerateResult Generate(const CpuModel& model, const Tokenizer& tokenizer, std::string_view prompt,
                        const GenerateOptions& options, const TextCallback& on_text) {
  const std::vector<int> ids = tokenizer.EncodePrompt(prompt);
  return GenerateFromIds(model, tokenizer, ids, options, on_text);
}

GenerateResult GenerateFromIds(const CpuModel& model, const Tokenizer& tokenizer,
                               std::span<const int> prompt_ids, const GenerateOptions& options,
                               const TextCallback& on_text) {
  const ModelConfig& config = model.config();
  if (prompt_ids.empty()) throw Error("the prompt is empty (no tokens to condition on)");
  if (options.max_tokens < 0) throw Error("max_tokens must be >= 0");
  const int64_t context = config.max_position_embeddings;
  const int64_t num_prompt = static_cast<int64_t>(prompt_ids.size());
  if (num_prompt >= context) {
    throw Error("the prompt has " + std::to_string(num_prompt) +
                " tokens; the model's context is " + std::to_string(context));
  }
  GenerateResult result;
  result.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
  result.finish_reason = "length";
  const int64_t max_new = std::min<int64_t>(options.max_tokens, context - num_prompt);
  if (max_new == 0) return result;

  // One request through the continuous-batching engine (no engine thread: this thread
  // steps it and streams the request's channel as tokens arrive).
  EngineConfig engine_config;
  engine_config.num_kv_blocks = (num_prompt + max_new) / engine_config.block_size + 2;
  engine_config.enable_prefix_caching = false;
  engine_config.kv_cache_dtype = options.kv_cache_dtype;
  Engine engine(model, tokenizer, engine_config);
  Request request;
  request.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
  request.sampling = options.sampling;
  request.sampling.max_tokens = static_cast<int>(max_new);
  request.sampling.ignore_eos = options.ignore_eos;
  std::shared_ptr<OutputChannel> channel = engine.AddRequest(std::move(request));

  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first_token;
  bool done = false;
  while (!done) {
    engine.Step();
    RequestOutput out;
    while (!done && channel->TryPop(&out)) {
      if (!first_token && !out.token_ids.empty()) first_token = std::chrono::steady_clock::now();
      result.output_ids.insert(result.output_ids.end(), out.token_ids.begin(), out.token_ids.end());
      result.text += out.text;
      if (on_text && !out.text.empty()) on_text(out.text);
      if (out.finish_reason == FinishReason::kError) throw Error(out.error);  // a failed step
      if (out.finish_reason != FinishReason::kNone) {
        result.finish_reason = FinishReasonName(out.finish_reason);
      }
      done = out.is_last;
    }
  }
  const auto end = std::chrono::steady_clock::now();
  const auto prefill_end = first_token.value_or(end);
  result.prefill_seconds = std::chrono::duration<double>(prefill_end - start).count();
  result.decode_seconds = std::chrono::duration<double>(end - prefill_end).count();
  return result;
}

}  // namespace llm
