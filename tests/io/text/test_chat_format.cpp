// Chat formatting against tools/golden/gen_chat.py: an independent Python rendering of the
// reference trainer's cookers and label rule, tokenized by HF `tokenizers` with the real Qwen3
// tokenizer. Ids and labels must be equal token for token.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/text/chat_format.h"

using namespace vlm;
using namespace vlm::io;

namespace {

std::string tokenizer_path() { return std::string(VLM_QWEN3_TOKENIZER_DIR) + "/tokenizer.json"; }

RawSample make_sample(const std::string& key, const std::map<std::string, std::string>& parts,
                      const std::map<std::string, std::string>& subflavors = {}) {
  RawSample s;
  s.key = key;
  s.shard = "shard_000.tar";
  s.parts = parts;
  s.subflavors = subflavors;
  return s;
}

} // namespace

TEST_CASE("chat: ids and labels equal the reference rule with the real tokenizer", "[io]") {
  Tokenizer tok = Tokenizer::from_file(tokenizer_path());
  std::ifstream f(std::string(VLM_SOURCE_DIR) + "/tests/data/chat/golden.json");
  REQUIRE(f.good());
  auto golden = nlohmann::json::parse(f);
  REQUIRE(golden["cases"].size() >= 10);
  for (const auto& c : golden["cases"]) {
    INFO("case " << c["key"].get<std::string>());
    RawSample s = make_sample(c["key"], c["parts"], c["subflavors"]);
    ChatSample chat = parse_chat_sample(s);
    TokenizedChat t = tokenize_chat(chat, tok, c["image_tokens"].get<std::vector<int64_t>>());
    CHECK(t.input_ids == c["input_ids"].get<std::vector<int32_t>>());
    CHECK(t.labels == c["labels"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("chat: unusable samples are refused with a countable reason", "[io]") {
  auto reason_of = [](const RawSample& s) {
    try {
      parse_chat_sample(s);
    } catch (const ChatFormatError& e) {
      CHECK(std::string(e.what()).find("shard_000.tar/k") != std::string::npos);
      return e.reason();
    }
    return std::string("accepted");
  };
  CHECK(reason_of(make_sample("k", {{"jpg", ""}, {"json", "{not json"}})) == "invalid_json");
  CHECK(reason_of(make_sample("k", {{"jpg", ""}, {"json", R"({"conversations": []})"}})) ==
        "empty_conversation");
  CHECK(reason_of(make_sample(
            "k",
            {{"jpg", ""}, {"json", R"({"conversations": [{"from": "human", "value": "hi"}]})"}})) ==
        "no_assistant_turn");
  CHECK(reason_of(make_sample("k", {{"jpg", ""}})) == "missing_part");
  CHECK(reason_of(make_sample("k", {{"txt", ""}})) == "empty_text");
  CHECK(reason_of(make_sample("k", {{"json", R"({"foo": 1})"}})) == "unknown_json");
  CHECK(reason_of(
            make_sample("k", {{"json", R"({"conversations": [{"from": "human", "value": "hi"}]})"}},
                        {{"type_dataset", "llava_recap"}})) == "empty_conversation");
  CHECK(reason_of(make_sample("k", {{"txt", "cap"}}, {{"type_dataset", "llava_recap_mn5"}})) ==
        "missing_image");
  // Well-formed JSON of the wrong types: a counted skip, not a bare json type_error; an extra key
  // of any type is no error at all.
  CHECK(reason_of(
            make_sample("k", {{"json", R"({"messages": [{"role": "user", "content": [{"type": 5}]},
                                            {"role": "assistant", "content": "a"}]})"}})) ==
        "invalid_json");
  CHECK(reason_of(make_sample("k", {{"json", R"({"messages": [{"role": "user", "content":
            [{"type": "text", "text": "x"}, {"type": ["image"]}]}, {"role": "assistant",
            "content": "a"}]})"}})) == "invalid_json");
  CHECK(reason_of(make_sample("k", {{"jpg", ""}, {"json", R"({"conversations": [1, 2]})"}},
                              {{"type_dataset", "llava_recap"}})) == "invalid_json");
  CHECK(reason_of(make_sample("k", {{"json", R"({"conversations": [{"from": "human", "value":
            "hi"}, {"from": "gpt", "value": "a"}], "x": 1})"}})) == "accepted");
  // Text that is not UTF-8 is refused here, so tokenizing a parsed chat cannot fail on bytes.
  CHECK(reason_of(make_sample("k", {{"txt", "caf\xe9 latte"}})) == "invalid_utf8");
  CHECK(reason_of(make_sample("k", {{"jpg", ""}, {"txt", "bad \xff caption"}})) == "invalid_utf8");
}

TEST_CASE("chat: render shows the template with one pad per image", "[io]") {
  RawSample s = make_sample(
      "k",
      {{"jpg", ""},
       {"json",
        R"({"conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A cat."}]})"}});
  CHECK(render_chat(parse_chat_sample(s)) ==
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What?<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n");
}
