// A tensor-parallel run's training state through the HDF5 checkpoint (issue 35), under
// `mpirun -np 4`: saved by FSDP 2 x TP 2 after step 2 — each rank writing its boxes: TP row
// segments and column blocks cut by FSDP rows, replicas writing nothing — and loaded by one process
// (whole tensors, bit for bit what the saving run holds), by TP 4, by FSDP 4 and by FSDP 2 x TP 2
// again; each continues for 2 steps on the same global batch. The same layout goes on
// bit-identically; the others give the same losses as the run that never stopped, to 1e-6
// relative (they add the same terms in another order).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "io/state/hdf5_state.h"
#include "model/model_spec.h"
#include "src/core/ops/shape_ops.h"
#include "src/train/train_state.h"
#include "tests/parallel/fsdp_fixture.h"
#include "tests/parallel/shared_temp_dir.h"

#if VLM_WITH_HDF5

using namespace vlm;
using namespace vlm::testing;
using parallel::MeshShape;

namespace {

constexpr int kGlobalMicroBatches = 4; // per step: 2 data ranks x accumulation 2 when saved
constexpr int kStop = 2, kSteps = 4;

// A family model trained in `shape` (TP by the family's plan when tp > 1, FSDP when dp > 1) on
// `ranks`, its share of every step's global batch each step.
struct TpRun {
  parallel::DeviceMesh mesh;
  ParallelFamilyModel run;
  std::shared_ptr<model::CausalLM>& model = run.model;
  parallel::Parallelized& parallelized = run.parallelized;
  std::unique_ptr<train::TrainStepper> stepper;
  std::vector<double> losses;
  const Family& family;

  TpRun(const Family& f, const train::TrainConfig& c, const MeshShape& shape,
        std::unique_ptr<parallel::ProcessGroup> ranks = parallel::world_group())
      : mesh(std::move(ranks), shape), run{loaded_family_model(f, c), {}}, family(f) {
    parallel::ParallelizeOptions o;
    if (shape.tp > 1) o.tp_plan = model::tp_plan(*model);
    parallelized = parallel::parallelize(*model, model->blocks(), mesh, o, Device::cpu());
    stepper = std::make_unique<train::TrainStepper>(c, model, parallelized);
  }
  void train(int from, int to) {
    const int dp = int(mesh.shape().dp()), per = kGlobalMicroBatches / dp;
    for (int s = from; s < to; s++) {
      std::vector<model::Batch> mine;
      for (int k = mesh.dp_rank() * per; k < (mesh.dp_rank() + 1) * per; k++)
        mine.push_back(micro_batch(family, s, k / 2, k % 2, 2, 2));
      losses.push_back(stepper->step(s, mine).loss);
    }
  }
  train::TrainState state(int64_t step) { return train_state(run, *stepper, step); }
  void load(const std::string& path, MPI_Comm comm) {
    train::TrainState st = state(0);
    st.load(io::Hdf5StateReader(path, comm));
    CHECK(st.step == kStop);
  }
  std::map<std::string, std::vector<double>> whole_params() {
    return testing::whole_params(*model, parallelized);
  }
};

void check_losses(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t s = 0; s < got.size(); s++) {
    INFO("step " << kStop + s + 1 << ": " << got[s] << " vs " << want[s]);
    CHECK(std::abs(got[s] - want[s]) <= 1e-6 * std::abs(want[s]));
  }
}

} // namespace

