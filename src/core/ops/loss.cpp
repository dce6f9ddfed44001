#include "src/core/ops/loss.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/gpu_runtime.h"
#include "kernels/loss.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/device_errors.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/common.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/weight_grad_gemm.h"

namespace vlm {

using namespace ops_detail;

namespace {

// The label-range failure text, shared by the immediate CPU check and the deferred CUDA one.
DeviceErrorFormatter label_error(const char* op, int64_t vocab, const char* what, const Tensor& t,
                                 int64_t ignore_index) {
  return [op, vocab, ignore_index, target = describe(what, t)](int64_t row, int64_t value) {
    return detail::str_cat(op, ": label ", value, " at row ", row, " is out of range [0, ", vocab,
                           ") for ", target, " (ignore_index ", ignore_index, ")");
  };
}

// CPU: checks every label is in [0, vocab) or ignore_index (naming the first bad row and value)
// and returns the number of non-ignored rows.
int64_t validate_labels_cpu(const char* op, const Tensor& labels, int64_t rows, int64_t vocab,
                            int64_t ignore_index, const char* what, const Tensor& t) {
  int64_t num_valid = 0;
  VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
    const I* lab = labels.data<I>();
    const int64_t bad = kernels::cpu::check_labels<I>(lab, rows, vocab, ignore_index, &num_valid);
    if (bad >= 0) VLM_FAIL(label_error(op, vocab, what, t, ignore_index)(bad, int64_t(lab[bad])));
  });
  return num_valid;
}

// What the forward hands to the result and to the backward: the 0-dim loss (f32; f64 for f64
// inputs), the number of counted rows (0-dim i64) and the gradient scale (0-dim f64: 1/num_valid
// for the mean, 1 for the sum), all on the inputs' device.
struct LossTotals {
  Tensor loss, num_valid, scale;
};

// CPU: rows are summed in a fixed order in double (deterministic, and no f32 drift over long
// batches); the labels were validated.
LossTotals reduce_cpu(const Tensor& row_loss, int64_t num_valid, Reduction reduction, DType acc) {
  double total = 0;
  for (double v : row_loss.to_doubles()) total += v;
  double scale = 1.0;
  if (reduction == Reduction::mean) scale = num_valid > 0 ? 1.0 / double(num_valid) : 0.0;
  return {Tensor::full({}, total * scale, acc), Tensor::full({}, double(num_valid), DType::i64),
          Tensor::full({}, scale, DType::f64)};
}

// CUDA: the same on the device (a fixed-order double sum, kernels/loss.h ce_reduce), so nothing
// travels to the host; a bad label is reported at the next synchronization. (A template like the
// other CUDA helpers: only dispatch()'s CUDA bodies instantiate it.)
template <typename I>
LossTotals reduce_cuda(const Tensor& row_loss, const Tensor& labels, int64_t vocab,
                       int64_t ignore_index, Reduction reduction, DeviceErrorFormatter on_error,
                       void* stream) {
  const Device d = row_loss.device();
  LossTotals r{Tensor::empty({}, DType::f32, d), Tensor::empty({}, DType::i64, d),
               Tensor::empty({}, DType::f64, d)};
  const int32_t site = register_device_check(std::move(on_error));
  kernels::cuda::ce_reduce<I>(r.loss.data<float>(), r.num_valid.data<int64_t>(),
                              r.scale.data<double>(), row_loss.data<float>(), labels.data<I>(),
                              labels.numel(), vocab, ignore_index, reduction == Reduction::mean,
                              site, stream);
  return r;
}

