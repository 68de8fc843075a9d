// The engine's error type: a message meant for the user (it names the file, the tensor or
// the field at fault). Loading code throws it; the CLI and server catch it at the top.
#pragma once

#include <stdexcept>
#include <string>

namespace llm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace llm
