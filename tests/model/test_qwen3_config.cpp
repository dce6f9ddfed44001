// Qwen3Config from config.json (transformers 4 and 5 spellings, HF defaults, rejected features)
// and back; training FLOPs against qwen-models.md §7.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "model/qwen3/config.h"
#include "model/text/text_config.h"
#include "model/text/text_flops.h"
#include "src/base/check.h"
#include "tests/temp_dir.h"

using namespace vlm;
using namespace vlm::model;
using nlohmann::json;

namespace {

// Qwen3-0.6B's config.json as transformers 4.x wrote it (qwen-models.md §1.1).
json qwen3_06b() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

Qwen3Config with(const std::function<void(json&)>& edit) {
  json j = qwen3_06b();
  edit(j);
  return Qwen3Config::from_json(j, "cfg.json");
}

} // namespace

TEST_CASE("qwen3 config: a real config.json (transformers 4 spelling)") {
  Qwen3Config c = Qwen3Config::from_json(qwen3_06b(), "cfg.json");
  CHECK(c.vocab_size == 151936);
  CHECK(c.hidden_size == 1024);
  CHECK(c.num_attention_heads == 16);
  CHECK(c.num_key_value_heads == 8);
  CHECK(c.head_dim == 128);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.tie_word_embeddings);
  CHECK(c.torch_dtype == "bfloat16");
  CHECK(c.max_position_embeddings == 40960);
  CHECK(c.token_ids["eos_token_id"] == 151645);
  CHECK(c.num_parameters() == 596049920); // 0.596 B (qwen-models.md §1.1)
}

TEST_CASE("qwen3 config: transformers 5 spelling, HF defaults, round trip") {
  Qwen3Config c = with([](json& j) {
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j.erase("torch_dtype");
    j["dtype"] = "float32";
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  });
  CHECK(c.rope_theta == 5e6);
  CHECK(c.torch_dtype == "float32");
  // rope_parameters wins over a legacy rope_theta, as in transformers 5.
  CHECK(with([](json& j) { j["rope_parameters"] = {{"rope_theta", 7e5}}; }).rope_theta == 7e5);
  // Defaults of transformers' Qwen3Config: head_dim 128 (not hidden/heads), kv heads = heads.
  Qwen3Config d = with([](json& j) {
    j.erase("head_dim");
    j.erase("num_key_value_heads");
    j.erase("rope_theta");
    j.erase("tie_word_embeddings");
    j.erase("model_type");
  });
  CHECK(d.head_dim == 128);
  CHECK(d.num_key_value_heads == 16);
  CHECK(d.rope_theta == 10000.0);
  CHECK_FALSE(d.tie_word_embeddings);
  // to_json -> from_json is the identity, and to_json names the architecture.
  json out = c.to_json();
  CHECK(out["model_type"] == "qwen3");
  CHECK(out["architectures"] == json::array({"Qwen3ForCausalLM"}));
  CHECK(out["rope_parameters"]["rope_theta"] == 5e6);
  CHECK(Qwen3Config::from_json(out, "out.json").to_json() == out);
  // load() reads a directory's config.json.
  testing::TempDir tmp("qwen3_config");
  tmp.write("config.json", out.dump());
  CHECK(Qwen3Config::load(tmp.dir.string()).to_json() == out);
  CHECK_THROWS_WITH(Qwen3Config::load(tmp.file("none")), Catch::Contains("cannot open"));
  std::filesystem::create_directories(tmp.file("bad"));
  tmp.write("bad/config.json", "{ not json");
  CHECK_THROWS_WITH(Qwen3Config::load(tmp.file("bad")), Catch::Contains("invalid JSON"));
}

