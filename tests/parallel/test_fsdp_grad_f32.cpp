// FSDP's gradient path for bf16 parameters (issue 34): the weight gradients of a bf16 unit reach
// its f32 gradient buffers straight from the GEMM (the gather node's accept_direct_grad,
// autograd's accumulate_weight_grad), never rounded to bf16 first — as an unsharded bf16
// parameter's reach its f32 .grad (tests/core/test_grad_accumulation_f32.cpp). Run here in one
// process: one rank, and 2 or 4 ranks through the stand-in group (parallel/comm/local_group.h),
// whose reduce-scatter gives ranks x this rank's block (exact: a power of two), so every rank's
// shard of the reduced gradient, divided by the ranks, is the whole gradient's rows.
//
// Errors are max-norm relative errors against the f64 sums of the same bf16 values over two
// micro-steps. Measured (x86-64, OpenBLAS), f32 reduce, worst over every layout (1, 2, 4 ranks;
// reduced every micro-step or on the last only; activation checkpointing off, full, selective): a
// Linear weight used twice straight from the GEMM and once through the graph 4.7e-7 (its bias
// 3.6e-8), a tied embedding + head 2.4e-7; a tied lm_head through linear_cross_entropy differs from
// the unsharded f32 .grad by 1.0e-7. Before (each micro-step's gradient rounded to bf16 on the
// gather node's route): 4.0e-3, 2.0e-3, 3.0e-3 and 2.6e-3. The bounds are 1e-5 (1e-6 against the
// unsharded .grad), and rounding each micro-step's f64 gradient to bf16 must exceed 1e-4.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/ac/activation_checkpointing.h"
#include "parallel/comm/local_group.h"
#include "parallel/fsdp/fsdp.h"
#include "parallel/parallelize.h"
#include "src/core/ops.h"
#include "src/nn/module.h"

using namespace vlm;

