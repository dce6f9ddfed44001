// Unicode helpers of the tokenizer: UTF-8 decoding/encoding, the character classes of the
// pre-tokenizer regex, and NFC normalization. The data tables are generated
// (tools/golden/gen_unicode_tables.py -> io/text/unicode_tables.inc) to reproduce Hugging Face
// `tokenizers` exactly, which uses two Unicode versions: 16.0 for the regex classes (its Oniguruma)
// and 9.0 for NFC (its normalization crate). Characters newer than 9.0 therefore pass NFC
// unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace vlm::io::unicode {

constexpr char32_t kReplacementChar = 0xFFFD;

// Unicode versions of the generated tables, e.g. "16.0.0" and "9.0.0".
const char* class_unicode_version();
const char* nfc_unicode_version();

// --- UTF-8 -------------------------------------------------------------------------------------

// Decodes the code point starting at s[i] (i < s.size()) into *cp and returns its length in
// bytes, or 0 when the bytes there are not valid UTF-8 (truncated, overlong, surrogate, above
// U+10FFFF, stray continuation byte).
size_t utf8_decode(std::string_view s, size_t i, char32_t* cp);
// Appends the UTF-8 encoding of cp (a valid scalar value).
void utf8_append(std::string* out, char32_t cp);
// Byte offset of the first invalid UTF-8 sequence, or std::string_view::npos when s is valid.
size_t utf8_find_invalid(std::string_view s);
// Valid UTF-8 from arbitrary bytes: each maximal invalid subpart becomes one U+FFFD (the
// "substitution of maximal subparts" practice; what Rust's String::from_utf8_lossy does).
std::string utf8_lossy(std::string_view bytes);

// --- Character properties -----------------------------------------------------------------------

// Classes of the pre-tokenizer regex (Oniguruma semantics): \p{L}, \p{M}, \p{N}, \s (U+0009..
// U+000D, U+0085, Zs, Zl, Zp); kOther is everything else, unassigned code points included.
enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3, kMark = 4 };

// Layout of the property byte (generated; tools/golden/gen_unicode_tables.py).
constexpr int kPropBlockShift = 7;
constexpr uint8_t kPropClassMask = 0x07;
constexpr uint8_t kPropNfcMaybe = 1 << 3; // may compose with the previous character
constexpr uint8_t kPropNfcNo = 1 << 4;    // never occurs in NFC output
constexpr uint8_t kPropCcc = 1 << 5;      // canonical combining class != 0
constexpr uint8_t kPropWord = 1 << 6;     // \w (single_word added tokens), see is_word_char

namespace detail {
extern const uint16_t* const prop_stage1;
extern const uint8_t* const prop_stage2;
} // namespace detail

// The property byte of cp (cp <= 0x10FFFF): two table loads, no branches.
inline uint8_t props(char32_t cp) {
  constexpr char32_t mask = (char32_t(1) << kPropBlockShift) - 1;
  return detail::prop_stage2[(char32_t(detail::prop_stage1[cp >> kPropBlockShift])
                              << kPropBlockShift) |
                             (cp & mask)];
}
inline CharClass char_class(char32_t cp) { return CharClass(props(cp) & kPropClassMask); }
// Unicode White_Space, which equals the regex \s above and Rust's char::is_whitespace.
inline bool is_space(char32_t cp) { return char_class(cp) == CharClass::kSpace; }
// Rust regex \w (Alphabetic, marks, Nd, Pc, Join_Control) approximated with general categories:
// L, M, Nd, Nl, Pc, U+200C/U+200D (Alphabetic's Other_Alphabetic symbols such as U+24B6 are not
// included). Used only for added tokens with single_word = true.
inline bool is_word_char(char32_t cp) { return (props(cp) & kPropWord) != 0; }
// Canonical combining class (Unicode 9.0, as the NFC data).
uint8_t combining_class(char32_t cp);

// --- NFC -----------------------------------------------------------------------------------------

// True when s (valid UTF-8) is certainly in NFC: the quick check of UAX #15 with "maybe" taken
// as "no". Fast; true for nearly all real text.
bool is_nfc_quick(std::string_view s);
// NFC normalization of s (valid UTF-8; checked, an error names the byte offset). Only the
// stretches that fail the quick check are decomposed, reordered and recomposed.
std::string to_nfc(std::string_view s);

} // namespace vlm::io::unicode
