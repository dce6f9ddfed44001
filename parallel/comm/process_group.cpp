#include "parallel/comm/process_group.h"

#include "parallel/comm/mpi.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/nccl.h"
#include "parallel/comm/local_group.h"
#include "parallel/comm/mpi_env.h"
#include "parallel/comm/watchdog.h"
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

// What every collective needs of a tensor: defined, contiguous, on the device of the others.
void check_tensor(const Tensor& t, const char* what, const char* role) {
  VLM_CHECK(t.defined(), "ProcessGroup ", what, ": ", role, " is undefined");
  VLM_CHECK(t.is_contiguous(), "ProcessGroup ", what, ": ", role, " ", t.desc(),
            " must be contiguous");
}

// What gather needs of its input and root.
void check_gather_to(const Tensor& in, int root, int size) {
  check_tensor(in, "gather", "the input");
  VLM_CHECK(!in.device().is_cuda(), "ProcessGroup gather: the input ", in.desc(),
            " is on the GPU; gather takes host tensors");
  VLM_CHECK(root >= 0 && root < size, "ProcessGroup gather: root ", root, " is not a rank of ",
            size);
}

void check_pair(const Tensor& a, const Tensor& b, const char* what) {
  VLM_CHECK(a.device() == b.device(), "ProcessGroup ", what, ": out ", a.desc(), " and in ",
            b.desc(), " are on different devices");
}

void check_reducible(const Tensor& t, ReduceOp op, const char* what) {
  switch (t.dtype()) {
  case DType::f32:
  case DType::f64:
  case DType::bf16: return;
  case DType::i32:
  case DType::i64:
    VLM_CHECK(op != ReduceOp::avg, "ProcessGroup ", what, ": avg of an integer tensor ", t.desc());
    return;
  default:
    VLM_FAIL("ProcessGroup ", what, ": ", op_name(op), " of a ", t.desc(),
             " tensor is not supported (f32, f64, bf16, i32, i64)");
  }
}

// MPI counts are ints: larger messages would need chunking (no caller sends 2^31 elements).
int count_of(int64_t n, const char* what) {
  VLM_CHECK(n <= int64_t(INT_MAX), "ProcessGroup ", what, ": ", n,
            " elements exceed one MPI message (INT_MAX)");
  return int(n);
}

// --- MPI
// ------------------------------------------------------------------------------------------

// bf16 reductions: MPI has no bf16, so bf16 travels as 16-bit words and user operations add
// (or compare) them in float, rounding each partial result to bf16 (as NCCL does).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; i++) b[i] = bf16(float(a[i]) + float(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; i++)
    if (float(a[i]) > float(b[i])) b[i] = a[i];
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
  case DType::f32: return MPI_FLOAT;
  case DType::f64: return MPI_DOUBLE;
  case DType::bf16:
  case DType::f16: return MPI_UINT16_T;
  case DType::i32: return MPI_INT32_T;
  case DType::i64: return MPI_INT64_T;
  case DType::u8:
  case DType::boolean: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::bf16) {
    static MPI_Op sum = [] {
      MPI_Op o;
      MPI_Op_create(&bf16_sum, 1, &o);
      return o;
    }();
    static MPI_Op max = [] {
      MPI_Op o;
      MPI_Op_create(&bf16_max, 1, &o);
      return o;
    }();
    return op == ReduceOp::max ? max : sum;
  }
  return op == ReduceOp::max ? MPI_MAX : MPI_SUM;
}

