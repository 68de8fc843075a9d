#include "engine/executor.h"

#include <stdexcept>
#include <string>

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

ForwardBatch ModelExecutor::ResolveFedTokens(const ForwardBatch& batch,
                                             std::span<const int> previous) {
  ForwardBatch fed = batch;
  for (size_t t = 0; t < fed.prev_sample_rows.size(); ++t) {
    const int32_t row = fed.prev_sample_rows[t];
    if (row < 0) continue;
    if (static_cast<size_t>(row) >= previous.size()) {
      throw std::logic_error("ForwardBatch: token " + std::to_string(t) + " is fed from task " +
                             std::to_string(row) + " of the previous step, which sampled " +
                             std::to_string(previous.size()) + " tokens");
    }
    fed.token_ids[t] = previous[static_cast<size_t>(row)];
  }
  fed.prev_sample_rows.clear();
  return fed;
}

StepHandle ModelExecutor::Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) {
  const int64_t id = next_step_id_++;
  std::vector<SampleResult> results;
  try {
    results = batch.has_fed_tokens()
                  ? ForwardAndSample(ResolveFedTokens(batch, last_tokens_), tasks)
                  : ForwardAndSample(batch, tasks);
  } catch (...) {
    last_tokens_.clear();  // nothing may be fed from a step that failed
    throw;
  }
  last_tokens_.clear();
  for (const SampleResult& r : results) last_tokens_.push_back(r.token);
  done_.emplace_back(id, std::move(results));
  return {id};
}

std::vector<SampleResult> ModelExecutor::Wait(StepHandle step) {
  if (done_.empty() || done_.front().first != step.id) {
    throw std::logic_error("ModelExecutor::Wait: step " + std::to_string(step.id) +
                           " is not the oldest launched step");
  }
  std::vector<SampleResult> results = std::move(done_.front().second);
  done_.pop_front();
  return results;
}

}  // namespace llm
