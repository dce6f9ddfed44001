#include "model/vision/vision_positions.h"

#include <cmath>
#include <limits>

#include "src/base/check.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace {

// Lower and upper table index and their weights along one axis of n patches.
struct AxisTap {
  int64_t lo, hi;
  float w_lo, w_hi;
};

AxisTap axis_tap(int64_t r, int64_t n, int64_t side) {
  // fp32 as transformers: multiply first, then divide (closed form, no linspace).
  const float src = float(r * (side - 1)) / float(std::max<int64_t>(n - 1, 1));
  const auto lo = int64_t(std::floor(src));
  const float d = src - float(lo);
  return {lo, std::min(lo + 1, side - 1), 1.0f - d, 1.0f - std::fabs(d - 1.0f)};
}

} // namespace

VisionPositions vision_positions(const std::vector<GridTHW>& grids, int64_t table_side,
                                 int64_t merge) {
  VLM_CHECK(table_side >= 1, "vision_positions: table side must be >= 1, got ", table_side);
  VLM_CHECK(merge >= 1, "vision_positions: merge size must be >= 1, got ", merge);
  VisionPositions p;
  p.cu_seqlens.push_back(0);
  for (size_t g = 0; g < grids.size(); g++) {
    const auto [gt, gh, gw] = grids[g];
    VLM_CHECK(gt >= 1 && gh >= 1 && gw >= 1 && gh % merge == 0 && gw % merge == 0,
              "vision_positions: image_grid_thw[", g, "] = (", gt, ", ", gh, ", ", gw,
              ") must be positive with h and w multiples of the merge size ", merge);
    VLM_CHECK(p.patches + gt * gh * gw < std::numeric_limits<int32_t>::max(),
              "vision_positions: more than 2^31 patches in one batch");
    for (int64_t t = 0; t < gt; t++) {
      for (int64_t br = 0; br < gh / merge; br++)
        for (int64_t bc = 0; bc < gw / merge; bc++)
          for (int64_t ir = 0; ir < merge; ir++)
            for (int64_t ic = 0; ic < merge; ic++) {
              const int64_t r = br * merge + ir, c = bc * merge + ic;
              p.rows.push_back(r);
              p.cols.push_back(c);
              const AxisTap a = axis_tap(r, gh, table_side), b = axis_tap(c, gw, table_side);
              for (auto [row, wr] : {std::pair{a.lo, a.w_lo}, std::pair{a.hi, a.w_hi}})
                for (auto [col, wc] : {std::pair{b.lo, b.w_lo}, std::pair{b.hi, b.w_hi}}) {
                  p.taps.push_back(row * table_side + col);
                  p.weights.push_back(wr * wc);
                }
            }
      p.patches += gh * gw;
      p.cu_seqlens.push_back(int32_t(p.patches));
    }
  }
  return p;
}

RopeTables vision_rope_tables(const VisionPositions& p, int64_t head_dim, double theta,
                              Device device) {
  VLM_CHECK(head_dim >= 4 && head_dim % 4 == 0,
            "vision_rope_tables: the vision head dim must be a multiple of 4, got ", head_dim);
  const Tensor rows = Tensor::from_vector(p.rows, {p.patches}, device);
  const Tensor cols = Tensor::from_vector(p.cols, {p.patches}, device);
  const RopeTables r = rope_tables(rows, head_dim / 2, theta, DType::f32);
  const RopeTables c = rope_tables(cols, head_dim / 2, theta, DType::f32);
  RopeTables t;
  t.rotary_dim = head_dim;
  t.cos = concat({r.cos, c.cos}, 1);
  t.sin = concat({r.sin, c.sin}, 1);
  return t;
}

} // namespace vlm::model
