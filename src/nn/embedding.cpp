#include "src/nn/embedding.h"

#include "src/core/ops/index.h"

namespace vlm::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Init init, DType dtype) {
  VLM_CHECK(num_embeddings > 0 && embedding_dim > 0,
            "Embedding: sizes must be positive, got num_embeddings=", num_embeddings,
            " embedding_dim=", embedding_dim);
  declare_parameter("weight", {num_embeddings, embedding_dim}, std::move(init), dtype);
}

Tensor Embedding::forward(const Tensor& ids) const {
  if (!has_forward_hooks()) return embedding(weight(), ids);
  // Through call(): tensor parallelism splits the vocabulary (parallel/tp/tensor_parallel.h).
  return call(
      [this](const std::vector<Tensor>& in) { return std::vector{embedding(weight(), in[0])}; },
      {ids})[0];
}

} // namespace vlm::nn
