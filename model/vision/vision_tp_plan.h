// The tensor-parallel plan of a vision-language model: its text stack's (model/text/text_tp_plan.h)
// and its vision tower's blocks, split Megatron's way where their heads divide tp — the fused qkv
// by segments (q | k | v, each by heads), proj row-parallel, linear_fc1 column-parallel and
// linear_fc2 row-parallel (the biases of the row-parallel ones added once, after the sum); the
// LayerNorms see whole activations and stay replicated. With fewer vision heads (or MLP rows)
// than ranks the block stays whole on every rank (TpPlan optional modules). The patch embedding,
// the position table and the mergers stay replicated: they are small next to the blocks.
#pragma once

#include "model/causal_lm.h"
#include "parallel/tp/tensor_parallel.h"

namespace vlm::model {

parallel::TpPlan vision_language_tp_plan(const CausalLM& model);

} // namespace vlm::model
