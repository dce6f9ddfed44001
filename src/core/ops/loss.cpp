#include "src/core/ops/loss.h"

#include <algorithm>

#include "kernels/loss.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"

namespace vlm {

using namespace ops_detail;

namespace {

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
  check_cpu(op, logits_in);

  const int64_t vocab = logits_in.shape().back(), rows = labels_in.numel();
  Tensor contiguous_logits = logits_in.contiguous();
  Tensor logits =
      contiguous_logits.as_strided({rows, vocab}, {vocab, 1}, contiguous_logits.offset());
  Tensor labels = labels_in.contiguous();
  int64_t num_valid = 0;
  VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
    const I* lab = labels.data<I>();
    int64_t bad = kernels::cpu::check_labels<I>(lab, rows, vocab, ignore_index, &num_valid);
    VLM_CHECK(bad < 0, op, ": label ", int64_t(lab[bad]), " at row ", bad, " is out of range [0, ",
              vocab, ") for ", describe("logits", logits_in), " (ignore_index ", ignore_index, ")");
  });

  const DType acc = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor row_loss = Tensor::empty({rows}, acc), lse = Tensor::empty({rows}, acc);
  VLM_DISPATCH_FLOAT(logits.dtype(), op, T, [&] {
    VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
      kernels::cpu::cross_entropy_fwd<T, I>(row_loss.data<acc_t<T>>(), lse.data<acc_t<T>>(),
                                            logits.data<T>(), labels.data<I>(), rows, vocab,
                                            ignore_index);
    });
  });
  // Rows are summed in a fixed order in double: deterministic, and no f32 drift over long batches.
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

} // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                     Reduction reduction) {
  return cross_entropy_impl(logits, labels, ignore_index, reduction).loss_sum;
}

CrossEntropyResult cross_entropy_sum(const Tensor& logits, const Tensor& labels,
                                     int64_t ignore_index) {
  return cross_entropy_impl(logits, labels, ignore_index, Reduction::sum);
}

} // namespace vlm
