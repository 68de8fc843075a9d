// The engine's invariance scenarios over any backend (what, why and how strictly:
// tests/engine/engine_invariance.h). Instantiated by engine_test.cc (CPU) and
// engine_gpu_test.cc (CUDA).
#include "tests/engine/engine_invariance.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "tests/test_util.h"

namespace llm::test {

Collected Drain(OutputChannel& channel, int n) {
  Collected c;
  c.tokens.resize(size_t(n));
  c.logprobs.resize(size_t(n));
  c.text.resize(size_t(n));
  c.finish.assign(size_t(n), FinishReason::kNone);
  RequestOutput out;
  while (channel.Pop(&out, std::chrono::seconds(60))) {
    const size_t i = static_cast<size_t>(out.index);
    c.tokens[i].insert(c.tokens[i].end(), out.token_ids.begin(), out.token_ids.end());
    c.logprobs[i].insert(c.logprobs[i].end(), out.logprobs.begin(), out.logprobs.end());
    c.text[i] += out.text;
    if (!out.error.empty()) c.errors.push_back(out.error);
    if (out.finish_reason != FinishReason::kNone) c.finish[i] = out.finish_reason;
    if (out.is_last) {
      ++c.num_last;
      c.usage = out.usage;
      break;
    }
  }
  return c;
}

Request Greedy(std::vector<int> prompt, int max_tokens) {
  return GreedyRequest(std::move(prompt), max_tokens, kNumTopLogprobs);  // + the near-ties
}

std::vector<Request> MixedRequests(const Tokenizer& tokenizer, int count) {
  std::mt19937 rng(11);
  std::vector<Request> out;
  const char* openings[] = {"Once upon a time", "The little dog", "Lily and Ben went to the",
                            "One day, a big red ball", "Tom had a"};
  for (int i = 0; i < count; ++i) {
    std::vector<int> ids = tokenizer.EncodePrompt(openings[i % 5]);
    const int extra = std::uniform_int_distribution<int>(0, i % 3 == 0 ? 150 : 20)(rng);
    for (int k = 0; k < extra; ++k) ids.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    out.push_back(Greedy(ids, std::uniform_int_distribution<int>(5, 60)(rng)));
  }
  return out;
}

void EngineInvariance::SetUp() {
  if (backend().unavailable) {
    if (const std::string why = backend().unavailable(); !why.empty()) GTEST_SKIP() << why;
  }
}

std::unique_ptr<Engine> EngineInvariance::NewEngine(EngineConfig config) const {
  config.batch_invariant = backend().batch_invariant;
  return std::make_unique<Engine>(backend().make_executor(config), tokenizer(), config);
}

std::vector<Collected> EngineInvariance::RunAlone(Engine& engine,
                                                  const std::vector<Request>& requests) const {
  std::vector<Collected> out;
  for (const Request& r : requests) {
    auto channel = engine.AddRequest(r);
    engine.RunUntilIdle();
    out.push_back(Drain(*channel, r.sampling.n));
  }
  return out;
}

std::vector<Collected> EngineInvariance::RunTogether(Engine& engine,
                                                     const std::vector<Request>& requests) const {
  std::vector<std::shared_ptr<OutputChannel>> channels;
  for (const Request& r : requests) channels.push_back(engine.AddRequest(r));
  engine.RunUntilIdle();
  std::vector<Collected> out;
  for (size_t i = 0; i < requests.size(); ++i) {
    out.push_back(Drain(*channels[i], requests[i].sampling.n));
  }
  return out;
}

namespace {

// Engines of the scenarios. Tight: a pool too small for the batch (preemption) and a small
// token budget (chunked prefill), as engine_test has always used.
constexpr EngineConfig kRoomy{.num_kv_blocks = 512};
// kv_reserve_ratio 0: admit whenever a prompt fits, so that the pool runs dry and preempts
// (the default headroom exists to avoid exactly that).
constexpr EngineConfig kTight{
    .num_kv_blocks = 48, .max_num_batched_tokens = 96, .max_num_seqs = 32, .kv_reserve_ratio = 0};

// Every completion ended once, without an error, as its request's limits say.
void ExpectFinishedCleanly(const Request& r, const Collected& c, const std::string& what) {
  EXPECT_EQ(c.num_last, 1) << what;
  EXPECT_TRUE(c.errors.empty()) << what << ": " << (c.errors.empty() ? "" : c.errors[0]);
  const SamplingParams& sp = r.sampling;
  const bool has_stop = !sp.stop.empty() || !sp.stop_token_ids.empty() || !sp.ignore_eos;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    const FinishReason f = c.finish[i];
    EXPECT_TRUE(f == FinishReason::kLength || (has_stop && f == FinishReason::kStop))
        << what << ", completion " << i << ": finish reason '" << FinishReasonName(f) << "'";
    if (f == FinishReason::kLength) {
      EXPECT_EQ(std::ssize(c.tokens[i]), sp.max_tokens) << what;
    }
    if (sp.logprobs) {
      EXPECT_EQ(c.logprobs[i].size(), c.tokens[i].size()) << what;
      for (const OutputLogprob& lp : c.logprobs[i]) {  // a log-probability (rounding aside)
        EXPECT_TRUE(std::isfinite(lp.logprob) && lp.logprob <= 1e-4f) << what << ": " << lp.logprob;
        EXPECT_EQ(std::ssize(lp.top), *sp.logprobs) << what;
      }
    }
  }
}

void ExpectIdle(const Engine& engine, const std::string& what) {
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks) << what << ": KV blocks still held";
  EXPECT_EQ(s.num_running + s.num_waiting, 0) << what;
  EXPECT_EQ(s.num_failed_steps, 0) << what;
}

