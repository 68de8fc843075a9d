// Hugging Face safetensors checkpoints: memory-mapped reading with full validation, and
// writing (used by `llm make-model`).
//
// File format: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32"|"F16"|"BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"k": "v"}}
// then the data section; offsets are relative to the data section.
//
// Every failure throws llm::Error whose message names the file and, where there is one,
// the tensor: header length beyond the file or above 100 MB, malformed JSON, unknown dtype,
// negative or overflowing shape, offsets out of bounds / overlapping / not covering the
// declared dtype x shape bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace llm {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // points into the mapping; valid while the file lives
  size_t num_bytes = 0;
  std::string file;  // path of the file it lives in (for error messages)

  int64_t num_elements() const;
};

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  // Maps and validates the whole header. Throws llm::Error.
  static std::unique_ptr<SafetensorsFile> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const TensorView* Find(const std::string& name) const;  // nullptr when absent
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void ParseHeader();  // validates the mapped header and fills tensors_ / metadata_
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` ({"weight_map": {"tensor": "file"}}). A tensor listed in
// the index must exist in the named shard; a tensor present in two files is an error.
class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> Open(const std::string& model_dir);

  const TensorView* Find(const std::string& name) const;
  // Throws llm::Error("<dir>: tensor '<name>' is missing") when absent.
  const TensorView& Get(const std::string& name) const;
  // Throws llm::Error naming file and tensor unless the tensor exists with exactly `shape`.
  const TensorView& GetWithShape(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;

  void AddFile(std::unique_ptr<SafetensorsFile> file);  // indexes it; duplicates throw
  void OpenSharded(const std::string& index_path);
};

// A tensor to write: raw little-endian bytes of dtype x shape.
struct TensorData {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

// Writes one safetensors file (tensors sorted by name, 8-byte aligned header, metadata
// {"format": "pt"} plus `metadata`). Throws llm::Error on I/O failure.
void WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Streaming writer for large checkpoints: declare every tensor first, then supply each
// tensor's bytes in declaration order (so a 16 GB model never sits in memory at once).
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, std::vector<Entry> entries,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // Writes the next tensor (in the order given to the constructor). `bytes` must be exactly
  // dtype x shape long.
  void Write(const std::string& name, const void* bytes, size_t num_bytes);
  void Close();  // checks every tensor was written

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llm
