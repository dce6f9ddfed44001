// kernels/gated_delta.h (cpu::gated_delta_recurrent_fwd/bwd, gated_delta_chunk_fwd/bwd) on raw
// packed buffers against a plain double-precision recurrence written here (state decayed, delta
// rule on the decayed state, read-out including the token, per document and value head). The
// recurrent backward is checked against central finite differences of the recurrent forward, the
// chunked backward against the recurrent one. Layouts: documents shorter than a chunk, exactly 64,
// 65, over two chunks (150), 1 token and empty; dk != dv both ways; HV = HK, 2·HK and 3·HK; with
// and without an initial state; log decays from (-5, 0) and close to 0. Also: a packed run equals
// its documents run alone, and the chunked form gives the same bits on 1 and 2 threads.
#include <catch2/catch.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/gated_delta.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::widen_all;

namespace {

// How the log decays g are drawn: U(-5, 0) (the state forgets within a few tokens), U(-0.02, 0)
// (it remembers across chunks and documents' worth of tokens), or each element either way.
enum class Decay { wide, near_zero, mixed };

struct Case {
  int64_t HK, HV, dk, dv;
  std::vector<int32_t> lengths; // document lengths, in packing order
  bool with_initial_state;
  Decay decay;
  uint64_t seed;
};

std::vector<int32_t> offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu(1, 0);
  for (int32_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

// The inputs of one case in T, and their exact values in double (what the reference sees).
template <typename T> struct Inputs {
  GatedDeltaShape shape;
  std::vector<int32_t> cu;
  std::vector<T> q, k, v, g, beta, h0, dout; // h0 empty: no initial state
  const T* h0_ptr() const { return h0.empty() ? nullptr : h0.data(); }
};

// Unit rows of n values (normalized in double, then rounded to T).
template <typename T> std::vector<T> unit_rows(Rng& rng, int64_t rows, int64_t n) {
  std::vector<T> out;
  for (int64_t r = 0; r < rows; r++) {
    std::vector<double> x(static_cast<size_t>(n));
    double ss = 0;
    for (auto& e : x) {
      e = rng.uniform(-1, 1);
      ss += e * e;
    }
    for (double e : x) out.push_back(T(e / std::sqrt(ss)));
  }
  return out;
}

template <typename T> Inputs<T> make_inputs(const Case& c) {
  Inputs<T> in;
  in.cu = offsets(c.lengths);
  const int64_t T_ = in.cu.back();
  in.shape = {T_, c.HK, c.HV, c.dk, c.dv, int64_t(c.lengths.size()), 1 / std::sqrt(double(c.dk))};
  Rng rng(c.seed);
  in.q = unit_rows<T>(rng, T_ * c.HK, c.dk);
  in.k = unit_rows<T>(rng, T_ * c.HK, c.dk);
  in.v = testing::random_vector<T>(rng, T_ * c.HV * c.dv, -1, 1);
  for (int64_t i = 0; i < T_ * c.HV; i++) {
    const bool wide = c.decay == Decay::wide || (c.decay == Decay::mixed && rng.uniform() < 0.5);
    in.g.push_back(T(wide ? rng.uniform(-5, 0) : rng.uniform(-0.02, 0)));
  }
  in.beta = testing::random_vector<T>(rng, T_ * c.HV, 0.01, 0.99);
  if (c.with_initial_state)
    in.h0 = testing::random_vector<T>(rng, in.shape.docs * c.HV * c.dk * c.dv, -1, 1);
  in.dout = testing::random_vector<T>(rng, T_ * c.HV * c.dv, -1, 1);
  return in;
}

// The reference: out [T, HV, dv] and the final states [docs, HV, dk, dv], token by token.
struct Reference {
  std::vector<double> out, final_state;
};

template <typename T> Reference reference_forward(const Inputs<T>& in) {
  const auto q = widen_all(in.q), k = widen_all(in.k), v = widen_all(in.v), g = widen_all(in.g),
             beta = widen_all(in.beta), h0 = widen_all(in.h0);
  const auto& s = in.shape;
  const int64_t HK = s.k_heads, HV = s.v_heads, dk = s.k_dim, dv = s.v_dim;
  Reference ref;
  ref.out.assign(size_t(s.tokens * HV * dv), 0.0);
  ref.final_state.assign(size_t(s.docs * HV * dk * dv), 0.0);
  for (int64_t b = 0; b < s.docs; b++)
    for (int64_t j = 0; j < HV; j++) {
      const int64_t hk = j / (HV / HK);
      std::vector<double> S(size_t(dk * dv), 0.0); // S[a][e]
      if (!h0.empty())
        for (int64_t x = 0; x < dk * dv; x++) S[x] = h0[(b * HV + j) * dk * dv + x];
      for (int64_t t = in.cu[b]; t < in.cu[b + 1]; t++) {
        const double* kt = &k[(t * HK + hk) * dk];
        const double* qt = &q[(t * HK + hk) * dk];
        const double* vt = &v[(t * HV + j) * dv];
        const double decay = std::exp(g[t * HV + j]), bt = beta[t * HV + j];
        for (double& x : S) x *= decay;
        for (int64_t e = 0; e < dv; e++) {
          double pred = 0; // (Sᵀ k)_e on the decayed state
          for (int64_t a = 0; a < dk; a++) pred += S[a * dv + e] * kt[a];
          const double delta = bt * (vt[e] - pred);
          for (int64_t a = 0; a < dk; a++) S[a * dv + e] += kt[a] * delta;
        }
        for (int64_t e = 0; e < dv; e++) {
          double o = 0;
          for (int64_t a = 0; a < dk; a++) o += S[a * dv + e] * s.scale * qt[a];
          ref.out[(t * HV + j) * dv + e] = o;
        }
      }
      std::copy(S.begin(), S.end(), ref.final_state.begin() + (b * HV + j) * dk * dv);
    }
  return ref;
}

// Results of one forward + backward.
template <typename T> struct Run { std::vector<T> out, final_state, dq, dk, dv, dg, dbeta, dh0; };

template <typename T> Run<T> run(const Inputs<T>& in, bool chunked) {
  const auto& s = in.shape;
  Run<T> r;
  r.out.resize(size_t(s.tokens * s.v_heads * s.v_dim));
  r.final_state.resize(size_t(s.docs * s.v_heads * s.k_dim * s.v_dim));
  r.dq.resize(in.q.size());
  r.dk.resize(in.k.size());
  r.dv.resize(in.v.size());
  r.dg.resize(in.g.size());
  r.dbeta.resize(in.beta.size());
  r.dh0.resize(r.final_state.size());
  auto fwd = chunked ? cpu::gated_delta_chunk_fwd<T> : cpu::gated_delta_recurrent_fwd<T>;
  auto bwd = chunked ? cpu::gated_delta_chunk_bwd<T> : cpu::gated_delta_recurrent_bwd<T>;
  fwd(r.out.data(), r.final_state.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
      in.beta.data(), in.h0_ptr(), in.cu.data(), s);
  bwd(r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(), r.dbeta.data(), r.dh0.data(),
      in.dout.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
      in.h0_ptr(), in.cu.data(), s);
  return r;
}

// The cases of the sweep (T4 of qwen-models.md §8, at test sizes).
std::vector<Case> sweep() {
  return {
      {2, 2, 32, 16, {37, 64, 1, 0, 65, 150}, true, Decay::mixed, 1},
      {2, 4, 16, 64, {150, 0, 1, 64, 65, 37}, false, Decay::wide, 2},
      {1, 3, 32, 16, {65, 1, 130, 0, 20}, true, Decay::near_zero, 3},
      {2, 6, 16, 64, {64, 37, 0, 150}, true, Decay::near_zero, 4},
      {1, 2, 32, 32, {0, 150, 1, 64}, false, Decay::mixed, 5},
  };
}

std::string describe(const Case& c) {
  std::string s = "HK " + std::to_string(c.HK) + " HV " + std::to_string(c.HV) + " dk " +
                  std::to_string(c.dk) + " dv " + std::to_string(c.dv) + " docs";
  for (int32_t n : c.lengths) s += " " + std::to_string(n);
  s += c.with_initial_state ? " initial state" : " zero state";
  s += c.decay == Decay::wide ? " g wide" : c.decay == Decay::near_zero ? " g near 0" : " g mixed";
  return s;
}

void check_grads(const Run<double>& got, const Run<double>& want, double rtol, double atol,
                 bool with_h0) {
  check_close(got.dq, want.dq, rtol, atol, "dq");
  check_close(got.dk, want.dk, rtol, atol, "dk");
  check_close(got.dv, want.dv, rtol, atol, "dv");
  check_close(got.dg, want.dg, rtol, atol, "dg");
  check_close(got.dbeta, want.dbeta, rtol, atol, "dbeta");
  if (with_h0) check_close(got.dh0, want.dh0, rtol, atol, "d_initial_state");
}

} // namespace

TEST_CASE("gated delta: recurrent and chunked forward against a double recurrence",
          "[gated_delta]") {
  for (const Case& c : sweep()) {
    INFO(describe(c));
    {
      const auto in = make_inputs<double>(c);
      const auto ref = reference_forward(in);
      const auto rec = run(in, false);
      const auto chk = run(in, true);
      // The recurrent kernel is the reference's arithmetic in another order: ~1e-15 relative.
      check_close(rec.out, ref.out, 1e-12, 1e-12, "recurrent out (double)");
      check_close(rec.final_state, ref.final_state, 1e-12, 1e-12, "recurrent final (double)");
      // The chunked form reorders the same sums through a 64x64 unit-triangular solve per
      // chunk: measured ~1e-14; 1e-10 is the brief's bound.
      check_close(chk.out, ref.out, 1e-10, 1e-10, "chunked out (double)");
      check_close(chk.final_state, ref.final_state, 1e-10, 1e-10, "chunked final (double)");
    }
    {
      // float: inputs are O(1), q and k unit rows, β < 1, so states stay O(1) (each token's
      // update is a contraction plus a bounded write) and an output is a sum of O(C + dk) float
      // products taken through the chunk's unit-triangular solve, whose inverse has O(1)
      // entries for β < 1 and unit keys: a few float ulps times a few dozen, ~1e-6. Measured
      // worst over this sweep ~5e-7 (abs and rel); 1e-5 leaves a 20x margin and still catches a
      // wrong or missing term (those are 1e-3 or more).
      const auto in = make_inputs<float>(c);
      const auto ref = reference_forward(in);
      const auto rec = run(in, false);
      const auto chk = run(in, true);
      const double tol = 1e-5;
      check_close(rec.out, ref.out, tol, tol, "recurrent out (float)");
      check_close(rec.final_state, ref.final_state, tol, tol, "recurrent final (float)");
      check_close(chk.out, ref.out, tol, tol, "chunked out (float)");
      check_close(chk.final_state, ref.final_state, tol, tol, "chunked final (float)");
    }
  }
}

TEST_CASE("gated delta: chunked backward against the recurrent backward", "[gated_delta]") {
  for (const Case& c : sweep()) {
    INFO(describe(c));
    const auto in = make_inputs<double>(c);
    const auto rec = run(in, false);
    const auto chk = run(in, true);
    check_grads(chk, rec, 1e-10, 1e-10, c.with_initial_state);
    // Without an initial state its gradient is still defined (the state the document starts
    // from, zero): both forms must agree on it too.
    check_close(chk.dh0, widen_all(rec.dh0), 1e-10, 1e-10, "d_initial_state");

    // float chunked against the double recurrence on the same (rounded) inputs. Gradients pass
    // through more float operations than the outputs (two triangular solves, the reverse state
    // scan over up to 150 tokens with g near 0; dg is a reverse cumulative sum of up to 64
    // terms, some O(1) and cancelling): measured worst ~2.5e-6 (dg; abs and rel); 5e-5 leaves a
    // 20x margin.
    const auto inf = make_inputs<float>(c);
    Inputs<double> wide;
    wide.shape = inf.shape;
    wide.cu = inf.cu;
    wide.q = widen_all(inf.q);
    wide.k = widen_all(inf.k);
    wide.v = widen_all(inf.v);
    wide.g = widen_all(inf.g);
    wide.beta = widen_all(inf.beta);
    wide.h0 = widen_all(inf.h0);
    wide.dout = widen_all(inf.dout);
    const auto want = run(wide, false);
    const auto got = run(inf, true);
    const double tol = 5e-5;
    check_close(got.dq, want.dq, tol, tol, "dq (float)");
    check_close(got.dk, want.dk, tol, tol, "dk (float)");
    check_close(got.dv, want.dv, tol, tol, "dv (float)");
    check_close(got.dg, want.dg, tol, tol, "dg (float)");
    check_close(got.dbeta, want.dbeta, tol, tol, "dbeta (float)");
    check_close(got.dh0, want.dh0, tol, tol, "d_initial_state (float)");
  }
}

TEST_CASE("gated delta: recurrent backward against finite differences", "[gated_delta]") {
  // loss = Σ dout ⊙ out; small enough for a central difference per input element.
  for (const Case& c : {Case{1, 2, 4, 3, {3, 0, 5, 1}, true, Decay::mixed, 7},
                        Case{2, 2, 3, 5, {4, 2}, true, Decay::near_zero, 8}}) {
    INFO(describe(c));
    auto in = make_inputs<double>(c);
    const auto grads = run(in, false);
    const auto& s = in.shape;
    auto loss = [&] {
      std::vector<double> out(size_t(s.tokens * s.v_heads * s.v_dim));
      cpu::gated_delta_recurrent_fwd<double>(out.data(), nullptr, in.q.data(), in.k.data(),
                                             in.v.data(), in.g.data(), in.beta.data(), in.h0_ptr(),
                                             in.cu.data(), s);
      double l = 0;
      for (size_t i = 0; i < out.size(); i++) l += out[i] * in.dout[i];
      return l;
    };
    // Step 1e-5: truncation ~1e-10 · |third derivative|, rounding ~1e-16 / 1e-5 = 1e-11.
    const double h = 1e-5;
    auto fd = [&](std::vector<double>& x) {
      std::vector<double> d(x.size());
      for (size_t i = 0; i < x.size(); i++) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss();
        x[i] = x0 - h;
        const double lm = loss();
        x[i] = x0;
        d[i] = (lp - lm) / (2 * h);
      }
      return d;
    };
    const double tol = 1e-7;
    check_close(grads.dq, fd(in.q), tol, tol, "dq");
    check_close(grads.dk, fd(in.k), tol, tol, "dk");
    check_close(grads.dv, fd(in.v), tol, tol, "dv");
    check_close(grads.dg, fd(in.g), tol, tol, "dg");
    check_close(grads.dbeta, fd(in.beta), tol, tol, "dbeta");
    check_close(grads.dh0, fd(in.h0), tol, tol, "d_initial_state");
  }
}

