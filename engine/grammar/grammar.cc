#include "engine/grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <map>

namespace llm::grammar {
namespace {

ExprPtr Make(Expr e) { return std::make_shared<const Expr>(std::move(e)); }

// UTF-8 bytes of `c` (1-4).
int Encode(char32_t c, uint8_t out[4]) {
  if (c < 0x80) {
    out[0] = uint8_t(c);
    return 1;
  }
  if (c < 0x800) {
    out[0] = uint8_t(0xC0 | (c >> 6));
    out[1] = uint8_t(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    out[0] = uint8_t(0xE0 | (c >> 12));
    out[1] = uint8_t(0x80 | ((c >> 6) & 0x3F));
    out[2] = uint8_t(0x80 | (c & 0x3F));
    return 3;
  }
  out[0] = uint8_t(0xF0 | (c >> 18));
  out[1] = uint8_t(0x80 | ((c >> 12) & 0x3F));
  out[2] = uint8_t(0x80 | ((c >> 6) & 0x3F));
  out[3] = uint8_t(0x80 | (c & 0x3F));
  return 4;
}

int EncodedLength(char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

// [lo, hi] with one encoded length: split until every byte position ranges independently.
void SplitRange(char32_t lo, char32_t hi, std::vector<ExprPtr>* out) {
  const int n = EncodedLength(lo);
  for (int i = 1; i < n; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitRange(lo, lo | m, out);
        SplitRange((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitRange(lo, (hi & ~m) - 1, out);
        SplitRange(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], z[4];
  Encode(lo, a);
  Encode(hi, z);
  std::vector<ExprPtr> seq;
  for (int k = 0; k < n; ++k) {
    ByteSet s;
    for (int b = a[k]; b <= z[k]; ++b) s.set(size_t(b));
    seq.push_back(Bytes(s));
  }
  out->push_back(Seq(std::move(seq)));
}

void AppendUtf8Range(char32_t lo, char32_t hi, std::vector<ExprPtr>* out) {
  hi = std::min<char32_t>(hi, 0x10FFFF);
  if (lo > hi) return;
  if (lo < 0xD800 && hi > 0xDFFF) {  // surrogates are not characters
    AppendUtf8Range(lo, 0xD7FF, out);
    AppendUtf8Range(0xE000, hi, out);
    return;
  }
  if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
  if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
  if (lo > hi) return;
  for (char32_t top : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}, char32_t{0x10FFFF}}) {
    if (lo > top) continue;
    const char32_t end = std::min(hi, top);
    SplitRange(lo, end, out);
    if (end == hi) return;
    lo = end + 1;
  }
}

}  // namespace

ExprPtr Bytes(const ByteSet& set) {
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = set;
  return Make(std::move(e));
}

ExprPtr Byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return Bytes(s);
}

ExprPtr Literal(std::string_view text) {
  std::vector<ExprPtr> items;
  for (char c : text) items.push_back(Byte(uint8_t(c)));
  return Seq(std::move(items));
}

ExprPtr Seq(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Expr::Kind::kSeq;
  e.items = std::move(items);
  return Make(std::move(e));
}

ExprPtr Alt(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Expr::Kind::kAlt;
  e.items = std::move(items);
  return Make(std::move(e));
}

ExprPtr Empty() { return Seq({}); }

ExprPtr Repeat(ExprPtr item, int min, int max) {
  if (min == 1 && max == 1) return item;
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.items = {std::move(item)};
  e.min = min;
  e.max = max;
  return Make(std::move(e));
}

ExprPtr Optional(ExprPtr item) { return Repeat(std::move(item), 0, 1); }
ExprPtr Star(ExprPtr item) { return Repeat(std::move(item), 0, -1); }
ExprPtr Plus(ExprPtr item) { return Repeat(std::move(item), 1, -1); }

ExprPtr RuleRef(int rule) {
  Expr e;
  e.kind = Expr::Kind::kRule;
  e.rule = rule;
  return Make(std::move(e));
}

ExprPtr Utf8Range(char32_t lo, char32_t hi) { return Utf8Class({{lo, hi}}); }

ExprPtr Utf8Class(const std::vector<std::pair<char32_t, char32_t>>& ranges) {
  std::vector<std::pair<char32_t, char32_t>> r = ranges;
  std::sort(r.begin(), r.end());
  std::vector<std::pair<char32_t, char32_t>> merged;
  for (const auto& [lo, hi] : r) {
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.push_back({lo, hi});
    }
  }
  ByteSet ascii;
  std::vector<ExprPtr> alts;
  for (auto [lo, hi] : merged) {
    for (; lo <= hi && lo < 0x80; ++lo) ascii.set(lo);
    if (lo <= hi) AppendUtf8Range(lo, hi, &alts);
  }
  if (ascii.any()) alts.insert(alts.begin(), Bytes(ascii));
  return Alt(std::move(alts));
}

// ---- GrammarBuilder

GrammarBuilder::GrammarBuilder(Limits limits) : limits_(limits) {}

int GrammarBuilder::NewRule(std::string name) {
  g_.alternatives.emplace_back();
  g_.rule_names.push_back(std::move(name));
  defined_.push_back(false);
  return int(g_.alternatives.size()) - 1;
}

bool GrammarBuilder::defined(int rule) const { return defined_[size_t(rule)]; }

void GrammarBuilder::CheckDeadline() {
  if (limits_.deadline && std::chrono::steady_clock::now() > *limits_.deadline) {
    throw GrammarError("the grammar did not compile within the time limit");
  }
}

int32_t GrammarBuilder::ByteSetIndex(const ByteSet& set) {
  for (const auto& [s, i] : set_index_) {
    if (s == set) return i;
  }
  // A small cache of recent sets, then the full table (grammars hold few distinct sets).
  for (size_t i = 0; i < g_.byte_sets.size(); ++i) {
    if (g_.byte_sets[i] == set) {
      if (set_index_.size() >= 64) set_index_.erase(set_index_.begin());
      set_index_.push_back({set, int32_t(i)});
      return int32_t(i);
    }
  }
  g_.byte_sets.push_back(set);
  return int32_t(g_.byte_sets.size()) - 1;
}

void GrammarBuilder::AddAlternative(int rule, const std::vector<Element>& seq) {
  if (g_.elements.size() + seq.size() + 1 > limits_.max_elements) {
    throw GrammarError("the grammar is too large (more than " +
                       std::to_string(limits_.max_elements) + " elements)");
  }
  if ((++steps_ & 1023) == 0) CheckDeadline();
  g_.alternatives[size_t(rule)].push_back(int32_t(g_.elements.size()));
  g_.elements.insert(g_.elements.end(), seq.begin(), seq.end());
  g_.elements.push_back({Element::kEnd, 0});
}

void GrammarBuilder::Define(int rule, const ExprPtr& body) {
  if (defined_[size_t(rule)]) {
    throw GrammarError("rule '" + g_.rule_names[size_t(rule)] + "' is defined twice");
  }
  defined_[size_t(rule)] = true;
  if (body->kind == Expr::Kind::kAlt) {
    for (const ExprPtr& item : body->items) {
      std::vector<Element> seq;
      Lower(item, &seq);
      AddAlternative(rule, seq);
    }
    return;
  }
  std::vector<Element> seq;
  Lower(body, &seq);
  AddAlternative(rule, seq);
}

int GrammarBuilder::LowerToRule(const ExprPtr& e, const std::string& name) {
  const int r = NewRule(name);
  Define(r, e);
  return r;
}

void GrammarBuilder::Lower(const ExprPtr& e, std::vector<Element>* out) {
  switch (e->kind) {
    case Expr::Kind::kBytes:
      out->push_back({Element::kBytes, ByteSetIndex(e->bytes)});
      return;
    case Expr::Kind::kSeq:
      for (const ExprPtr& item : e->items) Lower(item, out);
      return;
    case Expr::Kind::kAlt:
      if (e->items.size() == 1) {
        Lower(e->items[0], out);
        return;
      }
      out->push_back({Element::kRule, LowerToRule(e, "alt")});
      return;
    case Expr::Kind::kRule:
      out->push_back({Element::kRule, e->rule});
      return;
    case Expr::Kind::kRepeat: {
      const int min = e->min, max = e->max;
      if (min < 0 || (max >= 0 && max < min)) {
        throw GrammarError("a repetition {" + std::to_string(min) + "," + std::to_string(max) +
                           "} has its bounds reversed");
      }
      if (min > limits_.max_repeat || max > limits_.max_repeat) {
        throw GrammarError("a repetition bound above " + std::to_string(limits_.max_repeat) +
                           " is not supported");
      }
      // The item once, as one element when it is a byte set, else as a rule.
      const ExprPtr& item = e->items[0];
      Element one;
      if (item->kind == Expr::Kind::kBytes) {
        one = {Element::kBytes, ByteSetIndex(item->bytes)};
      } else if (item->kind == Expr::Kind::kRule) {
        one = {Element::kRule, item->rule};
      } else {
        one = {Element::kRule, LowerToRule(item, "item")};
      }
      for (int i = 0; i < min; ++i) out->push_back(one);
      if (max < 0) {  // S -> item S | ""
        const int s = NewRule("star");
        defined_[size_t(s)] = true;
        AddAlternative(s, {one, {Element::kRule, s}});
        AddAlternative(s, {});
        out->push_back({Element::kRule, s});
        return;
      }
      // O_1 -> item | "", O_k -> item O_{k-1} | "": at most max - min more, unambiguously.
      int prev = -1;
      for (int k = 0; k < max - min; ++k) {
        const int o = NewRule("opt");
        defined_[size_t(o)] = true;
        std::vector<Element> seq = {one};
        if (prev >= 0) seq.push_back({Element::kRule, prev});
        AddAlternative(o, seq);
        AddAlternative(o, {});
        prev = o;
      }
      if (prev >= 0) out->push_back({Element::kRule, prev});
      return;
    }
  }
}

Grammar GrammarBuilder::Build(int root) {
  if (limits_.prefix) {  // the text starts with the prefix
    const ExprPtr prefix = limits_.prefix(this);
    const int start = NewRule("start");
    Define(start, Seq({prefix, RuleRef(root)}));
    root = start;
  }
  const size_t n = g_.alternatives.size();
  for (size_t r = 0; r < n; ++r) {
    if (!defined_[r]) throw GrammarError("rule '" + g_.rule_names[r] + "' is not defined");
  }
  // Productive alternatives (a fixpoint): those whose every element can match some text.
  // The others (an empty byte set, a rule that derives nothing) are dropped, so that every
  // state the automaton reaches can still complete; a root that derives nothing is an error.
  {
    std::vector<bool> productive(n, false);
    auto alt_productive = [&](int32_t pos) {
      for (int32_t p = pos; g_.elements[size_t(p)].kind != Element::kEnd; ++p) {
        const Element& el = g_.elements[size_t(p)];
        if (el.kind == Element::kBytes ? g_.byte_sets[size_t(el.arg)].none()
                                       : !productive[size_t(el.arg)]) {
          return false;
        }
      }
      return true;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (productive[r]) continue;
        for (int32_t pos : g_.alternatives[r]) {
          if (alt_productive(pos)) {
            productive[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    if (!productive[size_t(root)]) throw GrammarError("the grammar matches no text at all");
    for (auto& alts : g_.alternatives) {
      alts.erase(std::remove_if(alts.begin(), alts.end(),
                                [&](int32_t pos) { return !alt_productive(pos); }),
                 alts.end());
    }
  }
  // Nullable rules (a fixpoint), then left recursion: a rule reachable from itself through
  // leading elements that may match nothing would expand forever.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (int32_t pos : g_.alternatives[r]) {
        bool all = true;
        for (int32_t p = pos; g_.elements[size_t(p)].kind != Element::kEnd; ++p) {
          const Element& el = g_.elements[size_t(p)];
          if (el.kind == Element::kBytes || !nullable[size_t(el.arg)]) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  // Left edges: r -> s when s can be expanded before any byte of r is read. An edge from a
  // reference that ends its alternative is a tail edge: the matcher continues it at the
  // parent (matcher.cc), so the stack does not grow, and a cycle of tail edges only revisits
  // an expansion it has seen ((a?)*: star -> item star | "", item nullable). A cycle with a
  // non-tail edge pushes a continuation per round and would expand forever: left recursion.
  struct LeftEdge {
    int to;
    bool tail;
  };
  std::vector<std::vector<LeftEdge>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (int32_t pos : g_.alternatives[r]) {
      for (int32_t p = pos; g_.elements[size_t(p)].kind == Element::kRule; ++p) {
        const int to = g_.elements[size_t(p)].arg;
        left[r].push_back({to, g_.elements[size_t(p) + 1].kind == Element::kEnd});
        if (!nullable[size_t(to)]) break;
      }
    }
  }
  // Strongly connected components (Kosaraju, iterative): a non-tail edge inside one closes a
  // growing cycle.
  std::vector<int> order;
  order.reserve(n);
  {
    std::vector<uint8_t> done(n, 0);
    for (size_t start = 0; start < n; ++start) {
      if (done[start]) continue;
      std::vector<std::pair<int, size_t>> stack = {{int(start), 0}};
      done[start] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i == left[size_t(r)].size()) {
          order.push_back(r);
          stack.pop_back();
          continue;
        }
        const int next = left[size_t(r)][i++].to;
        if (!done[size_t(next)]) {
          done[size_t(next)] = 1;
          stack.push_back({next, 0});
        }
      }
    }
  }
  std::vector<std::vector<int>> reverse(n);
  for (size_t r = 0; r < n; ++r) {
    for (const LeftEdge& e : left[r]) reverse[size_t(e.to)].push_back(int(r));
  }
  std::vector<int> component(n, -1);
  for (size_t k = order.size(); k-- > 0;) {
    const int root_of = order[k];
    if (component[size_t(root_of)] >= 0) continue;
    std::vector<int> stack = {root_of};
    component[size_t(root_of)] = root_of;
    while (!stack.empty()) {
      const int r = stack.back();
      stack.pop_back();
      for (int prev : reverse[size_t(r)]) {
        if (component[size_t(prev)] < 0) {
          component[size_t(prev)] = root_of;
          stack.push_back(prev);
        }
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const LeftEdge& e : left[r]) {
      if (!e.tail && component[size_t(e.to)] == component[r]) {
        throw GrammarError("rule '" + g_.rule_names[size_t(e.to)] +
                           "' is left-recursive (it can reach itself before any character)");
      }
    }
  }
  g_.root = root;
  return std::move(g_);
}

Grammar ChoiceGrammar(const std::vector<std::string>& choices, const Limits& limits) {
  if (choices.empty()) throw GrammarError("choice must list at least one string");
  GrammarBuilder b(limits);
  std::vector<ExprPtr> alts;
  for (const std::string& c : choices) alts.push_back(Literal(c));
  const int root = b.NewRule("root");
  b.Define(root, Alt(std::move(alts)));
  return b.Build(root);
}

}  // namespace llm::grammar
