// A model family is one folder plus one registry line: the toy family of tests/toy_family/ is
// registered through ModelSpec and then trained by `vlmtrain train` (cmd_train, the command's
// own code), exported by `vlmtrain export` and checkpointed from outside, with nothing in
// src/train or model/ knowing it. Also: the registry's errors.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "io/state/hdf5_state.h"
#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "parallel/ac/activation_checkpointing.h"
#include "src/cli/cmd_export.h"
#include "src/cli/cmd_train.h"
#include "src/demo/demo_dataset.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"
#include "tests/toy_family/mlp_lm.h"

using namespace vlm;
using Catch::Matchers::Contains;
using vlm::testing::error_of;

namespace {

std::vector<double> losses_of(const std::string& metrics) {
  std::ifstream in(metrics);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

} // namespace

TEST_CASE("model family: a toy family registered through ModelSpec trains with vlmtrain train") {
  testing::toy::register_mlp_lm();
  testing::TempDir tmp("toy_family");
  const std::string data = tmp.file("demo_data");
  demo::make_demo_dataset(data);
  // An HF-style snapshot folder that holds only config.json: random_init needs no weights.
  std::filesystem::create_directories(tmp.file("toy"));
  std::ofstream(tmp.file("toy/config.json")) << nlohmann::json{{"model_type", "toy_mlp_lm"},
                                                               {"vocab_size", 512},
                                                               {"hidden_size", 32},
                                                               {"intermediate_size", 64},
                                                               {"num_blocks", 2},
                                                               {"tie_word_embeddings", true}}
                                                    .dump();
  std::ofstream(tmp.file("train.toml"))
      << "[model]\nmodel_dir = \"" << tmp.file("toy") << "\"\ntokenizer = \"" << data
      << "\"\n[training]\nrandom_init = true\ntotal_steps = 40\n"
         "warmup_steps = 4\nlr_llm = 1e-2\nparam_dtype = \"f32\"\n"
         "micro_batch_rows = 2\nac_mode = \"full\"\n"
         "[data]\ndata_path = \""
      << data << "\"\nseq_len = 128\nnum_workers = 1\n"
      << "[checkpoint]\noutput_dir = \"" << tmp.file("out")
      << "\"\nsave_steps = 0\n[logging]\nprogress = false\n";
  REQUIRE(cli::cmd_train({"--config", tmp.file("train.toml"), "--require-loss-drop", "0.9"}) == 0);
  const auto losses = losses_of(tmp.file("out/metrics.jsonl"));
  REQUIRE(losses.size() == 40);
  CHECK(losses.back() < 0.9 * losses.front());

  // The final checkpoints: the resumable step_000040 (the default format) and the family's HF
  // snapshot; `vlmtrain export` takes either (the output folder: what `latest` names), and the
  // registry loads what it writes, the same weights from both.
  const std::string ckpt = tmp.file("out/checkpoint-step-40");
  REQUIRE(cli::cmd_export(
              {"--checkpoint", ckpt, "--out", tmp.file("exported"), "--dtype", "f32"}) == 0);
  auto reloaded = model::load_pretrained(tmp.file("exported"), DType::f32);
  CHECK(reloaded->model_type() == "toy_mlp_lm");
  CHECK(reloaded->blocks().size() == 2);
  CHECK(reloaded->head_weight().same(reloaded->find_parameter("model.embed_tokens.weight")));
  REQUIRE(std::filesystem::exists(tmp.file("out/step_000040/state.h5")) ==
          io::hdf5_state_available());
  if (io::hdf5_state_available()) {
    REQUIRE(cli::cmd_export({"--checkpoint", tmp.file("out"), "--out", tmp.file("from_h5"),
                             "--dtype", "f32"}) == 0);
    auto from_h5 = model::load_pretrained(tmp.file("from_h5"), DType::f32);
    for (const auto& p : reloaded->named_parameters())
      CHECK(p.tensor.to_doubles() == from_h5->find_parameter(p.name).to_doubles());
  }
}

TEST_CASE("model family: activation checkpointing from outside leaves the toy model's numbers") {
  testing::toy::register_mlp_lm();
  auto m = model::build_model(model::preset_config("toy-tiny"), "toy-tiny", DType::f32);
  Rng rng(3);
  m->init_weights(rng);
  std::vector<int64_t> ids = {1, 5, 9, 3, 7, 2, 8, 4};
  std::vector<int64_t> labels = {-100, 5, 9, 3, -100, 2, 8, 4};
  std::vector<int64_t> pos = {0, 1, 2, 3, 0, 1, 2, 3};
  const model::Batch b = model::batch_from_labels(
      Tensor::from_vector(ids, {8}), Tensor::from_vector(labels, {8}),
      Tensor::from_vector(pos, {8}), Tensor::from_vector(std::vector<int32_t>{0, 4, 8}, {3}));
  auto grads = [&] {
    m->zero_grad();
    model::lm_loss(*m, b, Reduction::mean).backward();
    std::vector<std::vector<double>> g;
    for (const auto& p : m->named_parameters()) g.push_back(p.tensor.grad().to_doubles());
    return g;
  };
  const auto off = grads();
  const auto handles =
      parallel::apply_activation_checkpointing(m->blocks(), parallel::AcMode::full);
  CHECK(handles.size() == 1);
  CHECK(grads() == off);
  CHECK_THAT(error_of([&] {
               parallel::apply_activation_checkpointing(m->blocks(), parallel::AcMode::selective);
             }),
             Contains("wrapped already"));
}

TEST_CASE("model family: the registry names what it knows") {
  testing::toy::register_mlp_lm();
  const auto types = model::registered_model_types();
  CHECK(std::find(types.begin(), types.end(), "qwen3") != types.end());
  CHECK(std::find(types.begin(), types.end(), "toy_mlp_lm") != types.end());
  CHECK_THAT(error_of([] { model::model_spec("llama"); }),
             Contains("unknown model_type 'llama'") && Contains("qwen3") && Contains("toy_mlp_lm"));
  CHECK_THAT(error_of([] {
               model::build_model({{"vocab_size", 3}}, "x/config.json", DType::f32);
             }),
             Contains("x/config.json") && Contains("model_type") && Contains("qwen3"));
  CHECK_THAT(error_of([] { model::preset_config("huge"); }),
             Contains("unknown model preset 'huge'") && Contains("tiny (qwen3)") &&
                 Contains("qwen3-1.7b (qwen3)"));
  CHECK_THAT(error_of([] { model::register_model_spec(testing::toy::mlp_lm_spec()); }),
             Contains("already registered"));
  // Presets adapt the vocabulary to the tokenizer: at least its size, rounded up to 64.
  model::PresetOptions o;
  o.min_vocab_size = 1000;
  CHECK(model::preset_config("tiny", o)["vocab_size"] == 1024);
  CHECK(model::preset_config("tiny")["vocab_size"] == 512);
}
