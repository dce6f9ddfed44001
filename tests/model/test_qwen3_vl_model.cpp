// Qwen3-VL beyond the golden: HF names and counts of the snapshot, the parameter groups of the
// training controls (merger + DeepStack mergers = mlp, every other vision parameter = vit),
// freezing each part (no gradient, no optimizer state, the step still defined), the export
// round trip, batch errors that name what disagrees, and the refused MoE variant.
#include <catch2/catch.hpp>

#include <filesystem>
#include <set>

#include "io/state/safetensors.h"
#include "model/batch_file.h"
#include "model/hf_weights.h"
#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "model/qwen3_vl/model.h"
#include "src/core/ops.h"
#include "src/train/train_step.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"

using namespace vlm;
using namespace vlm::model;
using Catch::Matchers::Contains;
using vlm::testing::error_of;
namespace fs = std::filesystem;

namespace {

std::string data(const std::string& rel) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/" + rel;
}

std::shared_ptr<CausalLM> load(const std::string& variant) {
  return load_pretrained(data("qwen3_vl_tiny_" + variant), DType::f32);
}

Batch packed_batch() {
  return model::read_batch_file(data("qwen3_vl_tiny_batches/untied_packed.safetensors"), true);
}

// A snapshot of every parameter's values.
std::map<std::string, std::vector<double>> values_of(const nn::Module& m) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& p : m.named_parameters()) out[p.name] = p.tensor.to_doubles();
  return out;
}

} // namespace

TEST_CASE("qwen3_vl model: HF names and shapes of the snapshot, parameter count, summary") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    auto m = load(variant);
    io::SafetensorsFile f(data(std::string("qwen3_vl_tiny_") + variant + "/model.safetensors"));
    const std::vector<std::string> names = f.names();
    std::set<std::string> ours, theirs(names.begin(), names.end());
    for (const auto& p : m->named_parameters()) {
      ours.insert(p.name);
      CHECK(p.tensor.shape() == f.get(p.name).shape);
    }
    CHECK(ours == theirs);
    const auto& vl = static_cast<const Qwen3VLForConditionalGeneration&>(*m);
    CHECK(vl.config().num_parameters() == m->num_parameters());
    CHECK(m->has_vision());
    // The vision blocks come first, then the decoder layers (the FSDP units of issue 13).
    CHECK(m->blocks().size() == 4u + 4u);
  }
}

TEST_CASE("qwen3_vl model: parameter groups for train_llm / train_mlp / train_vit") {
  auto m = load("untied");
  std::map<ParamGroup, int> count;
  for (const auto& p : m->named_parameters()) {
    INFO(p.name);
    const ParamRole r = m->param_role(p.name);
    count[r.group]++;
    const bool visual = p.name.rfind("model.visual.", 0) == 0;
    const bool merger = p.name.rfind("model.visual.merger.", 0) == 0 ||
                        p.name.rfind("model.visual.deepstack_merger_list.", 0) == 0;
    CHECK(r.group == (merger ? ParamGroup::mlp : visual ? ParamGroup::vit : ParamGroup::llm));
    CHECK(r.kind == param_kind_by_name(p.name));
  }
  CHECK(m->param_role("model.visual.pos_embed.weight").group == ParamGroup::vit);
  CHECK(m->param_role("model.visual.pos_embed.weight").kind == ParamKind::embedding);
  CHECK(m->param_role("model.visual.blocks.0.norm1.weight").kind == ParamKind::norm);
  CHECK(m->param_role("model.visual.merger.norm.bias").kind == ParamKind::bias);
  CHECK(count[ParamGroup::mlp] == 4 * 6); // merger + 3 DeepStack mergers: norm, fc1, fc2 (w, b)
  CHECK(count[ParamGroup::vit] == 75 - 24);
  CHECK(count[ParamGroup::llm] == 122 - 75);
}

TEST_CASE("qwen3_vl model: a frozen part has no gradient, no optimizer state and does not move") {
  struct Case {
    bool llm, mlp, vit;
  };
  for (const Case k : {Case{true, true, false}, Case{false, true, false}, Case{true, false, true},
                       Case{false, false, true}}) {
    INFO("train_llm " << k.llm << " train_mlp " << k.mlp << " train_vit " << k.vit);
    auto m = load("untied");
    train::TrainConfig c;
    c.training.total_steps = 2;
    c.training.warmup_steps = 1;
    c.training.lr_llm = c.training.lr_mlp = c.training.lr_vit = 1e-2;
    c.training.param_dtype = DType::f32;
    c.model.train_llm = k.llm;
    c.model.train_mlp = k.mlp;
    c.model.train_vit = k.vit;
    train::TrainStepper stepper(c, m);
    const auto before = values_of(*m);
    const Batch b = packed_batch();
    const auto st = stepper.step(0, {b});
    REQUIRE_FALSE(st.skipped);
    CHECK(std::isfinite(st.loss));
    CHECK(st.grad_norm > 0);
    const auto after = values_of(*m);
    for (const auto& p : m->named_parameters()) {
      INFO(p.name);
      const ParamGroup g = m->param_role(p.name).group;
      const bool trained = g == ParamGroup::llm ? k.llm : g == ParamGroup::mlp ? k.mlp : k.vit;
      CHECK(stepper.optimizer().has_state(p.name) == trained);
      CHECK(p.tensor.requires_grad() == trained);
      CHECK_FALSE(p.tensor.grad().defined()); // dropped after the step, or never made
      CHECK((before.at(p.name) != after.at(p.name)) == trained);
    }
  }
}

