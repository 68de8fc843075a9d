#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "engine/error.h"
#include "engine/sequence_runner.h"

namespace llm {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

GenerateResult Generate(const LlamaModel& model, const Tokenizer& tokenizer,
                        std::string_view prompt, const GenerateOptions& options,
                        const TextCallback& on_text) {
  const std::vector<int> ids = tokenizer.EncodePrompt(prompt);
  return GenerateFromIds(model, tokenizer, ids, options, on_text);
}

GenerateResult GenerateFromIds(const LlamaModel& model, const Tokenizer& tokenizer,
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

  SequenceRunner runner(model, num_prompt + max_new);
  Sampler sampler(options.sampling, prompt_ids);
  IncrementalDecoder decoder(tokenizer, prompt_ids);
  const auto& eos = config.generation.eos_token_ids.empty() ? config.eos_token_ids
                                                            : config.generation.eos_token_ids;
  auto emit = [&](const std::string& delta) {
    if (delta.empty()) return;
    result.text += delta;
    if (on_text) on_text(delta);
  };

  auto start = std::chrono::steady_clock::now();
  std::vector<float> logits = runner.Feed(prompt_ids);
  result.prefill_seconds = SecondsSince(start);
  start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < max_new; ++step) {
    const int id = sampler.Sample(logits).token;
    if (!options.ignore_eos && std::find(eos.begin(), eos.end(), id) != eos.end()) {
      result.finish_reason = "stop";
      break;
    }
    result.output_ids.push_back(id);
    emit(decoder.Push(id));
    if (step + 1 == max_new) break;
    const int next[1] = {id};
    logits = runner.Feed(next);
  }
  emit(decoder.Flush());
  result.decode_seconds = SecondsSince(start);
  return result;
}

}  // namespace llm