// Saves the logits, labels and one logsumexp per row; softmax is recomputed in backward by the
// chunk kernel over the whole vocabulary (chunk = V, v0 = 0).
struct CrossEntropyBackward final : Node {
  Tensor logits; // [rows, V], contiguous
  Tensor labels; // [rows], contiguous i32/i64
  Tensor lse;    // [rows], f32 (f64 for f64 logits)
  Tensor scale;  // 0-dim f64: 1/num_valid (mean), 1 (sum), 0 when nothing is valid
  Shape logits_shape;
  int64_t ignore_index = -100;
  const char* name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor g_loss = g[0].to(lse.dtype()).contiguous();
    Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    VLM_DISPATCH_INDEX(labels.dtype(), name(), I, [&] {
      dispatch(
          name(), logits.device(), logits.dtype(),
          [&](auto t) {
            using T = decltype(t);
            kernels::cpu::lce_chunk_bwd<T, I>(
                dlogits.data<T>(), logits.data<T>(), lse.data<acc_t<T>>(), labels.data<I>(),
                g_loss.data<acc_t<T>>(), scale.data<double>(), rows, vocab, 0, ignore_index);
          },
          [&](auto t, void* stream) {
            using T = decltype(t);
            kernels::cuda::lce_chunk_bwd<T, I>(
                dlogits.data<T>(), logits.data<T>(), lse.data<float>(), labels.data<I>(),
                g_loss.data<float>(), scale.data<double>(), rows, vocab, 0, ignore_index, stream);
          });
    });
    return {dlogits.as_strided(logits_shape, contiguous_strides(logits_shape), 0)};
  }
  void release() override { logits = labels = lse = scale = Tensor(); }
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
  if (logits_in.device().is_cuda())
    VLM_CHECK(logits_in.dtype() == DType::f32 || logits_in.dtype() == DType::bf16, op,
              ": CUDA kernels take f32 or bf16 logits, got ", logits_in.desc(),
              " (f64 runs on CPU only)");

  const int64_t vocab = logits_in.shape().back(), rows = labels_in.numel();
  Tensor contiguous_logits = logits_in.contiguous();
  Tensor logits =
      contiguous_logits.as_strided({rows, vocab}, {vocab, 1}, contiguous_logits.offset());
  Tensor labels = labels_in.contiguous();

  const DType acc = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor row_loss = Tensor::empty({rows}, acc, logits.device());
  Tensor lse = Tensor::empty({rows}, acc, logits.device());
  LossTotals totals;
  VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
    dispatch(
        op, logits.device(), logits.dtype(),
        [&](auto t) {
          using T = decltype(t);
          const int64_t num_valid =
              validate_labels_cpu(op, labels, rows, vocab, ignore_index, "logits", logits_in);
          kernels::cpu::cross_entropy_fwd<T, I>(row_loss.data<acc_t<T>>(), lse.data<acc_t<T>>(),
                                                logits.data<T>(), labels.data<I>(), rows, vocab,
                                                ignore_index);
          totals = reduce_cpu(row_loss, num_valid, reduction, acc);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::cross_entropy_fwd<T, I>(row_loss.data<float>(), lse.data<float>(),
                                                 logits.data<T>(), labels.data<I>(), rows, vocab,
                                                 ignore_index, stream);
          totals =
              reduce_cuda<I>(row_loss, labels, vocab, ignore_index, reduction,
                             label_error(op, vocab, "logits", logits_in, ignore_index), stream);
        });
  });
  Tensor loss = totals.loss;

  if (needs_grad({&logits_in})) {
    auto node = std::make_shared<CrossEntropyBackward>();
    node->logits = logits.detach();
    node->labels = labels.detach();
    node->lse = lse;
    node->scale = totals.scale;
    node->logits_shape = logits_in.shape();
    node->ignore_index = ignore_index;
    record(node, {&logits_in}, {&loss});
  }
  return {loss, totals.num_valid};
}

// --- linear_cross_entropy ------------------------------------------------------------------------

struct LceShape {
  int64_t n = 0, h = 0, v = 0, chunk = 0, ignore_index = -100;
  int64_t vocab_begin = 0; // the global column of the weight's row 0 (a part of a VocabSplit)
};

// Logits of the weight rows [c0, c0 + c): logits[N, c] = x[N, H] w[c0:c0+c, H]^T, as linear()
// does.
template <typename T>
void chunk_logits_cpu(T* logits, const T* x, const T* w, const LceShape& s, int64_t c0, int64_t c) {
  kernels::cpu::GemmShape g;
  g.M = s.n;
  g.N = c;
  g.K = s.h;
  g.trans_b = true;
  kernels::cpu::gemm<T>(logits, x, w + c0 * s.h, g);
}

// Per row of x, over the chunks merged so far: the running max and sum of exp(logit - max), and
// the label's logit (0 until its chunk comes), in f32 (f64 for f64). `sums` holds sum and target
// one after the other, so a vocabulary split combines both in one collective.
struct RowStats {
  Tensor max, sums, sum, target;
  RowStats(int64_t n, DType acc, Device d)
      : max(Tensor::full({n}, -INFINITY, acc, d)), sums(Tensor::zeros({2, n}, acc, d)),
        sum(sums.as_strided({n}, {1}, 0)), target(sums.as_strided({n}, {1}, n)) {}
};

