#include "io/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "io/text/unicode.h"
#include "src/base/check.h"

namespace vlm::io {

namespace fs = std::filesystem;
using json = nlohmann::json;
using unicode::CharClass;

namespace {

// The two pre-tokenizer regexes this matcher implements (tokenizer.json spelling). Qwen3.5's
// differs only in counting combining marks (\p{M}) as letters rather than as punctuation.
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's byte-level alphabet: each byte is shown as one printable code point (the printable
// Latin-1 bytes as themselves, the others as U+0100 + n in byte order). Vocabulary strings and
// merges are written in it ("Ġ" = byte 0x20).
std::array<char32_t, 256> byte_to_char_table() {
  std::array<char32_t, 256> t{};
  char32_t next = 256;
  for (int b = 0; b < 256; b++) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t[b] = printable ? char32_t(b) : next++;
  }
  return t;
}

const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> t = byte_to_char_table();
  return t;
}

// The byte of a byte-level code point, or -1 when cp is not in the alphabet.
int char_to_byte(char32_t cp) {
  static const auto inverse = [] {
    std::array<int16_t, 324> inv{};
    inv.fill(-1);
    for (int b = 0; b < 256; b++) inv[byte_to_char()[b]] = int16_t(b);
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

// The raw bytes of a byte-level token string; false when some character is not in the alphabet.
bool token_bytes(std::string_view token, std::string* out) {
  out->clear();
  for (size_t i = 0; i < token.size();) {
    char32_t cp = 0;
    const size_t len = unicode::utf8_decode(token, i, &cp);
    const int b = len ? char_to_byte(cp) : -1;
    if (b < 0) return false;
    out->push_back(char(b));
    i += len;
  }
  return true;
}

std::string byte_token(uint8_t b) {
  std::string s;
  unicode::utf8_append(&s, byte_to_char()[b]);
  return s;
}

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

// A string -> id index over strings kept elsewhere (strings[id]): open addressing with a hash
// tag per slot, so a lookup usually touches one slot and one string. Loading the vocabulary does
// ~600k lookups, which std::unordered_map makes the slowest part of loading.
class StringIndex {
public:
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

struct AddedToken {
  std::string content; // as matched (NFC-normalized when `normalized` and the normalizer is NFC)
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Leftmost-longest search over a set of added tokens (what HF's Aho-Corasick automaton with
// MatchKind::LeftmostLongest finds): candidates bucketed by first byte, longest first.
class AddedMatcher {
public:
  void add(const AddedToken* t) {
    if (t->content.empty()) return;
    auto& bucket = by_first_[uint8_t(t->content[0])];
    bucket.push_back(t);
    std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->content.size() > b->content.size();
    });
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // First match starting at or after `from`: sets *start and returns the token, or nullptr.
  const AddedToken* find(std::string_view s, size_t from, size_t* start) const {
    for (size_t p = from; p < s.size(); p++) {
      for (const AddedToken* t : by_first_[uint8_t(s[p])]) {
        if (s.compare(p, t->content.size(), t->content) == 0) {
          *start = p;
          return t;
        }
      }
    }
    return nullptr;
  }

private:
  std::array<std::vector<const AddedToken*>, 256> by_first_;
  bool empty_ = true;
};

// --- per-thread cache of BPE results for words -----------------------------------------------

constexpr size_t kCacheMaxWordBytes = 64;    // longer pieces rarely repeat
constexpr size_t kCacheMaxEntries = 1 << 16; // then the cache is cleared and refilled
constexpr size_t kCachesPerThread = 4;       // tokenizers one thread uses at a time
constexpr size_t kBpeScanMaxBytes = 48;      // BPE by array scan up to here, by heap beyond

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

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

// BPE results of words, for one tokenizer and one thread: open addressing over slots that point
// into a byte arena (the words) and an id arena (their tokens). When full it is emptied: simple,
// and the frequent words come back at once.
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

// The calling thread's cache for tokenizer `owner`. Lock-free: each thread has its own.
WordCache& thread_cache(uint64_t owner) {
  thread_local std::vector<std::unique_ptr<WordCache>> caches; // most recently created first
  for (auto& c : caches)
    if (c->owner() == owner) return *c;
  if (caches.size() == kCachesPerThread) caches.pop_back();
  caches.insert(caches.begin(), std::make_unique<WordCache>(owner));
  return *caches.front();
}

std::atomic<uint64_t> g_next_instance_id{1};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  VLM_CHECK(f, "tokenizer '", path, "': cannot open the file");
  std::ostringstream ss;
  ss << f.rdbuf();
  VLM_CHECK(!f.bad(), "tokenizer '", path, "': read error");
  return ss.str();
}

// model.vocab and model.merges, taken out of the JSON while it is parsed (building them as JSON
// values first would double the load time). A malformed entry is kept as text for the error.
struct RawModel {
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string bad_vocab, bad_merge; // the first malformed entry (key and value / element)
  size_t bad_merge_index = 0;
};

// Parses tokenizer.json into `rest` (everything but the vocabulary and the merges) and `raw`.
void parse_tokenizer_json(const std::string& text, json* rest, RawModel* raw) {
  std::string key1, key2, pending; // keys at depth 1 and 2, the current vocabulary key
  raw->vocab.reserve(1 << 18);
  raw->merges.reserve(1 << 18);
  auto bad_merge = [&](const json& v) {
    if (raw->bad_merge.empty()) {
      raw->bad_merge = v.dump();
      raw->bad_merge_index = raw->merges.size();
    }
    raw->merges.emplace_back(); // keeps the indices of later merges
  };
  using E = json::parse_event_t;
  *rest = json::parse(text, [&](int depth, E ev, json& v) {
    if (ev == E::key && depth <= 2) (depth == 1 ? key1 : key2) = v.get<std::string>();
    if (depth != 3 || key1 != "model") return true;
    if (key2 == "vocab") {
      if (ev == E::key) {
        pending = std::move(v.get_ref<std::string&>());
      } else if (ev == E::value || ev == E::object_end || ev == E::array_end) {
        if (v.is_number_integer())
          raw->vocab.emplace_back(std::move(pending), v.get<int64_t>());
        else if (raw->bad_vocab.empty())
          raw->bad_vocab = json(pending).dump() + ": " + v.dump();
      }
      return ev == E::object_start || ev == E::array_start; // keep nothing
    }
    if (key2 == "merges") {
      if (ev == E::array_end || ev == E::object_end) {
        if (v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_string())
          raw->merges.emplace_back(std::move(v[0].get_ref<std::string&>()),
                                   std::move(v[1].get_ref<std::string&>()));
        else
          bad_merge(v);
      } else if (ev == E::value) {
        // The older form "a b": byte-level tokens never contain a space.
        const std::string* m = v.is_string() ? &v.get_ref<const std::string&>() : nullptr;
        const size_t sp = m ? m->find(' ') : std::string::npos;
        if (sp != std::string::npos && m->find(' ', sp + 1) == std::string::npos)
          raw->merges.emplace_back(m->substr(0, sp), m->substr(sp + 1));
        else
          bad_merge(v);
      }
      return ev == E::object_start || ev == E::array_start;
    }
    return true;
  });
}

} // namespace

// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  // Unused ids a tokenizer.json may leave below its largest id (HF files have none or a few).
  static constexpr int64_t kMaxIdHoles = 4096;

  std::string path;
  uint64_t instance_id = 0;
  int64_t id_limit = 0;           // every id is below this (load)
  bool nfc = false;               // normalizer
  bool marks_are_letters = false; // Qwen3.5 regex
  bool ignore_merges = false;     // BPE: a word that is a token is taken whole

  std::vector<std::string> tokens;  // id -> token string ("" for unused ids)
  std::vector<std::string> decoded; // id -> bytes the ByteLevel decoder makes of it
  std::vector<uint8_t> kind;        // id -> 0 unused, 1 vocabulary, 2 added, 3 special
  StringIndex vocab_index;          // model.vocab strings -> id
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_ids;
  std::vector<std::string> word_bytes; // ignore_merges: id -> raw bytes of the token
  StringIndex word_index;              // ignore_merges: raw bytes -> id
  std::array<int32_t, 256> byte_ids{};
  MergeTable merges;
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, normalized_matcher;

  void load(const std::string& text);
  void load_model(const json& model, RawModel& raw);
  void load_added(const json& list);
  void check_pipeline(const json& j);

  void encode_text(std::string_view text, std::vector<int32_t>* ids) const;
  template <typename OnText>
  void split_added(std::string_view s, const AddedMatcher& m, std::vector<int32_t>* ids,
                   OnText&& on_text) const;
  void encode_normalized(std::string_view s, std::vector<int32_t>* ids, WordCache& cache) const;
  void bpe(std::string_view word, std::vector<int32_t>* ids) const;
  void bpe_scan(std::string_view word, std::vector<int32_t>* ids) const;
  void bpe_heap(std::string_view word, std::vector<int32_t>* ids) const;
};

namespace {

// Byte offsets and classes of the pre-tokenizer over valid UTF-8.
struct CharAt {
  uint8_t len;
  CharClass cls;
};

// Splits s into the pieces the Qwen pre-tokenizer regex finds (the pieces cover s):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n]* |
//   \s*[\r\n]+ | \s+(?!\S) | \s+
// The alternatives are tried in that order at each position, with the backtracking outcome
// written out per case (checked over every code point against HF in tools/gen_unicode_tables.py
// and on the golden strings). With marks_are_letters (Qwen3.5), \p{M} joins \p{L} in the letter
// runs and leaves the punctuation class.
template <typename Emit>
void split_pieces(std::string_view s, bool marks_are_letters, Emit&& emit) {
  const CharClass mark_as = marks_are_letters ? CharClass::kLetter : CharClass::kOther;
  const size_t n = s.size();
  auto at = [&](size_t i) -> CharAt {
    const auto b = uint8_t(s[i]);
    if (b < 0x80) return {1, unicode::char_class(b)}; // ASCII has no marks
    char32_t cp = 0;
    const auto len = uint8_t(unicode::utf8_decode(s, i, &cp));
    CharClass c = unicode::char_class(cp);
    if (c == CharClass::kMark) c = mark_as;
    return {len, c};
  };
  auto is_newline = [&](size_t i) { return s[i] == '\r' || s[i] == '\n'; };
  auto skip = [&](size_t i, CharClass c) {
    while (i < n) {
      const CharAt ch = at(i);
      if (ch.cls != c) break;
      i += ch.len;
    }
    return i;
  };
  auto skip_newlines = [&](size_t i) {
    while (i < n && is_newline(i)) i++;
    return i;
  };
  // Length of a contraction at s[i] == '\'' (0 if none). Case-insensitive as Oniguruma: ASCII
  // case plus U+017F LONG S, the one non-ASCII letter that case-folds to one of these letters.
  auto contraction = [&](size_t i) -> size_t {
    if (i + 1 >= n) return 0;
    if (uint8_t(s[i + 1]) == 0xC5 && i + 2 < n && uint8_t(s[i + 2]) == 0xBF) return 3; // 'ſ
    const char c1 = char(s[i + 1] | 0x20), c2 = i + 2 < n ? char(s[i + 2] | 0x20) : 0;
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if ((c1 == 'r' || c1 == 'v') && c2 == 'e') return 3;
    if (c1 == 'l' && c2 == 'l') return 3;
    return 0;
  };

  size_t i = 0;
  while (i < n) {
    if (s[i] == '\'') {
      if (const size_t m = contraction(i)) {
        emit(s.substr(i, m));
        i += m;
        continue;
      }
    }
    const CharAt c0 = at(i);
    const size_t i1 = i + c0.len;
    size_t j;
    if (c0.cls == CharClass::kLetter) {
      j = skip(i1, CharClass::kLetter);
    } else if (c0.cls != CharClass::kNumber && !is_newline(i) && i1 < n &&
               at(i1).cls == CharClass::kLetter) {
      j = skip(i1, CharClass::kLetter); // one non-letter, non-digit, non-newline prefix
    } else if (c0.cls == CharClass::kNumber) {
      j = i1; // digits one by one
    } else if (c0.cls == CharClass::kOther) {
      j = skip_newlines(skip(i1, CharClass::kOther));
    } else if (s[i] == ' ' && i1 < n && at(i1).cls == CharClass::kOther) {
      j = skip_newlines(skip(i1, CharClass::kOther));
    } else {
      // A whitespace run [i, end): up to its last newline if it has one; else all of it when it
      // ends the text or is one character; else all but its last character (which then starts
      // the next piece, e.g. " word").
      size_t end = i, last_start = i, after_newline = 0;
      while (end < n) {
        const CharAt ch = at(end);
        if (ch.cls != CharClass::kSpace) break;
        if (is_newline(end)) after_newline = end + 1;
        last_start = end;
        end += ch.len;
      }
      if (after_newline)
        j = after_newline;
      else if (end == n || last_start == i)
        j = end;
      else
        j = last_start;
    }
    emit(s.substr(i, j - i));
    i = j;
  }
}

// Scratch buffers of the BPE merge loop, reused across words.
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

// --- loading ---------------------------------------------------------------------------------

void Tokenizer::Impl::load(const std::string& text) {
  json j;
  RawModel raw;
  try {
    parse_tokenizer_json(text, &j, &raw);
  } catch (const json::exception& e) {
    VLM_FAIL("tokenizer '", path, "': invalid JSON: ", e.what());
  }
  VLM_CHECK(j.is_object(), "tokenizer '", path, "': the top level is not a JSON object");
  VLM_CHECK(j.contains("model") && j["model"].is_object(), "tokenizer '", path,
            "': no \"model\" object");
  check_pipeline(j);
  // Tables are sized by the largest id, so ids are checked against the number of tokens before
  // anything is allocated: a stray id near 2^31 must be an error, not 60 GB of empty strings.
  const json& added_list = j.value("added_tokens", json());
  id_limit = int64_t(raw.vocab.size()) + int64_t(added_list.is_array() ? added_list.size() : 0) +
             kMaxIdHoles;
  load_model(j["model"], raw);
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) load_added(j["added_tokens"]);

  // Per-id tables for decode and id_to_token.
  decoded.resize(tokens.size());
  std::string bytes;
  for (size_t id = 0; id < tokens.size(); id++) {
    // The ByteLevel decoder maps a token whose characters are all in the byte alphabet to those
    // bytes, and passes any other token through as its UTF-8 text.
    decoded[id] = token_bytes(tokens[id], &bytes) ? bytes : tokens[id];
  }
}

void Tokenizer::Impl::check_pipeline(const json& j) {
  auto dump = [](const json& v) {
    std::string s = v.dump();
    return s.size() > 300 ? s.substr(0, 300) + "..." : s;
  };
  auto type_of = [](const json& v) -> std::string {
    return v.is_object() && v.contains("type") && v["type"].is_string() ? v["type"] : "";
  };
  auto flag = [](const json& v, const char* key) {
    return v.contains(key) && v[key].is_boolean() && v[key].get<bool>();
  };
  const std::string file = "tokenizer '" + path + "'";

  const json& norm = j.value("normalizer", json());
  if (!norm.is_null()) {
    VLM_CHECK(type_of(norm) == "NFC", file,
              ": unsupported normalizer (supported: NFC or none): ", dump(norm));
    nfc = true;
  }

  const json& pre = j.value("pre_tokenizer", json());
  const std::string supported =
      " (supported: Sequence[Split(the Qwen2/Qwen3 or Qwen3.5 regex, Isolated), "
      "ByteLevel(add_prefix_space false, use_regex false)])";
  VLM_CHECK(type_of(pre) == "Sequence" && pre.contains("pretokenizers") &&
                pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2,
            file, ": unsupported pre_tokenizer", supported, ": ", dump(pre));
  const json& split = pre["pretokenizers"][0];
  const json& bytelevel = pre["pretokenizers"][1];
  VLM_CHECK(type_of(split) == "Split" && split.contains("pattern") &&
                split["pattern"].is_object() && split["pattern"].contains("Regex") &&
                split["pattern"]["Regex"].is_string(),
            file, ": unsupported pre_tokenizer[0]", supported, ": ", dump(split));
  const std::string regex = split["pattern"]["Regex"];
  if (regex == kQwen2Regex)
    marks_are_letters = false;
  else if (regex == kQwen35Regex)
    marks_are_letters = true;
  else
    VLM_FAIL(file, ": unsupported pre-tokenizer regex ", json(regex).dump(),
             " (supported: the Qwen2/Qwen3 regex ", json(std::string(kQwen2Regex)).dump(),
             " and the Qwen3.5 regex ", json(std::string(kQwen35Regex)).dump(), ")");
  VLM_CHECK(split.value("behavior", "") == "Isolated" && !flag(split, "invert"), file,
            ": unsupported Split behaviour (supported: Isolated, invert false): ", dump(split));
  VLM_CHECK(type_of(bytelevel) == "ByteLevel" && !flag(bytelevel, "add_prefix_space") &&
                !flag(bytelevel, "use_regex"),
            file, ": unsupported pre_tokenizer[1]", supported, ": ", dump(bytelevel));

  const json& dec = j.value("decoder", json());
  VLM_CHECK(type_of(dec) == "ByteLevel", file,
            ": unsupported decoder (supported: ByteLevel): ", dump(dec));
  const json& post = j.value("post_processor", json());
  VLM_CHECK(post.is_null() || type_of(post) == "ByteLevel", file,
            ": unsupported post_processor (supported: ByteLevel or none; templates that add "
            "special tokens are not applied by this tokenizer): ",
            dump(post));
}

void Tokenizer::Impl::load_model(const json& model, RawModel& raw) {
  const std::string file = "tokenizer '" + path + "'";
  const std::string type = model.value("type", "BPE");
  VLM_CHECK(type == "BPE", file, ": model.type is \"", type, "\"; only BPE is supported");
  VLM_CHECK(model.value("dropout", json()).is_null() || model["dropout"] == 0, file,
            ": model.dropout is set (", model["dropout"].dump(), "); BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = model.value(key, json());
    VLM_CHECK(v.is_null() || (v.is_string() && v.get<std::string>().empty()), file, ": model.", key,
              " is ", v.dump(), "; only empty is supported");
  }
  const json& im = model.value("ignore_merges", json(false));
  ignore_merges = im.is_boolean() && im.get<bool>();

  VLM_CHECK(model.contains("vocab") && model["vocab"].is_object(), file,
            ": model.vocab is missing or not an object");
  VLM_CHECK(raw.bad_vocab.empty(), file, ": model.vocab entry ", raw.bad_vocab,
            " is not an integer id");
  int64_t max_id = -1;
  for (const auto& [tok, id] : raw.vocab) {
    VLM_CHECK(id >= 0 && id < std::numeric_limits<int32_t>::max(), file, ": model.vocab[",
              json(tok).dump(), "] is ", id, ", not a non-negative 32-bit id");
    VLM_CHECK(id < id_limit, file, ": model.vocab[", json(tok).dump(), "] is ", id,
              ", far beyond the ", id_limit - kMaxIdHoles, " tokens of the file (at most ",
              kMaxIdHoles, " ids may be left unused)");
    max_id = std::max(max_id, id);
  }
  tokens.assign(size_t(max_id + 1), std::string());
  kind.assign(tokens.size(), 0);
  for (auto& [tok, id64] : raw.vocab) {
    const auto id = int32_t(id64);
    VLM_CHECK(kind[id] == 0, file, ": model.vocab gives id ", id, " to both ",
              json(tokens[id]).dump(), " and ", json(tok).dump());
    tokens[id] = std::move(tok);
    kind[id] = 1;
  }
  vocab_index.init(&tokens, tokens.size());
  for (size_t id = 0; id < tokens.size(); id++)
    if (kind[id]) vocab_index.insert(int32_t(id));
  if (ignore_merges) {
    word_bytes.resize(tokens.size());
    word_index.init(&word_bytes, tokens.size());
    for (size_t id = 0; id < tokens.size(); id++)
      if (kind[id] && token_bytes(tokens[id], &word_bytes[id])) word_index.insert(int32_t(id));
  }
  for (int b = 0; b < 256; b++) {
    const std::string t = byte_token(uint8_t(b));
    byte_ids[b] = vocab_index.find(t);
    VLM_CHECK(byte_ids[b] >= 0, file, ": model.vocab has no token for byte 0x", std::hex, b,
              std::dec, " (", json(t).dump(), "); a byte-level BPE vocabulary needs all 256");
  }

  VLM_CHECK(model.contains("merges") && model["merges"].is_array(), file,
            ": model.merges is missing or not an array");
  VLM_CHECK(raw.bad_merge.empty(), file, ": model.merges[", raw.bad_merge_index,
            "] = ", raw.bad_merge,
            " is not a pair of tokens (a 2-array, or two tokens split by a space)");
  merges.reserve(raw.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < raw.merges.size(); rank++) {
    const auto& [a, b] = raw.merges[rank];
    joined.assign(a).append(b);
    const int32_t ia = vocab_index.find(a), ib = vocab_index.find(b), ic = vocab_index.find(joined);
    if (ia < 0 || ib < 0 || ic < 0) {
      const std::string& missing = ia < 0 ? a : ib < 0 ? b : joined;
      VLM_FAIL(file, ": model.merges[", rank, "] = ", json::array({a, b}).dump(),
               " uses a token missing from model.vocab (", json(missing).dump(), ")");
    }
    merges.insert(ia, ib, {uint32_t(rank), ic});
  }
}

void Tokenizer::Impl::load_added(const json& list) {
  const std::string file = "tokenizer '" + path + "'";
  VLM_CHECK(list.is_array(), file, ": added_tokens is not an array");
  added.reserve(list.size()); // pointers into `added` are kept by the matchers
  for (size_t k = 0; k < list.size(); k++) {
    const json& t = list[k];
    const std::string where = "added_tokens[" + std::to_string(k) + "]";
    VLM_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() &&
                  t["id"].get<int64_t>() >= 0 &&
                  t["id"].get<int64_t>() < std::numeric_limits<int32_t>::max() &&
                  t.contains("content") && t["content"].is_string(),
              file, ": ", where, " needs an integer \"id\" and a string \"content\": ", t.dump());
    VLM_CHECK(t["id"].get<int64_t>() < id_limit, file, ": ", where, " has id ", t["id"].dump(),
              ", far beyond the ", id_limit - kMaxIdHoles, " tokens of the file (at most ",
              kMaxIdHoles, " ids may be left unused)");
    AddedToken a;
    a.id = t["id"].get<int32_t>();
    a.content = t["content"];
    VLM_CHECK(!a.content.empty(), file, ": ", where, " has empty content");
    VLM_CHECK(unicode::utf8_find_invalid(a.content) == std::string_view::npos, file, ": ", where,
              " content is not valid UTF-8");
    auto get_flag = [&](const char* key, bool dflt) {
      if (!t.contains(key) || t[key].is_null()) return dflt;
      VLM_CHECK(t[key].is_boolean(), file, ": ", where, ".", key, " is not a boolean");
      return t[key].get<bool>();
    };
    a.single_word = get_flag("single_word", false);
    a.lstrip = get_flag("lstrip", false);
    a.rstrip = get_flag("rstrip", false);
    a.special = get_flag("special", false);
    a.normalized = get_flag("normalized", !a.special);

    if (size_t(a.id) >= tokens.size()) {
      tokens.resize(size_t(a.id) + 1);
      kind.resize(tokens.size(), 0);
    }
    VLM_CHECK(kind[a.id] != 2 && kind[a.id] != 3, file, ": ", where, " reuses id ", a.id,
              " of added token ", json(tokens[a.id]).dump());
    tokens[a.id] = a.content; // an added token replaces a vocabulary entry with its id
    kind[a.id] = a.special ? 3 : 2;
    added_ids[a.content] = a.id;
    if (a.normalized && nfc) a.content = unicode::to_nfc(a.content); // matched after NFC
    added.push_back(std::move(a));
  }
  for (const AddedToken& a : added) (a.normalized ? normalized_matcher : raw_matcher).add(&a);
}

