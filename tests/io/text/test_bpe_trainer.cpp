// The byte-level BPE trainer (io/text/bpe_trainer.h) and the tokenizer the demo dataset carries:
// hand-checked merges, loading in io::Tokenizer, round trips, special tokens, sizes,
// determinism, and ids equal to HF `tokenizers` on a committed trained tokenizer
// (tests/data/bpe/, made by tools/golden/gen_bpe_trainer.py).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "io/energon/dataset.h"
#include "io/energon/writer.h"
#include "io/text/bpe_trainer.h"
#include "io/text/chat_format.h"
#include "io/text/tokenizer.h"
#include "io/text/unicode.h"
#include "src/demo/demo_dataset.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using nlohmann::json;
using vlm::io::Tokenizer;
using vlm::io::train_byte_level_bpe;
using vlm::testing::error_of;
using vlm::testing::TempDir;
namespace unicode = vlm::io::unicode;

namespace {

const std::string kDataDir = std::string(VLM_SOURCE_DIR) + "/tests/data/bpe/";
const std::string kQwenDir = std::string(VLM_QWEN3_TOKENIZER_DIR);

// The special tokens of the golden tokenizer in tests/data/bpe/ and its size.
const std::vector<std::string> kGoldenSpecials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
constexpr int64_t kGoldenVocab = 400;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  INFO("reading " << path);
  REQUIRE(f);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Loads tokenizer.json text through a file, as a user would.
Tokenizer load(const TempDir& dir, const std::string& text) {
  return Tokenizer::from_file(dir.write("tokenizer.json", text));
}

std::vector<std::vector<std::string>> merges_of(const json& j) {
  return j["model"]["merges"].get<std::vector<std::vector<std::string>>>();
}

std::string show(const std::string& s) {
  std::string t = json(s).dump();
  return t.size() > 200 ? t.substr(0, 200) + "...\"" : t;
}

// A corpus with plenty of repeated pairs: the demo's kind of sentences, varied.
std::vector<std::string> shapes_corpus() {
  const char* colours[] = {"red", "green", "blue", "yellow", "orange", "purple", "black", "white"};
  const char* shapes[] = {"circle", "square", "triangle", "diamond"};
  std::vector<std::string> texts;
  for (const char* c : colours)
    for (const char* s : shapes) {
      texts.push_back(std::string("There is a ") + c + " " + s + " in the picture.");
      texts.push_back(std::string("What colour is the ") + s + "? It is " + c + ".");
    }
  return texts;
}

// Random valid UTF-8: ASCII, Latin-1, combining marks, CJK, emoji, and any scalar value.
std::string random_utf8(std::mt19937& rng, int chars) {
  std::string s;
  for (int i = 0; i < chars; i++) {
    char32_t cp = 0;
    switch (rng() % 7) {
    case 0: cp = 0x20 + rng() % 0x5F; break;
    case 1: cp = "\t\n\r  "[rng() % 5]; break;
    case 2: cp = 0xA0 + rng() % 0x160; break;
    case 3: cp = 0x300 + rng() % 0x70; break; // combining marks: NFC may reorder / compose
    case 4: cp = 0x4E00 + rng() % 0x5000; break;
    case 5: cp = 0x1F300 + rng() % 0x300; break;
    default:
      do cp = rng() % 0x110000;
      while (cp >= 0xD800 && cp <= 0xDFFF);
    }
    unicode::utf8_append(&s, cp);
  }
  return s;
}

} // namespace

