// kernels/attention_tiles.h (make_tiles: the CUDA flash kernels' work lists, built on the host)
// and kernels/varlen_offsets.h (the conv1d / gated delta kernels' device image of the offsets),
// checked on the CPU against what they promise: every row of every document in exactly one tile,
// tiles inside their document, empty documents giving none, the heaviest-first order of each
// mask and kind, and which lists flash_tile_specs names for the kernels.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_tiles.h"
#include "kernels/varlen_offsets.h"
#include "src/base/check.h"

using namespace vlm;
using namespace vlm::kernels;

namespace {

std::vector<int32_t> offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

// Work of a tile as the kernels spend it: the keys a query tile meets (causal: up to its last
// row), the queries a key tile meets (causal: from its first key to the end), or the document.
int64_t work(const Tile& t, const TileSpec& s) {
  if (!s.causal) return t.len;
  const int64_t last = std::min<int64_t>(t.begin + s.rows, t.len);
  return s.late_first ? last : t.len - t.begin;
}

// Every token of cu covered by exactly one tile row, each tile inside its document and starting
// at a multiple of rows; returns the tiles per document.
std::map<int32_t, int> check_coverage(const std::vector<Tile>& tiles,
                                      const std::vector<int32_t>& cu, int32_t rows) {
  const int32_t T = cu.back();
  std::vector<int> seen(size_t(T), 0);
  std::map<int32_t, int> per_doc;
  for (const Tile& t : tiles) {
    // The tile's document is one of cu's.
    bool found = false;
    for (size_t b = 0; b + 1 < cu.size(); b++)
      found |= cu[b] == t.start && cu[b + 1] - cu[b] == t.len && t.len > 0;
    REQUIRE(found);
    REQUIRE(t.begin >= 0);
    REQUIRE(t.begin < t.len);
    REQUIRE(t.begin % rows == 0);
    for (int32_t r = t.begin; r < std::min(t.begin + rows, t.len); r++) seen[size_t(t.start + r)]++;
    per_doc[t.start]++;
  }
  for (int32_t i = 0; i < T; i++) {
    INFO("token " << i);
    CHECK(seen[size_t(i)] == 1);
  }
  return per_doc;
}

} // namespace

TEST_CASE("attention tiles: every row of every document in exactly one tile, heaviest first",
          "[kernels]") {
  // A one-token document, tile-sized, one past, empty ones (first, middle, last), a long one.
  const std::vector<int32_t> lengths = {0, 1, 64, 65, 0, 200, 31, 0};
  const std::vector<int32_t> cu = offsets(lengths);
  const int64_t docs = int64_t(lengths.size());
  for (int32_t rows : {32, 64})
    for (bool causal : {true, false})
      for (bool queries : {true, false}) {
        const TileSpec spec = tile_spec(rows, causal, queries);
        INFO(spec.str());
        const std::vector<Tile> tiles = make_tiles(cu.data(), docs, spec);
        const std::map<int32_t, int> per_doc = check_coverage(tiles, cu, rows);
        // ceil(len / rows) tiles per document, none for an empty one.
        int64_t expected = 0;
        for (int32_t l : lengths) expected += (l + rows - 1) / rows;
        CHECK(int64_t(tiles.size()) == expected);
        for (size_t b = 0; b < lengths.size(); b++)
          if (lengths[b] > 0) CHECK(per_doc.at(cu[b]) == (lengths[b] + rows - 1) / rows);
        // Heaviest first; equal work keeps document order, then row order.
        for (size_t i = 1; i < tiles.size(); i++) {
          const int64_t a = work(tiles[i - 1], spec), b = work(tiles[i], spec);
          INFO("tile " << i);
          CHECK(a >= b);
          if (a == b)
            CHECK(std::pair(tiles[i - 1].start, tiles[i - 1].begin) <
                  std::pair(tiles[i].start, tiles[i].begin));
        }
      }
}

