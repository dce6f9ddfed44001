// Training a small byte-level BPE tokenizer (the Qwen kind) from texts, for datasets that carry
// their own tokenizer (`vlmtrain data make-demo`). The result is the text of a Hugging Face
// `tokenizer.json` that io::Tokenizer and HF `tokenizers` load, with the pipeline of the Qwen3
// file: normalizer NFC; pre_tokenizer Sequence[Split(the Qwen2/Qwen3 regex, Isolated),
// ByteLevel(add_prefix_space false, use_regex false)]; post_processor and decoder ByteLevel.
//
// Vocabulary: ids 0..255 are the 256 byte symbols in GPT-2's bytes_to_unicode order (as Qwen3:
// "!" is 0, "Ā" = byte 0x00 is 188), then the tokens of the learned merges in the order they are
// learned, then `special_tokens` as added tokens (special, not normalized), in the given order.
//
// Training, as the standard BPE trainer: each text is split at the special tokens written in it,
// NFC-normalized and pre-tokenized exactly as Tokenizer::encode does; the pieces ("words") are
// counted; adjacent symbol pairs are counted over the words weighted by their counts; the most
// frequent pair is merged — ties go to the lexicographically smallest pair (left token's bytes,
// then right token's bytes, compared as unsigned bytes) — and this repeats until the vocabulary
// (256 bytes + merged tokens) reaches vocab_size - special_tokens.size(), or no pair occurs at
// least twice. A merge whose result is already a token (two ways of making the same bytes) adds
// a merge rule but no token. The output is deterministic: the same inputs give the same bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm::io {

// texts: valid UTF-8 (an error names the text's index and byte offset otherwise). vocab_size:
// the most ids the tokenizer may have, special tokens included (at least 256 + their number);
// it has exactly that many unless the texts run out of pairs occurring twice. special_tokens:
// distinct, non-empty, valid UTF-8.
std::string train_byte_level_bpe(const std::vector<std::string>& texts, int64_t vocab_size,
                                 const std::vector<std::string>& special_tokens);

} // namespace vlm::io
