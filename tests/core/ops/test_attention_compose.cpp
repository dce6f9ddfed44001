// rope and attention against independent references, forward and input gradients, in f64:
//  * rope vs HF's `x * cos + rotate_half(x) * sin` built from primitive ops (slice, concat, neg,
//    mul, add) with cos/sin tables computed in the test;
//  * attention vs a double-loop reference that materializes the full probability matrix and uses
//    the textbook softmax backward (there is no exp primitive to compose it from);
//  * a packed batch of documents vs one call per document (bit-identical in f32 as well).
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "src/core/ops.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/rope.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::leaf;
using vlm::testing::max_rel_error;

namespace {

constexpr double kTol = 1e-12; // f64: only summation order differs

Tensor rnd(const Shape& s, uint64_t seed, DType dtype = DType::f64) {
  Rng rng(seed);
  return leaf(Tensor::randn(s, rng, dtype));
}

Tensor cu_seqlens(const std::vector<int32_t>& offsets) {
  return Tensor::from_vector(offsets, {int64_t(offsets.size())});
}

// --- rope reference --------------------------------------------------------------------------

// HF's emb = cat(freqs, freqs) tables as [T, 1, R] f64 tensors.
std::pair<Tensor, Tensor> reference_cos_sin(const std::vector<int64_t>& pos, int64_t rotary_dim,
                                            double theta) {
  const int64_t T = int64_t(pos.size()), half = rotary_dim / 2;
  std::vector<double> c(size_t(T * rotary_dim)), s(size_t(T * rotary_dim));
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < rotary_dim; j++) {
      double inv_freq = 1.0 / std::pow(theta, double(2 * (j % half)) / double(rotary_dim));
      c[size_t(t * rotary_dim + j)] = std::cos(double(pos[size_t(t)]) * inv_freq);
      s[size_t(t * rotary_dim + j)] = std::sin(double(pos[size_t(t)]) * inv_freq);
    }
  return {Tensor::from_doubles(c, {T, 1, rotary_dim}, DType::f64),
          Tensor::from_doubles(s, {T, 1, rotary_dim}, DType::f64)};
}

Tensor composed_rope(const Tensor& x, const std::vector<int64_t>& pos, int64_t rotary_dim,
                     double theta) {
  auto [cos, sin] = reference_cos_sin(pos, rotary_dim, theta);
  const int64_t D = x.size(2), half = rotary_dim / 2;
  Tensor x_rot = slice(x, 2, 0, rotary_dim);
  Tensor rotated = concat({neg(slice(x_rot, 2, half, rotary_dim)), slice(x_rot, 2, 0, half)}, 2);
  Tensor y = add(mul(x_rot, cos), mul(rotated, sin));
  return rotary_dim == D ? y : concat({y, slice(x, 2, rotary_dim, D)}, 2);
}

// Forward and gradient of `fused` and `composed` on the same inputs, compared at kTol.
void compare_grads(const std::function<Tensor(const std::vector<Tensor>&)>& fused,
                   const std::function<Tensor(const std::vector<Tensor>&)>& composed,
                   const std::vector<Tensor>& inputs, double tol) {
  std::vector<Tensor> a, b;
  for (auto& t : inputs) {
    a.push_back(leaf(t));
    b.push_back(leaf(t));
  }
  Tensor out_a = fused(a), out_b = composed(b);
  CHECK(max_rel_error(out_a.to_doubles(), out_b.to_doubles()) <= tol);
  Rng rng(99);
  Tensor probe = Tensor::randn(out_a.shape(), rng, out_a.dtype());
  run_backward({out_a}, {probe});
  run_backward({out_b}, {probe});
  for (size_t i = 0; i < inputs.size(); i++) {
    INFO("input " << i);
    CHECK(max_rel_error(a[i].grad().to_doubles(), b[i].grad().to_doubles()) <= tol);
  }
}

// --- attention reference -----------------------------------------------------------------------

struct AttentionProblem {
  int64_t T, Hq, Hkv, D;
  std::vector<int32_t> cu;
  bool causal;
  double scale;
};

