// HfTokenizer's decoding: ids -> token strings (added tokens as the library keeps them,
// special ones dropped when asked) -> the decoder chain. The chain runs as a stream: each
// step takes tokens one at a time and holds back only what a later token could still change
// (bytes of an unfinished character, a run of byte tokens, trailing characters a Strip may
// remove, the start of a Replace pattern). A whole decode is the same stream pushed at once
// and finished, so streamed text equals Decode by construction.
//
// Before a joining step (ByteLevel, Fuse) the steps see the library's token list; after it
// they see pieces of the one joined string, and act as the library's step on that string:
// Metaspace as on token 0, Strip at the string's two ends, Replace across piece boundaries.
#include <array>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace llm::hf {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// The byte of a byte-level character, or -1 (inverse of ByteChars in hf_encode.cc).
int CharByte(char32_t c) {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[printable ? b : 256 + n++] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return c < table.size() ? table[c] : -1;
}

// The bytes a token stands for under the ByteLevel decoder: each character's byte, or the
// token's own UTF-8 when one of its characters is not in the byte-level alphabet.
std::string ByteLevelBytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    const int b = CharByte(unicode::NextChar(token, &pos));
    if (b < 0) return std::string(token);
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

// "<0xNN>" -> NN, read as byte_fallback.rs reads it (u8::from_str_radix, which also takes a
// sign: "<0x+A>" is byte 0x0A).
std::optional<uint8_t> ByteToken(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  std::string_view digits = token.substr(3, 2);
  if (digits[0] == '+') digits.remove_prefix(1);
  int value = 0;
  for (char c : digits) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + digit;
  }
  return static_cast<uint8_t>(value);
}

std::string RegexReplace(const Regex& pattern, const std::string& content, std::string_view text) {
  std::string out;
  size_t prev = 0;
  for (const auto& [begin, end] : pattern.FindAll(text)) {
    out.append(text.substr(prev, begin - prev));
    out.append(content);
    prev = end;
  }
  out.append(text.substr(prev));
  return out;
}

// decoders/strip.rs on one token.
std::string StripToken(std::string_view token, char32_t content, size_t start, size_t stop) {
  std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, character)
  for (size_t pos = 0; pos < token.size();) {
    const size_t at = pos;
    chars.push_back({at, unicode::NextChar(token, &pos)});
  }
  size_t start_cut = 0;
  for (size_t i = 0; i < chars.size() && i < start && chars[i].second == content; ++i) {
    start_cut = i + 1;
  }
  size_t stop_cut = chars.size();
  for (size_t i = 0; i < stop && i < chars.size(); ++i) {
    const size_t index = chars.size() - i - 1;
    if (chars[index].second != content) break;
    stop_cut = index;
  }
  if (stop_cut <= start_cut) return "";
  const size_t begin = chars[start_cut].first;
  const size_t end = stop_cut < chars.size() ? chars[stop_cut].first : token.size();
  return std::string(token.substr(begin, end - begin));
}