TEST_CASE("gated delta: a packed run equals its documents run alone", "[gated_delta]") {
  // Bit for bit: a document's arithmetic (chunks counted from its start, the value-head sums of
  // dq / dk in head order) does not depend on its neighbours.
  const Case c{2, 4, 32, 16, {37, 0, 150, 1, 64, 65}, true, Decay::near_zero, 21};
  const auto packed_in = make_inputs<double>(c);
  for (bool chunked : {false, true}) {
    INFO((chunked ? "chunked" : "recurrent"));
    const auto packed = run(packed_in, chunked);
    const auto& s = packed_in.shape;
    const int64_t qk_row = s.k_heads * s.k_dim, v_row = s.v_heads * s.v_dim, gb_row = s.v_heads;
    const int64_t state = s.v_heads * s.k_dim * s.v_dim;
    for (size_t b = 0; b < c.lengths.size(); b++) {
      INFO("document " << b);
      const int64_t t0 = packed_in.cu[b], n = c.lengths[b];
      auto slice = [](const std::vector<double>& x, int64_t from, int64_t count) {
        return std::vector<double>(x.begin() + from, x.begin() + from + count);
      };
      Inputs<double> one;
      one.cu = {0, int32_t(n)};
      one.shape = s;
      one.shape.tokens = n;
      one.shape.docs = 1;
      one.q = slice(packed_in.q, t0 * qk_row, n * qk_row);
      one.k = slice(packed_in.k, t0 * qk_row, n * qk_row);
      one.v = slice(packed_in.v, t0 * v_row, n * v_row);
      one.g = slice(packed_in.g, t0 * gb_row, n * gb_row);
      one.beta = slice(packed_in.beta, t0 * gb_row, n * gb_row);
      one.h0 = slice(packed_in.h0, int64_t(b) * state, state);
      one.dout = slice(packed_in.dout, t0 * v_row, n * v_row);
      const auto alone = run(one, chunked);
      CHECK(alone.out == slice(packed.out, t0 * v_row, n * v_row));
      CHECK(alone.final_state == slice(packed.final_state, int64_t(b) * state, state));
      CHECK(alone.dq == slice(packed.dq, t0 * qk_row, n * qk_row));
      CHECK(alone.dk == slice(packed.dk, t0 * qk_row, n * qk_row));
      CHECK(alone.dv == slice(packed.dv, t0 * v_row, n * v_row));
      CHECK(alone.dg == slice(packed.dg, t0 * gb_row, n * gb_row));
      CHECK(alone.dbeta == slice(packed.dbeta, t0 * gb_row, n * gb_row));
      CHECK(alone.dh0 == slice(packed.dh0, int64_t(b) * state, state));
    }
  }
}

