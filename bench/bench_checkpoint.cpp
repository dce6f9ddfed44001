// Checkpoint write and read bandwidth against plain POSIX I/O of the same bytes, in one run
// (`mpirun -np N bench/bench_checkpoint [--mib M] [--tensors K] [--iters I] [--dir DIR]`; --help:
// the defaults).
//
// A model of M MiB (default 1024) as K f32 tensors, each sharded by dim-0 rows over the N ranks as
// FSDP shards it. The checkpoint side is what `vlmtrain train` does for the model part of a save:
// io::Hdf5StateWriter over MPI_COMM_WORLD, every rank writing its rows of every tensor (one
// collective MPI-IO write each), close, fsync. The reference writes the same rows at the same
// offsets of one file with pwrite() from every rank, then fsync. Reads: Hdf5StateReader's
// read_rows_into of each rank's rows against pread() of them. Both sides run alternately, I times
// after a warm-up, every rank starting together; the time of a run is the slowest rank's; the
// median is reported (bench/timing.h). Rank 0 prints GB/s and ratio = reference time /
// checkpoint time (target >= 0.7). Reads come from the page cache on both sides (the bench cannot
// drop it), so they time the software path, not the disk.
#include "parallel/comm/mpi.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/record.h"
#include "bench/timing.h"
#include "io/state/hdf5_state.h"
#include "parallel/comm/mpi_env.h"
#include "parallel/comm/process_group.h"
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

// The system's folder for temporary files ("" if there is none: the files' paths then fail).
std::string temp_dir() {
  std::error_code ec;
  return std::filesystem::temp_directory_path(ec).string();
}

struct Options {
  int64_t mib = 1024, tensors = 64;
  bench::Timing timing{1, 3};
  std::string dir = temp_dir();
};

void add_options(CLI::App& app, Options& o) {
  cli::show_defaults(app);
  app.add_option("--mib", o.mib, "the model's size in MiB")->check(cli::at_least(1));
  app.add_option("--tensors", o.tensors, "f32 tensors of the model")->check(cli::at_least(1));
  bench::add_timing_options(app, o.timing, "--iters", "runs of each side");
  app.add_option("--dir", o.dir, "the folder of the two files");
}

// This rank's shards of the model, and the bytes of the whole model and of this rank's part.
struct Model {
  std::vector<Shard> shards;
  int64_t total_bytes = 0, my_bytes = 0;
};

// K tensors of [rows, 1024] f32 summing to M MiB; rows split as FSDP does (ceil, last short).
Model make_model(const Options& o, int n, int rank) {
  const int64_t cols = 1024,
                rows = std::max<int64_t>(1, o.mib * (1 << 20) / o.tensors / (cols * 4));
  const int64_t per_rank = (rows + n - 1) / n;
  Model m;
  Rng rng(uint64_t(rank) + 1);
  for (int64_t t = 0; t < o.tensors; t++) {
    Shard s;
    s.key = "model/layers." + std::to_string(t) + ".weight";
    s.global = {rows, cols};
    s.row_begin = std::min(rows, per_rank * rank);
    const int64_t mine = std::min(rows, s.row_begin + per_rank) - s.row_begin;
    s.rows = Tensor::randn({mine, cols}, rng);
    s.offset = m.total_bytes + s.row_begin * cols * 4;
    m.total_bytes += rows * cols * 4;
    m.my_bytes += mine * cols * 4;
    m.shards.push_back(std::move(s));
  }
  return m;
}

// The checkpoint side: every rank's rows of every tensor through Hdf5StateWriter, then fsync.
void write_h5(const std::vector<Shard>& shards, const std::string& h5) {
  io::Hdf5StateWriter out(h5, MPI_COMM_WORLD);
  for (const Shard& s : shards) out.write_rows(s.key, s.global, DType::f32, s.row_begin, s.rows);
  out.close();
  fsync_file(h5);
}

// The reference: the same rows at the same offsets with pwrite(), then fsync.
void write_raw(const std::vector<Shard>& shards, const std::string& raw, int rank) {
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
}

void read_h5(std::vector<Shard>& shards, const std::string& h5) {
  io::Hdf5StateReader in(h5, MPI_COMM_WORLD);
  for (Shard& s : shards) in.read_rows_into(s.key, s.row_begin, s.rows);
}

void read_raw(std::vector<Shard>& shards, const std::string& raw) {
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
}

int run(const Options& o) {
  const parallel::MpiWorld& world = parallel::require_mpi();
  const int n = world.size, rank = world.rank;
  Model m = make_model(o, n, rank);
  const double total_bytes = double(m.total_bytes);
  const std::string h5 = o.dir + "/bench_checkpoint.h5", raw = o.dir + "/bench_checkpoint.raw";

  const std::unique_ptr<parallel::ProcessGroup> world_group = parallel::world_group();
  const bench::Timer timer(Device::cpu(), world_group.get());
  const auto [w_h5, w_raw] = timer.interleaved(
      o.timing, [&] { write_h5(m.shards, h5); }, [&] { write_raw(m.shards, raw, rank); });
  const auto [r_h5, r_raw] = timer.interleaved(
      o.timing, [&] { read_h5(m.shards, h5); }, [&] { read_raw(m.shards, raw); });
  if (rank == 0) {
    std::printf("checkpoint I/O: %d rank(s), %.0f MiB in %lld f32 tensors (%.0f MiB per rank), "
                "%s, median of %lld\n",
                n, total_bytes / (1 << 20), (long long)o.tensors, double(m.my_bytes) / (1 << 20),
                o.dir.c_str(), (long long)o.timing.iters);
    std::printf("%-6s %12s %12s %8s\n", "", "hdf5 GB/s", "write() GB/s", "ratio");
    std::printf("%-6s %12.2f %12.2f %8.2f\n", "write", total_bytes / w_h5 / 1e9,
                total_bytes / w_raw / 1e9, w_raw / w_h5);
    std::printf("%-6s %12.2f %12.2f %8.2f\n", "read", total_bytes / r_h5 / 1e9,
                total_bytes / r_raw / 1e9, r_raw / r_h5);
    // The records: plain pwrite() / pread() of the same bytes is the reference.
    const std::string case_name = std::to_string(int64_t(total_bytes) >> 20) + " MiB in " +
                                  std::to_string(o.tensors) + " f32 tensors, " + o.dir;
    const std::string mesh = std::to_string(n) + " ranks";
    bench::emit("bench_checkpoint", case_name, mesh, "cpu", "write_GBps", total_bytes / w_h5 / 1e9,
                total_bytes / w_raw / 1e9);
    bench::emit("bench_checkpoint", case_name, mesh, "cpu", "read_GBps", total_bytes / r_h5 / 1e9,
                total_bytes / r_raw / 1e9);
  }
  if (rank == 0) {
    std::filesystem::remove(h5);
    std::filesystem::remove(raw);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint write and read bandwidth against plain pwrite() / pread() of the same "
               "bytes (mpirun -np N).",
               "bench_checkpoint"};
  Options o;
  add_options(app, o);
  return bench::run_main(
      app, argc, argv, [&] { return run(o); }, parallel::abort_job_if_parallel);
}

#else

int main() {
  std::fprintf(stderr, "bench_checkpoint: this build has no parallel HDF5\n");
  return 1;
}

#endif
