// MPI for the whole process. The first call initializes it (MPI_Init_thread with
// MPI_THREAD_FUNNELED: only the main thread communicates) unless the program already did, under
// mpirun, srun or as a single process with no launcher, and registers MPI_Finalize at exit.
// Only standard MPI calls: OpenMPI here, ParaStation MPI and Intel MPI on the clusters (and, in a
// build without MPI, the one-rank stand-in of parallel/mpi.h).
#pragma once

namespace vlm::parallel {

struct MpiWorld {
  int rank = 0, size = 1;             // in MPI_COMM_WORLD
  int local_rank = 0, local_size = 1; // among the ranks of this node (MPI_COMM_TYPE_SHARED)
};

// Initializes MPI on first use; the same world afterwards.
const MpiWorld& mpi_world();

// After an error on this rank (main() calls it once the error is printed): when MPI runs with
// more than one rank, MPI_Abort ends every rank of the job at once with `code`, so no peer waits
// in a collective for this one. Returns when MPI was never initialized or the job has one rank.
void abort_job_if_parallel(int code);

} // namespace vlm::parallel
