// SIGTERM (SLURM's time limit and preemption, `scancel`), SIGUSR1 (SLURM's pre-timeout signal,
// `--signal=USR1@120`) and SIGINT (Ctrl-C) during training: the first one asks the trainer to
// stop after the step that is running, with a message and a checkpoint; a second one ends the
// process at once (the default action), for a stuck step.
#pragma once

namespace vlm::train {

class StopSignals {
public:
  StopSignals();  // installs the handlers (one instance at a time)
  ~StopSignals(); // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (SIGTERM, SIGUSR1, SIGINT), or 0.
  static int received();
};

} // namespace vlm::train
