// A temporary directory every rank of MPI_COMM_WORLD sees: rank 0 makes it and sends its path to
// the others; rank 0 removes it after every rank is done with it (a barrier).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/mpi.h"
#include "tests/temp_dir.h"

namespace vlm::testing {

struct SharedTempDir {
  std::unique_ptr<TempDir> owned;
  std::string dir;
  SharedTempDir() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::vector<char> buf(4096, '\0');
    if (rank == 0) {
      owned = std::make_unique<TempDir>("mpi");
      const std::string p = owned->dir.string();
      std::copy(p.begin(), p.end(), buf.begin());
    }
    MPI_Bcast(buf.data(), int(buf.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    dir = buf.data();
  }
  ~SharedTempDir() { MPI_Barrier(MPI_COMM_WORLD); }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  std::string file(const std::string& name) const { return dir + "/" + name; }
};

} // namespace vlm::testing
