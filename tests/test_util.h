// Small helpers shared by the tests: where the test data lives, temp folders.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"

namespace llm {
class CpuModel;
class Tokenizer;
}  // namespace llm

namespace llm::test {

// ../shared (models, tokenizers), fixed at configure time.
std::filesystem::path SharedDir();
// The repository root and the build folder.
std::filesystem::path SourceDir();
std::filesystem::path BuildDir();
// Where the SentencePiece oracle fixture writes its JSON files.
std::filesystem::path OracleDir();
// A fresh empty folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};
// ../shared/models/stories260K and its model and tokenizer, loaded once per test process.
std::string StoriesDir();
const CpuModel& StoriesModel();
const Tokenizer& StoriesTokenizer();
// A model folder by name: "stories260K" (StoriesDir()), or a tiny random model of
// tests/data/tiny_models/<name>.json ("hd128", "hd64": seed 7, fp32 weights, stories260K's
// tokenizer; `llm make-model --seed 7`, as tests/tools/hf_bf16_tolerance.py measures them),
// made once per process in a temporary folder.
std::string TestModelDir(const std::string& name);

// A greedy request with ignore_eos (exactly max_tokens tokens), returning the sampled token's
// logprob (a bit-exact view of the logits) and `top_logprobs` alternatives per token.
Request GreedyRequest(std::vector<int> prompt, int max_tokens, int top_logprobs = 0);

// A prompt of n ids: BOS (1), then ids drawn uniformly from [3, vocab) by `seed`.
std::vector<int> RandomPrompt(int n, uint32_t seed, int vocab = 512);

// `n` greedy tokens after `prompt` from the single-sequence runner (engine/cpu/sequence_runner.h):
// what a request gets alone.
std::vector<int> RunnerGreedy(const CpuModel& model, const std::vector<int>& prompt, int n);

// The tokens a request's channel delivers, waiting (up to 300 s per event) for its last
// event; fails the test on an error event.
std::vector<int> AwaitTokens(const std::shared_ptr<OutputChannel>& channel);

// One completion's tokens and logprobs, as a request's channel delivered them.
struct Completion {
  std::vector<int> tokens;
  std::vector<OutputLogprob> logprobs;
};
// Every completion of each channel's request (its n by index), channel after channel; fails
// the test on an error event.
std::vector<Completion> DrainCompletions(
    const std::vector<std::shared_ptr<OutputChannel>>& channels);

// Two greedy runs of the same requests (`ref` asked for top-2 logprobs), each completion of
// `expected_tokens` tokens: equal, or first different where `ref`'s top two logprobs are
// within `near_tie` (rounding may flip those, nothing else may). Returns the tokens that agree
// before any divergence, of how many, and the largest chosen-token logprob difference there.
struct GreedyAgreement {
  int agree = 0, total = 0;
  double max_logprob_diff = 0;
};
GreedyAgreement CompareGreedy(const std::vector<Completion>& ref,
                              const std::vector<Completion>& got, int expected_tokens,
                              double near_tie);

// Reads a whole file; writes a whole file.
std::string ReadFile(const std::filesystem::path& path);
void WriteFile(const std::filesystem::path& path, const std::string& bytes);

// How much work the long tests (soaks, oracle sweeps) do: `full` normally, `small` when the
// environment sets LLM_TEST_SCALE=small (the sanitizer builds, where a test runs 5-20x slower).
// Scaling keeps every test running, with the same checks, on fewer inputs.
bool IsSmallScale();
int Scaled(int full, int small);
// Wall-clock limits and waits for slow builds: 10 with LLM_TEST_SCALE=small, else 1.
int SlowFactor();

// The number of threads this process runs now (/proc/self/status), or -1.
int ThreadsOfThisProcess();

// Runs `fn`, which must throw llm::Error whose message contains every one of `parts`
// (a GoogleTest failure otherwise).
void ExpectError(const std::function<void()>& fn, const std::vector<std::string>& parts);

}  // namespace llm::test