TEST_CASE("attention tiles: the causal orders put late query tiles and early key tiles first",
          "[kernels]") {
  const std::vector<int32_t> cu = {0, 100, 130}; // 100 tokens: 4 tiles of 32; 30: 1
  const std::vector<Tile> q = make_tiles(cu.data(), 2, tile_spec(32, true, true));
  REQUIRE(q.size() == 5);
  // Query tiles: work = last row + 1 -> (0, 96) 100, (0, 64) 96, (0, 32) 64, then (0, 0) 32 and
  // (100, 0) 30.
  CHECK((q[0].start == 0 && q[0].begin == 96));
  CHECK((q[1].start == 0 && q[1].begin == 64));
  CHECK((q[2].start == 0 && q[2].begin == 32));
  CHECK((q[3].start == 0 && q[3].begin == 0));
  CHECK((q[4].start == 100 && q[4].begin == 0));
  const std::vector<Tile> k = make_tiles(cu.data(), 2, tile_spec(32, true, false));
  REQUIRE(k.size() == 5);
  // Key tiles: work = len - begin -> (0, 0) 100, (0, 32) 68, (0, 64) 36, (100, 0) 30, (0, 96) 4.
  CHECK((k[0].start == 0 && k[0].begin == 0));
  CHECK((k[1].start == 0 && k[1].begin == 32));
  CHECK((k[2].start == 0 && k[2].begin == 64));
  CHECK((k[3].start == 100 && k[3].begin == 0));
  CHECK((k[4].start == 0 && k[4].begin == 96));
  // Bidirectional: the longer document's tiles first, in row order.
  const std::vector<Tile> b = make_tiles(cu.data(), 2, tile_spec(32, false, true));
  REQUIRE(b.size() == 5);
  for (int i = 0; i < 4; i++) CHECK((b[size_t(i)].start == 0 && b[size_t(i)].begin == 32 * i));
  CHECK(b[4].start == 100);
}

TEST_CASE("attention tiles: specs, empty batches and bad rows", "[kernels]") {
  // Bidirectional lists do not depend on the kind: one spec for both.
  CHECK(tile_spec(64, false, true) == tile_spec(64, false, false));
  CHECK_FALSE(tile_spec(64, true, true) == tile_spec(64, true, false));
  CHECK(tile_spec(64, true, true).str() == "64 rows, causal, late first");
  const std::vector<int32_t> empty = {0, 0, 0};
  CHECK(make_tiles(empty.data(), 2, tile_spec(64, true, true)).empty());
  CHECK_THROWS_AS(make_tiles(empty.data(), 2, tile_spec(0, true, true)), Error);
}

TEST_CASE("attention tiles: the lists the CUDA kernels read per dtype and head dim", "[kernels]") {
  AttentionShape s;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.docs = 1;
  s.causal = true;
  for (int64_t D : {8, 64, 100, 128}) {
    s.head_dim = D;
    const FlashTileSpecs bf = flash_tile_specs(s, DType::bf16), f = flash_tile_specs(s, DType::f32);
    CHECK(bf.queries == tile_spec(64, true, true));
    CHECK(f.queries == bf.queries);
    CHECK(f.keys == tile_spec(32, true, false)); // the SIMT dK/dV kernel: 32 keys
    if (!attention_simt_only()) CHECK(bf.keys == tile_spec(64, true, false));
  }
  s.head_dim = 256;
  CHECK(flash_tile_specs(s, DType::bf16).queries.rows == 32);
  CHECK(flash_tile_specs(s, DType::bf16).keys.rows == 32);
  s.causal = false;
  const FlashTileSpecs bi = flash_tile_specs(s, DType::bf16);
  CHECK(bi.queries == bi.keys); // one list serves the forward, dQ and dK/dV
}

TEST_CASE("varlen offsets: the device image of the offsets and each document's first chunk",
          "[kernels]") {
  const std::vector<int32_t> cu = offsets({1, 70, 0, 64, 65});
  int64_t chunks = -1;
  const std::vector<int32_t> image = varlen_offsets_image(cu.data(), 5, 64, &chunks);
  // Chunks per document: 1, 2, 0, 1, 2.
  const std::vector<int32_t> want = {0, 1, 71, 71, 135, 200, /*chunk starts*/ 0, 1, 3, 3, 4};
  CHECK(image == want);
  CHECK(chunks == 6);
  CHECK_THROWS_AS(varlen_offsets_image(cu.data(), 5, 0, &chunks), Error);
}
