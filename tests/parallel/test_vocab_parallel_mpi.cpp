// Vocabulary-parallel embedding and cross-entropy (parallel/tp/vocab_parallel.h) equal one process,
// under `mpirun -np 1 | 2 | 4`: tensor parallelism over the whole world and, on 4 ranks, over two
// sub-groups of 2 (split). Every rank builds the same full problem (same seed) and compares its
// loss, the whole dx and its own rows of dweight with single-process linear_cross_entropy /
// embedding on the full weight:
//   * f64 to 1e-12, f32 to 1e-5 (max-norm relative): the ranks merge the vocabulary in another
//     order, so only rounding differs; a wrong shard offset, a missing reduction or a local
//     logsumexp is O(1);
//   * vocab_chunk smaller than the local rows (several chunks, an uneven last one), 0 (none) and
//     larger than the rows; reduction mean and sum; an all-ignored batch (0, zero gradients);
//   * tied embeddings: one shard leaf used by both, its gradient (seen by a post-accumulate hook,
//     which runs once) the sum of both uses;
//   * bf16: the forward against one process with a loose bound, and a bf16 shard with an f32
//     .grad (the direct fp32 weight-gradient path) against the f64 reference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/tp/vocab_parallel.h"
#include "src/base/rng.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/index.h"
#include "src/core/ops/loss.h"
#include "src/core/ops/reduce.h"
#include "src/core/ops/shape_ops.h"

using namespace vlm;
using namespace vlm::parallel;

namespace {

constexpr int64_t kTokens = 13, kHidden = 8, kVocab = 40; // 40 rows split over 1, 2 or 4 ranks
constexpr int64_t kIgnore = -100;

// max |a - b| / max |b| (max-norm relative error); |a - b| when b is all zeros.
double rel(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  REQUIRE(x.size() == y.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); i++) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

double tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }

// The tensor-parallel groups each case runs over: the world, and on 4 ranks pairs {0,1}, {2,3}.
std::vector<std::unique_ptr<ProcessGroup>> tp_groups() {
  std::vector<std::unique_ptr<ProcessGroup>> groups;
  groups.push_back(world_group());
  if (groups[0]->size() == 4) {
    const int r = groups[0]->rank();
    groups.push_back(groups[0]->split(r / 2, r, "tp_pair"));
  }
  return groups;
}

// The same full problem on every rank. Labels: the first and last row of every rank's range
// (for every tp size used), random ones, and every fifth row ignored (or all of them).
struct Problem {
  Tensor x, weight, labels;
};
Problem make_problem(DType dtype, uint64_t seed, bool all_ignored = false) {
  Rng rng(seed);
  Problem p;
  p.x = Tensor::randn({kTokens, kHidden}, rng, dtype);
  p.weight = Tensor::randn({kVocab, kHidden}, rng, dtype, 0.7);
  std::vector<int64_t> labels(static_cast<size_t>(kTokens));
  const int64_t edges[] = {0, 9, 10, 19, 20, 29, 30, 39};
  for (int64_t i = 0; i < kTokens; i++) {
    labels[size_t(i)] = i < 8 ? edges[i] : rng.randint(0, kVocab);
    if (all_ignored || i % 5 == 4) labels[size_t(i)] = kIgnore;
  }
  p.labels = Tensor::from_vector(labels, {kTokens});
  return p;
}

// A leaf copy of rows [begin, begin + rows) of the full weight.
Tensor shard_leaf(const Tensor& weight, int64_t begin, int64_t rows) {
  Tensor s = slice(weight, 0, begin, begin + rows).clone();
  s.set_requires_grad(true);
  return s;
}

Tensor leaf(const Tensor& t) {
  Tensor l = t.clone();
  l.set_requires_grad(true);
  return l;
}

struct Grads {
  Tensor loss, dx, dweight;
};

// One process: linear_cross_entropy on the full weight.
Grads reference_ce(const Problem& p, Reduction reduction) {
  Tensor x = leaf(p.x), w = leaf(p.weight);
  Tensor loss = linear_cross_entropy(x, w, p.labels, kIgnore, reduction);
  loss.backward();
  return {loss, x.grad(), w.grad()};
}

