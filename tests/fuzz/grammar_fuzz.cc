// Fuzzes the structured-output grammar engine (engine/grammar): the front ends and the
// matcher. The first byte picks the front end and its flags, the rest is the text:
//   byte & 3 == 0: a JSON schema (StructuredSpec kJsonSchema; an empty text is kJsonObject),
//                  bit 2 = strict, bit 3 = compact;
//               1: a regex;  2: an EBNF grammar;  3: choices, one per line.
// Every input goes through GrammarCompiler::Compile (a fresh compiler, a 0.5 s deadline) over a
// small synthetic vocabulary, and must compile or throw GrammarError (any other exception is
// a crash), and return within the deadline plus a second of slack. Then a Matcher runs up to
// 48 steps, each choosing an allowed token from the mask by the input's bytes (read
// backwards, so that the choices vary with the text), and checks:
//   - the mask equals a brute-force check of every token (its bytes lead from the current
//     state to a live state; EOS exactly where the output is complete; never the special, the
//     empty or a beyond-the-vocabulary id);
//   - Accept returns true for the chosen token, and the matcher stays live;
//   - once EOS is accepted the output is a sentence: JSON text (RFC 8259 syntax) for a
//     schema (which nlohmann::json reads: numbers within a double's range), one of the
//     choices, a complete match of the regex / grammar;
//   - the initial state is live and every live state allows some token (a grammar whose
//     language is empty is refused at Build, and its dead-end alternatives are dropped);
// except where the automaton hit its size bounds (CompiledGrammar::Stats::num_capped), where
// a state goes dead by design.
// GRAMMAR_FUZZ_VERBOSE=1 prints each input's compile error or output.
//
//   scripts/fuzz.sh grammar
//   build-fuzz/grammar_fuzz FILE          (one input; FILE's first byte is the mode)
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/compiler.h"
#include "engine/grammar/matcher.h"

namespace {

using llm::grammar::CompiledGrammar;
using llm::grammar::GrammarCompiler;
using llm::grammar::GrammarError;
using llm::grammar::Matcher;
using llm::grammar::StructuredSpec;
using llm::grammar::TokenVocabulary;

constexpr int kEos = 0;
constexpr int kMaxSteps = 48;
constexpr double kCompileTimeoutSeconds = 0.5;
constexpr double kSlackSeconds = 1.0;

// `text` as a JSON string: control bytes and invalid UTF-8 made visible.
std::string Quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "grammar_fuzz: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

// Ids: 0 EOS, 1 a special token, 2..257 the single bytes, then multi-byte tokens of JSON,
// whitespace and UTF-8 (whole characters and pieces of them), then one empty token. The mask
// is 3 ids wider than the vocabulary (ids a tokenizer lacks, as in padded logits).
const std::shared_ptr<const TokenVocabulary>& Vocab() {
  static const std::shared_ptr<const TokenVocabulary> vocab = [] {
    std::vector<std::optional<std::string>> bytes;
    bytes.push_back(std::nullopt);  // EOS
    bytes.push_back(std::nullopt);  // special
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
    for (const char* t :
         {"{\"",  "\":",      "\": ", "\"}", "\",",  "\", \"",   "{}",       "[]",   "[{",
          "}]",   "},",       ", ",   ",\n", "\n  ", "\n    ",   "  ",       "true", "false",
          "null", "nul",      "12",   "123", "-1",   "0.",       "e+",       "\"\"", "\\n",
          "\\\"", "\\u00",    "ab",   "abc", "name", "\"name\"", "type",     "é",    "\xC3",
          "\xA9", "\xE2\x82", "\xAC", "€",   "😀",    "\xF0\x9F", "\x98\x80", "a\xC3"}) {
      bytes.push_back(std::string(t));
    }
    bytes.push_back(std::string());  // empty: never allowed
    const int64_t mask_vocab = int64_t(bytes.size()) + 3;
    return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int>{kEos},
                                                   mask_vocab);
  }();
  return vocab;
}

