#include "io/text/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "io/text/added_tokens.h"
#include "io/text/bpe.h"
#include "io/text/byte_level.h"
#include "io/text/pre_tokenizer.h"
#include "io/text/string_index.h"
#include "io/text/tokenizer_json.h"
#include "io/text/unicode.h"
#include "src/base/check.h"

// The Tokenizer glues the stages together: tokenizer_json.h reads the file, added_tokens.h finds
// the added tokens, unicode.h normalizes, pre_tokenizer.h splits, bpe.h merges, byte_level.h
// maps tokens to bytes and back.

namespace vlm::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

std::atomic<uint64_t> g_next_instance_id{1};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  VLM_CHECK(f, "tokenizer '", path, "': cannot open the file");
  std::ostringstream ss;
  ss << f.rdbuf();
  VLM_CHECK(!f.bad(), "tokenizer '", path, "': read error");
  return ss.str();
}

} // namespace

struct Tokenizer::Impl {
  std::string path;
  uint64_t instance_id = 0;       // keys this tokenizer's per-thread word caches
  int64_t id_limit = 0;           // every id is below this (load)
  bool nfc = false;               // normalizer
  bool marks_are_letters = false; // Qwen3.5 regex

  std::vector<std::string> tokens;  // id -> token string ("" for unused ids)
  std::vector<std::string> decoded; // id -> bytes the ByteLevel decoder makes of it
  std::vector<uint8_t> kind;        // id -> 0 unused, 1 vocabulary, 2 added, 3 special
  StringIndex vocab_index;          // model.vocab strings -> id
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_ids;
  BpeModel bpe;
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, normalized_matcher;

  void load(const std::string& text);
  void load_model(const json& model, RawModel& raw);
  void load_vocab(const json& model, RawModel& raw, const std::string& file);
  void load_added(const json& list);

  void encode_text(std::string_view text, std::vector<int32_t>* ids) const;
  void encode_normalized(std::string_view s, std::vector<int32_t>* ids, WordCache& cache) const;
};

// --- loading ---------------------------------------------------------------------------------

void Tokenizer::Impl::load(const std::string& text) {
  json j;
  RawModel raw;
  try {
    parse_tokenizer_json(text, &j, &raw);
  } catch (const json::exception& e) {
    VLM_FAIL("tokenizer '", path, "': invalid JSON: ", e.what());
  }
  VLM_CHECK(j.is_object(), "tokenizer '", path, "': the top level is not a JSON object");
  VLM_CHECK(j.contains("model") && j["model"].is_object(), "tokenizer '", path,
            "': no \"model\" object");
  const TokenizerPipeline pipeline = check_pipeline(j, path);
  nfc = pipeline.nfc;
  marks_are_letters = pipeline.marks_are_letters;
  // Tables are sized by the largest id, so ids are checked against the number of tokens before
  // anything is allocated.
  const json& added_list = j.value("added_tokens", json());
  id_limit = int64_t(raw.vocab.size()) + int64_t(added_list.is_array() ? added_list.size() : 0) +
             kMaxIdHoles;
  load_model(j["model"], raw);
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) load_added(j["added_tokens"]);
  decoded = byte_level_decoded(tokens); // per-id table for decode
}

void Tokenizer::Impl::load_model(const json& model, RawModel& raw) {
  const std::string file = "tokenizer '" + path + "'";
  const std::string type = model.value("type", "BPE");
  VLM_CHECK(type == "BPE", file, ": model.type is \"", type, "\"; only BPE is supported");
  VLM_CHECK(model.value("dropout", json()).is_null() || model["dropout"] == 0, file,
            ": model.dropout is set (", model["dropout"].dump(), "); BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = model.value(key, json());
    VLM_CHECK(v.is_null() || (v.is_string() && v.get<std::string>().empty()), file, ": model.", key,
              " is ", v.dump(), "; only empty is supported");
  }
  const json& im = model.value("ignore_merges", json(false));
  bpe.ignore_merges = im.is_boolean() && im.get<bool>();

  load_vocab(model, raw, file);
  bpe.index_words(tokens, kind);
  bpe.find_byte_ids(vocab_index, file);

  VLM_CHECK(model.contains("merges") && model["merges"].is_array(), file,
            ": model.merges is missing or not an array");
  VLM_CHECK(raw.bad_merge.empty(), file, ": model.merges[", raw.bad_merge_index,
            "] = ", raw.bad_merge,
            " is not a pair of tokens (a 2-array, or two tokens split by a space)");
  bpe.add_merges(raw.merges, vocab_index, file);
}

// model.vocab into tokens, kind and vocab_index (the token strings move out of raw).
void Tokenizer::Impl::load_vocab(const json& model, RawModel& raw, const std::string& file) {
  VLM_CHECK(model.contains("vocab") && model["vocab"].is_object(), file,
            ": model.vocab is missing or not an object");
  VLM_CHECK(raw.bad_vocab.empty(), file, ": model.vocab entry ", raw.bad_vocab,
            " is not an integer id");
  int64_t max_id = -1;
  for (const auto& [tok, id] : raw.vocab) {
    VLM_CHECK(id >= 0 && id < std::numeric_limits<int32_t>::max(), file, ": model.vocab[",
              json(tok).dump(), "] is ", id, ", not a non-negative 32-bit id");
    VLM_CHECK(id < id_limit, file, ": model.vocab[", json(tok).dump(), "] is ", id,
              ", far beyond the ", id_limit - kMaxIdHoles, " tokens of the file (at most ",
              kMaxIdHoles, " ids may be left unused)");
    max_id = std::max(max_id, id);
  }
  tokens.assign(size_t(max_id + 1), std::string());
  kind.assign(tokens.size(), 0);
  for (auto& [tok, id64] : raw.vocab) {
    const auto id = int32_t(id64);
    VLM_CHECK(kind[id] == 0, file, ": model.vocab gives id ", id, " to both ",
              json(tokens[id]).dump(), " and ", json(tok).dump());
    tokens[id] = std::move(tok);
    kind[id] = 1;
  }
  vocab_index.init(&tokens, tokens.size());
  for (size_t id = 0; id < tokens.size(); id++)
    if (kind[id]) vocab_index.insert(int32_t(id));
}

