// HF weights in and out (model/hf_weights.h): export round trip (bit-identical logits), sharded
// snapshots with an index, tokenizer files, atomic replacement, dtype conversion, and the loading
// errors — each names the tensor, and one error lists every problem.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/state/safetensors.h"
#include "model/hf_weights.h"
#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "model/qwen3/model.h"
#include "src/core/allocator.h"
#include "src/core/ops.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"

using namespace vlm;
using namespace vlm::model;
using Catch::Matchers::Contains;
using vlm::testing::error_of;
namespace fs = std::filesystem;

namespace {

std::string snapshot(const std::string& variant) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/qwen3_tiny_" + variant;
}

Batch small_batch() {
  std::vector<int64_t> ids = {3, 17, 400, 8, 99, 250, 1, 511, 42, 7};
  std::vector<int64_t> labels = {-100, 17, 400, 8, -100, 250, 1, 511, 42, 7};
  std::vector<int64_t> pos = {0, 1, 2, 3, 0, 1, 2, 3, 4, 5};
  return batch_from_labels(Tensor::from_vector(ids, {10}), Tensor::from_vector(labels, {10}),
                           Tensor::from_vector(pos, {10}),
                           Tensor::from_vector(std::vector<int32_t>{0, 4, 10}, {3}));
}

std::vector<double> logits_of(const Qwen3ForCausalLM& m) {
  NoGradGuard no_grad;
  return lm_logits(m, small_batch()).to_doubles();
}

// A copy of the golden snapshot whose model.safetensors is rewritten by `edit` (name -> tensor).
std::string edited_snapshot(const testing::TempDir& tmp, const std::string& variant,
                            const std::function<void(std::map<std::string, Tensor>&)>& edit) {
  const std::string dir = tmp.file(variant + "_edited");
  fs::create_directories(dir);
  fs::copy_file(snapshot(variant) + "/config.json", dir + "/config.json");
  io::SafetensorsFile f(snapshot(variant) + "/model.safetensors");
  std::map<std::string, Tensor> tensors;
  for (const auto& name : f.names()) {
    const auto& info = f.get(name);
    Tensor t = Tensor::empty(info.shape, info.dtype);
    std::memcpy(t.data_ptr(), info.data, info.nbytes);
    tensors[name] = t;
  }
  edit(tensors);
  std::vector<io::TensorInfo> infos;
  for (auto& [name, t] : tensors)
    infos.push_back({name, t.dtype(), t.shape(), t.data_ptr(), t.nbytes()});
  io::write_safetensors(dir + "/model.safetensors", infos);
  return dir;
}

