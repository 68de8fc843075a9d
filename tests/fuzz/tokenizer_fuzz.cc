// Fuzzes the tokenizer. The first byte picks the mode, the rest is the payload:
//   0: a tokenizer.model file (ModelProto bytes): FromFile, then encode and decode with it;
//   1: text encoded by the real stories260K tokenizer, then decoded;
//   2: token ids (little-endian int16 pairs, so some are negative or beyond the vocabulary)
//      decoded by Decode and by an IncrementalDecoder, whose Push + Flush must equal Decode.
// Every input must succeed or throw llm::Error (only loading a model may throw).
//
//   scripts/fuzz.sh tokenizer
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Decodes `ids` at once and incrementally (after `context`); checks the documented
// invariant where it is exact (no context).
void CheckDecode(const llm::Tokenizer& tokenizer, std::span<const int> context,
                 std::span<const int> ids) {
  llm::IncrementalDecoder decoder(tokenizer, context);
  std::string streamed;
  for (int id : ids) streamed += decoder.Push(id);
  streamed += decoder.Flush();
  if (context.empty() && streamed != tokenizer.Decode(ids)) __builtin_trap();
}

void EncodeDecode(const llm::Tokenizer& tokenizer, std::string_view text) {
  const std::vector<int> ids = tokenizer.Encode(text);
  for (int id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
    (void)tokenizer.IdToPiece(id);
  }
  tokenizer.EncodePrompt(text);
  CheckDecode(tokenizer, {}, ids);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const uint8_t* payload = data + 1;
  const size_t payload_size = size - 1;
  const std::string_view text(reinterpret_cast<const char*>(payload), payload_size);
  if (mode == 0) {
    static llm::fuzz::MemFile file;
    std::unique_ptr<llm::Tokenizer> tokenizer;
    try {
      tokenizer = llm::Tokenizer::FromFile(file.Write(payload, payload_size));
    } catch (const llm::Error&) {
      return 0;
    }
    EncodeDecode(*tokenizer,
                 "Hello world, once upon a time \xe2\x96\x81 <s> \xf0\x9f\x98\x80 \xff");
    std::vector<int> all(tokenizer->vocab_size() < 4096 ? tokenizer->vocab_size() : 4096);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    CheckDecode(*tokenizer, {}, all);
    for (int id : all) tokenizer->PieceToId(tokenizer->IdToPiece(id));
  } else if (mode == 1) {
    EncodeDecode(llm::fuzz::StoriesTokenizer(), text);
  } else {
    std::vector<int> ids(payload_size / 2);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int16_t>(payload[2 * i] | (payload[2 * i + 1] << 8));
    }
    const llm::Tokenizer& tokenizer = llm::fuzz::StoriesTokenizer();
    CheckDecode(tokenizer, {}, ids);
    const size_t split = ids.empty() ? 0 : static_cast<size_t>(payload[0]) % (ids.size() + 1);
    CheckDecode(tokenizer, std::span<const int>(ids).first(split),
                std::span<const int>(ids).subspan(split));
  }
  return 0;
}