size_t CharCount(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace

void HfTokenizer::DecodeStart(HfDecodeState* state) const {
  state->tokens_seen.assign(decoder_.size(), 0);
  state->held.assign(decoder_.size(), std::string());
  state->started.assign(decoder_.size(), false);
  state->joined_any = false;
}

void HfTokenizer::Feed(HfDecodeState* state, size_t step, std::string token,
                       std::string* out) const {
  if (step == decoder_.size()) {
    out->append(token);
    return;
  }
  const DecoderStep& d = decoder_[step];
  const bool joined = decoder_joined_[step];
  if (joined && token.empty()) return;
  std::string& held = state->held[step];
  using K = DecoderStep::Kind;
  switch (d.kind) {
    case K::kByteLevel: {
      held += ByteLevelBytes(token);
      std::string text;
      unicode::ReleaseUtf8Lossy(&held, /*at_end=*/false, &text);
      if (!text.empty()) Feed(state, step + 1, std::move(text), out);
      return;
    }
    case K::kFuse:
      Feed(state, step + 1, std::move(token), out);
      return;
    case K::kMetaspace: {
      const bool first = joined || state->tokens_seen[step]++ == 0;
      const bool drop = first && d.prepend_scheme != PrependScheme::kNever;
      std::string text;
      for (size_t pos = 0; pos < token.size();) {
        const size_t at = pos;
        unicode::NextChar(token, &pos);
        const std::string_view c = std::string_view(token).substr(at, pos - at);
        if (c == d.replacement) {
          if (!drop) text.push_back(' ');
        } else {
          text.append(c);
        }
      }
      Feed(state, step + 1, std::move(text), out);
      return;
    }
    case K::kByteFallback: {
      if (const auto byte = ByteToken(token)) {
        held.push_back(static_cast<char>(*byte));
        return;
      }
      FlushStep(state, step, out);
      Feed(state, step + 1, std::move(token), out);
      return;
    }
    case K::kStrip: {
      size_t pos = 0;
      const char32_t content = unicode::NextChar(d.content, &pos);
      if (!joined) {
        Feed(state, step + 1, StripToken(token, content, d.start, d.stop), out);
        return;
      }
      // The joined string: up to `start` leading `content` characters go, and up to `stop`
      // trailing ones, which are held until a later character (or the end) decides.
      std::string text;
      for (size_t p = 0; p < token.size();) {
        const size_t at = p;
        const char32_t c = unicode::NextChar(token, &p);
        const std::string_view ch = std::string_view(token).substr(at, p - at);
        if (!state->started[step]) {
          if (c == content && state->tokens_seen[step] < d.start) {
            ++state->tokens_seen[step];
            continue;
          }
          state->started[step] = true;
        }
        if (c == content && d.stop > 0) {
          held.append(ch);
          if (CharCount(held) > d.stop) {  // the oldest held one can no longer be stripped
            const size_t n = unicode::CharLength(static_cast<unsigned char>(held[0]));
            text.append(held, 0, n);
            held.erase(0, n);
          }
          continue;
        }
        text += held;
        held.clear();
        text.append(ch);
      }
      if (!text.empty()) Feed(state, step + 1, std::move(text), out);
      return;
    }
    case K::kReplace: {
      if (!joined) {
        Feed(state, step + 1, RegexReplace(*d.pattern, d.content, token), out);
        return;
      }
      held += token;
      std::string text;
      size_t pos = 0;
      while (true) {
        const size_t at = d.literal.empty() ? std::string::npos : held.find(d.literal, pos);
        if (at == std::string::npos) break;
        text.append(held, pos, at - pos);
        text += d.content;
        pos = at + d.literal.size();
      }
      // Keep the longest tail that may begin the pattern.
      size_t keep = std::min(held.size() - pos, d.literal.empty() ? 0 : d.literal.size() - 1);
      while (keep > 0 &&
             std::string_view(held).substr(held.size() - keep) != d.literal.substr(0, keep)) {
        --keep;
      }
      text.append(held, pos, held.size() - pos - keep);
      held.erase(0, held.size() - keep);
      if (!text.empty()) Feed(state, step + 1, std::move(text), out);
      return;
    }
  }
}

void HfTokenizer::FlushStep(HfDecodeState* state, size_t step, std::string* out) const {
  std::string& held = state->held[step];
  if (held.empty()) return;
  using K = DecoderStep::Kind;
  switch (decoder_[step].kind) {
    case K::kByteLevel: {
      std::string text;
      unicode::ReleaseUtf8Lossy(&held, /*at_end=*/true, &text);
      Feed(state, step + 1, std::move(text), out);
      break;
    }
    case K::kByteFallback: {
      std::string bytes = std::move(held);
      held.clear();
      if (unicode::IsValidUtf8(bytes)) {
        Feed(state, step + 1, std::move(bytes), out);
      } else {  // the library gives one U+FFFD token per byte of an invalid run
        for (size_t i = 0; i < bytes.size(); ++i) {
          Feed(state, step + 1, std::string(kReplacementChar), out);
        }
      }
      break;
    }
    case K::kStrip:  // trailing characters at the very end: stripped
      held.clear();
      break;
    case K::kReplace: {
      std::string text = std::move(held);
      held.clear();
      Feed(state, step + 1, std::move(text), out);
      break;
    }
    default:
      held.clear();
  }
}

void HfTokenizer::DecodePush(HfDecodeState* state, int id, bool skip_special_tokens,
                             std::string* out) const {
  std::string_view token;
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    token = added_[it->second].decoded;
  } else if (id >= 0 && id < static_cast<int>(bpe_.id_to_token.size())) {
    token = bpe_.id_to_token[id];
    if (token.data() == nullptr) return;  // an id the vocabulary skips (a "" token is kept)
  } else {
    return;  // outside the vocabulary: the library drops it
  }
  // The library skips a token whose text (the decoded form, for an added token) is in its set
  // of special contents; a special token whose normalized form differs is not skipped.
  if (skip_special_tokens && special_contents_.find(token) != special_contents_.end()) return;
  if (!has_decoder_) {
    if (state->joined_any) out->push_back(' ');
    state->joined_any = true;
    out->append(token);
    return;
  }
  Feed(state, 0, std::string(token), out);
}

