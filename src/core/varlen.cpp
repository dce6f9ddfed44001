#include "src/core/varlen.h"

#include <algorithm>
#include <vector>

#include "src/base/check.h"

namespace vlm {

VarlenLayout VarlenLayout::of(const Tensor& cu_seqlens, int64_t tokens) {
  VLM_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2 &&
                (cu_seqlens.dtype() == DType::i32 || cu_seqlens.dtype() == DType::i64),
            "varlen layout: cu_seqlens must be [docs + 1] i32 or i64 with docs >= 1, got ",
            cu_seqlens.defined() ? cu_seqlens.desc() : std::string("nothing"));
  const std::vector<double> v = cu_seqlens.to_doubles();
  VLM_CHECK(v[0] == 0, "varlen layout: cu_seqlens[0] must be 0, got ", v[0]);
  std::vector<int32_t> offsets(v.size());
  VarlenLayout out;
  for (size_t d = 1; d < v.size(); d++) {
    VLM_CHECK(v[d] >= v[d - 1], "varlen layout: cu_seqlens must be non-decreasing, but cu_seqlens[",
              d, "] = ", v[d], " < cu_seqlens[", d - 1, "] = ", v[d - 1]);
    offsets[d] = int32_t(v[d]);
    out.max_length = std::max(out.max_length, int64_t(v[d] - v[d - 1]));
  }
  VLM_CHECK(int64_t(v.back()) == tokens, "varlen layout: cu_seqlens ends at ", v.back(),
            " but the batch has ", tokens, " tokens");
  out.cu_seqlens = Tensor::from_vector(offsets, {int64_t(offsets.size())});
  out.docs = int64_t(offsets.size()) - 1;
  out.tokens = tokens;
  return out;
}

VarlenLayout VarlenLayout::single(int64_t tokens) {
  return of(Tensor::from_vector(std::vector<int32_t>{0, int32_t(tokens)}, {2}), tokens);
}

} // namespace vlm
