#include "parallel/process_group.h"

#include <mpi.h>

#include <climits>

#include "parallel/mpi_env.h"
#include "src/base/check.h"

namespace vlm::parallel {

namespace {

const char* op_name(ReduceOp op) {
  switch (op) {
  case ReduceOp::sum: return "sum";
  case ReduceOp::avg: return "avg";
  default: return "max";
  }
}

// What every collective needs of a tensor: defined, on the CPU, contiguous.
void check_tensor(const Tensor& t, const char* what, const char* role) {
  VLM_CHECK(t.defined(), "ProcessGroup ", what, ": ", role, " is undefined");
  VLM_CHECK(t.device().is_cpu(), "ProcessGroup ", what, ": ", role, " ", t.desc(),
            " is on a CUDA device; the NCCL backend is not built yet (CPU tensors go over MPI)");
  VLM_CHECK(t.is_contiguous(), "ProcessGroup ", what, ": ", role, " ", t.desc(),
            " must be contiguous");
}

// MPI counts are ints: larger messages would need chunking (not needed by any caller yet).
int count_of(size_t n, const char* what) {
  VLM_CHECK(n <= size_t(INT_MAX), "ProcessGroup ", what, ": ", n,
            " elements exceed one MPI message (INT_MAX)");
  return int(n);
}

MPI_Datatype reduce_type(const Tensor& t, ReduceOp op, const char* what) {
  switch (t.dtype()) {
  case DType::f32: return MPI_FLOAT;
  case DType::f64: return MPI_DOUBLE;
  case DType::i32:
  case DType::i64:
    VLM_CHECK(op != ReduceOp::avg, "ProcessGroup ", what, ": avg of an integer tensor ", t.desc());
    return t.dtype() == DType::i32 ? MPI_INT32_T : MPI_INT64_T;
  default:
    VLM_FAIL("ProcessGroup ", what, ": ", op_name(op), " of a ", t.desc(),
             " tensor is not supported (f32, f64, i32, i64; reduce bf16 gradients in f32)");
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

// avg = sum / ranks, in the tensor's own dtype (floats only, checked by reduce_type).
void divide(const Tensor& t, int ranks) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < n; i++) p[i] /= float(ranks);
  } else {
    double* p = t.data<double>();
    for (int64_t i = 0; i < n; i++) p[i] /= double(ranks);
  }
}

class MpiProcessGroup final : public ProcessGroup {
public:
  explicit MpiProcessGroup(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiProcessGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce", "the tensor");
    const MPI_Datatype type = reduce_type(t, op, "all_reduce");
    MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), count_of(size_t(t.numel()), "all_reduce"), type,
                  mpi_op(op), comm_);
    if (op == ReduceOp::avg) divide(t, size_);
  }

  void all_gather(const Tensor& out, const Tensor& in) override {
    check_tensor(in, "all_gather", "in");
    check_tensor(out, "all_gather", "out");
    VLM_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size_ && in.dim() >= 1 &&
                  out.dim() == in.dim() && out.size(0) == in.size(0) * size_,
              "ProcessGroup all_gather: out ", out.desc(), " must be in ", in.desc(),
              " with dim 0 times ", size_, " ranks");
    const int bytes = count_of(in.nbytes(), "all_gather");
    MPI_Allgather(in.data_ptr(), bytes, MPI_BYTE, out.data_ptr(), bytes, MPI_BYTE, comm_);
  }

  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_tensor(in, "reduce_scatter", "in");
    check_tensor(out, "reduce_scatter", "out");
    VLM_CHECK(out.dtype() == in.dtype() && in.numel() == out.numel() * size_ && out.dim() >= 1 &&
                  out.dim() == in.dim() && in.size(0) == out.size(0) * size_,
              "ProcessGroup reduce_scatter: in ", in.desc(), " must be out ", out.desc(),
              " with dim 0 times ", size_, " ranks");
    const MPI_Datatype type = reduce_type(in, op, "reduce_scatter");
    MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(),
                             count_of(size_t(out.numel()), "reduce_scatter"), type, mpi_op(op),
                             comm_);
    if (op == ReduceOp::avg) divide(out, size_);
  }

  void broadcast(const Tensor& t, int root) override {
    check_tensor(t, "broadcast", "the tensor");
    VLM_CHECK(root >= 0 && root < size_, "ProcessGroup broadcast: root ", root,
              " is not a rank of ", size_);
    MPI_Bcast(t.data_ptr(), count_of(t.nbytes(), "broadcast"), MPI_BYTE, root, comm_);
  }

  void barrier() override { MPI_Barrier(comm_); }

  std::unique_ptr<ProcessGroup> split(int color, int key) const override {
    VLM_CHECK(color >= 0, "ProcessGroup split: color ", color, " must be >= 0");
    MPI_Comm sub;
    MPI_Comm_split(comm_, color, key, &sub);
    return std::make_unique<MpiProcessGroup>(sub);
  }

private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

} // namespace

std::unique_ptr<ProcessGroup> world_group() {
  mpi_world();
  return std::make_unique<MpiProcessGroup>(MPI_COMM_WORLD);
}

} // namespace vlm::parallel
