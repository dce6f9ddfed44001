// The tensor-parallel plan (parallel/tp/tensor_parallel.h) of any model on the shared text stack,
// found by walking its modules, so every family (and every layer kind it mixes) gets one:
//   attention       q_proj (per head: [query | gate] rows with Qwen3.5's output gate), k_proj and
//                   v_proj column-parallel by heads (KV heads shared by tp/Hkv ranks when there
//                   are fewer than tp); o_proj row-parallel; q_norm / k_norm partial gradients;
//   Gated DeltaNet  in_proj_qkv split per segment (q | k | v by key / value heads), in_proj_z,
//                   in_proj_b, in_proj_a by value heads; conv1d channels like in_proj_qkv;
//                   A_log, dt_bias by value heads; out_proj row-parallel; the gated norm's weight
//                   partial;
//   MLP             gate_proj, up_proj column-parallel, down_proj row-parallel;
//   embeddings      vocabulary-parallel, and the head (tied or not) split by vocabulary rows.
// A VLM adds its vision tower's blocks (model/vision/vision_tp_plan.h).
#pragma once

#include "model/causal_lm.h"
#include "parallel/tp/tensor_parallel.h"

namespace vlm::model {

// The plan of `model`, a family on the shared text stack (TextCausalLM); otherwise an error.
parallel::TpPlan text_tp_plan(const CausalLM& model);

} // namespace vlm::model
