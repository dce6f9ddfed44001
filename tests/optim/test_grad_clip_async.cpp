// optim::clip_grad_norm_async on the CPU (the path a CPU run and mixed-device lists take): the same
// norm, coefficient and clipped gradients as clip_grad_norm, as a [2] f64 tensor; and the launch
// counters' interface (kernels/gpu_runtime.h), which a run without GPU work leaves at zero.
// Its CUDA twin is tests/optim/test_grad_clip_multi_gpu.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "src/core/ops.h"
#include "src/optim/grad_clip.h"

using namespace vlm;
using namespace vlm::optim;

namespace {

Tensor param_with_grad(const std::vector<double>& g, DType dtype = DType::f32) {
  Tensor p = Tensor::zeros({int64_t(g.size())}, dtype).set_requires_grad(true);
  p.set_grad(Tensor::from_doubles(g, {int64_t(g.size())}, dtype));
  return p;
}

} // namespace

TEST_CASE("grad clip async: on the CPU, {norm², coefficient} and the gradients of clip_grad_norm",
          "[optim]") {
  // sqrt(9 + 16 + 144) = 13.
  auto params = [] {
    return std::vector<Tensor>{param_with_grad({3, 4}), param_with_grad({12}, DType::bf16),
                               Tensor::zeros({5}).set_requires_grad(true)}; // no grad: skipped
  };
  std::vector<Tensor> ref = params(), got = params();
  const double norm = clip_grad_norm(ref, 6.5);
  const Tensor out = clip_grad_norm_async(got, 6.5);
  CHECK(out.device().is_cpu());
  CHECK(out.dtype() == DType::f64);
  REQUIRE(out.numel() == 2);
  const std::vector<double> v = out.to_doubles();
  CHECK(v[0] == 169.0);
  CHECK(std::sqrt(v[0]) == norm);
  CHECK(v[1] == clip_coefficient(13.0, 6.5));
  for (size_t i = 0; i < 2; i++) CHECK(got[i].grad().to_doubles() == ref[i].grad().to_doubles());
  CHECK_FALSE(got[2].grad().defined());

  // Below max_norm, and max_norm = 0 (measure only): coefficient 1, nothing scaled.
  for (double max_norm : {100.0, 0.0}) {
    std::vector<Tensor> ps = params();
    const std::vector<double> w = clip_grad_norm_async(ps, max_norm).to_doubles();
    CHECK(w == std::vector<double>{169.0, 1.0});
    CHECK(ps[0].grad().to_doubles() == std::vector<double>{3, 4});
  }
}

TEST_CASE("grad clip async: a non-finite norm is returned with coefficient 1, nothing scaled",
          "[optim]") {
  std::vector<Tensor> ps = {param_with_grad({3, NAN}), param_with_grad({12})};
  const std::vector<double> v = clip_grad_norm_async(ps, 1.0).to_doubles();
  CHECK(std::isnan(v[0]));
  CHECK(v[1] == 1.0);
  CHECK(ps[1].grad().to_doubles() == std::vector<double>{12});
  CHECK_THROWS(clip_grad_norm_async({Tensor()}, 1.0)); // an undefined parameter
}

TEST_CASE("launch counters: readable and resettable, and CPU work launches nothing", "[optim]") {
  kernels::cuda::reset_launch_counts();
  std::vector<Tensor> ps = {param_with_grad({3, 4})};
  clip_grad_norm_async(ps, 1.0);
  const kernels::cuda::LaunchCounts c = kernels::cuda::launch_counts();
  CHECK(c.kernels == 0);
  CHECK(c.library_calls == 0);
  CHECK(c.h2d_copies == 0);
  CHECK(c.d2h_copies == 0);
  CHECK(c.syncs == 0);
  CHECK(kernels::cuda::kernel_launch_count() == 0);
  kernels::cuda::reset_kernel_launch_count();
}
