#include "src/cli/cmd_dump.h"

#include <cstdio>

#include "src/base/check.h"
#include "src/train/parity_dump.h"

namespace vlm::cli {

namespace {

const char* kUsage = R"(usage: vlmtrain dump --model DIR --batch FILE --out FILE [options]
  One forward (and with --grads one backward) of the HF snapshot DIR (any registered model_type)
  on the batch in FILE (safetensors: input_ids, labels (HF-aligned), position_ids, cu_seqlens),
  writing logits [T, V] f32, loss (mean over valid targets) and with --grads every parameter
  gradient under its HF name.
  --grads                also run backward and write the gradients
  --dtype f32|bf16       parameter and compute dtype (default f32; logits and loss are f32)
  --ac off|full|selective  activation checkpointing (default off; results are identical)
  --device cpu|cuda[:N]  where to run (default cpu)
  --export DIR           also write the loaded model as an HF snapshot to DIR (same dtype)
)";

} // namespace

int cmd_dump(const std::vector<std::string>& args) {
  train::DumpOptions o;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      VLM_CHECK(i + 1 < args.size(), "option ", a, " needs a value\n", kUsage);
      return args[++i];
    };
    if (a == "--model")
      o.model_dir = value();
    else if (a == "--batch")
      o.batch_path = value();
    else if (a == "--out")
      o.out_path = value();
    else if (a == "--grads")
      o.grads = true;
    else if (a == "--dtype")
      o.dtype = parse_model_dtype(value(), "--dtype");
    else if (a == "--ac")
      o.ac = parallel::parse_ac_mode(value());
    else if (a == "--device")
      o.device = parse_device(value());
    else if (a == "--export")
      o.export_dir = value();
    else if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else
      VLM_FAIL("unknown option '", a, "' for `vlmtrain dump`\n", kUsage);
  }
  train::run_dump(o);
  return 0;
}

} // namespace vlm::cli
