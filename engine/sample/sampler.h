// Token sampling for one sequence: logit bias, repetition / presence / frequency penalties,
// greedy, temperature, top-k, top-p, min-p, raw logprobs. Names and meanings follow vLLM's
// SamplingParams (and OpenAI's request fields, which the server maps onto them).
//
// Processing order inside Sampler::Sample (logits [vocab] -> one token id):
//   1. logit_bias           logit[id] += bias
//   2. repetition_penalty   tokens seen in prompt or output: logit / r if > 0, else logit * r
//   3. presence/frequency   output tokens only: logit -= presence * [count > 0] + freq * count
//   4. greedy               is_greedy() or top_k == 1: argmax here (ties -> lowest id)
//   5. temperature          logit / T
//   6. top-k                keep the k highest (ties -> lowest id)
//   7. top-p                keep the smallest prefix (by probability) whose mass >= top_p
//   8. min-p                keep tokens with prob >= min_p * max prob
//   9. sample               one uniform draw from the sequence's own generator
// Note: vLLM v1 applies min-p before top-k/top-p. min-p commutes with top-k (both keep a
// prefix of the same order) but not with top-p; we apply it last.
//
// logprobs are of the model's raw distribution (log_softmax of the unprocessed logits, vLLM's
// default "raw_logprobs"), not of the processed one that was sampled from.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace llm {

namespace grammar {
class CompiledGrammar;  // engine/grammar/matcher.h
class Matcher;
}  // namespace grammar

struct SamplingParams {
  static constexpr int kMaxN = 16;              // completions per prompt
  static constexpr int kMaxLogprobs = 20;       // top alternatives per token (OpenAI's cap)
  static constexpr int kMaxStopStrings = 16;    // OpenAI allows 4; vLLM has no cap
  static constexpr double kMaxLogitBias = 100;  // OpenAI's range [-100, 100]
  static constexpr double kMaxPenalty = 2.0;    // presence/frequency in [-2, 2]
  // Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS).
  static constexpr double kGreedyTemperature = 1e-5;

  double temperature = 1.0;  // >= 0, finite; no upper bound (as vLLM; the server may cap at 2)
  int top_k = 0;             // -1 or 0 = no limit, else >= 1
  double top_p = 1.0;        // (0, 1]
  double min_p = 0.0;        // [0, 1]; 0 = off
  double repetition_penalty = 1.0;  // > 0, finite; 1 = off
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  std::map<int, float> logit_bias;  // token id -> bias in [-100, 100] (-100 bans in practice)
  int max_tokens = 16;              // >= 1 (as vLLM; OpenAI completions' default of 16)
  bool ignore_eos = false;          // keep going past EOS (the engine reads this)
  std::vector<std::string> stop;    // at most 16 non-empty strings; excluded from the output
  std::vector<int> stop_token_ids;  // ids in the vocabulary; the engine stops on them
  std::optional<int> logprobs;      // unset = none; N in [0, 20]: sampled token + top N
  int n = 1;                        // [1, 16] completions per prompt
  std::optional<uint64_t> seed;     // unset = nondeterministic
  // Structured output (engine/grammar): only tokens that keep the output a prefix of the
  // grammar's language are sampled, EOS only where the output is complete. Null = none.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;

  // Empty when valid, else a message naming the parameter, the allowed range and the value.
  // Token ids (logit_bias, stop_token_ids) are checked against [0, vocab_size).
  std::string Validate(int64_t vocab_size) const;
  // The same without a vocabulary: token ids are only checked to be >= 0.
  std::string Validate() const;
  bool is_greedy() const { return temperature < kGreedyTemperature; }
};

struct TokenLogprob {
  int token = 0;
  float logprob = 0;
};

struct SampleResult {
  int token = 0;
  // Set when params.logprobs is set: log_softmax(raw logits)[token].
  std::optional<float> logprob;
  // params.logprobs > 0: the top-N tokens of the raw distribution, logprob descending, ties by
  // id ascending. Empty otherwise.
  std::vector<TokenLogprob> top_logprobs;
};

// Steps 1-3 of one token as a sparse entry, for samplers that run elsewhere (the CUDA
// backend): l += bias; l = l > 0 ? l / repetition : l * repetition; l -= subtract.
struct TokenAdjust {
  int32_t token = 0;
  float bias = 0.f;
  float repetition = 1.f;
  float subtract = 0.f;
};

