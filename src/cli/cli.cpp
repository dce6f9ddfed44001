#include "src/cli/cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/cli/args.h"
#include "src/cli/cmd_check_model.h"
#include "src/cli/cmd_data.h"
#include "src/cli/cmd_dump.h"
#include "src/cli/cmd_export.h"
#include "src/cli/cmd_generate.h"
#include "src/cli/cmd_report.h"
#include "src/cli/cmd_tokenize.h"
#include "src/cli/cmd_train.h"
#include "src/core/device.h"

namespace vlm::cli {

namespace {

int cmd_models(const std::vector<std::string>& args) {
  CLI::App app{"The model types (config.json model_type) and presets this build knows.",
               "vlmtrain models"};
  if (!parse_args(app, args)) return 0;
  for (const std::string& type : model::registered_model_types()) {
    const model::ModelSpec& spec = model::model_spec(type);
    std::string presets;
    for (const auto& [name, fn] : spec.presets) presets += (presets.empty() ? "" : ", ") + name;
    std::printf("%-12s %s%s%s\n", type.c_str(), spec.description.c_str(),
                presets.empty() ? "" : "; presets: ", presets.c_str());
  }
  return 0;
}

int cmd_device_query(const std::vector<std::string>& args) {
  CLI::App app{"The CUDA devices this build sees (or why there are none).",
               "vlmtrain device-query"};
  if (!parse_args(app, args)) return 0;
  std::printf("%s\n", cuda_device_query().c_str());
  return 0;
}

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

const Command kCommands[] = {
    {"train",
     "train a model by a TOML config; without --config the built-in CPU demo (a tiny "
     "Qwen3-VL on `data make-demo` data)",
     cmd_train},
    {"export", "an HF snapshot for transformers from a checkpoint", cmd_export},
    {"check-model",
     "check an HF snapshot folder (config, tensors, tokenizer, processor) before the queue, "
     "reading no weights",
     cmd_check_model},
    {"data", "dataset tools: make-demo, inspect, pack", cmd_data},
    {"tokenize", "JSON lines {\"text\"} <-> {\"ids\"} on stdin/stdout", cmd_tokenize},
    {"dump", "one forward (+ backward) of an HF snapshot: logits, loss, grads to safetensors",
     cmd_dump},
    {"generate", "the greedy answer of a checkpoint to one chat turn (text, image)", cmd_generate},
    {"report", "PNG plots of runs' metrics.jsonl and of benchmark records", cmd_report},
    {"models", "the model types and presets this build knows", cmd_models},
    {"device-query", "the CUDA devices this build sees", cmd_device_query},
};

void print_usage(std::FILE* out) {
  std::fprintf(out, "usage: vlmtrain <command> [options]   (vlmtrain <command> --help: its "
                    "options, types and defaults)\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-13s %s\n", c.name, c.summary);
  std::fprintf(out, "  %-13s %s\n", "help", "this text");
}

} // namespace

int run_cli(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "help";
  const std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
  for (const Command& c : kCommands)
    if (cmd == c.name) return c.run(args);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    print_usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "unknown command '%s'\n", cmd.c_str());
  print_usage(stderr);
  return 2;
}

} // namespace vlm::cli