// GRAMMAR_FUZZ_VERBOSE=1: print each input's compile error or output (for triage).
bool Verbose() {
  static const bool verbose = std::getenv("GRAMMAR_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

bool Bit(const uint32_t* mask, int64_t id) { return (mask[id / 32] >> (id % 32)) & 1u; }

StructuredSpec SpecOf(uint8_t mode, std::string_view text) {
  StructuredSpec spec;
  spec.text = std::string(text);
  switch (mode & 3) {
    case 0:
      spec.kind =
          text.empty() ? StructuredSpec::Kind::kJsonObject : StructuredSpec::Kind::kJsonSchema;
      spec.strict = (mode >> 2) & 1;
      spec.compact = (mode >> 3) & 1;
      break;
    case 1:
      spec.kind = StructuredSpec::Kind::kRegex;
      break;
    case 2:
      spec.kind = StructuredSpec::Kind::kGrammar;
      break;
    case 3: {
      spec.kind = StructuredSpec::Kind::kChoice;
      spec.text.clear();
      size_t start = 0;
      while (true) {
        const size_t end = text.find('\n', start);
        spec.choices.emplace_back(text.substr(start, end - start));
        if (end == std::string_view::npos) break;
        start = end + 1;
      }
      break;
    }
  }
  return spec;
}

// Deterministic choices from the input's bytes, read from the end backwards (cycling).
class Chooser {
 public:
  Chooser(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t Next() {
    if (size_ == 0) return counter_++;
    uint32_t v = 0;
    for (int i = 0; i < 2; ++i, ++counter_) v = (v << 8) | data_[size_ - 1 - counter_ % size_];
    return v + counter_ / size_;  // a second pass differs from the first
  }

 private:
  const uint8_t* data_;
  size_t size_;
  uint32_t counter_ = 0;
};

// RFC 8259 JSON text syntax (the magnitude of numbers is not syntax; CheckSentence asks
// nlohmann::json for that).
class JsonSyntax {
 public:
  explicit JsonSyntax(std::string_view t) : t_(t) {}
  bool Text() {
    Ws();
    if (!Value(0)) return false;
    Ws();
    return i_ == t_.size();
  }

 private:
  bool At(char c) const { return i_ < t_.size() && t_[i_] == c; }
  bool Eat(char c) { return At(c) ? (++i_, true) : false; }
  bool Digit() const { return i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9'; }
  void Ws() {
    while (At(' ') || At('\t') || At('\n') || At('\r')) ++i_;
  }
  bool Word(std::string_view w) {
    if (t_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool String() {
    if (!Eat('"')) return false;
    while (i_ < t_.size() && !At('"')) {
      const unsigned char c = static_cast<unsigned char>(t_[i_++]);
      if (c < 0x20) return false;
      if (c != '\\') continue;
      if (Eat('u')) {
        for (int k = 0; k < 4; ++k, ++i_) {
          if (i_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[i_]))) return false;
        }
      } else if (i_ >= t_.size() ||
                 std::string_view("\"\\/bfnrt").find(t_[i_++]) == std::string_view::npos) {
        return false;
      }
    }
    return Eat('"');
  }
  bool Number() {
    Eat('-');
    if (Eat('0')) {
    } else if (Digit()) {
      while (Digit()) ++i_;
    } else {
      return false;
    }
    if (Eat('.')) {
      if (!Digit()) return false;
      while (Digit()) ++i_;
    }
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      if (!Digit()) return false;
      while (Digit()) ++i_;
    }
    return true;
  }
  template <typename F>
  bool List(char close, F&& item) {
    Ws();
    if (Eat(close)) return true;
    do {
      Ws();
      if (!item()) return false;
      Ws();
    } while (Eat(','));
    return Eat(close);
  }
  bool Value(int depth) {
    if (depth > 512) return false;
    if (Eat('{')) {
      return List('}', [&] {
        if (!String()) return false;
        Ws();
        return Eat(':') && (Ws(), Value(depth + 1));
      });
    }
    if (Eat('[')) return List(']', [&] { return Value(depth + 1); });
    if (At('"')) return String();
    if (At('t')) return Word("true");
    if (At('f')) return Word("false");
    if (At('n')) return Word("null");
    return Number();
  }

  std::string_view t_;
  size_t i_ = 0;
};

// The output is a sentence of what the spec asked for.
void CheckSentence(const StructuredSpec& spec, const CompiledGrammar& g, const std::string& out) {
  const int32_t s = g.NextBytes(g.initial_state(), out);
  if (s < 0 || !g.IsAccepting(s)) Fail("EOS was accepted after a non-sentence", Quoted(out));
  if (spec.kind == StructuredSpec::Kind::kJsonSchema ||
      spec.kind == StructuredSpec::Kind::kJsonObject) {
    if (!JsonSyntax(out).Text()) Fail("a JSON schema's output is not valid JSON", Quoted(out));
    // nlohmann::json also refuses numbers beyond a double's range (1E400).
    if (!nlohmann::json::accept(out)) {
      Fail("a JSON schema's output is refused by nlohmann::json (a number out of range?)",
           Quoted(out));
    }
  }
  if (spec.kind == StructuredSpec::Kind::kChoice) {
    bool found = false;
    for (const std::string& c : spec.choices) found = found || c == out;
    if (!found) Fail("a choice's output is none of the choices", Quoted(out));
  }
}

void RunMatcher(const StructuredSpec& spec, const std::shared_ptr<const CompiledGrammar>& g,
                Chooser* chooser) {
  const TokenVocabulary& v = *Vocab();
  // An ambiguous grammar ((a?){100}){200} can outgrow the automaton's bounds (matcher.cc:
  // 2,048 stacks a state): that state goes dead by design, and a live state whose every
  // continuation went dead so allows EOS only. Not a bug of the mask; the input ends here.
  auto capped = [&] { return g->stats().num_capped > 0; };
  if (g->initial_state() == CompiledGrammar::kDead) {
    if (capped()) return;
    Fail("the grammar compiled but its initial state is dead (nothing can be produced)");
  }
  Matcher m(g);
  int32_t state = g->initial_state();  // our own run of the automaton, beside the matcher's
  std::string out;
  std::vector<int> allowed;
  for (int step = 0; step < kMaxSteps; ++step) {
    const uint32_t* mask = m.AllowedTokens();
    allowed.clear();
    for (int64_t id = 0; id < v.mask_vocab(); ++id) {
      bool expected = false;
      if (id == kEos) {
        expected = g->IsAccepting(state);
      } else if (const std::string* b = v.bytes(int(id)); b != nullptr && !b->empty()) {
        expected = g->NextBytes(state, *b) >= 0;
      }
      if (Bit(mask, id) != expected) {
        if (capped()) return;
        Fail("the mask differs from the brute-force check",
             "token " + std::to_string(id) + " after " + Quoted(out) + ": mask " +
                 std::to_string(Bit(mask, id)));
      }
      if (expected) allowed.push_back(int(id));
    }
    if (allowed.empty()) {
      if (capped()) return;
      Fail("a live state allows no token at all (not even EOS)", "after " + Quoted(out));
    }
    int token = allowed[chooser->Next() % allowed.size()];
    // Prefer ending where the output is complete, a quarter of the time, to reach EOS often.
    if (Bit(mask, kEos) && chooser->Next() % 4 == 0) token = kEos;
    if (!m.Accept(token)) {
      Fail("Accept refused a token the mask allowed",
           "token " + std::to_string(token) + " after " + Quoted(out));
    }
    if (token == kEos) {
      if (Verbose()) std::fprintf(stderr, "grammar_fuzz: output (EOS): %s\n", Quoted(out).c_str());
      if (!m.finished()) Fail("EOS accepted but the matcher is not finished", Quoted(out));
      CheckSentence(spec, *g, out);
      return;
    }
    out += *v.bytes(token);
    state = g->NextBytes(state, *v.bytes(token));
    if (m.dead() || state < 0) Fail("an allowed token left the matcher dead", Quoted(out));
  }
  if (Verbose())
    std::fprintf(stderr, "grammar_fuzz: output (%d steps): %s\n", kMaxSteps, Quoted(out).c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const StructuredSpec spec =
      SpecOf(data[0], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  llm::grammar::CompilerOptions options;
  options.timeout_seconds = kCompileTimeoutSeconds;
  GrammarCompiler compiler(Vocab(), options);  // fresh: no cache between inputs
  std::shared_ptr<const CompiledGrammar> g;
  const auto start = std::chrono::steady_clock::now();
  try {
    g = compiler.Compile(spec);
  } catch (const GrammarError& e) {
    if (Verbose()) std::fprintf(stderr, "grammar_fuzz: GrammarError: %s\n", e.what());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (seconds > kCompileTimeoutSeconds + kSlackSeconds) {
    Fail("Compile overran its deadline", std::to_string(seconds) + " s");
  }
  if (!g) return 0;
  Chooser chooser(data + 1, size - 1);
  RunMatcher(spec, g, &chooser);
  return 0;
}
