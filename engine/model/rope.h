// Rotary position embeddings: the inverse frequencies both backends rotate q and k by.
#pragma once

#include <vector>

#include "engine/model/model_config.h"

namespace llm {

// RoPE inverse frequencies [head_dim / 2] with the config's rope_scaling applied (as
// Hugging Face's ROPE_INIT_FUNCTIONS compute them, in float32).
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace llm
