// Tensors on CUDA: allocation through the stream-ordered pool, host<->device copies, and the
// allocator's accounting. Skips (exit 77) with the device query text when there is no device.
#include <catch2/catch.hpp>

#include "src/core/ops.h"
#include "tests/gpu/gpu_testing.h"
#include "tests/skip.h"

using namespace vlm;

using vlm::testing::rel_err;
using vlm::testing::require_device;

namespace {} // namespace

TEST_CASE("cuda tensor: host -> device -> host round trip keeps every value", "[gpu]") {
  require_device();
  Rng rng(1);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    Tensor h = Tensor::randn({3, 5, 7}, rng, dt);
    Tensor d = h.to(Device::cuda(0));
    CHECK(d.device() == Device::cuda(0));
    CHECK(d.to(Device::cpu()).to_doubles() == h.to_doubles());
    Tensor z = Tensor::zeros({4, 4}, dt, Device::cuda(0));
    CHECK(z.to_doubles() == std::vector<double>(16, 0.0));
  }
}

TEST_CASE("cuda tensor: allocator tracks current and peak bytes", "[gpu]") {
  require_device();
  auto& a = allocator_for(Device::cuda(0));
  size_t before = a.stats().current_bytes;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::f32, Device::cuda(0));
    CHECK(a.stats().current_bytes == before + (size_t(1) << 22));
  }
  CHECK(a.stats().current_bytes == before);
}

TEST_CASE("cuda tensor: gradients flow back across a device move", "[gpu]") {
  require_device();
  Tensor x = Tensor::from_doubles({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor y = x.to(Device::cuda(0)).to(Device::cpu());
  sum(mul(y, y)).backward();
  CHECK(x.grad().to_doubles() == std::vector<double>{2, 4, 6});
}
