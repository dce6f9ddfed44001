#include "model/lm_loss.h"

#include "src/core/ops/elementwise.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace {

// Head logits [T, vocab] in the parameter dtype.
Tensor head_logits(const CausalLM& model, const Batch& batch) {
  return linear(model.hidden_states(batch), model.head_weight());
}

// Logits are handed out in fp32 (f64 for an f64 model), as HF upcasts them for the loss.
Tensor to_output_dtype(const Tensor& logits) {
  return logits.dtype() == DType::bf16 ? cast(logits, DType::f32) : logits;
}

void check_targets(const CausalLM& model, const Batch& batch) {
  VLM_CHECK(batch.targets.defined(), model.model_type(), ": the batch has no targets for the loss");
}

} // namespace

Tensor lm_loss(const CausalLM& model, const Batch& batch, Reduction reduction,
               const LossOptions& options) {
  check_targets(model, batch);
  VLM_CHECK(options.vocab_chunk >= 0, "lm_loss: vocab_chunk must be >= 0, got ",
            options.vocab_chunk);
  if (options.vocab_split) { // chunked over this part's rows (0: all of them at once)
    const Tensor& head = model.head_weight();
    return linear_cross_entropy(model.hidden_states(batch), head, batch.targets, -100, reduction,
                                options.vocab_chunk > 0 ? options.vocab_chunk : head.size(0),
                                options.vocab_split);
  }
  if (options.vocab_chunk > 0)
    return linear_cross_entropy(model.hidden_states(batch), model.head_weight(), batch.targets,
                                -100, reduction, options.vocab_chunk);
  return cross_entropy(head_logits(model, batch), batch.targets, -100, reduction);
}

Tensor lm_logits(const CausalLM& model, const Batch& batch) {
  return to_output_dtype(head_logits(model, batch));
}

LMOutput lm_forward(const CausalLM& model, const Batch& batch) {
  check_targets(model, batch);
  Tensor head = head_logits(model, batch);
  LMOutput out;
  out.logits = to_output_dtype(head);
  out.loss = cross_entropy(head, batch.targets);
  out.num_targets = count_targets(batch);
  return out;
}

} // namespace vlm::model
