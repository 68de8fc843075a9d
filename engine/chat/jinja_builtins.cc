// Built-ins of the chat-template interpreter: Jinja2's filters and tests that chat templates
// use, Python's str and dict methods, and the globals transformers provides (raise_exception,
// strftime_now) besides Jinja2's (range, namespace, dict). Case mapping is ASCII only.
#include <cctype>
#include <ctime>
#include <functional>
#include <map>

#include "engine/chat/jinja_eval.h"

namespace llm::jinja {
namespace {

bool IsPySpace(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto drop = [&](unsigned char c) {
    return chars.is_string() ? chars.str().find(static_cast<char>(c)) != std::string::npos
                             : IsPySpace(c);
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && drop(static_cast<unsigned char>(s[b]))) ++b;
  }
  if (right) {
    while (e > b && drop(static_cast<unsigned char>(s[e - 1]))) --e;
  }
  return s.substr(b, e - b);
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string Capitalize(const std::string& s) {
  std::string out = Lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}
// Jinja2's title filter: each run after [-\s({[<] starts with a capital, the rest is lowercase.
std::string TitleFilter(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    bool sep = c == '-' || IsPySpace(u) || c == '(' || c == '{' || c == '[' || c == '<';
    out += static_cast<char>(word_start && !sep ? std::toupper(u) : sep ? c : std::tolower(u));
    word_start = sep;
  }
  return out;
}
// Python's str.title(): a letter after a non-letter is upper case.
std::string TitleMethod(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    out += static_cast<char>(prev_cased ? std::tolower(u) : std::toupper(u));
    prev_cased = std::isalpha(u);
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, const RenderLimits& limits) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (from.empty()) return s;  // Python inserts between characters; templates never ask
  while (count < 0 || done < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    CheckSize(out.size(), limits);
    pos = hit + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

List Split(const std::string& s, const Value& sep, int64_t max_split) {
  List out;
  if (!sep.is_string() || sep.is_none()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && IsPySpace(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(out.size()) == max_split) {
        out.push_back(Value::String(Strip(s.substr(i), Value(), false, true)));
        break;
      }
      size_t e = i;
      while (e < s.size() && !IsPySpace(static_cast<unsigned char>(s[e]))) ++e;
      out.push_back(Value::String(s.substr(i, e - i)));
      i = e;
    }
    return out;
  }
  if (sep.str().empty()) throw RuntimeError("empty separator");
  size_t pos = 0;
  while (max_split < 0 || static_cast<int64_t>(out.size()) < max_split) {
    size_t hit = s.find(sep.str(), pos);
    if (hit == std::string::npos) break;
    out.push_back(Value::String(s.substr(pos, hit - pos)));
    pos = hit + sep.str().size();
  }
  out.push_back(Value::String(s.substr(pos)));
  return out;
}

int64_t Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString: {
      int64_t n = 0;
      for (unsigned char c : v.str()) n += (c & 0xC0) != 0x80;  // code points, as Python's len
      return n;
    }
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return static_cast<int64_t>(v.dict().entries.size());
    default:
      throw RuntimeError("object of type '" + v.TypeName() + "' has no len()");
  }
}

// `a.b.c` attribute paths of selectattr/map/join.
Value Attribute(const Value& v, const std::string& path, const RenderLimits& limits) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    cur = cur.is_undefined() ? Value() : GetAttribute(cur, part, limits);
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

