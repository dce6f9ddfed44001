#include "io/text/byte_level.h"

#include <array>

#include "io/text/unicode.h"

namespace vlm::io {

namespace {

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

} // namespace

char32_t byte_char(uint8_t b) { return byte_to_char()[b]; }

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
  unicode::utf8_append(&s, byte_char(b));
  return s;
}

std::vector<std::string> byte_level_decoded(const std::vector<std::string>& tokens) {
  std::vector<std::string> decoded(tokens.size());
  std::string bytes;
  for (size_t id = 0; id < tokens.size(); id++)
    decoded[id] = token_bytes(tokens[id], &bytes) ? bytes : tokens[id];
  return decoded;
}

} // namespace vlm::io
