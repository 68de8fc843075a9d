// Regular expressions to grammar expressions. The syntax is the subset JSON Schema's
// `pattern` and vLLM's `regex` use in practice (ECMAScript with the u flag: \d and \w are
// ASCII, \s is ECMAScript's whitespace set, . is any character but a line terminator). The
// whole text must match: ^ and $ may stand only at the ends of the pattern (or of a top-level
// alternative). Backreferences, lookaround, possessive quantifiers and inline flags are an
// error naming them.
#include <algorithm>

#include "engine/grammar/grammar.h"
#include "engine/tokenizer/unicode.h"

namespace llm::grammar {
namespace {

using Ranges = std::vector<std::pair<char32_t, char32_t>>;

constexpr char32_t kMaxChar = 0x10FFFF;
constexpr int kMaxNesting = 256;  // groups; the parser recurses per level

Ranges Complement(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  char32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = std::max<char32_t>(next, hi + 1);
  }
  if (next <= kMaxChar) out.push_back({next, kMaxChar});
  return out;
}

const Ranges& DigitRanges() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& WordRanges() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& SpaceRanges() {  // ECMAScript WhiteSpace and LineTerminator
  static const Ranges r = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                           {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                           {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return r;
}

class RegexParser {
 public:
  RegexParser(std::string_view p, bool json_string, GrammarBuilder* b)
      : p_(p), json_(json_string), b_(b) {}

  ExprPtr Parse() {
    ExprPtr e = ParseAlt(0);
    if (pos_ < p_.size()) Fail("unbalanced ')'");
    return e;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    throw GrammarError("regex /" + std::string(p_) + "/: " + what + " at offset " +
                       std::to_string(pos_));
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  char32_t NextChar() {
    const unsigned char lead = static_cast<unsigned char>(p_[pos_]);
    if (pos_ + unicode::CharLength(lead) > p_.size() ||
        !unicode::IsValidUtf8(p_.substr(pos_, unicode::CharLength(lead)))) {
      Fail("invalid UTF-8");
    }
    return unicode::NextChar(p_, &pos_);
  }

  // A character set as produced text: plain UTF-8, or JSON string content (escaped forms
  // for the characters JSON must escape).
  ExprPtr Chars(const Ranges& ranges) {
    if (!json_) return Utf8Class(ranges);
    Ranges plain;
    std::vector<ExprPtr> alts;
    for (auto [lo, hi] : ranges) {
      for (char32_t c = lo; c <= hi && c < 0x20; ++c) alts.push_back(Literal(JsonEscape(c)));
      lo = std::max<char32_t>(lo, 0x20);
      for (char32_t c : {char32_t{'"'}, char32_t{'\\'}}) {
        if (lo <= c && c <= hi) {
          alts.push_back(Literal(JsonEscape(c)));
          if (lo < c) plain.push_back({lo, c - 1});
          lo = c + 1;
        }
      }
      if (lo <= hi) plain.push_back({lo, hi});
    }
    if (!plain.empty()) alts.insert(alts.begin(), Utf8Class(plain));
    return Alt(std::move(alts));
  }

  static std::string JsonEscape(char32_t c) {
    switch (c) {
      case '"':
        return "\\\"";
      case '\\':
        return "\\\\";
      case '\n':
        return "\\n";
      case '\t':
        return "\\t";
      case '\r':
        return "\\r";
      case '\b':
        return "\\b";
      case '\f':
        return "\\f";
      default: {
        static const char* hex = "0123456789abcdef";
        return std::string("\\u00") + hex[c >> 4] + hex[c & 15];
      }
    }
  }

  ExprPtr ParseAlt(int depth) {
    std::vector<ExprPtr> alts;
    alts.push_back(ParseSeq(depth));
    while (!AtEnd() && Peek() == '|') {
      ++pos_;
      alts.push_back(ParseSeq(depth));
    }
    return Alt(std::move(alts));
  }

  ExprPtr ParseSeq(int depth) {
    std::vector<ExprPtr> items;
    const size_t start = pos_;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '^') {
        if (depth != 0 || pos_ != start) Fail("'^' inside the pattern is not supported");
        ++pos_;
        continue;
      }
      if (Peek() == '$') {
        ++pos_;
        if (depth != 0 || !(AtEnd() || Peek() == '|')) {
          Fail("'$' inside the pattern is not supported");
        }
        continue;
      }
      ExprPtr atom = ParseAtom(depth);
      items.push_back(ParseQuantifier(std::move(atom)));
    }
    if (!AtEnd() && Peek() == ')' && depth == 0) Fail("unbalanced ')'");
    return Seq(std::move(items));
  }

  bool ParseInt(int* out) {
    const size_t start = pos_;
    long v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = std::min<long>(v * 10 + (Peek() - '0'), 1L << 30);
      ++pos_;
    }
    *out = int(v);
    return pos_ > start;
  }

  ExprPtr ParseQuantifier(ExprPtr atom) {
    if (AtEnd()) return atom;
    int min = 0, max = 0;
    const char c = Peek();
    if (c == '*') {
      min = 0, max = -1, ++pos_;
    } else if (c == '+') {
      min = 1, max = -1, ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (c == '{') {
      const size_t save = pos_++;
      if (!ParseInt(&min)) {
        pos_ = save;  // not a quantifier: a literal '{' (parsed by the caller's next atom)
        return atom;
      }
      max = min;
      if (!AtEnd() && Peek() == ',') {
        ++pos_;
        if (!ParseInt(&max)) max = -1;
      }
      if (AtEnd() || Peek() != '}') Fail("a '{' quantifier is not closed");
      ++pos_;
      if (max >= 0 && max < min) Fail("the quantifier's bounds are reversed");
      if (min > b_->limits().max_repeat || max > b_->limits().max_repeat) {
        Fail("a quantifier above " + std::to_string(b_->limits().max_repeat) + " is not supported");
      }
    } else {
      return atom;
    }
    if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same language
    if (!AtEnd() && Peek() == '+') Fail("possessive quantifiers are not supported");
    // ECMAScript refuses a quantifier on a quantifier (a{2}{3}, a*{2}: "nothing to repeat");
    // a '{' that is no quantifier stays a literal.
    if (!AtEnd() &&
        (Peek() == '*' || Peek() == '+' || (Peek() == '{' && BraceQuantifierAt(pos_)))) {
      Fail("a quantifier follows a quantifier (nothing to repeat; group it: (a{2}){3})");
    }
    return Repeat(std::move(atom), min, max);
  }

  // p_[i..] is {m}, {m,} or {m,n}.
  bool BraceQuantifierAt(size_t i) const {
    auto digits = [&](size_t* j) {
      const size_t start = *j;
      while (*j < p_.size() && p_[*j] >= '0' && p_[*j] <= '9') ++*j;
      return *j > start;
    };
    if (i >= p_.size() || p_[i] != '{') return false;
    size_t j = i + 1;
    if (!digits(&j)) return false;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      digits(&j);
    }
    return j < p_.size() && p_[j] == '}';
  }

  ExprPtr ParseAtom(int depth) {
    const char c = Peek();
    if (c == '(') {
      if (depth >= kMaxNesting) Fail("groups nest deeper than " + std::to_string(kMaxNesting));
      ++pos_;
      if (!AtEnd() && Peek() == '?') {
        ++pos_;
        if (AtEnd()) Fail("a group is not closed");
        if (Peek() == ':') {
          ++pos_;
        } else if (Peek() == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' &&
                   p_[pos_ + 1] != '!') {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) Fail("a group name is not closed");
          pos_ = close + 1;
        } else if (Peek() == 'P' && pos_ + 1 < p_.size() && p_[pos_ + 1] == '<') {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) Fail("a group name is not closed");
          pos_ = close + 1;
        } else if (Peek() == '=' || Peek() == '!' || Peek() == '<') {
          Fail("lookaround assertions are not supported");
        } else {
          Fail("inline flags and other (?...) groups are not supported");
        }
      }
      ExprPtr inner = ParseAlt(depth + 1);
      if (AtEnd() || Peek() != ')') Fail("a group is not closed");
      ++pos_;
      return inner;
    }
    if (c == '[') return Chars(ParseClass());
    if (c == '.') {
      ++pos_;
      return Chars(Complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '*' || c == '+' || c == '?') Fail("a quantifier has nothing to repeat");
    if (c == '\\') {
      Ranges r;
      ParseEscape(/*in_class=*/false, &r);
      return Chars(r);
    }
    const char32_t ch = NextChar();
    return Chars({{ch, ch}});
  }

  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  char32_t ParseHex(int digits) {
    char32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (AtEnd() || HexValue(Peek()) < 0)
        Fail("a hex escape needs " + std::to_string(digits) + " hex digits");
      v = v * 16 + char32_t(HexValue(p_[pos_++]));
    }
    return v;
  }

  // After a backslash: the escaped set into *out. Returns true for a class escape (\d ...).
  bool ParseEscape(bool in_class, Ranges* out) {
    ++pos_;  // the backslash
    if (AtEnd()) Fail("the pattern ends in a backslash");
    const char c = p_[pos_++];
    auto single = [&](char32_t ch) {
      *out = {{ch, ch}};
      return false;
    };
    switch (c) {
      case 'd':
        *out = DigitRanges();
        return true;
      case 'D':
        *out = Complement(DigitRanges());
        return true;
      case 'w':
        *out = WordRanges();
        return true;
      case 'W':
        *out = Complement(WordRanges());
        return true;
      case 's':
        *out = SpaceRanges();
        return true;
      case 'S':
        *out = Complement(SpaceRanges());
        return true;
      case 'n':
        return single('\n');
      case 't':
        return single('\t');
      case 'r':
        return single('\r');
      case 'f':
        return single('\f');
      case 'v':
        return single('\v');
      case '0':
        return single(0);
      case 'x':
        return single(ParseHex(2));
      case 'u':
        if (!AtEnd() && Peek() == '{') {
          ++pos_;
          char32_t v = 0;
          int n = 0;
          while (!AtEnd() && HexValue(Peek()) >= 0 && n < 6)
            v = v * 16 + char32_t(HexValue(p_[pos_++])), ++n;
          if (n == 0 || AtEnd() || Peek() != '}' || v > kMaxChar) Fail("a bad \\u{...} escape");
          ++pos_;
          return single(v);
        }
        return single(ParseHex(4));
      case 'b':
        if (in_class) return single('\b');
        Fail("word boundaries (\\b) are not supported");
      case 'B':
        Fail("word boundaries (\\B) are not supported");
      default:
        break;
    }
    if (c >= '1' && c <= '9') Fail("backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      Fail(std::string("the escape \\") + c + " is not supported");
    }
    --pos_;
    return single(NextChar());
  }

  Ranges ParseClass() {
    ++pos_;  // [
    bool negate = false;
    if (!AtEnd() && Peek() == '^') negate = true, ++pos_;
    Ranges r;
    bool first = true;
    while (true) {
      if (AtEnd()) Fail("a character class is not closed");
      if (Peek() == ']' && !first) break;
      first = false;
      Ranges lo_set;
      bool lo_is_class = false;
      if (Peek() == '\\') {
        lo_is_class = ParseEscape(/*in_class=*/true, &lo_set);
      } else {
        const char32_t ch = NextChar();
        lo_set = {{ch, ch}};
      }
      if (!lo_is_class && pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        Ranges hi_set;
        bool hi_is_class = false;
        if (Peek() == '\\') {
          hi_is_class = ParseEscape(/*in_class=*/true, &hi_set);
        } else {
          const char32_t ch = NextChar();
          hi_set = {{ch, ch}};
        }
        if (hi_is_class) Fail("a class escape cannot end a range");
        if (hi_set[0].first < lo_set[0].first) Fail("a character range is out of order");
        r.push_back({lo_set[0].first, hi_set[0].first});
        continue;
      }
      r.insert(r.end(), lo_set.begin(), lo_set.end());
    }
    ++pos_;  // ]
    return negate ? Complement(r) : r;
  }

  std::string_view p_;
  bool json_;
  GrammarBuilder* b_;
  size_t pos_ = 0;
};

}  // namespace

ExprPtr RegexExpr(std::string_view pattern, GrammarBuilder* b) {
  return RegexParser(pattern, /*json_string=*/false, b).Parse();
}

ExprPtr RegexJsonStringExpr(std::string_view pattern, GrammarBuilder* b) {
  return RegexParser(pattern, /*json_string=*/true, b).Parse();
}

Grammar RegexGrammar(std::string_view pattern, const Limits& limits) {
  GrammarBuilder b(limits);
  const int root = b.NewRule("root");
  b.Define(root, RegexExpr(pattern, &b));
  return b.Build(root);
}

}  // namespace llm::grammar
