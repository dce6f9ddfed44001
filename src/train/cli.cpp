#include "src/train/cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/base/check.h"
#include "src/core/device.h"
#include "src/train/cmd_data.h"
#include "src/train/cmd_tokenize.h"
#include "src/train/demo.h"

namespace vlm::train {

namespace {

const char* kUsage = R"(usage: vlmtrain <command> [options]

commands:
  train          train the built-in CPU demo (a tiny Qwen3-shaped LM on a synthetic task)
                   --steps N (800)  --rows N (4)  --seq-len N (128)  --seed N (0)
                   --log-every N (50)  --ac (activation checkpointing)  --metrics FILE
                   --require-loss-drop R  exit 1 unless the final loss <= R x the first
  data           dataset tools: make-demo OUT, inspect PATH, pack PATH (`vlmtrain data help`)
  tokenize       --tokenizer PATH [--decode [--skip-special]]: JSON lines {"text"} <-> {"ids"}
                 on stdin/stdout
  device-query   print the CUDA devices this build sees (or why there are none)
  help           this text
)";

int64_t parse_int(const std::string& flag, const char* value) {
  VLM_CHECK(value, "option ", flag, " needs a value");
  char* end = nullptr;
  long long v = std::strtoll(value, &end, 10);
  VLM_CHECK(end && *end == '\0', "option ", flag, " expects an integer, got '", value, "'");
  return v;
}

double parse_double(const std::string& flag, const char* value) {
  VLM_CHECK(value, "option ", flag, " needs a value");
  char* end = nullptr;
  double v = std::strtod(value, &end);
  VLM_CHECK(end && *end == '\0', "option ", flag, " expects a number, got '", value, "'");
  return v;
}

int cmd_train(const std::vector<std::string>& args) {
  DemoOptions o;
  double require_drop = 0;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    const char* next = i + 1 < args.size() ? args[i + 1].c_str() : nullptr;
    if (a == "--steps")
      o.steps = parse_int(a, next), i++;
    else if (a == "--rows")
      o.rows = parse_int(a, next), i++;
    else if (a == "--seq-len")
      o.seq_len = parse_int(a, next), i++;
    else if (a == "--seed")
      o.seed = uint64_t(parse_int(a, next)), i++;
    else if (a == "--log-every")
      o.log_every = parse_int(a, next), i++;
    else if (a == "--metrics") {
      VLM_CHECK(next, "option --metrics needs a file name");
      o.metrics_path = next, i++;
    } else if (a == "--ac")
      o.activation_checkpointing = true;
    else if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (a == "--require-loss-drop")
      require_drop = parse_double(a, next), i++;
    else if (a == "--config")
      VLM_FAIL("--config: TOML training configs arrive with the Qwen3 trainer; run `vlmtrain "
               "train` without it for the demo");
    else
      VLM_FAIL("unknown option '", a, "' for `vlmtrain train`\n", kUsage);
  }
  DemoResult r = run_demo(o);
  if (require_drop > 0 && !(r.last_loss <= require_drop * r.first_loss)) {
    std::fprintf(stderr, "error: the loss did not fall enough: %.4f -> %.4f (required <= %.2f x)\n",
                 r.first_loss, r.last_loss, require_drop);
    return 1;
  }
  return 0;
}

} // namespace

int run_cli(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "help";
  std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
  if (cmd == "train") return cmd_train(args);
  if (cmd == "data") return cmd_data(args);
  if (cmd == "tokenize") return cmd_tokenize(args);
  if (cmd == "device-query") {
    std::printf("%s\n", cuda_device_query().c_str());
    return 0;
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    std::printf("%s", kUsage);
    return 0;
  }
  std::fprintf(stderr, "unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}

} // namespace vlm::train
