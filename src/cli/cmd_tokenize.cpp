#include "src/cli/cmd_tokenize.h"

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <istream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "io/text/tokenizer.h"
#include "src/base/check.h"
#include "src/cli/args.h"

namespace vlm::cli {

int cmd_tokenize(const std::vector<std::string>& args) {
  std::string path;
  bool decode = false, skip_special = false;
  CLI::App app{"Reads JSON lines from stdin and writes one JSON line per input line to stdout: "
               "{\"text\": \"...\"} -> {\"ids\": [...]} (encode; special tokens in the text are "
               "matched), or with --decode {\"ids\": [...]} -> {\"text\": \"...\"}.",
               "vlmtrain tokenize"};
  show_defaults(app);
  app.add_option("--tokenizer", path,
                 "a tokenizer.json or a folder holding one (an HF model snapshot)")
      ->required();
  app.add_flag("--decode", decode, "ids to text instead of text to ids");
  app.add_flag("--skip-special", skip_special, "with --decode: drop special tokens");
  if (!parse_args(app, args)) return 0;
  VLM_CHECK(decode || !skip_special, "--skip-special applies to --decode only");
  const io::Tokenizer tok = io::Tokenizer::from_file(path);
  std::ios::sync_with_stdio(false);
  tokenize_jsonl(tok, std::cin, std::cout, decode, skip_special);
  std::cout.flush();
  return 0;
}

void tokenize_jsonl(const io::Tokenizer& tok, std::istream& in, std::ostream& out, bool decode,
                    bool skip_special) {
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); line_no++) {
    VLM_CHECK(line.find_first_not_of(" \t\r") != std::string::npos, "input line ", line_no,
              ": empty line (expected a JSON object)");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      VLM_FAIL("input line ", line_no, ": invalid JSON: ", e.what());
    }
    nlohmann::json result;
    if (!decode) {
      VLM_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), "input line ",
                line_no, ": expected an object with a string \"text\"");
      try {
        result = {{"ids", tok.encode(j["text"].get_ref<const std::string&>())}};
      } catch (const Error& e) {
        VLM_FAIL("input line ", line_no, ": ", e.what());
      }
    } else {
      VLM_CHECK(j.is_object() && j.contains("ids") && j["ids"].is_array(), "input line ", line_no,
                ": expected an object with an array \"ids\"");
      std::vector<int32_t> ids;
      for (const auto& v : j["ids"]) {
        VLM_CHECK(v.is_number_integer() && v.get<int64_t>() >= INT32_MIN &&
                      v.get<int64_t>() <= INT32_MAX,
                  "input line ", line_no, ": ids holds ", v.dump(), ", not a 32-bit integer");
        ids.push_back(v.get<int32_t>());
      }
      try {
        result = {{"text", tok.decode(ids, skip_special)}};
      } catch (const Error& e) {
        VLM_FAIL("input line ", line_no, ": ", e.what());
      }
    }
    out << result.dump() << '\n';
  }
}

} // namespace vlm::cli
