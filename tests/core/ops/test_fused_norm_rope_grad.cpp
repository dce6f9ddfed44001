// Finite-difference checks (f64) of the fused add_rms_norm and rms_norm_rope: every differentiable
// input, plain and zero-centred weights, no weight, partial rotary, and only some inputs requiring
// grad. add_rms_norm's two outputs are checked together (concatenated), so the sum's own gradient
// and the norm's input gradient both reach x and h.
#include "src/core/ops/norm.h"
#include "src/core/ops/rope.h"
#include "src/core/ops/shape_ops.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::gradcheck;
using vlm::testing::leaf;

namespace {

Tensor rnd(const Shape& s, uint64_t seed, double std = 1.0, double mean = 0.0) {
  Rng rng(seed);
  return leaf(Tensor::randn(s, rng, DType::f64, std, mean));
}

Tensor both(const std::pair<Tensor, Tensor>& p) { return concat({p.first, p.second}, -1); }

RopeTables tables(int64_t T, int64_t rotary) {
  std::vector<int64_t> pos;
  for (int64_t t = 0; t < T; t++) pos.push_back(3 * t + 1);
  return rope_tables(Tensor::from_vector(pos, {T}), rotary, 1e4, DType::f64);
}

} // namespace

TEST_CASE("fused: grad add_rms_norm", "[grad]") {
  auto x = rnd({2, 3, 7}, 1), h = rnd({2, 3, 7}, 2, 0.5), w = rnd({7}, 3, 0.3, 1.0);
  gradcheck("add_rms_norm", [](auto& in) { return both(add_rms_norm(in[0], in[1], in[2], 1e-6)); },
            {x, h, w});
  gradcheck("add_rms_norm zero-centred",
            [](auto& in) { return both(add_rms_norm(in[0], in[1], in[2], 1e-6, true)); },
            {x, h, rnd({7}, 4, 0.3)});
  gradcheck("add_rms_norm no weight",
            [](auto& in) { return both(add_rms_norm(in[0], in[1], Tensor(), 1e-5)); }, {x, h});
  gradcheck("add_rms_norm h only",
            [](auto& in) { return both(add_rms_norm(in[0], in[1], in[2], 1e-6)); },
            {x.detach(), h, w.detach()});
  gradcheck("add_rms_norm normed output only",
            [](auto& in) { return add_rms_norm(in[0], in[1], in[2], 1e-6).second; }, {x, h, w});
  gradcheck("add_rms_norm many rows",
            [](auto& in) { return both(add_rms_norm(in[0], in[1], in[2], 1e-6)); },
            {rnd({300, 2}, 5), rnd({300, 2}, 6), rnd({2}, 7, 0.3, 1.0)});
}

TEST_CASE("fused: grad rms_norm_rope", "[grad]") {
  auto x = rnd({3, 2, 6}, 11, 1.0, 0.3), w = rnd({6}, 12, 0.3, 1.0);
  auto t6 = tables(3, 6), t2 = tables(3, 2);
  gradcheck("rms_norm_rope", [&](auto& in) { return rms_norm_rope(in[0], in[1], 1e-6, t6); },
            {x, w});
  gradcheck("rms_norm_rope zero-centred partial rotary",
            [&](auto& in) { return rms_norm_rope(in[0], in[1], 1e-6, t2, true); },
            {x, rnd({6}, 13, 0.3)});
  gradcheck("rms_norm_rope no weight",
            [&](auto& in) { return rms_norm_rope(in[0], Tensor(), 1e-5, t6); }, {x});
  gradcheck("rms_norm_rope weight only",
            [&](auto& in) { return rms_norm_rope(in[0], in[1], 1e-6, t6); }, {x.detach(), w});
  auto t150 = tables(150, 2);
  gradcheck("rms_norm_rope many rows",
            [&](auto& in) { return rms_norm_rope(in[0], in[1], 1e-6, t150); },
            {rnd({150, 2, 2}, 14), rnd({2}, 15, 0.3, 1.0)});
}
