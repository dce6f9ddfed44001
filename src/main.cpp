// vlmtrain: the command-line entry point. Library code throws vlm::Error; it is caught once here,
// printed with the rank, and in a multi-rank job every rank is ended (MPI_Abort), so no peer hangs
// in a collective waiting for this one; the process then ends without exit-time teardown.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "parallel/comm/mpi_env.h"
#include "src/base/logging.h"
#include "src/cli/cli.h"

int main(int argc, char** argv) {
#if defined(VLM_CPU_ARCH) && (defined(__x86_64__) || defined(_M_X64))
  // The kernels are built for VLM_CPU_ARCH (x86-64-v3 by default: AVX2 + FMA); say so rather
  // than die of an illegal instruction on an older CPU.
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::fprintf(stderr,
                 "error: vlmtrain was built for %s (AVX2, FMA), which this CPU lacks; "
                 "rebuild with cmake -DVLM_CPU_ARCH=x86-64\n",
                 VLM_CPU_ARCH);
    return 1;
  }
#endif
  try {
    return vlm::cli::run_cli(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%serror: %s\n", vlm::rank_prefix().c_str(), e.what());
    std::fflush(stderr);
    vlm::parallel::abort_job_if_parallel(1);
    // No exit-time teardown after an error: MPI_Finalize would run HDF5's cleanup of a file a
    // failed write left half-closed (a crash inside HDF5 1.10) and could wait for peers.
    std::fflush(nullptr);
    std::_Exit(1);
  }
}
