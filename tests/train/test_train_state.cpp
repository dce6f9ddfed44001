// TrainState (src/train/train_state.h): k steps, save to memory, load into a fresh trainer, N
// more steps == k + N uninterrupted steps, bit for bit (losses, gradient norms, the data of every
// step, every parameter and optimizer state), on CPU; and the refusals of a state that does not
// belong to the run.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/state/state_store.h"
#include "src/demo/demo_dataset.h"
#include "src/train/trainer.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"

using namespace vlm;
using Catch::Matchers::Contains;
using vlm::testing::error_of;

namespace {

// The built-in demo (the tiny Qwen3-VL, packed demo rows with images) made small, bf16 with fp32
// masters, and an uneven accumulation pattern (1, 2, 1, 2, ... micro-steps), so every part of the
// state matters.
train::TrainConfig demo_config(const std::string& data, const std::string& out,
                               const std::string& extra = "") {
  std::vector<std::string> overrides = {
      "model.tokenizer=" + data,   "data.data_path=" + data,      "checkpoint.output_dir=" + out,
      "training.total_steps=12",   "training.warmup_steps=3",     "training.eval_steps=0",
      "training.param_dtype=bf16", "training.tpi_multiplier=1.5", "training.micro_batch_rows=2",
      "logging.progress=false",    "data.num_workers=2"};
  if (!extra.empty()) overrides.push_back(extra);
  return train::parse_train_config(train::builtin_demo_config_toml(), "built-in demo config",
                                   overrides);
}

struct Steps {
  std::vector<double> losses, norms;
  std::vector<int64_t> targets;
};

void run(train::Trainer& t, int64_t n, Steps& into) {
  for (int64_t i = 0; i < n; i++) {
    const train::StepRecord r = t.train_step();
    into.losses.push_back(r.stats.loss);
    into.norms.push_back(r.stats.grad_norm);
    into.targets.push_back(r.stats.targets);
  }
}

std::vector<std::vector<double>> parameters(const train::Trainer& t) {
  std::vector<std::vector<double>> out;
  for (const auto& p : t.model().named_parameters()) out.push_back(p.tensor.to_doubles());
  return out;
}

} // namespace

TEST_CASE("train state: k steps, save, load into a fresh trainer, N more == k + N steps") {
  testing::TempDir tmp("train_state");
  const std::string data = tmp.file("demo_data");
  demo::make_demo_dataset(data);
  constexpr int64_t k = 5, n = 7;

  train::Trainer whole(demo_config(data, tmp.file("whole")));
  Steps all;
  run(whole, k + n, all);
  REQUIRE(whole.done());

  io::MemoryState saved;
  {
    train::Trainer first(demo_config(data, tmp.file("first")));
    Steps head;
    run(first, k, head);
    CHECK(head.losses == std::vector<double>(all.losses.begin(), all.losses.begin() + k));
    first.state().save(saved);
  }
  CHECK(saved.has("state"));
  CHECK(saved.has("model/model.language_model.embed_tokens.weight"));
  CHECK(saved.has("optim/model.language_model.norm.weight/exp_avg_sq"));
  CHECK(saved.has("optim/model.language_model.layers.0.mlp.up_proj.weight/master")); // fp32
  CHECK(saved.has("optim/model.visual.blocks.0.attn.qkv.weight/exp_avg_sq"));
  CHECK(saved.has("optim/model.visual.merger.linear_fc2.weight/master"));

  train::Trainer resumed(demo_config(data, tmp.file("resumed")));
  resumed.state().load(saved);
  CHECK(resumed.state().step == k);
  Steps tail;
  run(resumed, n, tail);
  CHECK(resumed.done());
  // Bit-identical: the same data (targets per step), losses, norms and final weights.
  CHECK(tail.targets == std::vector<int64_t>(all.targets.begin() + k, all.targets.end()));
  CHECK(tail.losses == std::vector<double>(all.losses.begin() + k, all.losses.end()));
  CHECK(tail.norms == std::vector<double>(all.norms.begin() + k, all.norms.end()));
  CHECK(parameters(resumed) == parameters(whole));
  CHECK(resumed.state().tokens == whole.state().tokens);
  CHECK(resumed.state().padded_tokens == whole.state().padded_tokens);
  for (const std::string& name : whole.state().optimizer->param_names()) {
    INFO(name);
    const auto& a = whole.state().optimizer->state(name);
    const auto& b = resumed.state().optimizer->state(name);
    CHECK(a.step == b.step);
    CHECK(a.exp_avg.to_doubles() == b.exp_avg.to_doubles());
    CHECK(a.exp_avg_sq.to_doubles() == b.exp_avg_sq.to_doubles());
    CHECK(a.master.to_doubles() == b.master.to_doubles());
  }
}

namespace {

// The state of a demo run after one step, the demo dataset made in `data` first.
io::MemoryState one_step_state(const testing::TempDir& tmp, const std::string& data) {
  demo::make_demo_dataset(data);
  io::MemoryState saved;
  train::Trainer t(demo_config(data, tmp.file("a")));
  t.train_step();
  t.state().save(saved);
  return saved;
}

} // namespace

