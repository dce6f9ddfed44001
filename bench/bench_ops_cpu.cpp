// CPU op benchmark: GFLOP/s of matmul (linear), attention (forward and backward, causal, up to
// 4096 tokens) and RMSNorm (forward and backward, GB/s next to a parallel copy of the same bytes)
// at transformer-like shapes, our linear() against a direct cblas_sgemm of the same shape in
// the same run, and the fused add_rms_norm / rms_norm_rope ops against the primitive op
// sequences they replace (forward + backward through autograd, f32). bench/bench_ops_cpu.sh puts
// torch's scaled_dot_product_attention on the same attention shapes next to it.
//   bench_ops_cpu [--quick]        (--quick: fewer shapes and runs; threads: OMP_NUM_THREADS /
//                                   OPENBLAS_NUM_THREADS)
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/record.h"
#include "bench/timing.h"
#include "kernels/norm.h"
#include "src/core/autograd.h"
#include "src/core/ops.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/norm.h"
#include "src/core/ops/rope.h"

using namespace vlm;

namespace {

// Median seconds of fn's timed runs (bench/timing.h).
double median_seconds(const bench::Timing& timing, const std::function<void()>& fn) {
  return bench::Timer().median_seconds(timing, fn);
}

void row(const char* name, const char* shape, double flops, double sec, const char* extra = "") {
  std::printf("%-22s %-34s %9.3f ms %9.2f GFLOP/s %s\n", name, shape, sec * 1e3, flops / sec / 1e9,
              extra);
}

// The common record of one op and shape (bench/record.h).
void record(const char* name, const char* shape, const char* metric, double value,
            std::optional<double> reference = {}) {
  bench::emit("bench_ops_cpu", std::string(name) + " " + shape, "1", "cpu", metric, value,
              reference);
}

// Our linear() against cblas_sgemm on the same buffers; returns the worst ratio (BLAS time / ours).
double bench_linear(bool quick, const bench::Timing& timing, Rng& rng) {
  struct MM {
    int64_t rows, in, out;
  };
  std::vector<MM> mms =
      quick ? std::vector<MM>{{512, 512, 1536}}
            : std::vector<MM>{{1024, 1024, 3072}, {2048, 1024, 1024}, {1024, 2048, 2048}};
  double worst_ratio = 1e9;
  for (auto [rows, in, out] : mms) {
    Tensor x = Tensor::randn({rows, in}, rng), w = Tensor::randn({out, in}, rng, DType::f32, 0.02);
    Tensor y;
    double ours = median_seconds(timing, [&] { y = linear(x, w); });
    std::vector<float> c(size_t(rows * out));
    double blas = median_seconds(timing, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(out), int(in), 1.f,
                  x.data<float>(), int(in), w.data<float>(), int(in), 0.f, c.data(), int(out));
    });
    double flops = 2.0 * double(rows) * double(in) * double(out);
    char shape[64], extra[64];
    std::snprintf(shape, sizeof shape, "x[%lld,%lld] w[%lld,%lld]", (long long)rows, (long long)in,
                  (long long)out, (long long)in);
    double ratio = blas / ours;
    worst_ratio = std::min(worst_ratio, ratio);
    std::snprintf(extra, sizeof extra, "vs cblas_sgemm %.2f GFLOP/s: ratio %.3f",
                  flops / blas / 1e9, ratio);
    row("linear f32", shape, flops, ours, extra);
    record("linear f32", shape, "GFLOPs", flops / ours / 1e9, flops / blas / 1e9);
  }
  return worst_ratio;
}