// How far below the top of `at` (a run's logprobs at one position) the token `other` is:
// found among the top alternatives, exactly; else at least as far as the last one listed
// (that lower bound is what is returned). 0 when no alternatives were requested.
double GapBelowTop(const OutputLogprob& at, int other) {
  if (at.top.empty()) return 0;
  const float top = at.top.front().logprob;
  for (const TokenLogprob& t : at.top) {
    if (t.token == other) return double(top) - t.logprob;
  }
  return double(top) - at.top.back().logprob;
}

// How far two top-N lists of (what should be) the same distribution disagree: for a token
// listed in both, the difference of its logprobs; for a token listed in one only, how far it
// is above the other list's last entry (it could sit just below that one there). 0 when no
// alternatives were requested.
double TopDisagreement(const OutputLogprob& a, const OutputLogprob& b) {
  if (a.top.empty() || b.top.empty()) return 0;
  auto one_way = [](const OutputLogprob& x, const OutputLogprob& y) {
    double worst = 0;
    for (const TokenLogprob& t : x.top) {
      const auto it = std::find_if(y.top.begin(), y.top.end(),
                                   [&](const TokenLogprob& u) { return u.token == t.token; });
      worst = std::max(worst, it != y.top.end() ? std::fabs(double(t.logprob) - it->logprob)
                                                : double(t.logprob) - y.top.back().logprob);
    }
    return worst;
  };
  return std::max(one_way(a, b), one_way(b, a));
}

bool SameLogprob(const OutputLogprob& a, const OutputLogprob& b) {
  if (a.token != b.token || a.logprob != b.logprob || a.top.size() != b.top.size()) return false;
  for (size_t k = 0; k < a.top.size(); ++k) {
    if (a.top[k].token != b.top[k].token || a.top[k].logprob != b.top[k].logprob) return false;
  }
  return true;
}

// What one comparison measured, summed over completions.
struct Agreement {
  int64_t num_seqs = 0, num_diverged = 0;
  int64_t num_tokens = 0;  // the reference's tokens
  int64_t num_equal = 0;   // equal to the run's token at the same position
  int64_t num_prefix = 0;  // in the common prefix (before the first difference)
  int64_t num_logprobs = 0, num_logprobs_identical = 0;  // over the common prefix
  // Where the context agreed: the largest logprob difference (sampled token, top-N), and
  // how many positions were beyond the tolerance; the first of them, for the failure message.
  double max_logprob_diff = 0;
  int64_t num_logprobs_beyond = 0;
  std::string first_logprobs_beyond;
  // Greedy divergences: how far below the top the other run's token was; how many were
  // beyond the tolerance; the first of them.
  double max_tie_gap = 0;
  int64_t num_ties_beyond = 0;
  std::string first_tie_beyond;
};

}  // namespace

