// Qwen3.5 beyond the golden files: packed documents never see each other (the causal conv1d
// history and the delta-rule state reset at every document start, attention stays within each
// document), the config's reading and refusals, and the registry.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/batch_file.h"
#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "model/qwen3_5/config.h"
#include "src/core/autograd.h"
#include "src/core/ops.h"
#include "tests/golden/golden.h"

using namespace vlm;
using namespace vlm::model;
using vlm::testing::rel_error;

namespace {

std::string data(const std::string& rel) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/" + rel;
}

// Document d of a packed batch as a batch of its own: its tokens, targets, positions and images
// (the batch's images belong to the documents in order of their placeholders).
std::vector<Batch> split_documents(const Batch& b, int64_t image_token_id, int64_t merge) {
  const std::vector<double> cu = b.cu_seqlens.to_doubles(), ids = b.input_ids.to_doubles();
  std::vector<double> grids;
  if (b.image_grid_thw.defined()) grids = b.image_grid_thw.to_doubles();
  std::vector<Batch> docs;
  int64_t image = 0, patch = 0;
  for (size_t d = 0; d + 1 < cu.size(); d++) {
    const int64_t s = int64_t(cu[d]), e = int64_t(cu[d + 1]);
    Batch o;
    o.input_ids = slice(b.input_ids, 0, s, e).contiguous();
    o.targets = slice(b.targets, 0, s, e).contiguous();
    o.position_ids = slice(b.position_ids, b.position_ids.dim() - 1, s, e).contiguous();
    o.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, int32_t(e - s)}, {2});
    int64_t placeholders = 0;
    for (int64_t t = s; t < e; t++) placeholders += ids[size_t(t)] == double(image_token_id);
    const int64_t first_image = image, first_patch = patch;
    while (placeholders > 0) {
      const int64_t n = int64_t(grids[3 * image] * grids[3 * image + 1] * grids[3 * image + 2]);
      placeholders -= n / (merge * merge);
      patch += n;
      image++;
    }
    if (image > first_image) {
      o.pixel_values = slice(b.pixel_values, 0, first_patch, patch).contiguous();
      o.image_grid_thw = slice(b.image_grid_thw, 0, first_image, image).contiguous();
    }
    docs.push_back(o);
  }
  return docs;
}

std::map<std::string, Tensor> take_grads(const CausalLM& m) {
  std::map<std::string, Tensor> g;
  for (const auto& p : m.named_parameters()) g[p.name] = p.tensor.grad().clone();
  return g;
}

} // namespace

TEST_CASE("qwen3_5 model: a packed row equals each document run alone, logits and every "
          "gradient") {
  // The golden row: documents of 11, 140 (two images), 1 and 25 tokens; every boundary falls
  // inside a 64-token chunk and the 1-token document is shorter than the conv kernel. In f64 the
  // two agree to rounding (observed 1.9e-14): a conv tap or a state carried across a boundary
  // would show at ~1e-3. In f32 both are rounded differently (GEMMs over the row vs over each
  // document: other blockings and summation orders): logits to 5e-6 (observed 1.7e-6), gradients
  // to 3e-5 (observed 7.1e-6 hybrid, 2.1e-6 tied, at A_log / dt_bias: sums of dg·g over the
  // tokens, with cancellation).
  for (DType dtype : {DType::f64, DType::f32}) {
    const bool f64 = dtype == DType::f64;
    for (const char* variant : {"hybrid", "tied"}) {
      INFO(variant << " " << dtype_name(dtype));
      auto m = load_pretrained(data(std::string("qwen3_5_tiny_") + variant), dtype);
      const Batch packed = read_batch_file(
          data(std::string("qwen3_5_tiny_batches/") + variant + "_packed.safetensors"), true);
      REQUIRE(packed.cu_seqlens.numel() == 5);

      m->zero_grad();
      lm_loss(*m, packed, Reduction::sum).backward();
      const std::map<std::string, Tensor> want_grads = take_grads(*m);
      Tensor want_logits;
      {
        NoGradGuard no_grad;
        want_logits = lm_logits(*m, packed);
      }

      m->zero_grad();
      std::vector<Tensor> logits;
      const nlohmann::json c = m->hf_config();
      for (const Batch& doc : split_documents(packed, c.at("image_token_id").get<int64_t>(),
                                              c.at("vision_config").at("spatial_merge_size"))) {
        lm_loss(*m, doc, Reduction::sum).backward();
        NoGradGuard no_grad;
        logits.push_back(lm_logits(*m, doc));
      }
      CHECK(rel_error(concat(logits, 0), want_logits) <= (f64 ? 1e-12 : 5e-6));
      const std::map<std::string, Tensor> got_grads = take_grads(*m);
      REQUIRE(got_grads.size() == want_grads.size());
      for (const auto& [name, g] : want_grads) {
        INFO(name);
        CHECK(rel_error(got_grads.at(name), g) <= (f64 ? 1e-12 : 3e-5));
      }
    }
  }
}

