// gated_delta_rule in f32 and bf16 against the same op in f64 (forward and every input gradient,
// on inputs rounded to the low precision first, so only the arithmetic differs), and the
// generation path: a document run in two calls (a prefix, then one token per call) carrying the
// state equals one call. Also the ops' error messages (shapes named, a state with gradients).
#include <cmath>
#include <string>
#include <vector>

#include "src/core/ops.h"
#include "tests/error_of.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::error_of;
using vlm::testing::leaf;
using vlm::testing::max_rel_error;

namespace {

Tensor offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return Tensor::from_vector(cu, {int64_t(cu.size())});
}

struct Inputs {
  Tensor q, k, v, g, beta;
  std::vector<Tensor> all() const { return {q, k, v, g, beta}; }
};

// Model-like f64 inputs: q, k L2-normalized per head, g in (-3, 0), beta in (0, 1).
Inputs make_inputs(int64_t T, int64_t HK, int64_t HV, int64_t dk, int64_t dv, uint64_t seed) {
  NoGradGuard no_grad;
  Rng rng(seed);
  Inputs in;
  in.q = l2_normalize(Tensor::randn({T, HK, dk}, rng, DType::f64), 1e-6);
  in.k = l2_normalize(Tensor::randn({T, HK, dk}, rng, DType::f64), 1e-6);
  in.v = Tensor::randn({T, HV, dv}, rng, DType::f64);
  in.g = Tensor::uniform({T, HV}, rng, -3, 0, DType::f64);
  in.beta = Tensor::uniform({T, HV}, rng, 0, 1, DType::f64);
  return in;
}

// The inputs rounded to dt and widened back to f64 (exact in dt).
Inputs rounded(const Inputs& in, DType dt) {
  NoGradGuard no_grad;
  auto r = [&](const Tensor& t) { return t.to(dt).to(DType::f64); };
  return {r(in.q), r(in.k), r(in.v), r(in.g), r(in.beta)};
}

struct Result {
  std::vector<double> out;
  std::vector<std::vector<double>> grads; // q, k, v, g, beta
};

// The op on leaves of dtype dt, backward with the upstream gradient dout (rounded to dt).
Result run(const Inputs& in, DType dt, const Tensor& cu, double scale, const Tensor& dout) {
  std::vector<Tensor> l;
  for (const Tensor& t : in.all()) l.push_back(leaf(t.to(dt)));
  Tensor out = gated_delta_rule(l[0], l[1], l[2], l[3], l[4], cu, scale);
  REQUIRE(out.dtype() == dt);
  run_backward({out}, {dout.to(dt)});
  Result r{out.to_doubles(), {}};
  for (const Tensor& t : l) {
    REQUIRE(t.grad().dtype() == dt);
    r.grads.push_back(t.grad().to_doubles());
  }
  return r;
}

// Rows idx of t ([T, ...]) as a new [idx.size(), ...] tensor of dtype dt.
Tensor rows(const Tensor& t, const std::vector<int64_t>& idx, DType dt) {
  const std::vector<double> all = t.to_doubles();
  const int64_t row = t.numel() / t.size(0);
  std::vector<double> picked;
  for (int64_t i : idx)
    picked.insert(picked.end(), all.begin() + i * row, all.begin() + (i + 1) * row);
  Shape s = t.shape();
  s[0] = int64_t(idx.size());
  return Tensor::from_doubles(picked, s, dt);
}

const char* const kNames[] = {"dq", "dk", "dv", "dg", "dbeta"};

} // namespace

TEST_CASE("gated delta: gated_delta_rule f32 and bf16 against f64", "[compose]") {
  // Documents: 1 token, a partial chunk, exactly one chunk, two chunks (64 + 36), 3 tokens;
  // GVA with 2 value heads per k-head, dk != dv.
  const Tensor cu = offsets({1, 37, 64, 100, 3});
  const int64_t T = 205, HK = 2, HV = 4, dk = 16, dv = 8;
  const double scale = 1.0 / std::sqrt(double(dk));
  const Inputs base = make_inputs(T, HK, HV, dk, dv, 7);
  Rng rng(8);
  const Tensor dout64 = Tensor::randn({T, HV, dv}, rng, DType::f64);
  // Errors relative to the largest element. f32: measured ~2e-7 (chains of float ops through
  // T = (I + A)^-1 over 64-token chunks and the state recurrence), checked at 2e-6. bf16: the
  // inputs are exact in bf16 and the f32 result is rounded to bf16 once (unit roundoff 2^-8 =
  // 3.9e-3 of the element; measured up to 3e-3), checked at 5e-3.
  for (auto [dt, tol] : {std::pair{DType::f32, 2e-6}, std::pair{DType::bf16, 5e-3}}) {
    INFO(dtype_name(dt));
    const Inputs in = rounded(base, dt);
    const Tensor dout = dout64.to(dt).to(DType::f64);
    const Result want = run(in, DType::f64, cu, scale, dout);
    const Result got = run(in, dt, cu, scale, dout);
    CHECK(max_rel_error(got.out, want.out) < tol);
    for (size_t i = 0; i < 5; i++) {
      INFO(kNames[i]);
      CHECK(max_rel_error(got.grads[i], want.grads[i]) < tol);
    }
  }
}