template <typename T, typename I>
void lce_chunks_cpu(RowStats& st, const T* x, const T* w, const I* labels, const LceShape& s) {
  using A = acc_t<T>;
  if (s.n == 0) return;
  std::vector<T> logits(size_t(s.n * std::min(s.chunk, s.v)));
  for (int64_t c0 = 0; c0 < s.v; c0 += s.chunk) {
    const int64_t c = std::min(s.chunk, s.v - c0);
    chunk_logits_cpu<T>(logits.data(), x, w, s, c0, c);
    kernels::cpu::lce_chunk_fwd<T, I>(st.max.data<A>(), st.sum.data<A>(), st.target.data<A>(),
                                      logits.data(), labels, s.n, c, s.vocab_begin + c0,
                                      s.ignore_index);
  }
}

// A vocabulary split (VocabSplit): each row's max over the parts, then its sum-exp moved to that
// max and summed over the parts with the target logit (which the label's part alone holds). A
// part whose logits are all -inf adds 0; -inf on every part (no finite LM head) would give NaN.
void combine_parts(RowStats& st, const VocabSplit& split) {
  NoGradGuard no_grad;
  Tensor global_max = st.max.clone();
  split.max(global_max);
  copy_(st.sum, mul(st.sum, exp(sub(st.max, global_max))));
  split.sum(st.sums);
  st.max = global_max;
}

// dx_acc[N, H] += dlogits w[c0:c0+c], in acc precision (bf16 operands widened first).
template <typename T>
void add_dx_cpu(acc_t<T>* dx_acc, const T* dl, const T* w, const LceShape& s, int64_t c0, int64_t c,
                std::vector<acc_t<T>>& dl_acc, std::vector<acc_t<T>>& w_acc) {
  using A = acc_t<T>;
  kernels::cpu::GemmShape g;
  g.M = s.n;
  g.N = s.h;
  g.K = c;
  if constexpr (std::is_same_v<T, A>) {
    kernels::cpu::gemm<A>(dx_acc, dl, w + c0 * s.h, g, 1.f, 1.f);
  } else {
    dl_acc.resize(size_t(s.n * c));
    w_acc.resize(size_t(c * s.h));
    for (size_t i = 0; i < dl_acc.size(); i++) dl_acc[i] = to_acc<A>(dl[i]);
    for (size_t i = 0; i < w_acc.size(); i++) w_acc[i] = to_acc<A>(w[c0 * s.h + int64_t(i)]);
    kernels::cpu::gemm<A>(dx_acc, dl_acc.data(), w_acc.data(), g, 1.f, 1.f);
  }
}

// The backward's pass over the chunks: dx into dx_acc (zeroed, acc precision; rounded by the
// caller), dw written chunk by chunk (or into an f32 .grad, beta as given).
template <typename T, typename I>
void lce_bwd_cpu(acc_t<T>* dx_acc, T* dw, float* dw32, float dw32_beta, const T* x, const T* w,
                 const I* labels, const acc_t<T>* lse, const acc_t<T>* grad_loss,
                 const double* scale, const LceShape& s) {
  using A = acc_t<T>;
  if (s.n == 0) {
    if (dw) std::fill(dw, dw + s.v * s.h, from_acc<T>(A(0)));
    if (dw32 && dw32_beta == 0.f) std::fill(dw32, dw32 + s.v * s.h, 0.f);
    return;
  }
  const int64_t cmax = std::min(s.chunk, s.v);
  std::vector<T> logits(size_t(s.n * cmax)), dl(size_t(s.n * cmax));
  std::vector<A> dl_acc, w_acc; // widened copies for bf16 (dx accumulates in acc precision)
  for (int64_t c0 = 0; c0 < s.v; c0 += s.chunk) {
    const int64_t c = std::min(s.chunk, s.v - c0);
    chunk_logits_cpu<T>(logits.data(), x, w, s, c0, c);
    kernels::cpu::lce_chunk_bwd<T, I>(dl.data(), logits.data(), lse, labels, grad_loss, scale, s.n,
                                      c, s.vocab_begin + c0, s.ignore_index);
    kernels::cpu::GemmShape g; // dw[c0:c0+c, H] = dl^T x, each row written once
    g.M = c;
    g.N = s.h;
    g.K = s.n;
    g.trans_a = true;
    if (dw) kernels::cpu::gemm<T>(dw + c0 * s.h, dl.data(), x, g);
    if constexpr (std::is_same_v<T, bf16>)
      if (dw32) // the same product into an f32 .grad (accumulate_weight_grad), beta as given
        kernels::cpu::gemm_bf16_f32(dw32 + c0 * s.h, dl.data(), x, g, 1.f, dw32_beta);
    if constexpr (std::is_same_v<T, float>)
      if (dw32) // an f32 head whose gradient FSDP keeps in its own buffer
        kernels::cpu::gemm<float>(dw32 + c0 * s.h, dl.data(), x, g, 1.f, dw32_beta);
    if (dx_acc) add_dx_cpu<T>(dx_acc, dl.data(), w, s, c0, c, dl_acc, w_acc);
  }
}

