// The deferred skip of a non-finite step on CUDA (issue 34), against the CPU:
//   * the step guard kernel (kernels/optim.h cuda::step_guard): the same clip coefficient and
//     skip flag as cpu::step_guard, bit for bit (one thread, the same fp64 operations in order);
//   * AdamW's multi-tensor update with a device skip flag: nonzero leaves parameters, masters and
//     moments bit-identical; zero updates exactly as without a flag (the CPU update, bit for bit);
//     a flag on the CPU is copied to the device;
//   * scale_grads with a device coefficient: as the CPU scales (scale_grads with a host value);
//   * the first-use self-check of the multi-tensor norm / clip kernels passes in strict mode
//     (VLM_GPU_SELF_CHECK=strict throws on a mismatch) for f32, bf16 and mixed gradients.
// Skips (exit 77) with the device query text when there is no CUDA device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "kernels/optim.h"
#include "src/base/rng.h"
#include "src/core/dispatch.h"
#include "src/core/ops/shape_ops.h"
#include "src/optim/adamw.h"
#include "src/optim/grad_clip.h"
#include "src/optim/grad_clip_check.h"
#include "tests/gpu_testing.h"

using namespace vlm;
using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::same_bits;

namespace {

Tensor flag(double v, Device device = kGpu) {
  return Tensor::from_vector(std::vector<double>{v}, {1}).to(device);
}

struct Params {
  std::vector<Tensor> cpu, cuda;
};

// Parameters of the three CUDA (param, grad) dtype pairs around the 32768-element chunk.
Params make_params(uint64_t seed) {
  Rng rng(seed);
  struct Spec {
    const char* name;
    int64_t n;
    DType param;
  };
  const Spec specs[] = {
      {"a", 100003, DType::f32}, {"b", 32768, DType::bf16}, {"c", 77, DType::bf16}};
  Params p;
  for (const Spec& s : specs) {
    const Tensor init = Tensor::randn({s.n}, rng, s.param);
    p.cpu.push_back(init.clone().set_requires_grad(true).set_name(s.name));
    p.cuda.push_back(gpu(init).set_requires_grad(true).set_name(s.name));
  }
  return p;
}

void set_grads(Params& p, uint64_t seed) {
  Rng rng(seed);
  for (size_t k = 0; k < p.cpu.size(); k++) {
    const DType g = k == 1 ? DType::bf16 : DType::f32; // (bf16, bf16) and (bf16, f32) both run
    const Tensor grad = Tensor::randn(p.cpu[k].shape(), rng, g, 0.1);
    p.cpu[k].set_grad(grad);
    p.cuda[k].set_grad(gpu(grad));
  }
}

void check_same_state(const std::vector<Tensor>& ps, const optim::AdamW& got,
                      const std::vector<Tensor>& want_ps, const optim::AdamW& want) {
  for (size_t k = 0; k < ps.size(); k++) {
    INFO("param " << ps[k].name());
    CHECK(same_bits(ps[k], want_ps[k]));
    const optim::AdamWState& g = got.state(ps[k].name());
    const optim::AdamWState& w = want.state(ps[k].name());
    CHECK(g.step == w.step);
    CHECK(same_bits(g.exp_avg, w.exp_avg));
    CHECK(same_bits(g.exp_avg_sq, w.exp_avg_sq));
    if (w.master.defined()) CHECK(same_bits(g.master, w.master));
  }
}

std::vector<optim::ParamGroup> groups(const std::vector<Tensor>& ps) {
  return {{"decay", {ps[0], ps[1]}, 1.0, 0.1}, {"other", {ps[2]}, 0.5, 0.0}};
}

} // namespace

