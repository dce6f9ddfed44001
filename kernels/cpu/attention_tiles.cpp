// The flash kernels' tile lists (kernels/attention_tiles.h) and which lists a CUDA attention call
// reads (kernels/attention.h): host logic, in every build.
#include "kernels/attention_tiles.h"

#include <algorithm>
#include <cstdlib>

#include "kernels/attention.h"
#include "src/base/check.h"

namespace vlm::kernels {

std::string TileSpec::str() const {
  return detail::str_cat(rows, " rows, ", causal ? "causal" : "bidirectional",
                         late_first ? ", late first" : "");
}

TileSpec tile_spec(int32_t rows, bool causal, bool queries) {
  return TileSpec{rows, causal, causal && queries};
}

std::vector<Tile> make_tiles(const int32_t* cu, int64_t docs, const TileSpec& spec) {
  VLM_CHECK(spec.rows >= 1, "attention tiles: rows must be >= 1, got ", spec.rows);
  const int64_t rows = spec.rows;
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < docs; b++) {
    const int32_t start = cu[b], len = cu[b + 1] - cu[b];
    for (int64_t r = 0; r < len; r += rows) tiles.push_back({start, len, int32_t(r)});
  }
  // The work of a tile: the keys its last query row sees (query tile) or the queries its first key
  // is seen by (key tile); bidirectional: the document.
  auto work = [&](const Tile& t) -> int64_t {
    if (!spec.causal) return t.len;
    return spec.late_first ? std::min<int64_t>(int64_t(t.begin) + rows, t.len)
                           : int64_t(t.len) - t.begin;
  };
  std::stable_sort(tiles.begin(), tiles.end(),
                   [&](const Tile& a, const Tile& b) { return work(a) > work(b); });
  VLM_CHECK(tiles.size() <= size_t(INT32_MAX), "attention: too many tiles: ", tiles.size());
  return tiles;
}

bool attention_simt_only() {
  const char* e = std::getenv("VLM_ATTENTION_SIMT");
  return e != nullptr && e[0] == '1';
}

int32_t flash_query_rows(int64_t head_dim) { return head_dim <= 128 ? 64 : 32; }

FlashTileSpecs flash_tile_specs(const AttentionShape& shape, DType dtype) {
  const int32_t query_rows = flash_query_rows(shape.head_dim);
  // bf16 on tensor cores tiles keys like queries; the fp32 SIMT dK/dV kernel takes 32 keys.
  const bool tensor_cores = dtype == DType::bf16 && !attention_simt_only();
  const int32_t key_rows = tensor_cores ? query_rows : 32;
  return {tile_spec(query_rows, shape.causal, /*queries=*/true),
          tile_spec(key_rows, shape.causal, /*queries=*/false)};
}

} // namespace vlm::kernels
