// Token sampling from one row of logits: greedy, temperature, top-k, top-p, with a seeded
// generator so the same seed reproduces the same tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>

namespace llm {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  int top_k = 0;             // 0 or < 0 = no limit
  double top_p = 1.0;        // (0, 1]
  std::optional<uint64_t> seed;

  // Empty when valid, else a message naming the parameter.
  std::string Validate() const;
  bool is_greedy() const { return temperature <= 0.0; }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token id from logits [vocab]. Greedy ties go to the lowest id (as torch.argmax).
  int Sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

// argmax with ties to the lowest index.
int Argmax(std::span<const float> logits);

}  // namespace llm
