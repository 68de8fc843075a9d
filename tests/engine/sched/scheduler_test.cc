// The scheduler's admission headroom (engine/sched/scheduler.h), driven step by step as the
// engine drives it (computed chunks marked, a token appended where a chunk samples, finished
// sequences removed) over a BlockManager, without a model: whether the running batch is
// preempted, how many steps a workload takes, and how the reserve ratio follows what finished
// sequences used of their budgets.
#include "engine/sched/scheduler.h"

#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <vector>

namespace llm {
namespace {

constexpr int64_t kBlockSize = 16;

// Sequences of `prompt` tokens generating `max_tokens` each (ignore_eos; or stopping after
// `stop_after` tokens, as at an EOS), the scheduler stepped until all are done.
class Workload {
 public:
  Workload(const SchedulerConfig& config, int64_t num_blocks)
      : blocks_(num_blocks, kBlockSize, /*enable_prefix_caching=*/false),
        scheduler_(config, &blocks_) {}

  void Add(int num_seqs, int64_t prompt, int max_tokens, int stop_after = 0) {
    for (int i = 0; i < num_seqs; ++i) {
      stop_after_.push_back(stop_after > 0 ? stop_after : max_tokens);
      auto& state = states_.emplace_back(std::make_unique<RequestState>());
      state->request.sampling.max_tokens = max_tokens;
      auto& seq = seqs_.emplace_back(std::make_unique<Sequence>());
      seq->id = static_cast<SeqId>(seqs_.size());
      seq->request = state.get();
      // Distinct tokens per sequence (no prefix sharing, though caching is off anyway).
      for (int64_t t = 0; t < prompt; ++t) seq->token_ids.push_back(int(seq->id * 1000 + t));
      seq->num_prompt_tokens = prompt;
      scheduler_.AddWaiting(seq.get());
    }
  }

  // One step; returns false when nothing was scheduled.
  bool Step() {
    SchedulerOutput out = scheduler_.Schedule();
    if (out.empty()) return false;
    max_running_ = std::max(max_running_, scheduler_.num_running());
    for (const ScheduledChunk& c : out.chunks) {
      Sequence* seq = c.seq;
      num_computed_ += c.num_tokens;
      seq->num_computed_tokens += c.num_tokens;
      blocks_.MarkComputed(seq->id, seq->num_computed_tokens);
      if (!c.samples) continue;
      seq->token_ids.push_back(7);
      const int max_tokens = seq->request->request.sampling.max_tokens;
      if (seq->num_output_tokens() >= std::min(max_tokens, stop_after_[size_t(seq->id - 1)])) {
        seq->finish_reason =
            seq->num_output_tokens() >= max_tokens ? FinishReason::kLength : FinishReason::kStop;
        scheduler_.Remove(seq);
        seq->status = SeqStatus::kFinished;
        ++num_finished_;
      }
    }
    ++num_steps_;
    return true;
  }

  // Steps until every sequence finished (or a step limit, which fails the test).
  void Run() {
    for (int i = 0; i < 100000 && num_finished_ < std::ssize(seqs_); ++i) {
      ASSERT_TRUE(Step()) << "nothing scheduled with " << std::ssize(seqs_) - num_finished_
                          << " sequences unfinished";
    }
    ASSERT_EQ(num_finished_, std::ssize(seqs_));
    EXPECT_EQ(blocks_.num_free_blocks(), blocks_.counters().num_blocks);
  }

  Scheduler& scheduler() { return scheduler_; }
  int64_t num_steps() const { return num_steps_; }
  int64_t max_running() const { return max_running_; }
  int64_t num_computed() const { return num_computed_; }  // tokens forwarded, recomputes too

