#include "src/cli/cmd_dump.h"

#include "src/base/check.h"
#include "src/cli/args.h"
#include "src/core/device.h"
#include "src/train/parity_dump.h"

namespace vlm::cli {

int cmd_dump(const std::vector<std::string>& args) {
  train::DumpOptions o;
  std::string dtype = "f32", ac = "off", device = "cpu";
  CLI::App app{"One forward (and with --grads one backward) of the HF snapshot --model (any "
               "registered model_type) on the batch in --batch (safetensors: input_ids, labels "
               "(HF-aligned), position_ids, cu_seqlens; model/batch_file.h), writing logits "
               "[T, V] f32, loss (mean over valid targets) and with --grads every parameter "
               "gradient under its HF name, for parity checks against transformers.",
               "vlmtrain dump"};
  show_defaults(app);
  app.add_option("--model", o.model_dir, "the HF snapshot folder")->required();
  app.add_option("--batch", o.batch_path, "the batch (safetensors)")->required();
  app.add_option("--out", o.out_path, "the output (safetensors)")->required();
  app.add_flag("--grads", o.grads, "also run backward and write the gradients");
  app.add_option("--dtype", dtype, "parameter and compute dtype (logits and loss are f32)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--ac", ac, "activation checkpointing (results are identical)")
      ->check(CLI::IsMember({"off", "full", "selective"}));
  app.add_option("--device", device, "cpu or cuda[:N]");
  app.add_option("--export", o.export_dir,
                 "also write the loaded model as an HF snapshot to this folder (same dtype)");
  if (!parse_args(app, args)) return 0;
  o.dtype = parse_model_dtype(dtype, "--dtype");
  o.ac = parallel::parse_ac_mode(ac);
  o.device = parse_device(device);
  train::run_dump(o);
  return 0;
}

} // namespace vlm::cli