TEST_CASE("gated delta: a prefix call then one token per call, carrying the state, equals one call",
          "[compose]") {
  // Two documents (70 = a chunk and a bit, 9 tokens) run together: a prefix of (40, 5) tokens, then
  // one token of each per call (the second document is empty in the calls after its end).
  const int64_t HK = 1, HV = 2, dk = 8, dv = 4;
  const int32_t len0 = 70, len1 = 9, pre0 = 40, pre1 = 5;
  const Tensor cu = offsets({len0, len1});
  const double scale = 0.3;
  const Inputs in = make_inputs(len0 + len1, HK, HV, dk, dv, 21);
  // The chunked and token-by-token orders of the same arithmetic: measured 1e-15 (f64) and
  // 3e-7 (f32) of the largest element.
  for (auto [dt, tol] : {std::pair{DType::f64, 1e-12}, std::pair{DType::f32, 2e-6}}) {
    INFO(dtype_name(dt));
    NoGradGuard no_grad;
    auto call = [&](const std::vector<int64_t>& idx, const Tensor& cu_call, Tensor* state) {
      return gated_delta_rule(rows(in.q, idx, dt), rows(in.k, idx, dt), rows(in.v, idx, dt),
                              rows(in.g, idx, dt), rows(in.beta, idx, dt), cu_call, scale, state);
    };
    std::vector<int64_t> all_tokens;
    for (int64_t t = 0; t < len0 + len1; t++) all_tokens.push_back(t);
    Tensor full_state;
    const std::vector<double> want = call(all_tokens, cu, &full_state).to_doubles();
    REQUIRE(full_state.shape() == Shape{2, HV, dk, dv});
    REQUIRE(full_state.dtype() == dt);

    // Outputs per token, in the one call's order.
    std::vector<double> got(want.size());
    auto place = [&](const std::vector<int64_t>& idx, const Tensor& out) {
      const std::vector<double> o = out.to_doubles();
      for (size_t r = 0; r < idx.size(); r++)
        std::copy(o.begin() + r * HV * dv, o.begin() + (r + 1) * HV * dv,
                  got.begin() + idx[r] * HV * dv);
    };
    Tensor state; // undefined: zeros
    std::vector<int64_t> idx;
    for (int64_t t = 0; t < pre0; t++) idx.push_back(t);
    for (int64_t t = 0; t < pre1; t++) idx.push_back(len0 + t);
    place(idx, call(idx, offsets({pre0, pre1}), &state));
    for (int32_t s = 0; s < len0 - pre0; s++) {
      const bool second = s < len1 - pre1;
      idx = {pre0 + s};
      if (second) idx.push_back(len0 + pre1 + s);
      place(idx, call(idx, offsets({1, second ? 1 : 0}), &state));
    }
    CHECK(max_rel_error(got, want) < tol);
    CHECK(max_rel_error(state.to_doubles(), full_state.to_doubles()) < tol);

    // An explicit zero initial state is the same as none.
    Tensor zeros = Tensor::zeros({2, HV, dk, dv}, dt);
    CHECK(max_rel_error(call(all_tokens, cu, &zeros).to_doubles(), want) == 0);
  }
}

TEST_CASE("gated delta: bf16 inputs keep an f32 state", "[compose]") {
  NoGradGuard no_grad;
  const Inputs in = make_inputs(6, 1, 1, 4, 3, 5);
  auto b = [](const Tensor& t) { return t.to(DType::bf16); };
  Tensor state;
  Tensor out = gated_delta_rule(b(in.q), b(in.k), b(in.v), b(in.g), b(in.beta), offsets({2, 4}),
                                0.5, &state);
  CHECK(out.dtype() == DType::bf16);
  CHECK(state.dtype() == DType::f32);
  CHECK(state.shape() == Shape{2, 1, 4, 3});
}