// --- encoding ----------------------------------------------------------------------------------

namespace {

// The code point ending at byte `end` (> 0) of valid UTF-8.
char32_t char_before(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) i--;
  char32_t cp = 0;
  unicode::utf8_decode(s, i, &cp);
  return cp;
}

} // namespace

// Splits s at the added tokens of m, as HF's AddedVocabulary::find_matches: leftmost-longest
// matches, non-overlapping, searched on after the end of each match (also one dropped by
// single_word); lstrip/rstrip widen a kept match over the whitespace beside it. Text between
// matches goes to on_text, match ids to *ids.
template <typename OnText>
void Tokenizer::Impl::split_added(std::string_view s, const AddedMatcher& m,
                                  std::vector<int32_t>* ids, OnText&& on_text) const {
  if (m.empty()) {
    on_text(s);
    return;
  }
  size_t done = 0, from = 0; // s[0, done) is consumed; the search resumes at `from`
  size_t start = 0;
  while (const AddedToken* t = m.find(s, from, &start)) {
    size_t stop = start + t->content.size();
    from = stop;
    if (start < done) continue; // inside the whitespace an rstrip took
    if (t->single_word) {
      const bool word_before = start > 0 && unicode::is_word_char(char_before(s, start));
      char32_t next = 0;
      const bool word_after =
          stop < s.size() && unicode::utf8_decode(s, stop, &next) && unicode::is_word_char(next);
      if (word_before || word_after) continue;
    }
    if (t->lstrip) {
      size_t b = start;
      while (b > done && unicode::is_space(char_before(s, b))) {
        b--;
        while ((uint8_t(s[b]) & 0xC0) == 0x80) b--;
      }
      start = b;
    }
    if (t->rstrip) {
      char32_t cp = 0;
      size_t len;
      while (stop < s.size() && (len = unicode::utf8_decode(s, stop, &cp)) && unicode::is_space(cp))
        stop += len;
    }
    if (done < start) on_text(s.substr(done, start - done));
    ids->push_back(t->id);
    done = stop;
  }
  if (done < s.size()) on_text(s.substr(done));
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>* ids) const {
  const size_t bad = unicode::utf8_find_invalid(text);
  VLM_CHECK(bad == std::string_view::npos, "tokenizer: the text is not valid UTF-8 (byte offset ",
            bad, " of ", text.size(), ")");
  WordCache& cache = thread_cache(instance_id);
  split_added(text, raw_matcher, ids, [&](std::string_view part) {
    if (nfc && !unicode::is_nfc_quick(part)) {
      const std::string normalized = unicode::to_nfc(part);
      split_added(normalized, normalized_matcher, ids,
                  [&](std::string_view p) { encode_normalized(p, ids, cache); });
    } else {
      split_added(part, normalized_matcher, ids,
                  [&](std::string_view p) { encode_normalized(p, ids, cache); });
    }
  });
}

