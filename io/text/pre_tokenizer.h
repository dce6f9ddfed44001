// Step 3 of the tokenizer (io/text/tokenizer.h): the pre-tokenizer regex of Qwen2/Qwen3 or
// Qwen3.5 splits the normalized text between added tokens into pieces, which BPE then encodes one
// by one (io/text/bpe.h). No regex engine runs: a hand-written matcher over generated Unicode
// class tables (io/text/unicode.h) finds the pieces HF's Oniguruma finds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/text/unicode.h"

namespace vlm::io {

// The two pre-tokenizer regexes this matcher implements (tokenizer.json spelling). Qwen3.5's
// differs only in counting combining marks (\p{M}) as letters rather than as punctuation.
inline constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The pieces the Qwen pre-tokenizer regex finds in a valid UTF-8 text (the pieces cover it):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n]* |
//   \s*[\r\n]+ | \s+(?!\S) | \s+
// The alternatives are tried in that order at each position, with the backtracking outcome
// written out per case (checked over every code point against HF in
// tools/golden/gen_unicode_tables.py and on the golden strings). With marks_are_letters
// (Qwen3.5), \p{M} joins \p{L} in the letter runs and leaves the punctuation class.
class PieceSplitter {
public:
  PieceSplitter(std::string_view text, bool marks_are_letters);
  // The end of the piece that starts at byte i (< text.size()).
  size_t piece_end(size_t i) const;

private:
  using CharClass = unicode::CharClass;
  // Length and class of the character at a byte offset.
  struct CharAt {
    uint8_t len;
    CharClass cls;
  };
  CharAt at(size_t i) const;
  bool is_newline(size_t i) const { return s_[i] == '\r' || s_[i] == '\n'; }
  size_t skip(size_t i, CharClass c) const;
  size_t skip_newlines(size_t i) const;
  size_t contraction(size_t i) const;
  size_t whitespace_end(size_t i) const;

  std::string_view s_;
  CharClass mark_as_; // the class \p{M} counts as
};

// Calls emit(piece) for each piece of `s` (valid UTF-8), in order.
template <typename Emit>
void split_pieces(std::string_view s, bool marks_are_letters, Emit&& emit) {
  const PieceSplitter splitter(s, marks_are_letters);
  for (size_t i = 0; i < s.size();) {
    const size_t j = splitter.piece_end(i);
    emit(s.substr(i, j - i));
    i = j;
  }
}

// --- the matcher, inline: it runs once per piece (out of line, encode() is ~15% slower) --------

inline PieceSplitter::PieceSplitter(std::string_view text, bool marks_are_letters)
    : s_(text), mark_as_(marks_are_letters ? CharClass::kLetter : CharClass::kOther) {}

inline PieceSplitter::CharAt PieceSplitter::at(size_t i) const {
  const auto b = uint8_t(s_[i]);
  if (b < 0x80) return {1, unicode::char_class(b)}; // ASCII has no marks
  char32_t cp = 0;
  const auto len = uint8_t(unicode::utf8_decode(s_, i, &cp));
  CharClass c = unicode::char_class(cp);
  if (c == CharClass::kMark) c = mark_as_;
  return {len, c};
}

// The end of the run of class c that starts at i.
inline size_t PieceSplitter::skip(size_t i, CharClass c) const {
  while (i < s_.size()) {
    const CharAt ch = at(i);
    if (ch.cls != c) break;
    i += ch.len;
  }
  return i;
}

inline size_t PieceSplitter::skip_newlines(size_t i) const {
  while (i < s_.size() && is_newline(i)) i++;
  return i;
}

// Length of a contraction at s[i] == '\'' (0 if none). Case-insensitive as Oniguruma: ASCII case
// plus U+017F LONG S, the one non-ASCII letter that case-folds to one of these letters.
inline size_t PieceSplitter::contraction(size_t i) const {
  const size_t n = s_.size();
  if (i + 1 >= n) return 0;
  if (uint8_t(s_[i + 1]) == 0xC5 && i + 2 < n && uint8_t(s_[i + 2]) == 0xBF) return 3; // 'ſ
  const char c1 = char(s_[i + 1] | 0x20), c2 = i + 2 < n ? char(s_[i + 2] | 0x20) : 0;
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if ((c1 == 'r' || c1 == 'v') && c2 == 'e') return 3;
  if (c1 == 'l' && c2 == 'l') return 3;
  return 0;
}

// The piece of the whitespace run [i, end): up to its last newline if it has one; else all of it
// when it ends the text or is one character; else all but its last character (which then starts
// the next piece, e.g. " word").
inline size_t PieceSplitter::whitespace_end(size_t i) const {
  const size_t n = s_.size();
  size_t end = i, last_start = i, after_newline = 0;
  while (end < n) {
    const CharAt ch = at(end);
    if (ch.cls != CharClass::kSpace) break;
    if (is_newline(end)) after_newline = end + 1;
    last_start = end;
    end += ch.len;
  }
  if (after_newline) return after_newline;
  if (end == n || last_start == i) return end;
  return last_start;
}

// The alternatives of the regex in order; the first that matches at i gives the piece.
inline size_t PieceSplitter::piece_end(size_t i) const {
  const size_t n = s_.size();
  if (s_[i] == '\'') {
    if (const size_t m = contraction(i)) return i + m;
  }
  const CharAt c0 = at(i);
  const size_t i1 = i + c0.len;
  // Letters, after at most one non-letter, non-digit, non-newline prefix.
  if (c0.cls == CharClass::kLetter) return skip(i1, CharClass::kLetter);
  if (c0.cls != CharClass::kNumber && !is_newline(i) && i1 < n && at(i1).cls == CharClass::kLetter)
    return skip(i1, CharClass::kLetter);
  // Digits one by one.
  if (c0.cls == CharClass::kNumber) return i1;
  // Punctuation (and symbols), after at most one space, with the newlines that follow it.
  if (c0.cls == CharClass::kOther) return skip_newlines(skip(i1, CharClass::kOther));
  if (s_[i] == ' ' && i1 < n && at(i1).cls == CharClass::kOther)
    return skip_newlines(skip(i1, CharClass::kOther));
  return whitespace_end(i);
}

} // namespace vlm::io
