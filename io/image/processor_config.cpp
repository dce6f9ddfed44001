#include "io/image/processor_config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "src/base/check.h"

namespace vlm::io {

std::string image_processor_json(const ImageProcessorConfig& c) {
  nlohmann::json j = {{"image_processor_type", "Qwen2VLImageProcessorFast"},
                      {"size", {{"shortest_edge", c.min_pixels}, {"longest_edge", c.max_pixels}}},
                      {"patch_size", c.patch_size},
                      {"temporal_patch_size", c.temporal_patch_size},
                      {"merge_size", c.merge_size},
                      {"image_mean", c.mean},
                      {"image_std", c.std},
                      {"do_resize", true},
                      {"do_rescale", true},
                      {"rescale_factor", 1.0 / 255.0},
                      {"do_normalize", true},
                      {"do_convert_rgb", true}};
  return j.dump(2) + "\n";
}

ImageProcessorConfig read_image_processor_config(const std::string& path) {
  std::ifstream f(path);
  VLM_CHECK(f, path, ": cannot open the image processor config");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    VLM_FAIL(path, ": not valid JSON (", e.what(), ")");
  }
  VLM_CHECK(j.is_object(), path, ": expected a JSON object");
  ImageProcessorConfig c;
  auto read = [&](const nlohmann::json& obj, const char* key, auto& out, const char* where) {
    if (!obj.contains(key) || obj[key].is_null()) return;
    try {
      obj[key].get_to(out);
    } catch (const std::exception&) {
      VLM_FAIL(path, ": '", where, "' has the wrong type (", obj[key].dump(), ")");
    }
  };
  read(j, "min_pixels", c.min_pixels, "min_pixels");
  read(j, "max_pixels", c.max_pixels, "max_pixels");
  if (j.contains("size") && j["size"].is_object()) {
    read(j["size"], "shortest_edge", c.min_pixels, "size.shortest_edge");
    read(j["size"], "longest_edge", c.max_pixels, "size.longest_edge");
  }
  read(j, "patch_size", c.patch_size, "patch_size");
  read(j, "temporal_patch_size", c.temporal_patch_size, "temporal_patch_size");
  read(j, "merge_size", c.merge_size, "merge_size");
  read(j, "image_mean", c.mean, "image_mean");
  read(j, "image_std", c.std, "image_std");
  return c;
}

} // namespace vlm::io