TEST_CASE("gated delta: null state pointers", "[gated_delta]") {
  // No final state / no initial-state gradient wanted: the other results are unchanged.
  const Case c{1, 2, 16, 16, {70, 5}, true, Decay::mixed, 31};
  const auto in = make_inputs<float>(c);
  const auto full = run(in, true);
  const auto& s = in.shape;
  std::vector<float> out(full.out.size()), dq(full.dq.size()), dk(full.dk.size()),
      dv(full.dv.size()), dg(full.dg.size()), dbeta(full.dbeta.size());
  cpu::gated_delta_chunk_fwd<float>(out.data(), nullptr, in.q.data(), in.k.data(), in.v.data(),
                                    in.g.data(), in.beta.data(), in.h0_ptr(), in.cu.data(), s);
  cpu::gated_delta_chunk_bwd<float>(dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(),
                                    nullptr, in.dout.data(), in.q.data(), in.k.data(), in.v.data(),
                                    in.g.data(), in.beta.data(), in.h0_ptr(), in.cu.data(), s);
  CHECK(out == full.out);
  CHECK(dq == full.dq);
  CHECK(dk == full.dk);
  CHECK(dv == full.dv);
  CHECK(dg == full.dg);
  CHECK(dbeta == full.dbeta);
}

#ifdef _OPENMP
TEST_CASE("gated delta: chunked results do not depend on the thread count", "[gated_delta]") {
  // Enough work for the parallel path (tokens · HV · dk · dv well above its threshold), GVA so
  // the value-head sums of dq / dk run too.
  const Case c{2, 4, 32, 16, {150, 1, 300, 0, 64, 65}, true, Decay::mixed, 41};
  const auto in = make_inputs<float>(c);
  auto run_with = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    auto r = run(in, true);
    omp_set_num_threads(before);
    return r;
  };
  const auto one = run_with(1), two = run_with(2);
  CHECK(one.out == two.out);
  CHECK(one.final_state == two.final_state);
  CHECK(one.dq == two.dq);
  CHECK(one.dk == two.dk);
  CHECK(one.dv == two.dv);
  CHECK(one.dg == two.dg);
  CHECK(one.dbeta == two.dbeta);
  CHECK(one.dh0 == two.dh0);
}
#endif

