#include "engine/grammar/matcher.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>
#include <utility>

#include "engine/tokenizer/tokenizer.h"

namespace llm::grammar {
namespace {

// Bounds on the lazily built automaton: a grammar that would exceed them (an ambiguous one
// whose stack sets explode, or an output that nests without end) goes dead instead of taking
// the server's memory. Memory stays within a few hundred MB per grammar.
constexpr size_t kMaxStacksPerState = 2048;
constexpr size_t kMaxExpandItems = size_t{1} << 18;  // (pos, parent) items per expansion
constexpr size_t kMaxNodes = size_t{1} << 23;
constexpr size_t kMaxCachedMasks = 4096;
// TokenVocabulary::plain_up_to_'s length bound, text_up_to_'s in characters.
constexpr size_t kMaxPlainBytes = 128;

void SetBit(Mask& m, int id) { m[size_t(id) / 32] |= uint32_t{1} << (id % 32); }

// Plain text bytes: what a JSON string holds unescaped but UTF-8 (and most of any text).
bool IsPlainByte(uint8_t b) { return b >= 0x20 && b <= 0x7E && b != '"' && b != '\\'; }

// UTF-8 as the grammar spells characters (grammar.cc: AppendUtf8Range: shortest forms, no
// surrogates, up to U+10FFFF): after lead byte `b`, `more` continuation bytes, the first in
// [lo, hi], the others in [80, BF]. Nullopt for a byte that starts no character of 2-4 bytes.
struct Utf8Lead {
  int more;
  uint8_t lo, hi;
};
std::optional<Utf8Lead> LeadOf(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return Utf8Lead{1, 0x80, 0xBF};
  if (b == 0xE0) return Utf8Lead{2, 0xA0, 0xBF};
  if (b == 0xED) return Utf8Lead{2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return Utf8Lead{2, 0x80, 0xBF};
  if (b == 0xF0) return Utf8Lead{3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return Utf8Lead{3, 0x80, 0xBF};
  if (b == 0xF4) return Utf8Lead{3, 0x80, 0x8F};
  return std::nullopt;
}

// The characters of a text token: one made of plain bytes and whole UTF-8 characters of 2-4
// bytes only. Nullopt for any other (a control byte, a quote, a backslash, DEL, a cut
// character: byte-level BPE has tokens of half a character).
std::optional<size_t> TextChars(std::string_view bytes) {
  size_t chars = 0;
  for (size_t i = 0; i < bytes.size(); ++chars) {
    const uint8_t c = uint8_t(bytes[i]);
    if (IsPlainByte(c)) {
      ++i;
      continue;
    }
    const std::optional<Utf8Lead> lead = LeadOf(c);
    if (!lead || i + size_t(lead->more) >= bytes.size()) return std::nullopt;
    for (int k = 1; k <= lead->more; ++k) {
      const uint8_t x = uint8_t(bytes[i + size_t(k)]);
      const uint8_t lo = k == 1 ? lead->lo : 0x80, hi = k == 1 ? lead->hi : 0xBF;
      if (x < lo || x > hi) return std::nullopt;
    }
    i += 1 + size_t(lead->more);
  }
  return chars;
}

}  // namespace

// ---- TokenVocabulary

TokenVocabulary::SortedTokens TokenVocabulary::Sort(
    const std::vector<std::optional<std::string>>& bytes, std::vector<int32_t> ids) {
  SortedTokens t;
  t.order = std::move(ids);
  std::sort(t.order.begin(), t.order.end(),
            [&](int32_t a, int32_t b) { return *bytes[size_t(a)] < *bytes[size_t(b)]; });
  const size_t num = t.order.size();
  t.lcp.assign(num, 0);
  for (size_t i = 1; i < num; ++i) {
    const std::string& a = *bytes[size_t(t.order[i - 1])];
    const std::string& b = *bytes[size_t(t.order[i])];
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n] && n < 0xFFFF) ++n;
    t.lcp[i] = uint16_t(n);
  }
  t.suffix_start.reserve(num + 1);
  for (size_t i = 0; i < num; ++i) {
    const std::string& b = *bytes[size_t(t.order[i])];
    t.suffix_start.push_back(uint32_t(t.suffix_bytes.size()));
    t.suffix_bytes.append(b, t.lcp[i]);
    t.max_bytes = std::max(t.max_bytes, b.size());
  }
  t.suffix_start.push_back(uint32_t(t.suffix_bytes.size()));
  // Skip targets, from the end: first_short[L] is the first token after the one at hand whose
  // common prefix with its predecessor is under L bytes.
  t.skip_start.assign(num + 1, 0);
  for (size_t i = 0; i < num; ++i) {
    const size_t top = std::min(bytes[size_t(t.order[i])]->size(), kSkipDepth);
    t.skip_start[i + 1] = t.skip_start[i] + uint32_t(top > t.lcp[i] ? top - t.lcp[i] : 0);
  }
  t.skip.resize(t.skip_start[num]);
  std::vector<uint32_t> first_short(kSkipDepth + 1, uint32_t(num));
  for (size_t i = num; i-- > 0;) {
    for (uint32_t k = t.skip_start[i]; k < t.skip_start[i + 1]; ++k) {
      t.skip[k] = first_short[t.lcp[i] + 1 + (k - t.skip_start[i])];
    }
    for (size_t l = size_t(t.lcp[i]) + 1; l <= kSkipDepth; ++l) first_short[l] = uint32_t(i);
  }
  return t;
}

TokenVocabulary::TokenVocabulary(std::vector<std::optional<std::string>> token_bytes,
                                 std::vector<int> eos_ids, int64_t mask_vocab)
    : mask_vocab_(std::max<int64_t>(mask_vocab, int64_t(token_bytes.size()))),
      bytes_(std::move(token_bytes)),
      eos_ids_(std::move(eos_ids)) {
  for (int id : eos_ids_) {
    if (id >= 0 && size_t(id) < bytes_.size()) bytes_[size_t(id)].reset();
  }
  std::vector<int32_t> all, not_plain, not_text;
  std::vector<std::vector<int32_t>> plain_by_length, text_by_chars;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    if (!bytes_[i] || bytes_[i]->empty()) continue;
    const std::string& b = *bytes_[i];
    all.push_back(int32_t(i));
    // Longer tokens are walked, so that the *_up_to_ masks stay a few MB (129 each).
    if (b.size() <= kMaxPlainBytes &&
        std::all_of(b.begin(), b.end(), [](char c) { return IsPlainByte(uint8_t(c)); })) {
      if (plain_by_length.size() <= b.size()) plain_by_length.resize(b.size() + 1);
      plain_by_length[b.size()].push_back(int32_t(i));
    } else {
      not_plain.push_back(int32_t(i));
    }
    if (const std::optional<size_t> chars = TextChars(b); chars && *chars <= kMaxPlainBytes) {
      if (text_by_chars.size() <= *chars) text_by_chars.resize(*chars + 1);
      text_by_chars[*chars].push_back(int32_t(i));
    } else {
      not_text.push_back(int32_t(i));
    }
  }
  all_ = Sort(bytes_, std::move(all));
  not_plain_ = Sort(bytes_, std::move(not_plain));
  not_text_ = Sort(bytes_, std::move(not_text));
  auto up_to = [&](const std::vector<std::vector<int32_t>>& by_length) {
    std::vector<Mask> masks(std::max<size_t>(by_length.size(), 1), Mask(mask_words(), 0u));
    for (size_t n = 1; n < by_length.size(); ++n) {
      masks[n] = masks[n - 1];
      for (int32_t id : by_length[n]) SetBit(masks[n], id);
    }
    return masks;
  };
  plain_up_to_ = up_to(plain_by_length);
  text_up_to_ = up_to(text_by_chars);
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::FromTokenizer(const Tokenizer& tokenizer,
                                                                      std::vector<int> eos_ids,
                                                                      int64_t mask_vocab) {
  std::vector<std::optional<std::string>> bytes(size_t(tokenizer.vocab_size()));
  for (int id = 0; id < tokenizer.vocab_size(); ++id) bytes[size_t(id)] = tokenizer.TokenBytes(id);
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(eos_ids), mask_vocab);
}