// One per sequence; not thread-safe (one sequence is stepped by one thread at a time).
class Sampler {
 public:
  // Throws Error when params.Validate() fails. prompt_ids feed the repetition penalty.
  // seed_offset derives an independent, deterministic stream from params.seed: the engine
  // passes the child index (0..n-1) for n > 1. A seeded sequence draws the same tokens alone
  // or in a batch, because each Sampler owns its generator.
  explicit Sampler(const SamplingParams& params, std::span<const int> prompt_ids = {},
                   uint64_t seed_offset = 0);
  ~Sampler();
  Sampler(Sampler&&) noexcept;

  // Picks a token from logits [vocab] and records it as an output token (Observe), so the
  // caller does not call Observe for it. Throws Error if a logit_bias id or a seen token id
  // lies outside [0, vocab).
  SampleResult Sample(std::span<const float> logits);

  // Records an output token the sampler did not pick (forced by the engine, or replayed
  // after preemption) for the repetition / presence / frequency penalties.
  void Observe(int token);

  // logits [vocab] after steps 1-3 (bias and penalties), before temperature: for tests and
  // debugging. Does not change the sampler's state.
  std::vector<float> ProcessedLogits(std::span<const float> logits) const;

  // ---- For a sampler on a device (engine/executor.h): the device draws from a counter-based
  // generator keyed by (device_seed, num_draws), deterministic for a seeded request alone or
  // in any batch (a different stream from the host's mt19937_64).
  const SamplingParams& params() const { return params_; }
  uint64_t device_seed() const { return device_seed_; }
  uint64_t num_draws() const { return num_draws_; }
  // Appends steps 1-3 for the current state as sparse entries, token ascending. Throws
  // Error for an id outside [0, vocab) (as Sample does).
  void AppendAdjustments(int64_t vocab, std::vector<TokenAdjust>* out) const;
  // Records a token the device sampled: an output token for the penalties, one more draw.
  void RecordSample(int token);
  // The same in two halves, for a step launched before the previous one's tokens are back
  // (async scheduling): TakeDraw at launch returns this draw's counter (num_draws() before
  // it), Observe(token) once the token is known.
  uint64_t TakeDraw() { return num_draws_++; }
  // Gives back `count` draws taken for a step that failed at launch (nothing was sampled): a
  // seeded request retried after it draws what it would have drawn.
  void UndoDraws(uint64_t count) { num_draws_ -= count; }
  // True when the processed logits depend on the tokens generated so far (repetition,
  // presence or frequency penalty, a grammar): such a sequence's next step needs its last
  // token first.
  bool depends_on_output() const;
  // Repetition, presence or frequency penalty (a device sampler builds their entries from
  // every token so far when the step is launched).
  bool has_penalties() const;
  // Structured output: the tokens allowed next as a packed bitmask (token t is allowed when
  // bit t % 32 of word t / 32 is set), at least (vocab + 31) / 32 words for the model's
  // logits width; ids past the tokenizer's vocabulary are never allowed. Null when the
  // request has no grammar. Valid until the next Observe / Sample.
  const uint32_t* AllowedTokens();
  bool has_grammar() const { return matcher_ != nullptr; }

 private:
  void ApplyBiasAndPenalties(std::span<float> logits) const;
  int SampleProcessed(std::span<const float> logits);
  size_t ApplyTopP(std::span<const float> logits, size_t num_candidates);

  SamplingParams params_;
  std::unique_ptr<grammar::Matcher> matcher_;  // when params_.grammar is set
  std::mt19937_64 rng_;
  uint64_t device_seed_ = 0;
  uint64_t num_draws_ = 0;
  std::unordered_set<int> seen_;                // prompt and output tokens
  std::unordered_map<int, int> output_counts_;  // output token -> count
  // Scratch buffers reused across steps, each [vocab].
  std::vector<float> work_;      // processed logits
  std::vector<int> ids_;         // candidate ids; [0, num_candidates) are the live ones
  std::vector<double> weights_;  // by id: exp((logit - max) / T), set for candidates only
};

// argmax with ties to the lowest index.
int Argmax(std::span<const float> logits);

// log_softmax(logits)[token] for every token is logits[token] - LogSumExp(logits).
double LogSumExp(std::span<const float> logits);

}  // namespace llm
