#include "model/selective_ac.h"

#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/matmul.h"

namespace vlm::model {

Tensor MatmulStash::linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (!GradMode::is_enabled()) { // the checkpoint's first run: compute and keep
    Tensor y = vlm::linear(x, w, bias);
    outputs_.push_back(y);
    return y;
  }
  // Recomputation: hand back the kept output, with linear()'s own backward (the same GEMMs, so
  // the gradients are bit-identical to running without checkpointing).
  VLM_CHECK(next_ < outputs_.size(), "selective checkpointing: projection ", next_ + 1,
            " was not run in the first forward (", outputs_.size(),
            " kept); the block's forward must call its projections in the same order each time");
  const Tensor& kept = outputs_[next_++];
  Shape expected = x.shape();
  VLM_CHECK(!expected.empty() && w.dim() == 2, "selective checkpointing: linear of ", x.desc(),
            " and ", w.desc());
  expected.back() = w.size(0);
  VLM_CHECK(kept.shape() == expected && kept.dtype() == x.dtype(),
            "selective checkpointing: projection ", next_, " kept ", kept.desc(),
            " but the recomputation asks for ", shape_str(expected), " ", dtype_name(x.dtype()),
            "; the block's forward must be deterministic");
  return linear_from_output(x, w, bias, kept);
}

size_t MatmulStash::nbytes() const {
  size_t n = 0;
  for (const auto& t : outputs_) n += t.nbytes();
  return n;
}

} // namespace vlm::model