TEST_CASE("tp checkpoint: saved by FSDP 2 x TP 2, resumed by one process, TP 4, FSDP 4 and "
          "FSDP 2 x TP 2 with the same losses",
          "[4ranks][tp]") {
  auto world = parallel::world_group();
  INFO("[4ranks] cases run in the 4-rank job only (tests/CMakeLists.txt)");
  REQUIRE(world->size() == 4);
  const train::TrainConfig c = equivalence_config();
  // qwen3 untied, qwen3_vl tied, qwen3_5 hybrid (no TP 4: its 2 Gated DeltaNet key heads)
  for (const Family* f : {&all_families()[0], &all_families()[3], &all_families()[4]}) {
    INFO(f->name);
    SharedTempDir tmp;
    const std::string path = tmp.file("state.h5");
    TpRun straight(*f, c, {1, 2, 2});
    straight.train(0, kStop);
    {
      io::Hdf5StateWriter out(path, MPI_COMM_WORLD);
      straight.state(kStop).save(out);
      out.close();
    }
    const auto saved = straight.whole_params();
    straight.train(kStop, kSteps);
    const std::vector<double> want(straight.losses.begin() + kStop, straight.losses.end());

    { // One process (every rank alone, its own communicator): the whole tensors, bit for bit.
      TpRun one(*f, c, {1, 1, 1}, world->split(world->rank(), 0, "self"));
      one.load(path, MPI_COMM_SELF);
      for (const auto& p : one.model->named_parameters()) {
        INFO(p.name);
        CHECK(p.tensor.to_doubles() == saved.at(p.name));
      }
      one.train(kStop, kSteps);
      check_losses(one.losses, want);
    }
    if (std::string(f->snapshot) != "qwen3_5_tiny_hybrid") {
      TpRun tp4(*f, c, {1, 1, 4});
      tp4.load(path, MPI_COMM_WORLD);
      tp4.train(kStop, kSteps);
      check_losses(tp4.losses, want);
    }
    {
      TpRun fsdp4(*f, c, {1, 4, 1});
      fsdp4.load(path, MPI_COMM_WORLD);
      fsdp4.train(kStop, kSteps);
      check_losses(fsdp4.losses, want);
    }
    TpRun same(*f, c, {1, 2, 2});
    same.load(path, MPI_COMM_WORLD);
    same.train(kStop, kSteps);
    CHECK(same.losses == want);
    const auto want_params = straight.whole_params();
    for (const auto& [name, values] : same.whole_params()) {
      INFO(name);
      CHECK(values == want_params.at(name));
    }
  }
}

TEST_CASE("tp checkpoint: each parameter put together on rank 0, block by block, from the ranks' "
          "boxes is, bit for bit, what unshard_all holds (FSDP 2 x TP 2, TP 4, FSDP 4, HSDP 2 x 2)",
          "[4ranks][tp]") {
  auto world = parallel::world_group();
  REQUIRE(world->size() == 4);
  const train::TrainConfig c = equivalence_config();
  for (const Family* f : {&all_families()[0], &all_families()[3], &all_families()[4]}) {
    for (const MeshShape shape :
         {MeshShape{1, 2, 2}, MeshShape{1, 1, 4}, MeshShape{1, 4, 1}, MeshShape{2, 2, 1}}) {
      if (std::string(f->snapshot) == "qwen3_5_tiny_hybrid" && shape.tp == 4) continue;
      INFO(f->name << ", " << shape.str());
      TpRun run(*f, c, shape);
      run.train(0, 1); // trained values (replicas agree), not the initial ones
      const auto layouts = run.parallelized.param_layouts();
      // Each parameter in blocks of 3 rows (they cut the FSDP shards and the TP ranges anywhere).
      std::map<std::string, Tensor> gathered;
      for (const auto& p : run.model->named_parameters()) {
        const parallel::ParamLayout* layout = parallel::find_layout(&layouts, p.name);
        const int64_t rows = layout ? layout->full_shape[0] : p.tensor.size(0);
        std::vector<Tensor> blocks;
        for (int64_t r = 0; r < rows; r += 3) {
          Tensor block = parallel::gather_param_rows(p.name, p.tensor, layout, *world, 0, r,
                                                     std::min(rows, r + 3));
          CHECK(block.defined() == (world->rank() == 0));
          if (block.defined()) blocks.push_back(block);
        }
        if (world->rank() == 0) gathered[p.name] = concat(blocks, 0);
      }
      run.parallelized.unshard_all();
      if (world->rank() == 0)
        for (const auto& p : run.model->named_parameters()) {
          INFO(p.name);
          REQUIRE(gathered.count(p.name));
          const Tensor want = p.tensor.to(Device::cpu()).contiguous(), &got = gathered[p.name];
          REQUIRE(got.shape() == want.shape());
          REQUIRE(got.dtype() == want.dtype());
          CHECK(std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()) == 0);
        }
      run.parallelized.reshard_all();
    }
  }
}

#endif // VLM_WITH_HDF5
