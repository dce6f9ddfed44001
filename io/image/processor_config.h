// preprocessor_config.json of a Qwen3-VL / Qwen3.5 snapshot <-> ImageProcessorConfig: what a
// saved model needs to see images again as it was trained (`vlmtrain generate`), and what
// transformers' AutoProcessor reads from a snapshot we export.
#pragma once

#include <string>

#include "io/image/preprocess.h"

namespace vlm::io {

// The JSON transformers v5 writes for Qwen2VLImageProcessor: size.{shortest_edge,longest_edge}
// (min / max pixels), patch_size, temporal_patch_size, merge_size, image_mean, image_std.
std::string image_processor_json(const ImageProcessorConfig& cfg);

// Reads such a file; also the older min_pixels / max_pixels keys. Missing keys keep their
// defaults; a value of the wrong type is an error naming the file and the key.
ImageProcessorConfig read_image_processor_config(const std::string& path);

} // namespace vlm::io
