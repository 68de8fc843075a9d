// The chat-template lexer: splits the source into text and tag tokens the way Jinja2 does with
// transformers' settings (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
#include <algorithm>
#include <cctype>
#include <string_view>

#include "engine/chat/jinja_ast.h"
#include "engine/error.h"

namespace llm::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> Run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t start = FindTagStart(pos);
      std::string text = src_.substr(pos, start - pos);
      if (start == src_.size()) {
        Emit(Token::Type::kText, text, pos);
        break;
      }
      char kind = src_[start + 1];
      size_t p = start + 2;
      char marker = p < src_.size() ? src_[p] : '\0';
      if (marker == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
        ++p;
      } else if (kind != '{' && marker == '+') {
        ++p;
      } else if (kind != '{') {
        LstripBlock(text, pos);
      }
      if (!text.empty()) Emit(Token::Type::kText, text, pos);
      if (kind == '#') {
        pos = SkipComment(start, p);
      } else {
        pos = LexTag(kind == '{', start, p);
      }
    }
    Emit(Token::Type::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t pos) const {
    for (size_t i = pos; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return src_.size();
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block tag go.
  void LstripBlock(std::string& text, size_t text_start) const {
    size_t nl = text.rfind('\n');
    bool line_start = nl != std::string::npos || text_start == 0 || src_[text_start - 1] == '\n';
    if (!line_start) return;
    size_t from = nl == std::string::npos ? 0 : nl + 1;
    for (size_t i = from; i < text.size(); ++i) {
      if (text[i] != ' ' && text[i] != '\t') return;
    }
    text.erase(from);
  }

  // After a block or comment tag: `-` strips all whitespace, `+` nothing, else one newline.
  size_t AfterTag(size_t pos, char marker, bool is_variable) const {
    if (marker == '-') {
      while (pos < src_.size() && IsSpace(src_[pos])) ++pos;
    } else if (!is_variable && marker != '+' && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t SkipComment(size_t start, size_t p) {
    size_t end = src_.find("#}", p);
    if (end == std::string::npos) Fail(start, "unterminated comment '{#'");
    char marker = end > p && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    return AfterTag(end + 2, marker, false);
  }

  size_t LexTag(bool is_variable, size_t start, size_t p) {
    Emit(is_variable ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", start);
    depth_ = 0;
    std::string_view closer = is_variable ? "}}" : "%}";
    while (true) {
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      if (p >= src_.size()) Fail(start, is_variable ? "unterminated '{{'" : "unterminated '{%'");
      std::string_view rest(src_.data() + p, src_.size() - p);
      char marker = '\0';
      if (rest.substr(0, 1 + closer.size()) == std::string("-") + std::string(closer)) marker = '-';
      if (!is_variable && rest.substr(0, 3) == "+%}") marker = '+';
      // Like Jinja2, a closer inside open brackets ("{'a': {}}}") belongs to the expression.
      if (depth_ == 0 && (marker || rest.substr(0, closer.size()) == closer)) {
        size_t end = p + (marker ? 1 : 0) + closer.size();
        Emit(is_variable ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", p);
        return AfterTag(end, marker, is_variable);
      }
      p = LexToken(p);
    }
  }

  size_t LexToken(size_t p) {
    char c = src_[p];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
        ++e;
      Emit(Token::Type::kName, src_.substr(p, e - p), p);
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return LexNumber(p);
    if (c == '\'' || c == '"') return LexString(p);
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                 "/",  "%",  "~",  "|",  ".",  ",",  ":", "(", ")",
                                 "[",  "]",  "{",  "}",  "<",  ">",  "="};
    for (const char* op : kOps) {
      if (src_.compare(p, std::char_traits<char>::length(op), op) == 0) {
        Emit(Token::Type::kOp, op, p);
        if (*op == '(' || *op == '[' || *op == '{') ++depth_;
        if ((*op == ')' || *op == ']' || *op == '}') && depth_ > 0) --depth_;
        return p + std::char_traits<char>::length(op);
      }
    }
    Fail(p, std::string("unexpected character '") + c + "'");
  }

  size_t LexNumber(size_t p) {
    size_t e = p;
    bool is_float = false;
    std::string digits;
    auto take_digits = [&] {
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) {
        if (src_[e] != '_') digits += src_[e];
        ++e;
      }
    };
    take_digits();
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      digits += src_[e++];
      take_digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        digits += 'e';
        digits += src_.substr(e + 1, q - e - 1);
        e = q;
        take_digits();
      }
    }
    Token token{is_float ? Token::Type::kFloat : Token::Type::kInt, digits};
    try {
      if (is_float) {
        token.float_value = std::stod(digits);
      } else {
        token.int_value = std::stoll(digits);
      }
    } catch (const std::exception&) {
      Fail(p, "number out of range: " + digits);
    }
    SetPosition(token, p);
    tokens_.push_back(token);
    return e;
  }

  static void AppendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Python string-literal escapes; an unknown escape keeps its backslash, as in Python.
  size_t LexString(size_t p) {
    char quote = src_[p];
    std::string out;
    size_t i = p + 1;
    while (true) {
      if (i >= src_.size()) Fail(p, "unterminated string literal");
      char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) Fail(p, "unterminated string literal");
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'a':
          out += '\a';
          break;
        case '0':
          out += '\0';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n > src_.size()) Fail(p, "truncated \\" + std::string(1, e) + " escape");
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            char h = src_[i + k];
            if (!std::isxdigit(static_cast<unsigned char>(h)))
              Fail(i, "bad \\" + std::string(1, e) + " escape");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                     ? h - '0'
                                                     : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF) Fail(i, "escape out of range");
          AppendUtf8(out, cp);
          i += n;
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
    Emit(Token::Type::kString, out, p);
    return i + 1;
  }

  void SetPosition(Token& token, size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());  // >= 1
    token.line = static_cast<int>(line);
    token.column = static_cast<int>(offset - line_starts_[line - 1]) + 1;
  }

  void Emit(Token::Type type, std::string text, size_t offset) {
    Token token{type, std::move(text)};
    SetPosition(token, offset);
    tokens_.push_back(std::move(token));
  }

  [[noreturn]] void Fail(size_t offset, const std::string& message) const {
    Token where{Token::Type::kEof, ""};
    SetPosition(where, offset);
    throw Error("chat template: line " + std::to_string(where.line) + ", column " +
                std::to_string(where.column) + ": " + message);
  }

  std::string src_;
  std::vector<size_t> line_starts_;  // offsets where each line begins
  std::vector<Token> tokens_;
  int depth_ = 0;  // open brackets in the current tag
};

}  // namespace

std::vector<Token> Lex(const std::string& source) {
  // Jinja2 normalises newlines to "\n" and drops one trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).Run();
}

}  // namespace llm::jinja
