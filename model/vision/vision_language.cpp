#include "model/vision/vision_language.h"

#include <algorithm>
#include <sstream>

#include "model/config_json.h"
#include "src/base/check.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/index.h"
#include "src/core/ops/reduce.h"

namespace vlm::model {

namespace {

using nlohmann::json;

// Host copies of small batch tensors (a device tensor is read back: one synchronization).
std::vector<int64_t> host_ints(const Tensor& t) {
  std::vector<int64_t> out;
  out.reserve(size_t(t.numel()));
  for (double v : t.to_doubles()) out.push_back(int64_t(v));
  return out;
}

} // namespace

void VisionLanguageFields::read_vision_json(const json& j, const std::string& where,
                                            const std::string& default_vision_type) {
  const std::string vw = where + " (vision_config)";
  const json v = json_object(j, "vision_config", where);
  vision = VisionConfig::from_json(v, vw, default_vision_type);
  vision_model_type = json_string(v, "model_type", vw, default_vision_type);
  image_token_id = json_int(j, "image_token_id", where, image_token_id);
  video_token_id = json_int(j, "video_token_id", where, video_token_id);
  vision_start_token_id = json_int(j, "vision_start_token_id", where, vision_start_token_id);
  vision_end_token_id = json_int(j, "vision_end_token_id", where, vision_end_token_id);
}

void VisionLanguageFields::write_vision_json(json& j) const {
  j["vision_config"] = vision.to_json(vision_model_type);
  j["image_token_id"] = image_token_id;
  j["video_token_id"] = video_token_id;
  j["vision_start_token_id"] = vision_start_token_id;
  j["vision_end_token_id"] = vision_end_token_id;
}

void VisionLanguageFields::validate_vision(const std::string& who, int64_t vocab_size,
                                           int64_t hidden_size) const {
  vision.validate();
  VLM_CHECK(vision.out_hidden_size == hidden_size, who, ": vision_config.out_hidden_size (",
            vision.out_hidden_size, ") must equal the text hidden_size (", hidden_size, ")");
  for (auto [name, id] : {std::pair{"image_token_id", image_token_id},
                          {"video_token_id", video_token_id},
                          {"vision_start_token_id", vision_start_token_id},
                          {"vision_end_token_id", vision_end_token_id}})
    VLM_CHECK(id >= 0 && id < vocab_size, who, ": ", name, " = ", id,
              " is outside the vocabulary [0, ", vocab_size, ")");
}

std::string VisionLanguageFields::vision_summary() const {
  std::ostringstream os;
  os << "vision depth=" << vision.depth << ", Hv=" << vision.hidden_size
     << ", heads=" << vision.num_heads << ", Iv=" << vision.intermediate_size
     << ", deepstack=" << vision.deepstack_visual_indexes.size();
  return os.str();
}

void VisionLanguageFields::set_tiny_vision() {
  vision.depth = 4;
  vision.hidden_size = 64;
  vision.intermediate_size = 128;
  vision.num_heads = 4;
  vision.out_hidden_size = 64;
  vision.num_position_embeddings = 64;
  vision.deepstack_visual_indexes = {0, 2, 3};
  image_token_id = 500;
  video_token_id = 501;
  vision_start_token_id = 502;
  vision_end_token_id = 503;
}

json vlm_text_config(const json& j, const std::string& where, const char* model_type,
                     const char* text_model_type, const char* family) {
  VLM_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  const std::string type = json_string(j, "model_type", where, model_type);
  VLM_CHECK(type == model_type, where, ": key 'model_type' is '", type, "'; this loader reads ",
            family, " (\"", model_type, "\") only");
  VLM_CHECK(has_key(j, "text_config"), where, ": missing required key 'text_config'");
  const json t = json_object(j, "text_config", where);
  const std::string tw = where + " (text_config)";
  const std::string text_type = json_string(t, "model_type", tw, text_model_type);
  VLM_CHECK(text_type == text_model_type, tw, ": key 'model_type' is '", text_type,
            "'; expected \"", text_model_type, "\"");
  return t;
}

void read_vlm_config(const json& j, const json& t, const std::string& where,
                     const std::string& default_vision_type, TextConfig& text,
                     VisionLanguageFields& vision) {
  const std::string tw = where + " (text_config)";
  text.tie_word_embeddings =
      json_bool(j, "tie_word_embeddings", where, json_bool(t, "tie_word_embeddings", tw, false));
  vision.read_vision_json(j, where, default_vision_type);
  text.torch_dtype =
      json_string(j, "dtype", where,
                  json_string(j, "torch_dtype", where, json_string(t, "dtype", tw, "bfloat16")));
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (has_key(j, key)) text.token_ids[key] = j[key];
}

json vlm_config_json(const json& text_config, const char* architecture, const char* model_type,
                     const TextConfig& text, const VisionLanguageFields& vision) {
  json j;
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["text_config"] = text_config;
  vision.write_vision_json(j);
  j["tie_word_embeddings"] = text.tie_word_embeddings;
  j["dtype"] = text.torch_dtype;
  j["torch_dtype"] = text.torch_dtype;
  for (const auto& [k, val] : text.token_ids.items()) j[k] = val;
  return j;
}

void adapt_to_tokenizer(int64_t& vocab_size, VisionLanguageFields& f, const PresetOptions& o) {
  vocab_size = std::max<int64_t>(vocab_size, (o.min_vocab_size + 63) / 64 * 64);
  if (o.image_token_id >= 0) f.image_token_id = o.image_token_id;
  if (o.video_token_id >= 0) f.video_token_id = o.video_token_id;
  if (o.vision_start_token_id >= 0) f.vision_start_token_id = o.vision_start_token_id;
  if (o.vision_end_token_id >= 0) f.vision_end_token_id = o.vision_end_token_id;
}

FusedEmbeddings fuse_image_features(const VisionTower& tower, const Tensor& token_embeds,
                                    const Batch& b, int64_t image_token_id, DType dtype,
                                    const char* who) {
  const Device device = b.input_ids.device();
  // The image placeholder positions, in order.
  // The host copy when the batch has one (to_device): no read-back of the device ids.
  const std::vector<int64_t> ids =
      host_ints(b.host_input_ids.defined() ? b.host_input_ids : b.input_ids);
  std::vector<int64_t> image_pos;
  std::vector<double> keep(ids.size(), 1.0);
  for (size_t t = 0; t < ids.size(); t++)
    if (ids[t] == image_token_id) image_pos.push_back(int64_t(t)), keep[t] = 0.0;

  std::vector<GridTHW> grids;
  if (b.image_grid_thw.defined()) {
    const std::vector<int64_t> g = host_ints(b.image_grid_thw);
    for (size_t i = 0; i + 2 < g.size(); i += 3) grids.push_back({g[i], g[i + 1], g[i + 2]});
  }
  FusedEmbeddings out;
  out.embeds = token_embeds;
  if (!grids.empty()) {
    VisionFeatures vision = tower.forward(b.pixel_values, grids);
    VLM_CHECK(vision.embeds.size(0) == int64_t(image_pos.size()), who, ": the batch has ",
              image_pos.size(), " <|image_pad|> tokens (id ", image_token_id, ") but its ",
              grids.size(), " images give ", vision.embeds.size(0), " image features");
    out.image_positions = Tensor::from_vector(image_pos, {int64_t(image_pos.size())}, device);
    const Tensor keep_t = Tensor::from_doubles(keep, {int64_t(keep.size()), 1}, dtype, device);
    out.embeds = index_add(mul(token_embeds, keep_t), 0, out.image_positions, vision.embeds);
    out.deepstack = std::move(vision.deepstack);
    return out;
  }
  VLM_CHECK(image_pos.empty(), who, ": the batch has ", image_pos.size(),
            " <|image_pad|> tokens (id ", image_token_id, ") but no pixel_values");
  if (b.kv_cache) return out; // decoding needs no vision gradients
  const VisionConfig& v = tower.config();
  const int64_t m = v.spatial_merge_size;
  const Tensor blank = Tensor::zeros({m * m, v.patch_dim()}, dtype, device);
  const VisionFeatures unused = tower.forward(blank, {GridTHW{1, m, m}});
  Tensor zero = sum(unused.embeds);
  for (const Tensor& f : unused.deepstack) zero = add(zero, sum(f));
  out.embeds = add(token_embeds, scale(zero, 0.0));
  return out;
}

void check_vision_batch(const Batch& b, const char* who) {
  const int64_t T = b.input_ids.numel();
  VLM_CHECK(b.position_ids.defined() &&
                ((b.position_ids.dim() == 1 && b.position_ids.size(0) == T) ||
                 (b.position_ids.dim() == 2 && b.position_ids.size(0) == 3 &&
                  b.position_ids.size(1) == T)),
            who, ": position_ids must be [3, T] (t, h, w) or [T] with T = ", T, ", got ",
            b.position_ids.defined() ? b.position_ids.desc() : std::string("nothing"));
  VLM_CHECK(b.pixel_values.defined() == b.image_grid_thw.defined(), who,
            ": pixel_values and image_grid_thw come together (got only ",
            b.pixel_values.defined() ? "pixel_values" : "image_grid_thw", ")");
  VLM_CHECK(!b.image_grid_thw.defined() ||
                (b.image_grid_thw.dim() == 2 && b.image_grid_thw.size(1) == 3),
            who, ": image_grid_thw must be [images, 3], got ", b.image_grid_thw.desc());
}

void add_vision_flops(TrainingFlops& f, const VisionConfig& v,
                      const std::vector<std::array<int64_t, 3>>& image_grids) {
  // Per patch the patch embedding and the blocks; per merged token (m x m patches) the merger and
  // each DeepStack merger; attention over all pairs of one frame's patches.
  const int64_t Hv = v.hidden_size, m2 = v.spatial_merge_size * v.spatial_merge_size;
  const double per_patch =
      double(v.patch_dim() * Hv + v.depth * (4 * Hv * Hv + 2 * Hv * v.intermediate_size));
  const double per_merged = double(int64_t(1 + v.deepstack_visual_indexes.size()) *
                                   (Hv * m2 * Hv * m2 + Hv * m2 * v.out_hidden_size));
  for (const auto& g : image_grids) { // attention runs per frame (t) of h x w patches
    const double frame = double(g[1] * g[2]), patches = double(g[0]) * frame;
    f.linear += 6.0 * (per_patch * patches + per_merged * patches / double(m2));
    f.attention += 12.0 * double(Hv) * double(g[0]) * frame * frame * double(v.depth);
  }
}

} // namespace vlm::model
