#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/error.h"

namespace llm {

std::string SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0) {
    return "temperature must be a finite number >= 0";
  }
  if (!(top_p > 0.0 && top_p <= 1.0)) return "top_p must be in (0, 1]";
  return "";
}

int Argmax(std::span<const float> logits) {
  int best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  const std::string problem = params.Validate();
  if (!problem.empty()) throw Error(problem);
  if (params.seed) {
    rng_.seed(*params.seed);
  } else {
    rng_.seed(std::random_device{}());
  }
}

int Sampler::Sample(std::span<const float> logits) {
  if (params_.is_greedy() || params_.top_k == 1) return Argmax(logits);
  // Candidates sorted by logit (descending, ties by id), cut to top-k.
  std::vector<int> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  size_t k = ids.size();
  if (params_.top_k > 0) k = std::min(k, static_cast<size_t>(params_.top_k));
  auto by_logit = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k), ids.end(), by_logit);
  ids.resize(k);
  // Softmax of logits / temperature over the candidates (in double: stable and exact enough).
  const double inv_t = 1.0 / params_.temperature;
  const double max_logit = logits[ids[0]];
  std::vector<double> probs(k);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    probs[i] = std::exp((logits[ids[i]] - max_logit) * inv_t);
    sum += probs[i];
  }
  // Top-p: the smallest prefix whose mass reaches top_p (always at least one token).
  size_t keep = k;
  if (params_.top_p < 1.0) {
    double mass = 0;
    for (size_t i = 0; i < k; ++i) {
      mass += probs[i] / sum;
      if (mass >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double kept_sum = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  const double u = std::uniform_real_distribution<double>(0.0, kept_sum)(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace llm
