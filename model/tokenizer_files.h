// The tokenizer files that travel with a model (tokenizer.json, tokenizer_config.json, the chat
// template, ...): read once into memory, so that a run writes them into every checkpoint and HF
// snapshot it saves without going back to the folder they came from (which a resumed run never
// reads again, and which a checkpoint folder removed by keep_last no longer is).
#pragma once

#include <array>
#include <map>
#include <string>

namespace vlm::model {

// What a snapshot's tokenizer consists of (those that exist are copied with it).
inline constexpr std::array<const char*, 8> kTokenizerFileNames = {
    "tokenizer.json",      "tokenizer_config.json",   "vocab.json",
    "merges.txt",          "generation_config.json",  "special_tokens_map.json",
    "chat_template.jinja", "preprocessor_config.json"};

// The files of the tokenizer list (those that exist) in `dir`: name -> contents. "" = none.
// An unreadable listed file is an error naming it.
std::map<std::string, std::string> read_tokenizer_files(const std::string& dir);

} // namespace vlm::model
