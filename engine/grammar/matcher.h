// Running a Grammar (engine/grammar/grammar.h) against a model's vocabulary: which tokens may
// come next, as a packed bitmask the samplers apply.
//
// The grammar runs as a pushdown automaton over bytes. A parse state is a set of stacks; a
// stack is a chain of nodes (position in the grammar, parent node), hash-consed so that equal
// stacks are one id and a set of stacks is a sorted vector of ids, interned as a state id.
// States and their byte transitions are built lazily and kept: the automaton a grammar needs
// grows into a DFA over the states its outputs actually visit, shared by every request that
// uses the grammar (compiled grammars are cached by the server). A mask walks the vocabulary
// in byte order, reusing the states of each token's common prefix with the one before
// (xgrammar's sorted-vocabulary walk) and jumping past the tokens of a rejected prefix, and is
// cached per state. Where every plain text byte (printable ASCII but " and \) leads to one
// same state, as in a JSON string, the plain tokens are taken by their length from a
// precomputed mask and only the others (about a quarter of Llama 3's) are walked.
//
// Special tokens (control pieces, special added tokens) are never allowed; EOS only where the
// output is complete. Tokens that decode to no bytes are never allowed (a model could loop on
// them).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/grammar/grammar.h"

namespace llm {
class Tokenizer;
}

namespace llm::grammar {

// A model's vocabulary as the grammar sees it: the bytes each token adds to the output text.
class TokenVocabulary {
 public:
  // token_bytes[id]: the bytes, or nullopt for a token that is never allowed (special).
  // eos_ids: allowed where the grammar is complete. mask_vocab: the width of the model's
  // logits (>= token_bytes.size(); ids beyond the tokenizer are never allowed).
  TokenVocabulary(std::vector<std::optional<std::string>> token_bytes, std::vector<int> eos_ids,
                  int64_t mask_vocab);
  static std::shared_ptr<const TokenVocabulary> FromTokenizer(const Tokenizer& tokenizer,
                                                              std::vector<int> eos_ids,
                                                              int64_t mask_vocab);

  int64_t mask_vocab() const { return mask_vocab_; }
  size_t mask_words() const { return size_t((mask_vocab_ + 31) / 32); }
  const std::vector<int>& eos_ids() const { return eos_ids_; }
  bool IsEos(int id) const;
  // Bytes of `id`; null for a token never allowed.
  const std::string* bytes(int id) const;

 private:
  friend class CompiledGrammar;
  int64_t mask_vocab_;
  std::vector<std::optional<std::string>> bytes_;
  std::vector<int> eos_ids_;
  // Tokens as the mask walk reads them: sorted by their bytes, with each one's common prefix
  // length with the one before, and the bytes past that prefix of every one, back to back in
  // this order (token i's are suffix_bytes[suffix_start[i] .. suffix_start[i + 1])), so the
  // walk reads them in sequence instead of chasing each token's string.
  struct SortedTokens {
    std::vector<int32_t> order;
    std::vector<uint16_t> lcp;
    std::vector<uint32_t> suffix_start;
    std::string suffix_bytes;
    size_t max_bytes = 0;
    // Where the walk goes when token i fails at its byte L - 1 (lcp[i] < L <= kSkipDepth, L <=
    // its length): the first token after it that does not share those L bytes, so a rejected
    // prefix's tokens are passed over at once. skip[skip_start[i] + L - lcp[i] - 1].
    std::vector<uint32_t> skip_start;
    std::vector<uint32_t> skip;
  };
  static constexpr size_t kSkipDepth = 64;
  static SortedTokens Sort(const std::vector<std::optional<std::string>>& bytes,
                           std::vector<int32_t> ids);
  // Every allowed-able token; those with a byte that is not plain text (IsPlainByte in
  // matcher.cc: printable ASCII but the double quote and the backslash); those that are not
  // text (TextChars in matcher.cc: plain bytes and whole UTF-8 characters of 2-4 bytes).
  SortedTokens all_, not_plain_, not_text_;
  // plain_up_to_[n]: the tokens of 1..n plain bytes, as a mask. A state where every plain byte
  // leads to one same state, for n bytes running, takes exactly these of the plain tokens, so
  // the walk reads only not_plain_ there. text_up_to_[n]: the same for the text tokens of
  // 1..n characters, where every character leads to one same state (a JSON string's content,
  // bounded or not); then the walk reads only not_text_ (a twentieth of Llama 3's tokens).
  std::vector<std::vector<uint32_t>> plain_up_to_, text_up_to_;
};

using Mask = std::vector<uint32_t>;

// A grammar bound to a vocabulary, with its lazily built automaton. Thread-safe: matchers on
// any thread share it. Building the automaton (new states and transitions) takes one mutex;
// transitions already built are read without it (the rows of a chunked table of atomics that
// never moves), so the masks of different states are walked on several threads at once and
// only their misses queue on the mutex. A state's mask is computed once: a second thread that
// asks for it while it is being computed waits for it.
class CompiledGrammar {
 public:
  static constexpr int32_t kDead = -1;
  // Bounds on the lazily built automaton (matcher.cc says why).
  static constexpr size_t kMaxStates = size_t{1} << 18;

  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab);
  const TokenVocabulary& vocab() const { return *vocab_; }
  const Grammar& grammar() const { return grammar_; }

