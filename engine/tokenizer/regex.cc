#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizer/regex.h"

#include <pcre2.h>

#include <cctype>

#include "engine/error.h"

namespace llm {
namespace {

// Per-thread match state: one ovector pair (only the whole match is read) and a JIT stack big
// enough for long whitespace runs under `\s+(?!\S)` (PCRE2's default is 32 KiB).
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

std::string ErrorText(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Oniguruma's \s (the library's regex engine) is Unicode's White_Space; PCRE2's UCP \s also
// takes U+180E (through \h). Spelling the class out makes the two agree.
constexpr const char* kWhiteSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string TranslateClasses(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out.push_back(c);
        out.push_back(next);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(pattern, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

Regex::Regex(const std::string& oniguruma_pattern) {
  const std::string pattern = TranslateClasses(oniguruma_pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  // Oniguruma's default (Ruby) syntax anchors ^ and $ at line boundaries: PCRE2's multiline.
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (code_ == nullptr) {
    throw Error("regex /" + oniguruma_pattern + "/: " + ErrorText(error) + " at offset " +
                std::to_string(offset));
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) it interprets
}

Regex Regex::Literal(std::string_view literal) {
  std::string pattern;      // every ASCII punctuation character escaped (a backslash before a
  for (char c : literal) {  // non-alphanumeric character always means the character itself)
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) pattern.push_back('\\');
    pattern.push_back(c);
  }
  return Regex(pattern);
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(code_);
}

Regex::Regex(Regex&& other) noexcept : code_(other.code_) { other.code_ = nullptr; }

Regex& Regex::operator=(Regex&& other) noexcept {
  std::swap(code_, other.code_);
  return *this;
}

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  ThreadMatchState& state = MatchState();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // As the onig crate's find_iter: an empty match where the previous match ended is skipped
  // (the search steps over one character), so "x*" on "xa" matches "x" and the empty string
  // at the end, not also the empty string right after "x".
  size_t start = 0;
  size_t last_end = std::string_view::npos;
  while (start <= text.size()) {
    const int rc = pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, state.data,
                               state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("regex match failed: " + ErrorText(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin || end != last_end) {
      matches.emplace_back(begin, end);
      last_end = end;
    }
    if (end > begin) {
      start = end;
    } else {  // an empty match: step over one character
      if (end >= text.size()) break;
      size_t next = end + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      start = next;
    }
  }
  return matches;
}

}  // namespace llm