bool TokenVocabulary::IsEos(int id) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
}

const std::string* TokenVocabulary::bytes(int id) const {
  if (id < 0 || size_t(id) >= bytes_.size() || !bytes_[size_t(id)]) return nullptr;
  return &*bytes_[size_t(id)];
}

// ---- CompiledGrammar

size_t CompiledGrammar::VecHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
  for (int32_t x : v) h = (h ^ uint64_t(uint32_t(x))) * 0x100000001B3ull, h ^= h >> 29;
  return size_t(h);
}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  auto eos = std::make_shared<Mask>(vocab_->mask_words(), 0u);
  for (int id : vocab_->eos_ids()) {
    if (id >= 0 && id < vocab_->mask_vocab()) SetBit(*eos, id);
  }
  eos_only_ = std::move(eos);
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> stacks;
  bool accepting = false;
  for (int32_t alt : grammar_.alternatives[size_t(grammar_.root)]) {
    ExpandLocked(alt, -1, &stacks, &accepting);
  }
  initial_ = StateLocked(&stacks, accepting);
}

int32_t CompiledGrammar::NodeLocked(int32_t pos, int32_t parent) const {
  const uint64_t key = (uint64_t(uint32_t(pos)) << 32) | uint32_t(parent);
  auto [it, inserted] = node_index_.try_emplace(key, int32_t(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void CompiledGrammar::ExpandLocked(int32_t pos, int32_t parent, std::vector<int32_t>* out,
                                   bool* accepting) const {
  // A worklist of (pos, parent); `seen` stops the same item from expanding twice (nullable
  // rules reach the same continuation along several paths).
  std::vector<std::pair<int32_t, int32_t>>& work = expand_work_;
  work.clear();
  work.push_back({pos, parent});
  std::vector<uint64_t>& seen = expand_seen_;
  seen.clear();
  bool big = false;  // the seen items moved to expand_seen_big_
  auto first_time = [&](uint64_t key) {
    if (!big) {
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) return false;
      if (seen.size() < kSmallSeen) {
        seen.push_back(key);
        return true;
      }
      big = true;
      expand_seen_big_.insert(seen.begin(), seen.end());
    }
    return expand_seen_big_.insert(key).second;
  };
  size_t items = 0;
  while (!work.empty()) {
    // An ambiguous grammar ((a?){2000}) would make states of thousands of stacks, each
    // transition quadratic in them: past the cap the state goes dead instead.
    if (out->size() > kMaxStacksPerState) break;
    // Nested nullable repetitions (((a?){1001}){699}) can walk a long chain of empty
    // alternatives before the first stack: past kMaxExpandItems items the state goes dead too
    // (StateLocked), so that no expansion outruns the compile deadline.
    if (++items > kMaxExpandItems) {
      expand_capped_ = true;
      break;
    }
    auto [p, par] = work.back();
    work.pop_back();
    const uint64_t key = (uint64_t(uint32_t(p)) << 32) | uint32_t(par);
    if (!first_time(key)) continue;
    const Element& el = grammar_.elements[size_t(p)];
    switch (el.kind) {
      case Element::kBytes:
        out->push_back(NodeLocked(p, par));
        break;
      case Element::kEnd:
        if (par < 0) {
          *accepting = true;
        } else {
          work.push_back(nodes_[size_t(par)]);
        }
        break;
      case Element::kRule: {
        // A reference that ends its alternative continues straight at the parent: a
        // right-recursive repetition (S -> item S) then keeps one stack depth, so a string's
        // characters revisit one state (and its cached mask) instead of deepening the stack.
        const int32_t cont =
            grammar_.elements[size_t(p) + 1].kind == Element::kEnd ? par : NodeLocked(p + 1, par);
        for (int32_t alt : grammar_.alternatives[size_t(el.arg)]) work.push_back({alt, cont});
        break;
      }
    }
  }
  if (big) expand_seen_big_.clear();
}

int32_t CompiledGrammar::StateLocked(std::vector<int32_t>* stacks_in, bool accepting) const {
  std::vector<int32_t>& stacks = *stacks_in;
  if (std::exchange(expand_capped_, false)) {  // an expansion into this state stopped early
    ++num_capped_;
    return kDead;
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty() && !accepting) return kDead;
  if (stacks.size() > kMaxStacksPerState || nodes_.size() > kMaxNodes ||
      states_.size() >= kMaxStates) {
    ++num_capped_;
    return kDead;
  }
  // The accepting flag is part of the key: a trailing sentinel that no node id takes.
  stacks.push_back(accepting ? -2 : -3);
  auto it = state_index_.find(stacks);
  if (it != state_index_.end()) return it->second;
  const int32_t id = int32_t(states_.size());
  state_index_.emplace(stacks, id);
  stacks.pop_back();
  State s;
  s.stacks = std::move(stacks);
  s.accepting = accepting;
  states_.push_back(std::move(s));
  if (size_t(id) % kRowChunk == 0) {
    // The chunk's slots (null: no row yet) exist before any state id in it is published.
    auto chunk = std::make_unique<RowSlot[]>(kRowChunk);
    row_chunks_[size_t(id) / kRowChunk].store(chunk.get(), std::memory_order_release);
    row_chunk_owner_.push_back(std::move(chunk));
  }
  uniform_.push_back(kUnknown);
  uniform_text_.push_back(kUnknown);
  return id;
}

const CompiledGrammar::Row* CompiledGrammar::RowOf(int32_t state) const {
  const RowSlot* chunk = row_chunks_[size_t(state) / kRowChunk].load(std::memory_order_acquire);
  return chunk[size_t(state) % kRowChunk].load(std::memory_order_acquire);
}

int32_t CompiledGrammar::Step(int32_t state, uint8_t byte) const {
  if (state < 0) return kDead;
  if (const Row* row = RowOf(state); row != nullptr) {
    const int32_t next = row[byte].load(std::memory_order_acquire);
    if (next != kUnset) return next;
  }
  std::lock_guard<std::mutex> lock(mu_);
  return NextLocked(state, byte);
}

int32_t CompiledGrammar::NextLocked(int32_t state, uint8_t byte) const {
  if (state < 0) return kDead;
  State* s = &states_[size_t(state)];
  if (!s->next) {
    s->next = std::make_unique<Row[]>(256);
    for (int b = 0; b < 256; ++b) s->next[b].store(kUnset, std::memory_order_relaxed);
    row_chunks_[size_t(state) / kRowChunk]
        .load(std::memory_order_relaxed)[size_t(state) % kRowChunk]
        .store(s->next.get(), std::memory_order_release);
  }
  if (const int32_t known = s->next[byte].load(std::memory_order_relaxed); known != kUnset) {
    return known;
  }
  std::vector<int32_t>& stacks = next_stacks_;
  stacks.clear();
  bool accepting = false;
  // The next state depends on the byte only through which stacks take it: every byte that
  // the same stacks take (`same`) gets the transition too.
  ByteSet same;
  same.set();
  for (int32_t node : s->stacks) {
    const auto [pos, parent] = nodes_[size_t(node)];
    const ByteSet& set = grammar_.byte_sets[size_t(grammar_.elements[size_t(pos)].arg)];
    if (set[byte]) {
      same &= set;
      ExpandLocked(pos + 1, parent, &stacks, &accepting);
    } else {
      same &= ~set;
    }
  }
  const int32_t next = StateLocked(&stacks, accepting);
  Row* row = states_[size_t(state)].next.get();  // states_ may have grown: index again
  for (int b = 0; b < 256; ++b) {
    if (same[size_t(b)]) row[b].store(next, std::memory_order_release);
  }
  return next;
}

int32_t CompiledGrammar::UniformLocked(int32_t state) const {
  if (uniform_[size_t(state)] != kUnknown) return uniform_[size_t(state)];
  // Every plain byte leads to the same stacks when each stack's byte set holds all of them
  // or none (a stack that takes the byte continues at pos + 1 whichever it is).
  static const ByteSet plain = [] {
    ByteSet s;
    for (int b = 0; b < 256; ++b) s[size_t(b)] = IsPlainByte(uint8_t(b));
    return s;
  }();
  bool any = false;
  for (int32_t node : states_[size_t(state)].stacks) {
    const ByteSet& set =
        grammar_.byte_sets[size_t(grammar_.elements[size_t(nodes_[size_t(node)].first)].arg)];
    const ByteSet both = set & plain;
    if (both.none()) continue;
    if (both != plain) return uniform_[size_t(state)] = kNotUniform;
    any = true;
  }
  // NextLocked may grow uniform_: index it after.
  const int32_t target = any ? NextLocked(state, uint8_t('a')) : int32_t{kUniformDead};
  uniform_[size_t(state)] = target < 0 ? kUniformDead : target;
  return uniform_[size_t(state)];
}

int32_t CompiledGrammar::UniformTextLocked(int32_t state) const {
  if (uniform_text_[size_t(state)] != kUnknown) return uniform_text_[size_t(state)];
  const int32_t u = UniformLocked(state);
  bool ok = u != kNotUniform;
  // Every character of 2-4 bytes must lead to u too (to nowhere when u is kUniformDead: then
  // every lead byte must be dead, a lead that lives counts as not uniform). `known`: (state,
  // continuation bytes left) pairs whose every [80, BF]... continuation ends at u.
  std::vector<std::pair<int32_t, int>> known;
  auto ends_at_u = [&](auto& self, int32_t g, int more, uint8_t lo, uint8_t hi) -> bool {
    if (g < 0) return false;
    const bool generic = lo == 0x80 && hi == 0xBF;
    if (generic && std::find(known.begin(), known.end(), std::pair{g, more}) != known.end()) {
      return true;
    }
    for (int b = lo; b <= hi; ++b) {
      const int32_t next = NextLocked(g, uint8_t(b));
      if (more == 1 ? next != u : !self(self, next, more - 1, 0x80, 0xBF)) return false;
    }
    if (generic) known.push_back({g, more});
    return true;
  };
  for (int lead = 0xC2; ok && lead <= 0xF4; ++lead) {
    const int32_t g = NextLocked(state, uint8_t(lead));
    if (u == kUniformDead) {
      ok = g == kDead;
    } else {
      const Utf8Lead l = *LeadOf(uint8_t(lead));
      ok = ends_at_u(ends_at_u, g, l.more, l.lo, l.hi);
    }
  }
  // NextLocked may grow uniform_text_: index it after.
  uniform_text_[size_t(state)] = ok ? u : int32_t{kNotUniform};
  return uniform_text_[size_t(state)];
}

int32_t CompiledGrammar::Next(int32_t state, uint8_t byte) const { return Step(state, byte); }

int32_t CompiledGrammar::NextBytes(int32_t state, std::string_view bytes) const {
  for (char c : bytes) {
    state = Step(state, uint8_t(c));
    if (state < 0) return kDead;
  }
  return state;
}

bool CompiledGrammar::IsAccepting(int32_t state) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state >= 0 && states_[size_t(state)].accepting;
}

bool CompiledGrammar::IsComplete(int32_t state) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state >= 0 && states_[size_t(state)].stacks.empty();
}