void EngineInvariance::ExpectAgreement(const std::string& what,
                                       const std::vector<Collected>& reference,
                                       const std::vector<Collected>& runs, bool is_greedy) const {
  ASSERT_EQ(reference.size(), runs.size()) << what;
  const bool exact = backend().is_exact;
  const double tol = exact ? 0.0 : backend().tolerance();
  Agreement a;
  for (size_t req = 0; req < runs.size(); ++req) {
    ASSERT_EQ(reference[req].tokens.size(), runs[req].tokens.size()) << what;
    for (size_t i = 0; i < runs[req].tokens.size(); ++i) {
      const std::string where =
          what + ", request " + std::to_string(req) + ", completion " + std::to_string(i);
      const std::vector<int>& rt = reference[req].tokens[i];
      const std::vector<int>& ct = runs[req].tokens[i];
      const std::vector<OutputLogprob>& rl = reference[req].logprobs[i];
      const std::vector<OutputLogprob>& cl = runs[req].logprobs[i];
      const size_t common = std::min(rt.size(), ct.size());
      size_t prefix = 0;
      while (prefix < common && rt[prefix] == ct[prefix]) ++prefix;
      const bool diverged = prefix < std::max(rt.size(), ct.size());
      ++a.num_seqs;
      a.num_diverged += diverged;
      a.num_tokens += std::ssize(rt);
      a.num_prefix += int64_t(prefix);
      for (size_t t = 0; t < common; ++t) a.num_equal += rt[t] == ct[t];
      // Where both runs had the same context (the common prefix and the first differing
      // position) they saw the same distribution: the top alternatives agree, and in the
      // common prefix the sampled token's logprob too.
      const size_t same_context = std::min({prefix + (prefix < common), rl.size(), cl.size()});
      for (size_t t = 0; t < same_context; ++t) {
        double diff = 0;
        if (t < prefix) {
          ++a.num_logprobs;
          a.num_logprobs_identical += SameLogprob(rl[t], cl[t]);
          diff = std::fabs(double(rl[t].logprob) - cl[t].logprob);
        }
        diff = std::max(diff, TopDisagreement(rl[t], cl[t]));
        a.max_logprob_diff = std::max(a.max_logprob_diff, diff);
        if (!exact && diff > tol && a.num_logprobs_beyond++ == 0) {
          a.first_logprobs_beyond =
              where + ", token " + std::to_string(t) + ": " + std::to_string(diff) + " nats apart";
        }
      }
      if (exact) {
        EXPECT_EQ(ct, rt) << where;
        EXPECT_EQ(runs[req].text[i], reference[req].text[i]) << where;
        EXPECT_EQ(runs[req].finish[i], reference[req].finish[i]) << where;
        EXPECT_EQ(cl.size(), rl.size()) << where;
        continue;
      }
      if (!diverged) {
        EXPECT_EQ(runs[req].text[i], reference[req].text[i]) << where;
        EXPECT_EQ(runs[req].finish[i], reference[req].finish[i]) << where;
      } else if (is_greedy && prefix < common && prefix < rl.size() && prefix < cl.size()) {
        // Each run's argmax must be a near-tie in the other run's distribution.
        const double gap =
            std::max(GapBelowTop(rl[prefix], ct[prefix]), GapBelowTop(cl[prefix], rt[prefix]));
        a.max_tie_gap = std::max(a.max_tie_gap, gap);
        if (gap > tol && a.num_ties_beyond++ == 0) {
          a.first_tie_beyond = where + ": token " + std::to_string(prefix) + " is " +
                               std::to_string(rt[prefix]) + " vs " + std::to_string(ct[prefix]) +
                               ", " + std::to_string(gap) + " nats below the top";
        }
      }
    }
  }
  std::printf(
      "[invariance] %s, %s: tokens %lld/%lld equal, common prefix %lld/%lld, %lld/%lld "
      "sequences diverged; logprobs over the common prefix %lld/%lld bit-identical; max |diff| "
      "where the context agreed %.3g, largest gap below the top at a greedy divergence %.3g "
      "(tolerance %.3g)\n",
      backend().name.c_str(), what.c_str(), (long long)a.num_equal, (long long)a.num_tokens,
      (long long)a.num_prefix, (long long)a.num_tokens, (long long)a.num_diverged,
      (long long)a.num_seqs, (long long)a.num_logprobs_identical, (long long)a.num_logprobs,
      a.max_logprob_diff, a.max_tie_gap, tol);
  if (exact) {
    EXPECT_EQ(a.num_logprobs_identical, a.num_logprobs) << what << ": logprobs not bit-identical";
    return;
  }
  EXPECT_EQ(a.num_logprobs_beyond, 0)
      << what << ": positions where the runs saw the same context but their logprobs differ by "
      << "more than " << tol
      << " nats (KV or logits corrupted?); first: " << a.first_logprobs_beyond;
  EXPECT_EQ(a.num_ties_beyond, 0) << what
                                  << ": greedy runs diverged where the two tokens were not within "
                                  << tol
                                  << " nats (not a rounding flip); first: " << a.first_tie_beyond;
}

