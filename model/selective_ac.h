// Selective activation checkpointing: keep the matmul outputs of a block, recompute the rest.
//
// A block runs under checkpoint() (src/core/autograd.h) with a MatmulStash, and routes every
// projection through MatmulStash::linear:
//   * first run (inside checkpoint, grad mode off): the projection runs normally and its output
//     is kept in the stash;
//   * recomputation (checkpoint's backward, grad mode on): the block's forward runs again, but each
//     projection hands back its kept output without a GEMM and records a backward node that
//     computes dx, dw (and db) from the recomputed input: linear()'s own backward
//     (linear_from_output), so gradients are bit-identical to running without checkpointing.
// So the expensive ops (the GEMMs) run once forward and once backward, as without checkpointing;
// only the cheap ones between them (norms, RoPE, attention, SwiGLU, residual adds) run twice.
// Kept per block: its input and every projection output; freed: all other activations (norm
// outputs, q/k after norm and RoPE, attention output, SwiGLU output, ...).
//
// The stash belongs to one block call: capture a fresh std::shared_ptr<MatmulStash> in each
// checkpoint function; it is freed with the checkpoint node after backward. The block must call
// its projections in the same order in both runs (a mismatch is an error, not silent garbage).
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/tensor.h"

namespace vlm::model {

class MatmulStash {
public:
  // y = x w^T + bias (bias may be undefined), see above.
  Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
  size_t size() const { return outputs_.size(); }
  size_t nbytes() const;

private:
  std::vector<Tensor> outputs_;
  size_t next_ = 0; // next output to hand back during recomputation
};

} // namespace vlm::model
