// The work lists of the CUDA flash-attention kernels (kernels/cuda/attention_*.cu): each block
// owns one tile of rows of one document, and the list of tiles is built on the host from
// cu_seqlens. Plain C++ (kernels/cpu/attention_tiles.cpp), so the CPU tests check it and the layer
// above (src/core/varlen.h) builds each list once per batch and keeps it on the device; the
// launchers only read device pointers.
//
// Tiles never cross documents: a document of n tokens gives ceil(n / rows) tiles, an empty one
// none. The list is ordered heaviest first, so the longest-running blocks start first: for causal
// attention a query tile's work grows with its distance from the document start (late tiles
// first) and a key tile's with its distance from the end (early tiles first); bidirectional tiles
// weigh their document's length. Ties keep document order (a stable sort).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm::kernels {

struct Tile {
  int32_t start; // first token of the document
  int32_t len;   // tokens in the document
  int32_t begin; // first row of the tile, relative to the document start
};
static_assert(sizeof(Tile) == 12, "the device kernels read Tile as three int32");

// Which list: rows per tile, the mask, and the order (late_first: query tiles, heaviest last in the
// document; otherwise key tiles, heaviest first in the document). late_first is false without the
// causal mask (bidirectional tiles weigh the same either way), so equal lists have equal specs.
struct TileSpec {
  int32_t rows = 0;
  bool causal = true;
  bool late_first = false;
  bool operator==(const TileSpec&) const = default;
  std::string str() const; // "64 rows, causal, late first"
};
// The spec of a query-tile (late_first) or key-tile list, normalized as above.
TileSpec tile_spec(int32_t rows, bool causal, bool queries);

// The tiles of `spec` over the documents of cu (docs + 1 non-decreasing offsets from 0). Throws
// when rows < 1 or there are more tiles than the grid takes (INT32_MAX).
std::vector<Tile> make_tiles(const int32_t* cu, int64_t docs, const TileSpec& spec);

// A tile list on the device (what the launchers take): `count` tiles at `tiles`, built for `spec`
// (a launcher checks it is the list it needs).
struct TileList {
  const Tile* tiles = nullptr;
  int64_t count = 0;
  TileSpec spec;
};

} // namespace vlm::kernels
