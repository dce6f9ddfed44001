// GPU op benchmark (CUDA events, median of several runs after a warm-up), each line with a
// reference from the same run:
//  * GEMM (bf16 in, fp32 accumulate): our linear() on CUDA tensors vs a direct cuBLASLt call of
//    the same shape (default heuristic, 32 MiB workspace): TFLOP/s and the ratio;
//  * attention (one causal document, bf16, 16 query / 8 kv heads) at 4k and 8k tokens, head dim
//    128, and 8k tokens at head dim 256: forward and backward TFLOP/s (causal FLOPs: fwd
//    2·T²·D·Hq, bwd 2.5×fwd) of the own flash kernels and of cuDNN's fused attention (the bf16
//    default, kernels/attention_cudnn.h; its speed over the own kernel's, target >= 5); then
//    torch's cuDNN SDPA on the same shapes in the same run (bench/bench_attention_torch.py
//    --device cuda --sdpa-backend cudnn, a child process while this one waits), each with the
//    ratio torch time / our time for the backend the op uses (>= 1: ours faster; target >= 0.9);
//  * RMSNorm forward on CUDA: GB/s (read x + write y) vs a device-to-device copy of the same bytes.
// Everything runs on the current stream of cuda:0. Prints one table; an op without a CUDA kernel
// yet prints "n/a" with the reason; the torch rows say why when torch or its GPU is missing.
//   bench_gpu_ops [--quick] [--torch-script PATH] [--python PYTHON] [--no-torch]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/record.h"
#include "bench/timing.h"
#include "kernels/attention.h"
#include "kernels/attention_cudnn.h"
#include "kernels/gpu_runtime.h"
#include "src/core/ops.h"
#include "src/core/ops/norm.h"
#include "src/core/stream.h"
#include "src/core/varlen.h"

using namespace vlm;

namespace {

#define BENCH_CUDA(expr)                                                                           \
  do {                                                                                             \
    cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess) VLM_FAIL(#expr, ": ", cudaGetErrorString(e_));                          \
  } while (0)
#define BENCH_CUBLAS(expr)                                                                         \
  do {                                                                                             \
    cublasStatus_t s_ = (expr);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) VLM_FAIL(#expr, ": ", cublasGetStatusString(s_));             \
  } while (0)

// The stream every launch of this benchmark goes to (ops use it as their current stream).
void* stream() { return current_stream(Device::cuda(0)).handle(); }

// Median seconds of `repeats` runs of fn after one warm-up, timed by events on the current stream
// (bench/timing.h).
double median_seconds(int repeats, const std::function<void()>& fn) {
  return bench::Timer(Device::cuda(0)).median_seconds({1, repeats}, fn);
}

// A table row and its common record (metric: the unit without "/": "TFLOPs", "GBps"; reference:
// the rate of the reference run where there is one).
void row(const std::string& name, const std::string& shape, double sec, double rate,
         const char* unit, const std::string& ref, std::optional<double> ref_rate = {}) {
  std::printf("| %-24s | %-30s | %9.3f ms | %8.2f %-7s | %-34s |\n", name.c_str(), shape.c_str(),
              sec * 1e3, rate, unit, ref.c_str());
  std::string metric = unit;
  metric.erase(std::remove(metric.begin(), metric.end(), '/'), metric.end());
  bench::emit("bench_gpu_ops", name + " " + shape, "1", "cuda:0", metric, rate, ref_rate);
}

std::string fmt(const char* f, double a, double b = 0) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

// Raw cuBLASLt: row-major C[M,N] = A[M,K] · W[N,K]^T in bf16 with fp32 compute, which is
// column-major C^T[N,M] = W · A^T: cuBLASLt's A = W (op T, stored [K,N] col-major), B = A (op N).
struct RawGemm {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* workspace = nullptr;
  size_t ws_bytes = size_t(32) << 20;
  RawGemm(int64_t M, int64_t N, int64_t K) {
    BENCH_CUBLAS(cublasLtCreate(&handle));
    BENCH_CUDA(cudaMalloc(&workspace, ws_bytes));
    BENCH_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(K), uint64_t(N), K));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(K), uint64_t(M), K));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, uint64_t(N), uint64_t(M), N));
    cublasLtMatmulPreference_t pref = nullptr;
    BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = ws_bytes;
    BENCH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    BENCH_CUBLAS(
        cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, 1, &result, &found));
    VLM_CHECK(found > 0, "no cuBLASLt algorithm");
    algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(void* c, const void* a, const void* w) {
    const float alpha = 1.f, beta = 0.f;
    BENCH_CUBLAS(cublasLtMatmul(handle, desc, &alpha, w, la, a, lb, &beta, c, lc, c, lc, &algo,
                                workspace, ws_bytes, static_cast<cudaStream_t>(stream())));
  }
  ~RawGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(workspace);
    cublasLtDestroy(handle);
  }
};

