#include "engine/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace llm::jinja {

const Value* Dict::Find(const std::string& key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
// 1 + the deepest of `depths`, checked against kMaxValueDepth.
template <typename Range, typename DepthOf>
static int ContainerDepth(const Range& items, DepthOf depth_of) {
  int deepest = 0;
  for (const auto& item : items) deepest = std::max(deepest, depth_of(item));
  if (deepest + 1 > kMaxValueDepth) {
    throw RuntimeError("value nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  return deepest + 1;
}

Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.depth_ = ContainerDepth(items, [](const Value& x) { return x.depth_; });
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeTuple(List items) {
  Value v = MakeList(std::move(items));
  v.is_tuple_ = true;
  return v;
}
Value Value::MakeDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.depth_ = ContainerDepth(dict.entries, [](const auto& e) { return e.second.depth_; });
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}
Value Value::Namespace(Dict dict) {
  Value v = MakeDict(std::move(dict));
  v.kind_ = Kind::kNamespace;
  v.depth_ = 1;  // a reference (kMaxValueDepth)
  return v;
}
Value Value::MakeFunction(Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<const Function>(std::move(fn));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (const auto& [key, item] : json.items()) dict.entries.emplace_back(key, FromJson(item));
      return MakeDict(std::move(dict));
    }
    default:
      throw RuntimeError("unsupported JSON value (binary or discarded)");
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->entries.empty();
    default:
      return true;
  }
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  // Python's repr: shortest round-trip digits; scientific when exponent < -4 or >= 16.
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, end);  // d.ddde[+-]XX
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.' && c != '-') digits += c;
  }
  bool negative = f < 0 || (f == 0 && std::signbit(f));
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + ebuf;
  }
  if (exponent < 0) return out + "0." + std::string(-exponent - 1, '0') + digits;
  if (static_cast<int>(digits.size()) <= exponent + 1) {
    return out + digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
}

static std::string StringRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return FloatRepr(f_);
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  std::string out;
  std::vector<const Dict*> open;
  AppendRepr(out, 0, open);
  return out;
}

// `open`: the namespaces being printed around this value (lists and dicts cannot hold
// themselves: only a namespace can, by `set ns.x = ns`).
void Value::AppendRepr(std::string& out, int depth, std::vector<const Dict*>& open) const {
  if (depth > kMaxValueDepth) {
    throw RuntimeError("value nested deeper than " + std::to_string(kMaxValueDepth) +
                       " levels to print");
  }
  auto entries = [&](const Dict& d) {
    out += '{';
    for (size_t i = 0; i < d.entries.size(); ++i) {
      out += (i ? ", " : "") + StringRepr(d.entries[i].first) + ": ";
      d.entries[i].second.AppendRepr(out, depth + 1, open);
    }
    out += '}';
  };
  switch (kind_) {
    case Kind::kString:
      out += StringRepr(*s_);
      return;
    case Kind::kList: {
      out += is_tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        (*list_)[i].AppendRepr(out, depth + 1, open);
      }
      if (is_tuple_) {
        out += list_->size() == 1 ? ",)" : ")";
      } else {
        out += ']';
      }
      return;
    }
    case Kind::kDict:
      entries(*dict_);
      return;
    case Kind::kNamespace: {
      out += "<Namespace ";
      if (std::find(open.begin(), open.end(), dict_.get()) != open.end()) {
        out += "{...}";
      } else {
        open.push_back(dict_.get());
        entries(*dict_);
        open.pop_back();
      }
      out += '>';
      return;
    }
    case Kind::kFunction:
      out += "<function>";
      return;
    default:
      out += ToString();
  }
}

// json.dumps's string escaping; with ensure_ascii, non-ASCII as \uXXXX (UTF-16 units).
static void JsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  auto hex4 = [&out](unsigned u) {  // u is a UTF-16 unit: four hex digits
    static constexpr char kHex[] = "0123456789abcdef";
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(u >> shift) & 0xF];
  };
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
          hex4(c);
        } else if (ensure_ascii && c >= 0x80) {
          const size_t len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
          uint32_t cp = len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
          for (size_t k = 1; k < len && i + 1 < s.size(); ++k) cp = (cp << 6) | (s[++i] & 0x3F);
          if (cp >= 0x10000) {
            cp -= 0x10000;
            hex4(0xD800 + (cp >> 10));
            hex4(0xDC00 + (cp & 0x3FF));
          } else {
            hex4(cp);
          }
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

static void JsonDump(const Value& v, const JsonOptions& o, int depth, std::string& out) {
  if (depth > 256) throw RuntimeError("tojson: value nested too deeply");
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator
                               : o.indent >= 0           ? ","
                                                         : ", ";
  const std::string key_sep = !o.key_separator.empty() ? o.key_separator : ": ";
  auto newline = [&](int level) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent) * static_cast<size_t>(level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      double f = v.as_float();
      out += std::isnan(f)   ? "NaN"
             : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity")
                             : FloatRepr(f);
      return;
    }
    case Value::Kind::kString:
      JsonString(v.str(), o.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        JsonDump(v.list()[i], o, depth + 1, out);
      }
      newline(depth);
      out += "]";
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict().entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.dict().entries) entries.push_back(&entry);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        JsonString(entries[i]->first, o.ensure_ascii, out);
        out += key_sep;
        JsonDump(entries[i]->second, o, depth + 1, out);
      }
      newline(depth);
      out += "}";
      return;
    }
    default:
      throw RuntimeError("tojson: " + v.TypeName() + " is not JSON serializable");
  }
}

std::string Value::ToJson(const JsonOptions& options) const {
  std::string out;
  JsonDump(*this, options, 0, out);
  return out;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    default:
      return "function";
  }
}

// Splits UTF-8 into code points (Python iterates a str by characters).
static List Utf8Chars(const std::string& s) {
  List out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    len = std::min(len, s.size() - i);
    out.push_back(Value::String(s.substr(i, len)));
    i += len;
  }
  return out;
}

List Value::Iterate() const {
  switch (kind_) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return *list_;
    case Kind::kString:
      return Utf8Chars(*s_);
    case Kind::kDict: {
      List keys;
      for (const auto& entry : dict_->entries) keys.push_back(String(entry.first));
      return keys;
    }
    default:
      throw RuntimeError("'" + TypeName() + "' object is not iterable");
  }
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      return a.as_float() == b.as_float();
    }
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.list().size() != b.list().size() || a.is_tuple() != b.is_tuple()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equals(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().entries.size() != b.dict().entries.size()) return false;
      for (const auto& [key, value] : a.dict().entries) {
        const Value* other = b.dict().Find(key);
        if (!other || !Equals(value, *other)) return false;
      }
      return true;
    }
    default:
      return &a.dict() == &b.dict();
  }
}

int Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_float(), y = b.as_float();
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat) {
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string())
    return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < a.list().size() && i < b.list().size(); ++i) {
      int c = Compare(a.list()[i], b.list()[i]);
      if (c) return c;
    }
    return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size() ? 1 : 0;
  }
  throw RuntimeError("'<' not supported between " + a.TypeName() + " and " + b.TypeName());
}

Value CallArgs::Get(size_t index, const std::string& name, Value fallback) const {
  for (const auto& [key, value] : kwargs) {
    if (key == name) return value;
  }
  if (index < args.size()) return args[index];
  return fallback;
}

}  // namespace llm::jinja
