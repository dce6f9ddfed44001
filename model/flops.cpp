#include "model/flops.h"

#include "src/base/check.h"

namespace vlm::model {

std::vector<int64_t> document_lengths(const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs,
                                      const char* who) {
  VLM_CHECK(!cu_seqlens.empty() && cu_seqlens[0] == 0, who, ": cu_seqlens must start at 0");
  const int64_t docs = int64_t(cu_seqlens.size()) - 1;
  if (num_real_docs < 0) num_real_docs = docs;
  VLM_CHECK(num_real_docs <= docs, who, ": ", num_real_docs,
            " real documents but cu_seqlens holds only ", docs);
  std::vector<int64_t> lengths;
  for (int64_t d = 0; d < num_real_docs; d++) {
    VLM_CHECK(cu_seqlens[size_t(d + 1)] >= cu_seqlens[size_t(d)], who,
              ": cu_seqlens must be non-decreasing");
    lengths.push_back(cu_seqlens[size_t(d + 1)] - cu_seqlens[size_t(d)]);
  }
  return lengths;
}

double causal_pairs(const std::vector<int64_t>& doc_lengths) {
  double pairs = 0;
  for (int64_t s : doc_lengths) {
    VLM_CHECK(s >= 0, "causal_pairs: negative document length ", s);
    pairs += double(s) * double(s + 1) / 2.0;
  }
  return pairs;
}

} // namespace vlm::model