void check_ce(ProcessGroup& tp, DType dtype, Reduction reduction, int64_t vocab_chunk,
              bool all_ignored) {
  const Problem p = make_problem(dtype, 7, all_ignored);
  const Grads want = reference_ce(p, reduction);
  const int64_t rows = kVocab / tp.size(), begin = tp.rank() * rows;
  Tensor x = leaf(p.x), shard = shard_leaf(p.weight, begin, rows);
  Tensor loss =
      vocab_parallel_cross_entropy(x, shard, p.labels, begin, tp, kIgnore, reduction, vocab_chunk);
  loss.backward();
  INFO(tp.name() << " rank " << tp.rank() << " of " << tp.size() << ", " << dtype_name(dtype)
                 << ", " << (reduction == Reduction::mean ? "mean" : "sum") << ", vocab_chunk "
                 << vocab_chunk << (all_ignored ? ", all ignored" : ""));
  CHECK(loss.dim() == 0);
  CHECK(loss.dtype() == (dtype == DType::f64 ? DType::f64 : DType::f32));
  CHECK(x.grad().dtype() == dtype);
  CHECK(shard.grad().dtype() == dtype);
  if (all_ignored) {
    CHECK(loss.item() == 0.0);
    CHECK(rel(x.grad(), Tensor::zeros(x.shape(), dtype)) == 0.0);
    CHECK(rel(shard.grad(), Tensor::zeros(shard.shape(), dtype)) == 0.0);
    return;
  }
  CHECK(std::abs(loss.item() - want.loss.item()) <= tolerance(dtype) * std::abs(want.loss.item()));
  CHECK(rel(x.grad(), want.dx) <= tolerance(dtype));
  CHECK(rel(shard.grad(), slice(want.dweight, 0, begin, begin + rows)) <= tolerance(dtype));
  // Every rank of the group holds the same loss, bit for bit.
  Tensor max_loss = loss.clone(), min_loss = neg(loss);
  tp.all_reduce(max_loss, ReduceOp::max);
  tp.all_reduce(min_loss, ReduceOp::max);
  CHECK(max_loss.item() == loss.item());
  CHECK(-min_loss.item() == loss.item());
}

} // namespace

TEST_CASE("vocab parallel: cross-entropy equals one process's linear_cross_entropy, f64 and f32",
          "[tp]") {
  for (auto& tp : tp_groups())
    for (DType dtype : {DType::f64, DType::f32})
      for (Reduction reduction : {Reduction::mean, Reduction::sum})
        for (int64_t chunk : {int64_t(3), int64_t(0), int64_t(64)})
          check_ce(*tp, dtype, reduction, chunk, false);
}

TEST_CASE("vocab parallel: an all-ignored batch gives loss 0 and zero gradients", "[tp]") {
  for (auto& tp : tp_groups())
    for (DType dtype : {DType::f64, DType::f32})
      for (Reduction reduction : {Reduction::mean, Reduction::sum})
        check_ce(*tp, dtype, reduction, 3, true);
}

TEST_CASE("vocab parallel: embedding equals the full lookup, the shard gets its rows' gradient",
          "[tp]") {
  for (auto& tp : tp_groups())
    for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
      Rng rng(11);
      const Tensor weight = Tensor::randn({kVocab, kHidden}, rng, dtype);
      const Tensor ids = Tensor::from_vector(
          std::vector<int32_t>{0, 39, 9, 10, 19, 20, 29, 30, 5, 5, 17, 33, 0, 12, 26}, {3, 5});
      const Tensor grad_out = Tensor::randn({3, 5, kHidden}, rng, dtype);
      Tensor full = leaf(weight);
      Tensor want = embedding(full, ids);
      sum(mul(want, grad_out)).backward();

      const int64_t rows = kVocab / tp->size(), begin = tp->rank() * rows;
      Tensor shard = shard_leaf(weight, begin, rows);
      Tensor got = vocab_parallel_embedding(shard, ids, begin, *tp);
      sum(mul(got, grad_out)).backward();
      INFO(tp->name() << " rank " << tp->rank() << " of " << tp->size() << ", "
                      << dtype_name(dtype));
      CHECK(got.shape() == Shape{3, 5, kHidden});
      CHECK(rel(got, want) == 0.0); // one nonzero part per element: the sum is exact
      // Foreign ids add exact zeros to row 0: the rows' gradients are the same sums.
      CHECK(rel(shard.grad(), slice(full.grad(), 0, begin, begin + rows)) == 0.0);
    }
}

