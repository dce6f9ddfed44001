// CUDA cross-entropy (forward, backward, ignore_index, mean/sum), global gradient norm and AdamW,
// each against the CPU implementation on the same inputs. Tolerances (relative, max-norm):
//   cross-entropy loss: 1e-5 for f32 and bf16 logits (fp32 arithmetic on identical inputs);
//   dlogits: 1e-5 f32, 1e-2 bf16 (one rounding to bf16, a one-ulp flip allowed);
//   grad norm: 1e-12 (fp64 partials, another block order);
//   AdamW: bit-identical (the same fp32 operations in the same order, no FMA contraction).
// Skips (exit 77) with the device query text when there is no CUDA device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "src/core/ops.h"
#include "src/optim/adamw.h"
#include "src/optim/grad_clip.h"
#include "tests/error_of.h"
#include "tests/gpu_testing.h"
#include "tests/gradcheck.h"
#include "tests/skip.h"

using namespace vlm;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::same_bits;

namespace {

// Labels in [0, vocab) with every `ignore_every`-th row set to ignore_index (0: none ignored).
Tensor make_labels(Rng& rng, int64_t rows, int64_t vocab, int64_t ignore_every, DType dt) {
  std::vector<int64_t> l(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; r++)
    l[size_t(r)] = ignore_every > 0 && r % ignore_every == 1 ? -100 : rng.randint(0, vocab);
  return Tensor::from_vector(l, {rows}).to(dt);
}

void compare_ce(DType dt, DType label_dt, int64_t rows, int64_t vocab, int64_t ignore_every,
                Reduction red, uint64_t seed, bool with_inf = false) {
  INFO(dtype_name(dt) << " labels " << dtype_name(label_dt) << " rows " << rows << " vocab "
                      << vocab << " ignore_every " << ignore_every << " sum "
                      << (red == Reduction::sum));
  Rng rng(seed);
  Tensor logits = Tensor::randn({rows, vocab}, rng, dt, 3.0);
  if (with_inf) { // a masked vocabulary slice: -inf logits that are never labels
    Tensor l32 = logits.to(DType::f32);
    for (int64_t r = 0; r < rows; r++) l32.data<float>()[r * vocab + vocab - 1] = -INFINITY;
    logits = l32.to(dt);
  }
  Tensor labels = make_labels(rng, rows, with_inf ? vocab - 1 : vocab, ignore_every, label_dt);
  Tensor lc = testing::leaf(logits), lg = testing::leaf(gpu(logits));
  Tensor loss_c = cross_entropy(lc, labels, -100, red);
  Tensor loss_g = cross_entropy(lg, gpu(labels), -100, red);
  CHECK(loss_g.device() == kGpu);
  CHECK(loss_g.dtype() == DType::f32);
  CHECK(std::abs(loss_g.item() - loss_c.item()) <= 1e-5 * std::max(1e-30, std::abs(loss_c.item())));
  loss_c.backward(Tensor::full({}, 0.7));
  loss_g.backward(gpu(Tensor::full({}, 0.7)));
  CHECK(rel_err(lg.grad(), lc.grad()) <= (dt == DType::bf16 ? 1e-2 : 1e-5));
}

} // namespace

TEST_CASE("gpu cross_entropy: loss and dlogits match the CPU op", "[gpu]") {
  require_device();
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16})
    for (DType lt : {DType::i32, DType::i64}) {
      compare_ce(dt, lt, 1, 1, 0, Reduction::mean, seed++);
      compare_ce(dt, lt, 37, 7, 5, Reduction::mean, seed++);
      compare_ce(dt, lt, 130, 1000, 3, Reduction::sum, seed++);
      compare_ce(dt, lt, 20, 50001, 4, Reduction::mean, seed++); // vocab not a block multiple
      compare_ce(dt, lt, 70000, 33, 7, Reduction::mean, seed++); // rows > 65535
      compare_ce(dt, lt, 64, 513, 0, Reduction::sum, seed++, /*with_inf=*/true);
    }
}

