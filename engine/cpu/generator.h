// One request, start to finish, on the CPU model: prefill the prompt, then sample and
// decode token by token, streaming text deltas. (The continuous-batching engine replaces
// this loop for the server; `llm generate` and the end-to-end tests use it today.)
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/kv_cache.h"
#include "engine/sample/sampler.h"
#include "engine/tokenizer/tokenizer.h"

namespace llm {

struct GenerateOptions {
  int max_tokens = 128;
  SamplingParams sampling;
  bool ignore_eos = false;  // keep going past EOS (benchmarks)
  KvCacheDType kv_cache_dtype = KvCacheDType::kF32;
};

struct GenerateResult {
  std::vector<int> prompt_ids;
  std::vector<int> output_ids;
  std::string text;           // the generated text (prompt not included)
  std::string finish_reason;  // "stop" (EOS) or "length"
  double prefill_seconds = 0;
  double decode_seconds = 0;  // wall time of the decode steps after the first token
};

using TextCallback = std::function<void(std::string_view delta)>;

// Tokenizes `prompt` as the tokenizer config says (BOS etc.) and generates.
GenerateResult Generate(const CpuModel& model, const Tokenizer& tokenizer, std::string_view prompt,
                        const GenerateOptions& options, const TextCallback& on_text = {});

// The same from token ids.
GenerateResult GenerateFromIds(const CpuModel& model, const Tokenizer& tokenizer,
                               std::span<const int> prompt_ids, const GenerateOptions& options,
                               const TextCallback& on_text = {});

}  // namespace llm