std::string load_error(const std::string& dir, const std::string& variant = "untied") {
  Qwen3ForCausalLM m(Qwen3Config::load(snapshot(variant)));
  try {
    load_hf_weights(m, dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("hf weights: export round trip gives bit-identical logits (f32, untied and tied)") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    testing::TempDir tmp("hf_roundtrip");
    Qwen3Config c = Qwen3Config::load(snapshot(variant));
    Qwen3ForCausalLM a(c);
    load_hf_weights(a, snapshot(variant));
    // A fake tokenizer folder: only the files present are copied.
    fs::create_directories(tmp.file("tok"));
    tmp.write("tok/tokenizer.json", "{\"model\": {}}");
    tmp.write("tok/merges.txt", "a b\n");
    tmp.write("tok/unrelated.txt", "x");
    save_hf_snapshot(a, c.to_json(), tmp.file("export"), DType::f32, tmp.file("tok"));
    CHECK(fs::exists(tmp.file("export/config.json")));
    CHECK(fs::exists(tmp.file("export/model.safetensors")));
    CHECK(fs::exists(tmp.file("export/tokenizer.json")));
    CHECK(fs::exists(tmp.file("export/merges.txt")));
    CHECK_FALSE(fs::exists(tmp.file("export/unrelated.txt")));
    CHECK_FALSE(fs::exists(tmp.file("export.tmp")));
    io::SafetensorsFile f(tmp.file("export/model.safetensors"));
    CHECK(f.contains("lm_head.weight") == (std::string(variant) == "untied"));
    CHECK(f.metadata().at("format") == "pt");

    Qwen3Config c2 = Qwen3Config::load(tmp.file("export"));
    CHECK(c2.to_json() == c.to_json());
    Qwen3ForCausalLM b(c2);
    load_hf_weights(b, tmp.file("export"));
    CHECK(logits_of(a) == logits_of(b));
  }
}

TEST_CASE("hf weights: bf16 export of a bf16 model reloads bit-identically, f32 -> bf16 rounds") {
  testing::TempDir tmp("hf_bf16");
  Qwen3Config c = Qwen3Config::load(snapshot("untied"));
  Qwen3ForCausalLM a(c, DType::bf16);
  load_hf_weights(a, snapshot("untied")); // f32 file -> bf16 parameters
  CHECK(a.find_parameter("model.norm.weight").dtype() == DType::bf16);
  save_hf_snapshot(a, c.to_json(), tmp.file("export"), DType::bf16, "");
  io::SafetensorsFile f(tmp.file("export/model.safetensors"));
  CHECK(f.get("model.embed_tokens.weight").dtype == DType::bf16);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(tmp.file("export/config.json")));
  CHECK(j["torch_dtype"] == "bfloat16");
  Qwen3ForCausalLM b(Qwen3Config::load(tmp.file("export")), DType::bf16);
  load_hf_weights(b, tmp.file("export"));
  CHECK(logits_of(a) == logits_of(b));
  // bf16 file -> f32 model: the values are the bf16 ones, exactly.
  Qwen3ForCausalLM f32(c);
  load_hf_weights(f32, tmp.file("export"));
  CHECK(f32.find_parameter("model.layers.0.mlp.up_proj.weight").to_doubles() ==
        a.find_parameter("model.layers.0.mlp.up_proj.weight").to_doubles());
}

TEST_CASE("hf weights: a 2-shard snapshot with an index saves and loads") {
  testing::TempDir tmp("hf_shards");
  Qwen3Config c = Qwen3Config::load(snapshot("untied"));
  Qwen3ForCausalLM a(c);
  load_hf_weights(a, snapshot("untied"));
  // Shards fill in parameter order: all but the last tensor (lm_head) fit into the first one.
  const int64_t total = a.num_parameters() * 4, head = c.vocab_size * c.hidden_size * 4;
  save_hf_snapshot(a, c.to_json(), tmp.file("sharded"), DType::f32, "", total - head);
  CHECK_FALSE(fs::exists(tmp.file("sharded/model.safetensors")));
  CHECK(fs::exists(tmp.file("sharded/model-00001-of-00002.safetensors")));
  CHECK(fs::exists(tmp.file("sharded/model-00002-of-00002.safetensors")));
  nlohmann::json index =
      nlohmann::json::parse(std::ifstream(tmp.file("sharded/model.safetensors.index.json")));
  CHECK(index["metadata"]["total_size"] == total);
  CHECK(index["weight_map"].size() == a.named_parameters().size());
  CHECK(index["weight_map"]["lm_head.weight"] == "model-00002-of-00002.safetensors");
  Qwen3ForCausalLM b(c);
  load_hf_weights(b, tmp.file("sharded"));
  CHECK(logits_of(a) == logits_of(b));

  // An index naming a shard that is not there.
  fs::remove(tmp.file("sharded/model-00002-of-00002.safetensors"));
  std::string msg = load_error(tmp.file("sharded"));
  CHECK(msg.find("model-00002-of-00002.safetensors") != std::string::npos);
  CHECK(msg.find("does not exist") != std::string::npos);
}

