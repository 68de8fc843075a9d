// The chat-template parser: recursive descent over the lexer's tokens, with Jinja2's operator
// precedence (or < and < not < comparisons < + - < ~ < * / // % < ** < unary < filters, tests
// and postfix access). Unsupported statements fail here, at start-up, with line and column.
#include "engine/chat/jinja_ast.h"
#include "engine/error.h"

namespace llm::jinja {
namespace {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  NodeList ParseAll() {
    NodeList nodes = ParseBody({});
    if (Peek().type != T::kEof) Fail(Peek(), "unexpected '" + Peek().text + "'");
    return nodes;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    size_t i = std::min(pos_ + ahead, tokens_.size() - 1);
    return tokens_[i];
  }
  const Token& Next() {
    const Token& t = Peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).type == T::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).type == T::kName && Peek(ahead).text == name;
  }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Fail(Peek(), std::string("expected '") + op + "'");
    Next();
  }
  std::string ExpectName() {
    if (Peek().type != T::kName) Fail(Peek(), "expected a name");
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Peek().type != T::kBlockEnd) Fail(Peek(), "expected '%}'");
    Next();
  }
  [[noreturn]] void Fail(const Token& at, const std::string& message) const {
    std::string found = at.type == T::kEof        ? " (end of template)"
                        : at.type == T::kVarEnd   ? " (found '}}')"
                        : at.type == T::kBlockEnd ? " (found '%}')"
                                                  : "";
    throw Error("chat template: line " + std::to_string(at.line) + ", column " +
                std::to_string(at.column) + ": " + message + found);
  }
  struct DepthGuard {
    DepthGuard(Parser& p, const Token& at) : parser(p) {
      if (++parser.depth_ > kMaxNestingDepth) parser.Fail(at, "template nested too deeply");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // Parses nodes until a block tag whose keyword is in `ends` (left unconsumed after `{%`).
  NodeList ParseBody(const std::vector<std::string>& ends) {
    DepthGuard guard(*this, Peek());
    if (!ends.empty()) open_blocks_.push_back(ends.back());
    struct Pop {
      std::vector<std::string>& blocks;
      bool active;
      ~Pop() {
        if (active) blocks.pop_back();
      }
    } pop{open_blocks_, !ends.empty()};
    NodeList nodes;
    while (true) {
      const Token& t = Peek();
      if (t.type == T::kEof) {
        if (!ends.empty()) Fail(t, "missing '{% " + ends.back() + " %}'");
        return nodes;
      }
      if (t.type == T::kText) {
        auto node = MakeNode(Node::Kind::kText, t);
        node->text = t.text;
        nodes.push_back(std::move(node));
        Next();
      } else if (t.type == T::kVarBegin) {
        Next();
        auto node = MakeNode(Node::Kind::kOutput, t);
        node->expr = ParseExpression();
        if (Peek().type != T::kVarEnd) Fail(Peek(), "expected '}}'");
        Next();
        nodes.push_back(std::move(node));
      } else if (t.type == T::kBlockBegin) {
        const Token& keyword = Peek(1);
        for (const auto& end : ends) {
          if (keyword.type == T::kName && keyword.text == end) return nodes;
        }
        Next();
        nodes.push_back(ParseStatement());
      } else {
        Fail(t, "unexpected token");
      }
    }
  }

  std::unique_ptr<Node> MakeNode(Node::Kind kind, const Token& at) {
    auto node = std::make_unique<Node>();
    node->kind = kind;
    node->line = at.line;
    node->column = at.column;
    return node;
  }

  // Consumes `{% name ... %}` that ParseBody stopped at.
  void ExpectEnd(const char* name) {
    Next();  // {%
    if (!IsName(name)) Fail(Peek(), std::string("expected '") + name + "'");
    Next();
    ExpectBlockEnd();
  }

  std::unique_ptr<Node> ParseStatement() {
    const Token& keyword = Peek();
    if (keyword.type != T::kName) Fail(keyword, "expected a statement name");
    const std::string& k = keyword.text;
    if (k == "if") return ParseIf();
    if (k == "for") return ParseFor();
    if (k == "set") return ParseSet();
    if (k == "macro") return ParseMacro();
    if (k == "break" || k == "continue") {
      Next();
      ExpectBlockEnd();
      return MakeNode(k == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, keyword);
    }
    if (k.rfind("end", 0) == 0 || k == "else" || k == "elif") {
      Fail(keyword, "unexpected '" + k + "'" +
                        (open_blocks_.empty() ? "" : ", expected '" + open_blocks_.back() + "'"));
    }
    if (k == "filter") {
      Next();
      auto node = MakeNode(Node::Kind::kFilterBlock, keyword);
      // {% filter f(args) | g %}: f applies to a placeholder (an unnamed kName) for the body.
      auto first = MakeExpr(Expr::Kind::kFilter, Peek());
      first->name = ExpectName();
      first->children.push_back(MakeExpr(Expr::Kind::kName, keyword));
      if (IsOp("(")) ParseCallArgs(*first);
      node->expr = ParseFilters(std::move(first));
      ExpectBlockEnd();
      node->body = ParseBody({"endfilter"});
      ExpectEnd("endfilter");
      return node;
    }
    if (k == "generation") {
      Next();
      ExpectBlockEnd();
      auto node = MakeNode(Node::Kind::kCallBlock, keyword);
      node->body = ParseBody({"endgeneration"});
      ExpectEnd("endgeneration");
      return node;
    }
    Fail(keyword, "unsupported statement '" + k + "'");
  }

  std::unique_ptr<Node> ParseIf() {
    auto node = MakeNode(Node::Kind::kIf, Next());  // if / elif
    node->expr = ParseExpression();
    ExpectBlockEnd();
    node->body = ParseBody({"elif", "else", "endif"});
    const Token& keyword = Peek(1);
    if (keyword.text == "elif") {
      Next();  // {%
      node->else_body.push_back(ParseIf());
      return node;  // the nested If consumed endif
    }
    if (keyword.text == "else") {
      Next();
      Next();
      ExpectBlockEnd();
      node->else_body = ParseBody({"endif"});
    }
    ExpectEnd("endif");
    return node;
  }

  std::unique_ptr<Node> ParseFor() {
    auto node = MakeNode(Node::Kind::kFor, Next());
    node->targets.push_back(ExpectName());
    while (IsOp(",")) {
      Next();
      node->targets.push_back(ExpectName());
    }
    if (!IsName("in")) Fail(Peek(), "expected 'in'");
    Next();
    node->expr = ParseTernary(/*allow_if=*/false);
    if (IsName("if")) {
      Next();
      node->filter = ParseTernary(false);
    }
    if (IsName("recursive")) Fail(Peek(), "recursive loops are not supported");
    ExpectBlockEnd();
    node->body = ParseBody({"else", "endfor"});
    if (Peek(1).text == "else") {
      Next();
      Next();
      ExpectBlockEnd();
      node->else_body = ParseBody({"endfor"});
    }
    ExpectEnd("endfor");
    return node;
  }

  std::unique_ptr<Node> ParseSet() {
    auto node = MakeNode(Node::Kind::kSet, Next());
    node->targets.push_back(ExpectName());
    if (IsOp(".")) {
      Next();
      node->attr = ExpectName();
    } else {
      while (IsOp(",")) {
        Next();
        node->targets.push_back(ExpectName());
      }
    }
    if (Peek().type == T::kBlockEnd && node->attr.empty() && node->targets.size() == 1) {
      Next();  // {% set x %}...{% endset %}
      node->body = ParseBody({"endset"});
      ExpectEnd("endset");
      return node;
    }
    ExpectOp("=");
    const Token& at = Peek();
    node->expr = ParseExpression();
    if (IsOp(",")) {  // {% set a, b = 1, 2 %}: the right side is a tuple
      auto tuple = MakeExpr(Expr::Kind::kList, at);
      tuple->name = "tuple";
      tuple->children.push_back(std::move(node->expr));
      while (IsOp(",")) {
        Next();
        if (Peek().type == T::kBlockEnd) break;
        tuple->children.push_back(ParseExpression());
      }
      node->expr = std::move(tuple);
    }
    ExpectBlockEnd();
    return node;
  }

  std::unique_ptr<Node> ParseMacro() {
    auto node = MakeNode(Node::Kind::kMacro, Next());
    node->text = ExpectName();
    ExpectOp("(");
    while (!IsOp(")")) {
      node->targets.push_back(ExpectName());
      if (IsOp("=")) {
        Next();
        node->defaults.push_back(ParseExpression());
      } else {
        node->defaults.push_back(nullptr);
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
    ExpectBlockEnd();
    node->body = ParseBody({"endmacro"});
    ExpectEnd("endmacro");
    return node;
  }

  ExprPtr MakeExpr(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  ExprPtr Binary(const Token& at, std::string op, ExprPtr a, ExprPtr b) {
    auto e = MakeExpr(Expr::Kind::kBinary, at);
    e->name = std::move(op);
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseExpression() { return ParseTernary(true); }

  ExprPtr ParseTernary(bool allow_if) {
    DepthGuard guard(*this, Peek());
    const Token& at = Peek();
    ExprPtr value = ParseOr();
    while (allow_if && IsName("if")) {
      Next();
      auto e = MakeExpr(Expr::Kind::kCondition, at);
      e->children.push_back(ParseOr());
      e->children.push_back(std::move(value));
      if (IsName("else")) {
        Next();
        e->children.push_back(ParseTernary(true));
      } else {
        e->children.push_back(nullptr);
      }
      value = std::move(e);
    }
    return value;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (IsName("or")) {
      const Token& at = Next();
      left = Binary(at, "or", std::move(left), ParseAnd());
    }
    return left;
  }
  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (IsName("and")) {
      const Token& at = Next();
      left = Binary(at, "and", std::move(left), ParseNot());
    }
    return left;
  }
  ExprPtr ParseNot() {
    if (IsName("not")) {
      const Token& at = Next();
      DepthGuard guard(*this, at);
      auto e = MakeExpr(Expr::Kind::kUnary, at);
      e->name = "not";
      e->children.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    ExprPtr left = ParseMath1();
    while (true) {
      const Token& at = Peek();
      std::string op;
      if (at.type == T::kOp && (at.text == "==" || at.text == "!=" || at.text == "<" ||
                                at.text == "<=" || at.text == ">" || at.text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        return left;
      }
      left = Binary(at, op, std::move(left), ParseMath1());
    }
  }
  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& at = Next();
      left = Binary(at, at.text, std::move(left), ParseConcat());
    }
    return left;
  }
  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (IsOp("~")) {
      const Token& at = Next();
      left = Binary(at, "~", std::move(left), ParseMath2());
    }
    return left;
  }
  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& at = Next();
      left = Binary(at, at.text, std::move(left), ParsePow());
    }
    return left;
  }
  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary();
    while (IsOp("**")) {
      const Token& at = Next();
      left = Binary(at, "**", std::move(left), ParseUnary());
    }
    return left;
  }
  ExprPtr ParseUnary() {
    if (IsOp("-") || IsOp("+")) {
      const Token& at = Next();
      DepthGuard guard(*this, at);
      auto e = MakeExpr(Expr::Kind::kUnary, at);
      e->name = at.text;
      e->children.push_back(ParseUnary());
      return ParseFilters(std::move(e));
    }
    return ParseFilters(ParsePostfix(ParsePrimary()));
  }

  void ParseCallArgs(Expr& e) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (Peek().type == T::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        Next();
        e.kwargs.emplace_back(name, ParseExpression());
      } else {
        e.children.push_back(ParseExpression());
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
  }

  ExprPtr ParsePostfix(ExprPtr value) {
    while (true) {
      const Token& at = Peek();
      if (IsOp(".")) {
        Next();
        auto e = MakeExpr(Expr::Kind::kAttr, at);
        if (Peek().type == T::kInt) {
          e->kind = Expr::Kind::kItem;
          e->children.push_back(std::move(value));
          auto index = MakeExpr(Expr::Kind::kLiteral, Peek());
          index->value = Value::Int(Next().int_value);
          e->children.push_back(std::move(index));
        } else {
          e->name = ExpectName();
          e->children.push_back(std::move(value));
        }
        value = std::move(e);
      } else if (IsOp("[")) {
        Next();
        value = ParseSubscript(at, std::move(value));
      } else if (IsOp("(")) {
        auto e = MakeExpr(Expr::Kind::kCall, at);
        e->children.push_back(std::move(value));
        ParseCallArgs(*e);
        value = std::move(e);
      } else {
        return value;
      }
    }
  }

  ExprPtr ParseSubscript(const Token& at, ExprPtr value) {
    ExprPtr parts[3];
    bool is_slice = false;
    for (int i = 0; i < 3; ++i) {
      if (!IsOp(":") && !IsOp("]")) parts[i] = ParseExpression();
      if (i < 2 && IsOp(":")) {
        Next();
        is_slice = true;
      } else {
        break;
      }
    }
    ExpectOp("]");
    auto e = MakeExpr(is_slice ? Expr::Kind::kSlice : Expr::Kind::kItem, at);
    e->children.push_back(std::move(value));
    if (!is_slice && !parts[0]) Fail(at, "empty subscript");
    e->children.push_back(std::move(parts[0]));
    if (is_slice) {
      e->children.push_back(std::move(parts[1]));
      e->children.push_back(std::move(parts[2]));
    }
    return e;
  }

  ExprPtr ParseFilters(ExprPtr value) {
    while (true) {
      const Token& at = Peek();
      if (IsOp("|")) {
        Next();
        auto e = MakeExpr(Expr::Kind::kFilter, at);
        e->name = ExpectName();
        e->children.push_back(std::move(value));
        if (IsOp("(")) ParseCallArgs(*e);
        value = ParsePostfix(std::move(e));
      } else if (IsName("is")) {
        Next();
        auto e = MakeExpr(Expr::Kind::kTest, at);
        if (IsName("not")) {
          Next();
          e->negated = true;
        }
        e->name = ExpectName();
        e->children.push_back(std::move(value));
        if (IsOp("(")) {
          ParseCallArgs(*e);
        } else if (Peek().type == T::kString || Peek().type == T::kInt ||
                   Peek().type == T::kFloat ||
                   (Peek().type == T::kName && !IsName("and") && !IsName("or") && !IsName("else") &&
                    !IsName("if") && !IsName("in") && !IsName("not") && !IsName("is"))) {
          e->children.push_back(ParsePostfix(ParsePrimary()));  // `is divisibleby 3`
        }
        value = std::move(e);
      } else {
        return value;
      }
    }
  }

  ExprPtr ParsePrimary() {
    DepthGuard guard(*this, Peek());
    const Token& t = Peek();
    auto literal = [&](Value v) {
      Next();
      auto e = MakeExpr(Expr::Kind::kLiteral, t);
      e->value = std::move(v);
      return e;
    };
    switch (t.type) {
      case T::kString: {
        std::string s = t.text;
        Next();
        while (Peek().type == T::kString) s += Next().text;  // adjacent literals concatenate
        auto e = MakeExpr(Expr::Kind::kLiteral, t);
        e->value = Value::String(std::move(s));
        return e;
      }
      case T::kInt:
        return literal(Value::Int(t.int_value));
      case T::kFloat:
        return literal(Value::Float(t.float_value));
      case T::kName: {
        if (t.text == "true" || t.text == "True") return literal(Value::Bool(true));
        if (t.text == "false" || t.text == "False") return literal(Value::Bool(false));
        if (t.text == "none" || t.text == "None") return literal(Value::None());
        auto e = MakeExpr(Expr::Kind::kName, t);
        e->name = Next().text;
        return e;
      }
      case T::kOp:
        if (t.text == "(") {
          Next();
          ExprPtr inner = ParseExpression();
          if (IsOp(",")) {  // a tuple
            auto list = MakeExpr(Expr::Kind::kList, t);
            list->name = "tuple";
            list->children.push_back(std::move(inner));
            while (IsOp(",")) {
              Next();
              if (IsOp(")")) break;
              list->children.push_back(ParseExpression());
            }
            inner = std::move(list);
          }
          ExpectOp(")");
          return inner;
        }
        if (t.text == "[") {
          Next();
          auto e = MakeExpr(Expr::Kind::kList, t);
          while (!IsOp("]")) {
            e->children.push_back(ParseExpression());
            if (!IsOp(",")) break;
            Next();
          }
          ExpectOp("]");
          return e;
        }
        if (t.text == "{") {
          Next();
          auto e = MakeExpr(Expr::Kind::kDict, t);
          while (!IsOp("}")) {
            e->children.push_back(ParseExpression());
            ExpectOp(":");
            e->children.push_back(ParseExpression());
            if (!IsOp(",")) break;
            Next();
          }
          ExpectOp("}");
          return e;
        }
        break;
      default:
        break;
    }
    Fail(t, t.type == T::kEof
                ? "unexpected end of template"
                : std::string(t.text.empty() ? "unexpected token" : "unexpected '" + t.text + "'"));
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::vector<std::string> open_blocks_;  // the end tag each open block waits for
};

}  // namespace

NodeList ParseTemplate(const std::vector<Token>& tokens) { return Parser(tokens).ParseAll(); }

}  // namespace llm::jinja
