// Reading a Hugging Face tokenizer.json: the JSON parse, with the large vocabulary and merge
// lists taken out on the way, and the check that its pipeline (normalizer, pre-tokenizer,
// decoder, post-processor) is one this tokenizer implements (io/text/tokenizer.h lists them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace vlm::io {

// Unused ids a tokenizer.json may leave below its largest id (HF files have none or a few).
// Tables are sized by the largest id, so a stray id near 2^31 must be an error, not 60 GB of
// empty strings.
constexpr int64_t kMaxIdHoles = 4096;

// model.vocab and model.merges, taken out of the JSON while it is parsed (building them as JSON
// values first would double the load time). A malformed entry is kept as text for the error.
struct RawModel {
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string bad_vocab, bad_merge; // the first malformed entry (key and value / element)
  size_t bad_merge_index = 0;
};

// Parses tokenizer.json into `rest` (everything but the vocabulary and the merges) and `raw`.
// Throws nlohmann::json::exception on invalid JSON.
void parse_tokenizer_json(const std::string& text, nlohmann::json* rest, RawModel* raw);

// The pipeline settings the tokenizer acts on.
struct TokenizerPipeline {
  bool nfc = false;               // normalizer NFC (else none)
  bool marks_are_letters = false; // the Qwen3.5 pre-tokenizer regex (else Qwen2/Qwen3's)
};

// Those of tokenizer.json `j`; anything unsupported is an error naming tokenizer `path` and the
// key.
TokenizerPipeline check_pipeline(const nlohmann::json& j, const std::string& path);

} // namespace vlm::io
