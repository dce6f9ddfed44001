// Stored dtypes and carried tensors under FSDP (model/stored_tensors.h): a bf16 run of the tiny
// Qwen3.5 snapshot typed like the official checkpoints, sharded over every rank at learning rate
// 0, seeds each rank's rows of the fp32 masters from the stored F32 values and writes the carried
// mtp.* tensors; its state.h5, exported by one process, holds every tensor bit for bit as stored.
#include <catch2/catch.hpp>

#include "io/state/hdf5_state.h"
#include "parallel/mpi.h"
#include "src/cli/cmd_export.h"
#include "src/demo/demo_dataset.h"
#include "src/train/trainer.h"
#include "tests/parallel/shared_temp_dir.h"
#include "tests/train/stored_tensors_fixture.h"

#if VLM_WITH_HDF5

using namespace vlm;
using namespace vlm::testing;

TEST_CASE("stored tensors: an FSDP bf16 run's checkpoint exports every tensor as stored") {
  SharedTempDir tmp;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string data = tmp.file("demo_data"), snap = tmp.file("snapshot");
  if (rank == 0) {
    demo::make_demo_dataset(data);
    write_demo_snapshot(snap);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    // The run's own HF snapshot is left out: under FSDP it writes the F32 tensors from their bf16
    // parameters (the masters are shards), while `vlmtrain export` of the step reads the masters.
    train::Trainer trainer(zero_lr_config(
        snap, data, tmp.file("out"),
        {"parallel.data_parallel=fsdp", "checkpoint.hf_snapshot=never", "data.num_workers=1"}));
    REQUIRE(trainer.run().steps == 1);
  }
  if (rank == 0) {
    REQUIRE(cli::cmd_export({"--checkpoint", tmp.file("out"), "--out", tmp.file("exported"),
                             "--dtype", "bf16"}) == 0);
    require_as_stored(tmp.file("exported"));
  }
}

#endif