TEST_CASE("hf weights: a snapshot goes into a new or empty folder only, never over files") {
  testing::TempDir tmp("hf_replace");
  Qwen3Config c = tiny_qwen3_config();
  Qwen3ForCausalLM a(c);
  Rng rng(1);
  a.init_weights(rng);
  fs::create_directories(tmp.file("empty"));
  fs::create_directories(tmp.file("out.tmp"));
  tmp.write("out.tmp/mine.txt", "a folder of the user's that the old code removed");
  save_hf_snapshot(a, c.to_json(), tmp.file("empty") + "/", DType::f32, "");
  CHECK(fs::exists(tmp.file("empty/model.safetensors")));
  save_hf_snapshot(a, c.to_json(), tmp.file("out"), DType::f32, "");
  CHECK(fs::exists(tmp.file("out/model.safetensors")));
  CHECK(fs::exists(tmp.file("out.tmp/mine.txt")));
  const auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(tmp.dir)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  };
  CHECK(entries() == std::vector<std::string>{"empty", "out", "out.tmp"}); // no temporary left
  // A folder with files (a snapshot, a checkpoint, anything) and a file are refused untouched.
  fs::create_directories(tmp.file("full"));
  tmp.write("full/notes.txt", "keep me");
  CHECK_THROWS_WITH(save_hf_snapshot(a, c.to_json(), tmp.file("full"), DType::f32, ""),
                    Catch::Contains("full") && Catch::Contains("not empty"));
  CHECK_THROWS_WITH(save_hf_snapshot(a, c.to_json(), tmp.file("out"), DType::f32, ""),
                    Catch::Contains("not empty"));
  tmp.write("afile", "keep me too");
  CHECK_THROWS_WITH(save_hf_snapshot(a, c.to_json(), tmp.file("afile"), DType::f32, ""),
                    Catch::Contains("afile") && Catch::Contains("not a folder"));
  const auto read = [&](const std::string& name) {
    std::ifstream f(tmp.file(name));
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  CHECK(read("full/notes.txt") == "keep me");
  CHECK(read("afile") == "keep me too");
  CHECK(entries() == std::vector<std::string>{"afile", "empty", "full", "out", "out.tmp"});
  CHECK_THROWS_WITH(
      save_hf_snapshot(a, c.to_json(), tmp.file("x"), DType::f32, tmp.file("no_such_dir")),
      Catch::Contains("no_such_dir"));
  CHECK_THROWS_WITH(save_hf_snapshot(a, c.to_json(), tmp.file("x"), DType::i32, ""),
                    Catch::Contains("i32"));
}

TEST_CASE("hf weights: loading errors name every missing, unexpected and mis-shaped tensor") {
  testing::TempDir tmp("hf_errors");
  SECTION("no weights file") {
    fs::create_directories(tmp.file("empty"));
    std::string msg = load_error(tmp.file("empty"));
    CHECK(msg.find("no model.safetensors or model.safetensors.index.json") != std::string::npos);
    CHECK(load_error(tmp.file("nowhere")).find("not a directory") != std::string::npos);
  }
  SECTION("missing tensor") {
    auto dir = edited_snapshot(tmp, "untied",
                               [](auto& t) { t.erase("model.layers.1.mlp.up_proj.weight"); });
    std::string msg = load_error(dir);
    CHECK(msg.find("1 missing, 0 unexpected, 0 wrong") != std::string::npos);
    CHECK(msg.find("missing: model.layers.1.mlp.up_proj.weight (128, 64)") != std::string::npos);
  }
  SECTION("unexpected tensor") {
    auto dir = edited_snapshot(tmp, "untied", [](auto& t) {
      t["model.layers.2.mlp.up_proj.weight"] = Tensor::zeros({128, 64});
    });
    std::string msg = load_error(dir);
    CHECK(
        msg.find("unexpected: model.layers.2.mlp.up_proj.weight in model.safetensors (128, 64)") !=
        std::string::npos);
  }
  SECTION("wrong shape and dtype") {
    auto dir = edited_snapshot(tmp, "untied", [](auto& t) {
      t["model.norm.weight"] = Tensor::ones({65});
      t["model.layers.0.self_attn.q_norm.weight"] = Tensor::zeros({32}, DType::i64);
    });
    std::string msg = load_error(dir);
    CHECK(msg.find("wrong shape: model.norm.weight in model.safetensors: expected (64), stored "
                   "(65)") != std::string::npos);
    CHECK(msg.find("wrong dtype: model.layers.0.self_attn.q_norm.weight") != std::string::npos);
  }
  SECTION("all problems in one error; the model is left untouched") {
    auto dir = edited_snapshot(tmp, "untied", [](auto& t) {
      t.erase("lm_head.weight");
      t["extra.weight"] = Tensor::zeros({2});
      t["model.embed_tokens.weight"] = Tensor::zeros({511, 64});
    });
    Qwen3ForCausalLM m(Qwen3Config::load(snapshot("untied")));
    Rng rng(2);
    m.init_weights(rng);
    auto before = m.find_parameter("model.norm.weight").to_doubles();
    std::string msg;
    try {
      load_hf_weights(m, dir);
    } catch (const Error& e) {
      msg = e.what();
    }
    CHECK(msg.find("1 missing, 1 unexpected, 1 wrong") != std::string::npos);
    CHECK(msg.find("lm_head.weight") != std::string::npos);
    CHECK(msg.find("extra.weight") != std::string::npos);
    CHECK(msg.find("model.embed_tokens.weight") != std::string::npos);
    CHECK(m.find_parameter("model.norm.weight").to_doubles() == before);
  }
  SECTION("a tied model ignores a stored lm_head.weight; legacy rotary buffers are ignored") {
    auto dir = edited_snapshot(tmp, "tied", [](auto& t) {
      t["lm_head.weight"] = t["model.embed_tokens.weight"];
      t["model.layers.0.self_attn.rotary_emb.inv_freq"] = Tensor::ones({16});
    });
    Qwen3ForCausalLM m(Qwen3Config::load(snapshot("tied")));
    load_hf_weights(m, dir);
    Qwen3ForCausalLM ref(Qwen3Config::load(snapshot("tied")));
    load_hf_weights(ref, snapshot("tied"));
    CHECK(logits_of(m) == logits_of(ref));
  }
}

