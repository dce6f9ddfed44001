// The varlen kernels' device image of the offsets (kernels/varlen_offsets.h): host logic, in every
// build.
#include "kernels/varlen_offsets.h"

#include "src/base/check.h"

namespace vlm::kernels {

std::vector<int32_t> varlen_offsets_image(const int32_t* cu, int64_t docs, int64_t chunk,
                                          int64_t* chunks) {
  VLM_CHECK(docs >= 1 && chunk >= 1, "varlen offsets: docs and chunk must be >= 1, got ", docs,
            ", ", chunk);
  std::vector<int32_t> image(size_t(2 * docs + 1));
  int64_t total = 0;
  for (int64_t b = 0; b <= docs; b++) image[size_t(b)] = cu[b];
  for (int64_t b = 0; b < docs; b++) {
    image[size_t(docs + 1 + b)] = int32_t(total);
    total += (int64_t(cu[b + 1]) - cu[b] + chunk - 1) / chunk;
    VLM_CHECK(total <= INT32_MAX, "varlen offsets: ", total, " chunks exceed int32");
  }
  *chunks = total;
  return image;
}

} // namespace vlm::kernels
