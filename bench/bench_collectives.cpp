// Collectives through our ProcessGroup against the same raw library calls on the same buffers, in
// one run (`mpirun -np N bench/bench_collectives [--max-mib M] [--iters K] [--device cpu|cuda]`):
// for all-gather, reduce-scatter and all-reduce of f32 tensors over message sizes, the median time
// of K iterations of each side (interleaved, after a warm-up) and the bus bandwidth as nccl-tests
// defines it (algbw x (n-1)/n for gathers and scatters, x 2(n-1)/n for all-reduce). Rank 0 prints
// the table; ratio = raw time / ours (target >= 0.95).
//   cpu   ours (MPI) against raw MPI_Allgather / MPI_Reduce_scatter_block / MPI_Allreduce; the
//         "_async" rows time the nonblocking path FSDP uses (MPI_I* + wait) against the same raw
//         blocking call;
//   cuda  ours (NCCL on the group's communication stream, ordered by events) against the raw
//         NCCL calls on a communicator and stream of the bench's own, each side synchronized
//         after every call; one GPU per rank (cuda:local_rank).
#include "parallel/mpi.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/mpi_timing.h"
#include "kernels/nccl.h"
#include "parallel/mpi_env.h"
#include "parallel/process_group.h"
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

} // namespace

int main(int argc, char** argv) {
  int64_t max_mib = 16, iters = 10;
  std::string device_name = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--max-mib")
      max_mib = std::atoll(argv[i + 1]);
    else if (a == "--iters")
      iters = std::atoll(argv[i + 1]);
    else if (a == "--device")
      device_name = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: bench_collectives [--max-mib M (16)] [--iters K (10)] "
                           "[--device cpu|cuda (cpu)]\n");
      return 2;
    }
  }
  const parallel::MpiWorld& w = parallel::require_mpi();
  auto g = parallel::world_group();
  const int n = w.size;
  const bool cuda = device_name == "cuda";
  if (cuda && cuda_device_count() == 0) {
    if (w.rank == 0) std::fprintf(stderr, "bench_collectives: --device cuda but no CUDA device\n");
    return 2;
  }
  const Device device =
      cuda ? parse_device("cuda:" + std::to_string(w.local_rank % cuda_device_count()))
           : Device::cpu();
  std::unique_ptr<RawNccl> raw_nccl;
  if (cuda) raw_nccl = std::make_unique<RawNccl>(device, w.rank, n);
  // CUDA: wait for the side's stream, so the time is the collective's.
  auto finish = [&](bool ours) {
    if (!cuda) return;
    (ours ? current_stream(device) : raw_nccl->stream).synchronize();
  };
  if (w.rank == 0)
    std::printf("collectives over %s, %d ranks, f32 %s tensors, median of %lld\n%-20s %10s %12s "
                "%12s %12s %8s\n",
                cuda ? "NCCL" : "MPI", n, cuda ? "CUDA" : "CPU", (long long)iters, "collective",
                "bytes", "ours GB/s", "raw GB/s", "ours us", "ratio");
  const double gather_factor = double(n - 1) / n, reduce_factor = 2.0 * double(n - 1) / n;
  for (int64_t bytes = 4096; bytes <= max_mib << 20; bytes *= 4) {
    const int64_t per_rank = bytes / 4 / n; // f32 elements of one rank's block
    if (per_rank == 0) continue;
    const int64_t total = per_rank * n;
    Tensor block = Tensor::full({per_rank}, 1.0, DType::f32, device),
           all = Tensor::full({total}, 1.0, DType::f32, device);
    Tensor out_block = Tensor::zeros({per_rank}, DType::f32, device),
           out_all = Tensor::zeros({total}, DType::f32, device);
    struct Row {
      const char* name;
      std::function<void()> ours, raw;
      double factor;
    };
    const int cnt = int(per_rank), tot = int(total);
    void* rs = cuda ? raw_nccl->stream.handle() : nullptr;
    void* rc = cuda ? raw_nccl->comm : nullptr;
    using kernels::cuda::NcclOp;
    const std::function<void()> raw_gather = [&] {
      if (cuda)
        kernels::cuda::nccl_all_gather(block.data_ptr(), out_all.data_ptr(), size_t(cnt),
                                       DType::f32, rc, rs);
      else
        MPI_Allgather(block.data_ptr(), cnt, MPI_FLOAT, out_all.data_ptr(), cnt, MPI_FLOAT,
                      MPI_COMM_WORLD);
      finish(false);
    };
    const std::function<void()> raw_scatter = [&] {
      if (cuda)
        kernels::cuda::nccl_reduce_scatter(all.data_ptr(), out_block.data_ptr(), size_t(cnt),
                                           DType::f32, NcclOp::sum, rc, rs);
      else
        MPI_Reduce_scatter_block(all.data_ptr(), out_block.data_ptr(), cnt, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
      finish(false);
    };
    const std::function<void()> raw_reduce = [&] {
      if (cuda)
        kernels::cuda::nccl_all_reduce(all.data_ptr(), all.data_ptr(), size_t(tot), DType::f32,
                                       NcclOp::sum, rc, rs);
      else
        MPI_Allreduce(MPI_IN_PLACE, all.data_ptr(), tot, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      finish(false);
    };
    std::vector<Row> rows = {
        {"all_gather", [&] { g->all_gather(out_all, block), finish(true); }, raw_gather,
         gather_factor},
        {"reduce_scatter", [&] { g->reduce_scatter(out_block, all), finish(true); }, raw_scatter,
         gather_factor},
        {"all_reduce", [&] { g->all_reduce(all), finish(true); }, raw_reduce, reduce_factor},
    };
    if (!cuda) { // CUDA collectives are all asynchronous already
      rows.push_back({"all_gather_async", [&] { g->all_gather_async(out_all, block)->wait(); },
                      raw_gather, gather_factor});
      rows.push_back({"reduce_scatter_async",
                      [&] { g->reduce_scatter_async(out_block, all)->wait(); }, raw_scatter,
                      gather_factor});
    }
    for (const Row& r : rows) {
      const auto [ours, raw] = bench::time_pair(r.ours, r.raw, int(iters), 2);
      const double gb = double(total) * 4 / 1e9;
      if (w.rank == 0)
        std::printf("%-20s %10lld %12.3f %12.3f %12.1f %7.2fx\n", r.name, (long long)(total * 4),
                    gb / ours * r.factor, gb / raw * r.factor, ours * 1e6, raw / ours);
    }
  }
  return 0;
}