// out = block `rank` of the sum (or max) over the ranks of `in`'s `size` blocks of `block`
// elements, by a ring: in pieces of at most 16 MiB, each rank sends a partial sum to the next and
// adds its own part of the block it receives, size - 1 times per piece. MPI's own reduce-scatter
// (blocking, and libnbc's nonblocking one) keeps a temporary as large as `in` on some or every
// rank: for an FSDP unit holding a 150k-token embedding that is hundreds of MiB of peak memory
// (measured +0.5 to +0.9 GiB per rank on Qwen3-0.6B over 4 ranks); the ring holds two pieces.
void ring_reduce_scatter(MPI_Comm comm, int rank, int size, const void* in, void* out,
                         int64_t block, DType dtype, MPI_Op op) {
  const size_t es = dtype_size(dtype);
  const MPI_Datatype type = mpi_type(dtype);
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  if (size == 1) {
    std::memcpy(dst, src, size_t(block) * es);
    return;
  }
  const int64_t piece = std::max<int64_t>(1, (int64_t(16) << 20) / int64_t(es));
  std::vector<char> send(size_t(std::min(piece, block)) * es), recv(send.size());
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (int64_t off = 0; off < block; off += piece) {
    const int64_t n = std::min(piece, block - off);
    const int count = count_of(n, "reduce_scatter");
    auto part = [&](int b) { return src + size_t(int64_t(b) * block + off) * es; };
    std::memcpy(send.data(), part((rank + size - 1) % size), size_t(n) * es);
    for (int step = 0; step < size - 1; step++) {
      MPI_Sendrecv(send.data(), count, type, next, 0, recv.data(), count, type, prev, 0, comm,
                   MPI_STATUS_IGNORE);
      // The block received now: its partial sum over the ranks before this one, plus this one's.
      MPI_Reduce_local(part((rank + 2 * size - step - 2) % size), recv.data(), count, type, op);
      std::swap(send, recv);
    }
    std::memcpy(dst + size_t(off) * es, send.data(), size_t(n) * es); // block `rank`, whole
  }
}

// avg = sum / ranks, in the tensor's own dtype.
void divide(const Tensor& t, int ranks) {
  if (ranks == 1) return;
  const int64_t n = t.numel();
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < n; i++) p[i] /= float(ranks);
  } else if (t.dtype() == DType::f64) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < n; i++) p[i] /= double(ranks);
  } else {
    bf16* p = t.data<bf16>();
    for (int64_t i = 0; i < n; i++) p[i] = bf16(float(p[i]) / float(ranks));
  }
}

// A nonblocking MPI collective: waits (watched) and then finishes it (avg divides).
// The group (whose label it points at) outlives its works.
class MpiWork final : public Work {
public:
  MpiWork(MPI_Request request, const char* op, const Tensor& t, const std::string& group,
          std::vector<Tensor> keep, Tensor divide_by, int ranks)
      : request_(request), op_(op), numel_(t.numel()), dtype_(t.dtype()), group_(group),
        keep_(std::move(keep)), divide_(std::move(divide_by)), ranks_(ranks) {}
  ~MpiWork() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) wait();
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL && keep_.empty()) return;
    {
      BlockedWait watch(op_, numel_, dtype_, group_);
      MPI_Wait(&request_, MPI_STATUS_IGNORE);
    }
    if (divide_.defined()) divide(divide_, ranks_);
    divide_ = Tensor();
    keep_.clear();
  }

private:
  MPI_Request request_;
  const char* op_;
  int64_t numel_;
  DType dtype_;
  const std::string& group_;
  std::vector<Tensor> keep_;
  Tensor divide_;
  int ranks_;
};

// --- NCCL (CUDA tensors)
// --------------------------------------------------------------------------

kernels::cuda::NcclOp nccl_op(ReduceOp op) {
  switch (op) {
  case ReduceOp::sum: return kernels::cuda::NcclOp::sum;
  case ReduceOp::avg: return kernels::cuda::NcclOp::avg;
  default: return kernels::cuda::NcclOp::max;
  }
}

// A collective queued on the communication stream; wait() orders the current stream after it.
class NcclWork final : public Work {
public:
  NcclWork(std::shared_ptr<Event> done, std::vector<Tensor> keep)
      : done_(std::move(done)), keep_(std::move(keep)) {}
  ~NcclWork() override { wait(); }
  void wait() override {
    if (!done_) return;
    current_stream(done_->device()).wait(*done_);
    done_.reset();
    keep_.clear(); // freed on their allocation (compute) stream, now ordered after the collective
  }

private:
  std::shared_ptr<Event> done_;
  std::vector<Tensor> keep_;
};

