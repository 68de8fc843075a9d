// llm::Tokenizer over a tokenizer.json: tokenizer_config.json's special tokens and flags, the
// prompt's special tokens, and transformers' clean-up of decoded text. The pipeline itself is
// hf::HfTokenizer (hf_tokenizer.h).
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"

namespace llm {

namespace {

// tokenizer_config.json's "<s>" or {"content": "<s>", ...}; nullopt when absent or null.
std::optional<std::string> TokenName(const nlohmann::json& config, const char* key,
                                     const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const nlohmann::json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  throw Error(path + ": " + key + ": must be a string or {\"content\": ...}");
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<hf::HfTokenizer> hf, std::unique_ptr<HfConfig> config)
    : hf_(std::move(hf)), hf_config_(std::move(config)) {}

std::unique_ptr<Tokenizer> Tokenizer::LoadHuggingFace(const std::string& json_path,
                                                      const std::string& config_path) {
  auto hf = hf::HfTokenizer::Load(json_path);
  auto config = std::make_unique<HfConfig>();
  if (!config_path.empty()) {
    const nlohmann::json c = ReadJsonFile(config_path);
    if (!c.is_object()) throw Error(config_path + ": not a JSON object");
    auto id_of = [&](const char* key, int* id) {
      const auto name = TokenName(c, key, config_path);
      if (!name) return;
      const auto found = hf->TokenToId(*name);
      if (!found) {
        throw Error(config_path + ": " + key + ": \"" + *name + "\" is not in " + json_path);
      }
      *id = *found;
    };
    id_of("bos_token", &config->bos_id);
    id_of("eos_token", &config->eos_id);
    id_of("unk_token", &config->unk_id);
    id_of("pad_token", &config->pad_id);
    auto flag = [&](const char* key, bool* value) {
      if (!c.contains(key) || c[key].is_null()) return false;
      if (!c[key].is_boolean()) throw Error(config_path + ": " + key + ": must be true or false");
      *value = c[key].get<bool>();
      return true;
    };
    const bool has_bos_flag = flag("add_bos_token", &config->add_bos);
    const bool has_eos_flag = flag("add_eos_token", &config->add_eos);
    flag("clean_up_tokenization_spaces", &config->clean_up_spaces);
    const std::string cls = c.contains("tokenizer_class") && c["tokenizer_class"].is_string()
                                ? c["tokenizer_class"].get<std::string>()
                                : "";
    const bool llama_like = cls.starts_with("LlamaTokenizer") ||
                            cls.starts_with("GemmaTokenizer") ||
                            cls.starts_with("CodeLlamaTokenizer");
    if (llama_like && (has_bos_flag || has_eos_flag)) {
      config->flags_decide = true;
      if (!has_bos_flag) config->add_bos = true;  // LlamaTokenizerFast's default
    }
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(hf), std::move(config)));
}

std::vector<int> Tokenizer::HfEncodePrompt(std::string_view text) const {
  if (!hf_config_->flags_decide) return hf_->Encode(text, /*add_special_tokens=*/true);
  std::vector<int> ids;
  if (hf_config_->add_bos && hf_config_->bos_id >= 0) ids.push_back(hf_config_->bos_id);
  const std::vector<int> body = hf_->Encode(text, /*add_special_tokens=*/false);
  ids.insert(ids.end(), body.begin(), body.end());
  if (hf_config_->add_eos && hf_config_->eos_id >= 0) ids.push_back(hf_config_->eos_id);
  return ids;
}

std::vector<int> Tokenizer::EncodeWithSpecialTokens(std::string_view text) const {
  if (hf_) return Encode(text);
  std::vector<std::pair<std::string_view, int>> specials;
  for (int id = 0; id < vocab_size(); ++id) {
    if (IsControl(id) && !IdToPiece(id).empty()) specials.emplace_back(IdToPiece(id), id);
  }
  std::vector<int> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string::npos;
    const std::pair<std::string_view, int>* hit = nullptr;
    for (const auto& sp : specials) {
      const size_t at = text.find(sp.first, pos);
      if (at < best || (at == best && hit && sp.first.size() > hit->first.size())) {
        best = at;
        hit = &sp;
      }
    }
    const size_t end = hit ? best : text.size();
    if (end > pos) {
      const std::vector<int> part = Encode(text.substr(pos, end - pos));
      ids.insert(ids.end(), part.begin(), part.end());
    }
    if (!hit) break;
    ids.push_back(hit->second);
    pos = best + hit->first.size();
  }
  return ids;
}

std::string Tokenizer::CleanUpSpaces(std::string text) const {
  if (!hf_ || !hf_config_->clean_up_spaces) return text;
  // transformers' PreTrainedTokenizerBase.clean_up_tokenization, in its order.
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    size_t pos = 0;
    for (size_t at; (at = text.find(from, pos)) != std::string::npos; pos = at + from.size()) {
      out.append(text, pos, at - pos);
      out.append(to);
    }
    out.append(text, pos);
    text = std::move(out);
  }
  return text;
}

}  // namespace llm
