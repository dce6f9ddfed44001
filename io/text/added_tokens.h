// Step 1 of the tokenizer (io/text/tokenizer.h): the added tokens of tokenizer.json
// (<|im_start|>, <|image_pad|>, <think>, ...) are found in the text before anything else, as HF's
// AddedVocabulary does; only the text between them is normalized, pre-tokenized and BPE-encoded.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/text/unicode.h"

namespace vlm::io {

struct AddedToken {
  std::string content; // as matched (NFC-normalized when `normalized` and the normalizer is NFC)
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Entry `where` ("added_tokens[k]") of tokenizer.json's added_tokens, checked: an integer id
// below id_limit (the file's token count plus kMaxIdHoles, io/text/tokenizer_json.h), non-empty
// valid UTF-8 content, boolean flags. Errors name `file` and `where`.
AddedToken parse_added_token(const nlohmann::json& t, const std::string& where,
                             const std::string& file, int64_t id_limit);

// A match of an added token: its id and the bytes [start, stop) it takes (lstrip / rstrip
// widen it over the whitespace beside it).
struct AddedMatch {
  int32_t id = 0;
  size_t start = 0, stop = 0;
};

// Leftmost-longest search over a set of added tokens (what HF's Aho-Corasick automaton with
// MatchKind::LeftmostLongest finds): candidates bucketed by first byte, longest first.
class AddedMatcher {
public:
  // `t` must outlive the matcher; empty content is never matched.
  void add(const AddedToken* t);
  bool empty() const { return empty_; }
  // The next match that HF's AddedVocabulary::find_matches keeps in s: searched from *from on
  // (advanced past every match looked at, also one dropped by single_word), not starting before
  // `done` (the end of the previous match). False when there is none.
  bool next_match(std::string_view s, size_t done, size_t* from, AddedMatch* match) const;

private:
  const AddedToken* find(std::string_view s, size_t from, size_t* start) const;
  static char32_t char_before(std::string_view s, size_t end);
  static bool inside_word(std::string_view s, size_t start, size_t stop);
  static size_t strip_left(std::string_view s, size_t done, size_t start);
  static size_t strip_right(std::string_view s, size_t stop);

  std::array<std::vector<const AddedToken*>, 256> by_first_;
  bool empty_ = true;
};

// Splits s at the added tokens of m: leftmost-longest matches, non-overlapping. Text between
// matches goes to on_text, match ids to *ids.
template <typename OnText>
void split_added(std::string_view s, const AddedMatcher& m, std::vector<int32_t>* ids,
                 OnText&& on_text) {
  if (m.empty()) {
    on_text(s);
    return;
  }
  size_t done = 0, from = 0; // s[0, done) is consumed; the search resumes at `from`
  AddedMatch match;
  while (m.next_match(s, done, &from, &match)) {
    if (done < match.start) on_text(s.substr(done, match.start - done));
    ids->push_back(match.id);
    done = match.stop;
  }
  if (done < s.size()) on_text(s.substr(done));
}

// --- matching, inline: it runs on every text encode() sees (out of line, encode() of text dense
// with added tokens is ~4% slower) ----------------------------------------------------------------

// First match starting at or after `from`: sets *start and returns the token, or nullptr.
inline const AddedToken* AddedMatcher::find(std::string_view s, size_t from, size_t* start) const {
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

inline bool AddedMatcher::next_match(std::string_view s, size_t done, size_t* from,
                                     AddedMatch* match) const {
  size_t start = 0;
  while (const AddedToken* t = find(s, *from, &start)) {
    size_t stop = start + t->content.size();
    *from = stop;
    if (start < done) continue; // inside the whitespace an rstrip took
    if (t->single_word && inside_word(s, start, stop)) continue;
    if (t->lstrip) start = strip_left(s, done, start);
    if (t->rstrip) stop = strip_right(s, stop);
    *match = {t->id, start, stop};
    return true;
  }
  return false;
}

// The code point ending at byte `end` (> 0) of valid UTF-8.
inline char32_t AddedMatcher::char_before(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) i--;
  char32_t cp = 0;
  unicode::utf8_decode(s, i, &cp);
  return cp;
}

// True when a word character touches s[start, stop) on either side: a single_word token there
// is part of a longer word, not a match.
inline bool AddedMatcher::inside_word(std::string_view s, size_t start, size_t stop) {
  const bool word_before = start > 0 && unicode::is_word_char(char_before(s, start));
  char32_t next = 0;
  const bool word_after =
      stop < s.size() && unicode::utf8_decode(s, stop, &next) && unicode::is_word_char(next);
  return word_before || word_after;
}

// lstrip: the start of the whitespace before `start`, not reaching back before `done`.
inline size_t AddedMatcher::strip_left(std::string_view s, size_t done, size_t start) {
  size_t b = start;
  while (b > done && unicode::is_space(char_before(s, b))) {
    b--;
    while ((uint8_t(s[b]) & 0xC0) == 0x80) b--;
  }
  return b;
}

// rstrip: the end of the whitespace after `stop`.
inline size_t AddedMatcher::strip_right(std::string_view s, size_t stop) {
  char32_t cp = 0;
  size_t len;
  while (stop < s.size() && (len = unicode::utf8_decode(s, stop, &cp)) && unicode::is_space(cp))
    stop += len;
  return stop;
}

} // namespace vlm::io