// Attention (causal, packed documents): forward, and backward (fwd + bwd minus fwd).
void bench_attention(bool quick, const bench::Timing& timing, Rng& rng) {
  struct Att {
    int64_t docs, len, hq, hkv, d;
  };
  std::vector<Att> atts = quick ? std::vector<Att>{{2, 256, 4, 2, 64}}
                                : std::vector<Att>{{1, 1024, 8, 4, 64},
                                                   {2, 1024, 8, 8, 128},
                                                   {1, 4096, 8, 4, 64},
                                                   {1, 4096, 8, 8, 128}};
  for (auto [docs, len, hq, hkv, d] : atts) {
    int64_t T = docs * len;
    Tensor q = Tensor::randn({T, hq, d}, rng), k = Tensor::randn({T, hkv, d}, rng),
           v = Tensor::randn({T, hkv, d}, rng), dout = Tensor::randn({T, hq, d}, rng);
    std::vector<int32_t> cu;
    for (int64_t i = 0; i <= docs; i++) cu.push_back(int32_t(i * len));
    Tensor cu_seqlens = Tensor::from_vector(cu, {docs + 1});
    const double scale = 1.0 / std::sqrt(double(d));
    double fwd = median_seconds(timing, [&] { attention(q, k, v, cu_seqlens, true, scale); });
    double both = median_seconds(timing, [&] {
      EnableGradGuard grad;
      Tensor ql = q.detach().set_requires_grad(true), kl = k.detach().set_requires_grad(true),
             vl = v.detach().set_requires_grad(true);
      run_backward({attention(ql, kl, vl, cu_seqlens, true, scale)}, {dout});
    });
    // Causal: half of the QK^T and PV products (2 GEMMs of 2·L²·D FLOPs each); the backward has
    // 5 such products (flash attention's count: 2.5x the forward).
    double flops = double(docs) * double(hq) * 4.0 * double(len) * double(len) * double(d) / 2.0;
    char shape[64];
    std::snprintf(shape, sizeof shape, "%lldx%lld tok, Hq%lld Hkv%lld D%lld", (long long)docs,
                  (long long)len, (long long)hq, (long long)hkv, (long long)d);
    row("attention fwd causal", shape, flops, fwd);
    row("attention bwd causal", shape, 2.5 * flops, std::max(both - fwd, 1e-9));
    record("attention fwd causal", shape, "GFLOPs", flops / fwd / 1e9);
    record("attention bwd causal", shape, "GFLOPs", 2.5 * flops / std::max(both - fwd, 1e-9) / 1e9);
  }
}

// RMSNorm kernels, forward and backward, next to a plain copy of the same bytes; returns the worst
// ratio (copy time / kernel time).
double bench_rms_norm(bool quick, const bench::Timing& timing, Rng& rng) {
  // Bandwidth-bound: the figure of merit is bytes moved per second against what a parallel copy
  // loop of as many bytes reaches in the same run (forward: read x, write y; backward: read x and
  // dy, write dx; the weight and per-row scalars are negligible). The kernels are called on
  // preallocated buffers, as the op does (autograd adds no pass over the data).
  double worst_norm = 1e9;
  for (int64_t rows : {quick ? int64_t(1024) : int64_t(4096)}) {
    for (int64_t dim : {int64_t(1024), int64_t(4096)}) {
      const int64_t n = rows * dim;
      std::vector<float> x(n), dy(n), y(n), dx(n), rstd(rows);
      std::vector<float> w(size_t(dim), 1.0f), src(size_t(3 * n), 1.0f), dst(size_t(3 * n));
      for (int64_t i = 0; i < n; i++) {
        x[size_t(i)] = float(rng.normal());
        dy[size_t(i)] = float(rng.normal());
      }
      auto copy_seconds = [&](int64_t count) {
        return median_seconds(timing, [&] {
          const float* a = src.data();
          float* b = dst.data();
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < count; i++) b[i] = a[i];
        });
      };
      const double copy2 = copy_seconds(n), copy3 = copy_seconds(3 * n / 2);
      const auto mode = kernels::RmsNormWeight::scale;
      const double fwd = median_seconds(timing, [&] {
        kernels::cpu::rms_norm_fwd<float>(y.data(), rstd.data(), x.data(), w.data(), mode, rows,
                                          dim, 1e-6);
      });
      const double bwd = median_seconds(timing, [&] {
        kernels::cpu::rms_norm_bwd<float>(dx.data(), nullptr, dy.data(), x.data(), w.data(),
                                          rstd.data(), mode, rows, dim);
      });
      const double bytes = 4.0 * double(n);
      char shape[64], extra[128];
      std::snprintf(shape, sizeof shape, "x[%lld,%lld]", (long long)rows, (long long)dim);
      std::snprintf(extra, sizeof extra, "%.2f GB/s, copy %.2f GB/s: ratio %.2f",
                    2 * bytes / fwd / 1e9, 2 * bytes / copy2 / 1e9, copy2 / fwd);
      row("rms_norm fwd f32", shape, 4.0 * double(n), fwd, extra);
      std::snprintf(extra, sizeof extra, "%.2f GB/s, copy %.2f GB/s: ratio %.2f",
                    3 * bytes / bwd / 1e9, 3 * bytes / copy3 / 1e9, copy3 / bwd);
      row("rms_norm bwd f32", shape, 6.0 * double(n), bwd, extra);
      // A copy of as many bytes is the reference.
      record("rms_norm fwd f32", shape, "GBps", 2 * bytes / fwd / 1e9, 2 * bytes / copy2 / 1e9);
      record("rms_norm bwd f32", shape, "GBps", 3 * bytes / bwd / 1e9, 3 * bytes / copy3 / 1e9);
      worst_norm = std::min({worst_norm, copy2 / fwd, copy3 / bwd});
    }
  }
  return worst_norm;
}

