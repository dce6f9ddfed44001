// Describe -> shard -> allocate -> load (DESIGN.md §2.1, issue 35): a model that is only
// described is made parallel (FSDP, TP, both) with nothing allocated but each rank's parts, then
// initialized or loaded from its HF snapshot or a checkpoint's state.h5 part by part. Checked for
// every family, under `mpirun -np 1|2|4`: the gathered model equals one process's bit for bit (the
// same init draws, the same stored values), the ranks together read each byte of the snapshot once
// when FSDP spans them (within 10%; TP-replicated weights are read by each TP rank), and no rank's
// tensor memory ever comes near the whole model's.
#include <catch2/catch.hpp>

#include <algorithm>

#include "io/state/safetensors.h"
#include "model/hf_weights.h"
#include "model/model_spec.h"
#include "parallel/comm/mpi_env.h"
#include "src/core/allocator.h"
#include "src/train/checkpoint.h"
#include "tests/parallel/fsdp_fixture.h"
#include "tests/parallel/shared_temp_dir.h"

using namespace vlm;
using namespace vlm::testing;
using parallel::MeshShape;

namespace {

// The layouts this world size allows: FSDP over every rank, TP over every rank (2 only: the hybrid
// refuses 4), and FSDP 2 x TP 2 on 4.
std::vector<MeshShape> layouts_for(int world) {
  if (world == 1) return {{1, 1, 1}};
  if (world == 2) return {{1, 2, 1}, {1, 1, 2}};
  return {{1, world, 1}, {1, world / 2, 2}};
}

std::shared_ptr<model::CausalLM> described(const Family& f, DType dtype = DType::f32) {
  const std::string dir = test_data(f.snapshot);
  return model::build_model(model::read_config_json(dir), dir, dtype);
}

struct Parts {
  parallel::DeviceMesh mesh;
  std::shared_ptr<model::CausalLM> model;
  parallel::Parallelized parallelized; // after the model: undone first
  std::map<std::string, parallel::ParamLayout> layouts;

  Parts(const Family& f, const MeshShape& shape, DType dtype = DType::f32)
      : mesh(parallel::world_group(), shape), model(described(f, dtype)) {
    parallel::ParallelizeOptions o;
    if (shape.tp > 1) o.tp_plan = model::tp_plan(*model);
    parallelized = parallel::parallelize(*model, model->blocks(), mesh, o, Device::cpu());
    layouts = parallelized.param_layouts();
  }
  std::map<std::string, std::vector<double>> whole() { return whole_params(*model, parallelized); }
};

std::string describe(const MeshShape& s) {
  return "dp_shard " + std::to_string(s.dp_shard) + " x tp " + std::to_string(s.tp);
}

void check_equal(const nn::Module& reference,
                 const std::map<std::string, std::vector<double>>& got) {
  const auto ref = reference.named_parameters();
  REQUIRE(ref.size() == got.size());
  for (const auto& p : ref) {
    INFO(p.name);
    REQUIRE(got.count(p.name));
    CHECK(got.at(p.name) == p.tensor.to_doubles());
  }
}

} // namespace