TEST_CASE("gated delta: chunked timing", "[.bench][gated_delta_bench]") {
  // Not a test: T = 4096 in one document, HK 4, HV 8, dk = dv = 64, float; prints ms per call.
  const Case c{4, 8, 64, 64, {4096}, false, Decay::wide, 51};
  const auto in = make_inputs<float>(c);
  const auto& s = in.shape;
  Run<float> r = run(in, true);
  auto time_ms = [](auto f) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      best = std::min(
          best,
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double fwd = time_ms([&] {
    cpu::gated_delta_chunk_fwd<float>(r.out.data(), r.final_state.data(), in.q.data(), in.k.data(),
                                      in.v.data(), in.g.data(), in.beta.data(), nullptr,
                                      in.cu.data(), s);
  });
  const double bwd = time_ms([&] {
    cpu::gated_delta_chunk_bwd<float>(r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(),
                                      r.dbeta.data(), r.dh0.data(), in.dout.data(), in.q.data(),
                                      in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                      nullptr, in.cu.data(), s);
  });
  const double rec = time_ms([&] {
    cpu::gated_delta_recurrent_fwd<float>(r.out.data(), r.final_state.data(), in.q.data(),
                                          in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                          nullptr, in.cu.data(), s);
  });
  WARN("chunked fwd " << fwd << " ms, bwd " << bwd << " ms; recurrent fwd " << rec << " ms");
}