void bench_gemm(int64_t M, int64_t N, int64_t K, int repeats) {
  const Device gpu = Device::cuda(0);
  Rng rng(1);
  Tensor x = Tensor::randn({M, K}, rng, DType::bf16, 0.1).to(gpu);
  Tensor w = Tensor::randn({N, K}, rng, DType::bf16, 0.1).to(gpu);
  Tensor c = Tensor::empty({M, N}, DType::bf16, gpu);
  NoGradGuard no_grad;
  const double flops = 2.0 * double(M) * double(N) * double(K);
  const double ours = median_seconds(repeats, [&] { linear(x, w, Tensor()); });
  RawGemm raw(M, N, K);
  const double ref =
      median_seconds(repeats, [&] { raw.run(c.data_ptr(), x.data_ptr(), w.data_ptr()); });
  const std::string shape = fmt("M=%.0f N=%.0f", double(M), double(N)) + fmt(" K=%.0f", double(K));
  row("gemm bf16 (linear)", shape, ours, flops / ours / 1e12, "TFLOP/s",
      fmt("cuBLASLt %.1f TFLOP/s, ratio %.2f", flops / ref / 1e12, ref / ours), flops / ref / 1e12);
}

// Our attention timings, for the torch rows after them.
struct AttentionTiming {
  int64_t T, Hq, Hkv, D;
  double fwd, bwd; // seconds
};
std::vector<AttentionTiming>& attention_timings() {
  static std::vector<AttentionTiming> t;
  return t;
}

// cuDNN's fused attention on the shape (ragged layout of one document, buffers with the spare
// rows it needs), forward and backward seconds; {0, 0} with a row saying why when it cannot run.
std::pair<double, double> time_cudnn_attention(const kernels::AttentionShape& s, int repeats) {
  namespace ca = kernels::cudnn_attention;
  const Device gpu = Device::cuda(0);
  const ca::Capability cap = ca::cuda::capability(0);
  const ca::Choice choice = ca::choose_backend(cap, s, DType::bf16, ca::Request::automatic);
  const std::string shape = fmt("T=%.0f Hq=16 Hkv=8 D=%.0f", double(s.tokens), double(s.head_dim));
  if (choice.backend != ca::Backend::cudnn) {
    std::printf("| %-24s | %-30s | n/a (%s)\n", "cuDNN attention", shape.c_str(),
                choice.reason.c_str());
    return {0, 0};
  }
  const std::vector<int32_t> cu = {0, int32_t(s.tokens)};
  const ca::RaggedLayout layout = ca::ragged_layout(cu.data(), s);
  const ca::PlanKey key =
      ca::plan_key(s, layout.size_class(), cap.sm, ca::deterministic_requested());
  const std::vector<uint8_t> image = ca::ragged_device_bytes(layout);
  Tensor ragged = Tensor::from_vector<uint8_t>(image, {int64_t(image.size())}).to(gpu);
  const int64_t rows = s.tokens + layout.spare_rows;
  Rng rng(4);
  // Random tokens, zero spare rows (the padding sequences and tile slack read them), as the op.
  auto rand_rows = [&](int64_t heads) {
    Tensor t = Tensor::zeros({rows, heads, s.head_dim}, DType::bf16);
    const Tensor r = Tensor::randn({s.tokens, heads, s.head_dim}, rng, DType::bf16);
    std::copy_n(r.data<bf16>(), r.numel(), t.data<bf16>());
    return t.to(gpu);
  };
  Tensor q = rand_rows(s.q_heads), k = rand_rows(s.kv_heads), v = rand_rows(s.kv_heads),
         dout = rand_rows(s.q_heads);
  Tensor out = Tensor::zeros(q.shape(), DType::bf16, gpu),
         dq = Tensor::empty(q.shape(), DType::bf16, gpu),
         dk = Tensor::empty(k.shape(), DType::bf16, gpu),
         dv = Tensor::empty(v.shape(), DType::bf16, gpu);
  Tensor lse = Tensor::zeros({rows, s.q_heads}, DType::f32, gpu);
  std::string why;
  auto forward = [&] {
    why = ca::cuda::sdpa_fwd(out.data<bf16>(), lse.data<float>(), q.data<bf16>(), k.data<bf16>(),
                             v.data<bf16>(), ragged.data_ptr(), key, stream());
  };
  auto backward = [&] {
    why = ca::cuda::sdpa_bwd(dq.data<bf16>(), dk.data<bf16>(), dv.data<bf16>(), dout.data<bf16>(),
                             q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), out.data<bf16>(),
                             lse.data<float>(), ragged.data_ptr(), key, stream());
  };
  forward(); // builds the plans outside the timing
  if (why.empty()) backward();
  if (!why.empty()) {
    std::printf("| %-24s | %-30s | n/a (%s)\n", "cuDNN attention", shape.c_str(), why.c_str());
    return {0, 0};
  }
  return {median_seconds(repeats, forward), median_seconds(repeats, backward)};
}

