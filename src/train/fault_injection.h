// Failures on purpose, for the tests of what a failing rank or an interrupted save does to a job
// (`vlmtrain train --inject-fault KIND:RANK:STEP[:POINT]`), on world rank RANK at optimizer step
// STEP (1-based), at POINT:
//   step           (default) after the first micro-batch's forward, before its backward: mid-step,
//                  while the other ranks are in collectives
//   save-writing   during the checkpoint save of step STEP: the file's tensors written, not closed
//   save-closed    the file complete and closed, the step_N.tmp folder not yet renamed
//   save-renamed   step_N renamed into place, `latest` not yet updated
// KIND error: throws; crash: abort() (SIGABRT); kill: SIGKILL, as `kill -9`; hang: sleeps forever;
// signal: raises SIGUSR1 (SLURM's pre-timeout signal), so the job saves and stops after the step.
#pragma once

#include <cstdint>
#include <string>

namespace vlm::train {

struct FaultInjection {
  enum class Kind { none, error, crash, kill, hang, signal } kind = Kind::none;
  enum class Point { step, save_writing, save_closed, save_renamed } point = Point::step;
  int rank = 0;
  int64_t step = 0;
};

FaultInjection parse_fault_injection(const std::string& text);

// A fault that can never fire in this run is an error naming --inject-fault: a rank outside the
// job, a step outside (first_step, total_steps] (first_step: where the run starts or resumed),
// or a save point at a step that saves nothing.
void check_fault_injection(const FaultInjection& fault, int world_size, int64_t first_step,
                           int64_t total_steps, int64_t save_steps);

// Fails as `fault` says when it is due here: on world rank `rank`, at 1-based step `step`, point
// `point`; otherwise returns.
void trigger_fault(const FaultInjection& fault, int rank, int64_t step,
                   FaultInjection::Point point);

} // namespace vlm::train