class MpiProcessGroup final : public ProcessGroup {
public:
  MpiProcessGroup(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    label_ = detail::str_cat("process group '", name_, "' (", size_, " ranks)");
  }
  ~MpiProcessGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (nccl_comm_) kernels::cuda::nccl_comm_destroy(nccl_comm_);
    if (!finalized && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return label_; }

  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce", "the tensor");
    check_reducible(t, op, "all_reduce");
    if (t.device().is_cuda())
      return nccl("all_reduce", t.device(), {t}, [&](void* comm, void* stream) {
        kernels::cuda::nccl_all_reduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), t.dtype(),
                                       nccl_op(op), comm, stream);
      });
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), count_of(t.numel(), "all_reduce"),
                   mpi_type(t.dtype()), mpi_op(op, t.dtype()), comm_, &req);
    return std::make_unique<MpiWork>(req, "all_reduce", t, label_, std::vector<Tensor>{t},
                                     op == ReduceOp::avg ? t : Tensor(), size_);
  }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    if (t.device().is_cuda()) return all_reduce_async(t, op)->wait();
    check_tensor(t, "all_reduce", "the tensor");
    check_reducible(t, op, "all_reduce");
    {
      BlockedWait watch("all_reduce", t.numel(), t.dtype(), label_);
      MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), count_of(t.numel(), "all_reduce"),
                    mpi_type(t.dtype()), mpi_op(op, t.dtype()), comm_);
    }
    if (op == ReduceOp::avg) divide(t, size_);
  }

  std::unique_ptr<Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    check_gather(out, in);
    if (in.device().is_cuda())
      return nccl("all_gather", in.device(), {out, in}, [&](void* comm, void* stream) {
        kernels::cuda::nccl_all_gather(in.data_ptr(), out.data_ptr(), size_t(in.numel()),
                                       in.dtype(), comm, stream);
      });
    MPI_Request req;
    const int count = count_of(in.numel(), "all_gather");
    const MPI_Datatype type = mpi_type(in.dtype());
    MPI_Iallgather(in.data_ptr(), count, type, out.data_ptr(), count, type, comm_, &req);
    return std::make_unique<MpiWork>(req, "all_gather", out, label_, std::vector<Tensor>{out, in},
                                     Tensor(), size_);
  }

  void all_gather(const Tensor& out, const Tensor& in) override {
    if (in.device().is_cuda()) return all_gather_async(out, in)->wait();
    check_gather(out, in);
    const int count = count_of(in.numel(), "all_gather");
    const MPI_Datatype type = mpi_type(in.dtype());
    BlockedWait watch("all_gather", out.numel(), out.dtype(), label_);
    MPI_Allgather(in.data_ptr(), count, type, out.data_ptr(), count, type, comm_);
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                             ReduceOp op) override {
    check_scatter(out, in, op);
    if (in.device().is_cuda())
      return nccl("reduce_scatter", in.device(), {out, in}, [&](void* comm, void* stream) {
        kernels::cuda::nccl_reduce_scatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()),
                                           in.dtype(), nccl_op(op), comm, stream);
      });
    // On the host the ring (ring_reduce_scatter), done by the time this returns: MPI's
    // nonblocking one needs a whole-size temporary, and without a progress thread it would not
    // overlap compute anyway.
    reduce_scatter(out, in, op);
    return std::make_unique<MpiWork>(MPI_REQUEST_NULL, "reduce_scatter", in, label_,
                                     std::vector<Tensor>{}, Tensor(), size_);
  }

  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    if (in.device().is_cuda()) return reduce_scatter_async(out, in, op)->wait();
    check_scatter(out, in, op);
    {
      BlockedWait watch("reduce_scatter", in.numel(), in.dtype(), label_);
      ring_reduce_scatter(comm_, rank_, size_, in.data_ptr(), out.data_ptr(), out.numel(),
                          in.dtype(), mpi_op(op, in.dtype()));
    }
    if (op == ReduceOp::avg) divide(out, size_);
  }

  void broadcast(const Tensor& t, int root) override {
    check_tensor(t, "broadcast", "the tensor");
    VLM_CHECK(root >= 0 && root < size_, "ProcessGroup broadcast: root ", root,
              " is not a rank of ", size_);
    if (t.device().is_cuda()) {
      nccl("broadcast", t.device(), {t}, [&](void* comm, void* stream) {
        kernels::cuda::nccl_broadcast(t.data_ptr(), size_t(t.numel()), t.dtype(), root, comm,
                                      stream);
      })->wait();
      return;
    }
    BlockedWait watch("broadcast", t.numel(), t.dtype(), label_);
    MPI_Bcast(t.data_ptr(), count_of(t.numel(), "broadcast"), mpi_type(t.dtype()), root, comm_);
  }

  Tensor gather(const Tensor& in, int root, std::vector<int64_t>* counts) override {
    check_gather_to(in, root, size_);
    const int64_t mine = in.numel();
    std::vector<int64_t> lengths(size_t(size_), 0);
    BlockedWait watch("gather", mine, in.dtype(), label_);
    MPI_Gather(&mine, 1, MPI_INT64_T, lengths.data(), 1, MPI_INT64_T, root, comm_);
    // Counts and displacements in elements (MPI ints: checked).
    std::vector<int> elements, displacements;
    Tensor out;
    if (rank_ == root) {
      int64_t total = 0;
      for (int64_t n : lengths) {
        elements.push_back(count_of(n, "gather"));
        displacements.push_back(count_of(total, "gather"));
        total += n;
      }
      count_of(total, "gather");
      out = Tensor::empty({total}, in.dtype());
    }
    const MPI_Datatype type = mpi_type(in.dtype());
    MPI_Gatherv(in.data_ptr(), count_of(mine, "gather"), type,
                out.defined() ? out.data_ptr() : nullptr, elements.data(), displacements.data(),
                type, root, comm_);
    if (counts && rank_ == root) *counts = lengths;
    return out;
  }

  void barrier() override {
    BlockedWait watch("barrier", 0, DType::u8, label_);
    MPI_Barrier(comm_);
  }

  void connect(Device device) override {
    if (device.is_cuda() && size_ > 1) nccl_comm(device);
  }

  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) const override {
    VLM_CHECK(color >= 0, "ProcessGroup split: color ", color, " must be >= 0");
    MPI_Comm sub;
    {
      BlockedWait watch("split", 0, DType::u8, label_);
      MPI_Comm_split(comm_, color, key, &sub);
    }
    return std::make_unique<MpiProcessGroup>(sub, name.empty() ? name_ + "/split" : name);
  }

