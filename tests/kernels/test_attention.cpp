// kernels/attention.h (cpu::attention_fwd, attention_bwd) on raw varlen buffers against a naive
// double-precision attention written here: per document, query head and query row, the full
// score row, its softmax and the weighted sum of values; the backward by the textbook chain rule
// through softmax (dS = P ⊙ (dP - rowsum(P ⊙ dP))).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::random_vector;
using vlm::testing::widen_all;

namespace {

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
};

Ref naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout,
                    const std::vector<int32_t>& cu, const AttentionShape& s) {
  const int64_t T = s.tokens, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
  Ref r;
  r.out.assign(size_t(T * Hq * D), 0.0);
  r.lse.assign(size_t(T * Hq), 0.0);
  r.dq.assign(size_t(T * Hq * D), 0.0);
  r.dk.assign(size_t(T * Hkv * D), 0.0);
  r.dv.assign(size_t(T * Hkv * D), 0.0);
  auto Q = [&](int64_t t, int64_t h, int64_t d) { return q[(t * Hq + h) * D + d]; };
  auto K = [&](int64_t t, int64_t g, int64_t d) { return k[(t * Hkv + g) * D + d]; };
  auto V = [&](int64_t t, int64_t g, int64_t d) { return v[(t * Hkv + g) * D + d]; };
  auto dO = [&](int64_t t, int64_t h, int64_t d) { return dout[(t * Hq + h) * D + d]; };
  for (int64_t b = 0; b < s.docs; b++)
    for (int64_t h = 0; h < Hq; h++) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t i = cu[b]; i < cu[b + 1]; i++) {
        const int64_t j_end = s.causal ? i + 1 : cu[b + 1];
        std::vector<double> p, dp;
        double mx = -1e300;
        for (int64_t j = cu[b]; j < j_end; j++) {
          double dot = 0;
          for (int64_t d = 0; d < D; d++) dot += Q(i, h, d) * K(j, g, d);
          p.push_back(s.scale * dot);
          mx = std::max(mx, p.back());
        }
        double sum = 0;
        for (double& x : p) sum += std::exp(x - mx);
        r.lse[i * Hq + h] = mx + std::log(sum);
        for (double& x : p) x = std::exp(x - mx) / sum;
        for (int64_t j = cu[b]; j < j_end; j++)
          for (int64_t d = 0; d < D; d++)
            r.out[(i * Hq + h) * D + d] += p[size_t(j - cu[b])] * V(j, g, d);
        // Backward of this query row: dP_j = dO_i . V_j, dS_j = P_j (dP_j - sum_l P_l dP_l).
        double pdp = 0;
        for (int64_t j = cu[b]; j < j_end; j++) {
          double dot = 0;
          for (int64_t d = 0; d < D; d++) dot += dO(i, h, d) * V(j, g, d);
          dp.push_back(dot);
          pdp += p[size_t(j - cu[b])] * dot;
        }
        for (int64_t j = cu[b]; j < j_end; j++) {
          const double pj = p[size_t(j - cu[b])], ds = pj * (dp[size_t(j - cu[b])] - pdp);
          for (int64_t d = 0; d < D; d++) {
            r.dq[(i * Hq + h) * D + d] += s.scale * ds * K(j, g, d);
            r.dk[(j * Hkv + g) * D + d] += s.scale * ds * Q(i, h, d);
            r.dv[(j * Hkv + g) * D + d] += pj * dO(i, h, d);
          }
        }
      }
    }
  return r;
}

// Tolerances. float32 kernel against double: inputs in [-1, 1], scores are D-term dot products,
// softmax by fast exp (2e-7 relative), and every output is a sum over at most a few hundred keys
// (and over the query heads of a group for dK/dV) of terms below ~1, so the absolute error is a
// few hundred float ulps of O(1) sums: 2e-5 absolute, 1e-4 relative for the larger gradients.
// double: 1e-12.
template <typename T>
void check_attention(std::vector<int32_t> cu, int64_t Hq, int64_t Hkv, int64_t D, bool causal) {
  using A = acc_t<T>;
  AttentionShape s;
  s.tokens = cu.back();
  s.q_heads = Hq;
  s.kv_heads = Hkv;
  s.head_dim = D;
  s.docs = int64_t(cu.size()) - 1;
  s.causal = causal;
  s.scale = 1 / std::sqrt(double(D));
  INFO("T " << s.tokens << " docs " << s.docs << " Hq " << Hq << " Hkv " << Hkv << " D " << D
            << " causal " << causal);
  const int64_t T_ = s.tokens;
  Rng rng(uint64_t(T_ * 1000 + Hq * 100 + D * 2 + causal));
  auto q = random_vector<T>(rng, T_ * Hq * D, -1, 1);
  auto k = random_vector<T>(rng, T_ * Hkv * D, -1, 1);
  auto v = random_vector<T>(rng, T_ * Hkv * D, -1, 1);
  auto dout = random_vector<T>(rng, T_ * Hq * D, -1, 1);
  const Ref ref = naive_attention(widen_all(q), widen_all(k), widen_all(v), widen_all(dout), cu, s);

  std::vector<T> out(size_t(T_ * Hq * D));
  std::vector<A> lse(size_t(T_ * Hq));
  cpu::attention_fwd<T>(out.data(), lse.data(), q.data(), k.data(), v.data(), cu.data(), s);
  std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_bwd<T>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                        out.data(), lse.data(), cu.data(), s);
  const bool f64 = std::is_same_v<T, double>;
  const double rtol = f64 ? 1e-12 : 1e-4, atol = f64 ? 1e-12 : 2e-5;
  check_close(out, ref.out, rtol, atol, "out");
  check_close(lse, ref.lse, rtol, atol, "lse");
  check_close(dq, ref.dq, rtol, atol, "dq");
  check_close(dk, ref.dk, rtol, atol, "dk");
  check_close(dv, ref.dv, rtol, atol, "dv");
}

} // namespace

TEST_CASE("attention kernel: tiny varlen documents, causal and bidirectional, GQA", "[attention]") {
  // Documents of 3, 1, 0 (empty) and 5 tokens; query heads 4 over kv heads 2 (GQA), 1 (MQA) and
  // 4 (MHA); odd head dims below one SIMD panel.
  const std::vector<int32_t> cu = {0, 3, 4, 4, 9};
  for (bool causal : {true, false}) {
    check_attention<float>(cu, 4, 2, 5, causal);
    check_attention<float>(cu, 4, 1, 3, causal);
    check_attention<float>(cu, 4, 4, 8, causal);
    check_attention<double>(cu, 4, 2, 5, causal);
    check_attention<double>(cu, 2, 1, 7, causal);
  }
  // A single document of one token: out = v, lse = the one scaled score.
  check_attention<float>({0, 1}, 2, 1, 1, true);
  check_attention<float>({0, 1}, 2, 2, 9, false);
}

TEST_CASE("attention kernel: a document longer than a query tile, odd head dim", "[attention]") {
  // 150 + 2 + 140 tokens: documents cross the 128-row query tiles and the 128-key backward
  // tiles; head dim 17 is one more than a float SIMD panel (16). Big enough for the kernel's
  // parallel plan (> 2^18 multiply-adds) when OpenMP has threads.
  const std::vector<int32_t> cu = {0, 150, 152, 292};
  for (bool causal : {true, false}) {
    check_attention<float>(cu, 4, 2, 17, causal);
    check_attention<double>(cu, 2, 1, 9, causal);
  }
}
