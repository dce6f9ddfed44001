#include "src/train/cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/base/check.h"
#include "src/core/device.h"
#include "src/train/cmd_data.h"
#include "src/train/cmd_dump.h"
#include "src/train/cmd_tokenize.h"
#include "src/train/cmd_train.h"

namespace vlm::train {

namespace {

const char* kUsage = R"(usage: vlmtrain <command> [options]

commands:
  train          [--config FILE] [--set section.key=value ...]: train a Qwen3 model; without
                 --config the built-in CPU demo (a tiny Qwen3 on `data make-demo` data)
  export         --checkpoint DIR --out DIR [--dtype bf16|f32]: an HF snapshot for transformers
  data           dataset tools: make-demo OUT, inspect PATH, pack PATH (`vlmtrain data help`)
  tokenize       --tokenizer PATH [--decode [--skip-special]]: JSON lines {"text"} <-> {"ids"}
                 on stdin/stdout
  dump           --model DIR --batch FILE --out FILE [--grads] [--dtype f32|bf16]: one forward
                 (+ backward) of an HF Qwen3 snapshot, logits/loss/grads to safetensors
  device-query   print the CUDA devices this build sees (or why there are none)
  help           this text
)";

} // namespace

int run_cli(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "help";
  std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
  if (cmd == "train") return cmd_train(args);
  if (cmd == "data") return cmd_data(args);
  if (cmd == "export") return cmd_export(args);
  if (cmd == "tokenize") return cmd_tokenize(args);
  if (cmd == "dump") return cmd_dump(args);
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
