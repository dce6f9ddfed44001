#include "src/cli/cmd_train.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "parallel/process_group.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/demo/demo_dataset.h"
#include "src/train/config.h"
#include "src/train/trainer.h"

namespace vlm::cli {

namespace {

const char* kTrainUsage = R"(usage: vlmtrain train [--config FILE] [--set section.key=value ...]
                     [--require-loss-drop R] [--require-caption-accuracy A]
                     [--inject-fault KIND:RANK:STEP]
  Trains by a TOML config (configs/*.toml; every key: configs/README.md). Without --config it
  trains the built-in demo (configs/demo.toml): a tiny Qwen3-VL on the synthetic shapes dataset
  of `vlmtrain data make-demo demo_data`, which is created on the first run, and prints its
  caption accuracy on held-out images.
  --set section.key=value   override one key (repeatable), e.g. --set training.total_steps=50
  --require-loss-drop R     exit 1 unless the last logged loss <= R x the first (for tests)
  --require-caption-accuracy A  exit 1 unless the caption accuracy is >= A (in [0, 1])
  --inject-fault KIND:RANK:STEP[:POINT]  fail on purpose (for tests): at step STEP on rank RANK,
                            mid-step or at POINT of that step's save (save-writing, save-closed,
                            save-renamed); KIND error (throws), crash (abort), kill (SIGKILL),
                            hang (sleeps forever) or signal (SIGUSR1)
  Under mpirun or srun each rank trains its share ([parallel] in configs/README.md); rank 0
  prints and writes the metrics (and checkpoints, unless checkpoint.format = "hdf5": all ranks).
  SIGTERM or SIGUSR1 (SLURM's --signal=USR1@120): the job saves after the running step and
  exits with code 75, for the job script to requeue; SIGINT: saves and exits with 130.
  --keys                    print every config key with its type, default and meaning (the
                            table of configs/README.md) and exit
)";

std::string value_of(const std::vector<std::string>& args, size_t& i) {
  VLM_CHECK(i + 1 < args.size(), "option ", args[i], " needs a value");
  return args[++i];
}

} // namespace

int cmd_train(const std::vector<std::string>& args) {
  std::string config_path;
  std::vector<std::string> overrides;
  double require_drop = 0, require_caption = -1;
  train::FaultInjection fault;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (a == "--config")
      config_path = value_of(args, i);
    else if (a == "--set")
      overrides.push_back(value_of(args, i));
    else if (a == "--require-loss-drop") {
      const std::string v = value_of(args, i);
      char* end = nullptr;
      require_drop = std::strtod(v.c_str(), &end);
      VLM_CHECK(end && *end == '\0' && require_drop > 0,
                "--require-loss-drop expects a positive number, got '", v, "'");
    } else if (a == "--require-caption-accuracy") {
      const std::string v = value_of(args, i);
      char* end = nullptr;
      require_caption = std::strtod(v.c_str(), &end);
      VLM_CHECK(end && *end == '\0' && require_caption >= 0 && require_caption <= 1,
                "--require-caption-accuracy expects a number in [0, 1], got '", v, "'");
    } else if (a == "--inject-fault") {
      fault = train::parse_fault_injection(value_of(args, i));
    } else if (a == "--keys") {
      std::printf("%s", train::train_config_keys_markdown().c_str());
      return 0;
    } else if (a == "--help" || a == "-h") {
      std::printf("%s", kTrainUsage);
      return 0;
    } else {
      VLM_FAIL("unknown option '", a, "' for `vlmtrain train`\n", kTrainUsage);
    }
  }
  const bool demo = config_path.empty();
  train::TrainConfig config = demo ? train::parse_train_config(train::builtin_demo_config_toml(),
                                                               "built-in demo config", overrides)
                                   : train::load_train_config(config_path, overrides);
  // MPI (a single process without a launcher is a world of one); rank 0 makes the demo data.
  auto world = parallel::world_group();
  if (demo && world->rank() == 0 && !std::filesystem::exists(config.data.data_path)) {
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