TEST_CASE("bpe trainer: the first merges of a small corpus (hand-checked)", "[io][bpe]") {
  // Words (pre-tokenizer pieces): hug, Ġhug, Ġpug, Ġpun, Ġbun, Ġhugs. Pair counts: ug 4, hu 3,
  // Ġh Ġp pu un 2, ... -> "u g". Then h+ug 3 -> "h ug". Then Ġ+hug, Ġ+p and u+n have 2 each:
  // the smallest pair by bytes first (" " < "u", "hug" < "p"; in byte-level spelling "Ġ" would
  // sort after "u"), so "Ġ hug", "Ġ p", "u n". Then no pair occurs twice.
  const std::vector<std::string> texts = {"hug hug pug pun bun hugs"};
  const std::vector<std::vector<std::string>> expected = {
      {"u", "g"}, {"h", "ug"}, {"Ġ", "hug"}, {"Ġ", "p"}, {"u", "n"}};
  const json j = json::parse(train_byte_level_bpe(texts, 300, {"<|endoftext|>"}));
  CHECK(merges_of(j) == expected);
  const json& vocab = j["model"]["vocab"];
  CHECK(vocab.size() == 256 + 5);
  CHECK(vocab["ug"] == 256);
  CHECK(vocab["hug"] == 257);
  CHECK(vocab["Ġhug"] == 258);
  CHECK(vocab["Ġp"] == 259);
  CHECK(vocab["un"] == 260);
  REQUIRE(j["added_tokens"].size() == 1);
  CHECK(j["added_tokens"][0]["id"] == 261); // the texts ran out of pairs before 300
  CHECK(j["added_tokens"][0]["content"] == "<|endoftext|>");
  CHECK(j["added_tokens"][0]["special"] == true);

  // The size limit stops the merges: 256 bytes + 2 merges + 1 special token.
  const json k = json::parse(train_byte_level_bpe(texts, 259, {"<|endoftext|>"}));
  CHECK(merges_of(k) ==
        std::vector<std::vector<std::string>>(expected.begin(), expected.begin() + 2));
  CHECK(k["added_tokens"][0]["id"] == 258);

  // Frequency weighting: "zz" occurs in one word counted 3 times, "ab" in two words once each.
  const json w = json::parse(train_byte_level_bpe({"zz zz zz", "ab", "xab"}, 300, {}));
  REQUIRE(merges_of(w).size() >= 2);
  CHECK(merges_of(w)[0] == std::vector<std::string>{"z", "z"});  // zz: 1 + 2 (Ġzz) = 3
  CHECK(merges_of(w)[1] == std::vector<std::string>{"Ġ", "zz"}); // 2, before "a b" (2) by bytes
  CHECK(merges_of(w)[2] == std::vector<std::string>{"a", "b"});
}

TEST_CASE("bpe trainer: the pipeline and byte alphabet of the Qwen3 tokenizer.json", "[io][bpe]") {
  const json j = json::parse(train_byte_level_bpe(shapes_corpus(), 300, {"<|endoftext|>"}));
  INFO("the real Qwen3 tokenizer is expected at " << kQwenDir);
  REQUIRE(fs::exists(kQwenDir + "/tokenizer.json"));
  const json q = json::parse(read_text(kQwenDir + "/tokenizer.json"));
  for (const char* key : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    INFO(key);
    CHECK(j[key] == q[key]);
  }
  for (const char* key : {"type", "dropout", "unk_token", "continuing_subword_prefix",
                          "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges"}) {
    INFO("model." << key);
    CHECK(j["model"][key] == q["model"][key]);
  }
  // Ids 0..255: the byte symbols in the order of Qwen3's vocabulary.
  int same = 0;
  for (const auto& [token, id] : j["model"]["vocab"].items())
    if (id.get<int64_t>() < 256) same += q["model"]["vocab"].value(token, -1) == id;
  CHECK(same == 256);

  TempDir dir("bpe");
  const Tokenizer tok = load(dir, j.dump());
  CHECK(tok.token_to_id("!") == 0);
  CHECK(tok.token_to_id("Ā") == 188); // byte 0x00
  CHECK(tok.token_to_id("Ġ") == 220); // byte 0x20
  CHECK(tok.decode({220}) == " ");
}

