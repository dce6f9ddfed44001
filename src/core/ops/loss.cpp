#include "src/core/ops/loss.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"

#if VLM_WITH_CUDA
#include "kernels/cuda_gemm.h"
#include "kernels/cuda_runtime.h"
#endif

namespace vlm {

using namespace ops_detail;

namespace {

// Checks every label is in [0, vocab) or ignore_index (naming the first bad row and value) and
// returns the number of non-ignored rows. On CUDA this synchronizes (the count is needed on the
// host for the mean).
int64_t validate_labels(const char* op, const Tensor& labels, int64_t rows, int64_t vocab,
                        int64_t ignore_index, bool on_cuda, const char* what, const Tensor& t) {
  int64_t num_valid = 0;
  int64_t bad = -1;
  VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
    const I* lab = labels.data<I>();
    if (on_cuda) {
#if VLM_WITH_CUDA
      bad = kernels::cuda::check_labels<I>(lab, rows, vocab, ignore_index, &num_valid, nullptr);
#endif
    } else {
      bad = kernels::cpu::check_labels<I>(lab, rows, vocab, ignore_index, &num_valid);
    }
  });
  if (bad >= 0) {
    Tensor host = labels.to(Device::cpu()); // the error path only
    int64_t value =
        VLM_DISPATCH_INDEX(host.dtype(), op, I, [&] { return int64_t(host.data<I>()[bad]); });
    VLM_FAIL(op, ": label ", value, " at row ", bad, " is out of range [0, ", vocab, ") for ",
             describe(what, t), " (ignore_index ", ignore_index, ")");
  }
  return num_valid;
}

// Saves the logits, labels and one logsumexp per row; softmax is recomputed in backward.
struct CrossEntropyBackward final : Node {
  Tensor logits; // [rows, V], contiguous
  Tensor labels; // [rows], contiguous i32/i64
  Tensor lse;    // [rows], f32 (f64 for f64 logits)
  Shape logits_shape;
  int64_t ignore_index = -100;
  double scale = 1.0; // 1/num_valid (mean), 1 (sum), 0 when nothing is valid
  const char* name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor g_loss = g[0].to(lse.dtype()).contiguous();
    Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    int64_t rows = logits.size(0), vocab = logits.size(1);
    if (logits.device().is_cuda()) {
      with_cuda_type(logits.dtype(), "cross_entropy backward", [&](auto tag) {
        using T = decltype(tag);
        VLM_DISPATCH_INDEX(labels.dtype(), "cross_entropy backward", I, [&] {
          kernels::cuda::cross_entropy_bwd<T, I>(
              dlogits.data<T>(), logits.data<T>(), lse.data<float>(), labels.data<I>(),
              g_loss.data<float>(), scale, rows, vocab, ignore_index, nullptr);
        });
      });
      return {dlogits.as_strided(logits_shape, contiguous_strides(logits_shape), 0)};
    }
    VLM_DISPATCH_FLOAT(logits.dtype(), "cross_entropy backward", T, [&] {
      VLM_DISPATCH_INDEX(labels.dtype(), "cross_entropy backward", I, [&] {
        kernels::cpu::cross_entropy_bwd<T, I>(
            dlogits.data<T>(), logits.data<T>(), lse.data<acc_t<T>>(), labels.data<I>(),
            g_loss.data<acc_t<T>>(), scale, rows, vocab, ignore_index);
      });
    });
    return {dlogits.as_strided(logits_shape, contiguous_strides(logits_shape), 0)};
  }
  void release() override { logits = labels = lse = Tensor(); }
};