// 64 requests alone vs together: a pool too small for all (preemption) and a small token
// budget (chunked prefill).
TEST_P(EngineInvariance, BatchInvarianceUnderChunkingAndPreemption) {
  const std::vector<Request> requests = MixedRequests(tokenizer(), 64);
  std::vector<Collected> alone;
  {
    auto engine = NewEngine(kRoomy);
    alone = RunAlone(*engine, requests);
    ExpectIdle(*engine, "alone");
  }
  auto engine = NewEngine(kTight);
  const std::vector<Collected> together = RunTogether(*engine, requests);
  int64_t num_logprobs = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ExpectFinishedCleanly(requests[i], alone[i], "alone " + std::to_string(i));
    ExpectFinishedCleanly(requests[i], together[i], "together " + std::to_string(i));
    num_logprobs += std::ssize(together[i].logprobs[0]);
  }
  ExpectAgreement("64 requests together (chunked, preempted) vs alone", alone, together, true);
  EXPECT_GT(num_logprobs, 1000);
  const EngineStats s = engine->Stats();
  EXPECT_GT(s.num_preemptions, 0) << "the pool was meant to force preemption";
  ExpectIdle(*engine, "together");
  std::printf("[engine] %s: 64 requests together: %lld steps, %lld preemptions\n",
              backend().name.c_str(), (long long)s.num_steps, (long long)s.num_preemptions);
}