Value BoundStringMethod(const std::string& s, const std::string& name, const RenderLimits& limits) {
  using F = std::function<Value(const std::string&, CallArgs&)>;
  static const std::map<std::string, F> kMethods = {
      {"strip", [](const std::string& s,
                   CallArgs& a) { return Value::String(Strip(s, a.Get(0, "chars"), true, true)); }},
      {"lstrip",
       [](const std::string& s, CallArgs& a) {
         return Value::String(Strip(s, a.Get(0, "chars"), true, false));
       }},
      {"rstrip",
       [](const std::string& s, CallArgs& a) {
         return Value::String(Strip(s, a.Get(0, "chars"), false, true));
       }},
      {"upper", [](const std::string& s, CallArgs&) { return Value::String(Upper(s)); }},
      {"lower", [](const std::string& s, CallArgs&) { return Value::String(Lower(s)); }},
      {"title", [](const std::string& s, CallArgs&) { return Value::String(TitleMethod(s)); }},
      {"capitalize", [](const std::string& s, CallArgs&) { return Value::String(Capitalize(s)); }},
      {"startswith",
       [](const std::string& s, CallArgs& a) {
         Value p = a.Get(0, "prefix");
         List options = p.is_list() ? p.list() : List{p};
         for (const auto& o : options) {
           if (o.is_string() && s.compare(0, o.str().size(), o.str()) == 0)
             return Value::Bool(true);
         }
         return Value::Bool(false);
       }},
      {"endswith",
       [](const std::string& s, CallArgs& a) {
         Value p = a.Get(0, "suffix");
         List options = p.is_list() ? p.list() : List{p};
         for (const auto& o : options) {
           if (o.is_string() && o.str().size() <= s.size() &&
               s.compare(s.size() - o.str().size(), o.str().size(), o.str()) == 0) {
             return Value::Bool(true);
           }
         }
         return Value::Bool(false);
       }},
      {"split",
       [](const std::string& s, CallArgs& a) {
         return Value::MakeList(
             Split(s, a.Get(0, "sep"), a.Get(1, "maxsplit", Value::Int(-1)).as_int()));
       }},
      {"find",
       [](const std::string& s, CallArgs& a) {
         size_t hit = s.find(a.Get(0, "sub").ToString());
         return Value::Int(hit == std::string::npos ? -1 : static_cast<int64_t>(hit));
       }},
      {"count",
       [](const std::string& s, CallArgs& a) {
         std::string sub = a.Get(0, "sub").ToString();
         int64_t n = 0;
         for (size_t pos = 0; !sub.empty() && (pos = s.find(sub, pos)) != std::string::npos;
              pos += sub.size())
           ++n;
         return Value::Int(n);
       }},
      {"join",
       [](const std::string& s, CallArgs& a) {
         std::string out;
         List items = a.Get(0, "iterable").Iterate();
         for (size_t k = 0; k < items.size(); ++k) out += (k ? s : "") + items[k].ToString();
         return Value::String(out);
       }},
  };
  if (name == "replace") {
    return Value::MakeFunction([s, &limits](CallArgs& a) {
      return Value::String(Replace(s, a.Get(0, "old").ToString(), a.Get(1, "new").ToString(),
                                   a.Get(2, "count", Value::Int(-1)).as_int(), limits));
    });
  }
  auto it = kMethods.find(name);
  if (it == kMethods.end()) return Value();
  const F& fn = it->second;
  return Value::MakeFunction([s, &fn](CallArgs& a) { return fn(s, a); });
}

