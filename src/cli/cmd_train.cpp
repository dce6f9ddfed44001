#include "src/cli/cmd_train.h"

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "parallel/comm/process_group.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/cli/args.h"
#include "src/demo/demo_dataset.h"
#include "src/train/config.h"
#include "src/train/trainer.h"

namespace vlm::cli {

namespace {

// Under a launcher, the signals, and --keys: what the option list does not say.
const char* kTrainFooter =
    R"(Under mpirun or srun each rank trains its share ([parallel] in configs/README.md); rank 0
prints and writes the metrics (and checkpoints, unless checkpoint.format = "hdf5": all ranks).
SIGTERM or SIGUSR1 (SLURM's --signal=USR1@120): the job saves after the running step and exits
with code 75, for the job script to requeue; SIGINT: saves and exits with 130.)";

} // namespace

int cmd_train(const std::vector<std::string>& args) {
  std::string config_path, fault_spec;
  std::vector<std::string> overrides;
  double require_drop = 0, require_caption = -1;
  bool keys = false;
  CLI::App app{"Trains by a TOML config (configs/*.toml; every key: configs/README.md). Without "
               "--config it trains the built-in demo (configs/demo.toml): a tiny Qwen3-VL on the "
               "synthetic shapes dataset of `vlmtrain data make-demo demo_data`, created on the "
               "first run, and prints its caption accuracy on held-out images.",
               "vlmtrain train"};
  show_defaults(app);
  app.add_option("--config", config_path, "the TOML config (default: the built-in demo)");
  app.add_option("--set", overrides,
                 "section.key=value: override one key (repeatable), e.g. training.total_steps=50")
      ->take_all()
      ->expected(1);
  app.add_option("--require-loss-drop", require_drop,
                 "exit 1 unless the last logged loss <= R x the first (for tests; 0 = off)")
      ->check(positive());
  app.add_option("--require-caption-accuracy", require_caption,
                 "exit 1 unless the caption accuracy is >= A (in [0, 1]; -1 = off)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--inject-fault", fault_spec,
                 "KIND:RANK:STEP[:POINT]: fail on purpose (for tests) at step STEP on rank RANK, "
                 "mid-step or at POINT of that step's save (save-writing, save-closed, "
                 "save-renamed); KIND error (throws), crash (abort), kill (SIGKILL), hang (sleeps "
                 "forever) or signal (SIGUSR1)");
  app.add_flag("--keys", keys,
               "print every config key with its type, default and meaning (the table of "
               "configs/README.md) and exit");
  app.footer(kTrainFooter);
  if (!parse_args(app, args)) return 0;
  if (keys) {
    std::printf("%s", train::train_config_keys_markdown().c_str());
    return 0;
  }
  // Given at all, even as "", it is parsed (an empty value is refused, not read as no fault).
  const train::FaultInjection fault = app.count("--inject-fault") == 0
                                          ? train::FaultInjection{}
                                          : train::parse_fault_injection(fault_spec);
  const bool builtin_demo = config_path.empty();
  train::TrainConfig config = builtin_demo
                                  ? train::parse_train_config(train::builtin_demo_config_toml(),
                                                              "built-in demo config", overrides)
                                  : train::load_train_config(config_path, overrides);
  // MPI (a single process without a launcher is a world of one); rank 0 makes the demo data
  // (data.make_demo: the built-in demo and the demo configs).
  auto world = parallel::world_group();
  if (config.data.make_demo && world->rank() == 0 &&
      !std::filesystem::exists(config.data.data_path)) {
    log_info("demo: creating the demo dataset in ", config.data.data_path,
             " (vlmtrain data make-demo)");
    demo::make_demo_dataset(config.data.data_path);
  }
  world->barrier();
  train::TrainSummary s = train::run_training(config, fault);
  // SIGTERM / SIGUSR1 (a time limit ahead): saved, run again to continue; SIGINT: the shell's
  // code for "ended by this signal".
  if (s.stop_signal) return s.stop_signal == SIGINT ? 128 + SIGINT : kRequeueExitCode;
  if (require_drop > 0 && !(s.last_loss <= require_drop * s.first_loss)) {
    std::fprintf(stderr, "error: the loss did not fall enough: %.4f -> %.4f (required <= %.2f x)\n",
                 s.first_loss, s.last_loss, require_drop);
    return 1;
  }
  if (require_caption >= 0 && !(s.caption_accuracy >= require_caption)) {
    std::fprintf(stderr, "error: caption accuracy %.3f is below the required %.3f%s\n",
                 s.caption_accuracy, require_caption,
                 s.caption_accuracy < 0 ? " (not measured: set training.caption_eval_images)" : "");
    return 1;
  }
  return 0;
}

} // namespace vlm::cli
