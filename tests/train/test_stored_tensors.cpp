// Stored dtypes and carried tensors (model/stored_tensors.h) on every path, with the tiny Qwen3.5
// snapshot typed like the official checkpoints (tests/data/qwen3_5_tiny_hybrid_bf16: BF16, except
// linear_attn.A_log and linear_attn.norm.weight in F32, plus 15 BF16 mtp.* tensors the model does
// not use): load -> export, and load -> a bf16 run (fp32 masters) -> HDF5 checkpoint ->
// `vlmtrain export`, every tensor bit for bit in its stored dtype.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/state/hdf5_state.h"
#include "io/state/safetensors.h"
#include "model/hf_weights.h"
#include "model/model_spec.h"
#include "src/cli/cmd_export.h"
#include "src/demo/demo_dataset.h"
#include "src/train/trainer.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"

using namespace vlm;

namespace {

const std::string kSnapshot = std::string(VLM_SOURCE_DIR) + "/tests/data/qwen3_5_tiny_hybrid_bf16";
const std::string kALog = "model.language_model.layers.0.linear_attn.A_log";
const std::string kQkv = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight";

// name -> (dtype, bytes) of each tensor of a snapshot folder's model.safetensors.
std::map<std::string, std::pair<DType, std::string>> tensors_of(const std::string& dir) {
  io::SafetensorsFile f(dir + "/model.safetensors");
  std::map<std::string, std::pair<DType, std::string>> out;
  for (const std::string& name : f.names()) {
    const io::TensorInfo& t = f.get(name);
    out[name] = {t.dtype, std::string(static_cast<const char*>(t.data), t.nbytes)};
  }
  return out;
}

// Every tensor of the source snapshot in `dir`, in its dtype with its bytes, and nothing else.
void require_as_stored(const std::string& dir) {
  const auto want = tensors_of(kSnapshot), got = tensors_of(dir);
  int f32 = 0, mtp = 0, differ = 0;
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    CHECK(dtype_name(got.at(name).first) == std::string(dtype_name(t.first)));
    differ += got.at(name) != t;
    f32 += t.first == DType::f32;
    mtp += name.rfind("mtp.", 0) == 0;
  }
  CHECK(differ == 0);
  CHECK(got.size() == want.size());
  CHECK(f32 == 12); // A_log and norm.weight of the 6 GDN layers
  CHECK(mtp == 15);
}

} // namespace

TEST_CASE("stored tensors: F32 tensors and mtp.* go from load to export bit for bit") {
  testing::TempDir tmp("stored_tensors");
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    auto m = model::load_pretrained(kSnapshot, dtype);
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
  auto m = model::load_pretrained(kSnapshot, DType::f32);
  model::save_hf_snapshot(*m, m->hf_config(), tmp.file("f32"), DType::f32, "",
                          model::kDefaultMaxShardBytes, {}, &m->stored());
  const auto got = tensors_of(tmp.file("f32")), want = tensors_of(kSnapshot);
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
  // The snapshot with the demo tokenizer's special-token ids (the weights are the file's own).
  const std::string snap = tmp.file("snapshot");
  std::filesystem::create_directories(snap);
  std::filesystem::copy_file(kSnapshot + "/model.safetensors", snap + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(kSnapshot + "/config.json"));
  config["image_token_id"] = 378;
  config["video_token_id"] = 379;
  config["vision_start_token_id"] = 376;
  config["vision_end_token_id"] = 377;
  std::ofstream(snap + "/config.json") << config.dump(2);

  // One step at learning rate 0: the values must come out as they went in, through the fp32
  // masters (seeded from the stored F32 values) and the checkpoint's carried tensors.
  const train::TrainConfig c = train::parse_train_config(
      train::builtin_demo_config_toml(), "built-in demo config",
      {"model.preset=", "model.model_dir=" + snap, "model.tokenizer=" + data,
       "data.data_path=" + data, "checkpoint.output_dir=" + tmp.file("out"),
       "training.total_steps=1", "training.warmup_steps=0", "training.eval_steps=0",
       "training.caption_eval_images=0", "training.lr_llm=0", "training.lr_mlp=0",
       "training.lr_vit=0", "training.param_dtype=bf16", "logging.progress=false"});
  train::Trainer trainer(c);
  const train::TrainSummary summary = trainer.run();
  REQUIRE(summary.steps == 1);
  require_as_stored(summary.hf_snapshot); // the run's own HF snapshot
  REQUIRE(cli::cmd_export({"--checkpoint", tmp.file("out"), "--out", tmp.file("exported"),
                           "--dtype", "bf16"}) == 0);
  require_as_stored(tmp.file("exported")); // from step_000001/state.h5
}
