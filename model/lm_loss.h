// The language-model head and its loss over any CausalLM, written once for every family. Logits
// and the loss are computed in fp32 (f64 for an f64 model): the cross-entropy op reads bf16
// logits and computes in fp32 — the same numbers as HF's logits.float() followed by the loss,
// without an fp32 copy of the [T, vocab] logits.
#pragma once

#include <cstdint>

#include "model/causal_lm.h"
#include "src/core/ops/loss.h"

namespace vlm::model {

// How the head meets the loss: vocab_chunk = 0 computes the head logits [T, vocab] and then
// cross-entropy (fastest); N > 0 fuses the head with the loss in vocabulary chunks of N rows
// (linear_cross_entropy), never holding [T, vocab] logits — for large vocabularies or long rows.
struct LossOptions {
  int64_t vocab_chunk = 0;
  // A head whose vocabulary is split (tensor parallelism: Parallelized::loss_split()): the head
  // weight holds the split's rows, and the loss is the whole vocabulary's, combined over the
  // parts by the split (src/core/ops/loss.h): the logits are never gathered.
  const VocabSplit* vocab_split = nullptr;
};

// Token cross-entropy over the targets != -100: their sum (the trainer divides by the step's
// target count, for exact gradient accumulation) or their mean (0 with zero gradients when there
// is none). 0-dim f32 (f64 for an f64 model).
Tensor lm_loss(const CausalLM& model, const Batch& batch, Reduction reduction,
               const LossOptions& options = {});

// [T, vocab] f32 (f64 for an f64 model).
Tensor lm_logits(const CausalLM& model, const Batch& batch);

// Logits and mean loss from one forward pass (`vlmtrain dump`).
struct LMOutput {
  Tensor logits; // [T, vocab] f32 (f64 for an f64 model)
  Tensor loss;   // 0-dim: mean token cross-entropy over the valid targets (0 if none)
  int64_t num_targets = 0;
};
LMOutput lm_forward(const CausalLM& model, const Batch& batch);

} // namespace vlm::model
