// AdamW and clip_grad_norm against torch (tools/golden/gen_optim.py): the same initial values and
// gradients replayed step by step.
#include <catch2/catch.hpp>

#include <map>
#include <memory>

#include "src/optim/adamw.h"
#include "src/optim/grad_clip.h"
#include "tests/golden/golden.h"

using namespace vlm;
using vlm::testing::Golden;
using vlm::testing::rel_error;

namespace {

const std::vector<std::string> kParams = {"w0", "b0", "w1"};

// The gradient of step s out of a stacked [steps, ...] tensor.
Tensor step_slice(const Tensor& stacked, int64_t s) {
  return reshape(slice(stacked, 0, s, s + 1).contiguous(),
                 Shape(stacked.shape().begin() + 1, stacked.shape().end()));
}

struct AdamWRun {
  std::map<std::string, Tensor> params;
  std::unique_ptr<optim::AdamW> opt;
};

// Builds the two torch param groups ([w0, b0] and [w1]) with parameters of `param_dtype`.
AdamWRun make_run(const Golden& g, DType param_dtype) {
  AdamWRun run;
  for (const auto& k : kParams) {
    Tensor p = g.get("adamw", "init." + k).to(param_dtype);
    p.set_requires_grad(true).set_name(k);
    run.params[k] = p;
  }
  auto group_lr = g.get("adamw", "group_lr").to_doubles();
  auto group_wd = g.get("adamw", "group_wd").to_doubles();
  auto hyper = g.get("adamw", "hyper").to_doubles();
  std::vector<optim::ParamGroup> groups = {
      {"g0", {run.params["w0"], run.params["b0"]}, group_lr[0], group_wd[0]},
      {"g1", {run.params["w1"]}, group_lr[1], group_wd[1]}};
  run.opt =
      std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{hyper[0], hyper[1], hyper[2]});
  return run;
}

} // namespace

TEST_CASE("optim golden: AdamW matches torch.optim.AdamW over 10 steps (fp32)", "[golden]") {
  Golden g("optim");
  AdamWRun run = make_run(g, DType::f32);
  auto lr_factor = g.get("adamw", "lr_factor").to_doubles();
  for (int64_t s = 0; s < int64_t(lr_factor.size()); s++) {
    for (const auto& k : kParams)
      run.params[k].set_grad(step_slice(g.get("adamw", "grads." + k), s));
    run.opt->step(lr_factor[size_t(s)]); // group LR = base LR (lr_scale) * factor
    for (const auto& k : kParams) {
      INFO("step " << s << " param " << k);
      // Same fp32 operations in the same order as torch: agreement to a few ulps.
      CHECK(rel_error(run.params[k], step_slice(g.get("adamw", "params." + k), s)) <= 1e-6);
    }
  }
  for (const auto& k : kParams) {
    INFO("param " << k);
    const auto& st = run.opt->state(k);
    CHECK(st.step == int64_t(lr_factor.size()));
    CHECK(rel_error(st.exp_avg, g.get("adamw", "exp_avg." + k)) <= 1e-6);
    CHECK(rel_error(st.exp_avg_sq, g.get("adamw", "exp_avg_sq." + k)) <= 1e-6);
  }
}

// bf16 parameters: the update goes to the fp32 master, so with fp32 gradients the master follows
// the fp32 golden to fp32 accuracy (the initial values are bf16-representable), and the bf16
// parameter is the master rounded to nearest-even: at most half an ulp of an 8-bit significand,
// 2^-8 = 3.9e-3 relative, checked as max-norm rel error <= 4e-3. With bf16 gradients (each
// rounded by <= 2^-8 relative) Adam's normalized update m / sqrt(v) changes by about that
// fraction of an update of size ~lr; over 10 steps the masters agree to 2e-4 (measured 2e-5).
TEST_CASE("optim golden: AdamW on bf16 parameters with an fp32 master", "[golden]") {
  Golden g("optim");
  auto lr_factor = g.get("adamw", "lr_factor").to_doubles();
  const int64_t last = int64_t(lr_factor.size()) - 1;
  for (DType grad_dtype : {DType::f32, DType::bf16}) {
    INFO("grad dtype " << dtype_name(grad_dtype));
    AdamWRun run = make_run(g, DType::bf16);
    for (int64_t s = 0; s <= last; s++) {
      for (const auto& k : kParams)
        run.params[k].set_grad(step_slice(g.get("adamw", "grads." + k), s).to(grad_dtype));
      run.opt->step(lr_factor[size_t(s)]);
    }
    for (const auto& k : kParams) {
      INFO("param " << k);
      Tensor expected = step_slice(g.get("adamw", "params." + k), last);
      const Tensor& master = run.opt->state(k).master;
      REQUIRE(master.dtype() == DType::f32);
      CHECK(rel_error(master, expected) <= (grad_dtype == DType::f32 ? 1e-6 : 2e-4));
      CHECK(rel_error(run.params[k], expected) <= 4e-3);
      CHECK(run.params[k].to_doubles() == master.to(DType::bf16).to_doubles());
    }
  }
}

TEST_CASE("optim golden: clip_grad_norm matches torch.nn.utils.clip_grad_norm_", "[golden]") {
  Golden g("optim");
  for (const char* c : {"clip", "clip_noop"}) {
    INFO("case " << c);
    std::vector<Tensor> params;
    for (int i = 0; i < 3; i++) {
      Tensor gin = g.get(c, "grads_in." + std::to_string(i));
      Tensor p = Tensor::zeros(gin.shape()).set_requires_grad(true);
      p.set_grad(gin);
      params.push_back(p);
    }
    const double max_norm = g.get(c, "max_norm").item();
    const double total = optim::clip_grad_norm(params, max_norm);
    const double expected = g.get(c, "total_norm").item();
    // Ours accumulates in double, torch in fp32: agreement to fp32 rounding.
    CHECK(std::abs(total - expected) <= 1e-6 * expected);
    for (int i = 0; i < 3; i++)
      CHECK(rel_error(params[size_t(i)].grad(), g.get(c, "grads_out." + std::to_string(i))) <=
            1e-6);
  }
}

// bf16 gradients: each element carries <= 2^-8 relative rounding, so the norm and the clipped
// gradients (relative to the fp32 golden) agree to 4e-3.
TEST_CASE("optim golden: clip_grad_norm on bf16 gradients", "[golden]") {
  Golden g("optim");
  std::vector<Tensor> params;
  for (int i = 0; i < 3; i++) {
    Tensor gin = g.get("clip", "grads_in." + std::to_string(i)).to(DType::bf16);
    Tensor p = Tensor::zeros(gin.shape(), DType::bf16).set_requires_grad(true);
    p.set_grad(gin);
    params.push_back(p);
  }
  const double expected = g.get("clip", "total_norm").item();
  const double total = optim::clip_grad_norm(params, g.get("clip", "max_norm").item());
  CHECK(std::abs(total - expected) <= 4e-3 * expected);
  for (int i = 0; i < 3; i++)
    CHECK(rel_error(params[size_t(i)].grad(), g.get("clip", "grads_out." + std::to_string(i))) <=
          4e-3);
}
