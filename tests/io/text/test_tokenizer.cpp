// The Qwen tokenizer against HF `tokenizers` (golden files made by tools/golden/gen_tokenizer.py
// from the real Qwen3 tokenizer.json of tests/data/qwen3-tokenizer and from a small
// tokenizer exercising the options the real file leaves at defaults), plus the Unicode helpers.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "io/text/tokenizer.h"
#include "io/text/unicode.h"
#include "src/base/check.h"
#include "src/cli/cmd_tokenize.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using nlohmann::json;
using vlm::io::Tokenizer;
namespace unicode = vlm::io::unicode;

using vlm::testing::error_of;

namespace {

const std::string kDataDir = std::string(VLM_SOURCE_DIR) + "/tests/data/tokenizer/";
const std::string kQwenDir = std::string(VLM_QWEN3_TOKENIZER_DIR);

// The real Qwen3 tokenizer (tests/data/qwen3-tokenizer, unpacked by CMake into the build folder),
// loaded once per process. Its absence is a failure, not a skip.
const Tokenizer& qwen() {
  static const Tokenizer tok = [] {
    INFO("the real Qwen3 tokenizer is expected at "
         << kQwenDir << "/tokenizer.json (unpacked from tests/data/qwen3-tokenizer by CMake)");
    REQUIRE(fs::exists(kQwenDir + "/tokenizer.json"));
    return Tokenizer::from_file(kQwenDir);
  }();
  return tok;
}

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream f(path);
  INFO("golden file " << path << " (tools/golden/gen_tokenizer.py)");
  REQUIRE(f);
  std::vector<json> rows;
  for (std::string line; std::getline(f, line);) rows.push_back(json::parse(line));
  return rows;
}

std::vector<json> golden(const std::string& name, const std::string& kind) {
  std::vector<json> out;
  for (json& r : read_jsonl(kDataDir + name))
    if (r["case"] == kind) out.push_back(std::move(r));
  return out;
}

// A printable form of a test string for failure messages.
std::string show(const std::string& s) {
  std::string t = json(s).dump();
  return t.size() > 200 ? t.substr(0, 200) + "...\"" : t;
}

using TempDir = vlm::testing::TempDir;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

} // namespace

TEST_CASE("tokenizer: ids equal HF tokenizers on the golden strings", "[io][tokenizer]") {
  const Tokenizer& tok = qwen();
  const auto rows = golden("golden.jsonl", "encode");
  REQUIRE(rows.size() >= 200);
  int failures = 0;
  for (const json& r : rows) {
    const std::string text = r["text"];
    const auto expected = r["ids"].get<std::vector<int32_t>>();
    const std::string nfc = r.value("nfc", text);
    const auto ids = tok.encode(text);
    if (ids != expected && failures++ < 10)
      FAIL_CHECK("encode(" << show(text) << ") = " << json(ids).dump().substr(0, 300)
                           << "\n  HF gives " << json(expected).dump().substr(0, 300));
    // decode(encode(x)) == NFC(x): all added tokens of Qwen3 are unnormalized ASCII.
    const std::string back = tok.decode(ids);
    if (back != nfc && failures++ < 10)
      FAIL_CHECK("decode(encode(" << show(text) << ")) = " << show(back) << ", NFC is "
                                  << show(nfc));
  }
  CHECK(failures == 0);
}

