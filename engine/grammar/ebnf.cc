// The EBNF subset of `structured_outputs.grammar` (llama.cpp's GBNF style, which vLLM's
// xgrammar backend also reads):
//
//   root   ::= "{" ws pair ("," ws pair)* "}"     # the start rule is named root
//   pair   ::= string ":" ws [0-9]+
//   string ::= "\"" [a-z]* "\""
//   ws     ::= [ \t\n]?
//
// A rule is `name ::= expression`; names are [A-Za-z_][A-Za-z0-9_-]*. Expressions: "string"
// and 'string' literals (escapes \n \t \r \\ \" \' \xHH \uHHHH), character classes [...] as in
// regexes (ranges, negation, \d \w \s), `.` (any character), rule names, ( groups ),
// alternation |, and the postfix * + ? {m} {m,} {m,n}. # starts a comment. Rules may refer to
// rules defined later and recurse, but not left-recursively (a rule reaching itself before
// any character is an error).
#include <map>

#include "engine/grammar/grammar.h"
#include "engine/tokenizer/unicode.h"

namespace llm::grammar {
namespace {

constexpr int kMaxNesting = 256;  // groups; the parser recurses per level

class EbnfParser {
 public:
  EbnfParser(std::string_view text, GrammarBuilder* b) : t_(text), b_(b) {}

  Grammar Parse() {
    Skip();
    while (!AtEnd()) {
      const size_t at = pos_;
      const std::string name = Name();
      if (name.empty()) Fail("a rule name was expected");
      Skip();
      if (t_.substr(pos_, 3) != "::=") Fail("'::=' was expected after '" + name + "'");
      pos_ += 3;
      const int rule = RuleId(name);
      if (b_->defined(rule)) {
        pos_ = at;
        Fail("rule '" + name + "' is defined twice");
      }
      b_->Define(rule, ParseAlt());
      Skip();
    }
    const auto root = rules_.find("root");
    if (root == rules_.end()) throw GrammarError("grammar: there is no rule named 'root'");
    for (const auto& [name, id] : rules_) {
      if (!b_->defined(id)) throw GrammarError("grammar: rule '" + name + "' is not defined");
    }
    return b_->Build(root->second);
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    size_t line = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) line += t_[i] == '\n';
    throw GrammarError("grammar: " + what + " (line " + std::to_string(line) + ")");
  }
  bool AtEnd() const { return pos_ >= t_.size(); }