// The CUDA helpers are templates reached only from dispatch()'s CUDA bodies, so a CPU-only build
// never instantiates them.
template <typename T> kernels::cuda::GemmType gemm_type() {
  return std::is_same_v<T, float> ? kernels::cuda::GemmType::f32 : kernels::cuda::GemmType::bf16;
}

template <typename T>
void chunk_logits_cuda(T* logits, const T* x, const T* w, const LceShape& s, int64_t c0, int64_t c,
                       void* stream) {
  kernels::cuda::gemm(logits, gemm_type<T>(), x, w + c0 * s.h, gemm_type<T>(), s.n, c, s.h, false,
                      true, 1.f, 0.f, 1, 0, 0, 0, stream);
}

template <typename T, typename I>
void lce_chunks_cuda(RowStats& st, const T* x, const T* w, const I* labels, const LceShape& s,
                     Device device, void* stream) {
  if (s.n == 0) return;
  Tensor logits = Tensor::empty({s.n * std::min(s.chunk, s.v)}, dtype_of<T>(), device);
  for (int64_t c0 = 0; c0 < s.v; c0 += s.chunk) {
    const int64_t c = std::min(s.chunk, s.v - c0);
    chunk_logits_cuda<T>(logits.data<T>(), x, w, s, c0, c, stream);
    kernels::cuda::lce_chunk_fwd<T, I>(st.max.data<float>(), st.sum.data<float>(),
                                       st.target.data<float>(), logits.data<T>(), labels, s.n, c,
                                       s.vocab_begin + c0, s.ignore_index, stream);
  }
}

template <typename T, typename I>
void lce_bwd_cuda(float* dx_acc, T* dw, float* dw32, float dw32_beta, const T* x, const T* w,
                  const I* labels, const float* lse, const float* grad_loss, const double* scale,
                  const LceShape& s, Device device, void* stream) {
  using kernels::cuda::GemmType;
  if (s.n == 0) {
    if (dw) kernels::cuda::memset_async(dw, 0, size_t(s.v * s.h) * sizeof(T), stream);
    if (dw32 && dw32_beta == 0.f)
      kernels::cuda::memset_async(dw32, 0, size_t(s.v * s.h) * sizeof(float), stream);
    return;
  }
  const int64_t cmax = std::min(s.chunk, s.v);
  Tensor logits = Tensor::empty({s.n * cmax}, dtype_of<T>(), device);
  Tensor dl = Tensor::empty({s.n * cmax}, dtype_of<T>(), device);
  for (int64_t c0 = 0; c0 < s.v; c0 += s.chunk) {
    const int64_t c = std::min(s.chunk, s.v - c0);
    chunk_logits_cuda<T>(logits.data<T>(), x, w, s, c0, c, stream);
    kernels::cuda::lce_chunk_bwd<T, I>(dl.data<T>(), logits.data<T>(), lse, labels, grad_loss,
                                       scale, s.n, c, s.vocab_begin + c0, s.ignore_index, stream);
    if (dw)
      kernels::cuda::gemm(dw + c0 * s.h, gemm_type<T>(), dl.data<T>(), x, gemm_type<T>(), c, s.h,
                          s.n, true, false, 1.f, 0.f, 1, 0, 0, 0, stream);
    if constexpr (std::is_same_v<T, bf16>)
      if (dw32) { // the same product into an f32 .grad (accumulate_weight_grad), beta as given
        kernels::cpu::GemmShape g;
        g.M = c;
        g.N = s.h;
        g.K = s.n;
        g.trans_a = true;
        weight_grad_gemm(dw32 + c0 * s.h, dl.data<T>(), x, g, dw32_beta, device);
      }
    if constexpr (std::is_same_v<T, float>)
      if (dw32) // an f32 head whose gradient FSDP keeps in its own buffer: dw's product, beta given
        kernels::cuda::gemm(dw32 + c0 * s.h, GemmType::f32, dl.data<T>(), x, GemmType::f32, c, s.h,
                            s.n, true, false, 1.f, dw32_beta, 1, 0, 0, 0, stream);
    // dx_acc[N, H] (+)= dl w[c0:c0+c] in fp32 (GEMM beta 1 after the first chunk)
    if (dx_acc)
      kernels::cuda::gemm(dx_acc, GemmType::f32, dl.data<T>(), w + c0 * s.h, gemm_type<T>(), s.n,
                          s.h, c, false, false, 1.f, c0 == 0 ? 0.f : 1.f, 1, 0, 0, 0, stream);
  }
}

