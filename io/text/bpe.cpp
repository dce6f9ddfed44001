#include "io/text/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "io/text/byte_level.h"
#include "src/base/check.h"

namespace vlm::io {

using json = nlohmann::json;

namespace {

constexpr size_t kCacheMaxWordBytes = 64;    // longer pieces rarely repeat
constexpr size_t kCacheMaxEntries = 1 << 16; // then the cache is cleared and refilled
constexpr size_t kCachesPerThread = 4;       // tokenizers one thread uses at a time
constexpr size_t kBpeScanMaxBytes = 48;      // BPE by array scan up to here, by heap beyond

// A fast hash for short byte strings (words average a few bytes): 8-byte chunks, multiply-mix.
uint64_t word_hash(std::string_view s) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = s.size() * kMul;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * kMul;
  return h ^ (h >> 32);
}

// Scratch buffers of the heap merge loop, reused across words.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev, next; // neighbours in the current segmentation, -1 at the ends
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos; // index of the left symbol
    int32_t id;  // the merge result, to detect stale candidates
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

} // namespace

// Open addressing over slots that point into a byte arena (the words) and an id arena (their
// tokens). When full it is emptied: simple, and the frequent words come back at once.
class WordCache {
public:
  explicit WordCache(uint64_t owner) : owner_(owner), slots_(2 * kCacheMaxEntries) {}
  uint64_t owner() const { return owner_; }

  // The cached ids of `word` (hash h = word_hash(word)), or false.
  bool find(std::string_view word, uint64_t h, const int32_t** ids, size_t* n) const {
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.word_len == 0) return false;
      if (s.hash == h && s.word_len == word.size() &&
          std::memcmp(words_.data() + s.word_offset, word.data(), word.size()) == 0) {
        *ids = ids_.data() + s.ids_offset;
        *n = s.ids_len;
        return true;
      }
    }
  }
  // Caches `word` (not cached yet, 1 < size <= kCacheMaxWordBytes) -> ids.
  void insert(std::string_view word, uint64_t h, const int32_t* ids, size_t n) {
    if (entries_ == kCacheMaxEntries) clear();
    size_t i = h & (slots_.size() - 1);
    while (slots_[i].word_len != 0) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = {h, uint32_t(words_.size()), uint32_t(ids_.size()), uint16_t(word.size()),
                 uint16_t(n)};
    words_.append(word);
    ids_.insert(ids_.end(), ids, ids + n);
    entries_++;
  }

private:
  struct Slot {
    uint64_t hash;
    uint32_t word_offset, ids_offset;
    uint16_t word_len, ids_len; // word_len 0: empty (cached words have >= 2 bytes)
  };
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    words_.clear();
    ids_.clear();
    entries_ = 0;
  }
  uint64_t owner_; // Tokenizer::Impl::instance_id, never reused
  std::vector<Slot> slots_;
  std::string words_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
};

WordCache& thread_word_cache(uint64_t owner) {
  thread_local std::vector<std::unique_ptr<WordCache>> caches; // most recently created first
  for (auto& c : caches)
    if (c->owner() == owner) return *c;
  if (caches.size() == kCachesPerThread) caches.pop_back();
  caches.insert(caches.begin(), std::make_unique<WordCache>(owner));
  return *caches.front();
}

// --- loading -----------------------------------------------------------------------------------

void BpeModel::index_words(const std::vector<std::string>& tokens,
                           const std::vector<uint8_t>& kind) {
  if (!ignore_merges) return;
  word_bytes.resize(tokens.size());
  word_index.init(&word_bytes, tokens.size());
  for (size_t id = 0; id < tokens.size(); id++)
    if (kind[id] && token_bytes(tokens[id], &word_bytes[id])) word_index.insert(int32_t(id));
}

void BpeModel::find_byte_ids(const StringIndex& vocab, const std::string& file) {
  for (int b = 0; b < 256; b++) {
    const std::string t = byte_token(uint8_t(b));
    byte_ids[b] = vocab.find(t);
    VLM_CHECK(byte_ids[b] >= 0, file, ": model.vocab has no token for byte 0x", std::hex, b,
              std::dec, " (", json(t).dump(), "); a byte-level BPE vocabulary needs all 256");
  }
}

