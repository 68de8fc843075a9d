#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "engine/error.h"

namespace llm {
namespace {

std::string Num(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

bool InRange(double v, double lo, double hi) { return v >= lo && v <= hi; }  // false for NaN

// vocab_size <= 0: no vocabulary known, ids are only checked to be >= 0.
std::string CheckTokenId(const std::string& what, int id, int64_t vocab_size) {
  if (id >= 0 && (vocab_size <= 0 || id < vocab_size)) return "";
  if (vocab_size <= 0) return what + " token id " + std::to_string(id) + " must be >= 0";
  return what + " token id " + std::to_string(id) + " is outside the vocabulary [0, " +
         std::to_string(vocab_size) + ")";
}

std::string ValidateNumbers(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0) {
    return "temperature must be a finite number >= 0, got " + Num(p.temperature);
  }
  if (p.top_k < -1) {
    return "top_k must be -1 or 0 (no limit) or >= 1, got " + std::to_string(p.top_k);
  }
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) return "top_p must be in (0, 1], got " + Num(p.top_p);
  if (!InRange(p.min_p, 0.0, 1.0)) return "min_p must be in [0, 1], got " + Num(p.min_p);
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0) {
    return "repetition_penalty must be a finite number > 0, got " + Num(p.repetition_penalty);
  }
  const double m = SamplingParams::kMaxPenalty;
  if (!InRange(p.presence_penalty, -m, m)) {
    return "presence_penalty must be in [-2, 2], got " + Num(p.presence_penalty);
  }
  if (!InRange(p.frequency_penalty, -m, m)) {
    return "frequency_penalty must be in [-2, 2], got " + Num(p.frequency_penalty);
  }
  if (p.max_tokens < 1) return "max_tokens must be >= 1, got " + std::to_string(p.max_tokens);
  if (p.logprobs && !(*p.logprobs >= 0 && *p.logprobs <= SamplingParams::kMaxLogprobs)) {
    return "logprobs must be between 0 and 20, got " + std::to_string(*p.logprobs);
  }
  if (p.n < 1 || p.n > SamplingParams::kMaxN) {
    return "n must be between 1 and 16, got " + std::to_string(p.n);
  }
  return "";
}

std::string ValidateTokensAndStops(const SamplingParams& p, int64_t vocab_size) {
  for (const auto& [id, bias] : p.logit_bias) {
    if (std::string e = CheckTokenId("logit_bias", id, vocab_size); !e.empty()) return e;
    if (!InRange(bias, -SamplingParams::kMaxLogitBias, SamplingParams::kMaxLogitBias)) {
      return "logit_bias for token " + std::to_string(id) + " must be in [-100, 100], got " +
             Num(bias);
    }
  }
  for (int id : p.stop_token_ids) {
    if (std::string e = CheckTokenId("stop_token_ids", id, vocab_size); !e.empty()) return e;
  }
  if (p.stop.size() > static_cast<size_t>(SamplingParams::kMaxStopStrings)) {
    return "stop may hold at most 16 strings, got " + std::to_string(p.stop.size());
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) return "stop[" + std::to_string(i) + "] must not be empty";
  }
  return "";
}

}  // namespace

std::string SamplingParams::Validate(int64_t vocab_size) const {
  if (vocab_size <= 0) return "the vocabulary is empty";
  if (std::string e = ValidateNumbers(*this); !e.empty()) return e;
  return ValidateTokensAndStops(*this, vocab_size);
}

std::string SamplingParams::Validate() const {
  if (std::string e = ValidateNumbers(*this); !e.empty()) return e;
  return ValidateTokensAndStops(*this, 0);
}

int Argmax(std::span<const float> logits) {
  int best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int>(i);
  }
  return best;
}

double LogSumExp(std::span<const float> logits) {
  const double max_logit = logits[static_cast<size_t>(Argmax(logits))];
  if (!std::isfinite(max_logit)) return max_logit;
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max_logit);
  return max_logit + std::log(sum);
}

Sampler::Sampler(const SamplingParams& params, std::span<const int> prompt_ids,
                 uint64_t seed_offset)
    : params_(params) {
  const std::string problem = params.Validate();
  if (!problem.empty()) throw Error(problem);
  if (params.seed) {
    // Both words of the seed and of the offset enter the state: offsets give unrelated streams.
    const uint64_t s = *params.seed;
    std::seed_seq seq{static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32),
                      static_cast<uint32_t>(seed_offset), static_cast<uint32_t>(seed_offset >> 32)};
    rng_.seed(seq);
  } else {
    rng_.seed(std::random_device{}());
  }
  for (int id : prompt_ids) {
    if (id < 0) throw Error("prompt token id " + std::to_string(id) + " is negative");
    seen_.insert(id);
  }
}

void Sampler::Observe(int token) {
  if (token < 0) throw Error("output token id " + std::to_string(token) + " is negative");
  seen_.insert(token);
  ++output_counts_[token];
}

