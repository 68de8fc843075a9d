// Built-ins of the chat-template interpreter besides filters (jinja_filters.cc) and str
// methods (jinja_strings.cc): Jinja2's tests, dict methods, attribute and item access, and the
// globals transformers provides (raise_exception, strftime_now) besides Jinja2's (range,
// namespace, dict).
#include <ctime>
#include <functional>
#include <map>

#include "engine/chat/jinja_eval.h"
#include "engine/chat/jinja_strings.h"

namespace llm::jinja {
namespace {

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
        if (name == "items") out.push_back(Value::MakeTuple({Value::String(k), v}));
        if (name == "keys") out.push_back(Value::String(k));
        if (name == "values") out.push_back(v);
      }
      return Value::MakeList(std::move(out));
    });
  }
  return Value();
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
      {"lower", [](const Value& v, const std::vector<Value>&) { return v.is_string() && Lower(v.str()) == v.str() && Upper(v.str()) != v.str(); }},
      {"upper", [](const Value& v, const std::vector<Value>&) { return v.is_string() && Upper(v.str()) == v.str() && Lower(v.str()) != v.str(); }},
  };
  return kTests;
}

const std::map<std::string, std::string>& Aliases() {
  static const std::map<std::string, std::string> kAliases = {
      {"eq", "equalto"}, {"==", "equalto"}, {"!=", "ne"},          {"<", "lt"},       {"<=", "le"},
      {">", "gt"},       {">=", "ge"},      {"greaterthan", "gt"}, {"lessthan", "lt"}};
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

bool HasTest(const std::string& name) { return Tests().count(Canonical(name)) > 0; }

bool ApplyTest(const std::string& name, const Value& value, const std::vector<Value>& args) {
  auto it = Tests().find(Canonical(name));
  if (it == Tests().end()) throw RuntimeError("unsupported test '" + name + "'");
  return it->second(value, args);
}

Value GetAttribute(const Value& obj, const std::string& name, const RenderLimits& limits) {
  if (obj.is_string()) return StringMethod(obj.str(), name, limits);
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