  void Skip() {
    while (!AtEnd()) {
      const char c = t_[pos_];
      if (c == '#') {
        while (!AtEnd() && t_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool NameStart(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  static bool NameChar(char c) { return NameStart(c) || (c >= '0' && c <= '9') || c == '-'; }

  std::string Name() {
    if (AtEnd() || !NameStart(t_[pos_])) return "";
    const size_t start = pos_;
    while (!AtEnd() && NameChar(t_[pos_])) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  int RuleId(const std::string& name) {
    auto [it, inserted] = rules_.try_emplace(name, -1);
    if (inserted) it->second = b_->NewRule(name);
    return it->second;
  }

  // Whether a `name ::=` starts here (the end of the current rule).
  bool AtRuleStart() {
    const size_t save = pos_;
    const bool is = !Name().empty() && (Skip(), t_.substr(pos_, 3) == "::=");
    pos_ = save;
    return is;
  }

  ExprPtr ParseAlt() {
    std::vector<ExprPtr> alts = {ParseSeq()};
    while (!AtEnd() && t_[pos_] == '|') {
      ++pos_;
      alts.push_back(ParseSeq());
    }
    return Alt(std::move(alts));
  }

  ExprPtr ParseSeq() {
    std::vector<ExprPtr> items;
    while (true) {
      Skip();
      if (AtEnd() || t_[pos_] == '|' || t_[pos_] == ')' || AtRuleStart()) break;
      items.push_back(ParsePostfix(ParseAtom()));
    }
    return Seq(std::move(items));
  }

  ExprPtr ParsePostfix(ExprPtr atom) {
    while (!AtEnd()) {
      const char c = t_[pos_];
      if (c == '*') {
        atom = Star(atom), ++pos_;
      } else if (c == '+') {
        atom = Plus(atom), ++pos_;
      } else if (c == '?') {
        atom = Optional(atom), ++pos_;
      } else if (c == '{') {
        const size_t close = t_.find('}', pos_);
        if (close == std::string_view::npos) Fail("a '{' repetition is not closed");
        const std::string body(t_.substr(pos_ + 1, close - pos_ - 1));
        int min = 0, max = 0;
        size_t used = 0;
        try {
          const size_t comma = body.find(',');
          min = std::stoi(body.substr(0, comma), &used);
          if (used != (comma == std::string::npos ? body.size() : comma)) throw 0;
          if (comma == std::string::npos) {
            max = min;
          } else if (comma + 1 == body.size()) {
            max = -1;
          } else {
            max = std::stoi(body.substr(comma + 1), &used);
            if (used != body.size() - comma - 1) throw 0;
          }
        } catch (...) {
          Fail("a bad {m,n} repetition");
        }
        if (min < 0 || (max >= 0 && max < min)) Fail("a bad {m,n} repetition");
        atom = Repeat(atom, min, max);
        pos_ = close + 1;
      } else {
        break;
      }
    }
    return atom;
  }

  static int Hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  ExprPtr ParseLiteral() {
    const char quote = t_[pos_++];
    std::string out;
    while (true) {
      if (AtEnd()) Fail("a string literal is not closed");
      const char c = t_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (AtEnd()) Fail("a string literal is not closed");
      const char e = t_[pos_++];
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'x':
        case 'u': {
          const int digits = e == 'x' ? 2 : 4;
          char32_t v = 0;
          for (int i = 0; i < digits; ++i) {
            if (AtEnd() || Hex(t_[pos_]) < 0) Fail("a bad \\x / \\u escape");
            v = v * 16 + char32_t(Hex(t_[pos_++]));
          }
          unicode::AppendChar(v, &out);
          break;
        }
        default:
          out.push_back(e);
      }
    }
    return Literal(out);
  }

  ExprPtr ParseAtom() {
    const char c = t_[pos_];
    if (c == '"' || c == '\'') return ParseLiteral();
    if (c == '(') {
      if (++depth_ > kMaxNesting) Fail("groups nest deeper than " + std::to_string(kMaxNesting));
      ++pos_;
      ExprPtr inner = ParseAlt();
      --depth_;
      Skip();
      if (AtEnd() || t_[pos_] != ')') Fail("a group is not closed");
      ++pos_;
      return inner;
    }
    if (c == '[' || c == '.') {  // a regex class: its own parser
      size_t end = pos_ + 1;
      if (c == '[') {
        if (end < t_.size() && t_[end] == '^') ++end;
        if (end < t_.size() && t_[end] == ']') ++end;
        while (end < t_.size() && t_[end] != ']') end += t_[end] == '\\' ? 2 : 1;
        if (end >= t_.size()) Fail("a character class is not closed");
        ++end;
      }
      const std::string_view cls = t_.substr(pos_, end - pos_);
      pos_ = end;
      try {
        return RegexExpr(cls, b_);
      } catch (const GrammarError& e) {
        Fail(e.what());
      }
    }
    const std::string name = Name();
    if (name.empty()) Fail(std::string("unexpected '") + c + "'");
    return RuleRef(RuleId(name));
  }

  std::string_view t_;
  GrammarBuilder* b_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::map<std::string, int> rules_;
};

}  // namespace

Grammar EbnfGrammar(std::string_view text, const Limits& limits) {
  GrammarBuilder b(limits);
  return EbnfParser(text, &b).Parse();
}

}  // namespace llm::grammar