void bench_attention(int64_t T, int64_t D, int repeats) {
  const Device gpu = Device::cuda(0);
  const int64_t Hq = 16, Hkv = 8;
  Rng rng(2);
  Tensor q = Tensor::randn({T, Hq, D}, rng, DType::bf16).to(gpu);
  Tensor k = Tensor::randn({T, Hkv, D}, rng, DType::bf16).to(gpu);
  Tensor v = Tensor::randn({T, Hkv, D}, rng, DType::bf16).to(gpu);
  Tensor dout = Tensor::randn({T, Hq, D}, rng, DType::bf16).to(gpu);
  Tensor out = Tensor::empty({T, Hq, D}, DType::bf16, gpu);
  Tensor dq = Tensor::empty(q.shape(), DType::bf16, gpu),
         dk = Tensor::empty(k.shape(), DType::bf16, gpu),
         dv = Tensor::empty(v.shape(), DType::bf16, gpu);
  Tensor lse = Tensor::empty({T, Hq}, DType::f32, gpu);
  const std::vector<int32_t> cu = {0, int32_t(T)};
  kernels::AttentionShape s;
  s.tokens = T;
  s.q_heads = Hq;
  s.kv_heads = Hkv;
  s.head_dim = D;
  s.docs = 1;
  s.causal = true;
  s.scale = 1.0 / std::sqrt(double(D));
  const double fwd_flops = 2.0 * double(T) * double(T) * double(D) * double(Hq); // causal half
  // The tile lists, uploaded once as in training (src/core/varlen.h).
  const VarlenLayout varlen = VarlenLayout::of(Tensor::from_vector(cu, {2}), T);
  const kernels::FlashTileSpecs specs = kernels::flash_tile_specs(s, DType::bf16);
  const kernels::TileList query_tiles = varlen.attention_tiles(gpu, specs.queries),
                          key_tiles = varlen.attention_tiles(gpu, specs.keys);
  const double fwd = median_seconds(repeats, [&] {
    kernels::cuda::attention_fwd<bf16>(out.data<bf16>(), lse.data<float>(), q.data<bf16>(),
                                       k.data<bf16>(), v.data<bf16>(), query_tiles, s, stream());
  });
  const double bwd = median_seconds(repeats, [&] {
    kernels::cuda::attention_bwd<bf16>(dq.data<bf16>(), dk.data<bf16>(), dv.data<bf16>(),
                                       dout.data<bf16>(), q.data<bf16>(), k.data<bf16>(),
                                       v.data<bf16>(), out.data<bf16>(), lse.data<float>(),
                                       key_tiles, query_tiles, s, stream());
  });
  const std::string shape = fmt("T=%.0f Hq=16 Hkv=8 D=%.0f", double(T), double(D));
  const auto [cudnn_fwd, cudnn_bwd] = time_cudnn_attention(s, repeats);
  // H100 anchors (docs/performance-anchors.md §D, causal, hdim 128): FA2 fwd 319 / 333 and
  // FA3 fwd 579 / 602 TFLOP/s at 4k / 8k; FA2 bwd 310 / 318, FA3 bwd 542 / 559.
  const bool k8 = T >= 8192;
  const bool d128 = D == 128;
  row("attention fwd (causal)", shape, fwd, fwd_flops / fwd / 1e12, "TFLOP/s",
      !d128 ? "torch SDPA below"
      : k8  ? "H100 FA2 333, FA3 602"
            : "H100 FA2 319, FA3 579");
  row("attention bwd (causal)", shape, bwd, 2.5 * fwd_flops / bwd / 1e12, "TFLOP/s",
      !d128 ? "torch SDPA below"
      : k8  ? "H100 FA2 318, FA3 559"
            : "H100 FA2 310, FA3 542");
  if (cudnn_fwd > 0) {
    row("cuDNN attention fwd", shape, cudnn_fwd, fwd_flops / cudnn_fwd / 1e12, "TFLOP/s",
        fmt("%.1fx the own kernel (target >= 5)", fwd / cudnn_fwd), fwd_flops / fwd / 1e12);
    row("cuDNN attention bwd", shape, cudnn_bwd, 2.5 * fwd_flops / cudnn_bwd / 1e12, "TFLOP/s",
        fmt("%.1fx the own kernel (target >= 5)", bwd / cudnn_bwd), 2.5 * fwd_flops / bwd / 1e12);
  }
  // What the op runs for bf16 is what torch is compared with.
  if (cudnn_fwd > 0)
    attention_timings().push_back({T, Hq, Hkv, D, cudnn_fwd, cudnn_bwd});
  else
    attention_timings().push_back({T, Hq, Hkv, D, fwd, bwd});
}

