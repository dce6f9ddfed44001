// Collectives through our ProcessGroup against the same raw library calls on the same buffers, in
// one run (`mpirun -np N bench/bench_collectives [--max-mib M] [--iters K] [--device cpu|cuda]`;
// --help: the defaults):
// for all-gather, reduce-scatter and all-reduce of f32 tensors over message sizes, the median time
// of K runs of each side (interleaved, after warm-ups: bench/timing.h) and the bus bandwidth as
// nccl-tests defines it (algbw x (n-1)/n for gathers and scatters, x 2(n-1)/n for all-reduce). Rank
// 0 prints the table; ratio = raw time / ours (target >= 0.95).
//   cpu   ours (MPI) against raw MPI_Allgather / MPI_Reduce_scatter_block / MPI_Allreduce; the
//         "_async" rows time the nonblocking path FSDP uses (MPI_I* + wait) against the same raw
//         blocking call;
//   cuda  ours (NCCL on the group's communication stream, ordered by events) against the raw
//         NCCL calls on a communicator and stream of the bench's own, each side synchronized
//         after every call; one GPU per rank (cuda:local_rank).
#include "parallel/comm/mpi.h"

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/record.h"
#include "bench/timing.h"
#include "kernels/nccl.h"
#include "parallel/comm/mpi_env.h"
#include "parallel/comm/process_group.h"
#include "src/core/device.h"
#include "src/core/stream.h"
#include "src/core/tensor.h"

using namespace vlm;

