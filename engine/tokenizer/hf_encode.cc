// HfTokenizer's encoding: added tokens, normalizer, pre-tokenizer, BPE, post-processor, each
// as the library's Rust code does it (tokenizer/added_vocabulary.rs, normalizers/,
// pre_tokenizers/, tokenizer/normalizer.rs's split, models/bpe/, processors/).
#include <algorithm>
#include <atomic>
#include <functional>
#include <queue>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace llm::hf {
namespace {

using Offsets = std::pair<size_t, size_t>;
using Matches = std::vector<std::pair<Offsets, bool>>;  // (range, is_match), covering the text

// pattern.rs: regex matches with the gaps between them.
Matches RegexMatches(const Regex& regex, std::string_view text) {
  if (text.empty()) return {{{0, 0}, false}};
  Matches out;
  size_t prev = 0;
  for (const auto& [begin, end] : regex.FindAll(text)) {
    if (prev != begin) out.push_back({{prev, begin}, false});
    out.push_back({{begin, end}, true});
    prev = end;
  }
  if (prev != text.size()) out.push_back({{prev, text.size()}, false});
  return out;
}

// pattern.rs's `Fn(char) -> bool` pattern: every matching character is its own match.
Matches CharMatches(std::string_view text, const std::function<bool(char32_t)>& is_match) {
  if (text.empty()) return {{{0, 0}, false}};
  Matches out;
  size_t last = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    if (is_match(unicode::NextChar(text, &pos))) {
      if (last < start) out.push_back({{last, start}, false});
      out.push_back({{start, pos}, true});
      last = pos;
    }
  }
  if (text.size() > last) out.push_back({{last, text.size()}, false});
  return out;
}

// The Whitespace pre-tokenizer's `\w+|[^\w\s]+` (regex crate classes): maximal runs of word
// characters and of other non-space characters.
Matches WordRuns(std::string_view text) {
  if (text.empty()) return {{{0, 0}, false}};
  Matches out;
  auto kind = [](char32_t c) {
    return unicode::IsWordChar(c) ? 1 : unicode::IsWhitespace(c) ? 0 : 2;
  };
  size_t pos = 0, last = 0;
  while (pos < text.size()) {
    size_t next = pos;
    const int k = kind(unicode::NextChar(text, &next));
    if (k == 0) {
      pos = next;
      continue;
    }
    if (last < pos) out.push_back({{last, pos}, false});
    size_t end = next;
    while (end < text.size()) {
      size_t after = end;
      if (kind(unicode::NextChar(text, &after)) != k) break;
      end = after;
    }
    out.push_back({{pos, end}, true});
    pos = last = end;
  }
  if (last < text.size()) out.push_back({{last, text.size()}, false});
  return out;
}

// NormalizedString::split: the ranges to keep under `behavior`.
std::vector<Offsets> ApplyBehavior(Matches matches, SplitBehavior behavior) {
  std::vector<std::pair<Offsets, bool>> splits;  // (range, remove)
  bool previous = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto& [r, m] : matches) splits.push_back({r, false});
      break;
    case SplitBehavior::kRemoved:
      splits = std::move(matches);
      break;
    case SplitBehavior::kContiguous:
      for (auto& [r, m] : matches) {
        if (m == previous && !splits.empty()) {
          splits.back().first.second = r.second;
        } else {
          splits.push_back({r, false});
        }
        previous = m;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (auto& [r, m] : matches) {
        if (m && !previous && !splits.empty()) {
          splits.back().first.second = r.second;
        } else {
          splits.push_back({r, false});
        }
        previous = m;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->second && !previous && !splits.empty()) {
          splits.back().first.first = it->first.first;
        } else {
          splits.push_back({it->first, false});
        }
        previous = it->second;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  std::vector<Offsets> keep;
  for (const auto& [r, remove] : splits) {
    if (!remove) keep.push_back(r);
  }
  return keep;
}

// Replaces the pieces by their splits (empty ones dropped, as PreTokenizedString::split does).
template <typename SplitFn>
void SplitPieces(std::vector<PreToken>* pieces, SplitFn&& split) {
  std::vector<PreToken> out;
  out.reserve(pieces->size());
  for (PreToken& piece : *pieces) {
    for (const auto& [begin, end] : split(piece)) {
      if (end <= begin) continue;
      PreToken part{piece.text.substr(begin, end - begin), piece.first && begin == 0, {}};
      if (!piece.origins.empty()) {
        part.origins.assign(piece.origins.begin() + begin, piece.origins.begin() + end);
        part.first = part.origins[0] == 0;
      }
      out.push_back(std::move(part));
    }
  }
  *pieces = std::move(out);
}