 private:
  BlockManager blocks_;
  Scheduler scheduler_;
  std::deque<std::unique_ptr<RequestState>> states_;
  std::deque<std::unique_ptr<Sequence>> seqs_;
  std::vector<int> stop_after_;  // by sequence id - 1
  int64_t num_finished_ = 0, num_steps_ = 0, max_running_ = 0, num_computed_ = 0;
};

// 24 sequences of 32 + 120 tokens (10 blocks each at the end) in a pool of 64 blocks: every
// prompt fits at once (2 blocks each), the grown batch does not.
SchedulerConfig Config(double ratio, double min_ratio) {
  return {.max_num_batched_tokens = 256,
          .max_num_seqs = 24,
          .kv_reserve_ratio = ratio,
          .kv_reserve_min_ratio = min_ratio};
}

TEST(SchedulerHeadroom, AdmittingWheneverThePromptFitsPreempts) {
  Workload w(Config(0, 0), 64);
  w.Add(24, 32, 120);
  w.Run();
  EXPECT_EQ(w.max_running(), 24);
  EXPECT_GT(w.scheduler().num_preemptions(), 0);
}

TEST(SchedulerHeadroom, AFullReserveNeverPreemptsNorRecomputes) {
  Workload greedy(Config(0, 0), 64);
  greedy.Add(24, 32, 120);
  greedy.Run();
  Workload reserved(Config(1, 1), 64);
  reserved.Add(24, 32, 120);
  reserved.Run();
  EXPECT_EQ(reserved.scheduler().num_preemptions(), 0);
  // 64 blocks hold six grown sequences (10 blocks each) and part of a seventh.
  EXPECT_GE(reserved.max_running(), 6);
  EXPECT_LE(reserved.max_running(), 7);
  // Every token is forwarded once (prompt, then each output but the last); admitting
  // whenever a prompt fits recomputes the preempted ones. (It takes fewer, larger steps: which
  // is faster on a GPU, where a decode step costs about the same at any batch size, is
  // measured by scripts/gpu_sched_bench.sh.)
  EXPECT_EQ(reserved.num_computed(), 24 * (32 + 120 - 1));
  EXPECT_GT(greedy.num_computed(), reserved.num_computed());
}

TEST(SchedulerHeadroom, RaisingMaxNumSeqsDoesNotAddSteps) {
  int64_t steps_at_6 = 0;
  for (int64_t max_num_seqs : {6, 12, 24}) {
    SchedulerConfig c = Config(1, 1);
    c.max_num_seqs = max_num_seqs;
    Workload w(c, 64);
    w.Add(24, 32, 120);
    w.Run();
    EXPECT_EQ(w.scheduler().num_preemptions(), 0) << max_num_seqs;
    if (max_num_seqs == 6) steps_at_6 = w.num_steps();
    EXPECT_LE(w.num_steps(), steps_at_6) << max_num_seqs;
  }
}

TEST(SchedulerHeadroom, ALoneSequenceIsAdmittedWhateverItMayNeed) {
  // 8 blocks (128 tokens); the sequence may grow to 16 + 100: more than the reserve allows
  // beside anything, but alone it must run.
  Workload w(Config(1, 1), 8);
  w.Add(1, 16, 100);
  w.Add(1, 16, 100);
  ASSERT_TRUE(w.Step());
  EXPECT_EQ(w.scheduler().num_running(), 1);  // the second waits for the first's room
  w.Run();
}

TEST(SchedulerHeadroom, RemainingTokensAreClipped) {
  // max_tokens of 100,000 each count as 4,096 (the clip, 256 blocks): in a pool of 1,024
  // blocks a full reserve admits the lone first one and 2 more (3 x 256 blocks plus their
  // prompts' fit; 4 x 256 do not), where unclipped it would admit none beside the first.
  SchedulerConfig c = Config(1, 1);
  c.max_num_batched_tokens = 1024;
  Workload w(c, 1024);
  w.Add(8, 16, 100000);
  ASSERT_TRUE(w.Step());
  EXPECT_EQ(w.scheduler().num_running(), 3);
}

TEST(SchedulerHeadroom, TheRatioFollowsFinishedSequencesAndRisesAfterAPreemption) {
  Workload w(Config(0.8, 0.2), 64);
  EXPECT_DOUBLE_EQ(w.scheduler().kv_reserve_ratio(), 0.8);
  // Sequences that use all of max_tokens keep it at the top.
  w.Add(4, 16, 40);
  w.Run();
  EXPECT_DOUBLE_EQ(w.scheduler().kv_reserve_ratio(), 0.8);
  // 64 that stop after 10 of their 100 tokens bring it down towards 0.1, to the floor 0.2.
  w.Add(64, 16, 100, 10);
  w.Run();
  EXPECT_NEAR(w.scheduler().kv_reserve_ratio(), 0.2, 1e-9);
  // At 0.2 a crowd that does use its 400 tokens is admitted beyond what the pool holds once
  // grown: a preemption follows, and the ratio goes halfway back up (0.2 -> 0.5 at the first).
  w.Add(20, 32, 400);
  int64_t steps = 0;
  while (w.scheduler().num_preemptions() == 0 && steps++ < 5000) ASSERT_TRUE(w.Step());
  ASSERT_EQ(w.scheduler().num_preemptions(), 1);
  EXPECT_DOUBLE_EQ(w.scheduler().kv_reserve_ratio(), 0.5);
  w.Run();
}

TEST(SchedulerHeadroom, BadReserveSettingsAreRefused) {
  BlockManager blocks(8, kBlockSize, false);
  EXPECT_THROW(Scheduler(Config(1.5, 0.1), &blocks), std::invalid_argument);
  EXPECT_THROW(Scheduler(Config(0.5, 0.6), &blocks), std::invalid_argument);
  EXPECT_THROW(Scheduler(Config(-0.1, 0), &blocks), std::invalid_argument);
}

}  // namespace
}  // namespace llm