TEST_CASE("bpe trainer: exact vocabulary size, special tokens last with their ids", "[io][bpe]") {
  const std::vector<std::string>& specials = vlm::demo::demo_special_tokens();
  const std::string text = train_byte_level_bpe(shapes_corpus(), 300, specials);
  const json j = json::parse(text);
  CHECK(j["model"]["vocab"].size() == 300 - specials.size());
  CHECK(merges_of(j).size() == 300 - specials.size() - 256); // no duplicate results here
  TempDir dir("bpe");
  const Tokenizer tok = load(dir, text);
  CHECK(tok.vocab_size() == 300);
  for (size_t k = 0; k < specials.size(); k++) {
    const auto id = int32_t(300 - specials.size() + k);
    INFO(specials[k]);
    CHECK(tok.token_to_id(specials[k]) == id);
    CHECK(tok.is_special(id));
    CHECK(tok.encode(specials[k]) == std::vector<int32_t>{id});
    CHECK(tok.decode({id}) == specials[k]);
    CHECK(tok.decode({id}, /*skip_special=*/true).empty());
  }
  // In running text too, and never split by BPE.
  const auto ids = tok.encode("<|im_start|>user\nA red circle.<|im_end|>\n");
  CHECK(ids.front() == tok.token_to_id("<|im_start|>"));
  CHECK(std::count(ids.begin(), ids.end(), tok.token_to_id("<|im_end|>")) == 1);
  // Learned words are single tokens.
  CHECK(tok.encode(" picture").size() == 1);
  CHECK(tok.encode(" colour").size() == 1);
}

TEST_CASE("bpe trainer: decode(encode(x)) gives x back, any UTF-8 encodes", "[io][bpe]") {
  TempDir dir("bpe");
  const Tokenizer tok = load(dir, train_byte_level_bpe(shapes_corpus(), 320, {"<|endoftext|>"}));
  for (const std::string& t : shapes_corpus()) {
    INFO(show(t));
    const auto ids = tok.encode(t);
    CHECK(ids.size() < t.size() / 2); // the merges do compress their own corpus
    CHECK(tok.decode(ids) == t);
  }
  // Text the corpus never had: byte tokens cover every byte. Round trip up to NFC, which the
  // normalizer applies.
  const std::vector<std::string> unseen = {"Straße 你好 😀👍🏽",
                                           "\x01\x02\x7f tab\there",
                                           "e\u0301 (NFD é)",
                                           "𝟘𝟙𝟚 Ⅻ",
                                           "\r\n\r\n  ",
                                           "<|endoftext|>x<|endoftext",
                                           "\xF4\x8F\xBF\xBF"};
  for (const std::string& t : unseen) {
    INFO(show(t));
    CHECK(tok.decode(tok.encode(t)) == unicode::to_nfc(t));
  }
  std::mt19937 rng(7);
  int failures = 0;
  for (int i = 0; i < 300; i++) {
    const std::string t = random_utf8(rng, 1 + int(rng() % 40));
    const auto ids = tok.encode(t);
    for (int32_t id : ids) failures += id < 0 || id >= 320;
    if (tok.decode(ids) != unicode::to_nfc(t) && failures++ < 5) FAIL_CHECK(show(t));
  }
  CHECK(failures == 0);
}

TEST_CASE("bpe trainer: deterministic, independent of the order of the texts", "[io][bpe]") {
  std::vector<std::string> texts = shapes_corpus();
  std::mt19937 rng(3);
  for (int i = 0; i < 50; i++) texts.push_back(random_utf8(rng, 30));
  const std::string a = train_byte_level_bpe(texts, 400, {"<|endoftext|>", "<|im_end|>"});
  CHECK(train_byte_level_bpe(texts, 400, {"<|endoftext|>", "<|im_end|>"}) == a);
  std::reverse(texts.begin(), texts.end());
  CHECK(train_byte_level_bpe(texts, 400, {"<|endoftext|>", "<|im_end|>"}) == a);
}