// dx in `dtype` from its acc-precision sum, rounded once.
Tensor round_dx(const Tensor& dx_acc, DType dtype) {
  if (dx_acc.dtype() == dtype) return dx_acc;
  Tensor dx = Tensor::empty(dx_acc.shape(), dtype, dx_acc.device());
  const int64_t n = dx_acc.numel();
  dispatch(
      "linear_cross_entropy", dx.device(), dtype,
      [&](auto t) {
        using T = decltype(t);
        const auto* a = dx_acc.data<acc_t<T>>();
        T* out = dx.data<T>();
        for (int64_t i = 0; i < n; i++) out[i] = from_acc<T>(a[i]);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        if constexpr (std::is_same_v<T, bf16>)
          kernels::cuda::round_to_bf16(dx.data<bf16>(), dx_acc.data<float>(), n, stream);
      });
  return dx;
}

struct LinearCrossEntropyBackward final : Node {
  Tensor x, weight, labels, lse; // contiguous, no history
  Tensor scale;                  // 0-dim f64, as CrossEntropyBackward's
  LceShape shape;
  std::optional<VocabSplit> split;
  const char* name() const override { return "LinearCrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor g_loss = g[0].to(lse.dtype()).contiguous();
    // dx accumulates over the chunks in acc precision (over a split's parts too) and is rounded
    // once.
    Tensor dx_acc =
        needs_input_grad(0) ? Tensor::zeros(x.shape(), lse.dtype(), x.device()) : Tensor();
    Tensor dw;
    auto out = [](const Tensor& t, auto tag) {
      using T = decltype(tag);
      return t.defined() ? t.data<T>() : nullptr;
    };
    // One pass over the vocabulary chunks gives dx and dw (into `dw`, or into an f32 .grad).
    auto run = [&](float* dw32, float dw32_beta) {
      VLM_DISPATCH_INDEX(labels.dtype(), name(), I, [&] {
        dispatch(
            name(), x.device(), x.dtype(),
            [&](auto t) {
              using T = decltype(t);
              lce_bwd_cpu<T, I>(out(dx_acc, acc_t<T>{}), out(dw, t), dw32, dw32_beta, x.data<T>(),
                                weight.data<T>(), labels.data<I>(), lse.data<acc_t<T>>(),
                                g_loss.data<acc_t<T>>(), scale.data<double>(), shape);
            },
            [&](auto t, void* stream) {
              using T = decltype(t);
              lce_bwd_cuda<T, I>(out(dx_acc, float{}), out(dw, t), dw32, dw32_beta, x.data<T>(),
                                 weight.data<T>(), labels.data<I>(), lse.data<float>(),
                                 g_loss.data<float>(), scale.data<double>(), shape, x.device(),
                                 stream);
            });
      });
    };
    // A bf16 lm_head whose .grad accumulates in f32 gets its gradient in fp32 straight from the
    // GEMMs (autograd's accumulate_weight_grad), as a Linear's weight does; so does an f32 head
    // whose gradient FSDP keeps in a buffer of its own (f64 heads never take direct writes).
    const bool direct = needs_input_grad(1) && weight.dtype() != DType::f64 &&
                        accumulate_weight_grad(next_edges[1], [&](Tensor& acc, float beta) {
                          if (beta == 0.f || acc.dtype() != weight.dtype())
                            return run(acc.data<float>(), beta);
                          // Added to an f32 gradient already there: the gradient on its own, then
                          // the sum, as autograd would add it (a GEMM accumulating into acc rounds
                          // otherwise).
                          dw = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
                          run(nullptr, 0.f);
                          add_(acc, dw);
                          dw = Tensor();
                        });
    if (!direct) {
      if (needs_input_grad(1)) dw = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
      run(nullptr, 0.f);
    }
    Tensor dx;
    if (dx_acc.defined()) {
      if (split && shape.n > 0) split->sum(dx_acc); // every part's share of dx
      dx = round_dx(dx_acc, x.dtype());
    }
    return {dx, dw};
  }
  void release() override { x = weight = labels = lse = scale = Tensor(); }
};

} // namespace