TEST_CASE("vocab parallel: tied embedding and LM head accumulate both gradients in the shard",
          "[tp]") {
  for (auto& tp : tp_groups())
    for (DType dtype : {DType::f64, DType::f32}) {
      Rng rng(5);
      const Problem p = make_problem(dtype, 13);
      const Tensor ids = Tensor::from_vector(
          std::vector<int64_t>{3, 39, 0, 20, 11, 29, 30, 19, 10, 9, 25, 36, 2}, {kTokens});
      const Tensor offset = Tensor::randn({kTokens, kHidden}, rng, dtype);
      // h = embedding(w, ids) * 0.5 + offset; loss = CE(h w^T, labels).
      auto forward = [&](const Tensor& embedded, const Tensor& off) {
        return add(scale(embedded, 0.5), off);
      };
      Tensor full = leaf(p.weight), off_ref = leaf(offset);
      Tensor want = linear_cross_entropy(forward(embedding(full, ids), off_ref), full, p.labels,
                                         kIgnore, Reduction::mean);
      want.backward();

      const int64_t rows = kVocab / tp->size(), begin = tp->rank() * rows;
      Tensor shard = shard_leaf(p.weight, begin, rows), off = leaf(offset);
      int hook_runs = 0;
      Tensor hooked_grad;
      shard.register_post_accumulate_grad_hook([&](Tensor& param) {
        hook_runs++;
        hooked_grad = param.grad().clone();
      });
      Tensor h = forward(vocab_parallel_embedding(shard, ids, begin, *tp), off);
      Tensor got =
          vocab_parallel_cross_entropy(h, shard, p.labels, begin, *tp, kIgnore, Reduction::mean, 4);
      got.backward();
      INFO(tp->name() << " rank " << tp->rank() << " of " << tp->size() << ", "
                      << dtype_name(dtype));
      CHECK(std::abs(got.item() - want.item()) <= tolerance(dtype) * std::abs(want.item()));
      CHECK(rel(off.grad(), off_ref.grad()) <= tolerance(dtype));
      const Tensor want_rows = slice(full.grad(), 0, begin, begin + rows);
      CHECK(rel(shard.grad(), want_rows) <= tolerance(dtype));
      CHECK(hook_runs == 1);
      REQUIRE(hooked_grad.defined());
      CHECK(rel(hooked_grad, want_rows) <= tolerance(dtype));
    }
}

TEST_CASE("vocab parallel: bf16 forward tracks one process, an f32 .grad takes the fp32 gradient",
          "[tp]") {
  for (auto& tp : tp_groups()) {
    const Problem p = make_problem(DType::bf16, 17);
    const int64_t rows = kVocab / tp->size(), begin = tp->rank() * rows;
    INFO(tp->name() << " rank " << tp->rank() << " of " << tp->size());
    // Forward: the same bf16 inputs in one process, loosely (logits are rounded to bf16).
    const Tensor want = linear_cross_entropy(p.x, p.weight, p.labels);
    const Tensor got =
        vocab_parallel_cross_entropy(p.x, slice(p.weight, 0, begin, begin + rows), p.labels, begin,
                                     *tp, kIgnore, Reduction::mean, 3);
    CHECK(got.dtype() == DType::f32);
    CHECK(std::abs(got.item() - want.item()) <= 1e-2 * std::abs(want.item()));

    // Backward into a bf16 shard with an f32 .grad, against f64 on the same (bf16) values.
    const Grads exact =
        reference_ce({p.x.to(DType::f64), p.weight.to(DType::f64), p.labels}, Reduction::mean);
    Tensor x = leaf(p.x), shard = shard_leaf(p.weight, begin, rows);
    shard.set_grad_dtype(DType::f32);
    vocab_parallel_cross_entropy(x, shard, p.labels, begin, *tp, kIgnore, Reduction::mean, 3)
        .backward();
    CHECK(shard.grad().dtype() == DType::f32);
    CHECK(x.grad().dtype() == DType::bf16);
    CHECK(rel(shard.grad(), slice(exact.dweight, 0, begin, begin + rows)) <= 2e-2);
    CHECK(rel(x.grad(), exact.dx) <= 2e-2);
  }
}

TEST_CASE("vocab parallel: bad arguments are refused before any communication", "[tp]") {
  auto tp = world_group();
  const int64_t rows = kVocab / tp->size(), begin = tp->rank() * rows;
  const Problem p = make_problem(DType::f32, 3);
  const Tensor shard = slice(p.weight, 0, begin, begin + rows).clone();
  Tensor bad_labels = p.labels.clone();
  bad_labels.data<int64_t>()[2] = kVocab; // outside the global vocabulary
  CHECK_THROWS_WITH(vocab_parallel_cross_entropy(p.x, shard, bad_labels, begin, *tp),
                    Catch::Matchers::Contains("label 40 at row 2 is out of range [0, 40)"));
  CHECK_THROWS_WITH(vocab_parallel_cross_entropy(p.x, shard, p.labels, kVocab, *tp),
                    Catch::Matchers::Contains("outside the vocabulary [0, 40)"));
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, kVocab}, {2});
  CHECK_THROWS(vocab_parallel_embedding(shard, ids, begin, *tp));
}
