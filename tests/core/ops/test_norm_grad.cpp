// Finite-difference checks (f64) of the normalization family: every differentiable input of
// rms_norm, rms_norm_zero_centered, rms_norm_gated and layer_norm, with and without the optional
// parameters, for strided inputs, and with only some inputs requiring grad.
#include "src/core/ops/norm.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::gradcheck;
using vlm::testing::leaf;

namespace {

Tensor rnd(const Shape& s, uint64_t seed, double std = 1.0, double mean = 0.0) {
  Rng rng(seed);
  return leaf(Tensor::randn(s, rng, DType::f64, std, mean));
}

Tensor constant(const Tensor& t) { return t.detach(); }

} // namespace

TEST_CASE("norm: grad rms_norm", "[grad]") {
  auto x = rnd({2, 3, 6}, 1), w = rnd({6}, 2, 0.3, 1.0);
  gradcheck("rms_norm", [](auto& in) { return rms_norm(in[0], in[1], 1e-6); }, {x, w});
  gradcheck("rms_norm no weight", [](auto& in) { return rms_norm(in[0], Tensor(), 1e-5); }, {x});
  gradcheck("rms_norm weight only", [](auto& in) { return rms_norm(in[0], in[1], 1e-6); },
            {constant(x), w});
  gradcheck("rms_norm strided x",
            [](auto& in) { return rms_norm(transpose(in[0], 0, 2), in[1], 1e-6); },
            {rnd({2, 3, 6}, 3), rnd({2}, 4, 0.3, 1.0)});
  // More rows than the kernel's 128 row blocks: several rows per block in the dw sum.
  gradcheck("rms_norm many rows", [](auto& in) { return rms_norm(in[0], in[1], 1e-6); },
            {rnd({300, 2}, 5), rnd({2}, 6, 0.3, 1.0)});
}

TEST_CASE("norm: grad rms_norm_zero_centered", "[grad]") {
  auto x = rnd({3, 2, 5}, 7), w = rnd({5}, 8, 0.3);
  gradcheck("rms_norm_zero_centered",
            [](auto& in) { return rms_norm_zero_centered(in[0], in[1], 1e-6); }, {x, w});
  gradcheck("rms_norm_zero_centered no weight",
            [](auto& in) { return rms_norm_zero_centered(in[0], Tensor(), 1e-6); }, {x});
  gradcheck("rms_norm_zero_centered x only",
            [](auto& in) { return rms_norm_zero_centered(in[0], in[1], 1e-5); }, {x, constant(w)});
}

TEST_CASE("norm: grad rms_norm_gated", "[grad]") {
  auto x = rnd({2, 3, 5}, 9), z = rnd({2, 3, 5}, 10, 2.0), w = rnd({5}, 11, 0.3, 1.0);
  gradcheck("rms_norm_gated", [](auto& in) { return rms_norm_gated(in[0], in[1], in[2], 1e-6); },
            {x, z, w});
  gradcheck("rms_norm_gated no weight",
            [](auto& in) { return rms_norm_gated(in[0], in[1], Tensor(), 1e-5); }, {x, z});
  gradcheck("rms_norm_gated z only",
            [](auto& in) { return rms_norm_gated(in[0], in[1], in[2], 1e-6); },
            {constant(x), z, constant(w)});
  gradcheck("rms_norm_gated x and w",
            [](auto& in) { return rms_norm_gated(in[0], in[1], in[2], 1e-6); },
            {x, constant(z), w});
  gradcheck("rms_norm_gated strided",
            [](auto& in) {
              return rms_norm_gated(transpose(in[0], 0, 1), transpose(in[1], 0, 1), in[2], 1e-6);
            },
            {rnd({4, 3, 5}, 12), rnd({4, 3, 5}, 13, 2.0), w});
}

TEST_CASE("norm: grad layer_norm", "[grad]") {
  auto x = rnd({2, 3, 6}, 14, 1.0, 0.5), w = rnd({6}, 15, 0.3, 1.0), b = rnd({6}, 16, 0.3);
  gradcheck("layer_norm", [](auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
            {x, w, b});
  gradcheck("layer_norm no affine",
            [](auto& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-6); }, {x});
  gradcheck("layer_norm weight only",
            [](auto& in) { return layer_norm(in[0], in[1], Tensor(), 1e-6); }, {x, w});
  gradcheck("layer_norm bias only",
            [](auto& in) { return layer_norm(in[0], Tensor(), in[1], 1e-6); }, {x, b});
  gradcheck("layer_norm params only",
            [](auto& in) { return layer_norm(in[0], in[1], in[2], 1e-6); }, {constant(x), w, b});
  gradcheck("layer_norm strided x",
            [](auto& in) { return layer_norm(transpose(in[0], 0, 2), in[1], in[2], 1e-6); },
            {rnd({2, 3, 6}, 17, 1.0, 0.5), rnd({2}, 18, 0.3, 1.0), rnd({2}, 19, 0.3)});
}
