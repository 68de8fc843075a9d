// A ModelExecutor that makes chosen steps fail: the way tests (and the server's test-only
// hook LLM_TEST_FAIL_FORWARD_ON_TOKEN, server/cli/backend.cc) reach the engine's step-failure
// path with a real model underneath. It wraps another executor and, on the steps its plan
// names, throws from Forward / ForwardAndSample / Launch instead of returning. And a
// StepObserver that throws from the engine's own code (EngineErrorInjector). Not for production.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/executor.h"

namespace llm {

struct FaultPlan {
  enum class Kind {
    kRuntimeError,  // std::runtime_error: fails the step's requests
    kBadAlloc,      // std::bad_alloc (an out-of-memory condition): the same
    kFatal,         // FatalExecutorError (a sticky CUDA error): the engine turns unhealthy
  };
  std::vector<int64_t> fail_steps = {};   // 0-based indices of the steps (Forward calls) that fail
  std::optional<int> fail_on_token = {};  // every step whose batch holds this token id fails
  int64_t max_failures = -1;              // after this many failures, none (-1: no limit)
  Kind kind = Kind::kRuntimeError;
  // Before throwing, run the wrapped forward on the batch with every token id changed: the
  // step's KV slots then hold wrong values, as after a step that died halfway through.
  bool is_corrupting_kv = true;
};

class FaultInjectingExecutor final : public ForwardingExecutor {
 public:
  FaultInjectingExecutor(std::unique_ptr<ModelExecutor> inner, FaultPlan plan);

  std::string Describe() const override;
  std::vector<float> Forward(const ForwardBatch& batch) override;
  std::vector<SampleResult> ForwardAndSample(const ForwardBatch& batch,
                                             std::span<const SampleTask> tasks) override;
  StepHandle Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) override;

  int64_t num_steps() const { return num_steps_.load(); }
  int64_t num_failures() const { return num_failures_.load(); }

 private:
  void MaybeFail(const ForwardBatch& batch);  // throws when the plan says this step fails

  FaultPlan plan_;
  std::atomic<int64_t> num_steps_{0}, num_failures_{0};
};

// Makes the Step() call with index `throw_in_step` (0-based, idle steps too) throw
// std::logic_error("injected engine error in step N") after scheduling, outside any executor
// call: an exception from the engine's own code, as a bug would throw (not a failed step).
class EngineErrorInjector final : public StepObserver {
 public:
  explicit EngineErrorInjector(int64_t throw_in_step) : throw_in_step_(throw_in_step) {}
  void OnScheduled(const SchedulerOutput& sched) override;

 private:
  int64_t throw_in_step_;
  int64_t num_steps_ = 0;  // engine thread only
};

}  // namespace llm
