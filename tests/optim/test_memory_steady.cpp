// A training step frees everything it allocates: after the first step (which creates the
// optimizer state), the bytes held by tensors are the same after every step.
#include <catch2/catch.hpp>

#include "src/core/ops.h"
#include "src/optim/adamw.h"

using namespace vlm;

TEST_CASE("memory: tensor bytes do not grow across training steps", "[optim]") {
  Rng rng(1);
  Tensor w1 = Tensor::randn({32, 16}, rng, DType::f32, 0.1).set_requires_grad(true);
  Tensor w2 = Tensor::randn({8, 32}, rng, DType::f32, 0.1).set_requires_grad(true);
  Tensor norm_w = Tensor::ones({32}).set_requires_grad(true);
  w1.set_name("w1");
  w2.set_name("w2");
  norm_w.set_name("norm");
  optim::AdamW opt({{"all", {w1, w2, norm_w}, 1.0, 0.01}});
  Tensor x = Tensor::randn({64, 16}, rng);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>(64, 3), {64});
  auto& alloc = allocator_for(Device::cpu());
  std::vector<size_t> held;
  for (int step = 0; step < 5; step++) {
    Tensor h = rms_norm(linear(x, w1), norm_w, 1e-6);
    Tensor loss = cross_entropy(linear(silu(h), w2), labels);
    loss.backward();
    opt.step(1e-3);
    opt.zero_grad();
    loss = h = Tensor();
    held.push_back(alloc.stats().current_bytes);
  }
  for (size_t i = 1; i < held.size(); i++) CHECK(held[i] == held[0]);
}
