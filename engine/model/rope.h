// Rotary position embeddings: the inverse frequencies both backends rotate q and k by.
#pragma once

#include <vector>

#include "engine/model/model_config.h"

namespace llm {

// RoPE inverse frequencies [head_dim / 2] with the config's rope_scaling applied (as
// Hugging Face's ROPE_INIT_FUNCTIONS compute them, in float32).
std::vector<float> RopeInvFreq(const RopeParameters& rope, int64_t head_dim);
// The full-attention layers' (every layer's, unless config.sliding_rope is set).
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace llm
