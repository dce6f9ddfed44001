// Checkpoint write and read bandwidth against plain POSIX I/O of the same bytes, in one run
// (`mpirun -np N bench/bench_checkpoint [--mib M] [--tensors K] [--iters I] [--dir DIR]`).
//
// A model of M MiB (default 1024) as K f32 tensors, each sharded by dim-0 rows over the N ranks as
// FSDP shards it. The checkpoint side is what `vlmtrain train` does for the model part of a save:
// io::Hdf5StateWriter over MPI_COMM_WORLD, every rank writing its rows of every tensor (one
// collective MPI-IO write each), close, fsync. The reference writes the same rows at the same
// offsets of one file with pwrite() from every rank, then fsync. Reads: Hdf5StateReader's
// read_rows_into of each rank's rows against pread() of them. Both sides run alternately, I times
// after a warm-up, every rank starting together; the time of a run is the slowest rank's; the
// median is reported. Rank 0 prints GB/s and ratio = reference time / checkpoint time (target
// >= 0.7). Reads come from the page cache on both sides (the bench cannot drop it), so they time
// the software path, not the disk.
#include "parallel/mpi.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "bench/mpi_timing.h"
#include "io/state/hdf5_state.h"
#include "parallel/mpi_env.h"
#include "src/base/check.h"
#include "src/base/rng.h"
#include "src/core/tensor.h"

using namespace vlm;

#if VLM_WITH_HDF5

namespace {

struct Shard {
  std::string key;
  Shape global;
  int64_t row_begin = 0;
  Tensor rows;        // this rank's rows
  int64_t offset = 0; // of this rank's rows in the reference file
};

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  VLM_CHECK(fd >= 0 && ::fsync(fd) == 0, "fsync ", path, ": ", std::strerror(errno));
  ::close(fd);
}

} // namespace

int main(int argc, char** argv) {
  const parallel::MpiWorld& world = parallel::require_mpi();
  int64_t mib = 1024, tensors = 64, iters = 3;
  std::string dir = std::filesystem::temp_directory_path().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib")
      mib = std::atoll(argv[i + 1]);
    else if (a == "--tensors")
      tensors = std::atoll(argv[i + 1]);
    else if (a == "--iters")
      iters = std::atoll(argv[i + 1]);
    else if (a == "--dir")
      dir = argv[i + 1];
    else
      VLM_FAIL("unknown option ", a, " (--mib M --tensors K --iters I --dir DIR)");
  }
  const int n = world.size, rank = world.rank;
  // K tensors of [rows, 1024] f32 summing to M MiB; rows split as FSDP does (ceil, last short).
  const int64_t cols = 1024, rows = std::max<int64_t>(1, mib * (1 << 20) / tensors / (cols * 4));
  const int64_t per_rank = (rows + n - 1) / n;
  std::vector<Shard> shards;
  Rng rng(uint64_t(rank) + 1);
  int64_t file_offset = 0, my_bytes = 0;
  for (int64_t t = 0; t < tensors; t++) {
    Shard s;
    s.key = "model/layers." + std::to_string(t) + ".weight";
    s.global = {rows, cols};
    s.row_begin = std::min(rows, per_rank * rank);
    const int64_t mine = std::min(rows, s.row_begin + per_rank) - s.row_begin;
    s.rows = Tensor::randn({mine, cols}, rng);
    s.offset = file_offset + s.row_begin * cols * 4;
    file_offset += rows * cols * 4;
    my_bytes += mine * cols * 4;
    shards.push_back(std::move(s));
  }
  const double total_bytes = double(file_offset);
  const std::string h5 = dir + "/bench_checkpoint.h5", raw = dir + "/bench_checkpoint.raw";

  auto write_h5 = [&] {
    io::Hdf5StateWriter out(h5, MPI_COMM_WORLD);
    for (const Shard& s : shards) out.write_rows(s.key, s.global, DType::f32, s.row_begin, s.rows);
    out.close();
    fsync_file(h5);
  };
  auto write_raw = [&] {
    if (rank == 0) { // created and sized once, as HDF5 creates its file
      const int fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      VLM_CHECK(fd >= 0, "open ", raw, ": ", std::strerror(errno));
      ::close(fd);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const int fd = ::open(raw.c_str(), O_WRONLY);
    VLM_CHECK(fd >= 0, "open ", raw, ": ", std::strerror(errno));
    for (const Shard& s : shards) {
      const char* p = static_cast<const char*>(s.rows.data_ptr());
      for (int64_t done = 0, size = int64_t(s.rows.nbytes()); done < size;) {
        const ssize_t w = ::pwrite(fd, p + done, size_t(size - done), s.offset + done);
        VLM_CHECK(w > 0, "pwrite ", raw, ": ", std::strerror(errno));
        done += w;
      }
    }
    VLM_CHECK(::fsync(fd) == 0, "fsync ", raw, ": ", std::strerror(errno));
    ::close(fd);
  };
  auto read_h5 = [&] {
    io::Hdf5StateReader in(h5, MPI_COMM_WORLD);
    for (Shard& s : shards) in.read_rows_into(s.key, s.row_begin, s.rows);
  };
  auto read_raw = [&] {
    const int fd = ::open(raw.c_str(), O_RDONLY);
    VLM_CHECK(fd >= 0, "open ", raw, ": ", std::strerror(errno));
    for (Shard& s : shards) {
      char* p = static_cast<char*>(s.rows.data_ptr());
      for (int64_t done = 0, size = int64_t(s.rows.nbytes()); done < size;) {
        const ssize_t r = ::pread(fd, p + done, size_t(size - done), s.offset + done);
        VLM_CHECK(r > 0, "pread ", raw, ": ", std::strerror(errno));
        done += r;
      }
    }
    ::close(fd);
  };

  const auto [w_h5, w_raw] = bench::time_pair(write_h5, write_raw, int(iters), 1);
  const auto [r_h5, r_raw] = bench::time_pair(read_h5, read_raw, int(iters), 1);
  if (rank == 0) {
    std::printf("checkpoint I/O: %d rank(s), %.0f MiB in %lld f32 tensors (%.0f MiB per rank), "
                "%s, median of %lld\n",
                n, total_bytes / (1 << 20), (long long)tensors, double(my_bytes) / (1 << 20),
                dir.c_str(), (long long)iters);
    std::printf("%-6s %12s %12s %8s\n", "", "hdf5 GB/s", "write() GB/s", "ratio");
    std::printf("%-6s %12.2f %12.2f %8.2f\n", "write", total_bytes / w_h5 / 1e9,
                total_bytes / w_raw / 1e9, w_raw / w_h5);
    std::printf("%-6s %12.2f %12.2f %8.2f\n", "read", total_bytes / r_h5 / 1e9,
                total_bytes / r_raw / 1e9, r_raw / r_h5);
  }
  if (rank == 0) {
    std::filesystem::remove(h5);
    std::filesystem::remove(raw);
  }
  return 0;
}

#else

int main() {
  std::fprintf(stderr, "bench_checkpoint: this build has no parallel HDF5\n");
  return 1;
}

#endif
