#include "parallel/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/device_errors.h"
#include "src/core/dispatch.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/index.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/shape_ops.h"
#include "src/core/ops/weight_grad_gemm.h"

namespace vlm::parallel {

namespace {

// --- embedding -------------------------------------------------------------------------------

// Sums the ranks' partial lookups in the forward; the identity in the backward (each rank's loss
// is a replica, so each rank's own rows get exactly their gradient).
struct VocabParallelAllReduceBackward final : Node {
  const char* name() const override { return "VocabParallelAllReduceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {g[0]}; }
};

// Ids are shifted and masked in f32 (cast() goes through f32 on CUDA): exact below 2^24.
constexpr int64_t kMaxExactVocab = int64_t(1) << 24;

} // namespace

Tensor vocab_parallel_embedding(const Tensor& weight_shard, const Tensor& ids, int64_t vocab_begin,
                                ProcessGroup& tp) {
  const char* op = "vocab_parallel_embedding";
  VLM_CHECK(weight_shard.defined() && weight_shard.dim() == 2 && weight_shard.size(0) > 0, op,
            ": weight_shard must be [V / tp, H], got ", describe("weight_shard", weight_shard));
  VLM_CHECK(ids.defined() && (ids.dtype() == DType::i32 || ids.dtype() == DType::i64), op,
            ": ids must be i32 or i64, got ", describe("ids", ids));
  VLM_CHECK(ids.device() == weight_shard.device(), op, ": ids ", ids.desc(), " and weight_shard ",
            weight_shard.desc(), " are on different devices");
  const int64_t rows = weight_shard.size(0), vocab = rows * tp.size();
  VLM_CHECK(vocab_begin >= 0 && vocab_begin + rows <= vocab, op, ": rows [", vocab_begin, ", ",
            vocab_begin + rows, ") of ", describe("weight_shard", weight_shard),
            " are outside the vocabulary [0, ", vocab, ") of group ", tp.name());
  VLM_CHECK(vocab < kMaxExactVocab, op, ": vocabulary ", vocab, " must be below 2^24");
  const Device device = weight_shard.device();

  // owned[v] = 1 for the local ids, 0 for the others (no history): looking ids up in it gives
  // the mask without comparison ops, and the lookup checks every id is in [0, V).
  Tensor owned = Tensor::zeros({vocab, 1}, DType::f32, device);
  Tensor local_rows = slice(owned, 0, vocab_begin, vocab_begin + rows);
  fill_(local_rows, 1.0);
  Tensor mask = embedding(owned, ids); // [*ids.shape, 1]
  // Local row of an owned id, 0 (any valid row: the mask zeroes it) for the others.
  Tensor local_ids = cast(
      mul(affine(cast(ids, DType::f32), 1.0, -double(vocab_begin)), reshape(mask, ids.shape())),
      DType::i64);

  // The masked lookup keeps its history (embedding, then the mask product), so the gradient of a
  // foreign id adds zeros to row 0 and the owned ids' gradients reach their rows.
  Tensor partial = mul(embedding(weight_shard, local_ids), cast(mask, weight_shard.dtype()));
  Tensor out = partial.detach(); // the product is a fresh tensor nothing saved: sum in place
  tp.all_reduce(out, ReduceOp::sum);
  if (needs_grad({&partial}))
    record(std::make_shared<VocabParallelAllReduceBackward>(), {&partial}, {&out});
  return out;
}

// --- cross-entropy ---------------------------------------------------------------------------

namespace {

struct ChunkPlan {
  int64_t n = 0, h = 0, rows = 0, chunk = 0, vocab = 0, vocab_begin = 0, ignore_index = -100;
};

// logits [n, c] of the local rows [c0, c0 + c): x w[c0:c0+c]^T, as linear() rounds them. Run
// outside any selective-checkpointing interceptor: these are recomputed here, never saved.
Tensor chunk_logits(const Tensor& x, const Tensor& weight, int64_t c0, int64_t c) {
  NoGradGuard no_grad;
  LinearInterceptScope no_intercept(nullptr);
  return linear(x, slice(weight, 0, c0, c0 + c)).contiguous();
}

// Merges one chunk's logits into the running (max, sum-exp) per row and picks the target logit
// when the label falls in the chunk (global column v0 = vocab_begin + c0).
void merge_chunk(const char* op, Tensor& run_max, Tensor& run_sum, Tensor& target,
                 const Tensor& logits, const Tensor& labels, int64_t v0, const ChunkPlan& p) {
  const int64_t c = logits.size(1);
  VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
    dispatch(
        op, logits.device(), logits.dtype(),
        [&](auto t) {
          using T = decltype(t);
          using A = acc_t<T>;
          kernels::cpu::lce_chunk_fwd<T, I>(run_max.data<A>(), run_sum.data<A>(), target.data<A>(),
                                            logits.data<T>(), labels.data<I>(), p.n, c, v0,
                                            p.ignore_index);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::lce_chunk_fwd<T, I>(run_max.data<float>(), run_sum.data<float>(),
                                             target.data<float>(), logits.data<T>(),
                                             labels.data<I>(), p.n, c, v0, p.ignore_index, stream);
        });
  });
}

struct VocabParallelCrossEntropyBackward final : Node {
  Tensor x, weight, labels, lse; // contiguous, no history; lse is the global one
  Tensor scale;                  // 0-dim f64: 1/num_valid (mean), 1 (sum), 0 when nothing counts
  ChunkPlan plan;
  ProcessGroup* tp = nullptr;
  const char* name() const override { return "VocabParallelCrossEntropyBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    const Device device = x.device();
    const DType acc = lse.dtype();
    Tensor g_loss = g[0].to(acc).contiguous();
    // dx accumulates over the chunks in acc precision; every rank holds its vocabulary part.
    Tensor dx_acc = needs_input_grad(0) ? Tensor::zeros({plan.n, plan.h}, acc, device) : Tensor();
    Tensor dw;
    // One pass over the local chunks gives dx and dw (into `dw`, or into an f32 .grad).
    auto run = [&](Tensor* dw32, float dw32_beta) {
      if (plan.n == 0) { // no tokens: zero gradients, nothing to recompute
        if (dw32 && dw32_beta == 0.f) fill_(*dw32, 0.0);
        if (dw.defined()) fill_(dw, 0.0);
        return;
      }
      for (int64_t c0 = 0; c0 < plan.rows; c0 += plan.chunk) {
        const int64_t c = std::min(plan.chunk, plan.rows - c0);
        Tensor dl = dlogits(chunk_logits(x, weight, c0, c), g_loss, plan.vocab_begin + c0);
        if (dw32) {
          kernels::cpu::GemmShape s; // dw32[c0:c0+c, H] (+)= dl^T x
          s.M = c;
          s.N = plan.h;
          s.K = plan.n;
          s.trans_a = true;
          ops_detail::weight_grad_gemm(dw32->data<float>() + c0 * plan.h, dl.data<bf16>(),
                                       x.data<bf16>(), s, dw32_beta, device);
        } else if (dw.defined()) {
          Tensor dw_rows = slice(dw, 0, c0, c0 + c);
          copy_(dw_rows, matmul(transpose(dl, 0, 1), x));
        }
        if (dx_acc.defined())
          add_(dx_acc, matmul(dl.to(acc), slice(weight, 0, c0, c0 + c).to(acc)));
      }
    };
    // A bf16 shard whose .grad (or FSDP buffer) accumulates in f32 gets its gradient in fp32
    // straight from the GEMMs, as linear_cross_entropy's weight does.
    const bool direct = needs_input_grad(1) && x.dtype() == DType::bf16 &&
                        accumulate_weight_grad(
                            next_edges[1], [&](Tensor& acc32, float beta) { run(&acc32, beta); });
    if (!direct) {
      if (needs_input_grad(1)) dw = Tensor::empty(weight.shape(), weight.dtype(), device);
      run(nullptr, 0.f);
    }
    Tensor dx;
    if (dx_acc.defined()) {
      if (plan.n > 0)
        tp->all_reduce(dx_acc, ReduceOp::sum); // summed in acc precision, rounded once
      dx = dx_acc.to(x.dtype());
    }
    return {dx, dw};
  }
  void release() override { x = weight = labels = lse = scale = Tensor(); }

private:
  // (softmax with the global logsumexp - onehot of the labels in this chunk) * grad * scale.
  Tensor dlogits(const Tensor& logits, const Tensor& g_loss, int64_t v0) const {
    Tensor dl = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    const int64_t c = logits.size(1);
    VLM_DISPATCH_INDEX(labels.dtype(), name(), I, [&] {
      dispatch(
          name(), logits.device(), logits.dtype(),
          [&](auto t) {
            using T = decltype(t);
            kernels::cpu::lce_chunk_bwd<T, I>(
                dl.data<T>(), logits.data<T>(), lse.data<acc_t<T>>(), labels.data<I>(),
                g_loss.data<acc_t<T>>(), scale.data<double>(), plan.n, c, v0, plan.ignore_index);
          },
          [&](auto t, void* stream) {
            using T = decltype(t);
            kernels::cuda::lce_chunk_bwd<T, I>(dl.data<T>(), logits.data<T>(), lse.data<float>(),
                                               labels.data<I>(), g_loss.data<float>(),
                                               scale.data<double>(), plan.n, c, v0,
                                               plan.ignore_index, stream);
          });
    });
    return dl;
  }
};

} // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& x_in, const Tensor& weight_in,
                                    const Tensor& labels_in, int64_t vocab_begin, ProcessGroup& tp,
                                    int64_t ignore_index, Reduction reduction,
                                    int64_t vocab_chunk) {
  const char* op = "vocab_parallel_cross_entropy";
  VLM_CHECK(x_in.defined() && weight_in.defined() && x_in.dim() == 2 && weight_in.dim() == 2 &&
                x_in.size(1) == weight_in.size(1) && weight_in.size(0) > 0,
            op, ": x must be [N, H] and weight_shard [V / tp, H] with V > 0, got ",
            describe("x", x_in), ", ", describe("weight_shard", weight_in));
  VLM_CHECK(is_floating(x_in.dtype()) && x_in.dtype() == weight_in.dtype(), op,
            ": x and weight_shard must have the same floating dtype, got ", x_in.desc(), ", ",
            weight_in.desc());
  VLM_CHECK(x_in.device() == weight_in.device(), op, ": x ", x_in.desc(), " and weight_shard ",
            weight_in.desc(), " are on different devices");
  VLM_CHECK(labels_in.defined() &&
                (labels_in.dtype() == DType::i32 || labels_in.dtype() == DType::i64) &&
                labels_in.dim() == 1 && labels_in.size(0) == x_in.size(0) &&
                labels_in.device() == x_in.device(),
            op, ": labels must be i32 or i64 [N] = (", x_in.size(0), ") on ", x_in.device().str(),
            ", got ", describe("labels", labels_in));
  VLM_CHECK(vocab_chunk >= 0, op, ": vocab_chunk must be >= 0 (0: no chunking), got ", vocab_chunk);
  if (x_in.device().is_cuda())
    VLM_CHECK(x_in.dtype() == DType::f32 || x_in.dtype() == DType::bf16, op,
              ": CUDA kernels take f32 or bf16, got ", x_in.desc(), " (f64 runs on CPU only)");

  ChunkPlan p;
  p.n = x_in.size(0);
  p.h = x_in.size(1);
  p.rows = weight_in.size(0);
  p.vocab = p.rows * tp.size();
  p.chunk = vocab_chunk > 0 ? std::min(vocab_chunk, p.rows) : p.rows;
  p.vocab_begin = vocab_begin;
  p.ignore_index = ignore_index;
  VLM_CHECK(vocab_begin >= 0 && vocab_begin + p.rows <= p.vocab, op, ": rows [", vocab_begin, ", ",
            vocab_begin + p.rows, ") of ", describe("weight_shard", weight_in),
            " are outside the vocabulary [0, ", p.vocab, ") of group ", tp.name());

  Tensor x, weight, labels;
  {
    NoGradGuard no_grad;
    x = x_in.contiguous().detach();
    weight = weight_in.contiguous().detach();
    labels = labels_in.contiguous().detach();
  }
  const Device device = x.device();
  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  // The labels are replicated, so every rank counts the same valid tokens: no collective. On the
  // CPU a bad label is thrown before any collective, on every rank alike.
  int64_t num_valid_cpu = 0;
  if (device.is_cpu())
    VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
      const I* lab = labels.data<I>();
      const int64_t bad =
          kernels::cpu::check_labels<I>(lab, p.n, p.vocab, ignore_index, &num_valid_cpu);
      VLM_CHECK(bad < 0, op, ": label ", int64_t(bad >= 0 ? lab[bad] : 0), " at row ", bad,
                " is out of range [0, ", p.vocab, ") (ignore_index ", ignore_index, ")");
    });

  // Per row: this rank's running max, then [sum-exp relative to the global max; target logit],
  // summed over tp in one all-reduce.
  Tensor run_max = Tensor::full({p.n}, -INFINITY, acc, device);
  Tensor sums = Tensor::zeros({2, p.n}, acc, device);
  Tensor run_sum = sums.as_strided({p.n}, {1}, 0);
  Tensor target = sums.as_strided({p.n}, {1}, p.n);
  Tensor row_loss = Tensor::empty({p.n}, acc, device);
  Tensor lse = Tensor::empty({p.n}, acc, device);
  if (p.n > 0) { // every rank has the same N: all skip the collectives together
    for (int64_t c0 = 0; c0 < p.rows; c0 += p.chunk) {
      const int64_t c = std::min(p.chunk, p.rows - c0);
      merge_chunk(op, run_max, run_sum, target, chunk_logits(x, weight, c0, c), labels,
                  vocab_begin + c0, p);
    }
    Tensor global_max = run_max.clone();
    tp.all_reduce(global_max, ReduceOp::max);
    {
      NoGradGuard no_grad;
      // Every rank's sum-exp moved to the global max (a rank whose logits are all -inf adds 0;
      // logits that are all -inf on every rank would give NaN here, as they do nowhere in a
      // finite LM head).
      copy_(run_sum, mul(run_sum, exp(sub(run_max, global_max))));
    }
    tp.all_reduce(sums, ReduceOp::sum);
    VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
      dispatch_device(
          op, device,
          [&] {
            auto finish = [&](auto a) {
              using A = decltype(a);
              kernels::cpu::lce_finish<A, I>(row_loss.data<A>(), lse.data<A>(),
                                             global_max.data<A>(), run_sum.data<A>(),
                                             target.data<A>(), labels.data<I>(), p.n, ignore_index);
            };
            if (acc == DType::f64)
              finish(double{});
            else
              finish(float{});
          },
          [&](auto stream) {
            kernels::cuda::lce_finish<I>(row_loss.data<float>(), lse.data<float>(),
                                         global_max.data<float>(), run_sum.data<float>(),
                                         target.data<float>(), labels.data<I>(), p.n, ignore_index,
                                         stream);
          });
    });
  }

  // The batch loss, identical on every rank (same row losses, summed in the same fixed order).
  Tensor loss, scale;
  if (device.is_cpu()) {
    double total = 0;
    for (double v : row_loss.to_doubles()) total += v;
    double s = 1.0;
    if (reduction == Reduction::mean) s = num_valid_cpu > 0 ? 1.0 / double(num_valid_cpu) : 0.0;
    loss = Tensor::full({}, total * s, acc);
    scale = Tensor::full({}, s, DType::f64);
  } else {
    // On the device (kernels/loss.h ce_reduce): the count and 1/count never reach the host.
    loss = Tensor::empty({}, DType::f32, device);
    scale = Tensor::empty({}, DType::f64, device);
    Tensor num_valid = Tensor::empty({}, DType::i64, device);
    const int64_t vocab = p.vocab;
    const int32_t site =
        register_device_check([op, vocab, ignore_index](int64_t row, int64_t value) {
          return detail::str_cat(op, ": label ", value, " at row ", row, " is out of range [0, ",
                                 vocab, ") (ignore_index ", ignore_index, ")");
        });
    VLM_DISPATCH_INDEX(labels.dtype(), op, I, [&] {
      dispatch_device(
          op, device, [] {},
          [&](auto stream) {
            kernels::cuda::ce_reduce<I>(loss.data<float>(), num_valid.data<int64_t>(),
                                        scale.data<double>(), row_loss.data<float>(),
                                        labels.data<I>(), p.n, p.vocab, ignore_index,
                                        reduction == Reduction::mean, site, stream);
          });
    });
  }

  if (needs_grad({&x_in, &weight_in})) {
    auto node = std::make_shared<VocabParallelCrossEntropyBackward>();
    node->x = x;
    node->weight = weight;
    node->labels = labels;
    node->lse = lse;
    node->scale = scale;
    node->plan = p;
    node->tp = &tp;
    record(node, {&x_in, &weight_in}, {&loss});
  }
  return loss;
}

} // namespace vlm::parallel