struct AttentionResult {
  std::vector<double> out, dq, dk, dv;
};

// Per document and query head: S = scale q k^T (masked), P = softmax(S), O = P V;
// dV = P^T dO, dP = dO V^T, dS = P ⊙ (dP - rowsum(P ⊙ dP)), dQ = scale dS K, dK = scale dS^T Q.
AttentionResult reference_attention(const AttentionProblem& p, const std::vector<double>& q,
                                    const std::vector<double>& k, const std::vector<double>& v,
                                    const std::vector<double>& dout) {
  const int64_t D = p.D, group = p.Hq / p.Hkv;
  AttentionResult r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  auto qi = [&](int64_t t, int64_t h) { return size_t((t * p.Hq + h) * D); };
  auto ki = [&](int64_t t, int64_t g) { return size_t((t * p.Hkv + g) * D); };
  for (size_t b = 0; b + 1 < p.cu.size(); b++) {
    const int64_t s0 = p.cu[b], L = p.cu[b + 1] - s0;
    for (int64_t h = 0; h < p.Hq; h++) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < L; i++) {
        const int64_t n = p.causal ? i + 1 : L; // visible keys
        const double* qrow = &q[qi(s0 + i, h)];
        const double* dorow = &dout[qi(s0 + i, h)];
        std::vector<double> P(static_cast<size_t>(n)), dP(static_cast<size_t>(n), 0.0);
        double m = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
          double s = 0;
          for (int64_t d = 0; d < D; d++) s += qrow[d] * k[ki(s0 + j, g) + d];
          P[size_t(j)] = s * p.scale;
          m = std::max(m, P[size_t(j)]);
        }
        double z = 0;
        for (auto& x : P) z += (x = std::exp(x - m));
        for (auto& x : P) x /= z;
        for (int64_t j = 0; j < n; j++)
          for (int64_t d = 0; d < D; d++) {
            r.out[qi(s0 + i, h) + d] += P[size_t(j)] * v[ki(s0 + j, g) + d];
            r.dv[ki(s0 + j, g) + d] += P[size_t(j)] * dorow[d];
            dP[size_t(j)] += dorow[d] * v[ki(s0 + j, g) + d];
          }
        double row = 0; // sum_j P_ij dP_ij
        for (int64_t j = 0; j < n; j++) row += P[size_t(j)] * dP[size_t(j)];
        for (int64_t j = 0; j < n; j++) {
          const double ds = P[size_t(j)] * (dP[size_t(j)] - row) * p.scale;
          for (int64_t d = 0; d < D; d++) {
            r.dq[qi(s0 + i, h) + d] += ds * k[ki(s0 + j, g) + d];
            r.dk[ki(s0 + j, g) + d] += ds * qrow[d];
          }
        }
      }
    }
  }
  return r;
}

void check_against_reference(const AttentionProblem& p, uint64_t seed) {
  INFO("T=" << p.T << " Hq=" << p.Hq << " Hkv=" << p.Hkv << " D=" << p.D << " causal=" << p.causal);
  Tensor q = rnd({p.T, p.Hq, p.D}, seed), k = rnd({p.T, p.Hkv, p.D}, seed + 1),
         v = rnd({p.T, p.Hkv, p.D}, seed + 2);
  Rng rng(seed + 3);
  Tensor dout = Tensor::randn({p.T, p.Hq, p.D}, rng, DType::f64);
  Tensor out = attention(q, k, v, cu_seqlens(p.cu), p.causal, p.scale);
  run_backward({out}, {dout});
  AttentionResult ref =
      reference_attention(p, q.to_doubles(), k.to_doubles(), v.to_doubles(), dout.to_doubles());
  CHECK(max_rel_error(out.to_doubles(), ref.out) <= kTol);
  CHECK(max_rel_error(q.grad().to_doubles(), ref.dq) <= kTol);
  CHECK(max_rel_error(k.grad().to_doubles(), ref.dk) <= kTol);
  CHECK(max_rel_error(v.grad().to_doubles(), ref.dv) <= kTol);
}

