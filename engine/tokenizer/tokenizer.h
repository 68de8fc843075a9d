// Our own SentencePiece tokenizer (the server process must not link libsentencepiece:
// DESIGN.md). Reads `tokenizer.model` (a serialized sentencepiece ModelProto, parsed with
// protobuf from engine/tokenizer/sentencepiece_model.proto) and `tokenizer_config.json`.
//
// Encode implements SentencePiece's BPE (merge by piece score, byte fallback to <0xNN>,
// unknown, control and user-defined pieces) and unigram (Viterbi) algorithms with the
// normalizer spec's dummy-prefix / whitespace-escape / extra-whitespace rules; the results
// equal the real library's (differential tests in tests/engine/tokenizer_*_test.cc).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llm {

struct DecodeState;  // engine/tokenizer/tokenizer_impl.h

class Tokenizer {
 public:
  // <dir>/tokenizer.model plus, when present, <dir>/tokenizer_config.json
  // (add_bos_token, add_eos_token, bos/eos/unk/pad tokens). Throws llm::Error.
  static std::unique_ptr<Tokenizer> Load(const std::string& model_dir);
  // Only a tokenizer.model file; add_bos_token = true, add_eos_token = false.
  static std::unique_ptr<Tokenizer> FromFile(const std::string& tokenizer_model_path);
  ~Tokenizer();

  // What SentencePieceProcessor::Encode(text) returns: no BOS/EOS. `text` may hold any
  // bytes: each byte of malformed UTF-8 is read as U+FFFD, as the library does.
  std::vector<int> Encode(std::string_view text) const;
  // Encode plus BOS/EOS as tokenizer_config.json says: the model's input for a prompt.
  std::vector<int> EncodePrompt(std::string_view text) const;
  // What SentencePieceProcessor::Decode(ids) returns (control tokens decode to "").
  // Ids outside [0, vocab_size()) decode to "" (the library refuses the whole call).
  std::string Decode(std::span<const int> ids) const;

  int vocab_size() const;
  std::string_view IdToPiece(int id) const;
  int PieceToId(std::string_view piece) const;  // unk_id() when absent
  bool IsControl(int id) const;
  bool IsByte(int id) const;
  int bos_id() const;
  int eos_id() const;
  int unk_id() const;
  int pad_id() const;  // -1 when none
  bool add_bos_token() const;
  bool add_eos_token() const;

  struct Impl;

 private:
  friend class IncrementalDecoder;  // runs Impl's per-id decoding state machine
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: text is released only when it is final. The concatenation of
// every Push() result and Flush() equals Decode(context + pushed) minus Decode(context),
// so a continuation of a prompt gets its leading space right ("▁there" after a prompt
// yields " there"; at the very start of a text the dummy-prefix space is dropped).
// Never emits a partial UTF-8 character: bytes of an unfinished sequence are held back
// until it completes (or become U+FFFD exactly where Decode would put one).
// O(1) work per id: it keeps Decode's state (not the ids), so long generations stay cheap.
// (A context that ends inside an unfinished byte sequence is taken as Decode(context)
// renders it, U+FFFD per byte; pushed bytes never complete the context's character.)
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, std::span<const int> context_ids = {});
  ~IncrementalDecoder();
  IncrementalDecoder(IncrementalDecoder&&) = default;
  // The text that `id` makes final (often "", e.g. for the first bytes of an emoji).
  std::string Push(int id);
  // Everything still held back (unfinished bytes become U+FFFD, as in Decode).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::unique_ptr<DecodeState> state_;
};

}  // namespace llm