// The fused ops against the primitive sequences they replace, forward and backward through
// autograd on leaves (what a training step runs): residual add + RMSNorm at a decoder layer's
// [tokens, hidden], q RMSNorm + RoPE at Qwen3's [tokens, 16 heads, 128].
void bench_fused(bool quick, const bench::Timing& timing, Rng& rng) {
  EnableGradGuard grad;
  const int64_t tokens = quick ? 512 : 2048, hidden = 2048, heads = 16, head_dim = 128;
  auto report = [](const char* name, const char* shape, double fused, double prim) {
    char extra[96];
    std::snprintf(extra, sizeof extra, "primitive %.3f ms: speedup %.2fx", prim * 1e3,
                  prim / fused);
    std::printf("%-22s %-34s %9.3f ms %17s %s\n", name, shape, fused * 1e3, "", extra);
    record(name, shape, "ms", fused * 1e3, prim * 1e3); // the primitive sequence is the reference
  };
  {
    Tensor x = Tensor::randn({tokens, hidden}, rng), h = Tensor::randn({tokens, hidden}, rng);
    Tensor w = Tensor::randn({hidden}, rng, DType::f32, 0.1, 1.0);
    Tensor gs = Tensor::randn({tokens, hidden}, rng), gy = Tensor::randn({tokens, hidden}, rng);
    auto leaves = [&] {
      std::vector<Tensor> l;
      for (const Tensor* t : {&x, &h, &w}) {
        Tensor c = t->detach();
        c.set_requires_grad(true);
        l.push_back(c);
      }
      return l;
    };
    const double fused = median_seconds(timing, [&] {
      auto l = leaves();
      auto [s, y] = add_rms_norm(l[0], l[1], l[2], 1e-6);
      run_backward({s, y}, {gs, gy});
    });
    const double prim = median_seconds(timing, [&] {
      auto l = leaves();
      Tensor s = add(l[0], l[1]);
      Tensor y = rms_norm(s, l[2], 1e-6);
      run_backward({s, y}, {gs, gy});
    });
    char shape[64];
    std::snprintf(shape, sizeof shape, "x,h[%lld,%lld] fwd+bwd", (long long)tokens,
                  (long long)hidden);
    report("add_rms_norm f32", shape, fused, prim);
  }
  {
    Tensor q = Tensor::randn({tokens, heads, head_dim}, rng);
    Tensor w = Tensor::randn({head_dim}, rng, DType::f32, 0.1, 1.0);
    Tensor gy = Tensor::randn({tokens, heads, head_dim}, rng);
    std::vector<int64_t> pos(static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; t++) pos[size_t(t)] = t;
    const RopeTables tables =
        rope_tables(Tensor::from_vector(pos, {tokens}), head_dim, 1e6, DType::f32);
    auto leaves = [&] {
      Tensor a = q.detach(), b = w.detach();
      a.set_requires_grad(true);
      b.set_requires_grad(true);
      return std::vector<Tensor>{a, b};
    };
    const double fused = median_seconds(timing, [&] {
      auto l = leaves();
      run_backward({rms_norm_rope(l[0], l[1], 1e-6, tables)}, {gy});
    });
    const double prim = median_seconds(timing, [&] {
      auto l = leaves();
      run_backward({rope(rms_norm(l[0], l[1], 1e-6), tables)}, {gy});
    });
    char shape[64];
    std::snprintf(shape, sizeof shape, "q[%lld,%lld,%lld] fwd+bwd", (long long)tokens,
                  (long long)heads, (long long)head_dim);
    report("rms_norm_rope f32", shape, fused, prim);
  }
}

int run(bool quick, const bench::Timing& timing) {
  NoGradGuard no_grad;
  Rng rng(0);
  std::printf("%-22s %-34s %12s %17s\n", "op", "shape", "median", "throughput");
  const double worst_ratio = bench_linear(quick, timing, rng);
  bench_attention(quick, timing, rng);
  const double worst_norm = bench_rms_norm(quick, timing, rng);
  bench_fused(quick, timing, rng);
  std::printf("\nlinear vs cblas_sgemm, worst ratio: %.3f (target >= 0.95)\n", worst_ratio);
  std::printf("rms_norm vs copy bandwidth, worst ratio: %.2f (target >= 0.5)\n", worst_norm);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU op benchmark: matmul, attention and RMSNorm against references of the same "
               "run.",
               "bench_ops_cpu"};
  cli::show_defaults(app);
  bool quick = false;
  bench::Timing timing{1, 7};
  app.add_flag("--quick", quick, "fewer shapes, and 3 timed runs unless --reps says");
  bench::add_timing_options(app, timing, "--reps", "runs per measurement");
  return bench::run_main(app, argc, argv, [&] {
    if (quick && app.count("--reps") == 0) timing.iters = 3;
    return run(quick, timing);
  });
}
