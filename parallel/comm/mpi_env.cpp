#include "parallel/comm/mpi_env.h"

#include "parallel/comm/mpi.h"

#include <cstdlib>
#include <cstring>
#include <optional>

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
  w.mpi = true;
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

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

std::optional<MpiWorld>& settled() {
  static std::optional<MpiWorld> world;
  return world;
}

} // namespace

bool launched_by_mpi() {
  if (const char* v = std::getenv("VLM_MPI"); v && std::strcmp(v, "1") == 0) return true;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
                           "SLURM_STEP_NUM_TASKS", "MPI_LOCALNRANKS"})
    if (env_set(name)) return true;
  return false;
}

const MpiWorld& mpi_world() {
  std::optional<MpiWorld>& w = settled();
  if (!w) {
    int initialized = 0;
    MPI_Initialized(&initialized); // a program that initialized MPI itself
    w = initialized || launched_by_mpi() ? init_world() : MpiWorld{};
  }
  return *w;
}

const MpiWorld& require_mpi() {
  std::optional<MpiWorld>& w = settled();
  if (!w) w = init_world();
  VLM_CHECK(w->mpi, "MPI is needed here, but this process already runs as a world of one without "
                    "MPI (no launcher: start it with mpirun or srun, or set VLM_MPI=1)");
  return *w;
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
