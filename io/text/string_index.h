// A string -> id index over strings kept elsewhere (strings[id]), for the tokenizer's vocabulary
// (io/text/tokenizer.cpp) and BPE's whole-word lookup (io/text/bpe.h): open addressing with a
// hash tag per slot, so a lookup usually touches one slot and one string. Loading the vocabulary
// does ~600k lookups, which std::unordered_map makes the slowest part of loading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::io {

class StringIndex {
public:
  // `strings` must outlive the index and keep its elements in place.
  void init(const std::vector<std::string>* strings, size_t n) {
    strings_ = strings;
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    ids_.assign(cap, -1);
    tags_.assign(cap, 0);
  }
  // Adds strings[id]; an equal string already present keeps its id (first wins).
  void insert(int32_t id) {
    const std::string_view s = (*strings_)[id];
    const uint64_t h = hash(s);
    size_t i = h & (ids_.size() - 1);
    for (; ids_[i] >= 0; i = (i + 1) & (ids_.size() - 1))
      if (tags_[i] == uint32_t(h >> 32) && (*strings_)[ids_[i]] == s) return;
    ids_[i] = id;
    tags_[i] = uint32_t(h >> 32);
  }
  // The id of s, or -1.
  int32_t find(std::string_view s) const {
    if (ids_.empty()) return -1;
    const uint64_t h = hash(s);
    for (size_t i = h & (ids_.size() - 1); ids_[i] >= 0; i = (i + 1) & (ids_.size() - 1))
      if (tags_[i] == uint32_t(h >> 32) && (*strings_)[ids_[i]] == s) return ids_[i];
    return -1;
  }

private:
  static uint64_t hash(std::string_view s) {
    return std::hash<std::string_view>{}(s)*0x9E3779B97F4A7C15ull; // spread the low bits
  }
  const std::vector<std::string>* strings_ = nullptr;
  std::vector<int32_t> ids_;
  std::vector<uint32_t> tags_;
};

} // namespace vlm::io