TEST_CASE("gpu step guard: the coefficient and skip flag of the CPU guard, bit for bit", "[gpu]") {
  require_device();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = INFINITY;
  const std::vector<std::vector<double>> cases = {
      {1.5, 2.5, 16.0}, {1.5, 0.25}, {0.1, 0.2, 0.3, 1e6}, {1.5, nan, 16.0},  {inf, 1.0, 16.0},
      {1.0, inf},       {1.0, nan},  {1e308, 1e308, 4.0},  {2.0, 3.0, 7e-13}, {4.0}};
  for (double max_norm : {1.0, 0.0, 3e-7}) {
    for (const auto& c : cases) {
      const int64_t m = int64_t(c.size()) - 1; // the last value is the squared norm
      std::vector<double> want = c;
      want.push_back(-7);
      want.push_back(-7);
      kernels::cpu::step_guard(want.data(), m, max_norm);
      Tensor s = Tensor::from_vector(std::vector<double>(c.begin(), c.end()), {m + 1});
      Tensor d = Tensor::full({m + 3}, -7.0, DType::f64).to(kGpu);
      {
        Tensor head = slice(d, 0, 0, m + 1);
        copy_(head, s.to(kGpu));
      }
      dispatch_device(
          "step_guard", kGpu, [] {},
          [&](auto stream) { kernels::cuda::step_guard(d.data<double>(), m, max_norm, stream); });
      INFO("max_norm " << max_norm << ", " << m << " losses, norm² " << c.back());
      CHECK(same_bits(d, Tensor::from_vector(want, {m + 3})));
    }
  }
}

TEST_CASE("gpu adamw skip: a device flag skips the multi-tensor update, zero updates as the CPU",
          "[gpu]") {
  require_device();
  Params p = make_params(7);
  optim::AdamW oc(groups(p.cpu)), og(groups(p.cuda));
  set_grads(p, 1);
  oc.step(1e-2);
  og.step(1e-2, flag(0.0)); // zero: the same update as the CPU's
  check_same_state(p.cuda, og, p.cpu, oc);

  for (double v : {1.0, std::numeric_limits<double>::quiet_NaN()}) {
    for (Device where : {kGpu, Device::cpu()}) {
      INFO("flag " << v << " on " << where.str());
      set_grads(p, 2);
      og.step(1e-2, flag(v, where)); // nothing changes (the counts advance until undo_step)
      CHECK(og.state("a").step == 2);
      og.undo_step();
      check_same_state(p.cuda, og, p.cpu, oc);
    }
  }
  // The next update uses t = 2 on both.
  set_grads(p, 3);
  oc.step(2e-2);
  og.step(2e-2, flag(0.0));
  check_same_state(p.cuda, og, p.cpu, oc);
}

TEST_CASE("gpu scale_grads: a device coefficient scales as the CPU does, 1 leaves them alone",
          "[gpu]") {
  require_device();
  Params p = make_params(11);
  set_grads(p, 12);
  const Tensor coef = flag(0.3);
  optim::scale_grads(p.cpu, 0.3);
  optim::scale_grads(p.cuda, coef);
  for (size_t k = 0; k < p.cpu.size(); k++) {
    INFO("param " << k);
    // The same fp32 product of the same values (tests/optim/test_grad_clip_multi_gpu.cpp).
    CHECK(rel_err(p.cuda[k].grad(), p.cpu[k].grad()) <= (k == 0 ? 1e-6 : 4e-3));
  }
  std::vector<Tensor> kept;
  for (const Tensor& t : p.cuda) kept.push_back(t.grad().clone());
  optim::scale_grads(p.cuda, flag(1.0));
  for (size_t k = 0; k < p.cuda.size(); k++) CHECK(same_bits(p.cuda[k].grad(), kept[k]));
}

TEST_CASE("gpu multi-tensor grad kernels: the first-use self-check passes in strict mode",
          "[gpu]") {
  require_device();
  // Read at each key's first use: strict makes a mismatch an exception naming the error.
  setenv("VLM_GPU_SELF_CHECK", "strict", 1);
  CHECK(optim::multi_tensor_grad_kernels_pass(kGpu, true, false));
  CHECK(optim::multi_tensor_grad_kernels_pass(kGpu, false, true));
  CHECK(optim::multi_tensor_grad_kernels_pass(kGpu, true, true));
  unsetenv("VLM_GPU_SELF_CHECK");
}
