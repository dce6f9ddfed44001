#include "io/text/bpe_trainer.h"

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "io/text/byte_level.h"
#include "io/text/pre_tokenizer.h"
#include "io/text/tokenizer.h"
#include "io/text/unicode.h"
#include "src/base/check.h"

namespace vlm::io {

namespace {

using ojson = nlohmann::ordered_json;

// Byte-level spelling of raw bytes ("Ġhello" for " hello").
std::string byte_level(std::string_view bytes) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    for (int b = 0; b < 256; b++) t[size_t(b)] = byte_token(uint8_t(b));
    return t;
  }();
  std::string out;
  for (char c : bytes) out += table[uint8_t(c)];
  return out;
}

// Calls on_text for each stretch of `text` between the special tokens written in it
// (leftmost-longest matches, as Tokenizer::encode finds added tokens).
template <typename OnText>
void split_at_specials(std::string_view text, const std::vector<std::string>& specials,
                       OnText&& on_text) {
  size_t done = 0;
  for (size_t p = 0; p < text.size();) {
    size_t len = 0;
    for (const std::string& s : specials)
      if (s.size() > len && text.compare(p, s.size(), s) == 0) len = s.size();
    if (len == 0) {
      p++;
      continue;
    }
    if (done < p) on_text(text.substr(done, p - done));
    p += len;
    done = p;
  }
  if (done < text.size()) on_text(text.substr(done));
}

// The merge loop over counted words. Pair counts are kept incrementally: a merge only revisits
// the words that hold its pair. The best pair comes from a max-heap with lazy deletion (an
// entry whose count is no longer current is dropped when it surfaces).
class BpeTrainer {
public:
  struct Merge {
    int32_t left, right;
  };

  explicit BpeTrainer(const std::map<std::string, int64_t>& word_counts) {
    // Ids 0..255: the byte symbols ordered by their byte-level code point (GPT-2's order).
    std::array<int, 256> order{};
    for (int b = 0; b < 256; b++) order[size_t(b)] = b;
    std::sort(order.begin(), order.end(),
              [](int a, int b) { return byte_char(uint8_t(a)) < byte_char(uint8_t(b)); });
    for (int id = 0; id < 256; id++) {
      const auto b = uint8_t(order[size_t(id)]);
      byte_id_[b] = id;
      add_token(std::string(1, char(b)));
    }
    for (const auto& [word, count] : word_counts) {
      std::vector<int32_t> symbols;
      symbols.reserve(word.size());
      for (char c : word) symbols.push_back(byte_id_[uint8_t(c)]);
      words_.push_back(std::move(symbols));
      freq_.push_back(count);
    }
    for (size_t w = 0; w < words_.size(); w++) count_pairs(int32_t(w), +1);
    push_touched();
  }

  // Learns merges until there are `max_tokens` tokens or no pair occurs at least twice.
  void run(size_t max_tokens) {
    std::vector<int64_t> seen(words_.size(), -1); // word -> last merge round that visited it
    int64_t merge_round = -1;
    while (tokens_.size() < max_tokens) {
      const Candidate* best = nullptr;
      while (!heap_.empty()) {
        const Candidate& top = heap_.front();
        auto it = pair_count_.find(key(top.left, top.right));
        if (it != pair_count_.end() && it->second == top.count) {
          best = &top;
          break;
        }
        pop();
      }
      if (!best || best->count < 2) break;
      const Merge m{best->left, best->right};
      pop();
      const std::string joined = tokens_[size_t(m.left)] + tokens_[size_t(m.right)];
      auto found = token_ids_.find(joined);
      const int32_t result = found != token_ids_.end() ? found->second : add_token(joined);
      // A pair merged before can come back when a later merge re-makes its left or right
      // token; it is merged again but keeps its first rule (encoding applies that one).
      if (merged_.insert(key(m.left, m.right)).second) merges_.push_back(m);
      merge_round++;

      std::vector<int32_t> holders;
      if (auto where = pair_words_.find(key(m.left, m.right)); where != pair_words_.end()) {
        holders = std::move(where->second);
        pair_words_.erase(where);
      }
      for (int32_t w : holders) {
        if (seen[size_t(w)] == merge_round) continue;
        seen[size_t(w)] = merge_round;
        std::vector<int32_t>& sym = words_[size_t(w)];
        bool present = false;
        for (size_t i = 0; i + 1 < sym.size() && !present; i++)
          present = sym[i] == m.left && sym[i + 1] == m.right;
        if (!present) continue;
        count_pairs(w, -1);
        std::vector<int32_t> out;
        out.reserve(sym.size());
        for (size_t i = 0; i < sym.size(); i++) {
          if (i + 1 < sym.size() && sym[i] == m.left && sym[i + 1] == m.right) {
            out.push_back(result);
            i++;
          } else {
            out.push_back(sym[i]);
          }
        }
        sym = std::move(out);
        count_pairs(w, +1);
      }
      push_touched();
    }
  }

  const std::vector<std::string>& tokens() const { return tokens_; } // id -> raw bytes
  const std::vector<Merge>& merges() const { return merges_; }

private:
  struct Candidate {
    int64_t count;
    int32_t left, right;
  };

