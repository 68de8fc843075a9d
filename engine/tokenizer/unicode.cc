// ICU (libicu-dev) gives the character properties and normalization forms; it was chosen over
// utf8proc for its UTF-8 quick check (isNormalizedUTF8): text that is already NFC, nearly all
// of it, costs one scan and no copy, where utf8proc always decomposes and recomposes.
#include "engine/tokenizer/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <array>

#include "engine/error.h"

namespace llm::unicode {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// The length of the longest prefix of `bytes` that starts a well-formed UTF-8 character
// (the "maximal subpart" of the Unicode standard, which Rust's lossy conversion replaces by
// one U+FFFD), and whether that prefix is the whole character (`complete`).
size_t ValidPrefix(std::string_view bytes, bool* complete) {
  const auto b0 = static_cast<unsigned char>(bytes[0]);
  *complete = false;
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;  // not a lead byte: the invalid subpart is this one byte
  }
  size_t n = 1;
  for (; n < need && n < bytes.size(); ++n) {
    const auto b = static_cast<unsigned char>(bytes[n]);
    const unsigned char l = n == 1 ? lo : 0x80, h = n == 1 ? hi : 0xBF;
    if (b < l || b > h) return n;
  }
  *complete = n == need;
  return n;
}

const icu::Normalizer2& Instance(NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::kNfc:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNfd:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNfkc:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNfkd:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status) || n == nullptr) throw Error("ICU: no Unicode normalizer");
  return *n;
}

}  // namespace

char32_t NextChar(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + *pos;
  const size_t length = CharLength(s[0]);
  char32_t c = length == 1 ? s[0] : s[0] & (0xFF >> (length + 1));
  for (size_t i = 1; i < length; ++i) c = (c << 6) | (s[i] & 0x3F);
  *pos += length;
  return c;
}

void AppendChar(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool IsWhitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool IsNumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & (U_GC_ND_MASK | U_GC_NL_MASK | U_GC_NO_MASK)) !=
         0;
}

bool IsAlphanumeric(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC) || IsNumeric(c);
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) return c == '_' || IsAlphanumeric(c);
  const auto ch = static_cast<UChar32>(c);
  return u_hasBinaryProperty(ch, UCHAR_ALPHABETIC) || u_hasBinaryProperty(ch, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(ch) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80) return c > ' ' && c < 0x7F && !IsAlphanumeric(c);
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_P_MASK) != 0;
}

std::string Normalize(NormalForm form, std::string_view text) {
  const icu::Normalizer2& normalizer = Instance(form);
  UErrorCode status = U_ZERO_ERROR;
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  if (normalizer.isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return std::string(text);
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  status = U_ZERO_ERROR;
  normalizer.normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status))
    throw Error(std::string("ICU normalization failed: ") + u_errorName(status));
  return out;
}

bool HasNormalizationBoundaryBefore(NormalForm form, char32_t c) {
  return Instance(form).hasBoundaryBefore(static_cast<UChar32>(c));
}

std::string LowercaseChars(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const char32_t c = NextChar(text, &pos);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      continue;
    }
    std::array<UChar, 2> src{};
    int32_t src_length = 0;
    U16_APPEND_UNSAFE(src.data(), src_length, static_cast<UChar32>(c));
    std::array<UChar, 8> dst{};
    UErrorCode status = U_ZERO_ERROR;
    const int32_t n = u_strToLower(dst.data(), dst.size(), src.data(), src_length, "", &status);
    if (U_FAILURE(status)) {
      out.append(text.substr(start, pos - start));
      continue;
    }
    for (int32_t i = 0; i < n;) {
      UChar32 lower;
      U16_NEXT_UNSAFE(dst.data(), i, lower);
      AppendChar(static_cast<char32_t>(lower), &out);
    }
  }
  return out;
}

void ReleaseUtf8Lossy(std::string* pending, bool at_end, std::string* out) {
  const std::string_view bytes = *pending;
  size_t offset = 0;
  while (offset < bytes.size()) {
    bool complete = false;
    const std::string_view rest = bytes.substr(offset);
    const size_t n = ValidPrefix(rest, &complete);
    if (complete) {
      out->append(rest.substr(0, n));
      offset += n;
    } else if (n == rest.size() && !at_end) {
      break;  // the character may still be completed by the next bytes
    } else {
      out->append(kReplacement);
      offset += n == 0 ? 1 : n;
    }
  }
  pending->erase(0, offset);
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string pending(bytes), out;
  ReleaseUtf8Lossy(&pending, /*at_end=*/true, &out);
  return out;
}

bool IsValidUtf8(std::string_view bytes) {
  for (size_t offset = 0; offset < bytes.size();) {
    bool complete = false;
    const size_t n = ValidPrefix(bytes.substr(offset), &complete);
    if (!complete) return false;
    offset += n;
  }
  return true;
}

}  // namespace llm::unicode
