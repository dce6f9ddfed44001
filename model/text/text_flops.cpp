#include "model/text/text_flops.h"

namespace vlm::model {

int64_t dense_text_matmul_params(const TextConfig& c) {
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  const int64_t per_layer = H * q + 2 * H * kv + q * H + c.mlp_matmul_params();
  return c.num_hidden_layers * per_layer + H * c.vocab_size;
}

TrainingFlops dense_text_training_flops(const TextConfig& c,
                                        const std::vector<int64_t>& doc_lengths) {
  TrainingFlops f;
  for (int64_t s : doc_lengths) f.tokens += s;
  f.linear = 6.0 * double(dense_text_matmul_params(c)) * double(f.tokens);
  f.attention = 12.0 * double(c.num_attention_heads) * double(c.head_dim) *
                causal_pairs(doc_lengths) * double(c.num_hidden_layers);
  return f;
}

TrainingFlops dense_text_training_flops(const TextConfig& c, const std::vector<int32_t>& cu_seqlens,
                                        int64_t num_real_docs) {
  return dense_text_training_flops(
      c, document_lengths(cu_seqlens, num_real_docs, "dense_text_training_flops"));
}

} // namespace vlm::model
