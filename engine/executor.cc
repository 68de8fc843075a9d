#include "engine/executor.h"

namespace llm {

std::vector<SampleResult> ModelExecutor::ForwardAndSample(const ForwardBatch& batch,
                                                          std::span<const SampleTask> tasks) {
  const std::vector<float> logits = Forward(batch);
  const int64_t vocab = config().vocab_size;
  std::vector<SampleResult> results;
  results.reserve(tasks.size());
  for (const SampleTask& t : tasks) {
    results.push_back(t.sampler->Sample(
        std::span<const float>(logits.data() + t.logits_row * vocab, static_cast<size_t>(vocab))));
  }
  return results;
}

CpuExecutor::CpuExecutor(const LlamaModel& model, int64_t num_blocks, int64_t block_size)
    : model_(model), kv_(model.config(), num_blocks, block_size) {}

std::string CpuExecutor::Describe() const {
  return "cpu, " + std::string(DTypeName(model_.weight_dtype())) + " weights, f32 KV cache";
}

}  // namespace llm
