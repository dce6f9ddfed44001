// The built-in CPU demo (the main job until the Qwen3 trainer lands): a tiny Qwen3-shaped causal
// LM (RMSNorm, GQA attention with q/k-norm and RoPE over packed documents, SwiGLU MLP, untied
// head) learns a synthetic next-token rule with AdamW, warmup + cosine LR and grad clipping. It
// exercises every layer of the core — kernels, ops, autograd, modules, optimizer — end to end.
#pragma once

#include <cstdint>
#include <string>

namespace vlm::train {

struct DemoOptions {
  int64_t steps = 800;
  int64_t rows = 4;      // packed rows per step
  int64_t seq_len = 128; // tokens per row
  uint64_t seed = 0;
  int64_t log_every = 50;
  bool activation_checkpointing = false;
  std::string metrics_path; // one JSON line per logged step; empty: none
};

struct DemoResult {
  double first_loss = 0; // mean over the first logged window
  double last_loss = 0;  // mean over the last logged window
  int64_t tokens = 0;
  double seconds = 0;
};

DemoResult run_demo(const DemoOptions& options);

} // namespace vlm::train
