// Unicode facts the Hugging Face tokenizer pipeline needs, with Rust's definitions (the
// library is Rust): character classes (char::is_whitespace, is_numeric, is_alphanumeric,
// the regex crate's \w), normalization forms and per-character lowercasing (ICU), UTF-8
// iteration, and String::from_utf8_lossy's replacement rule (one U+FFFD per maximal invalid
// subpart), batch and streaming.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace llm::unicode {

// The code point at text[*pos] (valid UTF-8 expected), advancing *pos past it.
char32_t NextChar(std::string_view text, size_t* pos);
void AppendChar(char32_t c, std::string* out);
// The byte length of the character whose lead byte is `lead` (valid UTF-8).
inline size_t CharLength(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

bool IsWhitespace(char32_t c);    // White_Space (Rust char::is_whitespace, regex \s)
bool IsNumeric(char32_t c);       // Nd | Nl | No (char::is_numeric)
bool IsAlphanumeric(char32_t c);  // Alphabetic | Numeric (char::is_alphanumeric)
bool IsWordChar(char32_t c);      // the regex crate's \w: Alphabetic | M | Nd | Pc | Join_Control
bool IsPunctuation(char32_t c);   // ASCII punctuation or a P* category (Punctuation pre-tokenizer)

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string Normalize(NormalForm form, std::string_view text);
// Whether `c` never interacts with what precedes it under `form` (text split before such
// characters normalizes piece by piece to the same result).
bool HasNormalizationBoundaryBefore(NormalForm form, char32_t c);
// Every character replaced by its full lowercase mapping, one character at a time (as the
// library's NormalizedString::lowercase does: no final-sigma context).
std::string LowercaseChars(std::string_view text);

// Malformed UTF-8 replaced as String::from_utf8_lossy does.
std::string Utf8Lossy(std::string_view bytes);
// Streaming form: moves the decided prefix of *pending to *out (valid characters, and one
// U+FFFD per maximal invalid subpart); a tail that may still become a character stays unless
// `at_end`. The concatenated output equals Utf8Lossy of the concatenated input.
void ReleaseUtf8Lossy(std::string* pending, bool at_end, std::string* out);
// Whether `bytes` is entirely valid UTF-8.
bool IsValidUtf8(std::string_view bytes);

}  // namespace llm::unicode
