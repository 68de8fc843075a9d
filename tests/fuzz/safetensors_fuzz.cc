// Fuzzes the safetensors header parser: the input is a whole .safetensors file (u64 header
// length, JSON header, data). Every input must open or throw llm::Error; an opened file's
// tensor views must lie inside the mapping (read every byte so that ASan checks it).
//
//   scripts/fuzz.sh safetensors
#include <cstddef>
#include <cstdint>

#include "engine/error.h"
#include "engine/loader/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static llm::fuzz::MemFile file;
  const std::string& path = file.Write(data, size);
  try {
    std::unique_ptr<llm::SafetensorsFile> st = llm::SafetensorsFile::Open(path);
    uint8_t sum = 0;
    for (const auto& [name, view] : st->tensors()) {
      if (view.num_bytes != static_cast<size_t>(view.num_elements()) * llm::DTypeSize(view.dtype)) {
        __builtin_trap();  // the header check promised dtype x shape bytes
      }
      for (size_t i = 0; i < view.num_bytes; ++i) sum += static_cast<uint8_t>(view.data[i]);
      if (st->Find(name) != &view) __builtin_trap();
    }
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const llm::Error&) {
  }
  return 0;
}