  int32_t initial_state() const { return initial_; }
  // The state after `byte` (kDead when the byte cannot follow).
  int32_t Next(int32_t state, uint8_t byte) const;
  int32_t NextBytes(int32_t state, std::string_view bytes) const;
  // The output so far is a complete sentence of the grammar.
  bool IsAccepting(int32_t state) const;
  // Nothing but EOS can follow.
  bool IsComplete(int32_t state) const;
  // The tokens allowed in `state` (kDead: only EOS). Computed once per state, then cached.
  // Past `deadline` (the compiler's, for the first state) it throws GrammarError.
  std::shared_ptr<const Mask> AllowedTokens(
      int32_t state, std::optional<std::chrono::steady_clock::time_point> deadline = {}) const;

  struct Stats {
    size_t nodes = 0, states = 0, masks_computed = 0, masks_cached = 0;
    // Transitions that went dead because the automaton hit its bounds (too many stacks in a
    // state, nodes or states), not because the grammar refuses the byte.
    size_t num_capped = 0;
  };
  Stats stats() const;

 private:
  // One state's transitions, [256]; kUnset until computed. Written under mu_ (release), read
  // by anyone (acquire).
  using Row = std::atomic<int32_t>;
  static constexpr int32_t kUnset = -2;
  struct State {
    std::vector<int32_t> stacks;  // node ids whose top is a byte set, sorted
    bool accepting = false;
    std::unique_ptr<Row[]> next;  // lazily (owns the row that row_chunks_ points to)
    std::shared_ptr<const Mask> mask;
    bool computing = false;  // a thread is computing `mask` (mask_done_ tells when it stops)
  };
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };

  int32_t NodeLocked(int32_t pos, int32_t parent) const;
  // The state of *stacks (sorted and deduplicated in place; copied when the state is new).
  int32_t StateLocked(std::vector<int32_t>* stacks, bool accepting) const;
  // The byte-topped stacks reachable from (pos, parent) without consuming a byte.
  void ExpandLocked(int32_t pos, int32_t parent, std::vector<int32_t>* out, bool* accepting) const;
  int32_t NextLocked(int32_t state, uint8_t byte) const;
  // The transition: read from its row without the lock when built, else built under it.
  int32_t Step(int32_t state, uint8_t byte) const;
  const Row* RowOf(int32_t state) const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  int32_t initial_ = kDead;
  std::shared_ptr<const Mask> eos_only_;

  mutable std::mutex mu_;
  mutable std::condition_variable mask_done_;
  mutable std::vector<std::pair<int32_t, int32_t>> nodes_;  // (pos, parent)
  mutable std::unordered_map<uint64_t, int32_t> node_index_;
  mutable std::vector<State> states_;  // under mu_ (it grows)
  // states_[i].next.get() for state i, readable without mu_: chunks of kRowChunk slots, each
  // chunk allocated (under mu_) before the first state it holds exists, so a state id read
  // from a row always finds its slot.
  static constexpr size_t kRowChunk = 4096;
  using RowSlot = std::atomic<const Row*>;
  mutable std::array<std::atomic<RowSlot*>, kMaxStates / kRowChunk> row_chunks_{};
  mutable std::vector<std::unique_ptr<RowSlot[]>> row_chunk_owner_;
  // Scratch kept between calls, so that an expansion allocates nothing: ExpandLocked's
  // worklist and seen items (a short list, a hash set past kSmallSeen), NextLocked's stacks.
  static constexpr size_t kSmallSeen = 32;
  mutable std::vector<std::pair<int32_t, int32_t>> expand_work_;
  mutable std::vector<uint64_t> expand_seen_;
  mutable std::unordered_set<uint64_t> expand_seen_big_;
  mutable std::vector<int32_t> next_stacks_;
  // Per state: the one state every plain byte leads to, or kUniformDead (all of them lead
  // nowhere), kNotUniform, kUnknown (not computed yet).
  static constexpr int32_t kUniformDead = -1, kNotUniform = -2, kUnknown = -3;
  mutable std::vector<int32_t> uniform_;
  int32_t UniformLocked(int32_t state) const;
  // The same over every character a text token can hold (plain bytes and UTF-8 characters of
  // 2-4 bytes), kept per state in uniform_text_.
  mutable std::vector<int32_t> uniform_text_;
  int32_t UniformTextLocked(int32_t state) const;
  // The mask's start, under mu_: EOS when accepting, the plain tokens that a uniform run of
  // plain bytes allows, and which tokens remain to be walked (null: none).
  const TokenVocabulary::SortedTokens* StartMaskLocked(int32_t state, Mask* mask) const;
  // Sets in *mask the tokens of `tokens` that `state` allows (without mu_ but for misses).
  void Walk(int32_t state, const TokenVocabulary::SortedTokens& tokens, Mask* mask,
            std::optional<std::chrono::steady_clock::time_point> deadline) const;
  mutable std::unordered_map<std::vector<int32_t>, int32_t, VecHash> state_index_;
  mutable size_t masks_computed_ = 0;
  mutable size_t masks_cached_ = 0;
  mutable size_t num_capped_ = 0;
  mutable bool expand_capped_ = false;  // ExpandLocked stopped at kMaxExpandItems
};

// One output's progress through a grammar. Not thread-safe (one sequence, one thread).
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  // Packed bitmask of the tokens allowed next (mask_words() words).
  const uint32_t* AllowedTokens();
  // Advances by a generated token. A token the mask did not allow (or any token after EOS)
  // leaves the matcher dead: from then on only EOS is allowed. Returns whether it was allowed.
  bool Accept(int token);
  bool accepting() const;  // EOS would be allowed now
  bool dead() const { return state_ == CompiledGrammar::kDead && !finished_; }
  bool finished() const { return finished_; }  // EOS accepted
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  int32_t state_;
  bool finished_ = false;
  std::shared_ptr<const Mask> mask_;  // for state_, when computed
};

}  // namespace llm::grammar
