// The chat-template evaluator: walks the syntax tree, keeps Jinja2's scopes (a for loop's body
// gets a fresh scope each iteration; if does not open one; a macro sees its arguments and the
// template's top level) and enforces the render limits.
#include "engine/chat/jinja_eval.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"

namespace llm::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

// Whether `nodes` read the variable `name` anywhere.
bool Mentions(const Expr& e, const std::string& name);
bool Mentions(const NodeList& nodes, const std::string& name) {
  for (const auto& node : nodes) {
    for (const Expr* e : {node->expr.get(), node->filter.get()}) {
      if (e && Mentions(*e, name)) return true;
    }
    for (const auto& d : node->defaults) {
      if (d && Mentions(*d, name)) return true;
    }
    if (Mentions(node->body, name) || Mentions(node->else_body, name)) return true;
  }
  return false;
}

struct Macro {
  const Node* node;
};

class Evaluator {
 public:
  Evaluator(const Dict& variables, const RenderLimits& limits) : limits_(limits) {
    Dict globals;
    AddGlobals(globals, limits_, &namespaces_);
    scopes_.push_back(std::move(globals));
    scopes_.push_back(variables);
  }
  // Namespaces are the only mutable values, so every reference cycle a template can build
  // passes through one: emptying them all frees the cycle (on success and on errors alike).
  ~Evaluator() {
    for (const Value& ns : namespaces_) ns.mutable_namespace().entries.clear();
  }

  std::string Run(const NodeList& nodes) {
    Flow flow = RenderNodes(nodes);
    (void)flow;  // break/continue outside a loop are rejected by Jinja2 at compile time
    return std::move(out_);
  }

