// The training state of a data-parallel run through the HDF5 checkpoint file, under
// `mpirun -np 1 | 2 | 4`: each rank writes its FSDP shard rows (replicas none) of whole datasets;
// one process loads the file whole and finds every rank's shard at its rows, AdamW moments and
// all; the same layout loads it back and continues bit-identically to a run that never stopped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>

#include "io/state/hdf5_state.h"
#include "src/core/autograd.h"
#include "src/train/train_state.h"
#include "tests/parallel/fsdp_fixture.h"
#include "tests/parallel/shared_temp_dir.h"

#if VLM_WITH_HDF5

using namespace vlm;
using namespace vlm::testing;
using parallel::MeshShape;

namespace {

constexpr int kAccumulation = 2;

struct Layout {
  const char* name;
  MeshShape shape;
};

std::vector<Layout> checkpoint_layouts(int world) {
  std::vector<Layout> out = {{"FSDP", {1, world, 1}}};
  if (world > 1) out.push_back({"DDP", {world, 1, 1}});
  if (world == 4) out.push_back({"HSDP 2x2", {2, 2, 1}});
  return out;
}

// A model of family `f` trained data-parallel in `layout`, one step at a time.
struct ParallelRun {
  parallel::DeviceMesh mesh;
  ParallelFamilyModel run; // FSDP even on one rank (mpirun -np 1)
  std::shared_ptr<model::CausalLM> model;
  parallel::Fsdp* fsdp;
  std::unique_ptr<train::TrainStepper> stepper;
  std::vector<double> losses;
  const Family& family;

  ParallelRun(const Family& f, const train::TrainConfig& c, const MeshShape& shape,
              std::unique_ptr<parallel::ProcessGroup> ranks = parallel::world_group())
      : mesh(std::move(ranks), shape),
        run(parallel_family_model(f, c, parallel::ParallelGroups::of(mesh))), model(run.model),
        fsdp(run.parallelized.fsdp()), family(f) {
    stepper = std::make_unique<train::TrainStepper>(c, model, run.step_parallel());
  }
  void train(int from, int to) {
    for (int s = from; s < to; s++) {
      std::vector<model::Batch> batches;
      for (int k = 0; k < kAccumulation; k++)
        batches.push_back(
            micro_batch(family, s, mesh.dp_rank(), k, kAccumulation, int(mesh.shape().dp())));
      losses.push_back(stepper->step(s, batches).loss);
    }
  }
  train::TrainState state(int64_t step) { return train_state(run, *stepper, step); }
  void save(const std::string& path, int64_t step) {
    io::Hdf5StateWriter out(path, MPI_COMM_WORLD);
    state(step).save(out);
    out.close();
  }
  std::map<std::string, std::vector<double>> whole_params() {
    std::map<std::string, std::vector<double>> out;
    fsdp->unshard_all();
    for (const auto& p : model->named_parameters()) out[p.name] = p.tensor.to_doubles();
    fsdp->reshard_all();
    return out;
  }
};

std::vector<double> rows_of(const std::vector<double>& whole, const Shape& shape, int64_t begin,
                            int64_t rows) {
  const int64_t row = shape.empty() ? 1 : vlm::numel(shape) / shape[0];
  return {whole.begin() + begin * row, whole.begin() + (begin + rows) * row};
}

const std::vector<const Family*> checkpoint_families() {
  // qwen3 untied, qwen3_vl tied, qwen3_5 hybrid
  return {&all_families()[0], &all_families()[3], &all_families()[4]};
}

} // namespace

TEST_CASE("fsdp checkpoint: a state saved by FSDP, DDP or HSDP loads whole into one process, "
          "every shard at its rows") {
  const int world = parallel::world_group()->size();
  const train::TrainConfig c = equivalence_config();
  for (const Family* f : checkpoint_families())
    for (const Layout& l : checkpoint_layouts(world)) {
      INFO(f->name << ", " << l.name);
      SharedTempDir tmp;
      const std::string path = tmp.file("state.h5");
      ParallelRun run(*f, c, l.shape);
      run.train(0, 2);
      run.save(path, 2);
      // One process (on every rank) loads the whole tensors.
      const ParallelFamilyModel whole_run = parallel_family_model(*f, c, {});
      const auto& whole = whole_run.model;
      train::TrainStepper single(c, whole);
      train::TrainState loaded;
      loaded.model = whole.get();
      loaded.optimizer = &single.optimizer();
      loaded.schedule = &single.schedule();
      loaded.load(io::Hdf5StateReader(path, MPI_COMM_WORLD));
      CHECK(loaded.step == 2);
      const auto want = run.whole_params();
      for (const auto& p : whole->named_parameters()) {
        INFO(p.name);
        CHECK(p.tensor.to_doubles() == want.at(p.name));
      }
      // Each rank's AdamW shards are at its rows of the whole moments (trained: not all zero).
      int64_t trained_moments = 0;
      for (const auto& [name, rows] : run.fsdp->shard_rows()) {
        INFO(name);
        const optim::AdamWState& mine = run.stepper->optimizer().state(name);
        const optim::AdamWState& all = single.optimizer().state(name);
        CHECK(all.step == mine.step);
        for (auto [shard, all_rows] : {std::pair{&mine.exp_avg, &all.exp_avg},
                                       std::pair{&mine.exp_avg_sq, &all.exp_avg_sq}}) {
          const std::vector<double> want_rows =
              rows_of(all_rows->to_doubles(), rows.full_shape, rows.row_begin, rows.rows);
          const std::vector<double> got = shard->to_doubles();
          CHECK(std::vector<double>(got.begin(), got.begin() + int64_t(want_rows.size())) ==
                want_rows);
          trained_moments +=
              std::count_if(want_rows.begin(), want_rows.end(), [](double v) { return v != 0; });
        }
      }
      CHECK(trained_moments > 0);
    }
}