TEST_CASE("qwen3 config: unsupported or invalid configs are errors naming the file and key") {
  auto error_of = [](const std::function<void(json&)>& edit) {
    try {
      with(edit);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto yarn = error_of([](json& j) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  });
  CHECK(yarn.find("cfg.json") != std::string::npos);
  CHECK(yarn.find("rope_scaling") != std::string::npos);
  CHECK(yarn.find("yarn") != std::string::npos);
  CHECK(error_of([](json& j) {
          j["rope_parameters"] = {{"rope_type", "dynamic"}};
        }).find("rope_parameters.rope_type") != std::string::npos);
  CHECK(error_of([](json& j) { j["hidden_act"] = "gelu"; }).find("hidden_act") !=
        std::string::npos);
  auto gqa = error_of([](json& j) { j["num_key_value_heads"] = 5; });
  CHECK(gqa.find("cfg.json") != std::string::npos);
  CHECK(gqa.find("num_key_value_heads (5)") != std::string::npos);
  auto missing = error_of([](json& j) { j.erase("vocab_size"); });
  CHECK(missing.find("cfg.json: missing required key 'vocab_size'") != std::string::npos);
  CHECK(error_of([](json& j) {
          j["hidden_size"] = "big";
        }).find("'hidden_size' must be an integer") != std::string::npos);
  CHECK(error_of([](json& j) { j["model_type"] = "qwen3_vl"; }).find("model_type") !=
        std::string::npos);
  CHECK(error_of([](json& j) { j["use_sliding_window"] = true; }).find("use_sliding_window") !=
        std::string::npos);
  CHECK(error_of([](json& j) {
          j["layer_types"] = {"full_attention", "sliding_attention"};
        }).find("layer_types") != std::string::npos);
  CHECK(error_of([](json& j) { j["rms_norm_eps"] = 0; }).find("rms_norm_eps") != std::string::npos);
}

TEST_CASE("qwen3 config: the tiny test config T1") {
  Qwen3Config c = tiny_qwen3_config(true);
  c.validate();
  CHECK(c.hidden_size == 64);
  CHECK(c.num_attention_heads * c.head_dim == 128);
  CHECK(c.vocab_size == 512);
  CHECK(c.tie_word_embeddings);
  CHECK(c.rope_theta == 1e6);
}

TEST_CASE("qwen3 flops: per-token training FLOPs match qwen-models.md §7 within 0.5%") {
  struct Ref {
    const char* name;
    int64_t H, L, Hq, Hkv, I;
    bool tie;
    double gflops; // per token at S = 4096
  };
  for (const Ref& r : {Ref{"0.6B", 1024, 28, 16, 8, 3072, true, 4.99},
                       Ref{"1.7B", 2048, 28, 16, 8, 6144, true, 11.73},
                       Ref{"4B", 2560, 36, 32, 8, 9728, true, 27.76},
                       Ref{"8B", 4096, 36, 32, 8, 12288, false, 49.03}}) {
    INFO(r.name);
    Qwen3Config c;
    c.vocab_size = 151936;
    c.hidden_size = r.H;
    c.num_hidden_layers = r.L;
    c.num_attention_heads = r.Hq;
    c.num_key_value_heads = r.Hkv;
    c.head_dim = 128;
    c.intermediate_size = r.I;
    c.tie_word_embeddings = r.tie;
    TrainingFlops f = dense_text_training_flops(c, std::vector<int64_t>{4096});
    CHECK(f.tokens == 4096);
    CHECK(f.per_token() / 1e9 == Approx(r.gflops).epsilon(0.005));
  }
  // 0.6B split: 3.58 linear + 1.41 attention.
  Qwen3Config c = Qwen3Config::from_json(qwen3_06b(), "cfg.json");
  TrainingFlops f = dense_text_training_flops(c, std::vector<int64_t>{4096});
  CHECK(f.linear / 4096 / 1e9 == Approx(3.58).epsilon(0.005));
  CHECK(f.attention / 4096 / 1e9 == Approx(1.41).epsilon(0.005));
}

TEST_CASE("qwen3 flops: packed documents count causal pairs per document, padding excluded") {
  Qwen3Config c = tiny_qwen3_config();
  const double per_pair = 12.0 * 4 * 32 * 2; // 12 · Hq · D · L
  const double per_token = 6.0 * double(dense_text_matmul_params(c));
  CHECK(dense_text_matmul_params(c) ==
        2 * (64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 128) + 64 * 512);
  // cu_seqlens [0, 5, 70, 133] plus a padding segment to 160.
  TrainingFlops f = dense_text_training_flops(c, std::vector<int32_t>{0, 5, 70, 133, 160}, 3);
  CHECK(f.tokens == 133);
  CHECK(f.linear == per_token * 133);
  CHECK(f.attention == per_pair * (5 * 6 / 2 + 65 * 66 / 2 + 63 * 64 / 2));
  TrainingFlops all = dense_text_training_flops(c, std::vector<int32_t>{0, 5, 70, 133, 160});
  CHECK(all.tokens == 160);
  CHECK_THROWS_WITH(dense_text_training_flops(c, std::vector<int32_t>{0, 5}, 2),
                    Catch::Contains("real documents"));
  CHECK(dense_text_training_flops(c, std::vector<int64_t>{}).per_token() == 0.0);
}