// Both entry points; the loss (mean or sum, per `reduction`) comes back in .loss_sum.
CrossEntropyResult cross_entropy_impl(const Tensor& logits_in, const Tensor& labels_in,
                                      int64_t ignore_index, Reduction reduction) {
  const char* op = "cross_entropy";
  check_float(op, "logits", logits_in);
  check_defined(op, "labels", labels_in);
  VLM_CHECK(logits_in.dim() >= 1 && logits_in.shape().back() > 0, op,
            ": logits must be [..., V] with V > 0, got ", logits_in.desc());
  VLM_CHECK(labels_in.dtype() == DType::i32 || labels_in.dtype() == DType::i64, op,
            ": labels must be i32 or i64, got ", labels_in.desc());
  Shape label_shape(logits_in.shape().begin(), logits_in.shape().end() - 1);
  VLM_CHECK(labels_in.shape() == label_shape, op, ": labels must have shape ",
            shape_str(label_shape), " to match ", describe("logits", logits_in), ", got ",
            describe("labels", labels_in));
  check_same_device(op, "logits", logits_in, "labels", labels_in);
  const bool on_cuda = logits_in.device().is_cuda();
  if (on_cuda)
    VLM_CHECK(logits_in.dtype() == DType::f32 || logits_in.dtype() == DType::bf16, op,
              ": CUDA kernels take f32 or bf16 logits, got ", logits_in.desc(),
              " (f64 runs on CPU only)");

  const int64_t vocab = logits_in.shape().back(), rows = labels_in.numel();
  Tensor contiguous_logits = logits_in.contiguous();
  Tensor logits =
      contiguous_logits.as_strided({rows, vocab}, {vocab, 1}, contiguous_logits.offset());
  Tensor labels = labels_in.contiguous();
  const int64_t num_valid =
      validate_labels(op, labels, rows, vocab, ignore_index, on_cuda, "logits", logits_in);

  const DType acc = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor row_loss = Tensor::empty({rows}, acc, logits.device());
  Tensor lse = Tensor::empty({rows}, acc, logits.device());
  if (on_cuda) {
    with_cuda_type(logits.dtype(), op, [&](auto tag) {
      using T = decltype(tag);
      VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
        kernels::cuda::cross_entropy_fwd<T, I>(row_loss.data<float>(), lse.data<float>(),
                                               logits.data<T>(), labels.data<I>(), rows, vocab,
                                               ignore_index, nullptr);
      });
    });
  } else {
    VLM_DISPATCH_FLOAT(logits.dtype(), op, T, [&] {
      VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
        kernels::cpu::cross_entropy_fwd<T, I>(row_loss.data<acc_t<T>>(), lse.data<acc_t<T>>(),
                                              logits.data<T>(), labels.data<I>(), rows, vocab,
                                              ignore_index);
      });
    });
  }
  // Rows are summed in a fixed order in double: deterministic, and no f32 drift over long batches.
  // (On CUDA the per-row losses come to the host for this: the mean needs num_valid, which the
  // label check already synchronized for, so this costs one small copy.)
  double total = 0;
  for (double v : row_loss.to_doubles()) total += v;
  double scale = 1.0;
  if (reduction == Reduction::mean) scale = num_valid > 0 ? 1.0 / double(num_valid) : 0.0;
  Tensor loss = Tensor::full({}, total * scale, acc, logits_in.device());

  if (needs_grad({&logits_in})) {
    auto node = std::make_shared<CrossEntropyBackward>();
    node->logits = logits.detach();
    node->labels = labels.detach();
    node->lse = lse;
    node->logits_shape = logits_in.shape();
    node->ignore_index = ignore_index;
    node->scale = scale;
    record(node, {&logits_in}, {&loss});
  }
  return {loss, num_valid};
}

// --- linear_cross_entropy ------------------------------------------------------------------------

struct LceShape {
  int64_t n = 0, h = 0, v = 0, chunk = 0, ignore_index = -100;
};

// Logits of the columns [v0, v0 + c): logits[N, c] = x[N, H] w[v0:v0+c, H]^T, as linear() does.
template <typename T>
void chunk_logits_cpu(T* logits, const T* x, const T* w, const LceShape& s, int64_t v0, int64_t c) {
  kernels::cpu::GemmShape g;
  g.M = s.n;
  g.N = c;
  g.K = s.h;
  g.trans_b = true;
  kernels::cpu::gemm<T>(logits, x, w + v0 * s.h, g);
}

template <typename T, typename I>
void lce_fwd_cpu(acc_t<T>* row_loss, acc_t<T>* lse, const T* x, const T* w, const I* labels,
                 const LceShape& s) {
  using A = acc_t<T>;
  std::vector<A> run_max(size_t(s.n), A(-INFINITY)), run_sum(size_t(s.n), A(0)),
      target(size_t(s.n), A(0));
  if (s.n > 0) {
    std::vector<T> logits(size_t(s.n * std::min(s.chunk, s.v)));
    for (int64_t v0 = 0; v0 < s.v; v0 += s.chunk) {
      const int64_t c = std::min(s.chunk, s.v - v0);
      chunk_logits_cpu<T>(logits.data(), x, w, s, v0, c);
      kernels::cpu::lce_chunk_fwd<T, I>(run_max.data(), run_sum.data(), target.data(),
                                        logits.data(), labels, s.n, c, v0, s.ignore_index);
    }
  }
  kernels::cpu::lce_finish<A, I>(row_loss, lse, run_max.data(), run_sum.data(), target.data(),
                                 labels, s.n, s.ignore_index);
}