TEST_CASE("qwen3_vl model: export round trip gives bit-identical logits, untied and tied") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    testing::TempDir tmp("qwen3_vl_export");
    auto a = load(variant);
    save_hf_snapshot(*a, a->hf_config(), tmp.file("export"), DType::f32, "");
    io::SafetensorsFile f(tmp.file("export/model.safetensors"));
    CHECK(f.contains("lm_head.weight") == (std::string(variant) == "untied"));
    auto b = load_pretrained(tmp.file("export"), DType::f32);
    CHECK(b->hf_config() == a->hf_config());
    NoGradGuard no_grad;
    const Batch batch = packed_batch();
    CHECK(lm_logits(*a, batch).to_doubles() == lm_logits(*b, batch).to_doubles());
  }
}

TEST_CASE("qwen3_vl model: bad batches name what disagrees") {
  auto m = load("untied");
  NoGradGuard no_grad;
  Batch b = packed_batch();
  Batch no_pixels = b;
  no_pixels.pixel_values = Tensor();
  CHECK_THAT(error_of([&] { lm_logits(*m, no_pixels); }),
             Contains("pixel_values and image_grid_thw come together"));
  Batch no_images = b;
  no_images.pixel_values = Tensor();
  no_images.image_grid_thw = Tensor();
  CHECK_THAT(error_of([&] { lm_logits(*m, no_images); }),
             Contains("26 <|image_pad|> tokens (id 500) but no pixel_values"));
  Batch one_image = b; // only the first image's grid and patches: 6 features for 26 tokens
  one_image.image_grid_thw = slice(b.image_grid_thw, 0, 0, 1);
  one_image.pixel_values = slice(b.pixel_values, 0, 0, 24);
  CHECK_THAT(error_of([&] { lm_logits(*m, one_image); }),
             Contains("26 <|image_pad|> tokens (id 500) but its 1 images give 6 image features"));
  Batch wrong_dim = b;
  wrong_dim.pixel_values = slice(b.pixel_values, 1, 0, 768);
  CHECK_THAT(error_of([&] { lm_logits(*m, wrong_dim); }),
             Contains("pixel_values must be [104, 1536]"));
}

TEST_CASE("qwen3_vl model: the MoE variant is refused with a clear error") {
  nlohmann::json j = read_config_json(data("qwen3_vl_tiny_untied"));
  j["model_type"] = "qwen3_vl_moe";
  CHECK_THAT(error_of([&] { build_model(j, "config.json", DType::f32); }),
             Contains("qwen3_vl_moe"));
}

TEST_CASE("qwen3_vl: training FLOPs add the vision tower's per image") {
  // tiny-vl: tower width 64, MLP 128, depth 4, patches of 3 x 2 x 16 x 16 = 1536 values, 2 x 2
  // merge, 3 DeepStack mergers, LLM width 64. Per patch 1536*64 + 4*(4*64^2 + 2*64*128) = 229376
  // matmul weights, per merged token 4*(256^2 + 256*64) = 327680.
  const Qwen3VLForConditionalGeneration m(tiny_qwen3_vl_config(), DType::f32);
  const std::vector<int32_t> cu = {0, 40, 64};
  const TrainingFlops text = m.training_flops(cu);
  // One 4 x 6 image: 24 patches, 6 merged tokens; attention 12 * 64 * 24^2 * 4 layers.
  const TrainingFlops one = m.training_flops(cu, -1, {{1, 4, 6}});
  CHECK(one.tokens == text.tokens);
  CHECK(one.linear - text.linear == 6.0 * (229376.0 * 24 + 327680.0 * 6));
  CHECK(one.attention - text.attention == 12.0 * 64 * 24 * 24 * 4);
  // Two frames of 4 x 6: twice the weights' work, attention within each frame only.
  const TrainingFlops two = m.training_flops(cu, -1, {{2, 4, 6}});
  CHECK(two.linear - text.linear == 2 * (one.linear - text.linear));
  CHECK(two.attention - text.attention == 2 * (one.attention - text.attention));
}
