// Internals of llm::Tokenizer shared by tokenizer.cc (loading, normalizing, encoding) and
// tokenizer_decode.cc (Decode, IncrementalDecoder). Not part of the engine's API.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace llm {

// SentencePiece's piece types (ModelProto.SentencePiece.Type).
enum class PieceType : uint8_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

// One (piece text, id) of a segmentation, before byte fallback and unknown merging.
// `text` points into the normalized string.
using Segment = std::pair<std::string_view, int>;

// State of SentencePiece's decoder between two ids (see DecodeId in tokenizer_decode.cc).
struct DecodeState {
  bool is_bos_ws = true;      // the next piece may still lose its leading "▁"
  bool bos_ws_seen = false;   // the previous piece lost its leading "▁"
  bool text_empty = true;     // nothing has been output yet
  std::string pending_bytes;  // bytes of <0xNN> pieces not yet turned into text
};

struct Tokenizer::Impl {
  struct Piece {
    std::string text;
    float score = 0;
    PieceType type = PieceType::kNormal;
  };

  std::string model_path;  // for error messages
  bool is_bpe = true;      // else unigram
  std::vector<Piece> pieces;
  // NORMAL, USER_DEFINED and UNUSED pieces (what merges and the lattice may produce), and
  // the others (CONTROL, UNKNOWN, BYTE), as SentencePiece keeps them apart. Keys view
  // `pieces[i].text`, which never moves after loading.
  std::unordered_map<std::string_view, int> normal_ids;
  std::unordered_map<std::string_view, int> reserved_ids;
  // Unigram only: every byte prefix of a normal piece -> its id, or -1 when the prefix is
  // not itself a piece (the trie SentencePiece walks, as a hash map).
  std::unordered_map<std::string_view, int> prefix_ids;
  // User-defined symbols, matched greedily (longest first) as whole pieces.
  std::unordered_map<std::string_view, int> user_symbols;
  std::vector<size_t> user_symbol_lengths;  // distinct lengths in bytes, longest first
  std::array<int, 256> byte_ids{};          // id of "<0xNN>" (unk_id when absent)

  int unk_id = 0;
  int bos_id = -1;
  int eos_id = -1;
  int pad_id = -1;
  bool byte_fallback = false;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  bool treat_whitespace_as_suffix = false;
  std::string unk_surface = " \xE2\x81\x87 ";
  float min_score = 0;  // over NORMAL pieces (unigram's unknown penalty base)
  float max_score = 0;  // over NORMAL pieces (unigram's user-defined bonus)
  bool add_bos = true;
  bool add_eos = false;

  bool IsType(int id, PieceType type) const {
    return id >= 0 && id < static_cast<int>(pieces.size()) && pieces[id].type == type;
  }
  // SentencePiece's ModelInterface::PieceToId: reserved pieces first, then normal, else unk.
  int LookupPiece(std::string_view piece) const;
  // Longest user-defined symbol at the start of `text`, 0 when none.
  size_t MatchUserSymbol(std::string_view text) const;

  // Encoding stages (tokenizer.cc).
  std::string Normalize(std::string_view text) const;
  std::vector<Segment> EncodeBpe(std::string_view normalized) const;
  std::vector<Segment> EncodeUnigram(std::string_view normalized) const;

  // Decoding (tokenizer_decode.cc): appends the final text for `id` to *out.
  void DecodeId(DecodeState& state, int id, std::string* out) const;
  // Turns all pending bytes into text (U+FFFD for each byte of an invalid sequence).
  void FlushBytes(DecodeState& state, std::string* out) const;
};

// tokenizer_config.json beside a tokenizer.json (tokenizer_hf.cc).
struct Tokenizer::HfConfig {
  int bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false, add_eos = false;
  // A Llama / Gemma tokenizer_class with add_bos_token or add_eos_token: transformers
  // rebuilds the post-processor as "BOS? $A EOS?" from those flags.
  bool flags_decide = false;
  bool clean_up_spaces = false;
};

// SentencePiece's UTF-8 rules (string_util::DecodeUTF8 / IsValidDecodeUTF8): the length of
// the valid character at the start of `text`, or 0 when it is malformed or cut short.
// Overlong forms, surrogates and code points above U+10FFFF are malformed.
size_t ValidUtf8CharLength(std::string_view text);

}  // namespace llm