TEST_CASE("gpu cross_entropy: all rows ignored gives 0 and zero gradients, bad labels throw",
          "[gpu]") {
  require_device();
  Rng rng(7);
  Tensor logits = testing::leaf(gpu(Tensor::randn({4, 9}, rng)));
  Tensor labels = gpu(Tensor::full({4}, -100, DType::i64));
  Tensor loss = cross_entropy(logits, labels);
  CHECK(loss.item() == 0.0);
  loss.backward(gpu(Tensor::full({}, 1.0)));
  CHECK(logits.grad().to_doubles() == std::vector<double>(36, 0.0));

  CrossEntropyResult r = cross_entropy_sum(gpu(Tensor::randn({6, 9}, rng)),
                                           gpu(make_labels(rng, 6, 9, 2, DType::i32)));
  CHECK(r.num_valid.item() == 3);

  // The label check is deferred to the next synchronization (here the item()).
  Tensor bad = gpu(Tensor::from_vector(std::vector<int32_t>{1, 9, 2, -100}, {4}));
  CHECK_THAT(testing::error_of([&] { cross_entropy(logits.detach(), bad).item(); }),
             Catch::Contains("label 9 at row 1"));
  CHECK_THAT(
      testing::error_of([&] {
        cross_entropy(gpu(Tensor::zeros({2, 3}, DType::f64)), gpu(Tensor::zeros({2}, DType::i64)));
      }),
      Catch::Contains("f64 runs on CPU only"));
}

TEST_CASE("gpu grad norm: many tensors of mixed sizes and dtypes match the CPU sum", "[gpu]") {
  require_device();
  Rng rng(11);
  std::vector<Tensor> cpu_params, gpu_params;
  const int64_t sizes[] = {1, 7, 16384, 16385, 100000, 3 * 16384 + 5, 33};
  int i = 0;
  for (int64_t n : sizes) {
    DType dt = i++ % 2 ? DType::bf16 : DType::f32;
    Tensor g = Tensor::randn({n}, rng, dt);
    Tensor pc = Tensor::zeros({n}, dt).set_requires_grad(true);
    Tensor pg = gpu(Tensor::zeros({n}, dt)).set_requires_grad(true);
    pc.set_grad(g);
    pg.set_grad(gpu(g));
    cpu_params.push_back(pc);
    gpu_params.push_back(pg);
  }
  gpu_params.push_back(gpu(Tensor::zeros({3})).set_requires_grad(true)); // no grad: skipped
  const double want = optim::grad_norm_squared(cpu_params);
  const double got = optim::grad_norm_squared(gpu_params);
  CHECK(std::abs(got - want) <= 1e-12 * want);
  CHECK(optim::grad_norm_squared(gpu_params) == got); // deterministic
}

