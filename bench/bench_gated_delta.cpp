// The gated delta rule op (Qwen3.5's Gated DeltaNet core, src/core/ops/gated_delta.h) on CPU, f32:
// forward alone (no graph) and forward + backward through the autograd engine (gradients of q,
// k, v, g and beta), on 4096 tokens as one document and as 4 documents of 1024, at head counts of
// 9B's ratios scaled down: HK 4, HV 8, dk = dv = 128 (9B: 16 / 32 / 128) and HK 2, HV 4,
// dk = dv = 64. bench/bench_gated_delta.sh puts transformers' torch_chunk_gated_delta_rule on the
// same inputs next to it (bench_gated_delta_torch.py, which reads the rows and the --inputs files).
//
// Inputs (seeded): q, k = l2_normalize(N(0, 1)) (as the layer feeds the op), v and the upstream
// gradient N(0, 1), beta = sigmoid(N(0, 1)), g = -A_h · softplus(a + dt_h) with per-head
// A_h = U(0.5, 8), dt_h = U(-4, 1) and a = N(0, 1) per token (tools/golden/gen_qwen3_5.py's
// ranges; here g from -0.006 to -28, per-head means -0.3 to -5.5: strong decays, with which
// torch's chunked fallback, unlike our kernels, computes on subnormals). scale = dk^-0.5.
//
//   bench_gated_delta [--quick] [--reps R] [--inputs DIR]   (threads: OMP_NUM_THREADS)
// Rows: "gated_delta fwd|fwd+bwd  DxL tok, HKa HVb dkc dvd  X ms  Y ktok/s", the median of R runs
// after one warm-up. --inputs DIR writes each head shape's inputs (q, k, v, g, beta, dout over all
// the tokens; the layouts of documents share them) to DIR/gated_delta_HKa_HVb_dkc_dvd.safetensors.
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/record.h"
#include "bench/timing.h"
#include "io/state/safetensors.h"
#include "src/base/rng.h"
#include "src/core/autograd.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/gated_delta.h"
#include "src/core/ops/norm.h"

using namespace vlm;

namespace {

struct Options {
  bool quick = false;
  bench::Timing timing{1, 5};
  std::string inputs_dir;
};

struct Heads {
  int64_t hk, hv, dk, dv;
};

struct Inputs {
  Tensor q, k, v, g, beta, dout;
};

double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

Inputs make_inputs(int64_t T, const Heads& h, Rng& rng) {
  NoGradGuard no_grad;
  Inputs in;
  in.q = l2_normalize(Tensor::randn({T, h.hk, h.dk}, rng), 1e-6).contiguous();
  in.k = l2_normalize(Tensor::randn({T, h.hk, h.dk}, rng), 1e-6).contiguous();
  in.v = Tensor::randn({T, h.hv, h.dv}, rng);
  in.beta = sigmoid(Tensor::randn({T, h.hv}, rng));
  in.dout = Tensor::randn({T, h.hv, h.dv}, rng);
  std::vector<double> a_h(size_t(h.hv)), dt_h(size_t(h.hv)), g(size_t(T * h.hv));
  for (int64_t j = 0; j < h.hv; j++) {
    a_h[size_t(j)] = rng.uniform(0.5, 8.0);
    dt_h[size_t(j)] = rng.uniform(-4.0, 1.0);
  }
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < h.hv; j++)
      g[size_t(t * h.hv + j)] = -a_h[size_t(j)] * softplus(rng.normal() + dt_h[size_t(j)]);
  in.g = Tensor::from_doubles(g, {T, h.hv}, DType::f32);
  return in;
}

std::string heads_name(const Heads& h) {
  char s[96];
  std::snprintf(s, sizeof s, "HK%lld HV%lld dk%lld dv%lld", (long long)h.hk, (long long)h.hv,
                (long long)h.dk, (long long)h.dv);
  return s;
}

void save_inputs(const std::string& dir, const Heads& h, const Inputs& in) {
  char file[160];
  std::snprintf(file, sizeof file, "%s/gated_delta_HK%lld_HV%lld_dk%lld_dv%lld.safetensors",
                dir.c_str(), (long long)h.hk, (long long)h.hv, (long long)h.dk, (long long)h.dv);
  std::vector<io::TensorInfo> infos;
  const std::pair<const char*, const Tensor*> named[] = {{"q", &in.q},       {"k", &in.k},
                                                         {"v", &in.v},       {"g", &in.g},
                                                         {"beta", &in.beta}, {"dout", &in.dout}};
  for (const auto& [name, t] : named)
    infos.push_back({name, DType::f32, t->shape(), t->data<float>(), t->nbytes()});
  io::write_safetensors(file, infos);
}

void row(const char* kind, int64_t docs, int64_t len, const Heads& h, double sec) {
  char shape[128];
  std::snprintf(shape, sizeof shape, "%lldx%lld tok, %s", (long long)docs, (long long)len,
                heads_name(h).c_str());
  std::printf("gated_delta %-8s %-38s %10.3f ms %9.1f ktok/s\n", kind, shape, sec * 1e3,
              double(docs * len) / sec / 1e3);
  // The reference (transformers' chunked rule) runs in bench_gated_delta.sh, which pairs them.
  vlm::bench::emit("bench_gated_delta", std::string("gated_delta ") + kind + " " + shape, "1",
                   "cpu", "ms", sec * 1e3);
  std::fflush(stdout);
}

void bench_shape(const Options& o, int64_t docs, int64_t len, const Heads& h, const Inputs& in) {
  std::vector<int32_t> cu;
  for (int64_t i = 0; i <= docs; i++) cu.push_back(int32_t(i * len));
  const Tensor cu_seqlens = Tensor::from_vector(cu, {docs + 1});
  const double scale = 1.0 / std::sqrt(double(h.dk));
  const bench::Timer timer;
  const double fwd = timer.median_seconds(o.timing, [&] {
    NoGradGuard no_grad;
    gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, cu_seqlens, scale);
  });
  const double both = timer.median_seconds(o.timing, [&] {
    EnableGradGuard grad;
    auto leaf = [](const Tensor& t) { return t.detach().set_requires_grad(true); };
    const Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v), g = leaf(in.g),
                 beta = leaf(in.beta);
    run_backward({gated_delta_rule(q, k, v, g, beta, cu_seqlens, scale)}, {in.dout});
  });
  row("fwd", docs, len, h, fwd);
  row("fwd+bwd", docs, len, h, both);
}

int run(const Options& o) {
  const int64_t T = o.quick ? 512 : 4096;
  const std::vector<Heads> heads = {{4, 8, 128, 128}, {2, 4, 64, 64}};
  Rng rng(0);
  std::printf("%-20s %-38s %13s %16s\n", "op", "shape", "median", "throughput");
  for (const Heads& h : heads) {
    const Inputs in = make_inputs(T, h, rng);
    if (!o.inputs_dir.empty()) save_inputs(o.inputs_dir, h, in);
    for (int64_t docs : {int64_t(1), int64_t(4)}) bench_shape(o, docs, T / docs, h, in);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"The gated delta rule op on CPU (f32): forward and forward + backward.",
               "bench_gated_delta"};
  cli::show_defaults(app);
  Options o;
  app.add_flag("--quick", o.quick, "512 tokens instead of 4096");
  bench::add_timing_options(app, o.timing, "--reps", "runs per measurement");
  app.add_option("--inputs", o.inputs_dir,
                 "write each head shape's inputs to this folder (for the torch side)");
  return bench::run_main(app, argc, argv, [&] { return run(o); });
}
