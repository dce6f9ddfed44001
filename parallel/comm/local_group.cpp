#include "parallel/comm/local_group.h"

#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::parallel {

namespace {

class DoneWork final : public Work {
public:
  void wait() override {}
};

} // namespace

LocalProcessGroup::LocalProcessGroup(int rank, int size) : rank_(rank), size_(size) {
  VLM_CHECK(size >= 1 && rank >= 0 && rank < size, "LocalProcessGroup: rank ", rank, " of ", size);
}

std::string LocalProcessGroup::name() const {
  return detail::str_cat("local stand-in group (", size_, " ranks, no peers)");
}

std::unique_ptr<Work> LocalProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  NoGradGuard no_grad;
  Tensor x = t;
  if (op == ReduceOp::sum && size_ > 1) scale_(x, double(size_));
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> LocalProcessGroup::all_gather_async(const Tensor& out, const Tensor& in) {
  VLM_CHECK(out.numel() == in.numel() * size_ && out.size(0) == in.size(0) * size_,
            "LocalProcessGroup all_gather: out ", out.desc(), " must be in ", in.desc(),
            " with dim 0 times ", size_);
  NoGradGuard no_grad;
  for (int r = 0; r < size_; r++) {
    Tensor block = slice(out, 0, r * in.size(0), (r + 1) * in.size(0));
    copy_(block, in);
  }
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> LocalProcessGroup::reduce_scatter_async(const Tensor& out, const Tensor& in,
                                                              ReduceOp op) {
  VLM_CHECK(in.numel() == out.numel() * size_ && in.size(0) == out.size(0) * size_,
            "LocalProcessGroup reduce_scatter: in ", in.desc(), " must be out ", out.desc(),
            " with dim 0 times ", size_);
  NoGradGuard no_grad;
  Tensor o = out;
  copy_(o, slice(in, 0, rank_ * out.size(0), (rank_ + 1) * out.size(0)));
  if (op == ReduceOp::sum && size_ > 1) scale_(o, double(size_));
  return std::make_unique<DoneWork>();
}

std::unique_ptr<ProcessGroup> LocalProcessGroup::split(int, int, const std::string&) const {
  // One rank (a process without MPI: the mesh of a world of one) splits into itself; the ranks of
  // a larger stand-in group have no peers to agree on sub-groups with.
  VLM_CHECK(size_ == 1, "LocalProcessGroup: split of a stand-in group of ", size_,
            " ranks is not supported");
  return std::make_unique<LocalProcessGroup>(0, 1);
}

} // namespace vlm::parallel