TEST_CASE("train state: a state from another run is refused, naming what differs") {
  testing::TempDir tmp("train_state_refuse");
  const std::string data = tmp.file("demo_data");
  const io::MemoryState saved = one_step_state(tmp, data);
  // Another LR schedule.
  train::Trainer other(demo_config(data, tmp.file("b"), "training.total_steps=20"));
  CHECK_THAT(error_of([&] { other.state().load(saved); }),
             Contains("LR schedule") && Contains("total_steps"));
  // Another model: its parameters have other shapes.
  train::Trainer wide(demo_config(data, tmp.file("c"), "training.param_dtype=f32"));
  CHECK_THAT(error_of([&] { wide.state().load(saved); }),
             Contains("model/model.visual.patch_embed.proj.weight") && Contains("bf16"));
  // Another data order (seed): the loader refuses the position.
  train::Trainer reseeded(demo_config(data, tmp.file("d"), "training.seed=5"));
  CHECK_THAT(error_of([&] { reseeded.state().load(saved); }), Contains("seed"));
}

// A copy of `in` with `edit` applied to each key's tensor or JSON document (return false to drop
// the key), plus `extra` tensors.
io::MemoryState
forged(const io::MemoryState& in,
       const std::function<bool(const std::string&, Tensor&, nlohmann::json&)>& edit,
       const std::map<std::string, Tensor>& extra = {}) {
  io::MemoryState out;
  for (const std::string& key : in.keys()) {
    Tensor t;
    nlohmann::json j;
    const bool tensor = key != "state"; // TrainState::save's one JSON document
    if (tensor) {
      t = Tensor::zeros(in.shape(key), in.dtype(key));
      in.read_tensor_into(key, t);
    } else {
      j = in.read_json(key);
    }
    if (!edit(key, t, j)) continue;
    if (tensor)
      out.write_tensor(key, t);
    else
      out.write_json(key, j);
  }
  for (const auto& [key, t] : extra) out.write_tensor(key, t);
  return out;
}

TEST_CASE("train state: a damaged state is refused, naming the key, before anything changes") {
  testing::TempDir tmp("train_state_damaged");
  const std::string data = tmp.file("demo_data");
  const io::MemoryState saved = one_step_state(tmp, data);
  train::Trainer fresh(demo_config(data, tmp.file("b")));
  const std::string w = "model.language_model.layers.0.mlp.up_proj.weight";
  const std::vector<double> before = fresh.model().find_parameter(w).to_doubles();
  const auto refused = [&](const io::MemoryState& st) {
    return error_of([&] { fresh.state().load(st); });
  };
  // One row more: the one-process path read only the rows it expected before (issue 31).
  CHECK_THAT(refused(forged(saved,
                            [&](const std::string& key, Tensor& t, nlohmann::json&) {
                              if (key == "model/" + w)
                                t = Tensor::zeros({t.size(0) + 1, t.size(1)}, t.dtype());
                              return true;
                            })),
             Contains("'model/" + w + "' holds bf16(") && Contains("but this model's is bf16("));
  CHECK_THAT(refused(forged(saved,
                            [](const std::string& key, Tensor&, nlohmann::json& j) {
                              if (key == "state") j["step"] = int64_t(1) << 50;
                              return true;
                            })),
             Contains("/state 'step' = 1125899906842624"));
  CHECK_THAT(refused(forged(saved,
                            [](const std::string& key, Tensor&, nlohmann::json& j) {
                              if (key == "state") j.erase("schedule");
                              return true;
                            })),
             Contains("/state has no 'schedule'"));
  CHECK_THAT(
      refused(forged(saved, [](const std::string&, Tensor&, nlohmann::json&) { return true; },
                     {{"model/zzz.extra", Tensor::zeros({3})}})),
      Contains("'model/zzz.extra' is not a parameter of this model"));
  CHECK_THAT(
      refused(forged(saved, [&](const std::string& key, Tensor&,
                                nlohmann::json&) { return key != "optim/" + w + "/exp_avg"; })),
      Contains("'optim/" + w + "/exp_avg' is missing"));
  // A loader position past the data: the document's key, this run's data and the field, not a
  // dataset error at the first read (issue 50); a negative count.
  const auto loader_edit = [&](const std::string& field, const nlohmann::json& value) {
    return refused(forged(saved, [&](const std::string& key, Tensor&, nlohmann::json& j) {
      if (key == "state") j["loaders"][0]["workers"][0][field] = value;
      return true;
    }));
  };
  CHECK_THAT(loader_edit("packer_buffer", nlohmann::json::array({1000000})),
             Contains("/state 'loaders'[0]") &&
                 Contains("does not fit data.data_path = '" + data) &&
                 Contains("saved for other data, or is damaged") &&
                 Contains("workers[0].packer_buffer[0] = 1000000 is out of range: it is sample "
                          "1000000 of 'demo_data' split 'train' ("));
  CHECK_THAT(loader_edit("samples", -2), Contains("workers[0].samples = -2 is negative"));
  // Refused before anything changed.
  CHECK(fresh.model().find_parameter(w).to_doubles() == before);
}

TEST_CASE("memory state: whole tensors as rows, rows read back, partial writes refused") {
  io::MemoryState st;
  const Tensor w = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {3, 2});
  st.write_rows("model/w", {3, 2}, DType::f32, 0, w);
  CHECK(st.shape("model/w") == Shape{3, 2});
  Tensor rows = Tensor::zeros({2, 2});
  st.read_rows_into("model/w", 1, rows);
  CHECK(rows.to_doubles() == std::vector<double>{3, 4, 5, 6});
  Tensor too_many = Tensor::zeros({2, 2});
  CHECK_THAT(error_of([&] { st.read_rows_into("model/w", 2, too_many); }),
             Contains("'model/w'") && Contains("rows from 2"));
  CHECK_THAT(error_of([&] {
               st.write_rows("model/v", {4, 2}, DType::f32, 1, w);
             }),
             Contains("'model/v'") && Contains("whole tensors"));
  CHECK_THAT(error_of([&] { st.shape("model/absent"); }), Contains("model/absent"));
}
