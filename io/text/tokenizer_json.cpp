#include "io/text/tokenizer_json.h"

#include "io/text/pre_tokenizer.h"
#include "src/base/check.h"

namespace vlm::io {

using json = nlohmann::json;

void parse_tokenizer_json(const std::string& text, json* rest, RawModel* raw) {
  std::string key1, key2, pending; // keys at depth 1 and 2, the current vocabulary key
  raw->vocab.reserve(1 << 18);
  raw->merges.reserve(1 << 18);
  auto bad_merge = [&](const json& v) {
    if (raw->bad_merge.empty()) {
      raw->bad_merge = v.dump();
      raw->bad_merge_index = raw->merges.size();
    }
    raw->merges.emplace_back(); // keeps the indices of later merges
  };
  using E = json::parse_event_t;
  *rest = json::parse(text, [&](int depth, E ev, json& v) {
    if (ev == E::key && depth <= 2) (depth == 1 ? key1 : key2) = v.get<std::string>();
    if (depth != 3 || key1 != "model") return true;
    if (key2 == "vocab") {
      if (ev == E::key) {
        pending = std::move(v.get_ref<std::string&>());
      } else if (ev == E::value || ev == E::object_end || ev == E::array_end) {
        if (v.is_number_integer())
          raw->vocab.emplace_back(std::move(pending), v.get<int64_t>());
        else if (raw->bad_vocab.empty())
          raw->bad_vocab = json(pending).dump() + ": " + v.dump();
      }
      return ev == E::object_start || ev == E::array_start; // keep nothing
    }
    if (key2 == "merges") {
      if (ev == E::array_end || ev == E::object_end) {
        if (v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_string())
          raw->merges.emplace_back(std::move(v[0].get_ref<std::string&>()),
                                   std::move(v[1].get_ref<std::string&>()));
        else
          bad_merge(v);
      } else if (ev == E::value) {
        // The older form "a b": byte-level tokens never contain a space.
        const std::string* m = v.is_string() ? &v.get_ref<const std::string&>() : nullptr;
        const size_t sp = m ? m->find(' ') : std::string::npos;
        if (sp != std::string::npos && m->find(' ', sp + 1) == std::string::npos)
          raw->merges.emplace_back(m->substr(0, sp), m->substr(sp + 1));
        else
          bad_merge(v);
      }
      return ev == E::object_start || ev == E::array_start;
    }
    return true;
  });
}

TokenizerPipeline check_pipeline(const json& j, const std::string& path) {
  auto dump = [](const json& v) {
    std::string s = v.dump();
    return s.size() > 300 ? s.substr(0, 300) + "..." : s;
  };
  auto type_of = [](const json& v) -> std::string {
    return v.is_object() && v.contains("type") && v["type"].is_string() ? v["type"] : "";
  };
  auto flag = [](const json& v, const char* key) {
    return v.contains(key) && v[key].is_boolean() && v[key].get<bool>();
  };
  const std::string file = "tokenizer '" + path + "'";
  TokenizerPipeline out;

  const json& norm = j.value("normalizer", json());
  if (!norm.is_null()) {
    VLM_CHECK(type_of(norm) == "NFC", file,
              ": unsupported normalizer (supported: NFC or none): ", dump(norm));
    out.nfc = true;
  }

  const json& pre = j.value("pre_tokenizer", json());
  const std::string supported =
      " (supported: Sequence[Split(the Qwen2/Qwen3 or Qwen3.5 regex, Isolated), "
      "ByteLevel(add_prefix_space false, use_regex false)])";
  VLM_CHECK(type_of(pre) == "Sequence" && pre.contains("pretokenizers") &&
                pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2,
            file, ": unsupported pre_tokenizer", supported, ": ", dump(pre));
  const json& split = pre["pretokenizers"][0];
  const json& bytelevel = pre["pretokenizers"][1];
  VLM_CHECK(type_of(split) == "Split" && split.contains("pattern") &&
                split["pattern"].is_object() && split["pattern"].contains("Regex") &&
                split["pattern"]["Regex"].is_string(),
            file, ": unsupported pre_tokenizer[0]", supported, ": ", dump(split));
  const std::string regex = split["pattern"]["Regex"];
  if (regex == kQwen2Regex)
    out.marks_are_letters = false;
  else if (regex == kQwen35Regex)
    out.marks_are_letters = true;
  else
    VLM_FAIL(file, ": unsupported pre-tokenizer regex ", json(regex).dump(),
             " (supported: the Qwen2/Qwen3 regex ", json(std::string(kQwen2Regex)).dump(),
             " and the Qwen3.5 regex ", json(std::string(kQwen35Regex)).dump(), ")");
  VLM_CHECK(split.value("behavior", "") == "Isolated" && !flag(split, "invert"), file,
            ": unsupported Split behaviour (supported: Isolated, invert false): ", dump(split));
  VLM_CHECK(type_of(bytelevel) == "ByteLevel" && !flag(bytelevel, "add_prefix_space") &&
                !flag(bytelevel, "use_regex"),
            file, ": unsupported pre_tokenizer[1]", supported, ": ", dump(bytelevel));

  const json& dec = j.value("decoder", json());
  VLM_CHECK(type_of(dec) == "ByteLevel", file,
            ": unsupported decoder (supported: ByteLevel): ", dump(dec));
  const json& post = j.value("post_processor", json());
  VLM_CHECK(post.is_null() || type_of(post) == "ByteLevel", file,
            ": unsupported post_processor (supported: ByteLevel or none; templates that add "
            "special tokens are not applied by this tokenizer): ",
            dump(post));
  return out;
}

} // namespace vlm::io
