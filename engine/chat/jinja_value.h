// The value model of the chat-template interpreter: Python's types as Jinja2 sees them
// (undefined, None, bool, int, float, str, list, dict, namespace, callable), with Python's
// str()/repr(), truthiness and comparisons, and json.dumps as transformers' `tojson` calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace llm::jinja {

// A render-time failure without its position; the evaluator adds line and column and turns it
// into llm::Error.
class RuntimeError : public std::runtime_error {
 public:
  explicit RuntimeError(const std::string& message) : std::runtime_error(message) {}
};

// The deepest list / dict a render may build (request JSON nests at most kMaxJsonDepth = 512
// levels). Deeper values would overflow the stack of the recursive walks (repr, ==, tojson) and
// of their own destruction: MakeList / MakeDict throw RuntimeError past it, as Python raises
// RecursionError. A namespace counts as one level (it is a reference: every namespace lives
// until the render ends, so destroying a value never recurses into one).
inline constexpr int kMaxValueDepth = 1024;

class Value;
using List = std::vector<Value>;
// Insertion-ordered like a Python dict (the order shows in `tojson` and `items()`).
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value value);
};
struct CallArgs;
// json.dumps's options as transformers' tojson passes them.
struct JsonOptions {
  int indent = -1;  // < 0: one line
  bool sort_keys = false;
  bool ensure_ascii = false;  // \uXXXX (surrogate pairs above U+FFFF) for non-ASCII
  // Python's defaults when empty: ", " and ": " on one line, "," and ": " with indent.
  std::string item_separator, key_separator;
};
using Function = std::function<Value(CallArgs&)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items);
  static Value MakeTuple(List items);  // a list that prints as Python's tuple: (1, 2)
  static Value MakeDict(Dict dict);
  static Value Namespace(Dict dict);  // mutable by `set ns.x = ...`, shared by reference
  static Value MakeFunction(Function fn);
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kFloat ? static_cast<int64_t>(f_) : i_; }
  double as_float() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const std::string& str() const { return *s_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_namespace() const { return *dict_; }
  const Function& function() const { return *fn_; }

  bool Truthy() const;
  // Python str(): what `{{ x }}` prints. Undefined prints as "".
  std::string ToString() const;
  // Python repr(): how lists and dicts print their items. A namespace met again inside itself
  // prints as <Namespace {...}> (Python's guard for a container that holds itself); a chain of
  // namespaces deeper than kMaxValueDepth throws RuntimeError.
  std::string Repr() const;
  // json.dumps(x, ...) as transformers' tojson calls it.
  std::string ToJson(const JsonOptions& options) const;
  // "string", "list", ... for error messages.
  std::string TypeName() const;
  // Items of a for loop: list items, dict keys, string characters; undefined is empty.
  List Iterate() const;
  // Nesting depth: 0 for scalars, 1 + the deepest item for lists and dicts, 1 for namespaces.
  int depth() const { return depth_; }

 private:
  void AppendRepr(std::string& out, int depth, std::vector<const Dict*>& open) const;

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool is_tuple_ = false;
  int depth_ = 0;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> fn_;
};

// Python ==, <, ... on two values (throws llm::Error where Python raises TypeError).
bool Equals(const Value& a, const Value& b);
int Compare(const Value& a, const Value& b);
// Python's repr() of a float (shortest round-trip form, "1.0", "1e+20").
std::string FloatRepr(double f);

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // The positional or keyword argument `name` at `index`, or `fallback`.
  Value Get(size_t index, const std::string& name, Value fallback = Value()) const;
};

}  // namespace llm::jinja
