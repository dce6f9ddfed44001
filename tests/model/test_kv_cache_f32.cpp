// The KV cache's one-token step keeps attention scores in fp32 (issue 34): in a bf16 model the
// step's output, against the f64 attention of the same bf16 values, is off by no more than its
// own rounding to bf16 (at most 2^-8 relative, plus fp32 noise), like the prefill's attention
// kernel; the old step (scores, scaled scores and probabilities rounded to bf16) is off by
// far more on the same inputs. Measured (x86-64): 0.87 units below (max-norm relative
// 2.8e-3, the output rounding) against 622 units (1.3e-2) for the old step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/kv_cache.h"
#include "src/core/ops.h"

using namespace vlm;

namespace {

constexpr int64_t kPrompt = 40, kHeads = 4, kKvHeads = 2, kD = 16;

// f64 attention of the last query row over every cached key (GQA: head h reads kv head h / g).
std::vector<double> reference(const Tensor& q, const Tensor& keys, const Tensor& values,
                              double scale) {
  const auto qv = q.to_doubles(), kv = keys.to_doubles(), vv = values.to_doubles();
  const int64_t T = keys.size(0), g = kHeads / kKvHeads;
  std::vector<double> out(size_t(kHeads * kD), 0.0);
  for (int64_t h = 0; h < kHeads; h++) {
    const int64_t kh = h / g;
    std::vector<double> s(static_cast<size_t>(T));
    double mx = -1e300, den = 0;
    for (int64_t t = 0; t < T; t++) {
      double dot = 0;
      for (int64_t d = 0; d < kD; d++)
        dot += qv[size_t(h * kD + d)] * kv[size_t((t * kKvHeads + kh) * kD + d)];
      s[size_t(t)] = dot * scale;
      mx = std::max(mx, s[size_t(t)]);
    }
    for (auto& x : s) den += (x = std::exp(x - mx));
    for (int64_t t = 0; t < T; t++)
      for (int64_t d = 0; d < kD; d++)
        out[size_t(h * kD + d)] += s[size_t(t)] / den * vv[size_t((t * kKvHeads + kh) * kD + d)];
  }
  return out;
}

// The largest |got - want| in units of 2^-8 |want| (the largest relative error of a rounding to
// bf16), with |want| floored at 1e-3 max|want| for values near zero.
double ulps(const std::vector<double>& got, const std::vector<double>& want) {
  double mx = 0, worst = 0;
  for (double w : want) mx = std::max(mx, std::abs(w));
  for (size_t i = 0; i < got.size(); i++) {
    const double unit = std::ldexp(std::max(std::abs(want[i]), 1e-3 * mx), -8);
    worst = std::max(worst, std::abs(got[i] - want[i]) / unit);
  }
  return worst;
}

// max |got - want| / max |want|
double rel(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

} // namespace

TEST_CASE("kv cache: a bf16 one-token step computes its scores in fp32", "[model]") {
  Rng rng(34);
  const double scale = 1.0 / std::sqrt(double(kD));
  // Large scores (std ~ 9 after scaling): a bf16 rounding of them moves the probabilities by %.
  Tensor k = Tensor::randn({kPrompt, kKvHeads, kD}, rng, DType::bf16, 3.0);
  Tensor v = Tensor::randn({kPrompt, kKvHeads, kD}, rng, DType::bf16);
  Tensor q = Tensor::randn({kPrompt, kHeads, kD}, rng, DType::bf16, 3.0);
  Tensor q1 = Tensor::randn({1, kHeads, kD}, rng, DType::bf16, 3.0);
  Tensor k1 = Tensor::randn({1, kKvHeads, kD}, rng, DType::bf16, 3.0);
  Tensor v1 = Tensor::randn({1, kKvHeads, kD}, rng, DType::bf16);
  model::KVCache::Layer cache;
  model::cached_attention(q, k, v, cache, scale); // prefill
  const Tensor out = model::cached_attention(q1, k1, v1, cache, scale);
  REQUIRE(out.dtype() == DType::bf16);
  REQUIRE(out.shape() == Shape{1, kHeads, kD});
  REQUIRE(cache.keys.size(0) == kPrompt + 1);
  const auto want = reference(q1, cache.keys, cache.values, scale);
  const double err = ulps(out.to_doubles(), want), err_rel = rel(out.to_doubles(), want);

  // The old step on the same inputs: every product and the softmax in bf16.
  const int64_t g = kHeads / kKvHeads;
  const Tensor kt = copy(permute(cache.keys, {1, 2, 0}));
  const Tensor vh = copy(permute(cache.values, {1, 0, 2}));
  const Tensor p = softmax(vlm::scale(matmul(reshape(q1, {kKvHeads, g, kD}), kt), scale));
  const auto old_out = reshape(matmul(p, vh), {1, kHeads, kD}).to_doubles();
  const double old_err = ulps(old_out, want), old_rel = rel(old_out, want);
  INFO("fp32 scores: " << err << " units (max-norm relative " << err_rel
                       << "); bf16 scores: " << old_err << " units (" << old_rel << ")");
  CHECK(err <= 1.01); // only the output's own rounding to bf16 (half an ulp, plus fp32 noise)
  CHECK(old_err > 3.0);
}
