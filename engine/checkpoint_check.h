// Checks a checkpoint against the tensors its config implies.
#pragma once

#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace llm {

void ValidateCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace llm