void Tokenizer::Impl::load_added(const json& list) {
  const std::string file = "tokenizer '" + path + "'";
  VLM_CHECK(list.is_array(), file, ": added_tokens is not an array");
  added.reserve(list.size()); // pointers into `added` are kept by the matchers
  for (size_t k = 0; k < list.size(); k++) {
    const std::string where = "added_tokens[" + std::to_string(k) + "]";
    AddedToken a = parse_added_token(list[k], where, file, id_limit);
    if (size_t(a.id) >= tokens.size()) {
      tokens.resize(size_t(a.id) + 1);
      kind.resize(tokens.size(), 0);
    }
    VLM_CHECK(kind[a.id] != 2 && kind[a.id] != 3, file, ": ", where, " reuses id ", a.id,
              " of added token ", json(tokens[a.id]).dump());
    tokens[a.id] = a.content; // an added token replaces a vocabulary entry with its id
    kind[a.id] = a.special ? 3 : 2;
    added_ids[a.content] = a.id;
    if (a.normalized && nfc) a.content = unicode::to_nfc(a.content); // matched after NFC
    added.push_back(std::move(a));
  }
  for (const AddedToken& a : added) (a.normalized ? normalized_matcher : raw_matcher).add(&a);
}

// --- encoding ----------------------------------------------------------------------------------

// Added tokens in the raw text first, then (NFC when the normalizer asks) the normalized ones in
// the text between, then pre-tokenization and BPE of what is left.
void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>* ids) const {
  const size_t bad = unicode::utf8_find_invalid(text);
  VLM_CHECK(bad == std::string_view::npos, "tokenizer: the text is not valid UTF-8 (byte offset ",
            bad, " of ", text.size(), ")");
  WordCache& cache = thread_word_cache(instance_id);
  split_added(text, raw_matcher, ids, [&](std::string_view part) {
    if (nfc && !unicode::is_nfc_quick(part)) {
      const std::string normalized = unicode::to_nfc(part);
      split_added(normalized, normalized_matcher, ids,
                  [&](std::string_view p) { encode_normalized(p, ids, cache); });
    } else {
      split_added(part, normalized_matcher, ids,
                  [&](std::string_view p) { encode_normalized(p, ids, cache); });
    }
  });
}

void Tokenizer::Impl::encode_normalized(std::string_view s, std::vector<int32_t>* ids,
                                        WordCache& cache) const {
  split_pieces(s, marks_are_letters,
               [&](std::string_view word) { bpe.encode_word(word, cache, ids); });
}

// --- public API ----------------------------------------------------------------------------------

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    file = (fs::path(path) / "tokenizer.json").string();
    VLM_CHECK(fs::exists(file, ec), "tokenizer: directory '", path, "' has no tokenizer.json");
  } else {
    VLM_CHECK(fs::exists(path, ec), "tokenizer '", path, "': no such file or directory");
  }
  auto impl = std::make_shared<Impl>();
  impl->path = file;
  impl->instance_id = g_next_instance_id.fetch_add(1);
  try {
    impl->load(read_file(file));
  } catch (const json::exception& e) { // a value of an unexpected JSON type
    VLM_FAIL("tokenizer '", file, "': unexpected content: ", e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode_text(text, &ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (size_t k = 0; k < ids.size(); k++) {
    const int32_t id = ids[k];
    VLM_CHECK(id >= 0 && size_t(id) < impl_->tokens.size() && impl_->kind[id] != 0,
              "tokenizer decode: ids[", k, "] = ", id, " is not a token id (vocabulary size ",
              impl_->tokens.size(), ")");
    if (skip_special && impl_->kind[id] == 3) continue;
    bytes += impl_->decoded[id];
  }
  return unicode::utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::find_token(std::string_view token) const {
  // Added tokens first, as HF.
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  const int32_t id = impl_->vocab_index.find(token);
  if (id < 0 || impl_->tokens[id] != token) return std::nullopt;
  return id;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto id = find_token(token);
  VLM_CHECK(id, "tokenizer '", impl_->path, "': no token ", json(std::string(token)).dump());
  return *id;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  VLM_CHECK(id >= 0 && size_t(id) < impl_->tokens.size() && impl_->kind[id] != 0, "tokenizer '",
            impl_->path, "': id ", id, " is not a token id (vocabulary size ", impl_->tokens.size(),
            ")");
  return impl_->tokens[id];
}

int64_t Tokenizer::vocab_size() const { return int64_t(impl_->tokens.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[id] == 3;
}

const std::string& Tokenizer::path() const { return impl_->path; }

} // namespace vlm::io