template <typename T, typename I>
void lce_bwd_cpu(T* dx, T* dw, const T* x, const T* w, const I* labels, const acc_t<T>* lse,
                 const acc_t<T>* grad_loss, double scale, const LceShape& s) {
  using A = acc_t<T>;
  if (s.n == 0) {
    if (dw) std::fill(dw, dw + s.v * s.h, from_acc<T>(A(0)));
    return;
  }
  const int64_t cmax = std::min(s.chunk, s.v);
  std::vector<T> logits(size_t(s.n * cmax)), dl(size_t(s.n * cmax));
  std::vector<A> dx_acc(dx ? size_t(s.n * s.h) : 0, A(0));
  std::vector<A> dl_acc, w_acc; // widened copies for bf16 (dx accumulates in acc precision)
  for (int64_t v0 = 0; v0 < s.v; v0 += s.chunk) {
    const int64_t c = std::min(s.chunk, s.v - v0);
    chunk_logits_cpu<T>(logits.data(), x, w, s, v0, c);
    kernels::cpu::lce_chunk_bwd<T, I>(dl.data(), logits.data(), lse, labels, grad_loss, scale, s.n,
                                      c, v0, s.ignore_index);
    if (dw) { // dw[v0:v0+c, H] = dl^T x, each row written once
      kernels::cpu::GemmShape g;
      g.M = c;
      g.N = s.h;
      g.K = s.n;
      g.trans_a = true;
      kernels::cpu::gemm<T>(dw + v0 * s.h, dl.data(), x, g);
    }
    if (dx) { // dx_acc[N, H] += dl w[v0:v0+c]
      kernels::cpu::GemmShape g;
      g.M = s.n;
      g.N = s.h;
      g.K = c;
      if constexpr (std::is_same_v<T, A>) {
        kernels::cpu::gemm<A>(dx_acc.data(), dl.data(), w + v0 * s.h, g, 1.f, 1.f);
      } else {
        dl_acc.resize(size_t(s.n * c));
        w_acc.resize(size_t(c * s.h));
        for (size_t i = 0; i < dl_acc.size(); i++) dl_acc[i] = to_acc<A>(dl[i]);
        for (size_t i = 0; i < w_acc.size(); i++) w_acc[i] = to_acc<A>(w[v0 * s.h + int64_t(i)]);
        kernels::cpu::gemm<A>(dx_acc.data(), dl_acc.data(), w_acc.data(), g, 1.f, 1.f);
      }
    }
  }
  if (dx)
    for (size_t i = 0; i < dx_acc.size(); i++) dx[i] = from_acc<T>(dx_acc[i]);
}

#if VLM_WITH_CUDA
template <typename T> kernels::cuda::GemmType gemm_type() {
  return std::is_same_v<T, float> ? kernels::cuda::GemmType::f32 : kernels::cuda::GemmType::bf16;
}

template <typename T>
void chunk_logits_cuda(T* logits, const T* x, const T* w, const LceShape& s, int64_t v0,
                       int64_t c) {
  kernels::cuda::gemm(logits, gemm_type<T>(), x, w + v0 * s.h, gemm_type<T>(), s.n, c, s.h, false,
                      true, 1.f, 0.f, 1, 0, 0, 0, nullptr);
}

template <typename T, typename I>
void lce_fwd_cuda(float* row_loss, float* lse, const T* x, const T* w, const I* labels,
                  const LceShape& s, Device device) {
  if (s.n == 0) return;
  Tensor state = Tensor::zeros({3, s.n}, DType::f32, device); // run_max, run_sum, target
  float* run_max = state.data<float>();
  float* run_sum = run_max + s.n;
  float* target = run_sum + s.n;
  kernels::cuda::lce_init(run_max, run_sum, s.n, nullptr);
  Tensor logits = Tensor::empty({s.n * std::min(s.chunk, s.v)}, dtype_of<T>(), device);
  for (int64_t v0 = 0; v0 < s.v; v0 += s.chunk) {
    const int64_t c = std::min(s.chunk, s.v - v0);
    chunk_logits_cuda<T>(logits.data<T>(), x, w, s, v0, c);
    kernels::cuda::lce_chunk_fwd<T, I>(run_max, run_sum, target, logits.data<T>(), labels, s.n, c,
                                       v0, s.ignore_index, nullptr);
  }
  kernels::cuda::lce_finish<I>(row_loss, lse, run_max, run_sum, target, labels, s.n, s.ignore_index,
                               nullptr);
}