void CompiledGrammar::Walk(int32_t state, const TokenVocabulary::SortedTokens& tokens, Mask* mask,
                           std::optional<std::chrono::steady_clock::time_point> deadline) const {
  const int32_t* order = tokens.order.data();
  const uint16_t* lcp = tokens.lcp.data();
  const uint32_t* suffix_start = tokens.suffix_start.data();
  const char* suffix = tokens.suffix_bytes.data();
  const uint32_t* skip_start = tokens.skip_start.data();
  const uint32_t* skip = tokens.skip.data();
  // path[k]: the state after the first k bytes of the token at hand; `good`: how many bytes
  // of the previous token were consumed (path[0..good] hold for it).
  std::vector<int32_t> path_buffer(tokens.max_bytes + 1);
  int32_t* path = path_buffer.data();
  path[0] = state;
  size_t good = 0;
  size_t num_walked = 0;
  for (size_t i = 0, num = tokens.order.size(); i < num; ++i) {
    if (deadline && (++num_walked & 255) == 0 && std::chrono::steady_clock::now() > *deadline) {
      throw GrammarError("the grammar did not compile within the time limit");
    }
    const size_t common = lcp[i];
    if (common > good) continue;  // shares the byte that failed the previous token
    const char* b = suffix + suffix_start[i];
    const size_t n = suffix_start[i + 1] - suffix_start[i];
    int32_t at = path[common];
    size_t j = 0;
    for (; j < n; ++j) {
      at = Step(at, uint8_t(b[j]));
      if (at < 0) break;
      path[common + j + 1] = at;
    }
    good = common + j;
    if (j == n) {
      SetBit(*mask, order[i]);
    } else if (good < TokenVocabulary::kSkipDepth) {
      // Failed at byte `good`: on to the first token without this token's good + 1 bytes.
      i = size_t(skip[skip_start[i] + j]) - 1;
    }
  }
}

