// Tokenizer::Encode: SentencePiece's normalizer (identity rules), BPE and unigram
// segmentation, then byte fallback / unknown merging, as SentencePieceProcessor::Encode
// does them (normalizer.cc, bpe_model.cc, unigram_model.cc, sentencepiece_processor.cc).
#include <algorithm>
#include <queue>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"

namespace llm {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";      // U+2581 "▁"
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

bool IsTrailByte(unsigned char c) { return (c & 0xC0) == 0x80; }

bool IsValidCodepoint(uint32_t cp) { return cp < 0xD800 || (cp >= 0xE000 && cp <= 0x10FFFF); }

// Byte length of a character from its lead byte alone (SentencePiece's OneCharLen):
// continuation bytes count as 1, 0xF8..0xFF as 4.
size_t OneCharLen(unsigned char lead) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

// Longest user-defined symbol, else one UTF-8 character (never past the end).
size_t SymbolLength(const Tokenizer::Impl& impl, std::string_view text, bool* is_user) {
  const size_t user = impl.MatchUserSymbol(text);
  *is_user = user > 0;
  return user > 0 ? user : std::min(text.size(), OneCharLen(text[0]));
}

// BPE merging over the normalized text (bpe_model.cc's Model::Encode). Symbols form a linked
// list; candidate pairs wait in a max-heap by (score, then leftmost); a popped pair whose
// sides changed since it was pushed is stale and skipped.
class BpeMerger {
 public:
  BpeMerger(const Tokenizer::Impl& impl, std::string_view normalized) : impl_(impl) {
    while (!normalized.empty()) {
      Symbol symbol;
      const size_t length = SymbolLength(impl, normalized, &symbol.is_frozen);
      const int index = static_cast<int>(symbols_.size());
      symbol.piece = normalized.substr(0, length);
      symbol.prev = index - 1;
      normalized.remove_prefix(length);
      symbol.next = normalized.empty() ? -1 : index + 1;
      symbols_.push_back(symbol);
    }
  }

  std::vector<Segment> Run() {
    std::vector<Segment> segments;
    if (symbols_.empty()) return segments;
    for (size_t i = 1; i < symbols_.size(); ++i) MaybeAddPair(static_cast<int>(i) - 1, i);
    while (!agenda_.empty()) {
      const Pair top = agenda_.top();
      agenda_.pop();
      Symbol& left = symbols_[top.left];
      Symbol& right = symbols_[top.right];
      if (left.piece.empty() || right.piece.empty() ||
          left.piece.size() + right.piece.size() != top.size) {
        continue;  // stale
      }
      left.piece = std::string_view(left.piece.data(), top.size);
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = top.left;
      right.piece = {};
      MaybeAddPair(left.prev, top.left);
      MaybeAddPair(top.left, left.next);
    }
    for (int index = 0; index != -1; index = symbols_[index].next) {
      Resegment(symbols_[index].piece, &segments);
    }
    return segments;
  }