// Puts `prefix` before the piece (NormalizedString::prepend: it takes the origin of the
// character it is put before).
void Prepend(std::string_view prefix, PreToken* piece) {
  if (!piece->origins.empty()) {
    piece->origins.insert(piece->origins.begin(), prefix.size(), piece->origins[0]);
  }
  piece->text.insert(0, prefix);
}

// The byte-level alphabet (pre_tokenizers/byte_level.rs's bytes_char), as UTF-8.
const std::array<std::string, 256>& ByteChars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      unicode::AppendChar(printable ? b : 256 + n++, &t[b]);
    }
    return t;
  }();
  return table;
}

// One split-out piece of text: an added token (its index) or text to encode (-1).
struct AddedSplit {
  size_t begin, end;
  int token;
};

bool EndsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  return unicode::IsWordChar(unicode::NextChar(s, &pos));
}

bool StartsWithWord(std::string_view s) {
  size_t pos = 0;
  return !s.empty() && unicode::IsWordChar(unicode::NextChar(s, &pos));
}

// AddedVocabulary::find_matches.
std::vector<AddedSplit> FindAddedTokens(const TokenTrie& trie, const std::vector<AddedToken>& added,
                                        std::string_view sentence) {
  if (trie.empty() || sentence.empty()) return {{0, sentence.size(), -1}};
  std::vector<AddedSplit> splits;
  size_t start_offset = 0, from = 0, start = 0, stop = 0;
  int index = -1;
  while (trie.FindFrom(sentence, from, &start, &stop, &index)) {
    from = stop;
    const AddedToken& token = added[index];
    if (token.single_word) {
      const bool start_space = start == 0 || !EndsWithWord(sentence.substr(0, start));
      const bool stop_space = stop == sentence.size() || !StartsWithWord(sentence.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {  // the leftmost start of the whitespace run before the token
      size_t s = start;
      while (s > 0) {
        size_t c = s - 1;
        while (c > 0 && (static_cast<unsigned char>(sentence[c]) & 0xC0) == 0x80) --c;
        size_t p = c;
        if (!unicode::IsWhitespace(unicode::NextChar(sentence, &p))) break;
        s = c;
      }
      start = std::max(s, start_offset);
    }
    if (token.rstrip) {
      while (stop < sentence.size()) {
        size_t p = stop;
        if (!unicode::IsWhitespace(unicode::NextChar(sentence, &p))) break;
        stop = p;
      }
    }
    if (start_offset < start) splits.push_back({start_offset, start, -1});
    splits.push_back({start, stop, index});
    start_offset = stop;
  }
  if (start_offset != sentence.size()) splits.push_back({start_offset, sentence.size(), -1});
  return splits;
}

}  // namespace

void TokenTrie::Insert(std::string_view text, int token_index) {
  int node = 0;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    auto it = nodes_[node].next.find(c);
    if (it == nodes_[node].next.end()) {
      nodes_.emplace_back();
      it = nodes_[node].next.emplace(c, static_cast<int>(nodes_.size()) - 1).first;
    }
    node = it->second;
  }
  if (nodes_[node].token < 0) nodes_[node].token = token_index;
  first_byte_[static_cast<unsigned char>(text[0])] = true;
}

bool TokenTrie::FindFrom(std::string_view text, size_t from, size_t* start, size_t* end,
                         int* index) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    int node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto it = nodes_[node].next.find(static_cast<unsigned char>(text[j]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      *start = i;
      *end = best_end;
      *index = best;
      return true;
    }
  }
  return false;
}

