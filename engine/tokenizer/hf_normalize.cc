// HfTokenizer's normalizer chain (normalizers/*.rs on tokenizer/normalizer.rs's
// NormalizedString), optionally tracking where each byte came from: per byte, the offset in
// the original text where its character begins (the start side of the library's alignments).
// Only Metaspace's prepend_scheme "first" reads it (is a piece still at the text's offset 0?),
// so only a tokenizer with such a step pays for it.
#include <algorithm>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace llm::hf {
namespace {

void Append(std::string_view piece, uint32_t origin, std::string* out,
            std::vector<uint32_t>* origins) {
  out->append(piece);
  if (origins != nullptr) origins->insert(origins->end(), piece.size(), origin);
}

unicode::NormalForm FormOf(NormalizerStep::Kind kind) {
  using K = NormalizerStep::Kind;
  return kind == K::kNfc    ? unicode::NormalForm::kNfc
         : kind == K::kNfd  ? unicode::NormalForm::kNfd
         : kind == K::kNfkc ? unicode::NormalForm::kNfkc
                            : unicode::NormalForm::kNfkd;
}

// A normalization form, tracked: text is normalized in pieces split before each character with
// a boundary before it (the same result), and within a piece the output characters take the
// input characters' origins in order, the surplus of an expansion the last one's. That is the
// library's alignment (it consumes input characters in order: a decomposition's extra
// characters are "inserted" after their base, a composition consumes its parts, reordered
// marks take the positions they land on) except for compositions that skip a reordered mark.
void NormalizeTracked(unicode::NormalForm form, std::string* text, std::vector<uint32_t>* origins) {
  const std::string normalized = unicode::Normalize(form, *text);
  if (normalized == *text) return;
  std::string out;
  std::vector<uint32_t> out_origins;
  std::vector<uint32_t> piece_origins;  // per input character of the piece
  size_t start = 0, pos = 0;
  auto flush = [&](size_t end) {
    const std::string piece =
        unicode::Normalize(form, std::string_view(*text).substr(start, end - start));
    size_t index = 0;
    for (size_t p = 0; p < piece.size(); ++index) {
      const size_t at = p;
      unicode::NextChar(piece, &p);
      Append(std::string_view(piece).substr(at, p - at),
             piece_origins[std::min(index, piece_origins.size() - 1)], &out, &out_origins);
    }
    piece_origins.clear();
    start = end;
  };
  while (pos < text->size()) {
    const size_t at = pos;
    const char32_t c = unicode::NextChar(*text, &pos);
    if (at > start && unicode::HasNormalizationBoundaryBefore(form, c)) flush(at);
    piece_origins.push_back((*origins)[at]);
  }
  flush(text->size());
  *text = std::move(out);
  *origins = std::move(out_origins);
}

}  // namespace

void ReplaceMatches(const Regex& pattern, std::string_view content, std::string* text,
                    std::vector<uint32_t>* origins, uint32_t base) {
  const auto found = pattern.FindAll(*text);
  if (found.empty()) return;
  std::string out;
  std::vector<uint32_t> out_origins;
  std::vector<uint32_t>* tracked = origins != nullptr ? &out_origins : nullptr;
  size_t prev = 0;
  for (const auto& [begin, end] : found) {
    out.append(*text, prev, begin - prev);
    if (tracked) tracked->insert(tracked->end(), origins->begin() + prev, origins->begin() + begin);
    // normalizer.rs's replace: the new characters are "inserted", aligned with the byte before
    // the match's end ((0, 0) at offset 0).
    Append(content, end == 0 ? base : (origins ? (*origins)[end - 1] : 0), &out, tracked);
    prev = end;
  }
  out.append(*text, prev);
  if (tracked) {
    tracked->insert(tracked->end(), origins->begin() + prev, origins->end());
    *origins = std::move(out_origins);
  }
  *text = std::move(out);
}

std::string HfTokenizer::Normalize(std::string_view text, std::vector<uint32_t>* origins,
                                   uint32_t base) const {
  std::string s(text);
  using K = NormalizerStep::Kind;
  for (const NormalizerStep& step : normalizer_) {
    switch (step.kind) {
      case K::kNfc:
      case K::kNfd:
      case K::kNfkc:
      case K::kNfkd:
        if (origins != nullptr) {
          NormalizeTracked(FormOf(step.kind), &s, origins);
        } else {
          s = unicode::Normalize(FormOf(step.kind), s);
        }
        break;
      case K::kLowercase:
        if (origins == nullptr) {
          s = unicode::LowercaseChars(s);
        } else {  // each character's lowercase takes its origin
          std::string out;
          std::vector<uint32_t> out_origins;
          for (size_t pos = 0; pos < s.size();) {
            const size_t at = pos;
            if (const char c = s[pos]; static_cast<unsigned char>(c) < 0x80) {
              out.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c);
              out_origins.push_back((*origins)[pos++]);
              continue;
            }
            unicode::NextChar(s, &pos);
            Append(unicode::LowercaseChars(std::string_view(s).substr(at, pos - at)),
                   (*origins)[at], &out, &out_origins);
          }
          s = std::move(out);
          *origins = std::move(out_origins);
        }
        break;
      case K::kReplace:
        ReplaceMatches(*step.pattern, step.content, &s, origins, base);
        break;
      case K::kPrepend:  // the prefix takes the first character's origin
        if (s.empty()) break;
        s.insert(0, step.content);
        if (origins != nullptr)
          origins->insert(origins->begin(), step.content.size(), (*origins)[0]);
        break;
      case K::kStrip: {
        size_t begin = 0, end = s.size();
        if (step.strip_left) {
          while (begin < end) {
            size_t p = begin;
            if (!unicode::IsWhitespace(unicode::NextChar(s, &p))) break;
            begin = p;
          }
        }
        if (step.strip_right) {
          while (end > begin) {
            size_t c = end - 1;
            while (c > begin && (static_cast<unsigned char>(s[c]) & 0xC0) == 0x80) --c;
            size_t p = c;
            if (!unicode::IsWhitespace(unicode::NextChar(s, &p))) break;
            end = c;
          }
        }
        s = s.substr(begin, end - begin);
        if (origins != nullptr) {
          *origins = std::vector<uint32_t>(origins->begin() + begin, origins->begin() + end);
        }
        break;
      }
    }
  }
  return s;
}

}  // namespace llm::hf