namespace {

// The bench's own NCCL communicator and stream (the raw side on CUDA).
struct RawNccl {
  void* comm = nullptr;
  Stream stream;
  RawNccl(Device device, int rank, int n) {
    char id[kernels::cuda::kNcclUniqueIdBytes] = {};
    if (rank == 0) kernels::cuda::nccl_unique_id(id);
    MPI_Bcast(id, int(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD);
    DeviceGuard guard(device);
    comm = kernels::cuda::nccl_comm_init(id, n, rank);
    stream = Stream::create(device);
  }
  ~RawNccl() { kernels::cuda::nccl_comm_destroy(comm); }
};

struct Options {
  int64_t max_mib = 16;
  bench::Timing timing{2, 10};
  std::string device = "cpu";
};

void add_options(CLI::App& app, Options& o) {
  cli::show_defaults(app);
  app.add_option("--max-mib", o.max_mib, "largest message in MiB (sizes from 4 KiB, x4 each)")
      ->check(cli::at_least(1));
  bench::add_timing_options(app, o.timing, "--iters", "runs of each side");
  app.add_option("--device", o.device, "cpu (MPI) or cuda (NCCL, cuda:local_rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

// Both sides: our world group, and on CUDA the bench's own NCCL communicator and stream.
struct Sides {
  int n = 1;
  bool cuda = false;
  Device device = Device::cpu();
  std::unique_ptr<parallel::ProcessGroup> g;
  std::unique_ptr<RawNccl> raw_nccl;
  // CUDA: wait for the side's stream, so the time is the collective's.
  void finish(bool ours) const {
    if (!cuda) return;
    (ours ? current_stream(device) : raw_nccl->stream).synchronize();
  }
};

// The f32 tensors of one message size: a rank's block and the whole, as input and output.
struct Buffers {
  int64_t per_rank, total;
  Tensor block, all, out_block, out_all;
  Buffers(int64_t per_rank_, int n, Device device)
      : per_rank(per_rank_), total(per_rank_ * n),
        block(Tensor::full({per_rank}, 1.0, DType::f32, device)),
        all(Tensor::full({total}, 1.0, DType::f32, device)),
        out_block(Tensor::zeros({per_rank}, DType::f32, device)),
        out_all(Tensor::zeros({total}, DType::f32, device)) {}
};

// One row of the table: our call and the raw one, and the bus bandwidth's factor.
struct Row {
  const char* name;
  std::function<void()> ours, raw;
  double factor;
};

// The raw calls (raw NCCL on CUDA, blocking MPI on the CPU) of all-gather, reduce-scatter and
// all-reduce on `b`.
std::vector<std::function<void()>> raw_calls(const Sides& s, Buffers& b) {
  const int cnt = int(b.per_rank), tot = int(b.total);
  void* rs = s.cuda ? s.raw_nccl->stream.handle() : nullptr;
  void* rc = s.cuda ? s.raw_nccl->comm : nullptr;
  using kernels::cuda::NcclOp;
  const std::function<void()> raw_gather = [&s, &b, cnt, rc, rs] {
    if (s.cuda)
      kernels::cuda::nccl_all_gather(b.block.data_ptr(), b.out_all.data_ptr(), size_t(cnt),
                                     DType::f32, rc, rs);
    else
      MPI_Allgather(b.block.data_ptr(), cnt, MPI_FLOAT, b.out_all.data_ptr(), cnt, MPI_FLOAT,
                    MPI_COMM_WORLD);
    s.finish(false);
  };
  const std::function<void()> raw_scatter = [&s, &b, cnt, rc, rs] {
    if (s.cuda)
      kernels::cuda::nccl_reduce_scatter(b.all.data_ptr(), b.out_block.data_ptr(), size_t(cnt),
                                         DType::f32, NcclOp::sum, rc, rs);
    else
      MPI_Reduce_scatter_block(b.all.data_ptr(), b.out_block.data_ptr(), cnt, MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
    s.finish(false);
  };
  const std::function<void()> raw_reduce = [&s, &b, tot, rc, rs] {
    if (s.cuda)
      kernels::cuda::nccl_all_reduce(b.all.data_ptr(), b.all.data_ptr(), size_t(tot), DType::f32,
                                     NcclOp::sum, rc, rs);
    else
      MPI_Allreduce(MPI_IN_PLACE, b.all.data_ptr(), tot, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    s.finish(false);
  };
  return {raw_gather, raw_scatter, raw_reduce};
}

// The rows of one message size: ours against the raw calls on the same buffers.
std::vector<Row> rows_for(const Sides& s, Buffers& b) {
  const std::vector<std::function<void()>> raw = raw_calls(s, b);
  const double gather_factor = double(s.n - 1) / s.n, reduce_factor = 2.0 * double(s.n - 1) / s.n;
  parallel::ProcessGroup& g = *s.g;
  std::vector<Row> rows = {
      {"all_gather", [&] { g.all_gather(b.out_all, b.block), s.finish(true); }, raw[0],
       gather_factor},
      {"reduce_scatter", [&] { g.reduce_scatter(b.out_block, b.all), s.finish(true); }, raw[1],
       gather_factor},
      {"all_reduce", [&] { g.all_reduce(b.all), s.finish(true); }, raw[2], reduce_factor},
  };
  if (!s.cuda) { // CUDA collectives are all asynchronous already
    rows.push_back({"all_gather_async", [&] { g.all_gather_async(b.out_all, b.block)->wait(); },
                    raw[0], gather_factor});
    rows.push_back({"reduce_scatter_async",
                    [&] { g.reduce_scatter_async(b.out_block, b.all)->wait(); }, raw[1],
                    gather_factor});
  }
  return rows;
}

int run(const Options& o) {
  const parallel::MpiWorld& w = parallel::require_mpi();
  Sides s;
  s.n = w.size;
  s.g = parallel::world_group();
  s.cuda = o.device == "cuda";
  if (s.cuda && cuda_device_count() == 0) {
    if (w.rank == 0) std::fprintf(stderr, "bench_collectives: --device cuda but no CUDA device\n");
    return 2;
  }
  if (s.cuda) {
    s.device = parse_device("cuda:" + std::to_string(w.local_rank % cuda_device_count()));
    s.raw_nccl = std::make_unique<RawNccl>(s.device, w.rank, s.n);
  }
  if (w.rank == 0)
    std::printf("collectives over %s, %d ranks, f32 %s tensors, median of %lld\n%-20s %10s %12s "
                "%12s %12s %8s\n",
                s.cuda ? "NCCL" : "MPI", s.n, s.cuda ? "CUDA" : "CPU", (long long)o.timing.iters,
                "collective", "bytes", "ours GB/s", "raw GB/s", "ours us", "ratio");
  // Every rank starts each run together (the device idle), the slowest rank's time counts.
  const bench::Timer timer(s.device, s.g.get(), /*whole_device=*/true);
  for (int64_t bytes = 4096; bytes <= o.max_mib << 20; bytes *= 4) {
    const int64_t per_rank = bytes / 4 / s.n; // f32 elements of one rank's block
    if (per_rank == 0) continue;
    Buffers b(per_rank, s.n, s.device);
    for (const Row& r : rows_for(s, b)) {
      const auto [ours, raw] = timer.interleaved(o.timing, r.ours, r.raw);
      const double gb = double(b.total) * 4 / 1e9;
      if (w.rank == 0) {
        std::printf("%-20s %10lld %12.3f %12.3f %12.1f %7.2fx\n", r.name, (long long)(b.total * 4),
                    gb / ours * r.factor, gb / raw * r.factor, ours * 1e6, raw / ours);
        // The records: the raw library call is the reference (the scaling model reads bus_GBps).
        const std::string case_name =
            std::string(r.name) + " " + std::to_string(b.total * 4) + " bytes";
        const std::string mesh = std::to_string(s.n) + " ranks";
        const std::string device = (s.cuda ? s.device.str() : "cpu") + (s.cuda ? " nccl" : " mpi");
        bench::emit("bench_collectives", case_name, mesh, device, "bus_GBps", gb / ours * r.factor,
                    gb / raw * r.factor);
        bench::emit("bench_collectives", case_name, mesh, device, "time_us", ours * 1e6, raw * 1e6);
      }
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Collectives through ProcessGroup against the same raw library calls (mpirun -np N).",
      "bench_collectives"};
  Options o;
  add_options(app, o);
  return bench::run_main(
      app, argc, argv, [&] { return run(o); }, parallel::abort_job_if_parallel);
}
