// Activation checkpointing, applied to a model's blocks from outside (DESIGN.md §2.2): each block
// gets a forward wrapper (nn::Module::add_forward_wrapper), so the model never knows.
//   off       everything the backward needs stays in memory;
//   full      each block runs under checkpoint() (src/core/autograd.h): only its inputs are kept,
//             the whole block is recomputed in backward (one extra forward);
//   selective each block runs under checkpoint() with a MatmulStash: its inputs and the output of
//             every linear() inside it are kept (a decoder layer's q, k, v, o, gate, up, down);
//             backward recomputes the cheap ops between them — norms, RoPE, the attention core
//             (softmax(qk^T)v; its FLOPs are ~12·Hq·D·ctx per token, cheap next to the projections
//             at short context, and its output is not kept), SwiGLU and the residual adds — but no
//             GEMM.
// All three give bit-identical losses and gradients. With grad mode off the wrappers just run the
// block. Whatever is outside the blocks (embeddings, final norm, head, loss) is never
// checkpointed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/base/enum_names.h"
#include "src/core/ops/matmul.h"
#include "src/nn/module.h"

namespace vlm::parallel {

enum class AcMode : uint8_t { off, full, selective };
// off, full, selective, and "sac" (the reference trainer's name) for selective.
std::span<const EnumName<AcMode>> ac_mode_names();
const char* ac_mode_name(AcMode mode);
AcMode parse_ac_mode(const std::string& text);

// Wraps each block's forward as `mode` says (off: nothing). Apply once, after tensor parallelism
// and before FSDP (torchtitan's order); applying it twice to a block is an error. Returns the
// wrapper of each block (nn::Module::remove_forward_hook takes it off again), in block order.
std::vector<size_t> apply_activation_checkpointing(const std::vector<nn::Module*>& blocks,
                                                   AcMode mode);

// The selective mode's store, one per block call: installed as the thread's LinearInterceptor
// (src/core/ops/matmul.h) while the block runs under checkpoint():
//   * first run (grad mode off): each linear() runs normally and its output is kept;
//   * recomputation (checkpoint's backward, grad mode on): each linear() hands back its kept
//     output without a GEMM, recorded with linear()'s own backward (linear_from_output), so
//     gradients are bit-identical to running without checkpointing.
// The block must call its projections in the same order in both runs (a mismatch is an error,
// not silent garbage).
class MatmulStash final : public LinearInterceptor {
public:
  Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) override;
  size_t size() const { return outputs_.size(); }
  size_t nbytes() const;

private:
  std::vector<Tensor> outputs_;
  size_t next_ = 0; // next output to hand back during recomputation
};

} // namespace vlm::parallel