 private:
  Flow RenderNodes(const NodeList& nodes) {
    for (const auto& node : nodes) {
      Flow flow = RenderNode(*node);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  [[noreturn]] static void Fail(int line, int column, const std::string& message) {
    throw Error("chat template: line " + std::to_string(line) + ", column " +
                std::to_string(column) + ": " + message);
  }

  Flow RenderNode(const Node& node) {
    try {
      return RenderNodeUnchecked(node);
    } catch (const RuntimeError& e) {
      Fail(current_line_ ? current_line_ : node.line, current_line_ ? current_column_ : node.column,
           e.what());
    }
  }

  void Append(const std::string& text) {
    if (out_.size() + text.size() > limits_.max_output_bytes) {
      throw RuntimeError("rendered output exceeds " + std::to_string(limits_.max_output_bytes) +
                         " bytes");
    }
    out_ += text;
  }

  Flow RenderNodeUnchecked(const Node& node) {
    current_line_ = 0;
    switch (node.kind) {
      case Node::Kind::kText:
        Append(node.text);
        return Flow::kNormal;
      case Node::Kind::kOutput:
        Append(Eval(*node.expr).ToString());
        return Flow::kNormal;
      case Node::Kind::kIf:
        return RenderNodes(Eval(*node.expr).Truthy() ? node.body : node.else_body);
      case Node::Kind::kFor:
        return RenderFor(node);
      case Node::Kind::kSet:
        RenderSet(node);
        return Flow::kNormal;
      case Node::Kind::kMacro: {
        const Node* macro = &node;
        scopes_.back().Set(node.text, Value::MakeFunction([this, macro](CallArgs& args) {
                             return CallMacro(*macro, args);
                           }));
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kCallBlock:
        return RenderNodes(node.body);
      case Node::Kind::kFilterBlock:
        Append(ApplyFilterChain(*node.expr, Value::String(Capture(node.body))).ToString());
        return Flow::kNormal;
    }
    return Flow::kNormal;
  }

  Flow RenderFor(const Node& node) {
    List items = Eval(*node.expr).Iterate();
    if (node.filter) {
      List kept;
      for (auto& item : items) {
        ScopeGuard scope(*this);
        Bind(node, item);
        if (Eval(*node.filter).Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return RenderNodes(node.else_body);
    int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (++num_iterations_ > limits_.max_loop_iterations) {
        throw RuntimeError("loop iterations exceed " + std::to_string(limits_.max_loop_iterations));
      }
      ScopeGuard scope(*this);
      Bind(node, items[i]);
      Dict loop;
      loop.Set("index", Value::Int(i + 1));
      loop.Set("index0", Value::Int(i));
      loop.Set("revindex", Value::Int(n - i));
      loop.Set("revindex0", Value::Int(n - i - 1));
      loop.Set("first", Value::Bool(i == 0));
      loop.Set("last", Value::Bool(i == n - 1));
      loop.Set("length", Value::Int(n));
      loop.Set("depth", Value::Int(1));  // loops are not recursive here
      loop.Set("depth0", Value::Int(0));
      loop.Set("previtem", i > 0 ? items[i - 1] : Value());
      loop.Set("nextitem", i + 1 < n ? items[i + 1] : Value());
      loop.Set("cycle", Value::MakeFunction([i](CallArgs& args) {
                 if (args.args.empty()) throw RuntimeError("loop.cycle() needs arguments");
                 return args.args[static_cast<size_t>(i) % args.args.size()];
               }));
      scopes_.back().Set("loop", Value::MakeDict(std::move(loop)));
      if (RenderNodes(node.body) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void Bind(const Node& node, const Value& item) {
    if (node.targets.size() == 1) {
      scopes_.back().Set(node.targets[0], item);
      return;
    }
    List parts = item.Iterate();
    if (parts.size() != node.targets.size()) {
      throw RuntimeError("cannot unpack " + std::to_string(parts.size()) + " values into " +
                         std::to_string(node.targets.size()) + " loop variables");
    }
    for (size_t k = 0; k < parts.size(); ++k) scopes_.back().Set(node.targets[k], parts[k]);
  }

  // What `nodes` print, apart from the output so far.
  std::string Capture(const NodeList& nodes) {
    std::string saved = std::move(out_);
    out_.clear();
    struct Restore {
      std::string& out;
      std::string& saved;
      ~Restore() { out = std::move(saved); }
    };
    std::string captured;
    {
      Restore restore{out_, saved};
      RenderNodes(nodes);
      captured = std::move(out_);
    }
    return captured;
  }

  // A filter block's filters, innermost (applied first) at the body's placeholder.
  Value ApplyFilterChain(const Expr& e, Value body) {
    if (e.kind == Expr::Kind::kName && e.name.empty()) return body;
    if (e.kind != Expr::Kind::kFilter) throw RuntimeError("a filter block takes only filters");
    Value input = ApplyFilterChain(*e.children[0], std::move(body));
    return ApplyFilter(e.name, input, EvalArgs(e), limits_);
  }

  void RenderSet(const Node& node) {
    Value value = node.expr ? Eval(*node.expr) : Value::String(Capture(node.body));
    if (!node.attr.empty()) {
      Value target = Lookup(node.targets[0]);
      if (target.kind() != Value::Kind::kNamespace) {
        throw RuntimeError("cannot assign attribute on non-namespace object '" + node.targets[0] +
                           "'");
      }
      target.mutable_namespace().Set(node.attr, std::move(value));
      return;
    }
    if (node.targets.size() == 1) {
      scopes_.back().Set(node.targets[0], std::move(value));
      return;
    }
    List parts = value.Iterate();
    if (parts.size() != node.targets.size()) throw RuntimeError("cannot unpack values in set");
    for (size_t k = 0; k < parts.size(); ++k) scopes_.back().Set(node.targets[k], parts[k]);
  }

  Value CallMacro(const Node& macro, CallArgs& args) {
    if (call_depth_ >= limits_.max_call_depth) {
      throw RuntimeError("macro calls nested deeper than " +
                         std::to_string(limits_.max_call_depth));
    }
    Dict locals;
    for (size_t k = 0; k < macro.targets.size(); ++k) {
      Value v = args.Get(k, macro.targets[k]);
      if (v.is_undefined() && macro.defaults[k]) v = Eval(*macro.defaults[k]);
      locals.Set(macro.targets[k], v);
    }
    // Jinja2's varargs and kwargs: the arguments beyond the parameters, an error unless the
    // macro reads them.
    List varargs;
    for (size_t k = macro.targets.size(); k < args.args.size(); ++k)
      varargs.push_back(args.args[k]);
    Dict kwargs;
    for (const auto& [name, value] : args.kwargs) {
      if (std::find(macro.targets.begin(), macro.targets.end(), name) == macro.targets.end()) {
        kwargs.Set(name, value);
      }
    }
    if (!varargs.empty() && !Mentions(macro.body, "varargs")) {
      throw RuntimeError("macro '" + macro.text + "' takes not more than " +
                         std::to_string(macro.targets.size()) + " argument(s)");
    }
    if (!kwargs.entries.empty() && !Mentions(macro.body, "kwargs")) {
      throw RuntimeError("macro '" + macro.text + "' takes no keyword argument '" +
                         kwargs.entries[0].first + "'");
    }
    locals.Set("varargs", Value::MakeTuple(std::move(varargs)));
    locals.Set("kwargs", Value::MakeDict(std::move(kwargs)));
    // A macro sees the globals, the template's top level and its arguments.
    std::vector<Dict> saved(scopes_.begin() + 2, scopes_.end());
    scopes_.resize(2);
    scopes_.push_back(std::move(locals));
    std::string saved_out = std::move(out_);
    out_.clear();
    ++call_depth_;
    struct Restore {
      Evaluator& e;
      std::vector<Dict>& saved;
      std::string& saved_out;
      ~Restore() {
        --e.call_depth_;
        e.scopes_.resize(2);
        for (auto& s : saved) e.scopes_.push_back(std::move(s));
        e.out_ = std::move(saved_out);
      }
    };
    std::string result;
    {
      Restore restore{*this, saved, saved_out};
      RenderNodes(macro.body);
      result = std::move(out_);
    }
    return Value::String(std::move(result));
  }

  struct ScopeGuard {
    explicit ScopeGuard(Evaluator& e) : evaluator(e) { evaluator.scopes_.emplace_back(); }
    ~ScopeGuard() { evaluator.scopes_.pop_back(); }
    Evaluator& evaluator;
  };

  Value Lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      if (const Value* v = scopes_[i].Find(name)) return *v;
    }
    return Value();
  }

  // Records where an expression failed, so that the error names the innermost position.
  Value Eval(const Expr& e) {
    try {
      return EvalUnchecked(e);
    } catch (const RuntimeError&) {
      if (!current_line_) {
        current_line_ = e.line;
        current_column_ = e.column;
      }
      throw;
    }
  }

  static std::string Describe(const Expr& e) {
    if (e.kind == Expr::Kind::kName) return "'" + e.name + "' is undefined";
    if (e.kind == Expr::Kind::kAttr) return "'" + e.name + "' is undefined";
    return "value is undefined";
  }

  Value EvalUnchecked(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        List items;
        for (const auto& child : e.children) items.push_back(Eval(*child));
        return e.name == "tuple" ? Value::MakeTuple(std::move(items))
                                 : Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t k = 0; k + 1 < e.children.size(); k += 2) {
          Value key = Eval(*e.children[k]);
          if (!key.is_string()) throw RuntimeError("dict keys must be strings");
          dict.Set(key.str(), Eval(*e.children[k + 1]));
        }
        return Value::MakeDict(std::move(dict));
      }
      case Expr::Kind::kAttr: {
        Value obj = Eval(*e.children[0]);
        if (obj.is_undefined()) throw RuntimeError(Describe(*e.children[0]));
        return GetAttribute(obj, e.name, limits_);
      }
      case Expr::Kind::kItem: {
        Value obj = Eval(*e.children[0]);
        if (obj.is_undefined()) throw RuntimeError(Describe(*e.children[0]));
        return GetItem(obj, Eval(*e.children[1]), limits_);
      }
      case Expr::Kind::kSlice:
        return EvalSlice(e);
      case Expr::Kind::kCall: {
        const Expr& target = *e.children[0];
        Value callee;
        if (target.kind == Expr::Kind::kAttr) {  // a method: name what lacks it
          const Value obj = Eval(*target.children[0]);
          if (obj.is_undefined()) throw RuntimeError(Describe(*target.children[0]));
          callee = GetAttribute(obj, target.name, limits_);
          if (callee.is_undefined()) {
            throw RuntimeError("'" + obj.TypeName() + "' object has no method '" + target.name +
                               "'");
          }
        } else {
          callee = Eval(target);
        }
        if (callee.kind() != Value::Kind::kFunction) {
          throw RuntimeError(callee.is_undefined()
                                 ? Describe(*e.children[0])
                                 : "'" + callee.TypeName() + "' object is not callable");
        }
        CallArgs args = EvalArgs(e);
        return callee.function()(args);
      }
      case Expr::Kind::kFilter: {
        Value input = Eval(*e.children[0]);
        return ApplyFilter(e.name, input, EvalArgs(e), limits_);
      }
      case Expr::Kind::kTest: {
        Value value = Eval(*e.children[0]);
        CallArgs args = EvalArgs(e);
        return Value::Bool(ApplyTest(e.name, value, args.args) != e.negated);
      }
      case Expr::Kind::kUnary: {
        Value v = Eval(*e.children[0]);
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (!v.is_number())
          throw RuntimeError("bad operand type for unary " + e.name + ": " + v.TypeName());
        if (e.name == "+") return v.kind() == Value::Kind::kFloat ? v : Value::Int(v.as_int());
        return v.kind() == Value::Kind::kFloat ? Value::Float(-v.as_float())
                                               : Value::Int(-v.as_int());
      }
      case Expr::Kind::kBinary:
        return EvalBinary(e);
      case Expr::Kind::kCondition:
        if (Eval(*e.children[0]).Truthy()) return Eval(*e.children[1]);
        return e.children[2] ? Eval(*e.children[2]) : Value();
    }
    return Value();
  }

  CallArgs EvalArgs(const Expr& e) {
    CallArgs args;
    size_t first =
        e.kind == Expr::Kind::kCall || e.kind == Expr::Kind::kFilter || e.kind == Expr::Kind::kTest
            ? 1
            : 0;
    for (size_t k = first; k < e.children.size(); ++k) args.args.push_back(Eval(*e.children[k]));
    for (const auto& [name, expr] : e.kwargs) args.kwargs.emplace_back(name, Eval(*expr));
    return args;
  }

  Value EvalSlice(const Expr& e) {
    Value obj = Eval(*e.children[0]);
    if (obj.is_undefined()) throw RuntimeError(Describe(*e.children[0]));
    auto bound = [&](size_t k) -> Value {
      return e.children[k] ? Eval(*e.children[k]) : Value::None();
    };
    Value start = bound(1), stop = bound(2), step_v = bound(3);
    int64_t step = step_v.is_none() ? 1 : step_v.as_int();
    if (step == 0) throw RuntimeError("slice step cannot be zero");
    List items = obj.is_string() || obj.is_list() ? obj.Iterate() : List();
    if (!obj.is_string() && !obj.is_list()) throw RuntimeError("cannot slice " + obj.TypeName());
    int64_t n = static_cast<int64_t>(items.size());
    auto clamp = [&](const Value& v, int64_t fallback) {
      if (v.is_none()) return fallback;
      int64_t i = v.as_int();
      if (i < 0) i += n;
      if (step > 0) return std::min(std::max<int64_t>(i, 0), n);
      return std::min(std::max<int64_t>(i, -1), n - 1);
    };
    int64_t lo = clamp(start, step > 0 ? 0 : n - 1);
    int64_t hi = clamp(stop, step > 0 ? n : -1);
    List picked;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
      picked.push_back(items[static_cast<size_t>(i)]);
    if (obj.is_list()) return Value::MakeList(std::move(picked));
    std::string s;
    for (const auto& c : picked) s += c.str();
    return Value::String(std::move(s));
  }

  Value EvalBinary(const Expr& e) {
    const std::string& op = e.name;
    Value a = Eval(*e.children[0]);
    if (op == "and") return a.Truthy() ? Eval(*e.children[1]) : a;
    if (op == "or") return a.Truthy() ? a : Eval(*e.children[1]);
    Value b = Eval(*e.children[1]);
    if (op == "~") {
      std::string s = a.ToString() + b.ToString();
      CheckSize(s.size(), limits_);
      return Value::String(std::move(s));
    }
    if (op == "==") return Value::Bool(Equals(a, b));
    if (op == "!=") return Value::Bool(!Equals(a, b));
    if (op == "<") return Value::Bool(Compare(a, b) < 0);
    if (op == "<=") return Value::Bool(Compare(a, b) <= 0);
    if (op == ">") return Value::Bool(Compare(a, b) > 0);
    if (op == ">=") return Value::Bool(Compare(a, b) >= 0);
    if (op == "in" || op == "not in") return Value::Bool(Contains(b, a) == (op == "in"));
    if (a.is_undefined()) throw RuntimeError(Describe(*e.children[0]));
    if (b.is_undefined()) throw RuntimeError(Describe(*e.children[1]));
    return Arithmetic(op, a, b);
  }

  static bool Contains(const Value& container, const Value& item) {
    if (container.is_string()) {
      if (!item.is_string()) throw RuntimeError("'in <string>' requires string as left operand");
      return container.str().find(item.str()) != std::string::npos;
    }
    if (container.is_mapping())
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    if (container.is_list()) {
      for (const auto& v : container.list()) {
        if (Equals(v, item)) return true;
      }
      return false;
    }
    if (container.is_undefined()) return false;
    throw RuntimeError("argument of type '" + container.TypeName() + "' is not iterable");
  }

  Value Arithmetic(const std::string& op, const Value& a, const Value& b) {
    auto type_error = [&]() -> RuntimeError {
      return RuntimeError("unsupported operand type(s) for " + op + ": '" + a.TypeName() +
                          "' and '" + b.TypeName() + "'");
    };
    if (op == "+" && a.is_string() && b.is_string()) {
      CheckSize(a.str().size() + b.str().size(), limits_);
      return Value::String(a.str() + b.str());
    }
    if (op == "+" && a.is_list() && b.is_list()) {
      List items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      CheckSize(items.size(), limits_);
      return Value::MakeList(std::move(items));
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.is_number() &&
        b.kind() != Value::Kind::kFloat) {
      int64_t times = std::max<int64_t>(b.as_int(), 0);
      size_t unit = a.is_string() ? a.str().size() : a.list().size();
      if (unit && static_cast<uint64_t>(times) > limits_.max_output_bytes / unit)
        CheckSize(limits_.max_output_bytes + 1, limits_);
      if (a.is_string()) {
        std::string s;
        for (int64_t k = 0; k < times; ++k) s += a.str();
        return Value::String(std::move(s));
      }
      List items;
      for (int64_t k = 0; k < times; ++k)
        items.insert(items.end(), a.list().begin(), a.list().end());
      return Value::MakeList(std::move(items));
    }
    if (!a.is_number() || !b.is_number()) throw type_error();
    bool is_float = a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat;
    double x = a.as_float(), y = b.as_float();
    int64_t i = a.as_int(), j = b.as_int();
    if (op == "/") {
      if (y == 0) throw RuntimeError("division by zero");
      return Value::Float(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0)
        throw RuntimeError(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (is_float) {
        double q = std::floor(x / y);
        return Value::Float(op == "//" ? q : x - q * y);
      }
      int64_t q = i / j;
      if ((i % j != 0) && ((i < 0) != (j < 0))) --q;  // Python floors
      return Value::Int(op == "//" ? q : i - q * j);
    }
    if (op == "**") {
      if (is_float || j < 0) return Value::Float(std::pow(x, y));
      if (i == 0 || i == 1) return Value::Int(j == 0 ? 1 : i);
      if (i == -1) return Value::Int(j % 2 ? -1 : 1);
      int64_t result = 1;
      for (int64_t k = 0; k < j; ++k) {  // |i| >= 2 overflows within 63 steps
        if (__builtin_mul_overflow(result, i, &result))
          throw RuntimeError("integer power too large");
      }
      return Value::Int(result);
    }
    int64_t r = 0;
    if (!is_float) {
      bool overflow = op == "+"   ? __builtin_add_overflow(i, j, &r)
                      : op == "-" ? __builtin_sub_overflow(i, j, &r)
                                  : __builtin_mul_overflow(i, j, &r);
      if (overflow) throw RuntimeError("integer overflow in " + op);
      return Value::Int(r);
    }
    return Value::Float(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }

  const RenderLimits& limits_;
  std::vector<Dict> scopes_;  // [0] globals, [1] the render variables and top-level sets
  std::string out_;
  std::vector<Value> namespaces_;  // every namespace() of this render (see ~Evaluator)
  int64_t num_iterations_ = 0;
  int call_depth_ = 0;
  int current_line_ = 0;  // where the innermost failing expression is
  int current_column_ = 0;
};

bool Mentions(const Expr& e, const std::string& name) {
  if (e.kind == Expr::Kind::kName && e.name == name) return true;
  for (const auto& child : e.children) {
    if (child && Mentions(*child, name)) return true;
  }
  for (const auto& [key, child] : e.kwargs) {
    if (Mentions(*child, name)) return true;
  }
  return false;
}

void CheckExprNames(const Expr& e) {
  if (e.kind == Expr::Kind::kFilter && !HasFilter(e.name)) {
    throw Error("chat template: line " + std::to_string(e.line) + ", column " +
                std::to_string(e.column) + ": unsupported filter '" + e.name + "'");
  }
  if (e.kind == Expr::Kind::kTest && !HasTest(e.name)) {
    throw Error("chat template: line " + std::to_string(e.line) + ", column " +
                std::to_string(e.column) + ": unsupported test '" + e.name + "'");
  }
  for (const auto& child : e.children) {
    if (child) CheckExprNames(*child);
  }
  for (const auto& [name, child] : e.kwargs) CheckExprNames(*child);
}

}  // namespace

std::string Render(const NodeList& nodes, const Dict& variables, const RenderLimits& limits) {
  return Evaluator(variables, limits).Run(nodes);
}

void CheckNames(const NodeList& nodes) {
  for (const auto& node : nodes) {
    for (const Expr* e : {node->expr.get(), node->filter.get()}) {
      if (e) CheckExprNames(*e);
    }
    for (const auto& d : node->defaults) {
      if (d) CheckExprNames(*d);
    }
    CheckNames(node->body);
    CheckNames(node->else_body);
  }
}

}  // namespace llm::jinja