void Sampler::ApplyBiasAndPenalties(std::span<float> logits) const {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto check = [&](int id, const char* what) {
    if (id >= vocab) {
      throw Error(std::string(what) + " token id " + std::to_string(id) +
                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  };
  for (const auto& [id, bias] : params_.logit_bias) {
    check(id, "logit_bias");
    logits[static_cast<size_t>(id)] += bias;
  }
  if (params_.repetition_penalty != 1.0) {
    const float r = static_cast<float>(params_.repetition_penalty);
    for (int id : seen_) {
      check(id, "seen");
      float& l = logits[static_cast<size_t>(id)];
      l = l > 0 ? l / r : l * r;
    }
  }
  if (params_.presence_penalty != 0.0 || params_.frequency_penalty != 0.0) {
    for (const auto& [id, count] : output_counts_) {
      check(id, "output");
      logits[static_cast<size_t>(id)] -=
          static_cast<float>(params_.presence_penalty + params_.frequency_penalty * count);
    }
  }
}

std::vector<float> Sampler::ProcessedLogits(std::span<const float> logits) const {
  std::vector<float> out(logits.begin(), logits.end());
  ApplyBiasAndPenalties(out);
  return out;
}

SampleResult Sampler::Sample(std::span<const float> logits) {
  if (logits.empty()) throw Error("Sample: empty logits");
  if (std::any_of(logits.begin(), logits.end(), [](float l) { return std::isnan(l); })) {
    throw Error("Sample: the logits contain NaN");
  }
  SampleResult result;
  work_.assign(logits.begin(), logits.end());
  ApplyBiasAndPenalties(work_);
  if (params_.is_greedy() || params_.top_k == 1) {
    result.token = Argmax(work_);
  } else {
    result.token = SampleProcessed(work_);
  }
  Observe(result.token);
  if (!params_.logprobs) return result;

  // Raw logprobs: log_softmax of the unprocessed logits.
  const double lse = LogSumExp(logits);
  result.logprob = static_cast<float>(logits[static_cast<size_t>(result.token)] - lse);
  const size_t num_top = std::min(static_cast<size_t>(*params_.logprobs), logits.size());
  if (num_top == 0) return result;
  ids_.resize(logits.size());
  std::iota(ids_.begin(), ids_.end(), 0);
  std::partial_sort(
      ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(num_top), ids_.end(),
      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (size_t i = 0; i < num_top; ++i) {
    const int id = ids_[i];
    result.top_logprobs.push_back({id, static_cast<float>(logits[static_cast<size_t>(id)] - lse)});
  }
  return result;
}

// ids_[0, k) := the k highest logits, sorted descending, ties by id ascending.
void Sampler::SelectTopK(std::span<const float> logits, size_t k) {
  std::partial_sort(
      ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(k), ids_.end(),
      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
}

// Keeps the smallest prefix (in probability order) of ids_[0, num_candidates) whose mass
// reaches top_p, and returns its length. The prefix is sorted lazily in growing chunks, so a
// peaked distribution over 128k tokens sorts only a few hundred of them.
size_t Sampler::ApplyTopP(std::span<const float> logits, double max_logit, size_t num_candidates) {
  const double inv_t = 1.0 / params_.temperature;
  auto weight = [&](int id) { return std::exp((logits[id] - max_logit) * inv_t); };
  double total = 0;
  for (size_t i = 0; i < num_candidates; ++i) total += weight(ids_[i]);
  const double target = params_.top_p * total;
  auto by_logit = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  // With top-k on, ids_[0, num_candidates) is already sorted.
  size_t sorted_end = params_.top_k > 0 ? num_candidates : 0;
  double mass = 0;
  for (size_t i = 0; i < num_candidates; ++i) {
    if (i == sorted_end) {
      sorted_end = std::min(num_candidates, std::max<size_t>(256, 4 * sorted_end));
      std::partial_sort(ids_.begin() + static_cast<ptrdiff_t>(i),
                        ids_.begin() + static_cast<ptrdiff_t>(sorted_end),
                        ids_.begin() + static_cast<ptrdiff_t>(num_candidates), by_logit);
    }
    mass += weight(ids_[i]);
    if (mass >= target) return i + 1;
  }
  return num_candidates;
}

// Steps 5-9 on the processed logits [vocab].
int Sampler::SampleProcessed(std::span<const float> logits) {
  const size_t vocab = logits.size();
  ids_.resize(vocab);
  std::iota(ids_.begin(), ids_.end(), 0);
  size_t num = vocab;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab) {
    num = static_cast<size_t>(params_.top_k);
    SelectTopK(logits, num);
  }
  // The maximum is always a candidate: top-k and top-p keep a prefix of the sorted order.
  const double max_logit = logits[static_cast<size_t>(Argmax(logits))];
  if (!std::isfinite(max_logit)) return Argmax(logits);
  if (params_.top_p < 1.0) num = ApplyTopP(logits, max_logit, num);
  // Weights are probabilities times a constant; the maximum's weight is 1, so min-p keeps
  // weight >= min_p. Compaction keeps the order (and the maximum).
  const double inv_t = 1.0 / params_.temperature;
  weights_.resize(num);
  size_t kept = 0;
  double total = 0;
  for (size_t i = 0; i < num; ++i) {
    const double w = std::exp((logits[ids_[i]] - max_logit) * inv_t);
    if (w < params_.min_p) continue;
    ids_[kept] = ids_[i];
    weights_[kept++] = w;
    total += w;
  }
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double acc = 0;
  for (size_t i = 0; i < kept; ++i) {
    acc += weights_[i];
    if (u < acc) return ids_[i];
  }
  return ids_[kept - 1];
}

}  // namespace llm
