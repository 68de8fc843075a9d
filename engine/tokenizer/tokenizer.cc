// Loading and encoding of llm::Tokenizer: SentencePiece's identity normalizer, BPE merges
// and unigram Viterbi, written to give exactly the ids of SentencePieceProcessor::Encode
// (libsentencepiece 0.1.97, checked by tests/engine/tokenizer/tokenizer_oracle_test.cc).
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/error.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"
#include "sentencepiece_model.pb.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using sentencepiece::ModelProto;
using sentencepiece::TrainerSpec;

std::string ReadWholeFile(const std::string& path, const char* what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw Error(std::string(what) + " not found: " + path);
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in.good() && !in.eof()) throw Error(std::string("cannot read ") + what + ": " + path);
  return bytes.str();
}

// "<0x41>" -> 0x41; -1 when `piece` is not a byte piece's text.
int PieceToByte(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    int digit = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

std::string ByteToPiece(int byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">";
}

// Fills impl.pieces and the lookup maps; throws on what SentencePiece also refuses.
void InitPieces(const ModelProto& proto, Tokenizer::Impl& impl) {
  const std::string& path = impl.model_path;
  if (proto.pieces_size() == 0) throw Error(path + ": the model has no pieces");
  impl.pieces.resize(proto.pieces_size());
  impl.unk_id = -1;
  for (int i = 0; i < proto.pieces_size(); ++i) {
    const auto& sp = proto.pieces(i);
    auto& piece = impl.pieces[i];
    piece = {sp.piece(), sp.score(), static_cast<PieceType>(sp.type())};
    if (piece.text.empty() || piece.text.find('\0') != std::string::npos) {
      throw Error(path + ": piece " + std::to_string(i) + " is empty or contains NUL");
    }
  }
  for (int i = 0; i < static_cast<int>(impl.pieces.size()); ++i) {
    const auto& piece = impl.pieces[i];
    const bool is_normal = piece.type == PieceType::kNormal ||
                           piece.type == PieceType::kUserDefined ||
                           piece.type == PieceType::kUnused;
    auto& map = is_normal ? impl.normal_ids : impl.reserved_ids;
    if (!map.emplace(piece.text, i).second) {
      throw Error(path + ": piece '" + piece.text + "' is defined twice");
    }
    if (piece.type == PieceType::kUserDefined) impl.user_symbols.emplace(piece.text, i);
    if (piece.type == PieceType::kUnknown) {
      if (impl.unk_id >= 0) throw Error(path + ": more than one unknown piece");
      impl.unk_id = i;
    }
    if (piece.type == PieceType::kByte && (!impl.byte_fallback || PieceToByte(piece.text) < 0)) {
      throw Error(path + ": unexpected byte piece '" + piece.text + "'");
    }
  }
  if (impl.unk_id < 0) throw Error(path + ": the model defines no unknown piece");
}

// Derived tables: user-symbol lengths, byte ids, score range, the unigram prefix map.
void InitTables(Tokenizer::Impl& impl) {
  for (const auto& [text, id] : impl.user_symbols) impl.user_symbol_lengths.push_back(text.size());
  std::sort(impl.user_symbol_lengths.begin(), impl.user_symbol_lengths.end(), std::greater<>());
  impl.user_symbol_lengths.erase(
      std::unique(impl.user_symbol_lengths.begin(), impl.user_symbol_lengths.end()),
      impl.user_symbol_lengths.end());
  for (int b = 0; b < 256; ++b) impl.byte_ids[b] = impl.LookupPiece(ByteToPiece(b));
  // As SentencePiece: FLT_MAX / FLT_MIN (the smallest positive float) before the scan.
  impl.min_score = std::numeric_limits<float>::max();
  impl.max_score = std::numeric_limits<float>::min();
  for (const auto& piece : impl.pieces) {
    if (piece.type != PieceType::kNormal) continue;
    impl.min_score = std::min(impl.min_score, piece.score);
    impl.max_score = std::max(impl.max_score, piece.score);
  }
  if (impl.is_bpe) return;
  for (const auto& [text, id] : impl.normal_ids) {
    for (size_t len = 1; len < text.size(); ++len) impl.prefix_ids.emplace(text.substr(0, len), -1);
  }
  for (const auto& [text, id] : impl.normal_ids) impl.prefix_ids[text] = id;
}

// The id of a control piece named by the trainer spec (bos/eos/pad), or -1.
int ControlId(const Tokenizer::Impl& impl, const std::string& piece) {
  const int id = impl.LookupPiece(piece);
  return impl.IsType(id, PieceType::kControl) ? id : -1;
}

std::unique_ptr<Tokenizer::Impl> LoadModel(const std::string& path) {
  const std::string bytes = ReadWholeFile(path, "tokenizer model");
  ModelProto proto;
  if (!proto.ParseFromString(bytes)) {
    throw Error(path + ": not a valid SentencePiece model (ModelProto does not parse)");
  }
  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->model_path = path;
  const TrainerSpec& trainer = proto.trainer_spec();
  if (trainer.model_type() != TrainerSpec::BPE && trainer.model_type() != TrainerSpec::UNIGRAM) {
    throw Error(path + ": unsupported SentencePiece model type " +
                TrainerSpec::ModelType_Name(trainer.model_type()) + " (only BPE and UNIGRAM)");
  }
  const auto& normalizer = proto.normalizer_spec();
  if (!normalizer.precompiled_charsmap().empty()) {
    throw Error(path + ": unsupported normalizer '" + normalizer.name() +
                "' (it has a precompiled character map; only identity normalization is "
                "implemented)");
  }
  impl->is_bpe = trainer.model_type() == TrainerSpec::BPE;
  impl->byte_fallback = trainer.byte_fallback();
  impl->treat_whitespace_as_suffix = trainer.treat_whitespace_as_suffix();
  impl->unk_surface = trainer.has_unk_surface() ? trainer.unk_surface() : " \xE2\x81\x87 ";
  impl->add_dummy_prefix = normalizer.add_dummy_prefix();
  impl->remove_extra_whitespaces = normalizer.remove_extra_whitespaces();
  impl->escape_whitespaces = normalizer.escape_whitespaces();
  InitPieces(proto, *impl);
  InitTables(*impl);
  auto name_or = [](const std::string& name, const char* fallback) {
    return name.empty() ? std::string(fallback) : name;
  };
  impl->bos_id = ControlId(*impl, name_or(trainer.bos_piece(), "<s>"));
  impl->eos_id = ControlId(*impl, name_or(trainer.eos_piece(), "</s>"));
  impl->pad_id = ControlId(*impl, name_or(trainer.pad_piece(), "<pad>"));
  return impl;
}

// tokenizer_config.json: add_bos_token / add_eos_token and the special tokens' names.
void ApplyConfig(const std::string& path, Tokenizer::Impl& impl) {
  const auto config = nlohmann::json::parse(ReadWholeFile(path, "tokenizer config"), nullptr,
                                            /*allow_exceptions=*/false);
  if (!config.is_object()) throw Error(path + ": not a JSON object");
  auto read_bool = [&](const char* key, bool* value) {
    if (!config.contains(key) || config[key].is_null()) return;
    if (!config[key].is_boolean()) throw Error(path + ": " + key + " must be true or false");
    *value = config[key].get<bool>();
  };
  read_bool("add_bos_token", &impl.add_bos);
  read_bool("add_eos_token", &impl.add_eos);
  // A token is "<s>" or {"content": "<s>", ...}; names missing from the vocabulary are ignored.
  auto read_token = [&](const char* key, int* id) {
    if (!config.contains(key)) return;
    const auto& token = config[key];
    const auto* name = token.is_object() && token.contains("content") ? &token["content"] : &token;
    if (!name->is_string()) return;
    const std::string text = name->get<std::string>();
    const int found = impl.LookupPiece(text);
    if (impl.pieces[found].text == text) *id = found;
  };
  read_token("bos_token", &impl.bos_id);
  read_token("eos_token", &impl.eos_id);
  read_token("pad_token", &impl.pad_id);
}

}  // namespace