  static uint64_t key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint64_t(uint32_t(b));
  }

  int32_t add_token(const std::string& bytes) {
    const auto id = int32_t(tokens_.size());
    tokens_.push_back(bytes);
    token_ids_.emplace(bytes, id);
    return id;
  }

  // Adds (sign +1) or removes (-1) the pairs of word w, weighted by its count.
  void count_pairs(int32_t w, int sign) {
    const std::vector<int32_t>& sym = words_[size_t(w)];
    for (size_t i = 0; i + 1 < sym.size(); i++) {
      const uint64_t k = key(sym[i], sym[i + 1]);
      int64_t& c = pair_count_[k];
      c += sign * freq_[size_t(w)];
      if (c == 0) pair_count_.erase(k);
      if (sign > 0) pair_words_[k].push_back(w);
      touched_.insert(k);
    }
  }

  // Heap order: larger count first, then the smaller (left bytes, right bytes).
  bool after(const Candidate& x, const Candidate& y) const {
    if (x.count != y.count) return x.count < y.count;
    const std::string &xl = tokens_[size_t(x.left)], &yl = tokens_[size_t(y.left)];
    if (xl != yl) return xl > yl;
    return tokens_[size_t(x.right)] > tokens_[size_t(y.right)];
  }
  void push(const Candidate& c) {
    heap_.push_back(c);
    std::push_heap(heap_.begin(), heap_.end(),
                   [this](const Candidate& x, const Candidate& y) { return after(x, y); });
  }
  void pop() {
    std::pop_heap(heap_.begin(), heap_.end(),
                  [this](const Candidate& x, const Candidate& y) { return after(x, y); });
    heap_.pop_back();
  }
  // New heap entries for the pairs whose count changed (and is still positive). The heap's
  // order is total, so the order of pushing does not matter.
  void push_touched() {
    for (uint64_t k : touched_) {
      auto it = pair_count_.find(k);
      if (it != pair_count_.end()) push({it->second, int32_t(k >> 32), int32_t(uint32_t(k))});
    }
    touched_.clear();
  }

  std::array<int32_t, 256> byte_id_{};
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> token_ids_;
  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> freq_;
  std::unordered_map<uint64_t, int64_t> pair_count_;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words_; // may hold stale entries
  std::unordered_set<uint64_t> touched_;
  std::unordered_set<uint64_t> merged_; // pairs with a merge rule
  std::vector<Candidate> heap_;
  std::vector<Merge> merges_;
};

ojson byte_level_options() {
  return ojson{{"type", "ByteLevel"},
               {"add_prefix_space", false},
               {"trim_offsets", false},
               {"use_regex", false}};
}

} // namespace

std::string train_byte_level_bpe(const std::vector<std::string>& texts, int64_t vocab_size,
                                 const std::vector<std::string>& special_tokens) {
  std::set<std::string> distinct;
  for (size_t k = 0; k < special_tokens.size(); k++) {
    const std::string& s = special_tokens[k];
    VLM_CHECK(!s.empty(), "bpe trainer: special token ", k, " is empty");
    VLM_CHECK(unicode::utf8_find_invalid(s) == std::string::npos, "bpe trainer: special token ", k,
              " is not valid UTF-8");
    VLM_CHECK(distinct.insert(s).second, "bpe trainer: special token ", ojson(s).dump(),
              " is given twice");
  }
  const int64_t min_size = 256 + int64_t(special_tokens.size());
  VLM_CHECK(vocab_size >= min_size, "bpe trainer: vocab_size ", vocab_size, " is below ", min_size,
            " (256 byte tokens + ", special_tokens.size(), " special tokens)");

  // Words: what Tokenizer::encode hands to BPE, counted.
  std::map<std::string, int64_t> word_counts;
  for (size_t t = 0; t < texts.size(); t++) {
    const size_t bad = unicode::utf8_find_invalid(texts[t]);
    VLM_CHECK(bad == std::string::npos, "bpe trainer: text ", t,
              " is not valid UTF-8 (byte offset ", bad, ")");
    split_at_specials(texts[t], special_tokens, [&](std::string_view part) {
      const std::string nfc = unicode::to_nfc(part);
      for (std::string_view piece : pre_tokenize(nfc, /*marks_are_letters=*/false))
        word_counts[std::string(piece)]++;
    });
  }

  BpeTrainer trainer(word_counts);
  trainer.run(size_t(vocab_size) - special_tokens.size());
  const std::vector<std::string>& tokens = trainer.tokens();

  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  ojson added = ojson::array();
  for (size_t k = 0; k < special_tokens.size(); k++)
    added.push_back({{"id", int64_t(tokens.size() + k)},
                     {"content", special_tokens[k]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  j["added_tokens"] = added;
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", ojson::array({ojson{{"type", "Split"},
                                            {"pattern", {{"Regex", std::string(kQwen2Regex)}}},
                                            {"behavior", "Isolated"},
                                            {"invert", false}},
                                      byte_level_options()})}};
  j["post_processor"] = byte_level_options();
  j["decoder"] = byte_level_options();
  ojson vocab = ojson::object();
  for (size_t id = 0; id < tokens.size(); id++) vocab[byte_level(tokens[id])] = int64_t(id);
  ojson merges = ojson::array();
  for (const auto& m : trainer.merges())
    merges.push_back(
        ojson::array({byte_level(tokens[size_t(m.left)]), byte_level(tokens[size_t(m.right)])}));
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  return j.dump(2) + "\n";
}

} // namespace vlm::io
