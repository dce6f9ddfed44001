// Softmax cross-entropy for language-model heads.
#pragma once

#include <cstdint>
#include <functional>

#include "src/core/tensor.h"

namespace vlm {

enum class Reduction : uint8_t { mean, sum };

// Cross-entropy of logits [..., V] (f32, bf16 or f64) against labels [...] (i32 or i64); the usual
// case is logits [N, V] with labels [N]. Per token: logsumexp(logits) - logits[label], computed in
// f32 (f64 for f64 logits). Tokens whose label == ignore_index contribute nothing; any other label
// outside [0, V) is an error naming the row and value.
//   mean: sum over valid tokens / number of valid tokens;  sum: the plain sum.
// The tokens are summed in double in a fixed order. Returns a 0-dim f32 tensor (f64 for f64
// logits) on the logits' device. The gradient w.r.t. logits comes back in the logits' dtype;
// ignored rows get zeros.
// If every label is ignored, the mean is 0 with zero gradients (torch returns NaN): a fully masked
// micro-batch must not poison training.
// On CUDA nothing synchronizes (no value travels to the host: the sum, the count and the mean's
// 1/count stay on the device), and a bad label is thrown at the next synchronization
// (src/core/device_errors.h); on the CPU it is thrown at once.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean);

// For gradient accumulation across micro-batches: the summed loss (reduction sum) and the number
// of non-ignored tokens, so the caller can divide by the global count. num_valid is a 0-dim i64
// tensor on the logits' device (read it with item(), which synchronizes on CUDA).
struct CrossEntropyResult {
  Tensor loss_sum;
  Tensor num_valid;
};
CrossEntropyResult cross_entropy_sum(const Tensor& logits, const Tensor& labels,
                                     int64_t ignore_index = -100);

// The LM head fused with cross-entropy: the value and gradients of
//   cross_entropy(linear(x, weight), labels, ignore_index, reduction)
// without ever holding the [N, V] logits: the vocabulary is processed in chunks of vocab_chunk
// rows of weight; each chunk's logits [N, vocab_chunk] (in x's dtype, rounded as linear() rounds
// them) are merged into a running per-row logsumexp in fp32 (f64 for f64), and the backward
// recomputes them chunk by chunk (dx accumulated in fp32 and rounded once, dweight written chunk
// by chunk). x: [N, H]; weight: [V, H] (HF layout; tied embeddings pass the embedding matrix);
// labels: [N] i32/i64. Same dtype/device rules as linear and cross_entropy (CUDA: f32/bf16, no
// synchronization, deferred label checks). Returns the 0-dim loss (f32; f64 for f64) on x's
// device; differentiable in x and weight.
//
// With `split`, `weight` is one part of a vocabulary split over several ranks (tensor
// parallelism: parallel/tp/vocab_parallel.h), and the loss is the whole vocabulary's: each part
// merges its own rows' chunks, then `split` combines the per-row statistics over the parts (the
// max, then [sum-exp; target logit] summed), and the backward sums dx over them before it is
// rounded. Every part passes the same x and labels and gets the same loss; its weight gets the
// gradient of its own rows. Nothing here knows ranks: the split's functions are the collectives.
struct VocabSplit {
  int64_t vocab_begin = 0, vocab = 0; // the part's first global row; the whole vocabulary
  // In place over the parts (a group's all-reduce): called in the same order on every part.
  std::function<void(const Tensor&)> sum, max;
};
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& labels,
                            int64_t ignore_index = -100, Reduction reduction = Reduction::mean,
                            int64_t vocab_chunk = 8192, const VocabSplit* split = nullptr);

} // namespace vlm
