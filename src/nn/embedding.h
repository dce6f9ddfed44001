// Embedding: a [num_embeddings, embedding_dim] table looked up by integer ids (HF layout).
#pragma once

#include "src/nn/module.h"

namespace vlm::nn {

class Embedding : public Module {
public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Init init = Init::normal(0.02),
            DType dtype = DType::f32);
  std::string type_name() const override { return "Embedding"; }

  // ids (i32/i64, any shape) -> [*ids.shape, embedding_dim]
  Tensor forward(const Tensor& ids) const;
  const Tensor& weight() const { return param("weight"); }
};

} // namespace vlm::nn
