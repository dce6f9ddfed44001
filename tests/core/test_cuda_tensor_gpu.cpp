// Tensors on CUDA: allocation through the stream-ordered pool, host<->device copies, and the
// allocator's accounting. Skips (exit 77) with the device query text when there is no device.
#include <catch2/catch.hpp>

#include "src/core/ops.h"
#include "src/nn/module.h"
#include "tests/gpu_testing.h"
#include "tests/skip.h"

using namespace vlm;

using vlm::testing::rel_err;
using vlm::testing::require_device;

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

TEST_CASE("cuda tensor: Module::to moves parameters, keeping names, ties and requires_grad",
          "[gpu]") {
  require_device();
  nn::Module m;
  auto emb = m.register_module("embed", std::make_shared<nn::Module>());
  auto head = m.register_module("head", std::make_shared<nn::Module>());
  Tensor w = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {3, 2}, DType::bf16);
  emb->register_parameter("weight", w);
  head->register_parameter("weight", w); // tied
  head->declare_parameter("bias", {3}, nn::Init::constant(0.5));
  m.materialize();
  Rng rng(1);
  m.initialize(rng);
  m.find_parameter("head.bias").set_requires_grad(false);
  m.to(Device::cuda(0));
  const auto params = m.named_parameters();
  REQUIRE(params.size() == 2); // the tied weight is still one tensor
  CHECK(params[0].name == "embed.weight");
  CHECK(params[0].tensor.name() == "embed.weight");
  CHECK(params[0].tensor.device() == Device::cuda(0));
  CHECK(params[0].tensor.dtype() == DType::bf16);
  CHECK(params[0].tensor.requires_grad());
  CHECK(params[0].tensor.is_leaf());
  CHECK(params[0].tensor.to_doubles() == w.to_doubles());
  CHECK(params[1].name == "head.bias");
  CHECK_FALSE(params[1].tensor.requires_grad());
  CHECK(params[1].tensor.to_doubles() == std::vector<double>(3, 0.5));
  // Both registrations now hold the same CUDA tensor.
  CHECK(emb->param("weight").same(head->param("weight")));
  m.to(Device::cpu());
  CHECK(m.find_parameter("embed.weight").to_doubles() == w.to_doubles());
}

TEST_CASE("cuda tensor: pinned staging blocks are reused only after their copies finish", "[gpu]") {
  require_device();
  // Many staging tensors filled, copied asynchronously and freed at once: a block handed out
  // again while its copy is still reading would corrupt an earlier device tensor.
  std::vector<Tensor> on_device;
  for (int i = 0; i < 64; i++) {
    Tensor staging = Tensor::empty_pinned({1 << 16}, DType::i64);
    int64_t* p = staging.data<int64_t>();
    for (int64_t j = 0; j < (1 << 16); j++) p[j] = int64_t(i) * 1000003 + j;
    on_device.push_back(staging.to(Device::cuda(0)));
  }
  for (int i = 0; i < 64; i++) {
    const auto v = on_device[size_t(i)].to_doubles();
    INFO("tensor " << i);
    CHECK(v.front() == double(int64_t(i) * 1000003));
    CHECK(v.back() == double(int64_t(i) * 1000003 + (1 << 16) - 1));
  }
}