TEST_P(EngineInvariance, PrefixCacheHitGivesSameOutput) {
  auto engine = NewEngine({.num_kv_blocks = 256});
  const std::vector<int> prompt = tokenizer().EncodePrompt(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends and her big red ball.");
  const Request r = Greedy(prompt, 20);
  const std::vector<Collected> miss = RunAlone(*engine, {r});
  const std::vector<Collected> hit = RunAlone(*engine, {r});
  ExpectFinishedCleanly(r, miss[0], "miss");
  ExpectFinishedCleanly(r, hit[0], "hit");
  ExpectAgreement("prefix-cache hit vs miss", miss, hit, true);
  EXPECT_EQ(miss[0].usage.cached_prompt_tokens, 0);
  EXPECT_EQ(hit[0].usage.cached_prompt_tokens, (std::ssize(prompt) - 1) / 16 * 16);
  EXPECT_GT(hit[0].usage.cached_prompt_tokens, 0);
  ExpectIdle(*engine, "prefix cache");
}

TEST_P(EngineInvariance, SeedGivesSameTokensAloneOrBatched) {
  Request r = Greedy(tokenizer().EncodePrompt("Tom had a"), 30);
  r.sampling.temperature = 0.9;
  r.sampling.top_p = 0.95;
  r.sampling.seed = 1234;
  auto engine = NewEngine({.num_kv_blocks = 256});
  const std::vector<Collected> alone = RunAlone(*engine, {r});
  std::vector<Request> batch = MixedRequests(tokenizer(), 8);
  batch.push_back(r);
  const std::vector<Collected> together = RunTogether(*engine, batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    ExpectFinishedCleanly(batch[i], together[i], "batched " + std::to_string(i));
  }
  ExpectFinishedCleanly(r, alone[0], "alone");
  ExpectAgreement("seeded sampling batched vs alone", alone, {together.back()}, false);
  ExpectIdle(*engine, "seeded");
}

TEST_P(EngineInvariance, NCompletionsShareThePromptAndFinishOnce) {
  auto engine = NewEngine({.num_kv_blocks = 128});
  Request r = Greedy(tokenizer().EncodePrompt("The little dog"), 12);
  r.sampling.n = 3;
  r.sampling.temperature = 1.0;
  r.sampling.seed = 5;
  const Collected c = RunAlone(*engine, {r})[0];
  ExpectFinishedCleanly(r, c, "n = 3");
  EXPECT_EQ(c.num_last, 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::ssize(c.tokens[size_t(i)]), 12) << i;
    EXPECT_EQ(c.finish[size_t(i)], FinishReason::kLength) << i;
  }
  EXPECT_NE(c.tokens[0], c.tokens[1]) << "completions sample their own streams";
  EXPECT_EQ(c.usage.completion_tokens, 36);
  ExpectIdle(*engine, "n = 3");
}

// n > 1 (copy-on-write of the shared prompt blocks) under chunking and preemption: each
// completion's tokens as when its request ran alone.
TEST_P(EngineInvariance, NCompletionsGiveSameTokensAloneOrBatched) {
  Request r = Greedy(tokenizer().EncodePrompt("Lily and Ben went to the"), 40);
  r.sampling.n = 3;
  r.sampling.temperature = 0.8;
  r.sampling.seed = 77;
  std::vector<Collected> alone;
  {
    auto engine = NewEngine(kRoomy);
    alone = RunAlone(*engine, {r});
  }
  std::vector<Request> batch = MixedRequests(tokenizer(), 16);
  // First in, and a budget that admits nearly every prompt in the first step (the last ones
  // chunked): its children, created when its prompt is done, are then the newest sequences
  // and the first the full pool preempts (on the CPU: both children once, and 5 others).
  batch.insert(batch.begin(), r);
  auto engine = NewEngine({.num_kv_blocks = 40,
                           .max_num_batched_tokens = 512,
                           .max_num_seqs = 32,
                           .kv_reserve_ratio = 0});
  const std::vector<Collected> together = RunTogether(*engine, batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    ExpectFinishedCleanly(batch[i], together[i], "batched " + std::to_string(i));
  }
  ExpectFinishedCleanly(r, alone[0], "alone");
  ExpectAgreement("n = 3 seeded batched (chunked, preempted) vs alone", alone, {together[0]},
                  false);
  EXPECT_GT(engine->Stats().num_preemptions, 0) << "the pool was meant to force preemption";
  ExpectIdle(*engine, "n = 3 batched");
}

namespace {

// Three ASCII letters from the second half of `text` (a stop string that occurs in it), or "".
std::string StopStringFrom(const std::string& text) {
  for (size_t p = text.size() / 2; p + 3 <= text.size(); ++p) {
    if (std::isalpha((unsigned char)text[p]) && std::isalpha((unsigned char)text[p + 1]) &&
        std::isalpha((unsigned char)text[p + 2])) {
      return text.substr(p, 3);
    }
  }
  return "";
}

}  // namespace

