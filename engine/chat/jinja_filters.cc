// The filters of the chat-template interpreter: Jinja2's built-in filters that chat templates
// use, with Jinja2's arguments, and transformers' tojson (json.dumps with ensure_ascii,
// indent, separators and sort_keys).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "engine/chat/jinja_eval.h"
#include "engine/chat/jinja_strings.h"

namespace llm::jinja {
namespace {

using Filter = std::function<Value(const Value&, const CallArgs&, const RenderLimits&)>;

int64_t Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return CodePointLength(v.str());
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return static_cast<int64_t>(v.dict().entries.size());
    default:
      throw RuntimeError("object of type '" + v.TypeName() + "' has no len()");
  }
}

// `a.b.0` attribute paths of selectattr, map, join, sort, ... (an integer part indexes a list).
Value Attribute(const Value& v, const std::string& path, const RenderLimits& limits) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part =
        path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool is_index =
        !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    if (cur.is_undefined()) return cur;
    cur = is_index && cur.is_list() ? GetItem(cur, Value::Int(std::stoll(part)), limits)
                                    : GetAttribute(cur, part, limits);
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

Value SelectOrReject(const Value& in, const CallArgs& a, const RenderLimits& limits, bool by_attr,
                     bool keep) {
  List out;
  const size_t first = by_attr ? 1 : 0;
  const std::string test = a.args.size() > first ? a.args[first].ToString() : "";
  const std::vector<Value> test_args(
      a.args.size() > first + 1 ? a.args.begin() + static_cast<long>(first) + 1 : a.args.end(),
      a.args.end());
  for (const auto& item : in.Iterate()) {
    const Value v = by_attr ? Attribute(item, a.Get(0, "attribute").ToString(), limits) : item;
    const bool pass = test.empty() ? v.Truthy() : ApplyTest(test, v, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

// The key Jinja2's sort, unique, min, max and dictsort compare: the attribute, lower-cased
// when a string and not case_sensitive.
Value SortKey(const Value& item, const Value& attribute, bool case_sensitive,
              const RenderLimits& limits) {
  Value key = attribute.is_undefined() || attribute.is_none()
                  ? item
                  : Attribute(item, attribute.ToString(), limits);
  if (!case_sensitive && key.is_string()) key = Value::String(Lower(key.str()));
  return key;
}

Value Sort(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  const bool reverse = a.Get(0, "reverse", Value::Bool(false)).Truthy();
  const bool case_sensitive = a.Get(1, "case_sensitive", Value::Bool(false)).Truthy();
  const Value attribute = a.Get(2, "attribute");
  List items = v.Iterate();
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t k = 0; k < items.size(); ++k) {
    keyed.emplace_back(SortKey(items[k], attribute, case_sensitive, limits), k);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? Compare(y.first, x.first) < 0 : Compare(x.first, y.first) < 0;
  });
  List out;
  for (const auto& [key, k] : keyed) out.push_back(items[k]);
  return Value::MakeList(std::move(out));
}

Value Unique(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  const bool case_sensitive = a.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  const Value attribute = a.Get(1, "attribute");
  List out, seen;
  for (const Value& item : v.Iterate()) {
    const Value key = SortKey(item, attribute, case_sensitive, limits);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeList(std::move(out));
}

Value MinOrMax(const Value& v, const CallArgs& a, const RenderLimits& limits, bool is_max) {
  const bool case_sensitive = a.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  const Value attribute = a.Get(1, "attribute");
  Value best, best_key;
  for (const Value& item : v.Iterate()) {
    const Value key = SortKey(item, attribute, case_sensitive, limits);
    if (best.is_undefined() || (is_max ? Compare(key, best_key) > 0 : Compare(key, best_key) < 0)) {
      best = item;
      best_key = key;
    }
  }
  return best;
}

Value DictSort(const Value& v, const CallArgs& a, const RenderLimits&) {
  if (!v.is_mapping()) throw RuntimeError("dictsort needs a mapping, got " + v.TypeName());
  const bool case_sensitive = a.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  const std::string by = a.Get(1, "by", Value::String("key")).ToString();
  const bool reverse = a.Get(2, "reverse", Value::Bool(false)).Truthy();
  if (by != "key" && by != "value")
    throw RuntimeError("You can only sort by either 'key' or 'value'");
  List pairs;
  for (const auto& [k, item] : v.dict().entries)
    pairs.push_back(Value::MakeTuple({Value::String(k), item}));
  auto key = [&](const Value& pair) {
    Value x = pair.list()[by == "key" ? 0 : 1];
    return !case_sensitive && x.is_string() ? Value::String(Lower(x.str())) : x;
  };
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    return reverse ? Compare(key(y), key(x)) < 0 : Compare(key(x), key(y)) < 0;
  });
  return Value::MakeList(std::move(pairs));
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value ToJson(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  JsonOptions o;
  o.ensure_ascii = a.Get(0, "ensure_ascii", Value::Bool(false)).Truthy();
  const Value indent = a.Get(1, "indent", Value::None());
  if (!indent.is_none() && !indent.is_undefined()) {
    if (indent.kind() != Value::Kind::kInt) throw RuntimeError("tojson: indent must be an integer");
    o.indent = static_cast<int>(std::clamp<int64_t>(indent.as_int(), -1, 64));
  }
  const Value separators = a.Get(2, "separators", Value::None());
  if (separators.is_list()) {
    if (separators.list().size() != 2 || !separators.list()[0].is_string() ||
        !separators.list()[1].is_string()) {
      throw RuntimeError("tojson: separators must be a pair of strings");
    }
    o.item_separator = separators.list()[0].str();
    o.key_separator = separators.list()[1].str();
  }
  o.sort_keys = a.Get(3, "sort_keys", Value::Bool(false)).Truthy();
  std::string out = v.ToJson(o);
  CheckSize(out.size(), limits);
  return Value::String(std::move(out));
}

// Jinja2's escape (markupsafe): & < > ' " as HTML entities.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value Indent(const Value& v, const CallArgs& a) {
  const Value width = a.Get(0, "width", Value::Int(4));
  const std::string pad =
      width.is_string()
          ? width.str()
          : std::string(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 1024)), ' ');
  const bool first = a.Get(1, "first", Value::Bool(false)).Truthy();
  const bool blank = a.Get(2, "blank", Value::Bool(false)).Truthy();
  const std::string s = v.ToString();
  std::string out;
  size_t pos = 0;
  bool is_first = true;
  while (true) {
    const size_t nl = s.find('\n', pos);
    const std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if ((!is_first || first) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    pos = nl + 1;
    is_first = false;
  }
  return Value::String(out);
}