int Tokenizer::Impl::LookupPiece(std::string_view piece) const {
  if (auto it = reserved_ids.find(piece); it != reserved_ids.end()) return it->second;
  if (auto it = normal_ids.find(piece); it != normal_ids.end()) return it->second;
  return unk_id;
}

size_t Tokenizer::Impl::MatchUserSymbol(std::string_view text) const {
  for (size_t len : user_symbol_lengths) {
    if (len <= text.size() && user_symbols.count(text.substr(0, len)) > 0) return len;
  }
  return 0;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::FromFile(const std::string& tokenizer_path) {
  if (fs::path(tokenizer_path).extension() == ".json") return LoadHuggingFace(tokenizer_path, "");
  return std::unique_ptr<Tokenizer>(new Tokenizer(LoadModel(tokenizer_path)));
}

std::unique_ptr<Tokenizer> Tokenizer::Load(const std::string& model_dir) {
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  std::error_code ec;
  const bool has_config = fs::exists(config_path, ec);
  if (const fs::path json_path = fs::path(model_dir) / "tokenizer.json";
      fs::exists(json_path, ec)) {
    return LoadHuggingFace(json_path.string(), has_config ? config_path : "");
  }
  auto impl = LoadModel((fs::path(model_dir) / "tokenizer.model").string());
  if (has_config) ApplyConfig(config_path, *impl);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int> Tokenizer::EncodePrompt(std::string_view text) const {
  if (hf_) return HfEncodePrompt(text);
  std::vector<int> ids;
  if (impl_->add_bos && impl_->bos_id >= 0) ids.push_back(impl_->bos_id);
  const std::vector<int> body = Encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (impl_->add_eos && impl_->eos_id >= 0) ids.push_back(impl_->eos_id);
  return ids;
}

int Tokenizer::vocab_size() const {
  return hf_ ? hf_->vocab_size() : static_cast<int>(impl_->pieces.size());
}

std::string_view Tokenizer::IdToPiece(int id) const {
  if (hf_) return hf_->IdToToken(id);
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->pieces[id].text;
}

int Tokenizer::PieceToId(std::string_view piece) const {
  if (hf_) return hf_->TokenToId(piece).value_or(unk_id());
  return impl_->LookupPiece(piece);
}
bool Tokenizer::IsControl(int id) const {
  return hf_ ? hf_->IsSpecial(id) : impl_->IsType(id, PieceType::kControl);
}
std::optional<std::string> Tokenizer::TokenBytes(int id) const {
  if (hf_) return hf_->TokenBytes(id);
  if (id < 0 || id >= vocab_size() || id == impl_->unk_id) return std::nullopt;
  if (impl_->IsType(id, PieceType::kControl) || impl_->IsType(id, PieceType::kUnknown) ||
      impl_->IsType(id, PieceType::kUnused)) {
    return std::nullopt;
  }
  const std::string& piece = impl_->pieces[size_t(id)].text;
  if (impl_->IsType(id, PieceType::kByte)) {
    return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  }
  std::string out;
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.compare(pos, 3, "\xE2\x96\x81") == 0) {
      out.push_back(' ');
      pos += 3;
    } else {
      out.push_back(piece[pos++]);
    }
  }
  return out;
}

bool Tokenizer::IsByte(int id) const {
  return hf_ ? hf_->IsByteToken(id) : impl_->IsType(id, PieceType::kByte);
}
int Tokenizer::bos_id() const { return hf_ ? hf_config_->bos_id : impl_->bos_id; }
int Tokenizer::eos_id() const { return hf_ ? hf_config_->eos_id : impl_->eos_id; }
int Tokenizer::unk_id() const { return hf_ ? hf_config_->unk_id : impl_->unk_id; }
int Tokenizer::pad_id() const { return hf_ ? hf_config_->pad_id : impl_->pad_id; }
bool Tokenizer::add_bos_token() const { return hf_ ? hf_config_->add_bos : impl_->add_bos; }
bool Tokenizer::add_eos_token() const { return hf_ ? hf_config_->add_eos : impl_->add_eos; }

}  // namespace llm