Tensor linear_cross_entropy(const Tensor& x_in, const Tensor& weight_in, const Tensor& labels_in,
                            int64_t ignore_index, Reduction reduction, int64_t vocab_chunk,
                            const VocabSplit* split) {
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
  if (x_in.device().is_cuda())
    VLM_CHECK(x_in.dtype() == DType::f32 || x_in.dtype() == DType::bf16, op,
              ": CUDA kernels take f32 or bf16, got ", x_in.desc(), " (f64 runs on CPU only)");
  if (split)
    VLM_CHECK(split->vocab_begin >= 0 && split->vocab_begin + weight_in.size(0) <= split->vocab &&
                  split->sum && split->max,
              op, ": rows [", split->vocab_begin, ", ", split->vocab_begin + weight_in.size(0),
              ") of ", describe("weight", weight_in), " are outside the vocabulary [0, ",
              split->vocab, ") (or the split has no combine functions)");

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
  s.vocab_begin = split ? split->vocab_begin : 0;
  const int64_t vocab = split ? split->vocab : s.v; // labels index the whole vocabulary
  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  RowStats stats(s.n, acc, x.device());
  int64_t num_valid = 0; // CPU: counted while the labels are checked, before any collective
  VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
    dispatch(
        op, x.device(), x.dtype(),
        [&](auto t) {
          using T = decltype(t);
          num_valid =
              validate_labels_cpu(op, labels, s.n, vocab, ignore_index, "weight", weight_in);
          lce_chunks_cpu<T, I>(stats, x.data<T>(), weight.data<T>(), labels.data<I>(), s);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          lce_chunks_cuda<T, I>(stats, x.data<T>(), weight.data<T>(), labels.data<I>(), s,
                                x.device(), stream);
        });
  });
  // Every part has the same rows, so all of them combine, or none.
  if (split && s.n > 0) combine_parts(stats, *split);
  Tensor row_loss = Tensor::empty({s.n}, acc, x.device());
  Tensor lse = Tensor::empty({s.n}, acc, x.device());
  LossTotals totals;
  VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
    dispatch(
        op, x.device(), x.dtype(),
        [&](auto t) {
          using A = acc_t<decltype(t)>;
          kernels::cpu::lce_finish<A, I>(row_loss.data<A>(), lse.data<A>(), stats.max.data<A>(),
                                         stats.sum.data<A>(), stats.target.data<A>(),
                                         labels.data<I>(), s.n, ignore_index);
          totals = reduce_cpu(row_loss, num_valid, reduction, acc); // fixed order, as cross_entropy
        },
        [&](auto, void* stream) {
          kernels::cuda::lce_finish<I>(row_loss.data<float>(), lse.data<float>(),
                                       stats.max.data<float>(), stats.sum.data<float>(),
                                       stats.target.data<float>(), labels.data<I>(), s.n,
                                       ignore_index, stream);
          totals =
              reduce_cuda<I>(row_loss, labels, vocab, ignore_index, reduction,
                             label_error(op, vocab, "weight", weight_in, ignore_index), stream);
        });
  });
  Tensor loss = totals.loss;
  if (needs_grad({&x_in, &weight_in})) {
    auto node = std::make_shared<LinearCrossEntropyBackward>();
    node->x = x;
    node->weight = weight;
    node->labels = labels;
    node->lse = lse;
    node->scale = totals.scale;
    node->shape = s;
    if (split) node->split = *split;
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