template <typename T, typename I>
void lce_bwd_cuda(T* dx, T* dw, const T* x, const T* w, const I* labels, const float* lse,
                  const float* grad_loss, double scale, const LceShape& s, Device device) {
  using kernels::cuda::GemmType;
  if (s.n == 0) {
    if (dw) kernels::cuda::memset_async(dw, 0, size_t(s.v * s.h) * sizeof(T), nullptr);
    return;
  }
  const int64_t cmax = std::min(s.chunk, s.v);
  Tensor logits = Tensor::empty({s.n * cmax}, dtype_of<T>(), device);
  Tensor dl = Tensor::empty({s.n * cmax}, dtype_of<T>(), device);
  // dx accumulates over the chunks in fp32 (GEMM beta = 1) and is rounded once.
  Tensor dx_acc;
  float* acc = nullptr;
  if (dx) {
    if constexpr (std::is_same_v<T, float>) {
      acc = dx;
    } else {
      dx_acc = Tensor::empty({s.n * s.h}, DType::f32, device);
      acc = dx_acc.data<float>();
    }
  }
  for (int64_t v0 = 0; v0 < s.v; v0 += s.chunk) {
    const int64_t c = std::min(s.chunk, s.v - v0);
    chunk_logits_cuda<T>(logits.data<T>(), x, w, s, v0, c);
    kernels::cuda::lce_chunk_bwd<T, I>(dl.data<T>(), logits.data<T>(), lse, labels, grad_loss,
                                       scale, s.n, c, v0, s.ignore_index, nullptr);
    if (dw)
      kernels::cuda::gemm(dw + v0 * s.h, gemm_type<T>(), dl.data<T>(), x, gemm_type<T>(), c, s.h,
                          s.n, true, false, 1.f, 0.f, 1, 0, 0, 0, nullptr);
    if (dx)
      kernels::cuda::gemm(acc, GemmType::f32, dl.data<T>(), w + v0 * s.h, gemm_type<T>(), s.n, s.h,
                          c, false, false, 1.f, v0 == 0 ? 0.f : 1.f, 1, 0, 0, 0, nullptr);
  }
  if constexpr (!std::is_same_v<T, float>)
    if (dx) kernels::cuda::round_to_bf16(dx, acc, s.n * s.h, nullptr);
}
#endif

struct LinearCrossEntropyBackward final : Node {
  Tensor x, weight, labels, lse; // contiguous, no history
  LceShape shape;
  double scale = 1.0;
  const char* name() const override { return "LinearCrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor g_loss = g[0].to(lse.dtype()).contiguous();
    Tensor dx = needs_input_grad(0) ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor dw = needs_input_grad(1) ? Tensor::empty(weight.shape(), weight.dtype(), weight.device())
                                    : Tensor();
    auto out = [](const Tensor& t, auto tag) {
      using T = decltype(tag);
      return t.defined() ? t.data<T>() : nullptr;
    };
    if (x.device().is_cuda()) {
#if VLM_WITH_CUDA
      with_cuda_type(x.dtype(), name(), [&](auto tag) {
        using T = decltype(tag);
        VLM_DISPATCH_INDEX(labels.dtype(), name(), I, [&] {
          lce_bwd_cuda<T, I>(out(dx, tag), out(dw, tag), x.data<T>(), weight.data<T>(),
                             labels.data<I>(), lse.data<float>(), g_loss.data<float>(), scale,
                             shape, x.device());
        });
      });
#endif
    } else {
      VLM_DISPATCH_FLOAT(x.dtype(), name(), T, [&] {
        VLM_DISPATCH_INDEX(labels.dtype(), name(), I, [&] {
          lce_bwd_cpu<T, I>(out(dx, T{}), out(dw, T{}), x.data<T>(), weight.data<T>(),
                            labels.data<I>(), lse.data<acc_t<T>>(), g_loss.data<acc_t<T>>(), scale,
                            shape);
        });
      });
    }
    return {dx, dw};
  }
  void release() override { x = weight = labels = lse = Tensor(); }
};

} // namespace

