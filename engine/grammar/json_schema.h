// JSON Schema to grammar, for the subset used in practice (OpenAI structured outputs, tool
// parameters, pydantic / zod output):
//   type (one or a list; "nullable": true adds null), properties, required,
//   additionalProperties (a schema is used when there are no properties), items, prefixItems,
//   minItems, maxItems, enum, const, anyOf, oneOf (compiled as anyOf: the alternatives should
//   exclude each other, as discriminated unions do), allOf (merged: properties, required,
//   type), $ref to "#", "#/$defs/..." or any "#/..." pointer (recursion allowed), $defs and
//   definitions, string pattern (the whole string matches), minLength, maxLength, integer
//   minimum / maximum / exclusiveMinimum / exclusiveMaximum, and the same for numbers
//   (the output is then an integer in the range). Annotations (title, description, default,
//   examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored.
// Any other keyword (format, uniqueItems, multipleOf, patternProperties, not, if, ...) is an
// error naming it when `strict`, else ignored (the output may then break that keyword).
//
// The output is bounded wherever the schema is: between tokens at most one space, or a
// newline and up to 24 spaces of indentation (none with `compact`); integers have at most 15
// digits, numbers 15 + 15 digits and an exponent of at most 292 in magnitude (so that every
// number is a finite double). Properties come in the schema's
// order; an optional property may be left out; no property the schema does not list is
// produced.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "engine/grammar/grammar.h"

namespace llm::grammar {

struct JsonSchemaOptions {
  bool strict = false;   // unsupported keywords are an error
  bool compact = false;  // no whitespace between tokens
};

Grammar JsonSchemaGrammar(const nlohmann::ordered_json& schema,
                          const JsonSchemaOptions& options = {}, const Limits& limits = {});
// The JSON for `schema` as an expression of `b`, to embed in a larger grammar (tool calls:
// engine/grammar/compiler.h). `schema` must outlive b->Build().
ExprPtr JsonSchemaExpr(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options,
                       GrammarBuilder* b);
// Any JSON object ({"type": "json_object"}).
Grammar JsonObjectGrammar(const JsonSchemaOptions& options = {}, const Limits& limits = {});

}  // namespace llm::grammar