private:
  void check_gather(const Tensor& out, const Tensor& in) const {
    check_tensor(in, "all_gather", "in");
    check_tensor(out, "all_gather", "out");
    check_pair(out, in, "all_gather");
    VLM_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size_ && in.dim() >= 1 &&
                  out.dim() == in.dim() && out.size(0) == in.size(0) * size_,
              "ProcessGroup all_gather: out ", out.desc(), " must be in ", in.desc(),
              " with dim 0 times ", size_, " ranks");
  }

  void check_scatter(const Tensor& out, const Tensor& in, ReduceOp op) const {
    check_tensor(in, "reduce_scatter", "in");
    check_tensor(out, "reduce_scatter", "out");
    check_pair(out, in, "reduce_scatter");
    VLM_CHECK(out.dtype() == in.dtype() && in.numel() == out.numel() * size_ && out.dim() >= 1 &&
                  out.dim() == in.dim() && in.size(0) == out.size(0) * size_,
              "ProcessGroup reduce_scatter: in ", in.desc(), " must be out ", out.desc(),
              " with dim 0 times ", size_, " ranks");
    check_reducible(in, op, "reduce_scatter");
  }

  // The group's NCCL communicator on `device`, made by connect() or at the first CUDA collective:
  // rank 0 makes the unique id and broadcasts it over MPI (every rank reaches here together).
  void* nccl_comm(Device device) {
    if (nccl_comm_) {
      VLM_CHECK(device == nccl_device_, name(), ": NCCL collectives on ", device.str(),
                " but the group's communicator is on ", nccl_device_.str(), " (one GPU per rank)");
      return nccl_comm_;
    }
    VLM_CHECK(kernels::cuda::nccl_built(), name(), ": a collective on ", device.str(),
              " needs NCCL, and this build has none (see docs/gpu.md: NCCL_ROOT, -DVLM_WITH_NCCL)");
    char id[kernels::cuda::kNcclUniqueIdBytes] = {};
    if (rank_ == 0) kernels::cuda::nccl_unique_id(id);
    {
      BlockedWait watch("NCCL bootstrap (unique id broadcast)", 0, DType::u8, label_);
      MPI_Bcast(id, int(sizeof id), MPI_BYTE, 0, comm_);
    }
    DeviceGuard guard(device);
    {
      // Blocks until every rank of the group has joined: watched like a collective.
      BlockedWait watch("NCCL communicator init", 0, DType::u8, label_);
      nccl_comm_ = kernels::cuda::nccl_comm_init(id, size_, rank_);
    }
    nccl_device_ = device;
    comm_stream_ = Stream::create(device);
    return nccl_comm_;
  }

  // Queues `launch` on the communication stream after the current stream's work so far.
  template <typename Launch>
  std::unique_ptr<Work> nccl(const char* what, Device device, std::vector<Tensor> keep,
                             Launch&& launch) {
    void* comm = nccl_comm(device);
    DeviceGuard guard(device);
    Event ready;
    ready.record(current_stream(device));
    comm_stream_.wait(ready);
    launch(comm, comm_stream_.handle());
    auto done = std::make_shared<Event>();
    done->record(comm_stream_);
    watch_in_flight(
        detail::str_cat(what, " of ", keep[0].desc(), " on ", name()),
        [done] { return done->query(); }, [comm] { return kernels::cuda::nccl_async_error(comm); });
    return std::make_unique<NcclWork>(std::move(done), std::move(keep));
  }

  MPI_Comm comm_;
  std::string name_, label_;
  int rank_ = 0, size_ = 1;
  void* nccl_comm_ = nullptr;
  Device nccl_device_;
  Stream comm_stream_;
};

} // namespace