// A stop token id and a stop string taken from each prompt's own greedy continuation: alone,
// the output is that continuation cut where the stop first occurs (the stop token and stop
// string excluded); batched with other requests under chunking and preemption, as alone.
TEST_P(EngineInvariance, StopConditionsEndOutputsAloneOrBatched) {
  const char* prompts[] = {"Once upon a time", "The little dog", "One day, a big red ball",
                           "Tom had a"};
  // No prefix caching: a stop run's steps have exactly its reference run's shapes, so the two
  // agree bit for bit on every backend.
  auto engine = NewEngine({.num_kv_blocks = 128, .enable_prefix_caching = false});
  std::vector<Request> stopped;
  std::vector<std::vector<int>> want_tokens;  // token stops: exactly; string stops: a prefix
  std::vector<std::string> want_text;         // string stops only
  for (const char* prompt : prompts) {
    const Request plain = Greedy(tokenizer().EncodePrompt(prompt), 32);
    const Collected ref = RunAlone(*engine, {plain})[0];
    ExpectFinishedCleanly(plain, ref, prompt);
    const std::vector<int>& tokens = ref.tokens[0];
    ASSERT_EQ(tokens.size(), 32u) << prompt;
    // Stop token: the 13th generated token; the output ends before its first occurrence.
    Request by_token = plain;
    by_token.sampling.stop_token_ids = {tokens[12]};
    stopped.push_back(by_token);
    want_tokens.emplace_back(tokens.begin(), std::find(tokens.begin(), tokens.end(), tokens[12]));
    want_text.emplace_back();
    // Stop string: three letters from the second half of the text; the text ends before it.
    const std::string stop = StopStringFrom(ref.text[0]);
    if (stop.empty()) {
      std::printf("[invariance] %s: no stop string in '%s'\n", prompt, ref.text[0].c_str());
      continue;
    }
    Request by_string = plain;
    by_string.sampling.stop = {stop};
    stopped.push_back(by_string);
    want_tokens.push_back(tokens);
    want_text.push_back(ref.text[0].substr(0, ref.text[0].find(stop)));
  }
  const std::vector<Collected> alone = RunAlone(*engine, stopped);
  for (size_t i = 0; i < stopped.size(); ++i) {
    const std::string what = "alone with a stop " + std::to_string(i);
    ExpectFinishedCleanly(stopped[i], alone[i], what);
    EXPECT_EQ(alone[i].finish[0], FinishReason::kStop) << what;
    const std::vector<int>& got = alone[i].tokens[0];
    if (!stopped[i].sampling.stop_token_ids.empty()) {
      EXPECT_EQ(got, want_tokens[i]) << what;
    } else {  // the tokens up to the one completing the stop string; the text before it
      EXPECT_EQ(alone[i].text[0], want_text[i]) << what;
      ASSERT_LE(got.size(), want_tokens[i].size()) << what;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want_tokens[i].begin())) << what;
    }
  }
  ExpectIdle(*engine, "stops alone");

  std::vector<Request> batch = MixedRequests(tokenizer(), 12);
  batch.insert(batch.begin() + 2, stopped.begin(), stopped.end());
  auto busy = NewEngine(kTight);
  const std::vector<Collected> together = RunTogether(*busy, batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    ExpectFinishedCleanly(batch[i], together[i], "batched " + std::to_string(i));
  }
  const std::vector<Collected> stopped_together(together.begin() + 2,
                                                together.begin() + 2 + std::ssize(stopped));
  for (size_t i = 0; i < stopped.size(); ++i) {  // whatever the tokens, the stop held
    const SamplingParams& sp = stopped[i].sampling;
    const Collected& c = stopped_together[i];
    for (int id : sp.stop_token_ids) {
      EXPECT_EQ(std::count(c.tokens[0].begin(), c.tokens[0].end(), id), 0) << "stop " << i;
    }
    for (const std::string& s : sp.stop) {
      EXPECT_EQ(c.text[0].find(s), std::string::npos) << "stop " << i;
    }
  }
  ExpectAgreement("stop conditions batched (chunked, preempted) vs alone", alone, stopped_together,
                  true);
  ExpectIdle(*busy, "stops batched");
}

}  // namespace llm::test
