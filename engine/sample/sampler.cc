#include "engine/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "engine/error.h"
#include "engine/grammar/matcher.h"

namespace llm {
namespace {

// Candidate order: logit descending, ties by id ascending (a strict total order).
struct ByLogit {
  std::span<const float> logits;
  bool operator()(int a, int b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

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

// Two passes: a max that vectorizes (the ternary is exactly maxps), then the first index
// holding it. One pass that tracks the index runs ~8x slower over a 128k vocabulary.
int Argmax(std::span<const float> logits) {
  float max_logit = logits[0];
  for (float l : logits) max_logit = l > max_logit ? l : max_logit;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == max_logit) return static_cast<int>(i);
  }
  return 0;  // all NaN
}

double LogSumExp(std::span<const float> logits) {
  const double max_logit = logits[static_cast<size_t>(Argmax(logits))];
  if (!std::isfinite(max_logit)) return max_logit;
  double sum = 0;
  // exp in float (a few times faster than double over a 128k vocabulary), summed in double.
  for (float l : logits) sum += std::exp(static_cast<float>(l - max_logit));
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
    device_seed_ = std::mt19937_64(seq)();
  } else {
    rng_.seed(std::random_device{}());
    device_seed_ = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  }
  for (int id : prompt_ids) {
    if (id < 0) throw Error("prompt token id " + std::to_string(id) + " is negative");
    seen_.insert(id);
  }
  if (params.grammar) matcher_ = std::make_unique<grammar::Matcher>(params.grammar);
}

Sampler::~Sampler() = default;
Sampler::Sampler(Sampler&&) noexcept = default;

void Sampler::Observe(int token) {
  if (token < 0) throw Error("output token id " + std::to_string(token) + " is negative");
  seen_.insert(token);
  ++output_counts_[token];
  if (matcher_) matcher_->Accept(token);
}

const uint32_t* Sampler::AllowedTokens() { return matcher_ ? matcher_->AllowedTokens() : nullptr; }

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

bool Sampler::depends_on_output() const { return has_penalties() || matcher_ != nullptr; }

bool Sampler::has_penalties() const {
  return params_.repetition_penalty != 1.0 || params_.presence_penalty != 0.0 ||
         params_.frequency_penalty != 0.0;
}

void Sampler::RecordSample(int token) {
  Observe(token);
  ++num_draws_;
}

void Sampler::AppendAdjustments(int64_t vocab, std::vector<TokenAdjust>* out) const {
  std::map<int, TokenAdjust> by_id;
  auto entry = [&](int id, const char* what) -> TokenAdjust& {
    if (id < 0 || id >= vocab) {
      throw Error(std::string(what) + " token id " + std::to_string(id) +
                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    TokenAdjust& a = by_id[id];
    a.token = id;
    return a;
  };
  for (const auto& [id, bias] : params_.logit_bias) entry(id, "logit_bias").bias = bias;
  if (params_.repetition_penalty != 1.0) {
    for (int id : seen_)
      entry(id, "seen").repetition = static_cast<float>(params_.repetition_penalty);
  }
  if (params_.presence_penalty != 0.0 || params_.frequency_penalty != 0.0) {
    for (const auto& [id, count] : output_counts_) {
      entry(id, "output").subtract =
          static_cast<float>(params_.presence_penalty + params_.frequency_penalty * count);
    }
  }
  for (const auto& [id, a] : by_id) out->push_back(a);
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
  if (const uint32_t* allowed = AllowedTokens()) {  // first: nothing else can bring a token back
    const float minus_inf = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < work_.size(); ++i) {
      if (((allowed[i / 32] >> (i % 32)) & 1u) == 0) work_[i] = minus_inf;
    }
  }
  ApplyBiasAndPenalties(work_);
  if (params_.is_greedy() || params_.top_k == 1) {
    result.token = Argmax(work_);
  } else {
    result.token = SampleProcessed(work_);
  }
  Observe(result.token);
  ++num_draws_;
  if (!params_.logprobs) return result;

  // Raw logprobs: log_softmax of the unprocessed logits.
  const double lse = LogSumExp(logits);
  result.logprob = static_cast<float>(logits[static_cast<size_t>(result.token)] - lse);
  const size_t num_top = std::min(static_cast<size_t>(*params_.logprobs), logits.size());
  if (num_top == 0) return result;
  ids_.resize(logits.size());
  std::iota(ids_.begin(), ids_.end(), 0);
  std::partial_sort(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(num_top), ids_.end(),
                    ByLogit{logits});
  for (size_t i = 0; i < num_top; ++i) {
    const int id = ids_[i];
    result.top_logprobs.push_back({id, static_cast<float>(logits[static_cast<size_t>(id)] - lse)});
  }
  return result;
}

// Keeps the smallest set of highest-ranked candidates in ids_[0, num_candidates) whose mass
// reaches top_p, moves it to the front and returns its size. First a sorted head of 256
// (enough for peaked distributions), then quickselect on the mass instead of a full sort:
// O(vocab) expected, also for flat distributions whose nucleus is most of a 128k vocabulary.
// Quickselect invariant: ids_[0, lo) are the lo highest-ranked candidates, with mass `mass`,
// and the answer lies in [lo, hi].
size_t Sampler::ApplyTopP(std::span<const float> logits, size_t num_candidates) {
  const ByLogit by_logit{logits};
  double total = 0;
  for (size_t i = 0; i < num_candidates; ++i) total += weights_[ids_[i]];
  const double target = params_.top_p * total;
  auto at = [&](size_t i) { return ids_.begin() + static_cast<ptrdiff_t>(i); };
  // Peaked distributions (the usual case): the nucleus lies in the top few hundred.
  const size_t head = std::min<size_t>(num_candidates, 256);
  std::partial_sort(at(0), at(head), at(num_candidates), by_logit);
  double mass = 0;
  for (size_t i = 0; i < head; ++i) {
    mass += weights_[ids_[i]];
    if (mass >= target) return i + 1;
  }
  size_t lo = head, hi = num_candidates;
  while (hi - lo > 64) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(at(lo), at(mid), at(hi), by_logit);  // [lo, mid) rank above [mid, hi)
    double upper = 0;
    for (size_t i = lo; i < mid; ++i) upper += weights_[ids_[i]];
    if (mass + upper >= target) {
      hi = mid;
    } else {
      mass += upper;
      lo = mid;
    }
  }
  std::sort(at(lo), at(hi), by_logit);
  for (size_t i = lo; i < hi; ++i) {
    mass += weights_[ids_[i]];
    if (mass >= target) return i + 1;
  }
  return hi;
}

// Steps 5-9 on the processed logits [vocab].
int Sampler::SampleProcessed(std::span<const float> logits) {
  const size_t vocab = logits.size();
  ids_.resize(vocab);
  std::iota(ids_.begin(), ids_.end(), 0);
  size_t num = vocab;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab) {
    num = static_cast<size_t>(params_.top_k);
    // A heap beats quickselect for small k (one comparison for most tokens).
    if (num * 16 <= vocab) {
      std::partial_sort(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(num), ids_.end(),
                        ByLogit{logits});
    } else {
      std::nth_element(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(num), ids_.end(),
                       ByLogit{logits});
    }
  }
  // The maximum stays a candidate through top-k and top-p; its weight is 1.
  const double max_logit = logits[static_cast<size_t>(Argmax(logits))];
  if (!std::isfinite(max_logit)) return Argmax(logits);
  const double inv_t = 1.0 / params_.temperature;
  weights_.resize(vocab);
  for (size_t i = 0; i < num; ++i) {
    const int id = ids_[i];
    weights_[id] = std::exp(static_cast<float>((logits[id] - max_logit) * inv_t));
  }
  if (params_.top_p < 1.0) num = ApplyTopP(logits, num);
  // min-p: prob >= min_p * max prob, i.e. weight >= min_p. The walk order below is the
  // candidate order, which is deterministic for given logits.
  size_t kept = 0;
  double total = 0;
  for (size_t i = 0; i < num; ++i) {
    const int id = ids_[i];
    if (weights_[id] < params_.min_p) continue;
    ids_[kept++] = id;
    total += weights_[id];
  }
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double acc = 0;
  for (size_t i = 0; i < kept; ++i) {
    acc += weights_[ids_[i]];
    if (u < acc) return ids_[i];
  }
  return ids_[kept - 1];
}

}  // namespace llm