TEST_CASE("load by parts: an HF snapshot read box by box equals the whole load, each byte once",
          "[mpi][load]") {
  const int world = parallel::mpi_world().size;
  for (const Family& f : all_families())
    for (const MeshShape& shape : layouts_for(world)) {
      INFO(f.name << ", " << describe(shape));
      const std::string dir = test_data(f.snapshot);
      const auto reference = model::load_pretrained(dir, DType::f32);
      int64_t whole_bytes = 0, largest = 0;
      for (const auto& p : reference->named_parameters()) {
        whole_bytes += int64_t(p.tensor.nbytes());
        largest = std::max(largest, int64_t(p.tensor.nbytes()));
      }

      allocator_for(Device::cpu()).reset_peak();
      const int64_t before = int64_t(allocator_for(Device::cpu()).stats().current_bytes);
      Parts parts(f, shape);
      int64_t read = 0;
      parts.model->stored() = model::load_hf_weights(
          *parts.model, dir, parts.model->carried_prefixes(), &parts.layouts, &read);
      // What the rank holds (its parts; FSDP's flat gradient shards too) and, while loading, the
      // reader's buffers for one tensor at most: never the whole model.
      const int64_t peak = int64_t(allocator_for(Device::cpu()).stats().peak_bytes) - before;
      int64_t params = 0;
      for (const auto& p : parts.model->named_parameters()) params += int64_t(p.tensor.nbytes());
      const parallel::Fsdp* fsdp = parts.parallelized.fsdp();
      const int64_t held = fsdp ? fsdp->memory().param_bytes + fsdp->memory().grad_bytes : params;
      INFO("peak tensor bytes while describing, sharding and loading: "
           << peak << ", held " << held << ", a " << whole_bytes << "-byte model");
      CHECK(peak <= held + 2 * largest);
      if (world > 1 && shape.tp == 1) CHECK(params < whole_bytes * 3 / 4);

      const int64_t total = parts.mesh.world().all_reduce_value(read);
      INFO("the ranks read " << total << " bytes of a " << whole_bytes << "-byte snapshot");
      if (shape.tp == 1) { // FSDP over every rank: each byte once
        CHECK(double(total) >= 0.9 * double(whole_bytes));
        CHECK(double(total) <= 1.1 * double(whole_bytes));
      } else { // replicated weights are read by each TP rank, the split ones once
        CHECK(total >= whole_bytes);
        CHECK(total < whole_bytes * shape.tp);
      }
      check_equal(*reference, parts.whole());
    }
}

TEST_CASE("load by parts: initialization by parts draws what one process draws", "[mpi][load]") {
  const int world = parallel::mpi_world().size;
  for (const Family& f : all_families())
    for (const MeshShape& shape : layouts_for(world)) {
      INFO(f.name << ", " << describe(shape));
      const auto reference = described(f);
      Rng ref_rng(11);
      reference->init_weights(ref_rng);

      Parts parts(f, shape);
      Rng rng(11);
      parts.model->initialize(rng, parallel::init_parts(parts.layouts));
      CHECK(rng.next_u64() == ref_rng.next_u64()); // the same draws from the caller's generator
      check_equal(*reference, parts.whole());
    }
}

#if VLM_WITH_HDF5
// model.model_dir = a step_N folder: each rank reads its boxes of state.h5. bf16 parameters, so
// that a family with F32 islands (Qwen3.5's A_log) takes their exact values from the fp32 masters.
TEST_CASE("load by parts: a checkpoint's weights read box by box equal the whole load",
          "[mpi][load]") {
  const int world = parallel::mpi_world().size;
  const auto group = parallel::world_group();
  for (const Family& f : all_families()) {
    INFO(f.name);
    train::TrainConfig c = equivalence_config();
    c.training.param_dtype = DType::bf16;
    SharedTempDir tmp;
    std::string dir;
    { // One process's model and AdamW state (its fp32 masters), saved by every rank together.
      const ParallelFamilyModel one = parallel_family_model(f, c, {});
      train::TrainStepper stepper(c, one.model, one.step_parallel());
      train::CheckpointSave save;
      save.output_dir = tmp.dir;
      save.hf_config = one.model->hf_config();
      dir = train::save_checkpoint(train_state(one, stepper, 1), save, *group);
    }
    const auto reference = described(f, DType::bf16);
    train::load_checkpoint_weights(*reference, dir);
    for (const MeshShape& shape : layouts_for(world)) {
      INFO(describe(shape));
      Parts parts(f, shape, DType::bf16);
      train::load_checkpoint_weights(*parts.model, dir, &parts.layouts);
      check_equal(*reference, parts.whole());
      const auto& want = reference->stored().exact;
      const auto& got = parts.model->stored().exact;
      REQUIRE(got.size() == want.size());
      for (const auto& [name, value] : want) {
        INFO("exact " << name);
        REQUIRE(got.count(name));
        CHECK(got.at(name).to_doubles() == value.to_doubles());
      }
    }
  }
}
#endif
