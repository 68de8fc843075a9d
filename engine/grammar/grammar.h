// A context-free grammar over bytes, the common target of every structured-output front
// end: regular expressions (regex.cc), JSON Schema (json_schema.cc) and the EBNF subset
// (ebnf.cc) build expressions (Expr), which GrammarBuilder lowers into rules whose
// alternatives are sequences of byte sets and rule references. The matcher
// (engine/grammar/matcher.h) runs it as a pushdown automaton over UTF-8 bytes.
//
// Terminals are bytes, not characters: a Unicode character class becomes the byte sequences
// of its UTF-8 encodings (Utf8Ranges), so a token that ends inside a character (byte-level
// BPE has many) is checked exactly, byte by byte.
#pragma once

#include <bitset>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llm::grammar {

using ByteSet = std::bitset<256>;

// An expression before lowering. Built with the helpers below; shared subtrees are fine.
struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;
struct Expr {
  enum class Kind { kBytes, kSeq, kAlt, kRepeat, kRule };
  Kind kind = Kind::kSeq;
  ByteSet bytes;               // kBytes
  std::vector<ExprPtr> items;  // kSeq, kAlt; kRepeat: items[0]
  int min = 0, max = 0;        // kRepeat: max < 0 = unbounded
  int rule = -1;               // kRule: a GrammarBuilder rule id
};

ExprPtr Bytes(const ByteSet& set);
ExprPtr Byte(uint8_t b);
ExprPtr Literal(std::string_view text);  // its bytes in sequence ("" = empty)
ExprPtr Seq(std::vector<ExprPtr> items);
ExprPtr Alt(std::vector<ExprPtr> items);  // no items: matches nothing
ExprPtr Empty();
ExprPtr Repeat(ExprPtr item, int min, int max);  // max < 0: unbounded
ExprPtr Optional(ExprPtr item);
ExprPtr Star(ExprPtr item);
ExprPtr Plus(ExprPtr item);
ExprPtr RuleRef(int rule);

// The UTF-8 encodings of the code points in [lo, hi] (surrogates excluded) as a union of
// byte-set sequences, each element one byte position.
ExprPtr Utf8Range(char32_t lo, char32_t hi);
// A union of code point ranges (sorted or not, may overlap).
ExprPtr Utf8Class(const std::vector<std::pair<char32_t, char32_t>>& ranges);

// The lowered grammar. Positions index `elements`; every alternative is a run of elements
// ending with kEnd. Rule 0.. are named; `root` is where a text starts.
struct Element {
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = kEnd;
  int32_t arg = 0;  // kBytes: index into byte_sets; kRule: rule id
};

struct Grammar {
  std::vector<ByteSet> byte_sets;
  std::vector<Element> elements;
  std::vector<std::vector<int32_t>> alternatives;  // rule -> start positions
  std::vector<std::string> rule_names;
  int32_t root = 0;
  size_t size() const { return elements.size(); }
};

class GrammarBuilder;

// Limits that keep a hostile schema or pattern from taking the server's memory or time.
struct Limits {
  size_t max_elements = size_t{1} << 21;  // lowered grammar size (~2M elements)
  int max_repeat = 10000;                 // {m,n}, minLength ... beyond this: an error
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Set: the text starts with what this makes (in the builder, at Build), then the grammar's
  // own: a reasoning block before the structured output (compiler.h).
  std::function<ExprPtr(GrammarBuilder*)> prefix;
};

class GrammarBuilder {
 public:
  explicit GrammarBuilder(Limits limits = {});
  // A rule to define later (for recursion: $ref, EBNF names).
  int NewRule(std::string name);
  void Define(int rule, const ExprPtr& body);
  bool defined(int rule) const;
  // Lowers, checks that every rule is defined and none is left-recursive, and returns the
  // grammar rooted at `root`. Throws GrammarError.
  Grammar Build(int root);
  const Limits& limits() const { return limits_; }
  // Throws GrammarError when the deadline has passed (called while building).
  void CheckDeadline();

 private:
  // Lowers `e` into a sequence of elements appended to `out` (sub-alternatives and repeats
  // become new rules).
  void Lower(const ExprPtr& e, std::vector<Element>* out);
  int LowerToRule(const ExprPtr& e, const std::string& name);
  int32_t ByteSetIndex(const ByteSet& set);
  void AddAlternative(int rule, const std::vector<Element>& seq);

  Limits limits_;
  Grammar g_;
  std::vector<bool> defined_;
  std::vector<std::pair<ByteSet, int32_t>> set_index_;  // small linear cache
  size_t steps_ = 0;
};

// A grammar that cannot be built: bad syntax, an unsupported feature, too large, too slow.
class GrammarError : public std::exception {
 public:
  explicit GrammarError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// ---- Front ends (each throws GrammarError naming the problem).

// A regular expression (the common Perl / JSON Schema subset: literals, escapes \d \w \s
// \D \W \S \n \t \r \f \v \xHH \uHHHH and \ + punctuation, classes [...] with ranges and
// negation, ., groups (...) (?:...), alternation |, quantifiers * + ? {m} {m,} {m,n} and
// their lazy forms, ^ and $ at the ends) matched as a whole.
ExprPtr RegexExpr(std::string_view pattern, GrammarBuilder* b);
// The same, as the characters of a JSON string's content: a character that JSON must escape
// (", \, control characters) is produced in its escaped form.
ExprPtr RegexJsonStringExpr(std::string_view pattern, GrammarBuilder* b);
Grammar RegexGrammar(std::string_view pattern, const Limits& limits = {});
// One of the strings, exactly.
Grammar ChoiceGrammar(const std::vector<std::string>& choices, const Limits& limits = {});
// The EBNF subset (ebnf.cc documents it); the start rule is `root`.
Grammar EbnfGrammar(std::string_view text, const Limits& limits = {});

}  // namespace llm::grammar
