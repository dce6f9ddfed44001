// Qwen3-VL / Qwen3.5 image preprocessing: the HF Qwen2VLImageProcessor (torchvision backend, the
// class their preprocessor_config.json names) in C++ (docs/qwen-models.md §4):
//   smart_resize -> bicubic antialiased resize -> (x - 255·mean) / (255·std) -> two identical
//   temporal frames -> patches of (c, t, y, x) = 3·2·16·16 values in merge-window order.
// The resize reproduces torchvision's uint8 path bit for bit (separable, int16 weights, uint8
// intermediate), so pixel_values equal the reference exactly (tests/io/image/test_image.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "io/image/decode.h"

namespace vlm::io {

// Defaults are Qwen3-VL's / Qwen3.5's preprocessor_config.json (the HF class defaults are
// Qwen2-VL's and differ). The reference trainer overrides max_pixels to 1048576.
struct ImageProcessorConfig {
  int64_t patch_size = 16, merge_size = 2, temporal_patch_size = 2;
  int64_t min_pixels = 65536;    // size.shortest_edge
  int64_t max_pixels = 16777216; // size.longest_edge
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f}, std{0.5f, 0.5f, 0.5f};
};

// Target (height, width): multiples of patch_size * merge_size with about the original aspect
// ratio and a pixel count in [min_pixels, max_pixels], rounded exactly as transformers v5 does
// (round half to even; the downscale branch keeps at least one factor per side, so that side's
// floor may exceed max_pixels for extreme aspect ratios). Throws ImageError(bad_size) for a zero
// side, an aspect ratio above 200 (the processor raises), or a zero result (min_pixels 0).
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width,
                                         const ImageProcessorConfig& cfg);

// Bicubic resize with antialiasing, as torchvision resize(BICUBIC, antialias=True) on a uint8
// image: Keys cubic a = -0.5 with support widened by the downscale factor, horizontal pass then
// vertical pass, each with int16 weights and a rounded uint8 result. Same size: a copy.
Image resize_bicubic(const Image& img, int64_t height, int64_t width);

struct ProcessedImage {
  // [num_patches, patch_dim] row-major; patch_dim = 3 · temporal_patch_size · patch_size².
  std::vector<float> pixel_values;
  int64_t num_patches = 0, patch_dim = 0;
  std::array<int64_t, 3> grid_thw{}; // (1, h / patch_size, w / patch_size)
  int64_t merge_size = 2;
  // Number of <|image_pad|> tokens: t · h · w / merge_size².
  int64_t num_tokens() const {
    return grid_thw[0] * grid_thw[1] * grid_thw[2] / (merge_size * merge_size);
  }
};

// The whole processor on one decoded image. Throws ImageError(bad_size) as smart_resize does;
// an invalid config is a vlm::Error. With `append_to`, the pixel values are appended there
// instead of to the result's own vector (the loader writes a row's images straight into the
// row: one image is ~10–20 MB of floats, and a copy plus a fresh allocation cost more than
// the preprocessing itself).
ProcessedImage preprocess_image(const Image& img, const ImageProcessorConfig& cfg,
                                std::vector<float>* append_to = nullptr);

} // namespace vlm::io