 private:
  struct Symbol {
    int prev = -1;
    int next = -1;
    bool is_frozen = false;  // a user-defined symbol: never merged
    std::string_view piece;
  };
  struct Pair {
    float score;
    int left;
    int right;
    size_t size;  // bytes of the merged piece
  };
  struct PairLess {
    bool operator()(const Pair& a, const Pair& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  void MaybeAddPair(int left, int right) {
    if (left == -1 || right == -1 || symbols_[left].is_frozen || symbols_[right].is_frozen) return;
    const std::string_view merged(symbols_[left].piece.data(),
                                  symbols_[left].piece.size() + symbols_[right].piece.size());
    const auto it = impl_.normal_ids.find(merged);
    if (it == impl_.normal_ids.end()) return;
    agenda_.push({impl_.pieces[it->second].score, left, right, merged.size()});
    if (impl_.IsType(it->second, PieceType::kUnused)) {
      rev_merge_[merged] = {symbols_[left].piece, symbols_[right].piece};
    }
  }

  // An UNUSED piece is not emitted: it is split back into the two pieces it was merged from.
  void Resegment(std::string_view piece, std::vector<Segment>* segments) const {
    const int id = impl_.LookupPiece(piece);
    const auto it = rev_merge_.find(piece);
    if (!impl_.IsType(id, PieceType::kUnused) || it == rev_merge_.end()) {
      segments->emplace_back(piece, id);
      return;
    }
    Resegment(it->second.first, segments);
    Resegment(it->second.second, segments);
  }

  const Tokenizer::Impl& impl_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Pair, std::vector<Pair>, PairLess> agenda_;
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge_;
};

// The best path ending at one byte position of the normalized text (unigram Viterbi).
struct BestPath {
  int id = -1;
  float score = 0;     // total score of the best path ending here
  int starts_at = -1;  // byte where its last piece starts; -1: not reached yet
};

// Appends one normalization unit of `input`: (text, bytes consumed). A user-defined symbol
// is kept whole; a malformed byte becomes U+FFFD.
std::pair<std::string_view, size_t> NormalizePrefix(const Tokenizer::Impl& impl,
                                                    std::string_view input) {
  const size_t user = impl.MatchUserSymbol(input);
  if (user > 0) return {input.substr(0, user), user};
  const size_t length = ValidUtf8CharLength(input);
  if (length == 0) return {kReplacementChar, 1};
  return {input.substr(0, length), length};
}

}  // namespace

size_t ValidUtf8CharLength(std::string_view text) {
  if (text.empty()) return 0;
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  if (b[0] < 0x80) return 1;
  if (n >= 2 && (b[0] & 0xE0) == 0xC0) {
    const uint32_t cp = ((b[0] & 0x1F) << 6) | (b[1] & 0x3F);
    return IsTrailByte(b[1]) && cp >= 0x80 && IsValidCodepoint(cp) ? 2 : 0;
  }
  if (n >= 3 && (b[0] & 0xF0) == 0xE0) {
    const uint32_t cp = ((b[0] & 0x0F) << 12) | ((b[1] & 0x3F) << 6) | (b[2] & 0x3F);
    return IsTrailByte(b[1]) && IsTrailByte(b[2]) && cp >= 0x800 && IsValidCodepoint(cp) ? 3 : 0;
  }
  if (n >= 4 && (b[0] & 0xF8) == 0xF0) {
    const uint32_t cp =
        ((b[0] & 0x07) << 18) | ((b[1] & 0x3F) << 12) | ((b[2] & 0x3F) << 6) | (b[3] & 0x3F);
    return IsTrailByte(b[1]) && IsTrailByte(b[2]) && IsTrailByte(b[3]) && cp >= 0x10000 &&
                   IsValidCodepoint(cp)
               ? 4
               : 0;
  }
  return 0;
}

std::string Tokenizer::Impl::Normalize(std::string_view input) const {
  std::string out;
  const std::string_view space = escape_whitespaces ? kSpaceSymbol : " ";
  if (remove_extra_whitespaces) {  // drop leading spaces
    while (!input.empty()) {
      const auto [unit, consumed] = NormalizePrefix(*this, input);
      if (unit != " ") break;
      input.remove_prefix(consumed);
    }
  }
  if (input.empty()) return out;
  out.reserve(input.size() * 3 / 2 + 3);
  if (!treat_whitespace_as_suffix && add_dummy_prefix) out.append(space);
  bool is_prev_space = remove_extra_whitespaces;
  while (!input.empty()) {
    auto [unit, consumed] = NormalizePrefix(*this, input);
    while (is_prev_space && !unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
    if (!unit.empty()) {
      for (char c : unit) {
        if (c == ' ') {
          out.append(space);
        } else {
          out.push_back(c);
        }
      }
      is_prev_space = unit.back() == ' ';
    }
    input.remove_prefix(consumed);
    if (!remove_extra_whitespaces) is_prev_space = false;
  }
  if (remove_extra_whitespaces) {  // drop trailing spaces
    size_t length = out.size();
    while (std::string_view(out.data(), length).ends_with(space)) length -= space.size();
    out.erase(length);
  }
  if (treat_whitespace_as_suffix && add_dummy_prefix) out.append(space);
  return out;
}

std::vector<Segment> Tokenizer::Impl::EncodeBpe(std::string_view normalized) const {
  return BpeMerger(*this, normalized).Run();
}

// unigram_model.cc's EncodeOptimized: for each character start, every piece beginning there
// (found by walking prefix_ids) extends the best path; a character no piece covers gets an
// unknown node scored min_score - 10. Score arithmetic keeps the library's float/double mix.
std::vector<Segment> Tokenizer::Impl::EncodeUnigram(std::string_view normalized) const {
  const int size = static_cast<int>(normalized.size());
  const float unk_score = min_score - 10.0f;
  std::vector<BestPath> best(size + 1);
  for (int start = 0; start < size;) {
    const float score_here = best[start].score;
    const int char_len = std::min<int>(OneCharLen(normalized[start]), size - start);
    bool has_single_char_piece = false;
    for (int end = start + 1; end <= size; ++end) {
      const auto it = prefix_ids.find(normalized.substr(start, end - start));
      if (it == prefix_ids.end()) break;
      const int id = it->second;
      if (id < 0 || IsType(id, PieceType::kUnused)) continue;
      const size_t length = end - start;
      const double score = IsType(id, PieceType::kUserDefined)
                               ? static_cast<double>(static_cast<float>(length) * max_score) - 0.1
                               : static_cast<double>(pieces[id].score);
      const double candidate = score + score_here;
      if (best[end].starts_at == -1 || candidate > best[end].score) {
        best[end] = {id, static_cast<float>(candidate), start};
      }
      if (static_cast<int>(length) == char_len) has_single_char_piece = true;
    }
    if (!has_single_char_piece) {
      BestPath& target = best[start + char_len];
      const float candidate = unk_score + score_here;
      if (target.starts_at == -1 || candidate > target.score) target = {unk_id, candidate, start};
    }
    start += char_len;
  }
  std::vector<Segment> segments;
  for (int end = size; end > 0; end = best[end].starts_at) {
    segments.emplace_back(normalized.substr(best[end].starts_at, end - best[end].starts_at),
                          best[end].id);
  }
  std::reverse(segments.begin(), segments.end());
  return segments;
}

std::vector<int> Tokenizer::Encode(std::string_view text) const {
  if (hf_) return hf_->Encode(text, /*add_special_tokens=*/false);
  const Impl& impl = *impl_;
  const std::string normalized = impl.Normalize(text);
  const std::vector<Segment> segments =
      impl.is_bpe ? impl.EncodeBpe(normalized) : impl.EncodeUnigram(normalized);
  // sentencepiece_processor.cc: an unknown piece becomes its bytes' <0xNN> pieces with byte
  // fallback; without it, a run of unknown pieces becomes one unknown id.
  std::vector<int> ids;
  ids.reserve(segments.size());
  bool is_prev_unk = false;
  for (const auto& [piece, id] : segments) {
    const bool is_unk = impl.IsType(id, PieceType::kUnknown);
    if (impl.IsType(id, PieceType::kControl)) {
      ids.push_back(id);
    } else if (is_unk && impl.byte_fallback) {
      for (unsigned char byte : piece) ids.push_back(impl.byte_ids[byte]);
    } else if (!(is_unk && is_prev_unk)) {
      ids.push_back(id);
    }
    is_prev_unk = is_unk;
  }
  return ids;
}

}  // namespace llm