// The number after "key": in one JSON line (NaN when absent): enough for the script's flat output.
double json_number(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
  return std::strtod(line.c_str() + at + key.size() + 3, nullptr);
}

// torch SDPA on the shapes timed above (bench_attention_torch.py --device cuda), one row each for
// forward and backward with the ratio torch time / ours, then the worst ratio.
void compare_attention_with_torch(const std::string& python, const std::string& script,
                                  int repeats) {
  const auto& ours = attention_timings();
  if (ours.empty()) return;
  std::string cmd = python + " '" + script + "' --device cuda --sdpa-backend cudnn --reps " +
                    std::to_string(repeats) + " --shapes";
  for (const AttentionTiming& t : ours)
    cmd += " " + std::to_string(t.T) + ":" + std::to_string(t.Hq) + ":" + std::to_string(t.Hkv) +
           ":" + std::to_string(t.D);
  cmd += " 2>&1";
  std::fflush(stdout);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    std::printf("| %-24s | n/a (cannot start %s)\n", "torch SDPA", cmd.c_str());
    return;
  }
  std::vector<std::string> lines;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) lines.emplace_back(buf);
  const int status = pclose(p);
  double worst = std::numeric_limits<double>::infinity();
  int compared = 0;
  for (const AttentionTiming& t : ours) {
    const std::string shape =
        fmt("T=%.0f Hq=16 Hkv=8 D=%.0f", double(t.T), double(t.D)); // as our rows
    const std::string key = fmt("\"T\": %.0f, \"hq\": %.0f", double(t.T), double(t.Hq)) +
                            fmt(", \"hkv\": %.0f, \"d\": %.0f,", double(t.Hkv), double(t.D));
    const auto it = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.find(key) != std::string::npos && l.find("\"fwd_ms\"") != std::string::npos;
    });
    if (it == lines.end()) continue;
    const double fwd_flops = 2.0 * double(t.T) * double(t.T) * double(t.D) * double(t.Hq);
    const double tf = json_number(*it, "fwd_ms") * 1e-3, tb = json_number(*it, "bwd_ms") * 1e-3;
    row("torch SDPA fwd (causal)", shape, tf, fwd_flops / tf / 1e12, "TFLOP/s",
        fmt("ours / torch speed %.2f (target >= 0.9)", tf / t.fwd));
    row("torch SDPA bwd (causal)", shape, tb, 2.5 * fwd_flops / tb / 1e12, "TFLOP/s",
        fmt("ours / torch speed %.2f (target >= 0.9)", tb / t.bwd));
    // Ours (what the op runs for bf16) against torch's SDPA.
    bench::emit("bench_gpu_ops", "attention fwd (causal) vs torch SDPA " + shape, "1", "cuda:0",
                "TFLOPs", fwd_flops / t.fwd / 1e12, fwd_flops / tf / 1e12);
    bench::emit("bench_gpu_ops", "attention bwd (causal) vs torch SDPA " + shape, "1", "cuda:0",
                "TFLOPs", 2.5 * fwd_flops / t.bwd / 1e12, 2.5 * fwd_flops / tb / 1e12);
    const size_t b = it->find("\"sdpa_backend\": \"");
    if (b != std::string::npos)
      std::printf("|   torch SDPA backend: %s\n",
                  it->substr(b + 17, it->find('"', b + 17) - b - 17).c_str());
    worst = std::min({worst, tf / t.fwd, tb / t.bwd});
    compared++;
  }
  if (compared == 0) {
    std::string why = lines.empty() ? "no output" : lines.back();
    while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
    std::printf("| %-24s | n/a (exit status %d): %s\n", "torch SDPA", status, why.c_str());
    return;
  }
  const std::string& first = lines.front();
  const size_t at = first.find("\"torch\":");
  std::printf("attention vs torch SDPA: worst ours / torch speed %.2f over %d shapes (fwd and bwd)"
              "%s\n",
              worst, compared,
              at == std::string::npos ? ""
                                      : (", " + first.substr(at, first.find('}') - at)).c_str());
}

