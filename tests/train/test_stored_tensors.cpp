// Stored dtypes and carried tensors (model/stored_tensors.h) on every path, with the tiny Qwen3.5
// snapshot typed like the official checkpoints (tests/data/qwen3_5_tiny_hybrid_bf16: BF16, except
// linear_attn.A_log and linear_attn.norm.weight in F32, plus 15 BF16 mtp.* tensors the model does
// not use): load -> export, and load -> a bf16 run (fp32 masters) -> HDF5 checkpoint ->
// `vlmtrain export`, every tensor bit for bit in its stored dtype.
#include <catch2/catch.hpp>

#include <string>

#include "io/state/hdf5_state.h"
#include "model/hf_weights.h"
#include "model/model_spec.h"
#include "src/cli/cmd_export.h"
#include "src/demo/demo_dataset.h"
#include "src/train/trainer.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"
#include "tests/train/stored_tensors_fixture.h"

using namespace vlm;
using namespace vlm::testing;

namespace {

const std::string kALog = "model.language_model.layers.0.linear_attn.A_log";
const std::string kQkv = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight";

} // namespace

TEST_CASE("stored tensors: F32 tensors and mtp.* go from load to export bit for bit") {
  testing::TempDir tmp("stored_tensors");
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    auto m = model::load_pretrained(kStoredSnapshot, dtype);
    const model::StoredTensors& s = m->stored();
    CHECK(s.dtypes.at(kALog) == DType::f32);
    CHECK(s.dtypes.at(kQkv) == DType::bf16);
    CHECK(s.carried.size() == 15);
    CHECK(s.carried.at("mtp.fc.weight").dtype() == DType::bf16);
    CHECK(s.exact.size() == (dtype == DType::bf16 ? 12u : 0u)); // what a bf16 parameter rounds
    const std::string out = tmp.file(std::string("bf16_from_") + dtype_name(dtype));
    model::save_hf_snapshot(*m, m->hf_config(), out, DType::bf16, "", model::kDefaultMaxShardBytes,
                            {}, &s);
    require_as_stored(out);
  }
  // An f32 export widens the BF16 parameters, keeps the F32 ones, and carries mtp.* as stored.
  auto m = model::load_pretrained(kStoredSnapshot, DType::f32);
  model::save_hf_snapshot(*m, m->hf_config(), tmp.file("f32"), DType::f32, "",
                          model::kDefaultMaxShardBytes, {}, &m->stored());
  const auto got = tensors_of(tmp.file("f32")), want = tensors_of(kStoredSnapshot);
  CHECK(got.at(kQkv).first == DType::f32);
  CHECK(got.at(kALog) == want.at(kALog));
  CHECK(got.at("mtp.fc.weight") == want.at("mtp.fc.weight"));
  // Without the stored dtypes, a bf16 snapshot truncates the F32 tensors (what this prevents).
  model::save_hf_snapshot(*m, m->hf_config(), tmp.file("plain"), DType::bf16, "");
  CHECK(tensors_of(tmp.file("plain")).at(kALog).first == DType::bf16);
  CHECK(tensors_of(tmp.file("plain")).count("mtp.fc.weight") == 0);
}

TEST_CASE("stored tensors: a bf16 run's HDF5 checkpoint and its export keep them bit for bit") {
  if (!io::hdf5_state_available()) VLM_SKIP("built without parallel HDF5");
  testing::TempDir tmp("stored_tensors_run");
  const std::string data = tmp.file("demo_data");
  demo::make_demo_dataset(data);
  const std::string snap = tmp.file("snapshot");
  write_demo_snapshot(snap);
  train::Trainer trainer(zero_lr_config(snap, data, tmp.file("out")));
  const train::TrainSummary summary = trainer.run();
  REQUIRE(summary.steps == 1);
  require_as_stored(summary.hf_snapshot); // the run's own HF snapshot
  REQUIRE(cli::cmd_export({"--checkpoint", tmp.file("out"), "--out", tmp.file("exported"),
                           "--dtype", "bf16"}) == 0);
  require_as_stored(tmp.file("exported")); // from step_000001/state.h5
}