void HfTokenizer::PreTokenize(std::vector<PreToken>* pieces) const {
  using K = PreTokenizerStep::Kind;
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    switch (step.kind) {
      case K::kSplit:
        SplitPieces(pieces, [&](const PreToken& p) {
          Matches m = RegexMatches(*step.pattern, p.text);
          if (step.invert) {
            for (auto& entry : m) entry.second = !entry.second;
          }
          return ApplyBehavior(std::move(m), step.behavior);
        });
        break;
      case K::kByteLevel: {
        if (step.add_prefix_space) {
          for (PreToken& p : *pieces) {
            if (!p.text.empty() && !p.text.starts_with(' ')) Prepend(" ", &p);
          }
        }
        if (step.use_regex) {
          SplitPieces(pieces, [&](const PreToken& p) {
            return ApplyBehavior(RegexMatches(*step.pattern, p.text), SplitBehavior::kIsolated);
          });
        }
        const auto& chars = ByteChars();
        for (PreToken& p : *pieces) {
          std::string mapped;
          mapped.reserve(p.text.size() * 2);
          std::vector<uint32_t> origins;  // a byte's character keeps the origin of the byte
          for (size_t i = 0; i < p.text.size(); ++i) {
            const std::string& c = chars[static_cast<unsigned char>(p.text[i])];
            mapped += c;
            if (!p.origins.empty()) origins.insert(origins.end(), c.size(), p.origins[i]);
          }
          p.text = std::move(mapped);
          if (!p.origins.empty()) p.origins = std::move(origins);
        }
        break;
      }
      case K::kMetaspace: {
        const Regex space = Regex::Literal(" ");
        for (PreToken& p : *pieces) {
          ReplaceMatches(space, step.replacement, &p.text, p.origins.empty() ? nullptr : &p.origins,
                         0);
          const bool prepend = step.prepend_scheme == PrependScheme::kAlways ||
                               (step.prepend_scheme == PrependScheme::kFirst && p.first);
          if (prepend && !p.text.starts_with(step.replacement)) Prepend(step.replacement, &p);
        }
        if (step.split) {
          size_t pos = 0;
          const char32_t r = unicode::NextChar(step.replacement, &pos);
          SplitPieces(pieces, [&](const PreToken& p) {
            return ApplyBehavior(CharMatches(p.text, [r](char32_t c) { return c == r; }),
                                 SplitBehavior::kMergedWithNext);
          });
        }
        break;
      }
      case K::kDigits:
        SplitPieces(pieces, [&](const PreToken& p) {
          return ApplyBehavior(
              CharMatches(p.text, unicode::IsNumeric),
              step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
        });
        break;
      case K::kPunctuation:
        SplitPieces(pieces, [&](const PreToken& p) {
          return ApplyBehavior(CharMatches(p.text, unicode::IsPunctuation), step.behavior);
        });
        break;
      case K::kWhitespace:
        SplitPieces(pieces, [&](const PreToken& p) {
          Matches m = WordRuns(p.text);
          for (auto& entry : m) entry.second = !entry.second;
          return ApplyBehavior(std::move(m), SplitBehavior::kRemoved);
        });
        break;
      case K::kWhitespaceSplit:
        SplitPieces(pieces, [&](const PreToken& p) {
          return ApplyBehavior(CharMatches(p.text, unicode::IsWhitespace), SplitBehavior::kRemoved);
        });
        break;
    }
  }
}

Bpe::Bpe() {
  static std::atomic<uint64_t> next_instance{1};
  instance = next_instance++;
}

// Words repeat: each thread keeps the ids of the words it merged (as the library's BPE cache
// does), for one Bpe at a time, up to a bound.
namespace {
struct WordCache {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int>, Hash, std::equal_to<>> words;
};
constexpr size_t kMaxCachedWords = 1 << 16;
constexpr size_t kMaxCachedWordBytes = 256;
}  // namespace

