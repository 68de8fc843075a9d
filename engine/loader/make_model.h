// `llm make-model`: writes a complete Hugging Face checkpoint folder with random weights
// (config.json, generation_config.json, model.safetensors, tokenizer.json or tokenizer.model,
// tokenizer_config.json) for tests, the demo model and benchmarks at real shapes. Like
// vLLM's dummy load format, speed does not depend on the weight values.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/dtype.h"

namespace llm {

struct MakeModelOptions {
  std::string config_path;  // a config.json of a registered architecture
  std::string out_dir;      // created if missing
  // A tokenizer.model or tokenizer.json (with the tokenizer_config.json beside it), or a folder
  // holding them, to copy in; "" for none. The config's vocab_size must cover its ids.
  std::string tokenizer_path;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;
  std::string chat_template_path;  // a Jinja chat template for tokenizer_config.json (optional)
};

// Weights: matrices uniform with standard deviation `initializer_range` (default 0.02),
// norms 1.0; deterministic in `seed` whatever the thread count. Throws llm::Error.
void MakeRandomModel(const MakeModelOptions& options);

}  // namespace llm
