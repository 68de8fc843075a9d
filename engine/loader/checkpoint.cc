// Checkpoint: every tensor of a model folder, from `model.safetensors` or from the shards
// named by `model.safetensors.index.json`.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "engine/loader/safetensors.h"
#include "engine/loader/safetensors_util.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// weight_map {"tensor": "shard file"} grouped as shard -> tensors it must hold. Shard names
// must be plain file names inside the model folder (no path components).
std::map<std::string, std::vector<std::string>> ReadWeightMap(const std::string& index_path) {
  json index = ReadJsonFile(index_path);
  if (!index.is_object()) throw Error(index_path + ": not a JSON object");
  auto it = index.find("weight_map");
  if (it == index.end() || !it->is_object()) {
    throw Error(index_path + ": \"weight_map\" is missing or not a JSON object");
  }
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [tensor, shard] : it->items()) {
    if (!shard.is_string()) {
      throw Error(index_path + ": weight_map entry for tensor '" + tensor + "' is not a string");
    }
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      throw Error(index_path + ": weight_map entry for tensor '" + tensor + "' names shard '" +
                  name + "', which is not a plain file name");
    }
    shards[name].push_back(tensor);
  }
  if (shards.empty()) throw Error(index_path + ": \"weight_map\" is empty");
  return shards;
}

}  // namespace

void Checkpoint::AddFile(std::unique_ptr<SafetensorsFile> file) {
  for (const auto& [name, view] : file->tensors()) {
    auto [it, inserted] = index_.emplace(name, &view);
    if (!inserted) {
      throw Error(dir_ + ": tensor '" + name + "' is present in both " + it->second->file +
                  " and " + file->path());
    }
  }
  files_.push_back(std::move(file));
}

void Checkpoint::OpenSharded(const std::string& index_path) {
  // Each shard is opened once, however many tensors the index assigns to it.
  for (const auto& [shard, tensors] : ReadWeightMap(index_path)) {
    const std::string shard_path = (fs::path(dir_) / shard).string();
    std::error_code ec;
    if (!fs::exists(shard_path, ec)) {
      throw Error(shard_path + ": shard '" + shard + "' listed in " + index_path +
                  " does not exist");
    }
    std::unique_ptr<SafetensorsFile> file = SafetensorsFile::Open(shard_path);
    for (const std::string& tensor : tensors) {
      if (file->Find(tensor) == nullptr) {
        throw Error(shard_path + ": tensor '" + tensor + "' is listed for this shard in " +
                    index_path + " but is absent from it");
      }
    }
    AddFile(std::move(file));
  }
}

std::unique_ptr<Checkpoint> Checkpoint::Open(const std::string& model_dir) {
  auto checkpoint = std::make_unique<Checkpoint>();
  checkpoint->dir_ = model_dir;
  const std::string index_path = (fs::path(model_dir) / kIndexFile).string();
  const std::string single_path = (fs::path(model_dir) / kSingleFile).string();
  std::error_code ec;
  // Like transformers' from_pretrained, a single model.safetensors wins over an index.
  if (fs::exists(single_path, ec)) {
    checkpoint->AddFile(SafetensorsFile::Open(single_path));
  } else if (fs::exists(index_path, ec)) {
    checkpoint->OpenSharded(index_path);
  } else {
    throw Error(model_dir + ": no checkpoint found (neither " + kSingleFile + " nor " + kIndexFile +
                " exists)");
  }
  return checkpoint;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& Checkpoint::Get(const std::string& name) const {
  const TensorView* view = Find(name);
  if (view == nullptr) throw Error(dir_ + ": tensor '" + name + "' is missing");
  return *view;
}

const TensorView& Checkpoint::GetWithShape(const std::string& name,
                                           const std::vector<int64_t>& shape) const {
  const TensorView* view = Find(name);
  if (view == nullptr) {
    throw Error(dir_ + ": tensor '" + name + "' is missing (expected shape " + ShapeString(shape) +
                ")");
  }
  if (view->shape != shape) {
    throw Error(view->file + ": tensor '" + name + "' has shape " + ShapeString(view->shape) +
                ", expected " + ShapeString(shape));
  }
  return *view;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, view] : index_) out.push_back(name);
  return out;
}

}  // namespace llm
