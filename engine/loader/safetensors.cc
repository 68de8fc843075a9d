// SafetensorsFile: maps a .safetensors file read-only and validates the whole header before
// any tensor is handed out, so that arbitrary bytes on disk yield an llm::Error, never UB.
// (The one thing no validation can prevent is another process truncating the file while it
// is mapped: the kernel then raises SIGBUS on access.)
#include "engine/loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "engine/error.h"
#include "engine/loader/safetensors_util.h"

namespace llm {
namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we (a corrupt length
// must not make us parse gigabytes of tensor data as JSON).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void Fail(const std::string& path, const std::string& what) {
  throw Error(path + ": " + what);
}

[[noreturn]] void FailTensor(const std::string& path, const std::string& name,
                             const std::string& what) {
  throw Error(path + ": tensor '" + name + "': " + what);
}

// Closes the descriptor on every path out of Open.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// A JSON value as a non-negative integer that fits in uint64; nullopt otherwise (negative,
// fractional, too large for uint64 -- nlohmann parses those as double -- or not a number).
std::optional<uint64_t> AsUnsigned(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  return std::nullopt;
}

DType ParseDType(const std::string& path, const std::string& name, const json& entry) {
  auto it = entry.find("dtype");
  if (it == entry.end()) FailTensor(path, name, "has no \"dtype\"");
  if (!it->is_string()) FailTensor(path, name, "\"dtype\" is not a string: " + JsonSnippet(*it));
  std::optional<DType> dtype = DTypeFromName(it->get<std::string>());
  if (!dtype) {
    FailTensor(path, name,
               "unsupported dtype '" + it->get<std::string>() + "' (supported: F32, F16, BF16)");
  }
  return *dtype;
}

// Shape [d0, d1, ...] of non-negative dims whose product, times the element size, fits in
// uint64 (so that the byte-length comparison below cannot overflow).
std::vector<int64_t> ParseShape(const std::string& path, const std::string& name, const json& entry,
                                DType dtype, uint64_t* num_bytes) {
  auto it = entry.find("shape");
  if (it == entry.end()) FailTensor(path, name, "has no \"shape\"");
  if (!it->is_array()) FailTensor(path, name, "\"shape\" is not a list: " + JsonSnippet(*it));
  std::vector<int64_t> shape;
  uint64_t bytes = DTypeSize(dtype);
  for (const json& dim : *it) {
    if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      FailTensor(path, name, "negative dimension in shape " + JsonSnippet(*it));
    }
    std::optional<uint64_t> d = AsUnsigned(dim);
    if (!d) FailTensor(path, name, "shape " + JsonSnippet(*it) + " is not a list of integers");
    if (*d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(bytes, *d, &bytes)) {
      FailTensor(path, name, "shape " + JsonSnippet(*it) + " overflows 64 bits");
    }
    shape.push_back(static_cast<int64_t>(*d));
  }
  *num_bytes = bytes;
  return shape;
}

// data_offsets [begin, end] relative to the data section of `data_size` bytes.
std::pair<uint64_t, uint64_t> ParseOffsets(const std::string& path, const std::string& name,
                                           const json& entry, uint64_t data_size) {
  auto it = entry.find("data_offsets");
  if (it == entry.end()) FailTensor(path, name, "has no \"data_offsets\"");
  std::optional<uint64_t> begin, end;
  if (it->is_array() && it->size() == 2) {
    begin = AsUnsigned((*it)[0]);
    end = AsUnsigned((*it)[1]);
  }
  if (!begin || !end) {
    FailTensor(path, name, "\"data_offsets\" is not [begin, end]: " + JsonSnippet(*it));
  }
  if (*begin > *end)
    FailTensor(path, name, "data_offsets " + JsonSnippet(*it) + " end before begin");
  if (*end > data_size) {
    FailTensor(path, name,
               "data_offsets " + JsonSnippet(*it) + " extend beyond the data section (" +
                   std::to_string(data_size) + " bytes)");
  }
  return {*begin, *end};
}

TensorView ParseEntry(const std::string& path, const std::string& name, const json& entry,
                      const std::byte* data, uint64_t data_size) {
  if (!entry.is_object()) FailTensor(path, name, "entry is not a JSON object");
  TensorView view;
  view.name = name;
  view.file = path;
  view.dtype = ParseDType(path, name, entry);
  uint64_t expected_bytes = 0;
  view.shape = ParseShape(path, name, entry, view.dtype, &expected_bytes);
  auto [begin, end] = ParseOffsets(path, name, entry, data_size);
  if (end - begin != expected_bytes) {
    FailTensor(path, name,
               "data_offsets cover " + std::to_string(end - begin) + " bytes but dtype " +
                   std::string(DTypeName(view.dtype)) + " x shape " + ShapeString(view.shape) +
                   " needs " + std::to_string(expected_bytes));
  }
  view.data = data + begin;
  view.num_bytes = static_cast<size_t>(expected_bytes);
  return view;
}

std::map<std::string, std::string> ParseMetadata(const std::string& path, const json& meta) {
  if (!meta.is_object()) Fail(path, "\"__metadata__\" is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) {
      Fail(path, "\"__metadata__\" value of '" + key + "' is not a string: " + JsonSnippet(value));
    }
    out[key] = value.get<std::string>();
  }
  return out;
}

// No two non-empty tensors may share a byte (an empty tensor owns no bytes).
void CheckNoOverlap(const std::string& path, const std::map<std::string, TensorView>& tensors) {
  std::vector<const TensorView*> sorted;
  for (const auto& [name, view] : tensors) {
    if (view.num_bytes > 0) sorted.push_back(&view);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorView* a, const TensorView* b) { return a->data < b->data; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    const TensorView* prev = sorted[i - 1];
    if (prev->data + prev->num_bytes > sorted[i]->data) {
      Fail(path, "tensors '" + prev->name + "' and '" + sorted[i]->name + "' overlap");
    }
  }
}

}  // namespace

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  Fd fd{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) Fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd.fd, &st) != 0) Fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) Fail(path, "not a regular file");
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    Fail(path, "truncated: " + std::to_string(size) + " bytes, less than the 8-byte header length");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (map == MAP_FAILED) Fail(path, std::string("cannot mmap: ") + std::strerror(errno));
  file->mapping_ = map;  // owned from here on: the destructor unmaps on any error below
  file->mapping_size_ = size;
  file->ParseHeader();
  return file;
}

void SafetensorsFile::ParseHeader() {
  const auto* base = static_cast<const std::byte*>(mapping_);
  const uint64_t size = mapping_size_;
  uint64_t header_len = 0;  // u64 little-endian, assembled bytewise (no alignment, any host)
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(base[i]);
  if (header_len > size - 8) {
    Fail(path_, "header length " + std::to_string(header_len) + " exceeds the file size " +
                    std::to_string(size) + " (truncated or not a safetensors file)");
  }
  if (header_len > kMaxHeaderBytes) {
    Fail(path_, "header length " + std::to_string(header_len) + " is above the 100 MB limit");
  }
  const char* text = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(text, text + header_len);
  } catch (const json::exception& e) {
    Fail(path_, std::string("header is not well-formed JSON: ") + e.what());
  }
  if (!header.is_object()) Fail(path_, "header is not a JSON object");
  const std::byte* data = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      metadata_ = ParseMetadata(path_, entry);
    } else {
      tensors_.emplace(name, ParseEntry(path_, name, entry, data, data_size));
    }
  }
  CheckNoOverlap(path_, tensors_);
}

}  // namespace llm