// Output and input gradients of one f32 run with `threads` OpenMP threads.
std::vector<std::vector<double>> f32_run(const AttentionProblem& p, uint64_t seed, int threads) {
  omp_set_num_threads(threads);
  Tensor q = rnd({p.T, p.Hq, p.D}, seed, DType::f32),
         k = rnd({p.T, p.Hkv, p.D}, seed + 1, DType::f32),
         v = rnd({p.T, p.Hkv, p.D}, seed + 2, DType::f32);
  Rng rng(seed + 3);
  Tensor dout = Tensor::randn({p.T, p.Hq, p.D}, rng, DType::f32);
  Tensor out = attention(q, k, v, cu_seqlens(p.cu), p.causal, p.scale);
  run_backward({out}, {dout});
  return {out.to_doubles(), q.grad().to_doubles(), k.grad().to_doubles(), v.grad().to_doubles()};
}

} // namespace

TEST_CASE("rope: matches x*cos + rotate_half(x)*sin from primitives", "[compose]") {
  std::vector<int64_t> pos{0, 1, 2, 3, 0, 5, 6, 100};
  Tensor pos_t = Tensor::from_vector(pos, {8});
  for (int64_t rotary_dim : {int64_t(12), int64_t(6), int64_t(2)}) {
    INFO("rotary_dim " << rotary_dim);
    compare_grads([&](auto& in) { return rope(in[0], pos_t, rotary_dim, 1e4); },
                  [&](auto& in) { return composed_rope(in[0], pos, rotary_dim, 1e4); },
                  {rnd({8, 3, 12}, 1)}, kTol);
  }
}

TEST_CASE("rope: tables reused across calls and strided input", "[compose]") {
  std::vector<int64_t> pos{4, 3, 2, 1, 0};
  RopeTables tables = rope_tables(Tensor::from_vector(pos, {5}), 8, 500.0, DType::f64);
  // x as a transposed view: rope makes it contiguous and still matches the composition.
  compare_grads([&](auto& in) { return rope(transpose(in[0], 0, 1), tables); },
                [&](auto& in) { return composed_rope(transpose(in[0], 0, 1), pos, 8, 500.0); },
                {rnd({2, 5, 8}, 2)}, kTol);
}

TEST_CASE("attention: matches a double-loop reference", "[compose]") {
  for (bool causal : {true, false}) {
    check_against_reference({15, 4, 2, 8, {0, 5, 6, 15}, causal, 1.0 / std::sqrt(8.0)}, 10);
    check_against_reference({15, 4, 1, 12, {0, 5, 6, 15}, causal, 0.3}, 20);
    check_against_reference({6, 2, 2, 64, {0, 6}, causal, 0.125}, 30);
    check_against_reference({9, 3, 1, 80, {0, 1, 4, 9}, causal, 1.0 / std::sqrt(80.0)}, 40);
    // A 130-token document spans three 64-row blocks of the CPU kernel.
    check_against_reference({133, 2, 1, 8, {0, 130, 133}, causal, 0.5}, 50);
  }
}

TEST_CASE("attention: long documents span several key tiles of the CPU kernel", "[compose]") {
  // 600 tokens: 3 tiles of the CPU forward's 256 keys (the online softmax rescales across them),
  // 5 of the backward's 128 and 5 blocks of 128 rows; the 257-token document ends one key into
  // its third block.
  for (bool causal : {true, false})
    check_against_reference({857, 4, 2, 16, {0, 600, 857}, causal, 0.25}, 70);
}

