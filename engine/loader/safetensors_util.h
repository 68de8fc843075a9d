// Small helpers shared by the safetensors reader, writer and checkpoint checks.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace llm {

// "F32" / "F16" / "BF16" -> DType; nullopt for anything else (I64, F8_E4M3, ...).
inline std::optional<DType> DTypeFromName(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (DTypeName(t) == name) return t;
  }
  return std::nullopt;
}

// [172, 64] (the form used in every shape error message).
inline std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// A short rendering of a JSON value for error messages. Never recurses more than one level:
// dump() is recursive, and an attacker-controlled header may nest a million levels deep.
inline std::string JsonSnippet(const nlohmann::json& v) {
  std::string text;
  if (v.is_structured()) {
    bool flat = true;
    for (const auto& item : v) flat = flat && !item.is_structured();
    if (!flat) return v.is_array() ? "[...]" : "{...}";
  }
  text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > 64 ? text.substr(0, 61) + "..." : text;
}

}  // namespace llm
