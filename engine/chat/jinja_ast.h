// Tokens and syntax tree of the chat-template interpreter (a Jinja2 subset), with the lexer
// and parser entry points. Whitespace control (trim_blocks, lstrip_blocks, `-`/`+` markers) is
// applied by the lexer, so Text nodes hold exactly what is printed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/chat/jinja_value.h"

namespace llm::jinja {

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type;
  std::string text;  // the text, the name, the operator, the unescaped string literal
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

// Limits that keep hostile templates from exhausting the server.
inline constexpr int kMaxNestingDepth = 200;  // nested blocks and expressions while parsing

// Throws llm::Error("chat template: line L, column C: ...") on unterminated tags and bad tokens.
std::vector<Token> Lex(const std::string& source);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // children; name "tuple" for a tuple (it prints as one)
    kDict,       // children: key, value, key, value, ...
    kAttr,       // children[0].name
    kItem,       // children[0][children[1]]
    kSlice,      // children[0][children[1]:children[2]:children[3]] (null where absent)
    kCall,       // children[0](children[1:], kwargs)
    kFilter,     // children[0] | name(children[1:], kwargs)
    kTest,       // children[0] is [not] name(children[1:]); negated
    kUnary,      // op children[0]: "not", "-", "+"
    kBinary,     // children[0] op children[1]
    kCondition,  // children[1] if children[0] else children[2] (children[2] may be null)
  };
  Kind kind;
  Value value;
  std::string name;  // name, attribute, filter, test, operator
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  int line = 0;
  int column = 0;
};

struct Node;
using NodeList = std::vector<std::unique_ptr<Node>>;
struct Node {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // if expr: body else else_body (elif is an If inside else_body)
    kFor,     // for targets in expr [if filter]: body else else_body
    kSet,     // set targets[0] [. attr] = expr, or block set with body
    kMacro,   // macro name(params = defaults): body
    kBreak,
    kContinue,
    kCallBlock,    // {% generation %} body: rendered as is
    kFilterBlock,  // {% filter f | g(...) %} body: expr is g(f(<the body>)), innermost a kName
  };
  Kind kind;
  std::string text;
  std::vector<std::string> targets;  // for/set variables; macro parameters
  std::string attr;                  // set ns.attr
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> defaults;  // macro parameter defaults (null where none)
  NodeList body;
  NodeList else_body;
  int line = 0;
  int column = 0;
};

// Throws llm::Error("chat template: line L, column C: ...") for syntax errors and for
// constructs outside the supported subset.
NodeList ParseTemplate(const std::vector<Token>& tokens);

}  // namespace llm::jinja
