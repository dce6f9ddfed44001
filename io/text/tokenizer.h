// The byte-level BPE tokenizer of the Qwen family, read from a Hugging Face `tokenizer.json`, with
// ids identical to HF `tokenizers` (checked against its output in
// tests/io/text/test_tokenizer.cpp). The pipeline, as HF runs it for these files:
//   1. added tokens (<|im_start|>, <|image_pad|>, <think>, ...) are matched in the raw text,
//      leftmost-longest, with each token's lstrip / rstrip / single_word / normalized flags
//      (added_tokens.h);
//   2. the text between them is NFC-normalized (Unicode 9.0, as HF; unicode.h);
//   3. split by the pre-tokenizer regex of Qwen2/Qwen3 or Qwen3.5 (a hand-written matcher over
//      generated Unicode 16.0 class tables, as HF's Oniguruma; pre_tokenizer.h);
//   4. each piece's UTF-8 bytes are merged by BPE rank (with a per-thread cache of words; bpe.h).
// decode() maps tokens back to bytes through GPT-2's byte alphabet (byte_level.h).
// Supported tokenizer.json (read by tokenizer_json.h): model BPE; normalizer NFC or none;
// pre_tokenizer Sequence[Split(one of the two Qwen regexes, Isolated), ByteLevel(use_regex false)];
// decoder ByteLevel; post_processor ByteLevel or none. Anything else is a load error naming the
// file and the key.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::io {

class Tokenizer {
public:
  // path: a tokenizer.json file or a directory containing one. Errors name the file and what is
  // wrong.
  static Tokenizer from_file(const std::string& path);

  // Token ids of `text` (valid UTF-8, else a vlm::Error naming the byte offset); added and
  // special tokens written in the text are matched and become their single id. No BOS/EOS.
  std::vector<int32_t> encode(std::string_view text) const;
  // The text of `ids`: byte-level tokens back to bytes, added tokens as their content (dropped
  // when special and skip_special), bytes that do not form valid UTF-8 (a multi-byte character
  // cut between ids) as U+FFFD. An id outside the vocabulary is an error naming it.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Token strings are those of tokenizer.json (byte-level form, e.g. "Ġhello" for " hello").
  int32_t token_to_id(std::string_view token) const; // error naming the token when missing
  std::optional<int32_t> find_token(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const; // error naming the id when out of range
  // Largest id + 1, added tokens included (151669 for Qwen3).
  int64_t vocab_size() const;
  // True for added tokens marked "special" (those decode(ids, true) drops).
  bool is_special(int32_t id) const;
  const std::string& path() const;

  // All methods are const and thread-safe: several loader threads may share one tokenizer
  // (copies are cheap and share the tables).

  struct Impl;

private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// The pieces the pre-tokenizer regex splits `text` (valid UTF-8) into, without normalization or
// added tokens: marks_are_letters false for the Qwen2/Qwen3 regex, true for Qwen3.5's. For tests
// and debugging; encode() applies it to the NFC text between added tokens.
std::vector<std::string_view> pre_tokenize(std::string_view text, bool marks_are_letters);

} // namespace vlm::io
