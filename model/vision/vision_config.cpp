#include "model/vision/vision_config.h"

#include <cmath>
#include <set>

#include "model/config_json.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

// Far above any released tower (depth 27, hidden 1152, 2304 table rows).
constexpr int64_t kMaxDimension = int64_t(1) << 20;
constexpr int64_t kMaxDepth = 1024;

} // namespace

int64_t VisionConfig::table_side() const {
  return int64_t(std::llround(std::sqrt(double(num_position_embeddings))));
}

void VisionConfig::validate() const {
  auto positive = [](const char* name, int64_t v, int64_t max) {
    VLM_CHECK(v > 0 && v <= max, "VisionConfig: ", name, " must be in [1, ", max, "], got ", v);
  };
  positive("depth", depth, kMaxDepth);
  positive("hidden_size", hidden_size, kMaxDimension);
  positive("intermediate_size", intermediate_size, kMaxDimension);
  positive("num_heads", num_heads, kMaxDimension);
  positive("in_channels", in_channels, 64);
  positive("patch_size", patch_size, 1024);
  positive("temporal_patch_size", temporal_patch_size, 64);
  positive("spatial_merge_size", spatial_merge_size, 64);
  positive("out_hidden_size", out_hidden_size, kMaxDimension);
  positive("num_position_embeddings", num_position_embeddings, kMaxDimension);
  VLM_CHECK(hidden_size % num_heads == 0, "VisionConfig: hidden_size (", hidden_size,
            ") must be a multiple of num_heads (", num_heads, ")");
  VLM_CHECK(head_dim() % 4 == 0,
            "VisionConfig: the head dim hidden_size / num_heads = ", head_dim(),
            " must be a multiple of 4 (the 2-D rotary's row and column halves)");
  VLM_CHECK(table_side() * table_side() == num_position_embeddings,
            "VisionConfig: num_position_embeddings must be a square (a side x side table), got ",
            num_position_embeddings);
  std::set<int64_t> seen;
  for (int64_t i : deepstack_visual_indexes) {
    VLM_CHECK(i >= 0 && i < depth, "VisionConfig: deepstack_visual_indexes entry ", i,
              " is not a block index in [0, ", depth, ")");
    VLM_CHECK(seen.insert(i).second, "VisionConfig: deepstack_visual_indexes lists block ", i,
              " twice");
  }
  VLM_CHECK(layer_norm_eps > 0 && std::isfinite(layer_norm_eps),
            "VisionConfig: layer_norm_eps must be > 0");
  VLM_CHECK(initializer_range >= 0 && std::isfinite(initializer_range),
            "VisionConfig: initializer_range must be >= 0");
}

VisionConfig VisionConfig::from_json(const nlohmann::json& j, const std::string& where,
                                     const std::string& default_type) {
  VLM_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  const std::string type = json_string(j, "model_type", where, default_type);
  const bool qwen3_5 = type == "qwen3_5_vision" || type == "qwen3_5";
  VLM_CHECK(qwen3_5 || type == "qwen3_vl_vision" || type == "qwen3_vl", where,
            ": key 'model_type' is '", type, "'; expected a Qwen3-VL or Qwen3.5 vision tower");
  VisionConfig c;
  if (qwen3_5) c.deepstack_visual_indexes.clear(); // Qwen3.5's tower has no DeepStack
  c.depth = json_int(j, "depth", where, c.depth);
  c.hidden_size = json_int(j, "hidden_size", where, c.hidden_size);
  c.intermediate_size = json_int(j, "intermediate_size", where, c.intermediate_size);
  c.num_heads = json_int(j, "num_heads", where, c.num_heads);
  c.in_channels = json_int(j, "in_channels", where, c.in_channels);
  c.patch_size = json_int(j, "patch_size", where, c.patch_size);
  c.temporal_patch_size = json_int(j, "temporal_patch_size", where, c.temporal_patch_size);
  c.spatial_merge_size = json_int(j, "spatial_merge_size", where, c.spatial_merge_size);
  c.out_hidden_size = json_int(j, "out_hidden_size", where, c.out_hidden_size);
  c.num_position_embeddings =
      json_int(j, "num_position_embeddings", where, c.num_position_embeddings);
  c.deepstack_visual_indexes =
      json_int_list(j, "deepstack_visual_indexes", where, c.deepstack_visual_indexes);
  c.initializer_range = json_double(j, "initializer_range", where, c.initializer_range);
  const std::string act = json_string(j, "hidden_act", where, "gelu_pytorch_tanh");
  VLM_CHECK(act == "gelu_pytorch_tanh", where, ": key 'hidden_act' is '", act,
            "'; the vision MLP implements \"gelu_pytorch_tanh\" only");
  if (has_key(j, "rope_parameters")) {
    const nlohmann::json& r = j["rope_parameters"];
    const std::string rope_type = rope_type_of(r, "rope_parameters", where);
    VLM_CHECK(rope_type == "axial" || rope_type == "default", where,
              ": key 'rope_parameters.rope_type' is '", rope_type,
              "'; the vision rotary is \"axial\"");
    c.rope_theta = json_double(r, "rope_theta", where + " (rope_parameters)", c.rope_theta);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    VLM_FAIL(where, ": ", e.what());
  }
  return c;
}

nlohmann::json VisionConfig::to_json(const std::string& model_type) const {
  nlohmann::json j;
  j["model_type"] = model_type;
  j["depth"] = depth;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_heads"] = num_heads;
  j["in_channels"] = in_channels;
  j["patch_size"] = patch_size;
  j["temporal_patch_size"] = temporal_patch_size;
  j["spatial_merge_size"] = spatial_merge_size;
  j["out_hidden_size"] = out_hidden_size;
  j["num_position_embeddings"] = num_position_embeddings;
  j["deepstack_visual_indexes"] = deepstack_visual_indexes;
  j["hidden_act"] = "gelu_pytorch_tanh";
  j["initializer_range"] = initializer_range;
  return j;
}

int64_t VisionConfig::num_parameters() const {
  const int64_t Hv = hidden_size, Iv = intermediate_size,
                M = Hv * spatial_merge_size * spatial_merge_size;
  const int64_t block =
      4 * Hv + (3 * Hv * Hv + 3 * Hv) + (Hv * Hv + Hv) + (Iv * Hv + Iv) + (Hv * Iv + Hv);
  const int64_t merger_mlp = (M * M + M) + (out_hidden_size * M + out_hidden_size);
  const int64_t merger = 2 * Hv + merger_mlp;
  const int64_t deepstack = 2 * M + merger_mlp;
  return (Hv * patch_dim() + Hv) + num_position_embeddings * Hv + depth * block + merger +
         int64_t(deepstack_visual_indexes.size()) * deepstack;
}

} // namespace vlm::model