Value Map(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  List out;
  const Value attr = a.Get(99, "attribute");
  for (const auto& item : v.Iterate()) {
    if (!attr.is_undefined()) {
      const Value got = Attribute(item, attr.ToString(), limits);
      out.push_back(got.is_undefined() ? a.Get(99, "default") : got);
    } else {
      if (a.args.empty()) throw RuntimeError("map needs a filter name or attribute=");
      const CallArgs rest{std::vector<Value>(a.args.begin() + 1, a.args.end()), a.kwargs};
      out.push_back(ApplyFilter(a.args[0].ToString(), item, rest, limits));
    }
  }
  return Value::MakeList(std::move(out));
}

Value Join(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  const std::string sep = a.Get(0, "d", Value::String("")).ToString();
  const Value attr = a.Get(1, "attribute");
  std::string out;
  const List items = v.Iterate();
  for (size_t k = 0; k < items.size(); ++k) {
    out +=
        (k ? sep : "") +
        (attr.is_undefined() ? items[k] : Attribute(items[k], attr.ToString(), limits)).ToString();
    CheckSize(out.size(), limits);
  }
  return Value::String(out);
}

Value ToInt(const Value& v, const CallArgs& a) {
  const Value fallback = a.Get(0, "default", Value::Int(0));
  if (v.kind() == Value::Kind::kFloat) {
    if (!std::isfinite(v.as_float())) return fallback;
    return Value::Int(static_cast<int64_t>(std::clamp(v.as_float(), -9.2e18, 9.2e18)));
  }
  if (v.is_number()) return Value::Int(v.as_int());
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string s = Strip(v.str(), Value(), true, true);
      const double d = std::stod(s, &used);
      if (used == s.size() && std::isfinite(d)) {
        return Value::Int(static_cast<int64_t>(std::clamp(d, -9.2e18, 9.2e18)));
      }
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value ToFloat(const Value& v, const CallArgs& a) {
  if (v.is_number()) return Value::Float(v.as_float());
  try {
    if (v.is_string()) return Value::Float(std::stod(v.str()));
  } catch (const std::exception&) {
  }
  return a.Get(0, "default", Value::Float(0));
}

Value Items(const Value& v) {
  if (v.is_undefined()) return Value::MakeList({});
  if (!v.is_mapping()) throw RuntimeError("items filter needs a mapping, got " + v.TypeName());
  List out;
  for (const auto& [k, item] : v.dict().entries)
    out.push_back(Value::MakeTuple({Value::String(k), item}));
  return Value::MakeList(std::move(out));
}

Value Reverse(const Value& v) {
  List items = v.Iterate();
  std::reverse(items.begin(), items.end());
  if (!v.is_string()) return Value::MakeList(std::move(items));
  std::string s;
  for (const auto& c : items) s += c.str();
  return Value::String(s);
}

Value Sum(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  const Value attribute = a.Get(0, "attribute");
  Value total = a.Get(1, "start", Value::Int(0));
  for (const Value& item : v.Iterate()) {
    const Value x = attribute.is_undefined() ? item : Attribute(item, attribute.ToString(), limits);
    if (!x.is_number() || !total.is_number()) throw RuntimeError("sum: unsupported operand types");
    total = total.kind() == Value::Kind::kFloat || x.kind() == Value::Kind::kFloat
                ? Value::Float(total.as_float() + x.as_float())
                : Value::Int(total.as_int() + x.as_int());
  }
  return total;
}

Value Round(const Value& v, const CallArgs& a) {
  const int64_t precision =
      std::clamp<int64_t>(a.Get(0, "precision", Value::Int(0)).as_int(), 0, 15);
  const std::string method = a.Get(1, "method", Value::String("common")).ToString();
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_float() * scale;
  // "common" is Python's round(): halves to even.
  const double r = method == "ceil"    ? std::ceil(x)
                   : method == "floor" ? std::floor(x)
                                       : std::nearbyint(x);
  if (v.kind() != Value::Kind::kFloat && method == "common")
    return v.is_number() ? Value::Int(v.as_int()) : v;
  return Value::Float(r / scale);
}

using Simple = Value (*)(const Value&);
Filter Of(Simple f) {
  return [f](const Value& v, const CallArgs&, const RenderLimits&) { return f(v); };
}
Filter String(std::string (*f)(const std::string&)) {
  return [f](const Value& v, const CallArgs&, const RenderLimits&) {
    return Value::String(f(v.ToString()));
  };
}

const std::map<std::string, Filter>& Filters() {
  static const std::map<std::string, Filter> kFilters = {
      {"trim",
       [](const Value& v, const CallArgs& a, const RenderLimits&) {
         return Value::String(Strip(v.ToString(), a.Get(0, "chars"), true, true));
       }},
      {"length", Of([](const Value& v) { return Value::Int(Length(v)); })},
      {"count", Of([](const Value& v) { return Value::Int(Length(v)); })},
      {"tojson", ToJson},
      {"upper", String(Upper)},
      {"lower", String(Lower)},
      {"title", String(TitleFilter)},
      {"capitalize", String(Capitalize)},
      {"escape", String(Escape)},
      {"replace",
       [](const Value& v, const CallArgs& a, const RenderLimits& limits) {
         return Value::String(Replace(v.ToString(), a.Get(0, "old").ToString(),
                                      a.Get(1, "new").ToString(),
                                      a.Get(2, "count", Value::Int(-1)).as_int(), limits));
       }},
      {"join", Join},
      {"first", Of([](const Value& v) {
         const List items = v.Iterate();
         return items.empty() ? Value() : items.front();
       })},
      {"last", Of([](const Value& v) {
         const List items = v.Iterate();
         return items.empty() ? Value() : items.back();
       })},
      {"default",
       [](const Value& v, const CallArgs& a, const RenderLimits&) {
         const bool boolean = a.Get(1, "boolean", Value::Bool(false)).Truthy();
         if (v.is_undefined() || (boolean && !v.Truthy()))
           return a.Get(0, "default_value", Value::String(""));
         return v;
       }},
      {"string", Of([](const Value& v) { return Value::String(v.ToString()); })},
      {"list", Of([](const Value& v) { return Value::MakeList(v.Iterate()); })},
      {"items", Of(Items)},
      {"int", [](const Value& v, const CallArgs& a, const RenderLimits&) { return ToInt(v, a); }},
      {"float",
       [](const Value& v, const CallArgs& a, const RenderLimits&) { return ToFloat(v, a); }},
      {"abs", Of([](const Value& v) {
         if (v.kind() == Value::Kind::kFloat) return Value::Float(std::abs(v.as_float()));
         if (!v.is_number()) throw RuntimeError("bad operand type for abs(): " + v.TypeName());
         return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
       })},
      {"reverse", Of(Reverse)},
      {"safe", Of([](const Value& v) { return v; })},
      {"selectattr", [](const Value& v, const CallArgs& a,
                        const RenderLimits& l) { return SelectOrReject(v, a, l, true, true); }},
      {"rejectattr", [](const Value& v, const CallArgs& a,
                        const RenderLimits& l) { return SelectOrReject(v, a, l, true, false); }},
      {"select", [](const Value& v, const CallArgs& a,
                    const RenderLimits& l) { return SelectOrReject(v, a, l, false, true); }},
      {"reject", [](const Value& v, const CallArgs& a,
                    const RenderLimits& l) { return SelectOrReject(v, a, l, false, false); }},
      {"map", Map},
      {"indent",
       [](const Value& v, const CallArgs& a, const RenderLimits&) { return Indent(v, a); }},
      {"sort", Sort},
      {"unique", Unique},
      {"dictsort", DictSort},
      {"min", [](const Value& v, const CallArgs& a,
                 const RenderLimits& l) { return MinOrMax(v, a, l, false); }},
      {"max", [](const Value& v, const CallArgs& a,
                 const RenderLimits& l) { return MinOrMax(v, a, l, true); }},
      {"sum", Sum},
      {"round", [](const Value& v, const CallArgs& a, const RenderLimits&) { return Round(v, a); }},
      {"attr",
       [](const Value& v, const CallArgs& a, const RenderLimits& limits) {
         return GetAttribute(v, a.Get(0, "name").ToString(), limits);
       }},
  };
  return kFilters;
}

const std::map<std::string, std::string>& Aliases() {
  static const std::map<std::string, std::string> kAliases = {{"d", "default"}, {"e", "escape"}};
  return kAliases;
}
std::string Canonical(const std::string& name) {
  auto it = Aliases().find(name);
  return it == Aliases().end() ? name : it->second;
}

}  // namespace

bool HasFilter(const std::string& name) { return Filters().count(Canonical(name)) > 0; }

Value ApplyFilter(const std::string& name, const Value& input, const CallArgs& args,
                  const RenderLimits& limits) {
  auto it = Filters().find(Canonical(name));
  if (it == Filters().end()) throw RuntimeError("unsupported filter '" + name + "'");
  return it->second(input, args, limits);
}

}  // namespace llm::jinja
