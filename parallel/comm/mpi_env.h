// MPI for the whole process, initialized only where a job needs it. A process started by a
// launcher (mpirun, srun, mpiexec: their environment says so, launched_by_mpi()) initializes MPI
// on first use (MPI_Init_thread with MPI_THREAD_FUNNELED: only the main thread communicates) and
// registers MPI_Finalize at exit. A process started without one is a world of one rank that
// never touches MPI: its start needs nothing of MPI's (shared-memory files, a PMIx server), so a
// single-process run works where MPI_Init would fail (a file-size limit, a sandbox), and its
// process groups are stand-ins (parallel/comm/local_group.h). Programs that are MPI programs in any
// case (benchmarks, the MPI tests' main, NCCL checks) call require_mpi() first.
// Only standard MPI calls: OpenMPI here, ParaStation MPI and Intel MPI on the clusters (and, in a
// build without MPI, the one-rank stand-in of parallel/comm/mpi.h).
#pragma once

namespace vlm::parallel {

struct MpiWorld {
  int rank = 0, size = 1;             // in MPI_COMM_WORLD
  int local_rank = 0, local_size = 1; // among the ranks of this node (MPI_COMM_TYPE_SHARED)
  bool mpi = false;                   // MPI is initialized (else a world of one without it)
};

// The environment of an MPI launcher: OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE), PMI (MPICH's
// Hydra, Intel MPI, ParaStation: PMI_RANK / PMI_SIZE), PMIx (PMIX_RANK), or a SLURM job step of
// srun (SLURM_STEP_NUM_TASKS); VLM_MPI=1 asks for MPI anyway.
bool launched_by_mpi();

// The world: MPI initialized on first use under a launcher (or after require_mpi()), else a world
// of one without MPI. The same afterwards.
const MpiWorld& mpi_world();

// Initializes MPI (if it is not yet) whether or not a launcher started the process; an error if
// mpi_world() already settled on a world without MPI.
const MpiWorld& require_mpi();

// After an error on this rank (main() calls it once the error is printed): when MPI runs with
// more than one rank, MPI_Abort ends every rank of the job at once with `code`, so no peer waits
// in a collective for this one. Returns when MPI was never initialized or the job has one rank.
void abort_job_if_parallel(int code);

} // namespace vlm::parallel