void HfTokenizer::DecodeFinish(HfDecodeState* state, std::string* out) const {
  for (size_t step = 0; step < decoder_.size(); ++step) FlushStep(state, step, out);
}

std::optional<std::string> HfTokenizer::TokenBytes(int id) const {
  std::string token;
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    if (added_[it->second].special) return std::nullopt;
    token = added_[it->second].decoded;
  } else if (id >= 0 && id < static_cast<int>(bpe_.id_to_token.size()) &&
             bpe_.id_to_token[id].data() != nullptr) {
    token = bpe_.id_to_token[id];
  } else {
    return std::nullopt;
  }
  if (special_contents_.find(token) != special_contents_.end()) return std::nullopt;
  if (!has_decoder_) return " " + token;  // tokens are joined with spaces
  using K = DecoderStep::Kind;
  for (size_t step = 0; step < decoder_.size(); ++step) {
    const DecoderStep& d = decoder_[step];
    switch (d.kind) {
      case K::kByteLevel:
        token = ByteLevelBytes(token);
        break;
      case K::kMetaspace: {  // not the first token: every replacement character is a space
        std::string text;
        for (size_t pos = 0; pos < token.size();) {
          const size_t at = pos;
          unicode::NextChar(token, &pos);
          const std::string_view c = std::string_view(token).substr(at, pos - at);
          if (c == d.replacement) {
            text.push_back(' ');
          } else {
            text.append(c);
          }
        }
        token = std::move(text);
        break;
      }
      case K::kByteFallback:
        if (const auto byte = ByteToken(token)) token = std::string(1, static_cast<char>(*byte));
        break;
      case K::kFuse:
        break;
      case K::kStrip:  // on the joined text it strips only at the very start or end
        if (!decoder_joined_[step]) {
          size_t pos = 0;
          token = StripToken(token, unicode::NextChar(d.content, &pos), d.start, d.stop);
        }
        break;
      case K::kReplace:
        token = RegexReplace(*d.pattern, d.content, token);
        break;
    }
  }
  return token;
}

std::string HfTokenizer::Decode(std::span<const int> ids, bool skip_special_tokens) const {
  HfDecodeState state;
  DecodeStart(&state);
  std::string text;
  for (int id : ids) DecodePush(&state, id, skip_special_tokens, &text);
  DecodeFinish(&state, &text);
  return text;
}

}  // namespace llm::hf