TEST_CASE("bpe trainer: special tokens in the texts are not learned, NFC before counting",
          "[io][bpe]") {
  // "<|x|>" repeated would give merges like "<|" or "|>" if it were not split off.
  const json j = json::parse(train_byte_level_bpe(
      {"<|x|><|x|><|x|>", "<|x|>\u00e9\u00e9", "e\u0301e\u0301"}, 300, {"<|x|>"}));
  // The only pair occurring twice is é é (C3 A9 twice in NFC); NFD e + U+0301 never counts.
  const auto merges = merges_of(j);
  REQUIRE(!merges.empty());
  for (const auto& m : merges) {
    INFO(m[0] << " " << m[1]);
    CHECK(m[0].find('|') == std::string::npos);
    CHECK(m[1].find('|') == std::string::npos);
    CHECK((m[0] != "e" && m[1] != "e")); // NFC leaves no "e" byte to merge
  }
  CHECK(merges[0] == std::vector<std::string>{"Ã", "©"}); // C3 A9 = é
}

TEST_CASE("bpe trainer: clear errors for bad arguments", "[io][bpe]") {
  CHECK_THAT(error_of([] {
               train_byte_level_bpe({"a"}, 257, {"<a>", "<b>"});
             }),
             Contains("vocab_size 257 is below 258"));
  CHECK_THAT(error_of([] {
               train_byte_level_bpe({"a"}, 300, {"<a>", "<a>"});
             }),
             Contains("given twice"));
  CHECK_THAT(error_of([] { train_byte_level_bpe({"a"}, 300, {""}); }), Contains("is empty"));
  CHECK_THAT(error_of([] {
               train_byte_level_bpe({"ok", "bad \xFF"}, 300, {});
             }),
             Contains("text 1 is not valid UTF-8 (byte offset 4)"));
}

// The golden tokenizer: tests/data/bpe/tokenizer.json is what the trainer makes of corpus.json
// (VLM_WRITE_BPE_GOLDEN=1 rewrites it; tools/golden/gen_bpe_trainer.py does that and then writes
// golden.jsonl with HF's ids).
TEST_CASE("bpe trainer: the golden tokenizer is what the trainer makes of its corpus",
          "[io][bpe]") {
  const auto corpus =
      json::parse(read_text(kDataDir + "corpus.json")).get<std::vector<std::string>>();
  const std::string made = train_byte_level_bpe(corpus, kGoldenVocab, kGoldenSpecials);
  if (const char* w = std::getenv("VLM_WRITE_BPE_GOLDEN"); w && std::string(w) == "1") {
    std::ofstream(kDataDir + "tokenizer.json", std::ios::binary) << made;
    WARN("wrote " << kDataDir << "tokenizer.json");
  }
  INFO("regenerate with tools/golden/gen_bpe_trainer.py --test-io build/tests/test_io");
  CHECK(made == read_text(kDataDir + "tokenizer.json"));
  CHECK(Tokenizer::from_file(kDataDir).vocab_size() == kGoldenVocab);
}

TEST_CASE("bpe trainer: ids equal HF tokenizers on the trained golden tokenizer", "[io][bpe]") {
  const Tokenizer tok = Tokenizer::from_file(kDataDir + "tokenizer.json");
  std::ifstream f(kDataDir + "golden.jsonl");
  INFO("golden file " << kDataDir << "golden.jsonl (tools/golden/gen_bpe_trainer.py)");
  REQUIRE(f);
  int rows = 0, failures = 0, merged = 0;
  for (std::string line; std::getline(f, line);) {
    const json r = json::parse(line);
    if (r["case"] != "encode") continue;
    rows++;
    const std::string text = r["text"];
    const auto expected = r["ids"].get<std::vector<int32_t>>();
    const auto ids = tok.encode(text);
    if (ids != expected && failures++ < 10)
      FAIL_CHECK("encode(" << show(text) << ") = " << json(ids).dump().substr(0, 300)
                           << "\n  HF gives " << json(expected).dump().substr(0, 300));
    if (tok.decode(ids) != r["decoded"].get<std::string>() && failures++ < 10)
      FAIL_CHECK("decode(encode(" << show(text) << ")) = " << show(tok.decode(ids)) << ", HF gives "
                                  << show(r["decoded"]));
    for (int32_t id : ids) merged += id >= 256 && id < kGoldenVocab - 3;
  }
  CHECK(rows >= 50);
  CHECK(failures == 0);
  CHECK(merged > 100); // the strings do use learned merges
}