TEST_CASE("fsdp checkpoint: saved after step k and loaded into the same layout, the run goes on "
          "bit-identically") {
  const int world = parallel::world_group()->size();
  const train::TrainConfig c = equivalence_config();
  constexpr int kStop = 2, kSteps = 4;
  for (const Family* f : checkpoint_families())
    for (const Layout& l : checkpoint_layouts(world)) {
      INFO(f->name << ", " << l.name);
      SharedTempDir tmp;
      const std::string path = tmp.file("state.h5");
      ParallelRun straight(*f, c, l.shape);
      straight.train(0, kSteps);
      {
        ParallelRun first(*f, c, l.shape);
        first.train(0, kStop);
        first.save(path, kStop);
      }
      ParallelRun resumed(*f, c, l.shape);
      train::TrainState st = resumed.state(0);
      st.load(io::Hdf5StateReader(path, MPI_COMM_WORLD));
      REQUIRE(st.step == kStop);
      resumed.train(kStop, kSteps);
      CHECK(resumed.losses ==
            std::vector<double>(straight.losses.begin() + kStop, straight.losses.end()));
      const auto want = straight.whole_params();
      for (const auto& [name, values] : resumed.whole_params()) {
        INFO(name);
        CHECK(values == want.at(name));
      }
    }
}

// The model's outputs on one micro-batch: the final hidden states and the evaluation loss sum.
std::pair<std::vector<double>, double> outputs(ParallelRun& run, const model::Batch& batch) {
  run.fsdp->unshard_all();
  NoGradGuard no_grad;
  std::vector<double> hidden = run.model->hidden_states(batch).to_doubles();
  run.fsdp->reshard_all();
  return {hidden, run.stepper->evaluate({batch}).first};
}

TEST_CASE("fsdp checkpoint: saved by FSDP on 4 ranks, loaded by 1 rank, by FSDP on 2 ranks and by "
          "HSDP 2x2, the model's outputs are identical",
          "[4ranks]") {
  auto world = parallel::world_group();
  INFO("[4ranks] cases run in the 4-rank job only (tests/CMakeLists.txt)");
  REQUIRE(world->size() == 4);
  const train::TrainConfig c = equivalence_config();
  for (const Family* f : checkpoint_families()) {
    INFO(f->name);
    SharedTempDir tmp;
    const std::string path = tmp.file("state.h5");
    {
      ParallelRun saved(*f, c, {1, 4, 1});
      saved.train(0, 2);
      saved.save(path, 2);
    }
    const model::Batch batch = micro_batch(*f, 1, 0, 1, 2, 1); // an image row for Qwen3-VL
    auto load = [&](ParallelRun& run, MPI_Comm comm) {
      train::TrainState st = run.state(0);
      st.load(io::Hdf5StateReader(path, comm));
      CHECK(st.step == 2);
    };
    // 1 rank: every rank alone (its own communicator), the whole model.
    ParallelRun one(*f, c, {1, 1, 1}, world->split(world->rank(), 0, "self"));
    load(one, MPI_COMM_SELF);
    const auto want = outputs(one, batch);
    CHECK(want.second != 0);
    // FSDP on 2 ranks: two independent pairs, each reading through its own communicator.
    MPI_Comm pair_comm;
    MPI_Comm_split(MPI_COMM_WORLD, world->rank() / 2, world->rank(), &pair_comm);
    {
      ParallelRun two(*f, c, {1, 2, 1}, world->split(world->rank() / 2, world->rank(), "pair"));
      load(two, pair_comm);
      CHECK(outputs(two, batch) == want);
    }
    MPI_Comm_free(&pair_comm);
    // HSDP 2 x 2 on all four.
    ParallelRun hsdp(*f, c, {2, 2, 1});
    load(hsdp, MPI_COMM_WORLD);
    CHECK(outputs(hsdp, batch) == want);
  }
}

#endif // VLM_WITH_HDF5