void bench_rmsnorm(int64_t rows, int64_t hidden, int repeats) {
  const Device gpu = Device::cuda(0);
  Rng rng(3);
  Tensor x = Tensor::randn({rows, hidden}, rng, DType::bf16).to(gpu);
  Tensor w = Tensor::randn({hidden}, rng, DType::bf16).to(gpu);
  Tensor y = Tensor::empty(x.shape(), DType::bf16, gpu);
  const double bytes = 2.0 * double(x.nbytes());
  const double copy = median_seconds(repeats, [&] {
    kernels::cuda::memcpy_d2d(y.data_ptr(), x.data_ptr(), x.nbytes(), stream());
  });
  const std::string shape = fmt("rows=%.0f hidden=%.0f", double(rows), double(hidden));
  NoGradGuard no_grad;
  try {
    const double ours = median_seconds(repeats, [&] { rms_norm(x, w, 1e-6); });
    row("rmsnorm fwd bf16", shape, ours, bytes / ours / 1e9, "GB/s",
        fmt("d2d copy %.0f GB/s, ratio %.2f", bytes / copy / 1e9, copy / ours), bytes / copy / 1e9);
  } catch (const Error& e) {
    std::printf("| %-24s | %-30s | n/a (%s)\n", "rmsnorm fwd bf16", shape.c_str(), e.what());
  }
}

struct Options {
  bool quick = false, no_torch = false;
  std::string python = "python3";
  // Beside this source file: the build runs where the tree is (tools/gpu/gpu_check.sh).
  std::string torch_script =
      std::string(__FILE__).substr(0, std::string(__FILE__).find_last_of('/') + 1) +
      "bench_attention_torch.py";
};

int run(const Options& o) {
  const bool quick = o.quick;
  if (kernels::cuda::device_count() == 0) {
    std::printf("bench_gpu_ops: %s\n", kernels::cuda::device_query().c_str());
    return 0;
  }
  const int repeats = quick ? 3 : 10;
  std::printf("| %-24s | %-30s | %12s | %16s | %-34s |\n", "op", "shape", "time", "rate",
              "reference");
  try {
    bench_gemm(4096, 4096, 4096, repeats);
    bench_gemm(8192, 4096, 12288, repeats);
    bench_attention(4096, 128, quick ? 2 : 5);
    bench_attention(8192, 128, quick ? 2 : 3);
    bench_attention(8192, 256, quick ? 2 : 3);
    bench_rmsnorm(16384, 4096, repeats);
    synchronize_device(Device::cuda(0));
    if (!o.no_torch) compare_attention_with_torch(o.python, o.torch_script, quick ? 2 : 5);
  } catch (const Error& e) {
    std::printf("bench_gpu_ops: failed: %s\n", e.what());
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU op benchmark: GEMM, attention and RMSNorm against references of the same "
               "run.",
               "bench_gpu_ops"};
  cli::show_defaults(app);
  Options o;
  app.add_flag("--quick", o.quick, "fewer runs of each op");
  app.add_flag("--no-torch", o.no_torch, "leave out torch SDPA on the attention shapes");
  app.add_option("--python", o.python, "the Python that imports torch");
  app.add_option("--torch-script", o.torch_script, "bench/bench_attention_torch.py");
  return bench::run_main(app, argc, argv, [&] { return run(o); });
}
