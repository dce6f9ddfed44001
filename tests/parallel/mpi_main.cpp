// The MPI tests' main: every rank runs the same Catch2 session (collectives need every rank), and
// every rank exits with the worst result of all, so mpirun fails when any rank failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "parallel/comm/mpi.h"

#include "parallel/comm/mpi_env.h"

int main(int argc, char** argv) {
  vlm::parallel::require_mpi(); // MPI up before any test (even with -np 1); finalized at exit
  const int failed = Catch::Session().run(argc, argv);
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst == 0 ? 0 : 1;
}
