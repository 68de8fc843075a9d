// The tokenizer's regular expressions: PCRE2 (libpcre2-dev) in UTF + UCP mode, JIT-compiled.
// The pre-tokenizer patterns of tokenizer.json are written for Oniguruma (the library's
// engine) and use \p{L}, \p{N}, (?i:...) and lookahead (?!\S), which std::regex and RE2 lack;
// PCRE2 has them all and its JIT makes the pre-tokenizer a small part of encoding.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace llm {

class Regex {
 public:
  // An Oniguruma pattern (as tokenizer.json writes them). Throws llm::Error with PCRE2's
  // message and the offset.
  explicit Regex(const std::string& oniguruma_pattern);
  // A pattern matching `literal` exactly.
  static Regex Literal(std::string_view literal);
  ~Regex();
  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping match in `text` (valid UTF-8), left to right, as byte ranges
  // [begin, end). An empty match advances the search by one character. Thread-safe.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace llm
