// Global-norm gradient clipping (training.max_grad_norm; the reference defined it but never
// applied it, docs/reference-trainer.md §1 #13). torch.nn.utils.clip_grad_norm_ semantics:
//   total = sqrt(sum over params of sum(grad^2)),  coef = min(1, max_norm / (total + 1e-6)).
// The sum is accumulated in double over fixed blocks and in the given parameter order, so it is
// bit-identical run to run and for any thread count. Parameters without a .grad are skipped.
// CUDA gradients (f32/bf16) are summed on their device (fixed-block fp64 partials added in
// order, one launch per tensor, one host synchronization per device) after the CPU ones.
//
// Distributed training splits clip_grad_norm into its pieces: each rank computes
// grad_norm_squared over its shards, the sums are all-reduced, then scale_grads(clip_coefficient).
#pragma once

#include <vector>

#include "src/core/tensor.h"

namespace vlm::optim {

// Sum of squares of every defined .grad (f32, bf16 or f64), in double.
double grad_norm_squared(const std::vector<Tensor>& params);
// sqrt(grad_norm_squared(params)): for logging without clipping.
double grad_norm(const std::vector<Tensor>& params);
// min(1, max_norm / (total_norm + 1e-6)); max_norm must be > 0.
double clip_coefficient(double total_norm, double max_norm);
// Multiplies every defined .grad by coef in place.
void scale_grads(const std::vector<Tensor>& params, double coef);

// Returns the pre-clip total norm and, when it exceeds max_norm, scales the gradients by
// clip_coefficient. A non-finite norm (inf/NaN gradients) is returned as is and nothing is
// scaled: the caller decides (the trainer skips the step and counts it).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

} // namespace vlm::optim
