// Training FLOPs of a dense text stack whose every layer is causal softmax attention (Qwen3, the
// text side of Qwen3-VL; qwen-models.md §7; conventions in model/flops.h): the GEMM weights are
// q, k, v, o, gate, up, down of every layer and the lm_head (counted even when tied; embedding
// lookups are free).
#pragma once

#include <cstdint>
#include <vector>

#include "model/flops.h"
#include "model/text/text_config.h"

namespace vlm::model {

// GEMM weight elements one token passes through (N_matmul), lm_head included.
int64_t dense_text_matmul_params(const TextConfig& config);

// For documents of the given lengths (each >= 0).
TrainingFlops dense_text_training_flops(const TextConfig& config,
                                        const std::vector<int64_t>& doc_lengths);
// For a packed batch: documents [cu_seqlens[d], cu_seqlens[d+1]) for d < num_real_docs; the
// segments after them (the padding pseudo-document) are left out. num_real_docs = -1: all.
TrainingFlops dense_text_training_flops(const TextConfig& config,
                                        const std::vector<int32_t>& cu_seqlens,
                                        int64_t num_real_docs = -1);

} // namespace vlm::model
