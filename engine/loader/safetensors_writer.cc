// Writing safetensors files: WriteSafetensors (whole tensors in memory) and the streaming
// SafetensorsWriter (header first, then each tensor's bytes in declaration order).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/error.h"
#include "engine/loader/safetensors.h"
#include "engine/loader/safetensors_util.h"

namespace llm {
namespace {

using nlohmann::json;

// stdio buffer: many small tensors (norm weights) coalesce into few write() calls; large
// tensors bypass it anyway.
constexpr size_t kWriteBuffer = 8 << 20;

// dtype x shape in bytes, with every multiplication checked (64-bit: 16+ GB files are fine).
uint64_t EntryBytes(const std::string& path, const SafetensorsWriter::Entry& e) {
  uint64_t bytes = DTypeSize(e.dtype);
  for (int64_t d : e.shape) {
    if (d < 0) {
      throw Error(path + ": tensor '" + e.name + "' has a negative dimension in shape " +
                  ShapeString(e.shape));
    }
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      throw Error(path + ": tensor '" + e.name + "' shape " + ShapeString(e.shape) +
                  " overflows 64 bits");
    }
  }
  return bytes;
}

// The JSON header, padded with spaces to a multiple of 8 bytes as the reference
// implementation does (so the data section starts 8-aligned). Fills `sizes`.
std::string BuildHeader(const std::string& path,
                        const std::vector<SafetensorsWriter::Entry>& entries,
                        const std::map<std::string, std::string>& metadata,
                        std::vector<uint64_t>* sizes) {
  json header = json::object();
  json meta = {{"format", "pt"}};
  for (const auto& [key, value] : metadata) meta[key] = value;
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const SafetensorsWriter::Entry& e : entries) {
    if (e.name == "__metadata__" || header.contains(e.name)) {
      throw Error(path + ": tensor name '" + e.name + "' is reserved or given twice");
    }
    uint64_t bytes = EntryBytes(path, e);
    if (__builtin_add_overflow(offset, bytes, &offset)) {
      throw Error(path + ": tensor '" + e.name + "' makes the file larger than 2^64 bytes");
    }
    header[e.name] = {{"dtype", std::string(DTypeName(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset - bytes, offset}}};
    sizes->push_back(bytes);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // e.g. a name that is not valid UTF-8
    throw Error(path + ": cannot encode the header: " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

struct SafetensorsWriter::Impl {
  std::string path;
  std::vector<Entry> entries;
  std::vector<uint64_t> sizes;  // bytes of each entry
  size_t next = 0;              // index of the next tensor to write
  FILE* file = nullptr;
  std::vector<char> buffer;

  // A writer destroyed before Close (an exception on the way, also from the constructor)
  // leaves no half-written file that would later fail to load with a confusing message.
  ~Impl() {
    if (file != nullptr) {
      std::fclose(file);
      std::remove(path.c_str());
    }
  }

  void WriteRaw(const void* bytes, size_t n) {
    // fwrite of a few GB is fine on 64-bit Linux, but loop in 1 GB pieces to be safe with
    // short writes and to report errno close to the failure.
    const char* p = static_cast<const char*>(bytes);
    while (n > 0) {
      size_t chunk = std::min<size_t>(n, size_t{1} << 30);
      if (std::fwrite(p, 1, chunk, file) != chunk) {
        throw Error(path + ": write failed: " + std::strerror(errno));
      }
      p += chunk;
      n -= chunk;
    }
  }
};

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<Entry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->entries = std::move(entries);
  std::string header = BuildHeader(path, impl_->entries, metadata, &impl_->sizes);
  impl_->file = std::fopen(path.c_str(), "wb");
  if (impl_->file == nullptr) throw Error(path + ": cannot create: " + std::strerror(errno));
  impl_->buffer.resize(kWriteBuffer);
  std::setvbuf(impl_->file, impl_->buffer.data(), _IOFBF, impl_->buffer.size());
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(uint64_t{header.size()} >> (8 * i));
  impl_->WriteRaw(len, sizeof(len));
  impl_->WriteRaw(header.data(), header.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::Write(const std::string& name, const void* bytes, size_t num_bytes) {
  Impl& s = *impl_;
  if (s.file == nullptr) throw Error(s.path + ": Write('" + name + "') after Close");
  if (s.next >= s.entries.size()) {
    throw Error(s.path + ": tensor '" + name + "' written but all tensors are already written");
  }
  const Entry& e = s.entries[s.next];
  if (name != e.name) {
    throw Error(s.path + ": tensor '" + name + "' written out of order, expected '" + e.name + "'");
  }
  if (num_bytes != s.sizes[s.next]) {
    throw Error(s.path + ": tensor '" + name + "' got " + std::to_string(num_bytes) +
                " bytes, dtype " + std::string(DTypeName(e.dtype)) + " x shape " +
                ShapeString(e.shape) + " needs " + std::to_string(s.sizes[s.next]));
  }
  s.WriteRaw(bytes, num_bytes);
  ++s.next;
}

void SafetensorsWriter::Close() {
  Impl& s = *impl_;
  if (s.file == nullptr) return;
  if (s.next < s.entries.size()) {
    throw Error(s.path + ": closed before tensor '" + s.entries[s.next].name + "' was written");
  }
  FILE* f = s.file;
  s.file = nullptr;
  bool ok = std::fflush(f) == 0;
  int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(s.path.c_str());
    throw Error(s.path + ": write failed: " + std::strerror(err ? err : errno));
  }
}

void WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorData*> sorted;
  for (const TensorData& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorData* a, const TensorData* b) { return a->name < b->name; });
  std::vector<SafetensorsWriter::Entry> entries;
  for (const TensorData* t : sorted) entries.push_back({t->name, t->dtype, t->shape});
  SafetensorsWriter writer(path, std::move(entries), metadata);
  for (const TensorData* t : sorted) writer.Write(t->name, t->bytes.data(), t->bytes.size());
  writer.Close();
}

}  // namespace llm
