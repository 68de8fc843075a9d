// The chat-template evaluator (statements and expressions) and its built-ins (filters, tests,
// string and dict methods, global functions), with limits that bound a hostile template.
#pragma once

#include <string>
#include <vector>

#include "engine/chat/jinja_ast.h"
#include "engine/chat/jinja_value.h"

namespace llm::jinja {

struct RenderLimits {
  size_t max_output_bytes = 8u << 20;       // the rendered prompt, and any one string value
  int64_t max_loop_iterations = 1'000'000;  // all loops of one render together
  int max_call_depth = 64;                  // nested macro calls
  int64_t max_range_length = 1'000'000;     // range(n)
};

// Renders `nodes` with `variables` (messages, add_generation_prompt, bos_token, ...).
// Throws llm::Error("chat template: line L, column C: ...") on runtime errors and limits.
std::string Render(const NodeList& nodes, const Dict& variables, const RenderLimits& limits);

// Throws llm::Error with line and column for a filter or test name that is not implemented
// (Jinja2 also rejects unknown filters when it compiles a template).
void CheckNames(const NodeList& nodes);

// Built-ins: filters (jinja_filters.cc), tests, attributes and globals (jinja_builtins.cc).
// They throw RuntimeError.
bool HasFilter(const std::string& name);
bool HasTest(const std::string& name);
Value ApplyFilter(const std::string& name, const Value& input, const CallArgs& args,
                  const RenderLimits& limits);
bool ApplyTest(const std::string& name, const Value& value, const std::vector<Value>& args);
// `obj.name`: a dict's key, or a bound str/dict method; undefined where absent.
Value GetAttribute(const Value& obj, const std::string& name, const RenderLimits& limits);
// `obj[key]`: item first, then attribute (as Jinja2's getitem).
Value GetItem(const Value& obj, const Value& key, const RenderLimits& limits);
// range, namespace, dict, raise_exception, strftime_now. Every namespace() the render creates
// is appended to `namespaces`: the evaluator empties them when the render ends, which breaks
// any reference cycle a template built through them (`{% set ns.self = ns %}`).
void AddGlobals(Dict& globals, const RenderLimits& limits, std::vector<Value>* namespaces);
// Throws RuntimeError when a string would exceed the limit.
void CheckSize(size_t num_bytes, const RenderLimits& limits);

}  // namespace llm::jinja
