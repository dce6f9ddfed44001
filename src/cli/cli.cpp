#include "src/cli/cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/cli/cmd_data.h"
#include "src/cli/cmd_dump.h"
#include "src/cli/cmd_export.h"
#include "src/cli/cmd_generate.h"
#include "src/cli/cmd_tokenize.h"
#include "src/cli/cmd_train.h"
#include "src/core/device.h"

namespace vlm::cli {

namespace {

const char* kUsage = R"(usage: vlmtrain <command> [options]

commands:
  train          [--config FILE] [--set section.key=value ...]: train a model; without
                 --config the built-in CPU demo (a tiny Qwen3-VL on `data make-demo` data)
  export         --checkpoint DIR --out DIR [--dtype bf16|f32]: an HF snapshot for transformers
  data           dataset tools: make-demo OUT, inspect PATH, pack PATH (`vlmtrain data help`)
  tokenize       --tokenizer PATH [--decode [--skip-special]]: JSON lines {"text"} <-> {"ids"}
                 on stdin/stdout
  dump           --model DIR --batch FILE --out FILE [--grads] [--dtype f32|bf16]: one forward
                 (+ backward) of an HF snapshot, logits/loss/grads to safetensors
  generate       --model DIR [--image FILE] --prompt TEXT [--max-new-tokens N]: greedy
                 answer of a checkpoint (HF snapshot, step_N or output folder) to one chat turn
  models         the model types (config.json model_type) and presets this build knows
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
  if (cmd == "generate") return cmd_generate(args);
  if (cmd == "models") {
    for (const std::string& type : model::registered_model_types()) {
      const model::ModelSpec& spec = model::model_spec(type);
      std::string presets;
      for (const auto& [name, fn] : spec.presets) presets += (presets.empty() ? "" : ", ") + name;
      std::printf("%-12s %s%s%s\n", type.c_str(), spec.description.c_str(),
                  presets.empty() ? "" : "; presets: ", presets.c_str());
    }
    return 0;
  }
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

} // namespace vlm::cli