void Tokenizer::Impl::encode_normalized(std::string_view s, std::vector<int32_t>* ids,
                                        WordCache& cache) const {
  split_pieces(s, marks_are_letters, [&](std::string_view word) {
    if (word.size() == 1) {
      ids->push_back(byte_ids[uint8_t(word[0])]);
      return;
    }
    if (word.size() > kCacheMaxWordBytes) {
      bpe(word, ids);
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
    bpe(word, ids);
    cache.insert(word, h, ids->data() + before, ids->size() - before);
  });
}

// Byte-pair merging of one word, as HF's BPE::merge_word: start from one symbol per byte and
// repeatedly apply the lowest-ranked merge present, leftmost first on ties. Short words (nearly
// all) scan an array of pair ranks; long ones (a CJK or Thai line is one word) use a min-heap of
// candidate pairs with lazy invalidation, O(n log n). Both do one merge-table lookup per pair.
void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    if (const int32_t id = word_index.find(word); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  if (word.empty()) return;
  if (word.size() <= kBpeScanMaxBytes)
    bpe_scan(word, ids);
  else
    bpe_heap(word, ids);
}

void Tokenizer::Impl::bpe_scan(std::string_view word, std::vector<int32_t>* ids) const {
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

void Tokenizer::Impl::bpe_heap(std::string_view word, std::vector<int32_t>* ids) const {
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

// --- public API ----------------------------------------------------------------------------------

std::vector<std::string_view> pre_tokenize(std::string_view text, bool marks_are_letters) {
  const size_t bad = unicode::utf8_find_invalid(text);
  VLM_CHECK(bad == std::string_view::npos,
            "pre_tokenize: the text is not valid UTF-8 (byte offset ", bad, ")");
  std::vector<std::string_view> pieces;
  split_pieces(text, marks_are_letters, [&](std::string_view p) { pieces.push_back(p); });
  return pieces;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    file = (fs::path(path) / "tokenizer.json").string();
    VLM_CHECK(fs::exists(file, ec), "tokenizer: directory '", path, "' has no tokenizer.json");
  } else {
    VLM_CHECK(fs::exists(path, ec), "tokenizer '", path, "': no such file or directory");
  }
  auto impl = std::make_shared<Impl>();
  impl->path = file;
  impl->instance_id = g_next_instance_id.fetch_add(1);
  try {
    impl->load(read_file(file));
  } catch (const json::exception& e) { // a value of an unexpected JSON type
    VLM_FAIL("tokenizer '", file, "': unexpected content: ", e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode_text(text, &ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (size_t k = 0; k < ids.size(); k++) {
    const int32_t id = ids[k];
    VLM_CHECK(id >= 0 && size_t(id) < impl_->tokens.size() && impl_->kind[id] != 0,
              "tokenizer decode: ids[", k, "] = ", id, " is not a token id (vocabulary size ",
              impl_->tokens.size(), ")");
    if (skip_special && impl_->kind[id] == 3) continue;
    bytes += impl_->decoded[id];
  }
  return unicode::utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::find_token(std::string_view token) const {
  // Added tokens first, as HF.
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  const int32_t id = impl_->vocab_index.find(token);
  if (id < 0 || impl_->tokens[id] != token) return std::nullopt;
  return id;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto id = find_token(token);
  VLM_CHECK(id, "tokenizer '", impl_->path, "': no token ", json(std::string(token)).dump());
  return *id;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  VLM_CHECK(id >= 0 && size_t(id) < impl_->tokens.size() && impl_->kind[id] != 0, "tokenizer '",
            impl_->path, "': id ", id, " is not a token id (vocabulary size ", impl_->tokens.size(),
            ")");
  return impl_->tokens[id];
}

int64_t Tokenizer::vocab_size() const { return int64_t(impl_->tokens.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[id] == 3;
}

const std::string& Tokenizer::path() const { return impl_->path; }

} // namespace vlm::io
