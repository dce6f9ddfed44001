// Step 4 of the tokenizer (io/text/tokenizer.h): byte-level BPE of one pre-tokenized piece, as
// HF's BPE model: the piece's UTF-8 bytes start as one token each and the merges of
// tokenizer.json join them by rank. Results for short pieces are cached per thread, since the
// frequent words of a text come back over and over.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/text/string_index.h"

namespace vlm::io {

// Merge rules keyed by (left id, right id): open addressing with linear probing, key and value
// side by side so a lookup is one cache line; the BPE loop does a lookup per candidate pair.
class MergeTable {
public:
  struct Value {
    uint32_t rank;
    int32_t id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n + n / 2) cap <<= 1; // load factor <= 2/3
    slots_.assign(cap, Slot{kEmpty, {0, 0}});
    shift_ = 64 - std::countr_zero(cap);
  }
  // Later rules for the same pair replace earlier ones (as HF's map does).
  void insert(int32_t a, int32_t b, Value v) {
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = {k, v};
  }
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == k) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

private:
  struct Slot {
    uint64_t key;
    Value value;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Slot> slots_;
  int shift_ = 60;
};

// BPE results of words for one tokenizer and one thread (defined in bpe.cpp).
class WordCache;

// The calling thread's cache for tokenizer `owner` (an id never reused). Lock-free: each thread
// has its own.
WordCache& thread_word_cache(uint64_t owner);

// The BPE model of a tokenizer.json over its vocabulary ids. Filled once by the load steps
// (errors name `file`), then read by any number of threads.
struct BpeModel {
  std::array<int32_t, 256> byte_ids{}; // id of the token of each single byte
  MergeTable merges;
  bool ignore_merges = false;          // a word that is a token is taken whole
  std::vector<std::string> word_bytes; // ignore_merges: id -> raw bytes of the token
  StringIndex word_index;              // ignore_merges: raw bytes -> id

  // Loading, in this order. kind[id] != 0 marks the ids of model.vocab.
  void index_words(const std::vector<std::string>& tokens, const std::vector<uint8_t>& kind);
  void find_byte_ids(const StringIndex& vocab, const std::string& file);
  void add_merges(const std::vector<std::pair<std::string, std::string>>& rules,
                  const StringIndex& vocab, const std::string& file);

  // Appends the ids of one pre-tokenized piece, looked up in or added to `cache`.
  void encode_word(std::string_view word, WordCache& cache, std::vector<int32_t>* ids) const;
  // Appends the ids of one word by byte-pair merging (no cache).
  void merge_word(std::string_view word, std::vector<int32_t>* ids) const;

private:
  void merge_scan(std::string_view word, std::vector<int32_t>* ids) const;
  void merge_heap(std::string_view word, std::vector<int32_t>* ids) const;
};

} // namespace vlm::io