namespace {

constexpr int64_t kRows = 2048, kIn = 24,
                  kOut = 18; // 18 rows: 4 ranks hold 5, 5, 5 and 3 + 2 padding
constexpr int kMicroSteps = 2;

double bf16_round(double v) { return double(float(bf16(float(v)))); }

// max |got - want| / max |want|
double rel(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

// A frozen bf16 projection kIn -> kIn: no gradient, never sharded.
class FrozenBlock final : public nn::Module {
public:
  explicit FrozenBlock(Tensor w) {
    register_parameter("weight", std::move(w));
    set_requires_grad(false);
  }
  Tensor forward(const Tensor& x) const {
    return call(
        [this](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{linear(in[0], param("weight"))};
        },
        {x})[0];
  }
};

// {linear(h, W, b), linear(h, W), 0.5 W}: W reaches the loss twice straight from a GEMM (both
// writes into one slot of the unit's buffer in one pass) and once through the graph.
class ProjBlock final : public nn::Module {
public:
  ProjBlock(Tensor w, Tensor b) {
    register_parameter("weight", std::move(w));
    register_parameter("bias", std::move(b));
  }
  std::vector<Tensor> forward(const Tensor& h) const {
    return call(
        [this](const std::vector<Tensor>& in) {
          const Tensor& w = param("weight");
          return std::vector<Tensor>{linear(in[0], w, param("bias")), linear(in[0], w),
                                     scale(w, 0.5)};
        },
        {h});
  }
};

class LinearModel final : public nn::Module {
public:
  explicit LinearModel(uint64_t seed) {
    Rng rng(seed);
    layers_ = register_module("layers", std::make_shared<nn::ModuleList>());
    frozen_ = layers_->append(std::make_shared<FrozenBlock>(
        Tensor::randn({kIn, kIn}, rng, DType::bf16, 1.0 / std::sqrt(double(kIn)))));
    proj_ = layers_->append(std::make_shared<ProjBlock>(
        Tensor::randn({kOut, kIn}, rng, DType::bf16), Tensor::randn({kOut}, rng, DType::bf16)));
  }
  std::vector<nn::Module*> blocks() const { return {frozen_.get(), proj_.get()}; }
  std::vector<Tensor> forward(const Tensor& x) const { return proj_->forward(frozen_->forward(x)); }

private:
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<FrozenBlock> frozen_;
  std::shared_ptr<ProjBlock> proj_;
};

// A tied table: the embedding lookup and the head read one tensor, registered twice.
class Head final : public nn::Module {
public:
  explicit Head(const Tensor& tied) { register_parameter("weight", tied); }
};
class TiedModel final : public nn::Module {
public:
  explicit TiedModel(uint64_t seed) {
    Rng rng(seed);
    const Tensor& table = register_parameter("embed", Tensor::randn({kOut, kIn}, rng, DType::bf16));
    head_ = register_module("head", std::make_shared<Head>(table));
  }
  const Tensor& table() const { return param("embed"); }
  const Tensor& head() const { return head_->param("weight"); }

private:
  std::shared_ptr<Head> head_;
};

struct Layout {
  int ranks;
  bool reduce_every_micro_step;
  parallel::AcMode ac;
  std::string str() const {
    return detail::str_cat(ranks, " rank(s), reduce ",
                           reduce_every_micro_step ? "every micro-step" : "on the last", ", AC ",
                           parallel::ac_mode_name(ac));
  }
};

std::vector<Layout> layouts(bool with_ac) {
  std::vector<Layout> out;
  for (int ranks : {1, 2, 4})
    for (bool every : {true, false})
      for (auto ac : {parallel::AcMode::off, parallel::AcMode::full, parallel::AcMode::selective})
        if (with_ac || ac == parallel::AcMode::off) out.push_back({ranks, every, ac});
  return out;
}

// The whole gradient [rows, row] from every rank's shard of it (shard(r): rank r's reduced
// gradient, ranks x its rows); padding rows must be zero.
std::vector<double> assemble(int ranks, int64_t rows, int64_t row,
                             const std::function<std::vector<double>(int)>& shard) {
  const int64_t shard_rows = (rows + ranks - 1) / ranks;
  std::vector<double> whole(size_t(rows * row), 0.0);
  for (int r = 0; r < ranks; r++) {
    const std::vector<double> g = shard(r);
    REQUIRE(int64_t(g.size()) == shard_rows * row);
    const int64_t lo = std::min(rows, r * shard_rows), n = std::min(rows, lo + shard_rows) - lo;
    for (int64_t i = 0; i < n * row; i++) whole[size_t(lo * row + i)] = g[size_t(i)] / ranks;
    for (int64_t i = n * row; i < int64_t(g.size()); i++) CHECK(g[size_t(i)] == 0.0);
  }
  return whole;
}

// Two micro-steps' inputs and upstream gradients, bf16.
struct LinearData {
  std::vector<Tensor> x, g1, g2;
};
LinearData linear_data() {
  Rng rng(34);
  LinearData d;
  for (int m = 0; m < kMicroSteps; m++) {
    d.x.push_back(Tensor::randn({kRows, kIn}, rng, DType::bf16));
    d.g1.push_back(Tensor::randn({kRows, kOut}, rng, DType::bf16));
    d.g2.push_back(Tensor::randn({kRows, kOut}, rng, DType::bf16));
  }
  return d;
}

// The gradients one rank's shards get from kMicroSteps micro-steps of LinearModel under FSDP.
struct LinearShardGrads {
  std::vector<double> w, b;
};
LinearShardGrads run_linear(const LinearData& d, const Layout& l, int rank, DType reduce_dtype) {
  LinearModel model(7);
  parallel::LocalProcessGroup group(rank, l.ranks);
  parallel::ParallelizeOptions o{l.ac, {}};
  o.fsdp.reduce_every_micro_step = l.reduce_every_micro_step;
  o.fsdp.reduce_dtype = reduce_dtype;
  const parallel::Parallelized parallelized =
      parallel::parallelize(model, model.blocks(), {&group, nullptr, nullptr}, o, Device::cpu());
  parallel::Fsdp& fsdp = *parallelized.fsdp();
  const Tensor half = Tensor::ones({kOut, kIn}, DType::bf16);
  for (int m = 0; m < kMicroSteps; m++) {
    fsdp.begin_micro_step(m == 0, m + 1 == kMicroSteps);
    const std::vector<Tensor> y = model.forward(d.x[size_t(m)]);
    run_backward(y, {d.g1[size_t(m)], d.g2[size_t(m)], half});
    fsdp.end_micro_step();
  }
  // Frozen: whole, no gradient.
  const Tensor frozen = model.find_parameter("layers.0.weight");
  CHECK(frozen.shape() == Shape{kIn, kIn});
  CHECK(!frozen.grad().defined());
  const Tensor w = model.find_parameter("layers.1.weight"),
               b = model.find_parameter("layers.1.bias");
  REQUIRE(w.grad().dtype() == DType::f32);
  return {w.grad().to_doubles(), b.grad().to_doubles()};
}

// f64 per micro-step: the weight gradient (g1 + g2)^T h + 0.5 and the bias gradient (column sums
// of g1), from the bf16 values of h = the frozen block's output.
struct LinearReference {
  std::vector<std::vector<double>> w, b; // [micro-step]
};
LinearReference linear_reference(const LinearData& d) {
  LinearModel model(7);
  LinearReference ref;
  NoGradGuard no_grad;
  for (int m = 0; m < kMicroSteps; m++) {
    const auto h = linear(d.x[size_t(m)], model.find_parameter("layers.0.weight")).to_doubles();
    const auto g1 = d.g1[size_t(m)].to_doubles(), g2 = d.g2[size_t(m)].to_doubles();
    std::vector<double> w(size_t(kOut * kIn), 0.5), b(size_t(kOut), 0.0);
    for (int64_t r = 0; r < kRows; r++)
      for (int64_t o = 0; o < kOut; o++) {
        const double gg = g1[size_t(r * kOut + o)] + g2[size_t(r * kOut + o)];
        b[size_t(o)] += g1[size_t(r * kOut + o)];
        for (int64_t i = 0; i < kIn; i++) w[size_t(o * kIn + i)] += gg * h[size_t(r * kIn + i)];
      }
    ref.w.push_back(w);
    ref.b.push_back(b);
  }
  return ref;
}

std::vector<double> total(const std::vector<std::vector<double>>& per_step, bool round_each) {
  std::vector<double> s(per_step[0].size(), 0.0);
  for (const auto& v : per_step)
    for (size_t i = 0; i < v.size(); i++) s[i] += round_each ? bf16_round(v[i]) : v[i];
  return s;
}

} // namespace

TEST_CASE("fsdp grad f32: a bf16 Linear's weight and bias gradients reach the f32 gradient "
          "shards unrounded, in every layout",
          "[parallel]") {
  const LinearData d = linear_data();
  const LinearReference ref = linear_reference(d);
  const auto want_w = total(ref.w, false), want_b = total(ref.b, false);
  // What rounding each micro-step's gradient to bf16 gives: the route before issue 34's FSDP part.
  const double bf16_w = rel(total(ref.w, true), want_w), bf16_b = rel(total(ref.b, true), want_b);
  CHECK(bf16_w > 1e-4); // the inputs make a bf16 rounding visible
  CHECK(bf16_b > 1e-4);
  double worst_w = 0, worst_b = 0;
  for (const Layout& l : layouts(true)) {
    INFO(l.str());
    std::vector<LinearShardGrads> shards;
    for (int r = 0; r < l.ranks; r++) shards.push_back(run_linear(d, l, r, DType::f32));
    const auto w = assemble(l.ranks, kOut, kIn, [&](int r) { return shards[size_t(r)].w; });
    const auto b = assemble(l.ranks, kOut, 1, [&](int r) { return shards[size_t(r)].b; });
    const double err_w = rel(w, want_w), err_b = rel(b, want_b);
    INFO("weight " << err_w << " (bf16 per micro-step " << bf16_w << "), bias " << err_b
                   << " (bf16 per micro-step " << bf16_b << ")");
    CHECK(err_w < 1e-5);
    CHECK(err_b < 1e-5);
    worst_w = std::max(worst_w, err_w);
    worst_b = std::max(worst_b, err_b);
  }
  std::printf("fsdp grad f32, Linear: worst weight error %.2e, bias %.2e over every layout "
              "(bf16 per micro-step: %.2e, %.2e)\n",
              worst_w, worst_b, bf16_w, bf16_b);
  CHECK(worst_w < bf16_w / 100);
  CHECK(worst_b < bf16_b / 100);
}

TEST_CASE("fsdp grad f32: with a bf16 reduce dtype the fp32 gradient is rounded once per "
          "reduction",
          "[parallel]") {
  // Reduced every micro-step, each micro-step's fp32 gradient is rounded to bf16 once (the
  // collective's dtype); reduced on the last micro-step only, their fp32 sum is. Any other
  // rounding (a GEMM output in bf16, a bf16 sum of the two uses of W) moves elements off those
  // values: measured before, 275 (every micro-step) and 221 (last only) of the weight's 432
  // elements differed; now none (the fp32 sums and the f64 ones round alike here).
  const LinearData d = linear_data();
  const LinearReference ref = linear_reference(d);
  for (bool every : {true, false}) {
    std::vector<double> want(size_t(kOut * kIn), 0.0);
    if (every)
      want = total(ref.w, true);
    else
      for (size_t i = 0; i < want.size(); i++) want[i] = bf16_round(total(ref.w, false)[i]);
    for (int ranks : {1, 2, 4}) {
      const Layout l{ranks, every, parallel::AcMode::off};
      INFO(l.str());
      std::vector<LinearShardGrads> shards;
      for (int r = 0; r < ranks; r++) shards.push_back(run_linear(d, l, r, DType::bf16));
      const auto w = assemble(ranks, kOut, kIn, [&](int r) { return shards[size_t(r)].w; });
      int64_t differ = 0;
      for (size_t i = 0; i < w.size(); i++) differ += w[i] != want[i];
      if (ranks == 1) {
        // One rank reduces nothing: the f32 gradient as with an f32 reduce dtype.
        CHECK(rel(w, total(ref.w, false)) < 1e-5);
        continue;
      }
      std::printf("fsdp grad f32, bf16 reduce (%s): %lld of %lld weight elements off the "
                  "once-rounded value\n",
                  l.str().c_str(), static_cast<long long>(differ),
                  static_cast<long long>(w.size()));
      CHECK(differ <= int64_t(w.size()) / 100);
      CHECK(rel(w, want) <= 1.0 / 128); // and none by more than about one rounding
    }
  }
}

TEST_CASE("fsdp grad f32: a tied table gets the embedding's and the head's gradients summed in "
          "fp32 in one slot",
          "[parallel]") {
  // The root unit's one parameter is read twice in one pass: by embedding() (rows of repeated ids
  // summed into the slot) and by a linear head (a GEMM into the slot): the second write must add.
  Rng rng(36);
  constexpr int64_t N = 4096;
  std::vector<Tensor> ids, up, x, g;
  for (int m = 0; m < kMicroSteps; m++) {
    std::vector<int64_t> v(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; i++) v[size_t(i)] = rng.randint(0, kOut);
    ids.push_back(Tensor::from_vector(v, {N}));
    up.push_back(Tensor::randn({N, kIn}, rng, DType::bf16));
    x.push_back(Tensor::randn({N, kIn}, rng, DType::bf16));
    g.push_back(Tensor::randn({N, kOut}, rng, DType::bf16));
  }
  std::vector<std::vector<double>> per_step;
  for (int m = 0; m < kMicroSteps; m++) {
    const auto idv = ids[size_t(m)].to_doubles(), uv = up[size_t(m)].to_doubles(),
               xv = x[size_t(m)].to_doubles(), gv = g[size_t(m)].to_doubles();
    std::vector<double> want(size_t(kOut * kIn), 0.0);
    for (int64_t r = 0; r < N; r++)
      for (int64_t i = 0; i < kIn; i++) {
        want[size_t(int64_t(idv[size_t(r)]) * kIn + i)] += uv[size_t(r * kIn + i)];
        for (int64_t o = 0; o < kOut; o++)
          want[size_t(o * kIn + i)] += gv[size_t(r * kOut + o)] * xv[size_t(r * kIn + i)];
      }
    per_step.push_back(want);
  }
  const auto want = total(per_step, false);
  const double bf16_err = rel(total(per_step, true), want);
  CHECK(bf16_err > 1e-4);
  double worst = 0;
  for (const Layout& l : layouts(false)) {
    INFO(l.str());
    const auto got = assemble(l.ranks, kOut, kIn, [&](int r) {
      TiedModel model(3);
      parallel::LocalProcessGroup group(r, l.ranks);
      parallel::FsdpOptions o;
      o.reduce_every_micro_step = l.reduce_every_micro_step;
      parallel::Fsdp fsdp(model, {}, group, nullptr, o, Device::cpu());
      for (int m = 0; m < kMicroSteps; m++) {
        fsdp.begin_micro_step(m == 0, m + 1 == kMicroSteps);
        REQUIRE(model.head().same(model.table())); // tied: the one whole tensor in both slots
        run_backward({embedding(model.table(), ids[size_t(m)]), linear(x[size_t(m)], model.head())},
                     {up[size_t(m)], g[size_t(m)]});
        fsdp.end_micro_step();
      }
      REQUIRE(model.table().grad().dtype() == DType::f32);
      return model.table().grad().to_doubles();
    });
    const double err = rel(got, want);
    INFO("error " << err << ", bf16 per micro-step " << bf16_err);
    CHECK(err < 1e-5);
    worst = std::max(worst, err);
  }
  std::printf("fsdp grad f32, tied embedding + head: worst error %.2e (bf16 per micro-step "
              "%.2e)\n",
              worst, bf16_err);
  CHECK(worst < bf16_err / 100);
}

TEST_CASE("fsdp grad f32: a tied lm_head through linear_cross_entropy gets what an unsharded "
          "parameter's f32 .grad gets",
          "[parallel]") {
  // The same forward and backward on an unsharded bf16 leaf with an f32 grad_dtype (written
  // straight from the GEMMs, tests/core/test_grad_accumulation_f32.cpp) and under FSDP: the same
  // fp32 sums, in the same order up to the reduction's exact scaling by the ranks. The stand-in
  // group's all-gather repeats this rank's shard, so with more than one rank the unsharded run
  // gets the table each rank's forward saw (its shard repeated) and is compared on its rows.
  Rng rng(37);
  constexpr int64_t N = 1024;
  std::vector<Tensor> ids, x, labels;
  for (int m = 0; m < kMicroSteps; m++) {
    std::vector<int64_t> v(static_cast<size_t>(N)), t(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; i++) {
      v[size_t(i)] = rng.randint(0, kOut);
      t[size_t(i)] = rng.uniform() < 0.1 ? -100 : rng.randint(0, kOut);
    }
    ids.push_back(Tensor::from_vector(v, {N}));
    labels.push_back(Tensor::from_vector(t, {N}));
    x.push_back(Tensor::randn({N, kIn}, rng, DType::bf16));
  }
  auto loss = [&](const TiedModel& model, int m) {
    // The table's rows feed the head through x + embedding: both uses reach the table.
    const Tensor h = add(x[size_t(m)], embedding(model.table(), ids[size_t(m)]));
    return linear_cross_entropy(h, model.head(), labels[size_t(m)], -100, Reduction::sum, 8);
  };
  // The unsharded gradient with the table rank r of `ranks` sees: its rows (and zero padding)
  // in every rank's place.
  auto unsharded = [&](int r, int ranks) {
    TiedModel plain(5);
    Tensor leaf = plain.table();
    const int64_t shard_rows = (kOut + ranks - 1) / ranks, lo = std::min(kOut, r * shard_rows);
    const int64_t hi = std::min(kOut, lo + shard_rows);
    const std::vector<double> values = leaf.to_doubles();
    std::vector<double> seen(values.size(), 0.0);
    for (int64_t row = 0; row < kOut; row++) {
      const int64_t from = lo + row % shard_rows; // past hi: padding
      for (int64_t i = 0; i < kIn; i++)
        seen[size_t(row * kIn + i)] = from < hi ? values[size_t(from * kIn + i)] : 0.0;
    }
    {
      NoGradGuard no_grad;
      copy_(leaf, Tensor::from_vector(seen, {kOut, kIn}));
    }
    leaf.set_grad_dtype(DType::f32);
    for (int m = 0; m < kMicroSteps; m++) loss(plain, m).backward();
    REQUIRE(leaf.grad().dtype() == DType::f32);
    return leaf.grad().to_doubles();
  };
  double worst = 0;
  for (const Layout& l : layouts(false)) {
    INFO(l.str());
    std::vector<double> want(size_t(kOut * kIn), 0.0);
    const auto got = assemble(l.ranks, kOut, kIn, [&](int r) {
      const std::vector<double> mine = unsharded(r, l.ranks);
      const int64_t shard_rows = (kOut + l.ranks - 1) / l.ranks;
      const int64_t lo = std::min(kOut, r * shard_rows), hi = std::min(kOut, lo + shard_rows);
      std::copy(mine.begin() + lo * kIn, mine.begin() + hi * kIn, want.begin() + lo * kIn);
      TiedModel model(5);
      parallel::LocalProcessGroup group(r, l.ranks);
      parallel::FsdpOptions o;
      o.reduce_every_micro_step = l.reduce_every_micro_step;
      parallel::Fsdp fsdp(model, {}, group, nullptr, o, Device::cpu());
      for (int m = 0; m < kMicroSteps; m++) {
        fsdp.begin_micro_step(m == 0, m + 1 == kMicroSteps);
        loss(model, m).backward();
        fsdp.end_micro_step();
      }
      return model.table().grad().to_doubles();
    });
    const double err = rel(got, want);
    INFO("FSDP vs the unsharded f32 .grad: " << err);
    CHECK(err <= 1e-6);
    worst = std::max(worst, err);
  }
  std::printf("fsdp grad f32, tied lm_head (linear_cross_entropy): worst difference from the "
              "unsharded f32 .grad %.2e\n",
              worst);
}