TEST_CASE("attention: f32 is bit-identical for any thread count and within 1e-5 of f64",
          "[compose]") {
  const std::vector<int32_t> cu{0, 700, 703};
  const int threads = std::max(2, omp_get_max_threads());
  for (bool causal : {true, false}) {
    INFO("causal=" << causal);
    const AttentionProblem p{703, 4, 2, 64, cu, causal, 0.125};
    std::vector<std::vector<double>> runs[2] = {f32_run(p, 80, 1), f32_run(p, 80, threads)};
    omp_set_num_threads(threads);
    CHECK(runs[0] == runs[1]);
    // The same inputs in f64 (the f32 kernel's exp is a polynomial; sums run in f32).
    auto f64 = [](const Tensor& t) { return leaf(t.detach().to(DType::f64)); };
    Tensor q = f64(rnd({703, 4, 64}, 80, DType::f32)), k = f64(rnd({703, 2, 64}, 81, DType::f32)),
           v = f64(rnd({703, 2, 64}, 82, DType::f32));
    Rng rng(83);
    Tensor dout = Tensor::randn({703, 4, 64}, rng, DType::f32).to(DType::f64);
    Tensor out = attention(q, k, v, cu_seqlens(cu), causal, 0.125);
    run_backward({out}, {dout});
    CHECK(max_rel_error(runs[0][0], out.to_doubles()) <= 1e-5);
    CHECK(max_rel_error(runs[0][1], q.grad().to_doubles()) <= 1e-5);
    CHECK(max_rel_error(runs[0][2], k.grad().to_doubles()) <= 1e-5);
    CHECK(max_rel_error(runs[0][3], v.grad().to_doubles()) <= 1e-5);
  }
}

TEST_CASE("attention: with more threads than heads the CPU backward splits by key blocks and "
          "gives the same bits",
          "[compose]") {
  // 16 threads for 2-4 query heads: the backward takes its split plan (items per block of 128
  // keys for dK/dV and of 128 queries for dQ); one thread takes the per-head plan. Both must
  // match the f64 reference, and in f32 each other bit for bit.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(16);
  const std::vector<AttentionProblem> problems{
      {300, 4, 2, 16, {0, 300}, true, 0.25},
      {400, 3, 1, 80, {0, 260, 263, 400}, true, 1.0 / std::sqrt(80.0)},
      {333, 4, 1, 24, {0, 333}, false, 0.2},
  };
  for (size_t i = 0; i < problems.size(); i++) {
    const AttentionProblem& p = problems[i];
    check_against_reference(p, 90 + 10 * i);
    std::vector<std::vector<double>> runs[2] = {f32_run(p, 200 + 10 * i, 1),
                                                f32_run(p, 200 + 10 * i, 16)};
    INFO("problem " << i);
    CHECK(runs[0] == runs[1]);
  }
  omp_set_num_threads(threads);
}

TEST_CASE("attention: packed batch equals separate documents", "[compose]") {
  // Packed documents of 5, 0 (empty), 1 and 9 tokens vs one call per document; in f32 the
  // results must be bit-identical, since each row sees the same keys in the same order.
  const std::vector<int32_t> cu{0, 5, 5, 6, 15};
  for (DType dtype : {DType::f64, DType::f32}) {
    for (bool causal : {true, false}) {
      INFO(dtype_name(dtype) << " causal=" << causal);
      Tensor q = rnd({15, 4, 12}, 60, dtype), k = rnd({15, 2, 12}, 61, dtype),
             v = rnd({15, 2, 12}, 62, dtype);
      Rng rng(63);
      Tensor dout = Tensor::randn({15, 4, 12}, rng, dtype);
      Tensor out = attention(q, k, v, cu_seqlens(cu), causal, 0.3);
      run_backward({out}, {dout});
      for (size_t b = 0; b + 1 < cu.size(); b++) {
        const int64_t s = cu[b], e = cu[b + 1];
        if (s == e) continue;
        INFO("document " << b);
        Tensor qd = leaf(slice(q, 0, s, e).contiguous()), kd = leaf(slice(k, 0, s, e).contiguous()),
               vd = leaf(slice(v, 0, s, e).contiguous());
        Tensor od = attention(qd, kd, vd, cu_seqlens({0, int32_t(e - s)}), causal, 0.3);
        run_backward({od}, {slice(dout, 0, s, e).contiguous()});
        CHECK(od.to_doubles() == slice(out, 0, s, e).to_doubles());
        CHECK(qd.grad().to_doubles() == slice(q.grad(), 0, s, e).to_doubles());
        CHECK(kd.grad().to_doubles() == slice(k.grad(), 0, s, e).to_doubles());
        CHECK(vd.grad().to_doubles() == slice(v.grad(), 0, s, e).to_doubles());
      }
    }
  }
}
