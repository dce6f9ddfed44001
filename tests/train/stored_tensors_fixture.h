// The tiny Qwen3.5 snapshot typed like the official checkpoints
// (tests/data/qwen3_5_tiny_hybrid_bf16: BF16, except linear_attn.A_log and linear_attn.norm.weight
// in F32, plus 15 BF16 mtp.* tensors the model does not use), and the checks that a written
// snapshot holds each of its tensors bit for bit in its stored dtype. Shared by
// tests/train/test_stored_tensors.cpp and the MPI run of
// tests/parallel/test_stored_tensors_mpi.cpp.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/state/safetensors.h"
#include "src/train/config.h"

namespace vlm::testing {

inline const std::string kStoredSnapshot =
    std::string(VLM_SOURCE_DIR) + "/tests/data/qwen3_5_tiny_hybrid_bf16";

// name -> (dtype, bytes) of each tensor of a snapshot folder's model.safetensors.
inline std::map<std::string, std::pair<DType, std::string>> tensors_of(const std::string& dir) {
  io::SafetensorsFile f(dir + "/model.safetensors");
  std::map<std::string, std::pair<DType, std::string>> out;
  for (const std::string& name : f.names()) {
    const io::TensorInfo& t = f.get(name);
    out[name] = {t.dtype, std::string(static_cast<const char*>(t.data), t.nbytes)};
  }
  return out;
}

// Every tensor of the source snapshot in `dir`, in its dtype with its bytes, and nothing else.
inline void require_as_stored(const std::string& dir) {
  const auto want = tensors_of(kStoredSnapshot), got = tensors_of(dir);
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

// A copy of the snapshot in `dir` with the demo tokenizer's special-token ids (the weights are
// the file's own), for training on the demo data.
inline void write_demo_snapshot(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kStoredSnapshot + "/model.safetensors", dir + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(kStoredSnapshot + "/config.json"));
  config["image_token_id"] = 378;
  config["video_token_id"] = 379;
  config["vision_start_token_id"] = 376;
  config["vision_end_token_id"] = 377;
  std::ofstream(dir + "/config.json") << config.dump(2);
}

// One bf16 step of that snapshot on the demo data at learning rate 0: the values must come out
// as they went in, through the fp32 masters (seeded from the stored F32 values) and the
// checkpoint's carried tensors.
inline train::TrainConfig zero_lr_config(const std::string& snapshot, const std::string& data,
                                         const std::string& out,
                                         std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.preset=",
                                "model.model_dir=" + snapshot,
                                "model.tokenizer=" + data,
                                "data.data_path=" + data,
                                "checkpoint.output_dir=" + out,
                                "training.total_steps=1",
                                "training.warmup_steps=0",
                                "training.eval_steps=0",
                                "training.caption_eval_images=0",
                                "training.lr_llm=0",
                                "training.lr_mlp=0",
                                "training.lr_vit=0",
                                "training.param_dtype=bf16",
                                "logging.progress=false"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parse_train_config(train::builtin_demo_config_toml(), "built-in demo config", o);
}

} // namespace vlm::testing
