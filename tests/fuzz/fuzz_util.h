// Helpers shared by the libFuzzer targets (tests/fuzz/*_fuzz.cc).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "engine/tokenizer/tokenizer.h"

namespace llm::fuzz {

// The shared/ folder with the test models: $LLM_SHARED_DIR, else the one next to the
// source tree (baked in at configure time).
inline std::string SharedDir() {
  const char* env = std::getenv("LLM_SHARED_DIR");
  return env != nullptr && *env != '\0' ? env : LLM_SHARED_DIR;
}

// The stories260K tokenizer (512 pieces, BPE with byte fallback), loaded once.
inline const Tokenizer& StoriesTokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer =
      Tokenizer::FromFile(SharedDir() + "/models/stories260K/tokenizer.model");
  return *tokenizer;
}

// An in-memory file (memfd) reachable by path, for parsers that only open paths. One per
// process; Write replaces its contents.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("fuzz_input", 0)) {
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  const std::string& Write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

// Splits the input at the first occurrence of `separator`: {before, after}; no separator:
// {all, ""}.
inline std::pair<std::string_view, std::string_view> SplitAt(std::string_view input,
                                                             std::string_view separator) {
  const size_t pos = input.find(separator);
  if (pos == std::string_view::npos) return {input, {}};
  return {input.substr(0, pos), input.substr(pos + separator.size())};
}

}  // namespace llm::fuzz