void BpeModel::add_merges(const std::vector<std::pair<std::string, std::string>>& rules,
                          const StringIndex& vocab, const std::string& file) {
  merges.reserve(rules.size());
  std::string joined;
  for (size_t rank = 0; rank < rules.size(); rank++) {
    const auto& [a, b] = rules[rank];
    joined.assign(a).append(b);
    const int32_t ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(joined);
    if (ia < 0 || ib < 0 || ic < 0) {
      const std::string& missing = ia < 0 ? a : ib < 0 ? b : joined;
      VLM_FAIL(file, ": model.merges[", rank, "] = ", json::array({a, b}).dump(),
               " uses a token missing from model.vocab (", json(missing).dump(), ")");
    }
    merges.insert(ia, ib, {uint32_t(rank), ic});
  }
}

// --- encoding ----------------------------------------------------------------------------------

void BpeModel::encode_word(std::string_view word, WordCache& cache,
                           std::vector<int32_t>* ids) const {
  if (word.size() == 1) {
    ids->push_back(byte_ids[uint8_t(word[0])]);
    return;
  }
  if (word.size() > kCacheMaxWordBytes) {
    merge_word(word, ids);
    return;
  }
  const uint64_t h = word_hash(word);
  const int32_t* cached = nullptr;
  size_t n = 0;
  if (cache.find(word, h, &cached, &n)) {
    ids->insert(ids->end(), cached, cached + n);
    return;
  }
  const size_t before = ids->size();
  merge_word(word, ids);
  cache.insert(word, h, ids->data() + before, ids->size() - before);
}

// Byte-pair merging of one word, as HF's BPE::merge_word: start from one symbol per byte and
// repeatedly apply the lowest-ranked merge present, leftmost first on ties. Short words (nearly
// all) scan an array of pair ranks; long ones (a CJK or Thai line is one word) use a min-heap of
// candidate pairs with lazy invalidation, O(n log n). Both do one merge-table lookup per pair.
void BpeModel::merge_word(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    if (const int32_t id = word_index.find(word); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  if (word.empty()) return;
  if (word.size() <= kBpeScanMaxBytes)
    merge_scan(word, ids);
  else
    merge_heap(word, ids);
}

void BpeModel::merge_scan(std::string_view word, std::vector<int32_t>* ids) const {
  constexpr uint32_t kNone = ~0u;
  int32_t sym[kBpeScanMaxBytes];
  uint32_t rank[kBpeScanMaxBytes]; // rank[i]: the merge of (sym[i], sym[i + 1]), kNone if none
  int32_t result[kBpeScanMaxBytes];
  size_t n = word.size();
  auto lookup = [&](size_t i) {
    const MergeTable::Value* v = merges.find(sym[i], sym[i + 1]);
    rank[i] = v ? v->rank : kNone;
    result[i] = v ? v->id : -1;
  };
  for (size_t i = 0; i < n; i++) sym[i] = byte_ids[uint8_t(word[i])];
  for (size_t i = 0; i + 1 < n; i++) lookup(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; i++)
      if (rank[i] < rank[best]) best = i; // strict: the leftmost of equal ranks
    if (rank[best] == kNone) break;
    sym[best] = result[best];
    for (size_t i = best + 1; i + 1 < n; i++) {
      sym[i] = sym[i + 1];
      rank[i] = rank[i + 1];
      result[i] = result[i + 1];
    }
    n--;
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
  ids->insert(ids->end(), sym, sym + n);
}

void BpeModel::merge_heap(std::string_view word, std::vector<int32_t>* ids) const {
  thread_local BpeScratch scratch;
  auto& sym = scratch.symbols;
  auto& heap = scratch.heap;
  const auto n = int32_t(word.size());
  sym.resize(size_t(n));
  heap.clear();
  std::greater<BpeScratch::Candidate> later;
  auto push_pair = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    if (const MergeTable::Value* v = merges.find(sym[pos].id, sym[next].id)) {
      heap.push_back({v->rank, pos, v->id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i < n; i++)
    sym[i] = {byte_ids[uint8_t(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  for (int32_t i = 0; i + 1 < n; i++) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate c = heap.back();
    heap.pop_back();
    auto& left = sym[c.pos];
    if (left.id < 0 || left.next < 0) continue; // merged away meanwhile
    const MergeTable::Value* v = merges.find(left.id, sym[left.next].id);
    if (!v || v->id != c.id) continue; // the pair changed since it was queued
    const int32_t right = left.next;
    left.id = c.id;
    left.next = sym[right].next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    sym[right].id = -1;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids->push_back(sym[i].id);
}

} // namespace vlm::io
