// GPT-2's byte-level alphabet, in which the Qwen vocabularies are written: each byte is shown as
// one printable code point (the printable Latin-1 bytes as themselves, the others as U+0100 + n
// in byte order), so vocabulary strings and merges are text ("Ġ" = byte 0x20). BPE starts from
// the tokens of single bytes (io/text/bpe.h); the ByteLevel decoder maps tokens back to bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::io {

// The code point that stands for byte b.
char32_t byte_char(uint8_t b);

// The raw bytes of a byte-level token string; false when some character is not in the alphabet.
bool token_bytes(std::string_view token, std::string* out);

// The byte-level token string of one byte.
std::string byte_token(uint8_t b);

// id -> the bytes HF's ByteLevel decoder makes of tokens[id]: a token whose characters are all in
// the byte alphabet becomes those bytes, any other token passes through as its UTF-8 text.
std::vector<std::string> byte_level_decoded(const std::vector<std::string>& tokens);

} // namespace vlm::io
