#include "model/flops.h"

#include "src/base/check.h"

namespace vlm::model {

int64_t qwen3_matmul_params(const Qwen3Config& c) {
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  const int64_t per_layer = H * q + 2 * H * kv + q * H + 3 * H * c.intermediate_size;
  return c.num_hidden_layers * per_layer + H * c.vocab_size;
}

TrainingFlops qwen3_training_flops(const Qwen3Config& c, const std::vector<int64_t>& doc_lengths) {
  TrainingFlops f;
  double causal_pairs = 0; // Σ S (S + 1) / 2
  for (int64_t s : doc_lengths) {
    VLM_CHECK(s >= 0, "qwen3_training_flops: negative document length ", s);
    f.tokens += s;
    causal_pairs += double(s) * double(s + 1) / 2.0;
  }
  f.linear = 6.0 * double(qwen3_matmul_params(c)) * double(f.tokens);
  f.attention = 12.0 * double(c.num_attention_heads) * double(c.head_dim) * causal_pairs *
                double(c.num_hidden_layers);
  return f;
}

TrainingFlops qwen3_training_flops(const Qwen3Config& c, const std::vector<int32_t>& cu_seqlens,
                                   int64_t num_real_docs) {
  VLM_CHECK(!cu_seqlens.empty() && cu_seqlens[0] == 0,
            "qwen3_training_flops: cu_seqlens must start at 0");
  const int64_t docs = int64_t(cu_seqlens.size()) - 1;
  if (num_real_docs < 0) num_real_docs = docs;
  VLM_CHECK(num_real_docs <= docs, "qwen3_training_flops: ", num_real_docs,
            " real documents but cu_seqlens holds only ", docs);
  std::vector<int64_t> lengths;
  for (int64_t d = 0; d < num_real_docs; d++) {
    VLM_CHECK(cu_seqlens[size_t(d + 1)] >= cu_seqlens[size_t(d)],
              "qwen3_training_flops: cu_seqlens must be non-decreasing");
    lengths.push_back(cu_seqlens[size_t(d + 1)] - cu_seqlens[size_t(d)]);
  }
  return qwen3_training_flops(c, lengths);
}

} // namespace vlm::model
