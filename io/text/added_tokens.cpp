#include "io/text/added_tokens.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/text/tokenizer_json.h"
#include "io/text/unicode.h"
#include "src/base/check.h"

namespace vlm::io {

using json = nlohmann::json;

AddedToken parse_added_token(const json& t, const std::string& where, const std::string& file,
                             int64_t id_limit) {
  VLM_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() &&
                t["id"].get<int64_t>() >= 0 &&
                t["id"].get<int64_t>() < std::numeric_limits<int32_t>::max() &&
                t.contains("content") && t["content"].is_string(),
            file, ": ", where, " needs an integer \"id\" and a string \"content\": ", t.dump());
  VLM_CHECK(t["id"].get<int64_t>() < id_limit, file, ": ", where, " has id ", t["id"].dump(),
            ", far beyond the ", id_limit - kMaxIdHoles, " tokens of the file (at most ",
            kMaxIdHoles, " ids may be left unused)");
  AddedToken a;
  a.id = t["id"].get<int32_t>();
  a.content = t["content"];
  VLM_CHECK(!a.content.empty(), file, ": ", where, " has empty content");
  VLM_CHECK(unicode::utf8_find_invalid(a.content) == std::string_view::npos, file, ": ", where,
            " content is not valid UTF-8");
  auto get_flag = [&](const char* key, bool dflt) {
    if (!t.contains(key) || t[key].is_null()) return dflt;
    VLM_CHECK(t[key].is_boolean(), file, ": ", where, ".", key, " is not a boolean");
    return t[key].get<bool>();
  };
  a.single_word = get_flag("single_word", false);
  a.lstrip = get_flag("lstrip", false);
  a.rstrip = get_flag("rstrip", false);
  a.special = get_flag("special", false);
  a.normalized = get_flag("normalized", !a.special);
  return a;
}

void AddedMatcher::add(const AddedToken* t) {
  if (t->content.empty()) return;
  auto& bucket = by_first_[uint8_t(t->content[0])];
  bucket.push_back(t);
  std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
    return a->content.size() > b->content.size();
  });
  empty_ = false;
}

} // namespace vlm::io
