// A write the OS refuses is an error naming the file and the OS reason, with what to do: a full
// disk is written to through /dev/full (every write fails with ENOSPC; no mount needed), by the
// atomic small-file writer and by the HDF5 checkpoint writer (HDF5's POSIX driver: a process
// without MPI); the texts of the other errors a disk gives (quota, read-only, I/O, permission).
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "io/state/atomic_file.h"
#include "io/state/hdf5_state.h"
#include "src/core/tensor.h"
#include "tests/error_of.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"

using namespace vlm;
using Catch::Matchers::Contains;
using vlm::testing::error_of;

namespace fs = std::filesystem;

namespace {

// A path in `tmp` that is a link to /dev/full: opened for writing, every write fails with ENOSPC.
std::string full_disk_path(const vlm::testing::TempDir& tmp, const std::string& name) {
  if (!fs::exists("/dev/full")) VLM_SKIP("no /dev/full on this system");
  fs::create_symlink("/dev/full", tmp.file(name));
  return tmp.file(name);
}

} // namespace

TEST_CASE("write errors: the OS reason is named, with what to do for a disk's errors") {
  CHECK(io::write_error_text(ENOSPC, "checkpoint.output_dir") ==
        std::string(std::strerror(ENOSPC)) +
            " (the disk of checkpoint.output_dir is full; free space or point "
            "checkpoint.output_dir elsewhere)");
  CHECK_THAT(io::write_error_text(ENOSPC), Contains("the disk is full; free space or write"));
  CHECK_THAT(io::write_error_text(EDQUOT, "checkpoint.output_dir"),
             Contains(std::strerror(EDQUOT)) &&
                 Contains("quota on the disk of checkpoint.output_dir is used up"));
  CHECK_THAT(io::write_error_text(EFBIG), Contains(std::strerror(EFBIG)) && Contains("ulimit -f"));
  CHECK_THAT(io::write_error_text(EROFS, "x.dir"), Contains("read-only; point x.dir elsewhere"));
  CHECK_THAT(io::write_error_text(EACCES),
             Contains(std::strerror(EACCES)) && Contains("no permission"));
  CHECK_THAT(io::write_error_text(EIO), Contains(std::strerror(EIO)) && Contains("I/O error"));
  CHECK(io::write_error_text(EINVAL) == std::strerror(EINVAL)); // no advice where none fits
}

TEST_CASE("write errors: an atomic file on a full disk names the file and the disk") {
  vlm::testing::TempDir tmp("write_errors");
  // The temporary the writer opens is the link: its writes fail as on a full disk.
  full_disk_path(tmp, "config.toml.tmp");
  const std::string data(1000, 'x');
  const std::string err = error_of([&] {
    io::write_file_atomic(tmp.file("config.toml"), {{data.data(), data.size()}}, "checkpoint",
                          "checkpoint.output_dir");
  });
  CHECK_THAT(err,
             Contains("checkpoint: cannot write '" + tmp.file("config.toml.tmp") +
                      "': No space left on device (the disk of checkpoint.output_dir is full"));
  CHECK_FALSE(fs::exists(fs::symlink_status(tmp.file("config.toml.tmp")))); // removed
  CHECK_FALSE(fs::exists(tmp.file("config.toml")));                         // nothing in place
}

#if VLM_WITH_HDF5
TEST_CASE("write errors: an HDF5 checkpoint on a full disk names the file and the disk") {
  vlm::testing::TempDir tmp("write_errors");
  const std::string path = full_disk_path(tmp, "state.h5");
  // HDF5's POSIX driver writes the superblock when it creates the file; whichever call meets the
  // full disk first, the error names the file and the OS reason, not HDF5's "can't write data".
  const std::string err = error_of([&] {
    io::Hdf5StateWriter w(path, MPI_COMM_WORLD, "checkpoint.output_dir");
    w.write_tensor("model/w", Tensor::zeros({256, 256}));
    w.write_json("state", {{"step", 4}});
    w.close();
  });
  INFO(err);
  CHECK_THAT(err, Contains("checkpoint: cannot write '" + path +
                           "': No space left on device (the disk of checkpoint.output_dir is "
                           "full; free space or point checkpoint.output_dir elsewhere) ["));
  CHECK_THAT(err, Contains("HDF5: "));
}
#endif
