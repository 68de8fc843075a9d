// Tokenizer::Decode and IncrementalDecoder. Both run the same per-id state machine
// (Impl::DecodeId), which reproduces SentencePieceProcessor::Decode(ids):
//   - control ids decode to "";
//   - the unknown id decodes to the unk surface (" ⁇ ");
//   - "▁" becomes " "; the first piece drops one leading "▁" when the normalizer adds a
//     dummy prefix (or removes extra whitespace), and so does the next one while nothing
//     has been output and no "▁" was dropped yet;
//   - runs of <0xNN> byte pieces are gathered into bytes; each byte that does not start a
//     valid UTF-8 character becomes U+FFFD.
// Bytes are released as soon as they are final: a valid character, or a byte that can no
// longer start one. That is what makes the streaming decoder equal to Decode.
#include <cstring>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"

namespace llm {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";      // U+2581 "▁"
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Whether the bytes of `prefix` (shorter than the character its lead byte announces) could
// still become a valid character. Validity only depends on the first two bytes (overlong,
// surrogate and range checks), so trying every second byte and padding the rest is exact.
bool CanComplete(std::string_view prefix) {
  const auto lead = static_cast<unsigned char>(prefix[0]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  if (prefix.size() >= need) return false;
  std::string trial(prefix);
  trial.resize(need, '\x80');
  if (prefix.size() >= 2) return ValidUtf8CharLength(trial) == need;
  for (int second = 0x80; second <= 0xBF; ++second) {
    trial[1] = static_cast<char>(second);
    if (ValidUtf8CharLength(trial) == need) return true;
  }
  return false;
}

// Moves the decided part of state.pending_bytes to *out; with `at_end`, everything (an
// unfinished character then becomes one U+FFFD per byte, as the library does).
void ReleaseBytes(DecodeState& state, bool at_end, std::string* out) {
  std::string_view bytes = state.pending_bytes;
  size_t offset = 0;
  while (offset < bytes.size()) {
    const std::string_view rest = bytes.substr(offset);
    const size_t length = ValidUtf8CharLength(rest);
    if (length > 0) {
      out->append(rest.substr(0, length));
      offset += length;
    } else if (!at_end && CanComplete(rest)) {
      break;  // wait for the rest of this character
    } else {
      out->append(kReplacementChar);
      offset += 1;
    }
  }
  if (offset > 0) state.text_empty = false;
  state.pending_bytes.erase(0, offset);
}

void AppendUnescaped(std::string_view piece, std::string* out) {
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos, kSpaceSymbol.size()) == kSpaceSymbol) {
      out->push_back(' ');
      pos += kSpaceSymbol.size();
    } else {
      out->push_back(piece[pos++]);
    }
  }
}

}  // namespace

void Tokenizer::Impl::FlushBytes(DecodeState& state, std::string* out) const {
  ReleaseBytes(state, /*at_end=*/true, out);
}

void Tokenizer::Impl::DecodeId(DecodeState& state, int id, std::string* out) const {
  // Ids outside the vocabulary (the library refuses the whole call) decode to nothing.
  if (id < 0 || id >= static_cast<int>(pieces.size())) return;
  const Piece& piece = pieces[id];
  if (piece.type == PieceType::kByte) {
    state.pending_bytes.push_back(
        static_cast<char>(std::stoi(piece.text.substr(3, 2), nullptr, 16)));
    ReleaseBytes(state, /*at_end=*/false, out);
    return;
  }
  FlushBytes(state, out);
  if (state.bos_ws_seen || !state.text_empty) state.is_bos_ws = false;
  state.bos_ws_seen = false;
  if (piece.type == PieceType::kControl) return;
  const size_t size_before = out->size();
  if (piece.type == PieceType::kUnknown) {
    out->append(unk_surface);
  } else {
    std::string_view text = piece.text;
    if (state.is_bos_ws && (add_dummy_prefix || remove_extra_whitespaces) &&
        text.starts_with(kSpaceSymbol)) {
      text.remove_prefix(kSpaceSymbol.size());
      // With remove_extra_whitespaces every leading "▁" piece is dropped, not only one.
      state.bos_ws_seen = !remove_extra_whitespaces;
    }
    AppendUnescaped(text, out);
  }
  if (out->size() > size_before) state.text_empty = false;
}

std::string Tokenizer::Decode(std::span<const int> ids, bool skip_special_tokens) const {
  if (hf_) return hf_->Decode(ids, skip_special_tokens);
  DecodeState state;
  std::string text;
  for (int id : ids) impl_->DecodeId(state, id, &text);
  impl_->FlushBytes(state, &text);
  return text;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, std::span<const int> context_ids,
                                       bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {
  if (const hf::HfTokenizer* hf = tokenizer_.hf_.get()) {
    // The context's text is settled as Decode(context) settles it, and dropped.
    hf_state_ = std::make_unique<hf::HfDecodeState>();
    hf->DecodeStart(hf_state_.get());
    std::string discarded;
    for (int id : context_ids)
      hf->DecodePush(hf_state_.get(), id, skip_special_tokens_, &discarded);
    hf->DecodeFinish(hf_state_.get(), &discarded);
    return;
  }
  state_ = std::make_unique<DecodeState>();
  // Run the context through the same state machine and drop its text: what remains is
  // whether a leading "▁" may still be dropped. Bytes of a character the context leaves
  // unfinished are settled now as Decode(context) settles them (U+FFFD each), since that
  // text counts as the context's.
  std::string discarded;
  for (int id : context_ids) tokenizer_.impl_->DecodeId(*state_, id, &discarded);
  tokenizer_.impl_->FlushBytes(*state_, &discarded);
}

IncrementalDecoder::~IncrementalDecoder() = default;

std::string IncrementalDecoder::Push(int id) {
  std::string text;
  if (hf_state_) {
    tokenizer_.hf_->DecodePush(hf_state_.get(), id, skip_special_tokens_, &text);
    return text;
  }
  tokenizer_.impl_->DecodeId(*state_, id, &text);
  return text;
}

std::string IncrementalDecoder::Flush() {
  std::string text;
  if (hf_state_) {
    tokenizer_.hf_->DecodeFinish(hf_state_.get(), &text);
    return text;
  }
  tokenizer_.impl_->FlushBytes(*state_, &text);
  return text;
}

}  // namespace llm
