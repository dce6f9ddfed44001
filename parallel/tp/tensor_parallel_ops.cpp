#include "parallel/tp/tensor_parallel_ops.h"

#include <algorithm>

#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::parallel {

namespace {

struct CopyToTpBackward final : Node {
  ProcessGroup* tp = nullptr;
  const char* name() const override { return "CopyToTpBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor sum = g[0].clone(); // the incoming gradient may be shared: reduce a copy
    tp->all_reduce(sum);
    return {sum};
  }
};

struct ReduceFromTpBackward final : Node {
  const char* name() const override { return "ReduceFromTpBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {g[0]}; }
};

// x [rows, ...] with zero rows appended up to `padded` (x itself when it has them all).
Tensor pad_rows(const Tensor& x, int64_t padded) {
  const int64_t rows = x.size(0);
  if (rows == padded) return x.contiguous();
  Shape shape = x.shape();
  shape[0] = padded - rows;
  return concat({x, Tensor::zeros(shape, x.dtype(), x.device())}, 0);
}

// The rank's block of x's rows, padded (forward of split_rows, backward of gather_rows).
Tensor block_of(const Tensor& x, ProcessGroup& tp) {
  const int64_t b = rows_per_rank(x.size(0), tp), begin = b * tp.rank();
  const int64_t end = std::min(begin + b, x.size(0));
  if (begin >= end) { // a block of padding only
    Shape shape = x.shape();
    shape[0] = b;
    return Tensor::zeros(shape, x.dtype(), x.device());
  }
  const Tensor rows = slice(x, 0, begin, end);
  return end - begin == b ? rows.clone() : pad_rows(rows, b);
}

// Every rank's block stacked, the first `rows` of them.
Tensor all_gather_rows(const Tensor& block, int64_t rows, ProcessGroup& tp) {
  Shape shape = block.shape();
  shape[0] *= tp.size();
  VLM_CHECK(block.size(0) == rows_per_rank(rows, tp), "sequence parallel: blocks of ",
            block.size(0), " rows on ", tp.size(), " ranks do not hold ", rows, " rows");
  Tensor all = Tensor::empty(shape, block.dtype(), block.device());
  tp.all_gather(all, block.contiguous());
  return shape[0] == rows ? all : slice(all, 0, 0, rows).contiguous();
}

// The rank's block of the sum over the ranks of x [rows, ...].
Tensor reduce_scatter_block(const Tensor& x, ProcessGroup& tp) {
  const int64_t b = rows_per_rank(x.size(0), tp);
  const Tensor padded = pad_rows(x, b * tp.size());
  Shape shape = x.shape();
  shape[0] = b;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  tp.reduce_scatter(out, padded);
  return out;
}

// The backward of split_rows and reduce_scatter_rows: every rank's block of the gradient, whole.
struct AllGatherRowsBackward final : Node {
  ProcessGroup* tp = nullptr;
  int64_t rows = 0;
  const char* name() const override { return "AllGatherRowsBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    return {all_gather_rows(g[0], rows, *tp)};
  }
};

struct GatherRowsBackward final : Node {
  ProcessGroup* tp = nullptr;
  bool reduce = false; // the gradient is a partial sum (gather_rows_to_tp)
  const char* name() const override { return "GatherRowsBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    return {reduce ? reduce_scatter_block(g[0], *tp) : block_of(g[0], *tp)};
  }
};

// `out`, this rank's block of x's rows, with the backward that gathers the blocks' gradients.
Tensor with_all_gather_backward(const Tensor& x, Tensor out, ProcessGroup& tp) {
  if (needs_grad({&x})) {
    auto node = std::make_shared<AllGatherRowsBackward>();
    node->tp = &tp;
    node->rows = x.size(0);
    record(node, {&x}, {&out});
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t rows, ProcessGroup& tp, bool reduce_in_backward) {
  Tensor out = all_gather_rows(x.detach(), rows, tp);
  if (needs_grad({&x})) {
    auto node = std::make_shared<GatherRowsBackward>();
    node->tp = &tp;
    node->reduce = reduce_in_backward;
    record(node, {&x}, {&out});
  }
  return out;
}

} // namespace

int64_t rows_per_rank(int64_t rows, const ProcessGroup& tp) {
  return (rows + tp.size() - 1) / tp.size();
}

Tensor split_rows(const Tensor& x, ProcessGroup& tp) {
  return with_all_gather_backward(x, block_of(x.detach(), tp), tp);
}

Tensor gather_rows(const Tensor& x, int64_t rows, ProcessGroup& tp) {
  return gather(x, rows, tp, /*reduce_in_backward=*/false);
}

Tensor gather_rows_to_tp(const Tensor& x, int64_t rows, ProcessGroup& tp) {
  return gather(x, rows, tp, /*reduce_in_backward=*/true);
}

Tensor reduce_scatter_rows(const Tensor& x, ProcessGroup& tp) {
  return with_all_gather_backward(x, reduce_scatter_block(x.detach(), tp), tp);
}

Tensor copy_to_tp(const Tensor& x, ProcessGroup& tp) {
  Tensor out = x.detach(); // the same storage; the new handle carries the backward's collective
  if (needs_grad({&x})) {
    auto node = std::make_shared<CopyToTpBackward>();
    node->tp = &tp;
    record(node, {&x}, {&out});
  }
  return out;
}

Tensor reduce_from_tp(const Tensor& x, ProcessGroup& tp) {
  Tensor out = x.detach().clone();
  tp.all_reduce(out);
  if (needs_grad({&x})) record(std::make_shared<ReduceFromTpBackward>(), {&x}, {&out});
  return out;
}

} // namespace vlm::parallel
