// Stored dtypes and carried tensors under FSDP, DDP and HSDP (model/stored_tensors.h): a bf16 run
// of the tiny Qwen3.5 snapshot typed like the official checkpoints over every rank at learning rate
// 0 seeds each rank's rows of the fp32 masters from the stored F32 values and writes the carried
// mtp.* tensors; its HF snapshot (the masters gathered) and its state.h5 exported by one process
// hold every tensor bit for bit as stored.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "io/state/hdf5_state.h"
#include "parallel/comm/mpi.h"
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
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"fsdp", {"parallel.data_parallel=fsdp"}}};
  if (world > 1) layouts.push_back({"ddp", {"parallel.data_parallel=ddp"}});
  if (world == 4) // replicas hold the same rows: only the first one's count
    layouts.push_back(
        {"hsdp",
         {"parallel.data_parallel=fsdp", "parallel.dp_replicate=2", "parallel.dp_shard=2"}});
  for (auto& [layout, options] : layouts) {
    INFO(layout);
    const std::string out = tmp.file("out_" + layout), exported = tmp.file("exported_" + layout);
    options.push_back("data.num_workers=1");
    std::string hf_snapshot;
    {
      train::Trainer trainer(zero_lr_config(snap, data, out, options));
      const train::TrainSummary summary = trainer.run();
      REQUIRE(summary.steps == 1);
      hf_snapshot = summary.hf_snapshot;
    }
    if (rank == 0) {
      require_as_stored(hf_snapshot); // the run's own, its F32 tensors from the gathered masters
      REQUIRE(cli::cmd_export({"--checkpoint", out, "--out", exported, "--dtype", "bf16"}) == 0);
      require_as_stored(exported);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

#endif