Tensor linear_cross_entropy(const Tensor& x_in, const Tensor& weight_in, const Tensor& labels_in,
                            int64_t ignore_index, Reduction reduction, int64_t vocab_chunk) {
  const char* op = "linear_cross_entropy";
  check_float(op, "x", x_in);
  check_float(op, "weight", weight_in);
  check_same_dtype(op, "x", x_in, "weight", weight_in);
  check_same_device(op, "x", x_in, "weight", weight_in);
  check_dim(op, "x", x_in, 2);
  check_dim(op, "weight", weight_in, 2);
  VLM_CHECK(x_in.size(1) == weight_in.size(1) && weight_in.size(0) > 0, op,
            ": x must be [N, H] and weight [V, H] with V > 0, got ", describe("x", x_in), ", ",
            describe("weight", weight_in));
  check_defined(op, "labels", labels_in);
  VLM_CHECK((labels_in.dtype() == DType::i32 || labels_in.dtype() == DType::i64) &&
                labels_in.dim() == 1 && labels_in.size(0) == x_in.size(0),
            op, ": labels must be i32 or i64 [N] = (", x_in.size(0), "), got ",
            describe("labels", labels_in));
  check_same_device(op, "x", x_in, "labels", labels_in);
  VLM_CHECK(vocab_chunk > 0, op, ": vocab_chunk must be > 0, got ", vocab_chunk);
  const bool on_cuda = x_in.device().is_cuda();
  if (on_cuda)
    VLM_CHECK(x_in.dtype() == DType::f32 || x_in.dtype() == DType::bf16, op,
              ": CUDA kernels take f32 or bf16, got ", x_in.desc(), " (f64 runs on CPU only)");

  Tensor x, weight, labels;
  {
    NoGradGuard no_grad;
    x = x_in.contiguous().detach();
    weight = weight_in.contiguous().detach();
    labels = labels_in.contiguous().detach();
  }
  LceShape s;
  s.n = x.size(0);
  s.h = x.size(1);
  s.v = weight.size(0);
  s.chunk = std::min(vocab_chunk, s.v);
  s.ignore_index = ignore_index;
  const int64_t num_valid =
      validate_labels(op, labels, s.n, s.v, ignore_index, on_cuda, "weight", weight_in);

  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor row_loss = Tensor::empty({s.n}, acc, x.device());
  Tensor lse = Tensor::empty({s.n}, acc, x.device());
  if (on_cuda) {
#if VLM_WITH_CUDA
    with_cuda_type(x.dtype(), op, [&](auto tag) {
      using T = decltype(tag);
      VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
        lce_fwd_cuda<T, I>(row_loss.data<float>(), lse.data<float>(), x.data<T>(), weight.data<T>(),
                           labels.data<I>(), s, x.device());
      });
    });
#endif
  } else {
    VLM_DISPATCH_FLOAT(x.dtype(), op, T, [&] {
      VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
        lce_fwd_cpu<T, I>(row_loss.data<acc_t<T>>(), lse.data<acc_t<T>>(), x.data<T>(),
                          weight.data<T>(), labels.data<I>(), s);
      });
    });
  }
  double total = 0; // fixed order in double, as cross_entropy
  for (double v : row_loss.to_doubles()) total += v;
  double scale = 1.0;
  if (reduction == Reduction::mean) scale = num_valid > 0 ? 1.0 / double(num_valid) : 0.0;
  Tensor loss = Tensor::full({}, total * scale, acc, x_in.device());
  if (needs_grad({&x_in, &weight_in})) {
    auto node = std::make_shared<LinearCrossEntropyBackward>();
    node->x = x;
    node->weight = weight;
    node->labels = labels;
    node->lse = lse;
    node->shape = s;
    node->scale = scale;
    record(node, {&x_in, &weight_in}, {&loss});
  }
  return loss;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                     Reduction reduction) {
  return cross_entropy_impl(logits, labels, ignore_index, reduction).loss_sum;
}

CrossEntropyResult cross_entropy_sum(const Tensor& logits, const Tensor& labels,
                                     int64_t ignore_index) {
  return cross_entropy_impl(logits, labels, ignore_index, Reduction::sum);
}

} // namespace vlm
