#include "engine/loader/make_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "engine/loader/safetensors.h"
#include "engine/model/architecture.h"
#include "engine/model/model_config.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void WriteJson(const fs::path& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw Error(path.string() + ": cannot write");
}

// Fills `out` (count elements of dtype) with uniform values of standard deviation `std`,
// or with `constant` when std == 0. Chunked with per-chunk generators: deterministic.
void FillRandom(std::vector<std::byte>& out, int64_t count, DType dtype, uint64_t seed, double std,
                float constant) {
  constexpr int64_t kChunk = 1 << 16;
  const float half_width = static_cast<float>(std * std::sqrt(3.0));
  const int64_t num_chunks = (count + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < num_chunks; ++c) {
    uint64_t state = SplitMix64(seed + static_cast<uint64_t>(c));
    const int64_t end = std::min(count, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) {
      float v = constant;
      if (std > 0) {
        state = SplitMix64(state);
        const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);  // [0,1)
        v = (2.f * u - 1.f) * half_width;
      }
      std::byte* dst = out.data() + i * static_cast<int64_t>(DTypeSize(dtype));
      if (dtype == DType::kF32) {
        std::memcpy(dst, &v, 4);
      } else {
        const uint16_t h = dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
        std::memcpy(dst, &h, 2);
      }
    }
  }
}

const char* TorchDtype(DType d) {
  return d == DType::kF32 ? "float32" : d == DType::kBF16 ? "bfloat16" : "float16";
}

}  // namespace

void MakeRandomModel(const MakeModelOptions& options) {
  json config_json = ReadJsonFile(options.config_path);
  config_json["torch_dtype"] = TorchDtype(options.dtype);
  const ModelConfig config = ModelConfig::FromJson(config_json, options.config_path);
  if (!options.tokenizer_path.empty() && !fs::exists(options.tokenizer_path)) {
    throw Error(options.tokenizer_path + ": tokenizer model not found");
  }
  const fs::path out(options.out_dir);
  fs::create_directories(out);
  WriteJson(out / "config.json", config_json);
  json gen = {{"bos_token_id", config.bos_token_id}, {"do_sample", false}};
  gen["eos_token_id"] =
      config.eos_token_ids.size() == 1 ? json(config.eos_token_ids[0]) : json(config.eos_token_ids);
  WriteJson(out / "generation_config.json", gen);
  if (!options.tokenizer_path.empty()) {
    fs::copy_file(options.tokenizer_path, out / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    json tok = {{"tokenizer_class", "LlamaTokenizer"},
                {"add_bos_token", true},
                {"add_eos_token", false},
                {"bos_token", "<s>"},
                {"eos_token", "</s>"},
                {"unk_token", "<unk>"}};
    if (!options.chat_template_path.empty()) {
      std::ifstream in(options.chat_template_path, std::ios::binary);
      if (!in) throw Error(options.chat_template_path + ": cannot open the chat template");
      tok["chat_template"] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    WriteJson(out / "tokenizer_config.json", tok);
  }

  const std::vector<TensorSpec> specs = ExpectedTensors(config);
  std::vector<SafetensorsWriter::Entry> entries;
  for (const TensorSpec& s : specs) entries.push_back({s.name, options.dtype, s.shape});
  const double init_std = config_json.value("initializer_range", 0.02);
  SafetensorsWriter writer(
      (out / "model.safetensors").string(), entries,
      {{"generator", "llm make-model"}, {"seed", std::to_string(options.seed)}});
  std::vector<std::byte> buffer;
  for (const TensorSpec& s : specs) {
    int64_t count = 1;
    for (int64_t d : s.shape) count *= d;
    buffer.resize(static_cast<size_t>(count) * DTypeSize(options.dtype));
    const bool is_norm = s.shape.size() == 1;  // RMSNorm weights start at 1.0
    FillRandom(buffer, count, options.dtype, SplitMix64(options.seed ^ HashName(s.name)),
               is_norm ? 0.0 : init_std, 1.0f);
    writer.Write(s.name, buffer.data(), buffer.size());
  }
  writer.Close();
}

}  // namespace llm