double ProcessGroup::all_reduce_value(double v, ReduceOp op) {
  Tensor t = Tensor::from_vector(std::vector<double>{v}, {1});
  all_reduce(t, op);
  return t.data<double>()[0];
}

int64_t ProcessGroup::all_reduce_value(int64_t v, ReduceOp op) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{v}, {1});
  all_reduce(t, op);
  return t.data<int64_t>()[0];
}

Tensor ProcessGroup::gather(const Tensor& in, int root, std::vector<int64_t>* counts) {
  const int n = size();
  check_gather_to(in, root, n);
  Tensor lengths = Tensor::zeros({n}, DType::i64);
  all_gather(lengths, Tensor::from_vector(std::vector<int64_t>{in.numel()}, {1}));
  const int64_t* len = lengths.data<int64_t>();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(len, len + n));
  Tensor padded = Tensor::zeros({longest}, in.dtype()),
         all = Tensor::zeros({n * longest}, in.dtype());
  const size_t es = dtype_size(in.dtype());
  if (in.numel() > 0) std::memcpy(padded.data_ptr(), in.data_ptr(), size_t(in.numel()) * es);
  all_gather(all, padded);
  if (rank() != root) return Tensor();
  if (counts) counts->assign(len, len + n);
  Tensor out = Tensor::empty({std::accumulate(len, len + n, int64_t(0))}, in.dtype());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (int r = 0; r < n; r++) {
    if (len[r] == 0) continue;
    std::memcpy(dst, static_cast<const char*>(all.data_ptr()) + size_t(r * longest) * es,
                size_t(len[r]) * es);
    dst += size_t(len[r]) * es;
  }
  return out;
}

std::vector<std::string> ProcessGroup::all_gather_strings(const std::string& mine) {
  const int n = size();
  Tensor lengths = Tensor::zeros({n}, DType::i64);
  all_gather(lengths, Tensor::from_vector(std::vector<int64_t>{int64_t(mine.size())}, {1}));
  int64_t longest = 1;
  for (int r = 0; r < n; r++) longest = std::max(longest, lengths.data<int64_t>()[r]);
  Tensor padded = Tensor::zeros({longest}, DType::u8),
         all = Tensor::zeros({n * longest}, DType::u8);
  std::copy(mine.begin(), mine.end(), padded.data<uint8_t>());
  all_gather(all, padded);
  std::vector<std::string> out;
  for (int r = 0; r < n; r++) {
    const char* begin = reinterpret_cast<const char*>(all.data<uint8_t>() + r * longest);
    out.emplace_back(begin, size_t(lengths.data<int64_t>()[r]));
  }
  return out;
}

std::unique_ptr<ProcessGroup> world_group() {
  // A process without a launcher is a world of one: its collectives are copies, without MPI.
  if (!mpi_world().mpi) return std::make_unique<LocalProcessGroup>(0, 1);
  return std::make_unique<MpiProcessGroup>(MPI_COMM_WORLD, "world");
}

} // namespace vlm::parallel