TEST_CASE("tokenizer: pre-tokenizer pieces equal HF (Qwen2/3 and Qwen3.5 regex)",
          "[io][tokenizer]") {
  const auto rows = golden("golden.jsonl", "split");
  REQUIRE(rows.size() >= 500);
  int failures = 0;
  for (const json& r : rows) {
    const std::string text = r["text"];
    for (const bool marks : {false, true}) {
      const auto expected = r[marks ? "qwen35" : "qwen2"].get<std::vector<std::string>>();
      const auto views = vlm::io::pre_tokenize(text, marks);
      const std::vector<std::string> pieces(views.begin(), views.end());
      if (pieces != expected && failures++ < 10)
        FAIL_CHECK("pre_tokenize(" << show(text) << ", marks_are_letters=" << marks
                                   << ") = " << json(pieces).dump().substr(0, 300)
                                   << "\n  HF gives " << json(expected).dump().substr(0, 300));
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("tokenizer: decode equals HF (cut UTF-8, skip_special)", "[io][tokenizer]") {
  const Tokenizer& tok = qwen();
  const auto rows = golden("golden.jsonl", "decode");
  REQUIRE(rows.size() > 20);
  int replacements = 0;
  for (const json& r : rows) {
    const auto ids = r["ids"].get<std::vector<int32_t>>();
    const std::string expected = r["text"];
    INFO("ids " << json(ids).dump() << " skip_special " << r["skip_special"]);
    CHECK(tok.decode(ids, r["skip_special"].get<bool>()) == expected);
    replacements += expected.find("\xEF\xBF\xBD") != std::string::npos;
  }
  CHECK(replacements > 5); // the golden set does cut characters
}

TEST_CASE("tokenizer: Qwen3 special tokens, vocabulary, lookups", "[io][tokenizer]") {
  const Tokenizer& tok = qwen();
  // docs/qwen-models.md §5
  const std::vector<std::pair<std::string, int32_t>> known = {
      {"<|endoftext|>", 151643},    {"<|im_start|>", 151644},   {"<|im_end|>", 151645},
      {"<|vision_start|>", 151652}, {"<|vision_end|>", 151653}, {"<|vision_pad|>", 151654},
      {"<|image_pad|>", 151655},    {"<|video_pad|>", 151656},  {"<think>", 151667},
      {"</think>", 151668}};
  for (const auto& [text, id] : known) {
    INFO(text);
    CHECK(tok.token_to_id(text) == id);
    CHECK(tok.id_to_token(id) == text);
    CHECK(tok.encode(text) == std::vector<int32_t>{id});
    CHECK(tok.encode("a" + text + "b") == std::vector<int32_t>{64, id, 65});
  }
  CHECK(tok.vocab_size() == 151669);
  CHECK(tok.is_special(151644));
  CHECK_FALSE(tok.is_special(151667)); // <think> is an added token but not special
  CHECK_FALSE(tok.is_special(9707));
  CHECK(tok.decode({151644, 9707, 151667, 151645}, true) == "Hello<think>");

  CHECK(tok.token_to_id("Hello") == 9707);
  CHECK(tok.token_to_id("Ġmy") == 847); // byte-level form of " my"
  CHECK(tok.id_to_token(847) == "Ġmy");
  CHECK(tok.find_token("Ġmy") == 847);
  CHECK_FALSE(tok.find_token(" my").has_value());
  CHECK_THAT(error_of([&] { tok.token_to_id("<|no_such_token|>"); }),
             Contains("<|no_such_token|>"));
  CHECK_THAT(error_of([&] { tok.id_to_token(151669); }), Contains("151669"));
  CHECK_THAT(error_of([&] { tok.id_to_token(-1); }), Contains("-1"));
  CHECK_THAT(error_of([&] {
               tok.decode({9707, 200000});
             }),
             Contains("ids[1] = 200000") && Contains("not a token id"));
  CHECK(tok.path() == kQwenDir + "/tokenizer.json");

  // Text that is not UTF-8 is an error naming the offset (the loader skips such samples).
  CHECK_THAT(error_of([&] { tok.encode(std::string("ok \xC3\x28", 5)); }),
             Contains("not valid UTF-8") && Contains("byte offset 3"));
  CHECK(tok.encode("").empty());
}

TEST_CASE("tokenizer: Qwen3.5 regex, added-token flags, string merges, ignore_merges",
          "[io][tokenizer]") {
  const Tokenizer tok = Tokenizer::from_file(kDataDir + "mini.json");
  const auto rows = golden("mini.jsonl", "encode");
  REQUIRE(rows.size() > 100);
  for (const json& r : rows) {
    const std::string text = r["text"];
    INFO("text " << show(text));
    const auto ids = tok.encode(text);
    CHECK(ids == r["ids"].get<std::vector<int32_t>>());
    CHECK(tok.decode(ids) == r["decoded"].get<std::string>());
    CHECK(tok.decode(ids, true) == r["decoded_skip"].get<std::string>());
  }
}

TEST_CASE("tokenizer: concurrent encodes from several threads agree", "[io][tokenizer]") {
  // Two tokenizers used alternately by each thread: per-thread word caches must not mix them.
  const Tokenizer mini = Tokenizer::from_file(kDataDir + "mini.json");
  const Tokenizer mini2 = Tokenizer::from_file(kDataDir + "mini.json");
  const auto rows = golden("mini.jsonl", "encode");
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> expected;
  for (const json& r : rows) {
    texts.push_back(r["text"]);
    expected.push_back(r["ids"]);
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; rep++)
        for (size_t k = 0; k < texts.size(); k++) {
          const Tokenizer& tk = (k + rep + t) % 2 ? mini : mini2;
          mismatches[t] += tk.encode(texts[k]) != expected[k];
        }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; t++) CHECK(mismatches[t] == 0);
  // A copy shares the tables and gives the same ids.
  const Tokenizer copy = mini;
  CHECK(copy.encode(texts[0]) == expected[0]);
}

TEST_CASE("tokenizer: clear errors for missing or invalid tokenizer.json", "[io][tokenizer]") {
  TempDir tmp;
  const std::string good_text = read_text(kDataDir + "mini.json");
  REQUIRE(!good_text.empty());
  const json good = json::parse(good_text);
  // The error of loading `j` (written to `name`), which must name the file.
  auto load_error = [&](const std::string& name, const json& j) {
    const std::string path = tmp.write(name, j.is_string() ? j.get<std::string>() : j.dump());
    const std::string e = error_of([&] { Tokenizer::from_file(path); });
    CHECK_THAT(e, Contains(path));
    return e;
  };

  const std::string missing = (tmp.dir / "nope.json").string();
  CHECK_THAT(error_of([&] { Tokenizer::from_file(missing); }),
             Contains(missing) && Contains("no such file"));
  CHECK_THAT(error_of([&] { Tokenizer::from_file(tmp.dir.string()); }),
             Contains(tmp.dir.string()) && Contains("has no tokenizer.json"));
  CHECK_THAT(load_error("trunc.json", good_text.substr(0, good_text.size() / 2)),
             Contains("invalid JSON"));
  CHECK_THAT(load_error("array.json", json::array({1, 2})), Contains("not a JSON object"));
  CHECK_THAT(load_error("nomodel.json", json::object()), Contains("no \"model\""));

  json j = good;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
  CHECK_THAT(load_error("regex.json", j),
             Contains("unsupported pre-tokenizer regex") && Contains("Qwen3.5"));
  j = good;
  j["normalizer"] = {{"type", "NFKC"}};
  CHECK_THAT(load_error("norm.json", j), Contains("unsupported normalizer") && Contains("NFKC"));
  j = good;
  j["decoder"] = nullptr;
  CHECK_THAT(load_error("decoder.json", j), Contains("unsupported decoder"));
  j = good;
  j["post_processor"] = {{"type", "TemplateProcessing"}};
  CHECK_THAT(load_error("post.json", j), Contains("unsupported post_processor"));
  j = good;
  j["model"]["type"] = "Unigram";
  CHECK_THAT(load_error("model.json", j), Contains("only BPE"));
  j = good;
  j["model"]["merges"][0] = "nospace";
  CHECK_THAT(load_error("merge.json", j),
             Contains("model.merges[0]") && Contains("not a pair of tokens"));
  j = good;
  j["model"]["merges"][3] = "zq x";
  CHECK_THAT(load_error("merge2.json", j),
             Contains("model.merges[3]") && Contains("missing from model.vocab") && Contains("zq"));
  j = good;
  j["model"]["vocab"].erase("\xC4\x80"); // U+0100, byte 0x00
  CHECK_THAT(load_error("byte.json", j), Contains("no token for byte 0x0"));
  j = good;
  j["model"]["vocab"]["zzz"] = 5;
  CHECK_THAT(load_error("dupvocab.json", j), Contains("gives id 5 to both"));
  j = good;
  j["added_tokens"][1]["content"] = 5;
  CHECK_THAT(load_error("added.json", j), Contains("added_tokens[1]"));
  j = good;
  j["added_tokens"][1]["id"] = j["added_tokens"][0]["id"];
  CHECK_THAT(load_error("dupadded.json", j), Contains("added_tokens[1]") && Contains("reuses id"));
  // Ids size the tables: one near 2^31 is refused before anything is allocated (it was a
  // bad_alloc), in the vocabulary and in the added tokens alike.
  j = good;
  j["model"]["vocab"]["zzz"] = 2147483000;
  CHECK_THAT(load_error("hugevocab.json", j),
             Contains("model.vocab[\"zzz\"] is 2147483000") && Contains("far beyond"));
  j = good;
  j["added_tokens"][1]["id"] = 2147483000;
  CHECK_THAT(load_error("hugeadded.json", j),
             Contains("added_tokens[1] has id 2147483000") && Contains("far beyond"));

  // A directory holding a tokenizer.json loads like the file.
  TempDir dir;
  dir.write("tokenizer.json", good_text);
  const Tokenizer from_dir = Tokenizer::from_file(dir.dir.string());
  CHECK(from_dir.encode("hello world <mask>") ==
        Tokenizer::from_file(kDataDir + "mini.json").encode("hello world <mask>"));
}

TEST_CASE("tokenizer: vlmtrain tokenize reads and writes JSON lines", "[io][tokenizer]") {
  const Tokenizer tok = Tokenizer::from_file(kDataDir + "mini.json");
  auto run = [&](const std::string& input, bool decode, bool skip = false) {
    std::istringstream in(input);
    std::ostringstream out;
    vlm::cli::tokenize_jsonl(tok, in, out, decode, skip);
    return out.str();
  };
  const std::string ids = json(tok.encode("hello world<|endoftext|>")).dump();
  const std::string other = json(tok.encode("caf\xC3\xA9 \xE4\xBD\xA0")).dump();
  CHECK(run("{\"text\": \"hello world<|endoftext|>\"}\n{\"text\": \"caf\\u00e9 \u4f60\"}\n",
            false) == "{\"ids\":" + ids + "}\n{\"ids\":" + other + "}\n");
  CHECK(run("{\"ids\": " + ids + "}\n", true) == "{\"text\":\"hello world<|endoftext|>\"}\n");
  CHECK(run("{\"ids\": " + ids + "}\n", true, true) == "{\"text\":\"hello world\"}\n");
  // Errors name the line.
  CHECK_THAT(error_of([&] { run("{\"text\": \"a\"}\n{\"txt\": 1}\n", false); }),
             Contains("input line 2") && Contains("\"text\""));
  CHECK_THAT(error_of([&] { run("{\"text\": \"a\"}\n\n", false); }),
             Contains("input line 2") && Contains("empty line"));
  CHECK_THAT(error_of([&] { run("{\"text\": \"a\"\n", false); }),
             Contains("input line 1") && Contains("invalid JSON"));
  CHECK_THAT(error_of([&] { run("{\"ids\": [1]}\n{\"ids\": [1, 99999999]}\n", true); }),
             Contains("input line 2") && Contains("99999999"));
  CHECK_THAT(error_of([&] { run("{\"ids\": [1.5]}\n", true); }),
             Contains("input line 1") && Contains("1.5"));
}

TEST_CASE("tokenizer: UTF-8 helpers", "[io][tokenizer]") {
  char32_t cp = 0;
  CHECK(unicode::utf8_decode("\xE2\x82\xAC", 0, &cp) == 3);
  CHECK(cp == 0x20AC);
  CHECK(unicode::utf8_decode("\xF0\x9F\x98\x80", 0, &cp) == 4);
  CHECK(cp == 0x1F600);
  CHECK(unicode::utf8_decode("\xC0\x80", 0, &cp) == 0);         // overlong
  CHECK(unicode::utf8_decode("\xED\xA0\x80", 0, &cp) == 0);     // surrogate
  CHECK(unicode::utf8_decode("\xF4\x90\x80\x80", 0, &cp) == 0); // above U+10FFFF
  CHECK(unicode::utf8_decode("\xE2\x82", 0, &cp) == 0);         // truncated
  CHECK(unicode::utf8_find_invalid("plain ascii text, long enough for 8-byte steps") ==
        std::string_view::npos);
  CHECK(unicode::utf8_find_invalid("0123456789\x80") == 10);
  for (char32_t c : {char32_t(0x41), char32_t(0xE9), char32_t(0x20AC), char32_t(0x1F600)}) {
    std::string s;
    unicode::utf8_append(&s, c);
    CHECK(unicode::utf8_decode(s, 0, &cp) == s.size());
    CHECK(cp == c);
  }
  // Maximal subparts (Unicode §3.9, table 3-8): one U+FFFD for each.
  const std::string r = "\xEF\xBF\xBD";
  CHECK(unicode::utf8_lossy("a\xF1\x80\x80"
                            "b") == "a" + r + "b");        // truncated 4-byte
  CHECK(unicode::utf8_lossy("\xC0\xAF") == r + r);         // never-valid lead
  CHECK(unicode::utf8_lossy("\xE0\x80\xAF") == r + r + r); // overlong 3-byte
  CHECK(unicode::utf8_lossy("\xED\xA0\x80") == r + r + r); // surrogate
  CHECK(unicode::utf8_lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64") ==
        "a" + r + r + r + "b" + r + "c" + r + r + "d"); // the standard's example
}

TEST_CASE("tokenizer: NFC normalization (Unicode 9.0 as HF)", "[io][tokenizer]") {
  CHECK(std::string(unicode::nfc_unicode_version()) == "9.0.0");
  CHECK(std::string(unicode::class_unicode_version()) == "16.0.0");
  CHECK(unicode::to_nfc("Cafe\xCC\x81") == "Caf\xC3\xA9"); // e + U+0301 -> é
  CHECK(unicode::to_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81"); // jamo -> 각
  CHECK(unicode::to_nfc("\xE2\x84\xA6") == "\xCE\xA9");                             // Ohm -> Omega
  CHECK(unicode::to_nfc("\xE0\xA5\x98") == "\xE0\xA4\x95\xE0\xA4\xBC"); // excluded: stays split
  // q + dot above (230) + dot below (220): reordered to below, above
  CHECK(unicode::to_nfc("q\xCC\x87\xCC\xA3") == "q\xCC\xA3\xCC\x87");
  // U+11935 U+11930 compose since Unicode 13, not in HF's 9.0 data
  CHECK(unicode::to_nfc("\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0") == "\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0");
  CHECK(unicode::is_nfc_quick("plain text, 中文, Ελληνικά"));
  CHECK_FALSE(unicode::is_nfc_quick("Cafe\xCC\x81"));
  CHECK(unicode::combining_class(0x0301) == 230);
  CHECK(unicode::combining_class(0x0041) == 0);
  CHECK_THAT(error_of([] { unicode::to_nfc("ab\xFF"); }), Contains("byte offset 2"));
  CHECK(unicode::char_class(U'a') == unicode::CharClass::kLetter);
  CHECK(unicode::char_class(0x0301) == unicode::CharClass::kMark);
  CHECK(unicode::char_class(0x3000) == unicode::CharClass::kSpace);
  CHECK(unicode::char_class(0x0663) == unicode::CharClass::kNumber);
  CHECK(unicode::char_class(0x1C89) == unicode::CharClass::kLetter); // new in Unicode 16
  CHECK(unicode::char_class(0x1F600) == unicode::CharClass::kOther);
}
