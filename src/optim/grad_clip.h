// Global-norm gradient clipping (training.max_grad_norm; the reference defined it but never
// applied it, docs/reference-trainer.md §1 #13). torch.nn.utils.clip_grad_norm_ semantics:
//   total = sqrt(sum over params of sum(grad^2)),  coef = min(1, max_norm / (total + 1e-6)).
// The sum is accumulated in double over fixed blocks and in the given parameter order, so it is
// bit-identical run to run and for any thread count. Parameters without a .grad are skipped.
// CUDA gradients (f32/bf16) are summed on their device by the multi-tensor kernels of
// kernels/optim.h (fixed-chunk fp64 partials added in a fixed order: deterministic; two launches
// for up to 1024 tensors, whatever their sizes) after the CPU ones, and scaled by one more launch.
// clip_grad_norm_async keeps the norm on the device: clipping needs no host read at all.
// The multi-tensor kernels check themselves on first use per device and dtype mix
// (src/optim/grad_clip_check.h); after a mismatch every function here takes the per-tensor path
// (the sums of squares on host copies, scale_ per gradient), which reads the device.
//
// Distributed training splits clip_grad_norm into its pieces: each rank computes its squared norm
// (clip_grad_norm_async with max_norm 0: on the device), the sums are all-reduced as a tensor, the
// coefficient is computed from them (the training step's guard, kernels/optim.h step_guard) and
// applied by scale_grads with that coefficient tensor: no host read.
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
// The same with a one-element f64 coefficient that may not be known on the host yet (e.g.
// clip_grad_norm_async's [1], or the training step's guard): the gradients are scaled when
// coef < 1 (1 or NaN: untouched). With every gradient and the coefficient on one CUDA device this
// is decided there (one launch per 1024 tensors, no host read); otherwise coef is read first.
void scale_grads(const std::vector<Tensor>& params, const Tensor& coef);

// Returns the pre-clip total norm and, when it exceeds max_norm, scales the gradients by
// clip_coefficient. A non-finite norm (inf/NaN gradients) is returned as is and nothing is
// scaled: the caller decides (the trainer skips the step and counts it).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// clip_grad_norm without a host read: returns a [2] f64 tensor {sum of squares of every defined
// .grad, clip coefficient} on the gradients' device, and (max_norm > 0) scales the gradients by
// the coefficient when it is below 1 — decided on the device when the gradients are on one CUDA
// device (the coefficient is min(1, max_norm / (sqrt(sum) + 1e-6)); 1 when max_norm <= 0 or the
// sum is not finite, and nothing is scaled then). On the CPU, with gradients on several devices,
// or after a failed self-check of the multi-tensor kernels, the same result is computed
// synchronously and returned on the CPU. With every gradient on one CUDA device this is 3
// launches for up to kernels::cuda::kGradSpansPerLaunch (1024) tensors (2 without clipping) and
// no synchronization; read the result (to_doubles) once, when the value is needed (logging, the
// non-finite check).
Tensor clip_grad_norm_async(const std::vector<Tensor>& params, double max_norm);

} // namespace vlm::optim
