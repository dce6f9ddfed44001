// Training FLOPs for throughput and MFU (qwen-models.md §7, model-FLOPs convention): every GEMM
// counted 3x for training (forward, input gradient, weight gradient) at 2 FLOPs per multiply-add;
// recomputation (activation checkpointing) not counted. Each family counts its own GEMM weights
// and attention (model/<family>/); the shared pieces are here.
//   linear:    6 · N_matmul per token, N_matmul = the GEMM weights a token passes through;
//   attention: 12 · Hq · D · Σ_docs S_d (S_d + 1) / 2 per causal softmax-attention layer — causal
//              within each document of length S_d, not over the packed row's total length.
// Only real tokens count: the trailing padding segment of a packed row is excluded.
#pragma once

#include <cstdint>
#include <vector>

namespace vlm::model {

struct TrainingFlops {
  double linear = 0;    // 6 · N_matmul · tokens
  double attention = 0; // attention cores, all layers
  int64_t tokens = 0;   // real tokens counted
  double total() const { return linear + attention; }
  double per_token() const { return tokens ? total() / double(tokens) : 0.0; }
};

// Lengths of documents [cu_seqlens[d], cu_seqlens[d+1]) for d < num_real_docs (-1: all); checks
// that cu_seqlens starts at 0 and does not decrease (`who` names the caller in errors).
std::vector<int64_t> document_lengths(const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs,
                                      const char* who);

// Σ S (S + 1) / 2 over the documents: query-key pairs of causal attention within each document.
double causal_pairs(const std::vector<int64_t>& doc_lengths);

} // namespace vlm::model