TEST_CASE("bpe trainer: the demo dataset carries a tokenizer all its samples fit", "[io][bpe]") {
  TempDir dir("bpe_demo");
  const std::string root = dir.file("demo");
  vlm::demo::make_demo_dataset(root); // the default size: what `data make-demo` writes
  CHECK(!fs::exists(root + ".tmp"));
  REQUIRE(fs::exists(root + "/tokenizer.json"));
  const Tokenizer tok = Tokenizer::from_file(root);
  CHECK(tok.vocab_size() <= vlm::demo::kDemoVocabSize);
  const auto& specials = vlm::demo::demo_special_tokens();
  for (size_t k = 0; k < specials.size(); k++)
    CHECK(tok.token_to_id(specials[k]) == tok.vocab_size() - int64_t(specials.size() - k));
  // Every sample of both splits: chat ids (a few image pads per image) all below 512, and the
  // text comes back.
  const auto ds = vlm::io::EnergonDataset::open(root);
  int64_t samples = 0, tokens = 0, bytes = 0;
  for (const std::string split : {"train", "val"}) {
    for (int64_t i = 0; i < ds.split(split).num_samples; i++, samples++) {
      const vlm::io::RawSample raw = ds.read_sample(split, i);
      const vlm::io::ChatSample chat = vlm::io::parse_chat_sample(raw);
      const std::vector<int64_t> pads(chat.image_parts.size(), 4);
      const auto t = vlm::io::tokenize_chat(chat, tok, pads);
      for (int32_t id : t.input_ids) {
        REQUIRE(id >= 0);
        REQUIRE(id < vlm::demo::kDemoVocabSize);
      }
      const std::string rendered = vlm::io::render_chat(chat);
      const auto ids = tok.encode(rendered);
      REQUIRE(tok.decode(ids) == rendered);
      tokens += int64_t(ids.size());
      bytes += int64_t(rendered.size());
    }
  }
  CHECK(samples == 4200);    // DemoDatasetOptions: 4000 train, 200 val
  CHECK(tokens * 3 < bytes); // the demo's words are mostly single tokens
  // Same seed, same tokenizer.
  const std::string again = dir.file("again");
  vlm::demo::DemoDatasetOptions o;
  o.train_samples = 30;
  o.val_samples = 5;
  vlm::demo::make_demo_dataset(again, o);
  vlm::demo::make_demo_dataset(dir.file("again2"), o);
  CHECK(read_text(again + "/tokenizer.json") == read_text(dir.file("again2") + "/tokenizer.json"));
}

TEST_CASE("energon writer: extra files go into the dataset folder, inside it only", "[io][bpe]") {
  TempDir dir("writer_extra");
  std::map<std::string, std::vector<vlm::io::WriterSample>> splits;
  splits["train"].push_back({"000", {{"txt", "hello"}}});
  vlm::io::EnergonWriteOptions w;
  w.extra_files["tokenizer.json"] = "{}";
  w.extra_files["sub/x.txt"] = "x";
  vlm::io::write_energon_dataset(dir.file("ds"), splits, w);
  CHECK(read_text(dir.file("ds/tokenizer.json")) == "{}");
  CHECK(read_text(dir.file("ds/sub/x.txt")) == "x");
  CHECK(vlm::io::EnergonDataset::open(dir.file("ds")).split("train").num_samples == 1);
  for (const char* bad : {"../escape.txt", "/abs.txt", "", "sub/"}) {
    vlm::io::EnergonWriteOptions b;
    b.extra_files[bad] = "x";
    INFO(bad);
    CHECK_THAT(error_of([&] { vlm::io::write_energon_dataset(dir.file("bad"), splits, b); }),
               Contains("is not a file path inside the dataset"));
    CHECK(!fs::exists(dir.file("bad")));
  }
}
