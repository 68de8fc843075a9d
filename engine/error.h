// The engine's error type: a message meant for the user (it names the file, the tensor or
// the field at fault). Loading code throws it; the CLI and server catch it at the top.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace llm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Engine::AddRequest on an engine that has turned unhealthy (Engine::IsHealthy): the front
// ends answer 503 / UNAVAILABLE, not 400, so that clients go elsewhere while it restarts.
class EngineUnavailableError : public Error {
 public:
  using Error::Error;
};

// e's what(), or "unknown exception" when e is not a std::exception.
inline std::string ExceptionMessage(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
  }
  return "unknown exception";
}

}  // namespace llm
