// Checks that a checkpoint holds exactly the tensors a config implies, before any weight is
// used: a wrong shape found here is a clear error instead of an out-of-bounds read later.
#pragma once

#include "engine/loader/safetensors.h"
#include "engine/model/architecture.h"
#include "engine/model/model_config.h"

namespace llm {

// Every ExpectedTensors(config) entry must exist with exactly its shape; otherwise throws
// llm::Error naming the file (or folder, when missing), the tensor, the actual and expected
// shape. A tied model may still carry lm_head.weight (some exporters write the copy); it is
// accepted when its shape is [vocab, hidden]. Tensors beyond the expected set are ignored
// (e.g. rotary_emb.inv_freq buffers in older exports).
void ValidateCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace llm