TEST_CASE("hf weights: a config.json with wild sizes fails before anything is allocated") {
  // A typo'd hidden_size / vocab_size describes terabytes of parameters; the shapes are compared
  // with the safetensors header before the model allocates (it used to allocate first).
  testing::TempDir tmp("hf_wild");
  const std::string dir = tmp.file("wild");
  fs::create_directories(dir);
  fs::copy_file(snapshot("untied") + "/model.safetensors", dir + "/model.safetensors");
  nlohmann::json config = read_config_json(snapshot("untied"));
  config["hidden_size"] = 4000000;
  config["vocab_size"] = 1000000;
  std::ofstream(dir + "/config.json") << config.dump();
  Allocator& cpu = allocator_for(Device::cpu());
  cpu.reset_peak();
  const size_t in_use = cpu.stats().current_bytes;
  try {
    load_pretrained(dir, DType::f32);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Contains("wrong shape: model.embed_tokens.weight") &&
                             Contains("expected (1000000, 4000000), stored"));
  }
  CHECK(cpu.stats().peak_bytes <= in_use + (size_t(1) << 20)); // nothing of the model allocated
  // Without weights to compare with (random init), the machine's memory is the bound.
  auto m = build_model(config, dir + "/config.json", DType::f32);
  CHECK_THAT(error_of([&] { m->materialize(); }), Contains("GiB of memory of this machine"));
  // And each size has a stated bound of its own.
  config["hidden_size"] = int64_t(1) << 40;
  CHECK_THAT(error_of([&] { build_model(config, "wild/config.json", DType::f32); }),
             Contains("wild/config.json") && Contains("hidden_size must be in [1, 16777216]"));
}

TEST_CASE("hf weights: f16 and bf16 sources convert to the parameter dtype") {
  testing::TempDir tmp("hf_dtypes");
  auto dir = edited_snapshot(tmp, "untied", [](auto& t) {
    t["model.norm.weight"] = t["model.norm.weight"].to(DType::f16);
    t["lm_head.weight"] = t["lm_head.weight"].to(DType::bf16);
  });
  Qwen3ForCausalLM m(Qwen3Config::load(snapshot("untied")));
  load_hf_weights(m, dir);
  Qwen3ForCausalLM ref(Qwen3Config::load(snapshot("untied")));
  load_hf_weights(ref, snapshot("untied"));
  auto a = m.find_parameter("model.norm.weight").to_doubles();
  auto b = ref.find_parameter("model.norm.weight").to(DType::f16).to_doubles();
  CHECK(a == b);
  CHECK(m.find_parameter("lm_head.weight").to_doubles() ==
        ref.find_parameter("lm_head.weight").to(DType::bf16).to_doubles());
}