void Bpe::Tokenize(std::string_view word, std::vector<int>* ids) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (const int id = vocab.Find(word); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  thread_local WordCache cache;
  if (cache.owner != instance) {
    cache.words.clear();
    cache.owner = instance;
  }
  if (auto it = cache.words.find(word); it != cache.words.end()) {
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t first = ids->size();
  MergeWord(word, ids);
  if (word.size() < kMaxCachedWordBytes) {
    if (cache.words.size() >= kMaxCachedWords) cache.words.clear();
    cache.words.emplace(std::string(word), std::vector<int>(ids->begin() + first, ids->end()));
  }
}

void Bpe::MergeWord(std::string_view word, std::vector<int>* ids) const {
  struct Symbol {
    int id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int id) {
    const int index = static_cast<int>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back(Symbol{id, index - 1, -1, true});
  };
  int unk = -1;  // a pending unknown id (fused while fuse_unk)
  std::string s;
  for (size_t pos = 0; pos < word.size();) {
    const size_t start = pos;
    pos += unicode::CharLength(static_cast<unsigned char>(word[pos]));
    s.clear();
    if (start > 0 && continuing_subword_prefix) s += *continuing_subword_prefix;
    s.append(word.substr(start, pos - start));
    if (pos >= word.size() && end_of_word_suffix) s += *end_of_word_suffix;
    if (const int id = vocab.Find(s); id >= 0) {
      if (unk >= 0) add(unk);
      unk = -1;
      add(id);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (char c : s) all = all && byte_ids[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : s) add(byte_ids[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_token) {
      if (unk >= 0 && !fuse_unk) add(unk);
      unk = unk_id;
    }
  }
  if (unk >= 0) add(unk);

  // Word::merge_all: the lowest-ranked pair first (leftmost among equals); stale entries
  // (a side merged away since) are skipped when popped.
  struct Candidate {
    uint32_t rank;
    int pos;
    int new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto lookup = [&](int left, int right) { return merges.Find(left, right); };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = lookup(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* m = lookup(left.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* pm = lookup(symbols[left.prev].id, left.id)) {
        queue.push({pm->rank, left.prev, pm->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = lookup(left.id, symbols[left.next].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.alive) ids->push_back(symbol.id);
  }
}

void HfTokenizer::EncodeSegment(std::string_view raw, size_t offset, std::vector<int>* ids) const {
  // Tracked: each byte's origin in the whole text (its character's start), through the
  // normalizer; a piece is "first" where its first byte's origin is 0.
  std::vector<uint32_t> origins;
  if (track_origins_) {
    origins.resize(raw.size());
    for (size_t pos = 0; pos < raw.size();) {
      const size_t at = pos;
      unicode::NextChar(raw, &pos);
      std::fill(origins.begin() + at, origins.begin() + pos, static_cast<uint32_t>(offset + at));
    }
  }
  const std::string normalized =
      Normalize(raw, track_origins_ ? &origins : nullptr, static_cast<uint32_t>(offset));
  for (const AddedSplit& split : FindAddedTokens(normalized_trie_, added_, normalized)) {
    if (split.token >= 0) {
      ids->push_back(added_[split.token].id);
    } else if (split.end > split.begin) {
      std::vector<PreToken> pieces = {
          PreToken{normalized.substr(split.begin, split.end - split.begin),
                   offset == 0 && split.begin == 0,
                   {}}};
      if (track_origins_) {
        pieces[0].origins.assign(origins.begin() + split.begin, origins.begin() + split.end);
        pieces[0].first = pieces[0].origins[0] == 0;
      }
      PreTokenize(&pieces);
      for (const PreToken& p : pieces) bpe_.Tokenize(p.text, ids);
    }
  }
}

std::vector<int> HfTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string valid;
  if (!unicode::IsValidUtf8(text)) {
    valid = unicode::Utf8Lossy(text);
    text = valid;
  }
  std::vector<int> ids;
  for (const AddedSplit& split : FindAddedTokens(raw_trie_, added_, text)) {
    if (split.token >= 0) {
      ids.push_back(added_[split.token].id);
    } else if (split.end > split.begin) {
      EncodeSegment(text.substr(split.begin, split.end - split.begin), split.begin, &ids);
    }
  }
  if (post_single_.empty()) return ids;
  // The template's sequences are there with or without special tokens (a template may repeat
  // the sequence, or leave it out); its special tokens only with.
  std::vector<int> out;
  for (const TemplateItem& item : post_single_) {
    if (!item.is_sequence && !add_special_tokens) continue;
    const std::vector<int>& part = item.is_sequence ? ids : item.ids;
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::string_view HfTokenizer::IdToToken(int id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
  if (id >= 0 && id < static_cast<int>(bpe_.id_to_token.size())) return bpe_.id_to_token[id];
  return {};
}

std::optional<int> HfTokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) {
    return added_[it->second].id;
  }
  if (const int id = bpe_.vocab.Find(token); id >= 0) return id;
  return std::nullopt;
}

bool HfTokenizer::IsSpecial(int id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && special_contents_.count(added_[it->second].content) > 0;
}

bool HfTokenizer::IsByteToken(int id) const {
  if (!bpe_.byte_fallback || added_by_id_.count(id) > 0) return false;
  const std::string_view t = IdToToken(id);
  return t.size() == 6 && t.starts_with("<0x") && t.ends_with('>');
}

}  // namespace llm::hf