const TokenVocabulary::SortedTokens* CompiledGrammar::StartMaskLocked(int32_t state,
                                                                      Mask* mask) const {
  *mask = *eos_only_;
  if (!states_[size_t(state)].accepting) std::fill(mask->begin(), mask->end(), 0u);
  if (states_[size_t(state)].stacks.empty()) return nullptr;
  // Follow the text characters: while every one leads to a single state, a text token of n
  // characters is allowed exactly when n steps stay live. Decided when the run ends dead,
  // loops, or outlasts the longest such token; then only the other tokens need the walk.
  // First with every character of 1-4 bytes (a JSON string's content), else with the plain
  // bytes only. The run is built once, by the first mask of a bounded string (each of its
  // positions checked for UTF-8: up to ~2.5 ms for 63 positions on the dev VM); every later
  // mask in the string finds it.
  auto run = [&](int32_t (CompiledGrammar::*uniform)(int32_t) const,
                 size_t longest) -> std::optional<size_t> {
    int32_t s = state;
    for (size_t n = 0;; ++n) {
      if (n >= longest) return longest;
      const int32_t u = (this->*uniform)(s);
      if (u == kNotUniform) return std::nullopt;
      if (u == kUniformDead || u == s) return u == s ? longest : n;
      s = u;
    }
  };
  auto take = [&](const Mask& allowed) {
    for (size_t w = 0; w < mask->size(); ++w) (*mask)[w] |= allowed[w];
  };
  const std::vector<Mask>& text_up_to = vocab_->text_up_to_;
  if (const auto n = run(&CompiledGrammar::UniformTextLocked, text_up_to.size() - 1)) {
    take(text_up_to[*n]);
    return &vocab_->not_text_;
  }
  const std::vector<Mask>& plain_up_to = vocab_->plain_up_to_;
  if (const auto n = run(&CompiledGrammar::UniformLocked, plain_up_to.size() - 1)) {
    take(plain_up_to[*n]);
    return &vocab_->not_plain_;
  }
  return &vocab_->all_;
}

