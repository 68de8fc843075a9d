#include "engine/loader/checkpoint_check.h"

namespace llm {

void ValidateCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint) {
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    checkpoint.GetWithShape(spec.name, spec.shape);  // throws naming file, tensor and shapes
  }
  if (config.tie_word_embeddings && checkpoint.Find("lm_head.weight") != nullptr) {
    checkpoint.GetWithShape("lm_head.weight", {config.vocab_size, config.hidden_size});
  }
}

}  // namespace llm
