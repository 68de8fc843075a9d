// The model's tokenizer, one of two formats, both our own code:
//   - Hugging Face's `tokenizer.json` (engine/tokenizer/hf_*.cc): added tokens, normalizer,
//     pre-tokenizer (PCRE2 regexes), BPE, post-processor and decoder chain as the `tokenizers`
//     library runs them; ids and text equal the library's (tests/engine/tokenizer/
//     tokenizer_hf_oracle_test.cc runs the library itself, from npm, in its own process).
//   - SentencePiece's `tokenizer.model` (a serialized ModelProto, parsed with protobuf from
//     sentencepiece_model.proto; the server process must not link libsentencepiece:
//     DESIGN.md): BPE (merge by piece score, byte fallback to <0xNN>, unknown, control and
//     user-defined pieces) and unigram (Viterbi) with the normalizer spec's dummy-prefix /
//     whitespace-escape / extra-whitespace rules, equal to the real library's.
// A folder with both uses tokenizer.json, as Hugging Face's fast tokenizers do.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llm {

struct DecodeState;  // engine/tokenizer/tokenizer_impl.h
namespace hf {
class HfTokenizer;  // engine/tokenizer/hf_tokenizer.h
struct HfDecodeState;
}  // namespace hf

class Tokenizer {
 public:
  // <dir>/tokenizer.json, else <dir>/tokenizer.model, plus <dir>/tokenizer_config.json when
  // present (add_bos_token, add_eos_token, bos/eos/unk/pad tokens, tokenizer_class,
  // clean_up_tokenization_spaces). Throws llm::Error naming the file and the field.
  static std::unique_ptr<Tokenizer> Load(const std::string& model_dir);
  // Only a tokenizer.json (by its name) or tokenizer.model file; for tokenizer.model
  // add_bos_token = true, add_eos_token = false.
  static std::unique_ptr<Tokenizer> FromFile(const std::string& tokenizer_path);
  ~Tokenizer();

  // No BOS/EOS added. tokenizer.json: the library's encode(text, add_special_tokens=False)
  // (added tokens written in the text, such as "<|im_start|>", become their ids).
  // tokenizer.model: SentencePieceProcessor::Encode(text) (control pieces are plain text).
  // `text` may hold any bytes: malformed UTF-8 is read as the libraries read it (U+FFFD).
  std::vector<int> Encode(std::string_view text) const;
  // The model's input for a prompt: Encode plus the special tokens the tokenizer adds.
  // tokenizer.json: its post-processor (encode(text) with add_special_tokens), except that a
  // Llama or Gemma tokenizer_class with add_bos_token / add_eos_token in tokenizer_config.json
  // adds BOS / EOS as those say (transformers rebuilds the post-processor for them).
  // tokenizer.model: BOS / EOS as tokenizer_config.json says.
  std::vector<int> EncodePrompt(std::string_view text) const;
  // A rendered chat template: special tokens written as text become their ids. For
  // tokenizer.json that is Encode; for tokenizer.model the control pieces are split out and
  // the text between them encoded (SentencePiece's "legacy" behaviour, as Hugging Face's slow
  // Llama tokenizer does).
  std::vector<int> EncodeWithSpecialTokens(std::string_view text) const;
  // tokenizer.json: the library's decode(ids, skip_special_tokens); ids outside the vocabulary
  // are dropped, as it drops them. tokenizer.model: SentencePieceProcessor::Decode(ids)
  // (control tokens always decode to ""; ids outside the vocabulary decode to "").
  std::string Decode(std::span<const int> ids, bool skip_special_tokens = true) const;
  // transformers' clean_up_tokenization (" ." -> ".", " n't" -> "n't", ...) on `text` when
  // tokenizer_config.json sets clean_up_tokenization_spaces; `text` unchanged otherwise.
  std::string CleanUpSpaces(std::string text) const;

  int vocab_size() const;
  std::string_view IdToPiece(int id) const;
  int PieceToId(std::string_view piece) const;  // unk_id() when absent (-1 when none)
  // A control piece (tokenizer.model) or a special added token (tokenizer.json).
  bool IsControl(int id) const;
  bool IsByte(int id) const;  // a <0xNN> byte-fallback piece
  // The bytes `id` adds to the output when it follows other tokens (how a completion's
  // tokens decode after its prompt): byte-level BPE's bytes, "▁" as " ", a <0xNN> piece as
  // its one byte (possibly part of a UTF-8 character). nullopt for a control / special
  // token, the unknown piece of a tokenizer.model, or an id outside the vocabulary. The
  // grammar engine (engine/grammar) matches these bytes.
  std::optional<std::string> TokenBytes(int id) const;
  int bos_id() const;
  int eos_id() const;
  int unk_id() const;
  int pad_id() const;  // -1 when none
  bool add_bos_token() const;
  bool add_eos_token() const;
  bool is_hugging_face() const { return hf_ != nullptr; }

  struct Impl;
  struct HfConfig;

 private:
  friend class IncrementalDecoder;  // runs Impl's per-id decoding state machine
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  Tokenizer(std::unique_ptr<hf::HfTokenizer> hf, std::unique_ptr<HfConfig> config);
  // tokenizer_hf.cc: a tokenizer.json with its tokenizer_config.json ("" when none).
  static std::unique_ptr<Tokenizer> LoadHuggingFace(const std::string& json_path,
                                                    const std::string& config_path);
  std::vector<int> HfEncodePrompt(std::string_view text) const;
  std::unique_ptr<Impl> impl_;           // tokenizer.model
  std::unique_ptr<hf::HfTokenizer> hf_;  // tokenizer.json
  std::unique_ptr<HfConfig> hf_config_;
};

// Streaming detokenizer: text is released only when it is final. The concatenation of
// every Push() result and Flush() equals Decode(context + pushed) minus Decode(context),
// so a continuation of a prompt gets its leading space right ("▁there" after a prompt
// yields " there"; at the very start of a text the dummy-prefix space is dropped).
// Never emits a partial UTF-8 character: bytes of an unfinished sequence are held back
// until it completes (or become U+FFFD exactly where Decode would put one).
// O(1) work per id: it keeps Decode's state (not the ids), so long generations stay cheap.
// (A context that ends inside an unfinished byte sequence is taken as Decode(context)
// renders it, U+FFFD; pushed bytes never complete the context's character.)
// tokenizer.json with a ByteFallback decoder holds a run of <0xNN> tokens until the run ends:
// the library turns an invalid run into one U+FFFD per byte, valid characters included.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, std::span<const int> context_ids = {},
                     bool skip_special_tokens = true);
  ~IncrementalDecoder();
  IncrementalDecoder(IncrementalDecoder&&) = default;
  // The text that `id` makes final (often "", e.g. for the first bytes of an emoji).
  std::string Push(int id);
  // Everything still held back (unfinished bytes become U+FFFD, as in Decode).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_ = true;
  std::unique_ptr<DecodeState> state_;           // tokenizer.model
  std::unique_ptr<hf::HfDecodeState> hf_state_;  // tokenizer.json
};

}  // namespace llm
