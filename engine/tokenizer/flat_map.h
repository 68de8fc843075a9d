// Open-addressing hash tables for the BPE model's two big lookups, built once at load time:
// token text -> id (StringIds: entries in one flat array, the texts in one arena) and a
// pair of ids -> merge (PairTable). A 262k-token vocabulary with 515k merges (Gemma 3)
// takes millions of lookups to load; node-based std::unordered_map spends most of that in
// cache misses, these tables in one or two probes of contiguous memory.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace llm::hf {

inline uint64_t MixBits(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class StringIds {
 public:
  // Sizes the table for `count` texts of `bytes` bytes in all (a hint).
  void Reserve(size_t count, size_t bytes) {
    arena_.reserve(bytes);
    Rehash(count);
  }
  // Adds text -> id, or replaces the id of an existing text.
  void Insert(std::string_view text, int id) {
    if ((size_ + 1) * 2 > slots_.size()) Rehash(size_ * 2 + 16);
    const uint64_t h = Hash(text);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(text.size()), id};
        arena_.append(text);
        ++size_;
        return;
      }
      if (s.hash == h && Text(s) == text) {
        s.id = id;
        return;
      }
    }
  }
  // The id of `text`, or -1.
  int Find(std::string_view text) const {
    if (slots_.empty()) return -1;
    const uint64_t h = Hash(text);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && Text(s) == text) return s.id;
    }
  }
  size_t size() const { return size_; }
  // Calls f(text, id) for every entry (texts stay valid while the table lives).
  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.id >= 0) f(Text(s), s.id);
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0, length = 0;
    int id = -1;
  };
  static uint64_t Hash(std::string_view s) { return MixBits(std::hash<std::string_view>{}(s)); }
  std::string_view Text(const Slot& s) const {
    return std::string_view(arena_).substr(s.offset, s.length);
  }
  void Rehash(size_t count) {
    size_t n = 16;
    while (n < count * 2) n *= 2;
    if (n <= slots_.size()) return;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    for (const Slot& s : old) {
      if (s.id < 0) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].id >= 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;  // texts, appended; never moved once ForEach's views are taken
  size_t mask_ = 0, size_ = 0;
};

// (left id, right id) -> {rank, merged id}.
class PairTable {
 public:
  struct Value {
    uint32_t rank;
    int new_id;
  };
  void Reserve(size_t count) { Rehash(count); }
  void Insert(int left, int right, Value value) {  // replaces an existing pair's value
    if ((size_ + 1) * 2 > slots_.size()) Rehash(size_ * 2 + 16);
    const uint64_t key = Key(left, right);
    for (size_t i = MixBits(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == kEmpty || s.key == key) {
        if (s.key == kEmpty) ++size_;
        s = Slot{key, value};
        return;
      }
    }
  }
  const Value* Find(int left, int right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = Key(left, right);
    for (size_t i = MixBits(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;  // ids are below 2^30: never a real key
  struct Slot {
    uint64_t key = kEmpty;
    Value value{};
  };
  static uint64_t Key(int left, int right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void Rehash(size_t count) {
    size_t n = 16;
    while (n < count * 2) n *= 2;
    if (n <= slots_.size()) return;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = MixBits(s.key) & mask_;
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

}  // namespace llm::hf
