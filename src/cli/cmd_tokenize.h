// `vlmtrain tokenize --tokenizer PATH [--decode]`: JSON lines on stdin to JSON lines on stdout.
//   encode: {"text": "..."}  ->  {"ids": [...]}
//   decode: {"ids": [...]}   ->  {"text": "..."}     (--decode; --skip-special drops special
//   tokens)
// One output line per input line; a bad line is an error naming its line number.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "io/text/tokenizer.h"

namespace vlm::cli {

// args: the options after the subcommand name. Returns the process exit code.
int cmd_tokenize(const std::vector<std::string>& args);

// The loop of cmd_tokenize over any streams (tests use string streams).
void tokenize_jsonl(const io::Tokenizer& tok, std::istream& in, std::ostream& out, bool decode,
                    bool skip_special);

} // namespace vlm::cli
