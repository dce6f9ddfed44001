#include "src/cli/cmd_export.h"

#include <cstdio>
#include <filesystem>

#include "model/hf_weights.h"
#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/cli/args.h"
#include "src/train/checkpoint.h"

namespace vlm::cli {

namespace {

namespace fs = std::filesystem;

// --out: a new or empty folder, checked before anything is loaded (export writes nothing else).
void check_out(const std::string& out) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(out, ec);
  if (!fs::exists(st)) return;
  VLM_CHECK(fs::is_directory(st), "export: --out ", out,
            " is a file; export writes a new folder and never replaces anything");
  VLM_CHECK(fs::is_empty(out, ec) && !ec, "export: --out ", out,
            " is a folder that is not empty (a checkpoint, a run's output, other files): export "
            "writes only into a new or empty folder and never replaces or deletes anything");
}

} // namespace

int cmd_export(const std::vector<std::string>& args) {
  std::string checkpoint, out, dtype_name_ = "bf16";
  CLI::App app{"Writes an HF snapshot (config.json, model.safetensors, tokenizer files) that "
               "transformers loads, from a checkpoint of `vlmtrain train`: a step_N folder "
               "(checkpoint.format = \"hdf5\", saved by any number of ranks and any layout), a "
               "checkpoint.output_dir (what its `latest` names), or an HF snapshot "
               "(checkpoint-step-N, or any HF snapshot of a registered model type).",
               "vlmtrain export"};
  show_defaults(app);
  app.add_option("--checkpoint", checkpoint, "the checkpoint: step_N, output_dir or HF snapshot")
      ->required();
  app.add_option("--out", out,
                 "a new folder or an empty one: export never replaces or deletes anything")
      ->required();
  app.add_option("--dtype", dtype_name_, "the snapshot's dtype")
      ->check(CLI::IsMember({"bf16", "f32"}));
  if (!parse_args(app, args)) return 0;
  const DType dtype = parse_model_dtype(dtype_name_, "--dtype");
  check_out(out);
  const std::string dir = train::resolve_checkpoint_path(checkpoint, "export: --checkpoint");
  std::shared_ptr<model::CausalLM> m =
      train::load_checkpoint_model(dir, DType::f32, "export: --checkpoint");
  model::save_hf_snapshot(*m, m->hf_config(), out, dtype, dir, model::kDefaultMaxShardBytes, {},
                          &m->stored());
  std::printf("exported %s (%s) from %s to %s\n", m->summary().c_str(), dtype_name(dtype),
              dir.c_str(), out.c_str());
  return 0;
}

} // namespace vlm::cli