std::shared_ptr<const Mask> CompiledGrammar::AllowedTokens(
    int32_t state, std::optional<std::chrono::steady_clock::time_point> deadline) const {
  if (state < 0) return eos_only_;
  std::unique_lock<std::mutex> lock(mu_);
  // Another thread computing this state's mask: wait for it (then it is cached, or the cache
  // was full and this thread computes it too).
  mask_done_.wait(lock, [&] { return !states_[size_t(state)].computing; });
  if (states_[size_t(state)].mask) return states_[size_t(state)].mask;
  states_[size_t(state)].computing = true;
  auto mask = std::make_shared<Mask>();
  auto done = [&] {
    states_[size_t(state)].computing = false;
    mask_done_.notify_all();
  };
  try {
    const TokenVocabulary::SortedTokens* rest = StartMaskLocked(state, mask.get());
    if (rest != nullptr) {
      lock.unlock();
      Walk(state, *rest, mask.get(), deadline);
      lock.lock();
    }
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    done();
    throw;
  }
  done();
  ++masks_computed_;
  // No token of the vocabulary continues the output (bytes it cannot spell): only EOS, so
  // that the sampler never has to pick from nothing.
  std::shared_ptr<const Mask> result = std::move(mask);
  if (std::all_of(result->begin(), result->end(), [](uint32_t w) { return w == 0; })) {
    result = eos_only_;
  }
  if (masks_cached_ < kMaxCachedMasks) {
    states_[size_t(state)].mask = result;
    ++masks_cached_;
  }
  return result;
}

CompiledGrammar::Stats CompiledGrammar::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {nodes_.size(), states_.size(), masks_computed_, masks_cached_, num_capped_};
}

// ---- Matcher

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(grammar_->initial_state()) {}

const uint32_t* Matcher::AllowedTokens() {
  if (!mask_) mask_ = grammar_->AllowedTokens(finished_ ? CompiledGrammar::kDead : state_);
  return mask_->data();
}

bool Matcher::accepting() const { return state_ >= 0 && grammar_->IsAccepting(state_); }

bool Matcher::Accept(int token) {
  mask_.reset();
  if (finished_) return false;
  const TokenVocabulary& v = grammar_->vocab();
  if (v.IsEos(token)) {
    const bool ok = accepting();
    finished_ = ok;
    if (!ok) state_ = CompiledGrammar::kDead;
    return ok;
  }
  const std::string* bytes = v.bytes(token);
  if (bytes == nullptr || bytes->empty() || state_ < 0) {
    state_ = CompiledGrammar::kDead;
    return false;
  }
  state_ = grammar_->NextBytes(state_, *bytes);
  return state_ >= 0;
}

}  // namespace llm::grammar
