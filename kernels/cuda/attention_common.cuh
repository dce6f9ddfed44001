// The parts the flash-attention forward (attention_fwd.cu) and backward (attention_bwd.cu) share
// beyond the tiles of attention_tiles.cuh: each block's view of its tile (query tiles: forward and
// dQ; key tiles: dK/dV), staging a query tile's lse and delta, and the one host-side launcher
// (tile list check, grid, shared memory, launch check). For .cu files under kernels/cuda only.
#pragma once

#include "kernels/cuda/attention_tiles.cuh"

namespace vlm::kernels::cuda::attn {

// A block of a query-tile kernel (forward, dQ): its tile (blockIdx.x), query head h (blockIdx.y)
// and that head's kv head g, the tile's rows, the row strides of q and k/v, and the (token, head)
// row of the tile's first query.
struct QueryTile {
  Tile tile;
  int h, g;
  int rows;
  int64_t q_stride, kv_stride;
  int64_t q_row0;
};

template <int kRows>
__device__ __forceinline__ QueryTile query_tile(const Tile* tiles, int Hq, int Hkv, int D) {
  const Tile tile = tiles[blockIdx.x];
  const int h = blockIdx.y;
  return {tile,
          h,
          h / (Hq / Hkv),
          min(kRows, tile.len - tile.begin),
          int64_t(Hq) * D,
          int64_t(Hkv) * D,
          (int64_t(tile.start) + tile.begin) * Hq + h};
}

// A block of a key-tile kernel (dK, dV): its tile (blockIdx.x), kv head g (blockIdx.y) and the
// number of query heads per kv head, the tile's keys, the row strides of q and k/v, and the
// (token, kv head) row of the tile's first key.
struct KeyTile {
  Tile tile;
  int g, group;
  int keys;
  int64_t q_stride, kv_stride;
  int64_t kv_row0;
};

template <int kRows>
__device__ __forceinline__ KeyTile key_tile(const Tile* tiles, int Hq, int Hkv, int D) {
  const Tile tile = tiles[blockIdx.x];
  const int g = blockIdx.y;
  return {tile,
          g,
          Hq / Hkv,
          min(kRows, tile.len - tile.begin),
          int64_t(Hq) * D,
          int64_t(Hkv) * D,
          (int64_t(tile.start) + tile.begin) * Hkv + g};
}

// sLse[e], sDelta[e] = lse, delta of query row e of a tile whose first (token, head) row is
// q_row0 (rows Hq apart) for e < rows; zero for the tile's other rows (e < kRows).
template <int kRows>
__device__ __forceinline__ void load_row_stats(float* sLse, float* sDelta, const float* lse,
                                               const float* delta, int64_t q_row0, int rows,
                                               int Hq) {
  for (int e = threadIdx.x; e < kRows; e += blockDim.x) {
    sLse[e] = e < rows ? lse[q_row0 + int64_t(e) * Hq] : 0.f;
    sDelta[e] = e < rows ? delta[q_row0 + int64_t(e) * Hq] : 0.f;
  }
}

// ------------------------------------------------------------------------------------------------
// Host side.

// What a flash kernel's blocks own: query tiles (grid y = query heads) or key tiles (grid y = kv
// heads). Either list is ordered heaviest first: late query tiles, early key tiles (make_tiles).
enum class TileRows { queries, keys };

// The launches of one attention call: its shape and stream.
struct FlashLauncher {
  const AttentionShape& s;
  cudaStream_t stream;

  // Launches kernel over `tiles` (on the device; they must be the list of tile_rows rows of
  // `kind` for this shape's mask) x the heads that `kind` names, with Cfg's threads and dynamic
  // shared memory, and checks the launch under `op`. The kernel takes `args` followed by (tiles,
  // Hq, Hkv, D, scale, causal).
  template <typename Cfg, typename Kernel, typename... Args>
  void launch(const char* op, Kernel kernel, TileRows kind, int tile_rows, const TileList& tiles,
              Args... args) const {
    const int D = int(s.head_dim), Hq = int(s.q_heads), Hkv = int(s.kv_heads);
    const bool queries = kind == TileRows::queries;
    const TileSpec want = tile_spec(tile_rows, s.causal, queries);
    VLM_CHECK(tiles.spec == want, op, ": needs the tile list of ", want.str(), ", got one of ",
              tiles.spec.str());
    VLM_CHECK(tiles.count > 0 && tiles.count <= INT32_MAX && tiles.tiles != nullptr, op,
              ": a tile list of ", tiles.count, " tiles for ", s.tokens, " tokens");
    allow_smem(kernel, Cfg::smem);
    kernel<<<dim3(unsigned(tiles.count), unsigned(queries ? Hq : Hkv)), Cfg::kThreads, Cfg::smem,
             stream>>>(args..., tiles.tiles, Hq, Hkv, D, float(s.scale), s.causal);
    check_last_launch(op);
  }
};

} // namespace vlm::kernels::cuda::attn