TEST_CASE("gpu adamw: multi-tensor update of mixed dtypes and groups matches the CPU bit for bit",
          "[gpu]") {
  require_device();
  Rng rng(21);
  struct Spec {
    const char* name;
    int64_t n;
    DType param, grad;
    int group;
  };
  // Sizes around the 32768-element chunk of the multi-tensor kernel; two groups with their own
  // LR scale and weight decay; "frozen" never gets a gradient (skipped, as on CPU).
  const Spec specs[] = {
      {"a", 100003, DType::f32, DType::f32, 0}, {"b", 32768, DType::bf16, DType::bf16, 0},
      {"c", 32769, DType::bf16, DType::f32, 1}, {"d", 1, DType::f32, DType::f32, 1},
      {"e", 77, DType::bf16, DType::bf16, 1},   {"frozen", 5, DType::f32, DType::f32, 0}};
  std::vector<Tensor> pc, pg;
  optim::ParamGroup gc[2] = {{"decay", {}, 1.0, 0.1}, {"other", {}, 0.5, 0.0}};
  optim::ParamGroup gg[2] = {{"decay", {}, 1.0, 0.1}, {"other", {}, 0.5, 0.0}};
  for (const Spec& s : specs) {
    Tensor init = Tensor::randn({s.n}, rng, s.param);
    pc.push_back(init.clone().set_requires_grad(true).set_name(s.name));
    pg.push_back(gpu(init).set_requires_grad(true).set_name(s.name));
    gc[s.group].params.push_back(pc.back());
    gg[s.group].params.push_back(pg.back());
  }
  optim::AdamW oc({gc[0], gc[1]}), og({gg[0], gg[1]});
  for (int step = 0; step < 4; step++) {
    for (size_t k = 0; k < pc.size(); k++) {
      if (std::string(specs[k].name) == "frozen") continue;
      if (step == 2 && k == 3) { // "d" skips a step: its own bias-correction count
        pc[k].zero_grad();
        pg[k].zero_grad();
        continue;
      }
      Tensor g = Tensor::randn({specs[k].n}, rng, specs[k].grad, step == 0 ? 1.0 : 1e-3);
      pc[k].set_grad(g);
      pg[k].set_grad(gpu(g));
    }
    oc.step(1e-3 * (step + 1));
    og.step(1e-3 * (step + 1));
  }
  for (size_t k = 0; k < pc.size(); k++) {
    INFO("param " << specs[k].name);
    CHECK(same_bits(pg[k], pc[k]));
    const optim::AdamWState& sc = oc.state(specs[k].name);
    const optim::AdamWState& sg = og.state(specs[k].name);
    CHECK(sg.step == sc.step);
    CHECK(sg.exp_avg.device() == kGpu);
    CHECK(same_bits(sg.exp_avg, sc.exp_avg));
    CHECK(same_bits(sg.exp_avg_sq, sc.exp_avg_sq));
    if (specs[k].param == DType::bf16) CHECK(same_bits(sg.master, sc.master));
  }
  // refresh_master copies overwritten bf16 values into the device master (new values: the old
  // masters already agree, so only a real copy makes them equal to these).
  Tensor fresh = Tensor::randn({specs[1].n}, rng, DType::bf16, 3.0);
  {
    NoGradGuard no_grad;
    copy_(pc[1], fresh);
    copy_(pg[1], fresh);
  }
  og.refresh_master();
  oc.refresh_master();
  CHECK(same_bits(og.state("b").master, fresh.to(DType::f32)));
  CHECK(same_bits(oc.state("b").master, fresh.to(DType::f32)));
}

TEST_CASE("gpu linear_cross_entropy: chunked LM head + loss matches the CPU op", "[gpu]") {
  require_device();
  // f32: 1e-5 (cuBLASLt's fp32 GEMM, no TF32, vs OpenBLAS); bf16: 1e-2 (logits and gradients
  // rounded to bf16 once on both sides).
  struct Case {
    int64_t n, h, v, chunk;
  };
  const Case cases[] = {{37, 64, 1000, 256}, {130, 72, 5003, 1024}, {8, 16, 33, 4096}};
  uint64_t seed = 91;
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " N " << c.n << " H " << c.h << " V " << c.v << " chunk " << c.chunk);
      Rng rng(seed++);
      Tensor x = Tensor::randn({c.n, c.h}, rng, dt);
      Tensor w = Tensor::randn({c.v, c.h}, rng, dt, 0.2);
      Tensor labels = make_labels(rng, c.n, c.v, 4, DType::i64);
      Tensor xc = testing::leaf(x), wc = testing::leaf(w);
      Tensor xg = testing::leaf(gpu(x)), wg = testing::leaf(gpu(w));
      Tensor lc = linear_cross_entropy(xc, wc, labels, -100, Reduction::mean, c.chunk);
      Tensor lg = linear_cross_entropy(xg, wg, gpu(labels), -100, Reduction::mean, c.chunk);
      CHECK(lg.device() == kGpu);
      const double tol = dt == DType::bf16 ? 1e-2 : 1e-5;
      CHECK(std::abs(lg.item() - lc.item()) <= tol * std::abs(lc.item()));
      lc.backward(Tensor::full({}, 1.3));
      lg.backward(gpu(Tensor::full({}, 1.3)));
      CHECK(rel_err(xg.grad(), xc.grad()) <= tol);
      CHECK(rel_err(wg.grad(), wc.grad()) <= tol);
    }
}