TEST_CASE("qwen3_5 config: layer kinds, partial rotary and the refusals") {
  const nlohmann::json j = tiny_qwen3_5_config().to_json();
  const Qwen3_5Config c = Qwen3_5Config::from_json(j, "config.json");
  CHECK(c.rotary_dim() == 16);
  CHECK(c.num_linear_attention_layers() == 6);
  CHECK(c.is_linear_attention(0));
  CHECK_FALSE(c.is_linear_attention(3));
  CHECK(c.to_json() == j);
  // A vision_config without model_type is Qwen3.5's tower: no DeepStack (the tiny one has 2
  // blocks, so Qwen3-VL's default indexes 8, 16, 24 would not even fit).
  nlohmann::json untyped = j;
  untyped["vision_config"].erase("model_type");
  CHECK(Qwen3_5Config::from_json(untyped, "config.json").vision.deepstack_visual_indexes.empty());

  // No layer_types: every full_attention_interval-th layer is attention.
  nlohmann::json k = j;
  k["text_config"].erase("layer_types");
  k["text_config"]["full_attention_interval"] = 2;
  const Qwen3_5Config d = Qwen3_5Config::from_json(k, "config.json");
  CHECK(d.layer_types == std::vector<std::string>{"linear_attention", "full_attention",
                                                  "linear_attention", "full_attention",
                                                  "linear_attention", "full_attention",
                                                  "linear_attention", "full_attention"});

  auto fails_with = [&](nlohmann::json bad, const std::string& what) {
    CHECK_THROWS_WITH(Qwen3_5Config::from_json(bad, "config.json"), Catch::Contains(what));
  };
  nlohmann::json bad = j;
  bad["text_config"]["layer_types"][2] = "sliding_attention";
  fails_with(bad, "'layer_types' entry 2");
  bad = j;
  bad["text_config"]["linear_num_value_heads"] = 3;
  fails_with(bad, "multiple of linear_num_key_heads");
  bad = j;
  bad["text_config"]["rope_parameters"]["mrope_section"] = {3, 3, 3};
  fails_with(bad, "sum to rotary_dim / 2 = 8");
  bad = j;
  bad["text_config"]["layer_types"].erase(0);
  fails_with(bad, "layer_types has 7 entries for 8 layers");
  CHECK_THROWS_WITH(
      build_model(nlohmann::json{{"model_type", "qwen3_5_moe"}}, "config.json", DType::f32),
      Catch::Contains("mixture of experts"));
}

TEST_CASE("qwen3_5 model: the registry builds the presets with the released parameter counts") {
  // qwen-models.md §3.1: text 0.752 B (0.8B) and 8.954 B (9B), vision 0.10 and 0.46 B.
  const std::map<std::string, std::pair<double, double>> want = {
      {"qwen3.5-0.8b", {0.752, 0.10}}, {"qwen3.5-9b", {8.954, 0.46}}, {"tiny-3.5", {0, 0}}};
  for (const auto& [preset, billions] : want) {
    INFO(preset);
    const nlohmann::json j = preset_config(preset);
    auto m = build_model(j, preset, DType::f32);
    CHECK(m->model_type() == "qwen3_5");
    const Qwen3_5Config c = Qwen3_5Config::from_json(j, preset);
    CHECK(m->num_parameters() == c.num_parameters());
    if (billions.first == 0) continue;
    const double vision = double(c.vision.num_parameters()) / 1e9;
    CHECK(std::abs(double(c.num_parameters()) / 1e9 - vision - billions.first) < 0.001);
    CHECK(std::abs(vision - billions.second) < 0.01);
  }
}

TEST_CASE("qwen3_5 model: training FLOPs per token are qwen-models.md §7's") {
  // Qwen3.5-9B at S = 4096, per token: 47.61 GF in the GEMMs (gated q_proj, the Gated DeltaNet
  // projections, the MLPs and the head), 0.81 GF causal attention in the 8 attention layers and
  // 0.23 GF for the delta rule's minimal count 18 · HV · dk · dv in the 24 others.
  auto m = build_model(preset_config("qwen3.5-9b"), "qwen3.5-9b", DType::f32);
  const TrainingFlops f = m->training_flops({0, 4096});
  CHECK(f.tokens == 4096);
  CHECK(std::abs(f.linear / 4096 / 1e9 - 47.61) < 0.01);
  CHECK(std::abs(f.attention / 4096 / 1e9 - (0.81 + 0.23)) < 0.01);
  // Packed: attention over each document, not the row; padding (the last segment) left out.
  const TrainingFlops two = m->training_flops({0, 2048, 4096, 4200}, 2);
  CHECK(two.tokens == 4096);
  CHECK(two.linear == f.linear);
  CHECK(two.attention < f.attention);
}
