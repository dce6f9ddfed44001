#include "parallel/mpi_env.h"

#include "parallel/mpi.h"

#include <cstdlib>

#include "src/base/check.h"
#include "src/base/logging.h"

namespace vlm::parallel {

namespace {

MpiWorld init_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    VLM_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
              "MPI_Init_thread failed");
    VLM_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level ", provided,
              ", below MPI_THREAD_FUNNELED");
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  MpiWorld w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &w.local_rank);
  MPI_Comm_size(node, &w.local_size);
  MPI_Comm_free(&node);
  set_log_rank(w.rank, w.size); // "[rank r/W] " before every log line and error of a parallel job
  return w;
}

} // namespace

const MpiWorld& mpi_world() {
  static const MpiWorld world = init_world();
  return world;
}

void abort_job_if_parallel(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

} // namespace vlm::parallel
