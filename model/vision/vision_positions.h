// Where each patch of the vision tower (Qwen3-VL and Qwen3.5, qwen-models.md §2.4) sits, computed
// on the host once per batch from image_grid_thw, in the processor's merge-window patch order
// (per temporal slice: 2x2 windows in raster order, the 4 patches of a window consecutive):
//   * rows / cols: the patch's coordinates in its gh x gw grid (the 2-D vision rotary's
//     positions), repeated for each of the gt slices;
//   * taps / weights: the learned position table (side x side) bilinearly interpolated to the
//     grid with align_corners = True: src = r·(side−1)/max(gh−1, 1) in fp32, four table rows
//     and fp32 weights per patch (transformers 5.24's closed form: 1 − d for the lower tap,
//     1 − |d − 1| for the upper one);
//   * cu_seqlens: one attention segment per image and per temporal slice (gh·gw patches each).
// vision_rope_tables turns rows / cols into the attention's rotary tables.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "src/core/ops/rope.h"

namespace vlm::model {

using GridTHW = std::array<int64_t, 3>; // (t, h, w) in patches, as HF image_grid_thw

struct VisionPositions {
  std::vector<int64_t> rows, cols; // [patches]
  std::vector<int64_t> taps;       // [patches, 4] indices into the position table
  std::vector<float> weights;      // [patches, 4]
  std::vector<int32_t> cu_seqlens; // [segments + 1]
  int64_t patches = 0;
};

// The 2-D rotary tables of the vision attention (qwen-models.md §2.4 step 3, rope type "axial"):
// slots [0, hd/4) rotate by the patch row, slots [hd/4, hd/2) by its column, both with the
// frequencies of a hd/2-dim rope (inv_freq[i] = theta^(-2i/(hd/2))); fp32, as HF applies them
// (q and k upcast). On `device`; rope() applies them over the whole head dim.
RopeTables vision_rope_tables(const VisionPositions& positions, int64_t head_dim, double theta,
                              Device device = Device::cpu());

// grids: every image (and video) of the batch in order; h and w multiples of `merge`;
// table_side: sqrt(num_position_embeddings) (48 for the released models). Errors name the grid.
VisionPositions vision_positions(const std::vector<GridTHW>& grids, int64_t table_side,
                                 int64_t merge = 2);

} // namespace vlm::model
