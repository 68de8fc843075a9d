// What a request asks for (StructuredSpec) to a CompiledGrammar, with a cache: requests that
// share a schema share one compiled grammar and its lazily built automaton and masks. The
// front ends compile on their own threads, under a deadline, before a request reaches the
// engine: a schema that does not compile in time is a 400, never a stuck request.
#pragma once

#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/grammar/matcher.h"

namespace llm::grammar {

struct StructuredSpec {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar, kToolCalls };
  Kind kind = Kind::kJsonObject;
  // The schema (JSON text), regex or EBNF grammar. kToolCalls: a JSON object
  //   {"prefix", "separator", "suffix": text, "min", "max": calls (max -1: no limit),
  //    "items": [{"before": text, "schema": the arguments' schema, "after": text,
  //               "strict": bool}]}
  // for prefix, min..max items between separators, suffix; an item is `before`, JSON for its
  // schema, `after` (a tool call in a model family's format, under tool_choice "required" or
  // a named function).
  std::string text;
  std::vector<std::string> choices;  // kChoice
  bool strict = false;               // kJsonSchema: unsupported keywords are an error
  bool compact = false;              // JSON: no whitespace between tokens
  // A reasoning model's thinking before the output: kOptional, the text may start with
  // <think>, any text without </think>, </think> and up to 4 spaces or newlines; kInside, the
  // prompt opened <think> already, so the text starts inside it (the same without <think>).
  // The structured output follows, as vLLM constrains only what comes after the reasoning.
  enum class Reasoning { kNone, kOptional, kInside };
  Reasoning reasoning = Reasoning::kNone;
  std::string Key() const;  // the cache key
};

struct CompilerOptions {
  double timeout_seconds = 10;      // --structured-output-compile-timeout
  size_t cache_size = 256;          // compiled grammars kept (least recently used go)
  size_t max_spec_bytes = 1 << 20;  // a larger schema / regex / grammar is refused
};

class GrammarCompiler {
 public:
  GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, CompilerOptions options = {});
  // Throws GrammarError naming the problem (syntax, unsupported keyword, size, time).
  std::shared_ptr<const CompiledGrammar> Compile(const StructuredSpec& spec);
  const TokenVocabulary& vocab() const { return *vocab_; }
  size_t cache_hits() const;

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  CompilerOptions options_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
  size_t hits_ = 0;
};

}  // namespace llm::grammar
