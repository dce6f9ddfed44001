// Training FLOPs of Qwen3 for throughput and MFU (qwen-models.md §7, model-FLOPs convention):
// every GEMM counted 3x for training (forward, input gradient, weight gradient) at 2 FLOPs per
// multiply-add; recomputation (activation checkpointing) not counted.
//   linear:    6 · N_matmul per token, N_matmul = the GEMM weights a token passes through
//              (q, k, v, o, gate, up, down of every layer and the lm_head — counted even when
//              tied; embedding lookups are free);
//   attention: 12 · Hq · D · Σ_docs S_d (S_d + 1) / 2 per layer — causal within each document
//              of length S_d (a query attends to (S+1)/2 keys on average), not over the packed
//              row's total length.
// Only real tokens count: the trailing padding segment of a packed row is excluded.
#pragma once

#include <cstdint>
#include <vector>

#include "model/qwen3_config.h"

namespace vlm::model {

struct TrainingFlops {
  double linear = 0;    // 6 · N_matmul · tokens
  double attention = 0; // causal softmax-attention core, all layers
  int64_t tokens = 0;   // real tokens counted
  double total() const { return linear + attention; }
  double per_token() const { return tokens ? total() / double(tokens) : 0.0; }
};

// GEMM weight elements one token passes through (N_matmul), lm_head included.
int64_t qwen3_matmul_params(const Qwen3Config& config);

// For documents of the given lengths (each >= 0).
TrainingFlops qwen3_training_flops(const Qwen3Config& config,
                                   const std::vector<int64_t>& doc_lengths);
// For a packed batch: documents [cu_seqlens[d], cu_seqlens[d+1]) for d < num_real_docs; the
// segments after them (the padding pseudo-document) are left out. num_real_docs = -1: all.
TrainingFlops qwen3_training_flops(const Qwen3Config& config,
                                   const std::vector<int32_t>& cu_seqlens,
                                   int64_t num_real_docs = -1);

} // namespace vlm::model
