// The engine's invariance scenarios, written once and run on every backend: the same greedy
// (or seeded) request gives the same tokens alone or inside a busy batch, under chunked
// prefill, preemption (a KV pool too small for the batch: recompute), prefix-cache hits,
// n > 1 completions and stop conditions. The bodies are value-parameterized GoogleTest tests
// (tests/engine/engine_invariance.cc, suite EngineInvariance) over an EngineBackend: how to
// make the executor, and how strictly runs must agree. Each test binary instantiates them:
//
//   engine_test      (label cpu)  the CPU backend: every invariance exact, demanded bit for
//                                 bit (tokens, texts, finish reasons, logprobs and their top
//                                 alternatives); and the CPU backend with noisy logits, which
//                                 runs the GPU's measured comparisons in CI (see below)
//   engine_gpu_test  (label gpu)  the CUDA backend, bf16/fp16, stories260K and a random hd128
//                                 model, batch-invariant and throughput modes: agreement
//                                 measured and printed (one line per comparison), floors
//                                 demanded (see EngineBackend::is_exact)
//
// Why the GPU is not held to bit-exactness even with EngineConfig::batch_invariant (decode
// rows on the prefill kernel, no CUDA graphs): its linear layers still depend on the step's
// shape. cuBLASLt picks an algorithm per GEMM shape (engine/cuda/gemm.h: the token count is
// part of the key), steps of at most 8 tokens run on the GEMV kernel instead, and bf16/fp16
// activations and KV entries round differently along those paths. The same request alone and
// batched therefore sees logits that differ at the rounding level, and a greedy argmax flips
// where two tokens are within that rounding of each other.
//
// The floors (non-exact backends), chosen to pass rounding and fail real bugs:
//  - every request finishes once, with no error, with the tokens its limits imply; every KV
//    block is free at the end (all backends);
//  - where two runs saw the same context (their common prefix, and the first position where
//    they differ) they saw the same distribution up to rounding: the sampled token's logprob
//    (common prefix) and the top-N alternatives agree within `tolerance` nats, and a token
//    one run lists but the other does not is at most `tolerance` above the other's last
//    listed one. KV corruption (a chunk's KV written to the wrong slots, a copy-on-write not
//    done), prefix-cache mix-ups and garbage logits show up here;
//  - greedy runs may diverge only at a near-tie: at the first differing position each run's
//    token is within `tolerance` of the other run's top logprob there.
// Position-by-position token agreement is printed, not floored: after a legitimate flip at a
// near-tie the rest of that sequence differs, so the fraction says little about bugs. With the
// CPU executor plus +-0.12 of batch-shape-dependent noise on stories260K's logits (engine_test's
// cpu_noisy_logits instantiation) 901 of 1,869 tokens agree, every divergence at a near-tie,
// and all floors pass; the same comparisons failed each of these bugs injected into the CPU
// executor: chunks' KV written one slot off, copy-on-write skipped, one row of garbage logits.
// Stop conditions are also checked against the backend's own alone run without them; that
// pair has identical step shapes, so it is demanded exactly on every backend.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"

namespace llm::test {

// Top alternatives requested with every token of the shared scenarios: the near-tie check
// looks the other run's token up among them.
constexpr int kNumTopLogprobs = 5;

// One request's channel, read to its end.
struct Collected {
  std::vector<std::vector<int>> tokens;              // per completion index
  std::vector<std::vector<OutputLogprob>> logprobs;  // per completion, when requested
  std::vector<std::string> text;
  std::vector<FinishReason> finish;
  std::vector<std::string> errors;  // the error of any event that carried one
  int num_last = 0;
  Usage usage;
};

// Reads a channel to its last event (n: the request's completions).
Collected Drain(OutputChannel& channel, int n = 1);

// A greedy request with ignore_eos (exactly max_tokens tokens) and kNumTopLogprobs logprobs.
Request Greedy(std::vector<int> prompt, int max_tokens);

// `count` greedy prompts of mixed lengths: story openings plus up to 150 random token ids from
// the stories260K vocabulary (also the random test models': they share its tokenizer).
std::vector<Request> MixedRequests(const Tokenizer& tokenizer, int count);

// A backend the scenarios run on (the test parameter; cheap to copy, loads nothing until used).
struct EngineBackend {
  std::string name;  // the test-name suffix: letters, digits and '_' only
  // Why it cannot run here ("" when it can): asked in SetUp, a reason skips the test.
  std::function<std::string()> unavailable;
  // The executor of an engine configured as `config`: a KV pool of config.num_kv_blocks blocks
  // of config.block_size, room for steps of config.max_num_batched_tokens tokens and
  // config.max_num_seqs sequences.
  std::function<std::unique_ptr<ModelExecutor>(const EngineConfig& config)> make_executor;
  std::function<const Tokenizer&()> tokenizer;
  bool batch_invariant = true;  // EngineConfig::batch_invariant of every engine
  // True: every invariance holds bit for bit here and is demanded so. False: agreement is
  // measured, printed and held to the floors at the top of this file.
  bool is_exact = true;
  // Non-exact backends: the largest logprob difference (nats) allowed between two runs over
  // their common prefix, and the width of a near-tie where greedy runs may diverge.
  std::function<double()> tolerance;
};

inline void PrintTo(const EngineBackend& backend, std::ostream* os) { *os << backend.name; }

// The fixture of the shared scenarios. Instantiate it in a test binary:
//   INSTANTIATE_TEST_SUITE_P(Cpu, EngineInvariance, ::testing::Values(backend, ...),
//                            EngineInvariance::Name);
class EngineInvariance : public ::testing::TestWithParam<EngineBackend> {
 public:
  static std::string Name(const ::testing::TestParamInfo<EngineBackend>& info) {
    return info.param.name;
  }

 protected:
  void SetUp() override;
  const EngineBackend& backend() const { return GetParam(); }
  const Tokenizer& tokenizer() const { return backend().tokenizer(); }
  // An engine over a new executor of this backend (config.batch_invariant is the backend's).
  std::unique_ptr<Engine> NewEngine(EngineConfig config) const;
  // Runs each request to its end before adding the next one.
  std::vector<Collected> RunAlone(Engine& engine, const std::vector<Request>& requests) const;
  // Adds every request, then runs until all have finished.
  std::vector<Collected> RunTogether(Engine& engine, const std::vector<Request>& requests) const;
  // Compares `runs` with `reference` (the same requests, completion by completion): exactly on
  // an exact backend, else measured and held to the floors; prints one line either way.
  void ExpectAgreement(const std::string& what, const std::vector<Collected>& reference,
                       const std::vector<Collected>& runs, bool is_greedy) const;
};

}  // namespace llm::test