TEST_CASE("gated delta: causal_conv1d and softplus in f32 and bf16 against f64", "[compose]") {
  // causal_conv1d: forward and both gradients on inputs exact in the low precision; f32 within a
  // few float roundings (sums of K = 4 products; dw of 40 tokens), bf16 one rounding (2^-8).
  const Tensor cu = offsets({1, 3, 30, 6});
  Rng rng(31);
  const Tensor x64 = Tensor::randn({40, 6}, rng, DType::f64),
               w64 = Tensor::randn({6, 4}, rng, DType::f64);
  const Tensor dy64 = Tensor::randn({40, 6}, rng, DType::f64);
  for (auto [dt, tol] : {std::pair{DType::f32, 1e-6}, std::pair{DType::bf16, 5e-3}}) {
    INFO(dtype_name(dt));
    auto conv = [&](DType run_dt) {
      Tensor x = leaf(x64.to(dt).to(run_dt)), w = leaf(w64.to(dt).to(run_dt));
      Tensor y = causal_conv1d(x, w, cu, true);
      run_backward({y}, {dy64.to(dt).to(run_dt)});
      return std::vector<std::vector<double>>{y.to_doubles(), x.grad().to_doubles(),
                                              w.grad().to_doubles()};
    };
    const auto want = conv(DType::f64), got = conv(dt);
    for (size_t i = 0; i < 3; i++) {
      INFO(i);
      CHECK(max_rel_error(got[i], want[i]) < tol);
    }
  }
  // softplus: both branches (the threshold 20), large negative inputs, in f32 and bf16.
  const std::vector<double> xs = {-40, -20, -3, -0.5, 0, 0.25, 2, 7, 19.9, 20.1, 35};
  const Tensor xs64 = Tensor::from_doubles(xs, {int64_t(xs.size())}, DType::f64);
  for (auto [dt, tol] : {std::pair{DType::f32, 1e-6}, std::pair{DType::bf16, 5e-3}}) {
    INFO(dtype_name(dt));
    const Tensor x = xs64.to(dt);
    const std::vector<double> got = softplus(x).to_doubles(),
                              want = softplus(x.to(DType::f64)).to_doubles();
    for (size_t i = 0; i < xs.size(); i++) {
      INFO("x " << xs[i]);
      CHECK(std::abs(got[i] - want[i]) <= tol * std::abs(want[i]));
    }
  }
}

TEST_CASE("gated delta: errors name the shapes at fault", "[compose]") {
  const Inputs in = make_inputs(5, 1, 2, 4, 3, 9);
  const Tensor cu = offsets({2, 3});
  auto op = [&](const Tensor& q, const Tensor& v, const Tensor& g, const Tensor& c,
                Tensor* state = nullptr) { gated_delta_rule(q, q, v, g, in.beta, c, 0.5, state); };
  CHECK_THAT(error_of([&] {
               op(in.q, in.v, in.g, offsets({2, 2}));
             }),
             Catch::Contains("cu_seqlens[2] = 4") && Catch::Contains("(5, 1, 4)"));
  CHECK_THAT(error_of([&] { op(in.q, in.v, transpose(in.g, 0, 1), cu); }),
             Catch::Contains("g and beta must be [T, HV]") && Catch::Contains("(2, 5)"));
  CHECK_THAT(error_of([&] { op(in.q, in.q, in.g, cu); }), Catch::Contains("[T, HV]"));
  CHECK_THAT(error_of([&] { op(in.q, in.v.to(DType::f32), in.g, cu); }),
             Catch::Contains("dtype mismatch"));
  Tensor bad_state = Tensor::zeros({2, 2, 3, 4}, DType::f64);
  CHECK_THAT(error_of([&] { op(in.q, in.v, in.g, cu, &bad_state); }),
             Catch::Contains("(2, 2, 4, 3)") && Catch::Contains("f64(2, 2, 3, 4)"));
  // A state while a graph is recorded.
  Tensor v = leaf(in.v), state;
  CHECK_THAT(error_of([&] { op(in.q, v, in.g, cu, &state); }),
             Catch::Contains("a state (generation) takes no gradient"));
  {
    NoGradGuard no_grad;
    op(in.q, v, in.g, cu, &state);
    CHECK(state.defined());
  }

  Rng rng(1);
  Tensor x = Tensor::randn({5, 3}, rng, DType::f64), w = Tensor::randn({4, 4}, rng, DType::f64);
  CHECK_THAT(error_of([&] { causal_conv1d(x, w, cu, true); }),
             Catch::Contains("(4, 4)") && Catch::Contains("(5, 3)"));
  CHECK_THAT(error_of([&] { causal_conv1d(x, w.to(DType::f32), cu, true); }),
             Catch::Contains("dtype mismatch"));
  CHECK_THAT(error_of([&] {
               causal_conv1d(x, Tensor::zeros({3, 2}, DType::f64), offsets({4}), true);
             }),
             Catch::Contains("cu_seqlens[1] = 4") && Catch::Contains("(5, 3)"));
}
