#include "engine/testing/fault_injection.h"

#include <algorithm>
#include <new>
#include <stdexcept>
#include <string>

namespace llm {

FaultInjectingExecutor::FaultInjectingExecutor(std::unique_ptr<ModelExecutor> inner, FaultPlan plan)
    : ForwardingExecutor(std::move(inner)), plan_(std::move(plan)) {}

std::string FaultInjectingExecutor::Describe() const {
  return inner().Describe() + ", WITH INJECTED STEP FAILURES (test hook)";
}

void FaultInjectingExecutor::MaybeFail(const ForwardBatch& batch) {
  const int64_t step = num_steps_++;
  if (plan_.max_failures >= 0 && num_failures_.load() >= plan_.max_failures) return;
  const bool by_step = std::count(plan_.fail_steps.begin(), plan_.fail_steps.end(), step) > 0;
  const bool by_token =
      plan_.fail_on_token && std::count(batch.token_ids.begin(), batch.token_ids.end(),
                                        static_cast<int32_t>(*plan_.fail_on_token)) > 0;
  if (!by_step && !by_token) return;
  ++num_failures_;
  if (plan_.is_corrupting_kv) {
    ForwardBatch garbage = batch;
    garbage.prev_sample_rows.clear();  // (async) fed tokens: 0 here, changed below
    const int32_t vocab = static_cast<int32_t>(config().vocab_size);
    for (int32_t& id : garbage.token_ids) id = (id + 1) % vocab;
    (void)inner().Forward(garbage);
  }
  const std::string what = "injected failure of step " + std::to_string(step) + " (" +
                           std::to_string(batch.num_tokens()) + " tokens)";
  switch (plan_.kind) {
    case FaultPlan::Kind::kBadAlloc:
      throw std::bad_alloc();
    case FaultPlan::Kind::kFatal:
      throw FatalExecutorError(what + ": the device is unusable");
    case FaultPlan::Kind::kRuntimeError:
      break;
  }
  throw std::runtime_error(what);
}

std::vector<float> FaultInjectingExecutor::Forward(const ForwardBatch& batch) {
  MaybeFail(batch);
  return inner().Forward(batch);
}

std::vector<SampleResult> FaultInjectingExecutor::ForwardAndSample(
    const ForwardBatch& batch, std::span<const SampleTask> tasks) {
  MaybeFail(batch);
  return inner().ForwardAndSample(batch, tasks);
}

}  // namespace llm

namespace llm {

StepHandle FaultInjectingExecutor::Launch(const ForwardBatch& batch,
                                          std::span<const SampleTask> tasks) {
  MaybeFail(batch);
  return inner().Launch(batch, tasks);
}

void EngineErrorInjector::OnScheduled(const SchedulerOutput&) {
  if (num_steps_++ == throw_in_step_) {
    throw std::logic_error("injected engine error in step " + std::to_string(throw_in_step_));
  }
}

}  // namespace llm