Value BoundDictMethod(const Value& d, const std::string& name) {
  if (name == "get") {
    return Value::MakeFunction([d](CallArgs& a) {
      Value key = a.Get(0, "key");
      const Value* v = key.is_string() ? d.dict().Find(key.str()) : nullptr;
      return v ? *v : a.Get(1, "default", Value::None());
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return Value::MakeFunction([d, name](CallArgs&) {
      List out;
      for (const auto& [k, v] : d.dict().entries) {
        if (name == "items") out.push_back(Value::MakeList({Value::String(k), v}));
        if (name == "keys") out.push_back(Value::String(k));
        if (name == "values") out.push_back(v);
      }
      return Value::MakeList(std::move(out));
    });
  }
  return Value();
}

using Filter = std::function<Value(const Value&, const CallArgs&, const RenderLimits&)>;

Value SelectOrReject(const Value& in, const CallArgs& a, const RenderLimits& limits, bool by_attr,
                     bool keep) {
  List out;
  size_t first = by_attr ? 1 : 0;
  std::string test = a.args.size() > first ? a.args[first].ToString() : "";
  std::vector<Value> test_args(
      a.args.size() > first + 1 ? a.args.begin() + static_cast<long>(first) + 1 : a.args.end(),
      a.args.end());
  for (const auto& item : in.Iterate()) {
    Value v = by_attr ? Attribute(item, a.Get(0, "attribute").ToString(), limits) : item;
    bool pass = test.empty() ? v.Truthy() : ApplyTest(test, v, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

const std::map<std::string, Filter>& Filters() {
  static const std::map<std::string, Filter> kFilters = {
      {"trim",
       [](const Value& v, const CallArgs& a, const RenderLimits&) {
         return Value::String(Strip(v.ToString(), a.Get(0, "chars"), true, true));
       }},
      {"length",
       [](const Value& v, const CallArgs&, const RenderLimits&) { return Value::Int(Length(v)); }},
      {"count",
       [](const Value& v, const CallArgs&, const RenderLimits&) { return Value::Int(Length(v)); }},
      {"tojson",
       [](const Value& v, const CallArgs& a, const RenderLimits&) {
         Value indent = a.Get(0, "indent", Value::None());
         return Value::String(v.ToJson(indent.is_none() ? -1 : static_cast<int>(indent.as_int()),
                                       a.Get(3, "sort_keys", Value::Bool(false)).Truthy()));
       }},
      {"upper", [](const Value& v, const CallArgs&,
                   const RenderLimits&) { return Value::String(Upper(v.ToString())); }},
      {"lower", [](const Value& v, const CallArgs&,
                   const RenderLimits&) { return Value::String(Lower(v.ToString())); }},
      {"title", [](const Value& v, const CallArgs&,
                   const RenderLimits&) { return Value::String(TitleFilter(v.ToString())); }},
      {"capitalize", [](const Value& v, const CallArgs&,
                        const RenderLimits&) { return Value::String(Capitalize(v.ToString())); }},
      {"replace",
       [](const Value& v, const CallArgs& a, const RenderLimits& limits) {
         return Value::String(Replace(v.ToString(), a.Get(0, "old").ToString(),
                                      a.Get(1, "new").ToString(),
                                      a.Get(2, "count", Value::Int(-1)).as_int(), limits));
       }},
      {"join",
       [](const Value& v, const CallArgs& a, const RenderLimits& limits) {
         std::string sep = a.Get(0, "d", Value::String("")).ToString();
         Value attr = a.Get(1, "attribute");
         std::string out;
         List items = v.Iterate();
         for (size_t k = 0; k < items.size(); ++k) {
           out += (k ? sep : "") +
                  (attr.is_undefined() ? items[k] : Attribute(items[k], attr.ToString(), limits))
                      .ToString();
           CheckSize(out.size(), limits);
         }
         return Value::String(out);
       }},
      {"first",
       [](const Value& v, const CallArgs&, const RenderLimits&) {
         List items = v.Iterate();
         return items.empty() ? Value() : items.front();
       }},
      {"last",
       [](const Value& v, const CallArgs&, const RenderLimits&) {
         List items = v.Iterate();
         return items.empty() ? Value() : items.back();
       }},
      {"default",
       [](const Value& v, const CallArgs& a, const RenderLimits&) {
         bool boolean = a.Get(1, "boolean", Value::Bool(false)).Truthy();
         if (v.is_undefined() || (boolean && !v.Truthy()))
           return a.Get(0, "default_value", Value::String(""));
         return v;
       }},
      {"string", [](const Value& v, const CallArgs&,
                    const RenderLimits&) { return Value::String(v.ToString()); }},
      {"list", [](const Value& v, const CallArgs&,
                  const RenderLimits&) { return Value::MakeList(v.Iterate()); }},
      {"items",
       [](const Value& v, const CallArgs&, const RenderLimits&) {
         if (v.is_undefined()) return Value::MakeList({});
         if (!v.is_mapping())
           throw RuntimeError("items filter needs a mapping, got " + v.TypeName());
         List out;
         for (const auto& [k, item] : v.dict().entries)
           out.push_back(Value::MakeList({Value::String(k), item}));
         return Value::MakeList(std::move(out));
       }},
      {"int",
       [](const Value& v, const CallArgs& a, const RenderLimits&) {
         Value fallback = a.Get(0, "default", Value::Int(0));
         if (v.is_number()) return Value::Int(v.as_int());
         if (v.is_string()) {
           try {
             size_t used = 0;
             std::string s = Strip(v.str(), Value(), true, true);
             double d = std::stod(s, &used);
             if (used == s.size()) return Value::Int(static_cast<int64_t>(d));
           } catch (const std::exception&) {
           }
         }
         return fallback;
       }},
      {"float",
       [](const Value& v, const CallArgs& a, const RenderLimits&) {
         if (v.is_number()) return Value::Float(v.as_float());
         try {
           if (v.is_string()) return Value::Float(std::stod(v.str()));
         } catch (const std::exception&) {
         }
         return a.Get(0, "default", Value::Float(0));
       }},
      {"abs",
       [](const Value& v, const CallArgs&, const RenderLimits&) {
         if (v.kind() == Value::Kind::kFloat) return Value::Float(std::abs(v.as_float()));
         if (!v.is_number()) throw RuntimeError("bad operand type for abs(): " + v.TypeName());
         return Value::Int(std::llabs(v.as_int()));
       }},
      {"reverse",
       [](const Value& v, const CallArgs&, const RenderLimits&) {
         List items = v.Iterate();
         std::reverse(items.begin(), items.end());
         if (!v.is_string()) return Value::MakeList(std::move(items));
         std::string s;
         for (const auto& c : items) s += c.str();
         return Value::String(s);
       }},
      {"safe", [](const Value& v, const CallArgs&, const RenderLimits&) { return v; }},
      {"selectattr", [](const Value& v, const CallArgs& a,
                        const RenderLimits& l) { return SelectOrReject(v, a, l, true, true); }},
      {"rejectattr", [](const Value& v, const CallArgs& a,
                        const RenderLimits& l) { return SelectOrReject(v, a, l, true, false); }},
      {"select", [](const Value& v, const CallArgs& a,
                    const RenderLimits& l) { return SelectOrReject(v, a, l, false, true); }},
      {"reject", [](const Value& v, const CallArgs& a,
                    const RenderLimits& l) { return SelectOrReject(v, a, l, false, false); }},
      {"map",
       [](const Value& v, const CallArgs& a, const RenderLimits& limits) {
         List out;
         Value attr = a.Get(99, "attribute");
         for (const auto& item : v.Iterate()) {
           if (!attr.is_undefined()) {
             Value got = Attribute(item, attr.ToString(), limits);
             out.push_back(got.is_undefined() ? a.Get(99, "default") : got);
           } else {
             if (a.args.empty()) throw RuntimeError("map needs a filter name or attribute=");
             CallArgs rest{std::vector<Value>(a.args.begin() + 1, a.args.end()), {}};
             out.push_back(ApplyFilter(a.args[0].ToString(), item, rest, limits));
           }
         }
         return Value::MakeList(std::move(out));
       }},
      {"indent",
       [](const Value& v, const CallArgs& a, const RenderLimits&) {
         Value width = a.Get(0, "width", Value::Int(4));
         std::string pad =
             width.is_string()
                 ? width.str()
                 : std::string(static_cast<size_t>(std::max<int64_t>(width.as_int(), 0)), ' ');
         bool first = a.Get(1, "first", Value::Bool(false)).Truthy();
         bool blank = a.Get(2, "blank", Value::Bool(false)).Truthy();
         std::string s = v.ToString(), out;
         size_t pos = 0;
         bool is_first = true;
         while (true) {
           size_t nl = s.find('\n', pos);
           std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
           if ((!is_first || first) && (blank || !line.empty())) out += pad;
           out += line;
           if (nl == std::string::npos) break;
           out += '\n';
           pos = nl + 1;
           is_first = false;
         }
         return Value::String(out);
       }},
  };
  return kFilters;
}

using Test = std::function<bool(const Value&, const std::vector<Value>&)>;
const Value& Arg(const std::vector<Value>& args) {
  if (args.empty()) throw RuntimeError("test needs an argument");
  return args[0];
}

const std::map<std::string, Test>& Tests() {
  using K = Value::Kind;
  static const std::map<std::string, Test> kTests = {
      {"defined", [](const Value& v, const std::vector<Value>&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const std::vector<Value>&) { return v.is_undefined(); }},
      {"none", [](const Value& v, const std::vector<Value>&) { return v.is_none(); }},
      {"string", [](const Value& v, const std::vector<Value>&) { return v.is_string(); }},
      {"number", [](const Value& v, const std::vector<Value>&) { return v.is_number(); }},
      {"integer", [](const Value& v, const std::vector<Value>&) { return v.kind() == K::kInt; }},
      {"float", [](const Value& v, const std::vector<Value>&) { return v.kind() == K::kFloat; }},
      {"boolean", [](const Value& v, const std::vector<Value>&) { return v.kind() == K::kBool; }},
      {"true", [](const Value& v, const std::vector<Value>&) { return v.kind() == K::kBool && v.as_bool(); }},
      {"false", [](const Value& v, const std::vector<Value>&) { return v.kind() == K::kBool && !v.as_bool(); }},
      {"mapping", [](const Value& v, const std::vector<Value>&) { return v.kind() == K::kDict; }},
      {"iterable", [](const Value& v, const std::vector<Value>&) {
         return v.is_undefined() || v.is_string() || v.is_list() || v.kind() == K::kDict;
       }},
      {"sequence", [](const Value& v, const std::vector<Value>&) {
         return v.is_string() || v.is_list() || v.kind() == K::kDict;
       }},
      {"callable", [](const Value& v, const std::vector<Value>&) { return v.kind() == K::kFunction; }},
      {"odd", [](const Value& v, const std::vector<Value>&) { return v.as_int() % 2 != 0; }},
      {"even", [](const Value& v, const std::vector<Value>&) { return v.as_int() % 2 == 0; }},
      {"divisibleby", [](const Value& v, const std::vector<Value>& a) {
         if (Arg(a).as_int() == 0) throw RuntimeError("divisibleby 0");
         return v.as_int() % Arg(a).as_int() == 0;
       }},
      {"equalto", [](const Value& v, const std::vector<Value>& a) { return Equals(v, Arg(a)); }},
      {"ne", [](const Value& v, const std::vector<Value>& a) { return !Equals(v, Arg(a)); }},
      {"lt", [](const Value& v, const std::vector<Value>& a) { return Compare(v, Arg(a)) < 0; }},
      {"le", [](const Value& v, const std::vector<Value>& a) { return Compare(v, Arg(a)) <= 0; }},
      {"gt", [](const Value& v, const std::vector<Value>& a) { return Compare(v, Arg(a)) > 0; }},
      {"ge", [](const Value& v, const std::vector<Value>& a) { return Compare(v, Arg(a)) >= 0; }},
      {"in", [](const Value& v, const std::vector<Value>& a) {
         const Value& c = Arg(a);
         if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
         if (c.is_mapping()) return v.is_string() && c.dict().Find(v.str()) != nullptr;
         for (const auto& item : c.Iterate()) {
           if (Equals(item, v)) return true;
         }
         return false;
       }},
      {"sameas", [](const Value& v, const std::vector<Value>& a) {
         const Value& o = Arg(a);
         if (v.kind() != o.kind()) return false;
         if (v.kind() == K::kNone || v.kind() == K::kUndefined) return true;
         if (v.kind() == K::kBool) return v.as_bool() == o.as_bool();
         return false;
       }},
      {"lower", [](const Value& v, const std::vector<Value>&) { return v.is_string() && Lower(v.str()) == v.str(); }},
      {"upper", [](const Value& v, const std::vector<Value>&) { return v.is_string() && Upper(v.str()) == v.str(); }},
  };
  return kTests;
}

const std::map<std::string, std::string>& Aliases() {
  static const std::map<std::string, std::string> kAliases = {
      {"d", "default"}, {"e", "safe"},         {"eq", "equalto"}, {"==", "equalto"},
      {"!=", "ne"},     {"<", "lt"},           {"<=", "le"},      {">", "gt"},
      {">=", "ge"},     {"greaterthan", "gt"}, {"lessthan", "lt"}};
  return kAliases;
}
std::string Canonical(const std::string& name) {
  auto it = Aliases().find(name);
  return it == Aliases().end() ? name : it->second;
}

}  // namespace

void CheckSize(size_t num_bytes, const RenderLimits& limits) {
  if (num_bytes > limits.max_output_bytes) {
    throw RuntimeError("value exceeds " + std::to_string(limits.max_output_bytes) + " bytes");
  }
}

bool HasFilter(const std::string& name) { return Filters().count(Canonical(name)) > 0; }
bool HasTest(const std::string& name) { return Tests().count(Canonical(name)) > 0; }

Value ApplyFilter(const std::string& name, const Value& input, const CallArgs& args,
                  const RenderLimits& limits) {
  auto it = Filters().find(Canonical(name));
  if (it == Filters().end()) throw RuntimeError("unsupported filter '" + name + "'");
  return it->second(input, args, limits);
}

bool ApplyTest(const std::string& name, const Value& value, const std::vector<Value>& args) {
  auto it = Tests().find(Canonical(name));
  if (it == Tests().end()) throw RuntimeError("unsupported test '" + name + "'");
  return it->second(value, args);
}

Value GetAttribute(const Value& obj, const std::string& name, const RenderLimits& limits) {
  if (obj.is_string()) return BoundStringMethod(obj.str(), name, limits);
  if (obj.kind() == Value::Kind::kDict) {
    Value method = BoundDictMethod(obj, name);
    if (!method.is_undefined()) return method;
  }
  if (obj.is_mapping()) {
    const Value* v = obj.dict().Find(name);
    return v ? *v : Value();
  }
  return Value();
}

Value GetItem(const Value& obj, const Value& key, const RenderLimits& limits) {
  if (obj.is_mapping()) {
    const Value* v = key.is_string() ? obj.dict().Find(key.str()) : nullptr;
    if (v) return *v;
    return key.is_string() ? GetAttribute(obj, key.str(), limits) : Value();
  }
  if ((obj.is_list() || obj.is_string()) && key.is_number() && key.kind() != Value::Kind::kFloat) {
    List items = obj.is_list() ? List() : obj.Iterate();
    const List& seq = obj.is_list() ? obj.list() : items;
    int64_t i = key.as_int();
    int64_t n = static_cast<int64_t>(seq.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return seq[static_cast<size_t>(i)];
  }
  if (key.is_string()) return GetAttribute(obj, key.str(), limits);
  return Value();
}

void AddGlobals(Dict& globals, const RenderLimits& limits, std::vector<Value>* namespaces) {
  globals.Set(
      "range", Value::MakeFunction([&limits](CallArgs& a) {
        if (a.args.empty() || a.args.size() > 3)
          throw RuntimeError("range expects 1 to 3 arguments");
        int64_t start = 0, stop = 0, step = 1;
        if (a.args.size() == 1) {
          stop = a.args[0].as_int();
        } else {
          start = a.args[0].as_int();
          stop = a.args[1].as_int();
          if (a.args.size() == 3) step = a.args[2].as_int();
        }
        if (step == 0) throw RuntimeError("range() arg 3 must not be zero");
        List out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (static_cast<int64_t>(out.size()) >= limits.max_range_length) {
            throw RuntimeError("range() longer than " + std::to_string(limits.max_range_length));
          }
          out.push_back(Value::Int(i));
        }
        return Value::MakeList(std::move(out));
      }));
  auto make_dict = [namespaces](CallArgs& a, bool is_namespace) {
    Dict d;
    for (const auto& arg : a.args) {
      if (!arg.is_mapping()) throw RuntimeError("expected a mapping argument");
      for (const auto& [k, v] : arg.dict().entries) d.Set(k, v);
    }
    for (const auto& [k, v] : a.kwargs) d.Set(k, v);
    if (!is_namespace) return Value::MakeDict(std::move(d));
    Value ns = Value::Namespace(std::move(d));
    namespaces->push_back(ns);
    return ns;
  };
  globals.Set("namespace",
              Value::MakeFunction([make_dict](CallArgs& a) { return make_dict(a, true); }));
  globals.Set("dict",
              Value::MakeFunction([make_dict](CallArgs& a) { return make_dict(a, false); }));
  globals.Set("raise_exception", Value::MakeFunction([](CallArgs& a) -> Value {
                throw RuntimeError("raise_exception: " + a.Get(0, "message").ToString());
              }));
  globals.Set("strftime_now", Value::MakeFunction([](CallArgs& a) {
                std::time_t now = std::time(nullptr);
                std::tm local{};
                localtime_r(&now, &local);
                char buf[256];
                size_t n =
                    std::strftime(buf, sizeof(buf), a.Get(0, "format").ToString().c_str(), &local);
                return Value::String(std::string(buf, n));
              }));
}

}  // namespace llm::jinja
