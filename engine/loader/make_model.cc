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
#include "engine/tokenizer/tokenizer.h"

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

// --tokenizer: a tokenizer.model or tokenizer.json file, or a folder holding either (with its
// tokenizer_config.json); tokenizer.json wins when a folder has both.
struct TokenizerSource {
  std::string json_file, config_file, model_file;
};

TokenizerSource FindTokenizer(const std::string& path) {
  TokenizerSource source;
  if (path.empty()) return source;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "tokenizer.json", ec)) {
      source.json_file = (dir / "tokenizer.json").string();
    } else if (fs::exists(dir / "tokenizer.model", ec)) {
      source.model_file = (dir / "tokenizer.model").string();
    } else {
      throw Error(path + ": no tokenizer.json or tokenizer.model in this folder");
    }
    if (!source.json_file.empty() && fs::exists(dir / "tokenizer_config.json", ec)) {
      source.config_file = (dir / "tokenizer_config.json").string();
    }
    return source;
  }
  if (!fs::exists(path, ec)) throw Error(path + ": tokenizer not found");
  if (fs::path(path).extension() == ".json") {
    source.json_file = path;
    const fs::path config = fs::path(path).parent_path() / "tokenizer_config.json";
    if (fs::exists(config, ec)) source.config_file = config.string();
  } else {
    source.model_file = path;
  }
  return source;
}

const char* TorchDtype(DType d) {
  return d == DType::kF32 ? "float32" : d == DType::kBF16 ? "bfloat16" : "float16";
}

}  // namespace

void MakeRandomModel(const MakeModelOptions& options) {
  json config_json = ReadJsonFile(options.config_path);
  config_json["torch_dtype"] = TorchDtype(options.dtype);
  const ModelConfig config = ModelConfig::FromJson(config_json, options.config_path);
  const TokenizerSource source = FindTokenizer(options.tokenizer_path);
  const fs::path out(options.out_dir);
  fs::create_directories(out);
  WriteJson(out / "config.json", config_json);
  json gen = {{"bos_token_id", config.bos_token_id}, {"do_sample", false}};
  gen["eos_token_id"] =
      config.eos_token_ids.size() == 1 ? json(config.eos_token_ids[0]) : json(config.eos_token_ids);
  WriteJson(out / "generation_config.json", gen);
  json tok;
  if (!source.json_file.empty()) {  // Hugging Face: tokenizer.json and its config as they are
    fs::copy_file(source.json_file, out / "tokenizer.json", fs::copy_options::overwrite_existing);
    tok = source.config_file.empty() ? json::object() : ReadJsonFile(source.config_file);
  } else if (!source.model_file.empty()) {
    fs::copy_file(source.model_file, out / "tokenizer.model", fs::copy_options::overwrite_existing);
    tok = {{"tokenizer_class", "LlamaTokenizer"},
           {"add_bos_token", true},
           {"add_eos_token", false},
           {"bos_token", "<s>"},
           {"eos_token", "</s>"},
           {"unk_token", "<unk>"}};
  }
  if (!options.tokenizer_path.empty()) {
    if (!options.chat_template_path.empty()) {
      std::ifstream in(options.chat_template_path, std::ios::binary);
      if (!in) throw Error(options.chat_template_path + ": cannot open the chat template");
      tok["chat_template"] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    WriteJson(out / "tokenizer_config.json", tok);
    // Every id the tokenizer can produce must have an embedding row.
    const int tokenizer_vocab = Tokenizer::Load(out.string())->vocab_size();
    if (tokenizer_vocab > config.vocab_size) {
      throw Error(options.config_path + ": vocab_size " + std::to_string(config.vocab_size) +
                  " is smaller than the tokenizer's " + std::to_string(tokenizer_vocab) + " ids (" +
                  options.tokenizer_path + ")");
    }
  }

  const std::vector<TensorSpec> specs = ExpectedTensors(config);
  std::vector<SafetensorsWriter::Entry> entries;
  for (const TensorSpec& s : specs) entries.push_back({s.name, options.dtype, s.shape});
  const double init_std = config_json.value("initializer_range", 0.02);
  const bool offset_norms = ArchitectureOf(config).features.norm == NormStyle::kRmsNormOffset;
  SafetensorsWriter writer(
      (out / "model.safetensors").string(), entries,
      {{"generator", "llm make-model"}, {"seed", std::to_string(options.seed)}});
  std::vector<std::byte> buffer;
  for (const TensorSpec& s : specs) {
    int64_t count = 1;
    for (int64_t d : s.shape) count *= d;
    buffer.resize(static_cast<size_t>(count) * DTypeSize(options.dtype));
    // Vectors are constants: RMSNorm weights 1.0 (0.0 where the norm scales by 1 + w, as
    // Gemma's), biases 0.
    const bool is_vector = s.shape.size() == 1;
    const float constant = IsBias(s.weight->role) || offset_norms ? 0.0f : 1.0f;
    FillRandom(buffer, count, options.dtype, SplitMix64(options.seed ^ HashName(s.name)),
               is_vector ? 0.0 : init_std, constant);
    writer.Write(s.name, buffer.data(), buffer.size());
  }
  writer.Close();
}

}  // namespace llm
