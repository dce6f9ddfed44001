// Collectives through our ProcessGroup against the same raw MPI calls on the same buffers, in one
// run (`mpirun -np N bench/bench_collectives [--max-mib M] [--iters K]`): for all-gather,
// reduce-scatter and all-reduce of f32 CPU tensors over message sizes, the median time of K
// iterations of each side (interleaved, after a warm-up) and the bus bandwidth as nccl-tests
// defines it (algbw x (n-1)/n for gathers and scatters, x 2(n-1)/n for all-reduce). Rank 0 prints
// the table; ratio = raw time / ours (target >= 0.95). NCCL against raw NCCL comes with the NCCL
// backend.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "parallel/mpi_env.h"
#include "parallel/process_group.h"
#include "src/core/tensor.h"

using namespace vlm;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `iters` runs of each of a and b, alternating, every rank starting together.
std::pair<double, double> time_pair(const std::function<void()>& a, const std::function<void()>& b,
                                    int iters) {
  std::vector<double> ta, tb;
  for (int i = 0; i < iters + 2; i++) {
    for (int side = 0; side < 2; side++) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      (side == 0 ? a : b)();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); // the slowest rank
      if (i >= 2) (side == 0 ? ta : tb).push_back(s);
    }
  }
  return {median(ta), median(tb)};
}

} // namespace

int main(int argc, char** argv) {
  int64_t max_mib = 16, iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--max-mib")
      max_mib = std::atoll(argv[i + 1]);
    else if (a == "--iters")
      iters = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_collectives [--max-mib M (16)] [--iters K (10)]\n");
      return 2;
    }
  }
  const parallel::MpiWorld& w = parallel::mpi_world();
  auto g = parallel::world_group();
  const int n = w.size;
  if (w.rank == 0)
    std::printf("collectives over MPI, %d ranks, f32 CPU tensors, median of %lld\n%-15s %10s "
                "%12s %12s %12s %8s\n",
                n, (long long)iters, "collective", "bytes", "ours GB/s", "raw GB/s", "ours us",
                "ratio");
  const double gather_factor = double(n - 1) / n, reduce_factor = 2.0 * double(n - 1) / n;
  for (int64_t bytes = 4096; bytes <= max_mib << 20; bytes *= 4) {
    const int64_t per_rank = bytes / 4 / n; // f32 elements of one rank's block
    if (per_rank == 0) continue;
    const int64_t total = per_rank * n;
    Tensor block = Tensor::full({per_rank}, 1.0, DType::f32),
           all = Tensor::full({total}, 1.0, DType::f32);
    Tensor out_block = Tensor::zeros({per_rank}, DType::f32),
           out_all = Tensor::zeros({total}, DType::f32);
    struct Row {
      const char* name;
      std::function<void()> ours, raw;
      double factor;
    };
    const int cnt = int(per_rank), tot = int(total);
    const std::vector<Row> rows = {
        {"all_gather", [&] { g->all_gather(out_all, block); },
         [&] {
           MPI_Allgather(block.data_ptr(), cnt * 4, MPI_BYTE, out_all.data_ptr(), cnt * 4, MPI_BYTE,
                         MPI_COMM_WORLD);
         },
         gather_factor},
        {"reduce_scatter", [&] { g->reduce_scatter(out_block, all); },
         [&] {
           MPI_Reduce_scatter_block(all.data_ptr(), out_block.data_ptr(), cnt, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
         },
         gather_factor},
        {"all_reduce", [&] { g->all_reduce(all); },
         [&] {
           MPI_Allreduce(MPI_IN_PLACE, all.data_ptr(), tot, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
         },
         reduce_factor},
    };
    for (const Row& r : rows) {
      const auto [ours, raw] = time_pair(r.ours, r.raw, int(iters));
      const double gb = double(total) * 4 / 1e9;
      if (w.rank == 0)
        std::printf("%-15s %10lld %12.3f %12.3f %12.1f %7.2fx\n", r.name, (long long)(total * 4),
                    gb / ours * r.factor, gb / raw * r.factor, ours * 1e6, raw / ours);
    }
  }
  return 0;
}
