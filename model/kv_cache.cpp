#include "model/kv_cache.h"

#include "src/base/check.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, KVCache::Layer& cache,
                        double softmax_scale) {
  const int64_t T = q.size(0), heads = q.size(1), D = q.size(2), kv_heads = k.size(1);
  if (!cache.keys.defined()) { // prefill: the prompt as one causal document
    cache.keys = k;
    cache.values = v;
    const Tensor cu = Tensor::from_vector(std::vector<int32_t>{0, int32_t(T)}, {2});
    return attention(q, k, v, cu, /*causal=*/true, softmax_scale);
  }
  VLM_CHECK(T == 1, "KV cache: a step after the prefill takes one token, got ", T);
  cache.keys = concat({cache.keys, k}, 0);
  cache.values = concat({cache.values, v}, 0);
  // GQA: query head h reads kv head h / g, so [1, heads, D] is [kv_heads, g, D] per kv head.
  // Scores, softmax and the weighted sum in f32 (f64 for f64 models) and the output rounded to
  // q's dtype once, as the attention kernels of the prefill and the full forward do: in bf16 the
  // scores would be rounded to 8 significant bits before the softmax (issue 34).
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const int64_t g = heads / kv_heads;
  const Tensor qh = reshape(q, {kv_heads, g, D}).to(acc);
  const Tensor kt = copy(permute(cache.keys, {1, 2, 0})).to(acc);   // [kv_heads, D, T_all]
  const Tensor vh = copy(permute(cache.values, {1, 0, 2})).to(acc); // [kv_heads, T_all, D]
  const Tensor p = softmax(scale(matmul(qh, kt), softmax_scale));
  return reshape(matmul(p, vh), {1, heads, D}).to(q.dtype());
}

} // namespace vlm::model
