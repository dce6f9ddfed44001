// Position ids of one document, for RoPE (text) and MRoPE (Qwen3-VL / Qwen3.5), exactly as
// transformers' get_rope_index computes them for a single unpadded document
// (docs/qwen-models.md §2.3). The packer calls these once per document of a packed row, so
// positions restart at 0 for every document (§3.7); tests/data/position_ids/golden.json holds
// transformers' own output for the check.
//
// MRoPE walks the document in maximal runs of image-placeholder tokens and everything else:
//   * a text run of n tokens (<|vision_start|>/<|vision_end|> are text) gets cur … cur+n-1 on
//     all three axes (t, h, w); cur += n;
//   * an image of grid (gt, gh, gw) patches covers gt·(gh/m)·(gw/m) placeholder tokens (m =
//     spatial_merge_size) in raster order (t outer, then h, then w); token (it, ih, iw) gets
//     (cur + it, cur + ih, cur + iw); afterwards cur += max(gh, gw) / m.
// Images only: the data pipeline has no video (HF splits a video into t=1 grids, each then
// treated as an image).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace vlm::io {

using GridTHW = std::array<int64_t, 3>; // (t, h, w) in patches, as HF image_grid_thw

// Placeholder tokens of one image: [begin, end) in the document.
struct ImageRun {
  int64_t begin = 0, end = 0;
};

// Tokens an image of `grid` occupies in the LLM sequence: t·(h/m)·(w/m).
int64_t image_tokens(const GridTHW& grid, int64_t spatial_merge_size);

// Finds the image placeholder runs of a document and checks them against its grids: every
// maximal run of image_token_id must be exactly one image, the i-th run holding image_tokens of
// grids[i] tokens, and there must be as many runs as grids; h and w must be multiples of
// spatial_merge_size and t, h, w >= 1. (Adjacent images with no text between them would form one
// run: transformers cannot split those either, and the Qwen chat template always wraps an image
// in <|vision_start|> … <|vision_end|>.) Returns "" and fills `runs`, or says what is wrong.
std::string find_image_runs(std::span<const int32_t> input_ids, std::span<const GridTHW> grids,
                            int32_t image_token_id, int64_t spatial_merge_size,
                            std::vector<ImageRun>& runs);

// 1-D positions 0 … n-1 into out[0 … n-1].
void text_position_ids(int64_t n, int64_t* out);

// MRoPE positions of one document into the three planes t[0 … L-1], h[…], w[…] (L =
// input_ids.size()). Throws vlm::Error when find_image_runs rejects the document. Returns cur at
// the end: the position a following text token would get.
int64_t mrope_position_ids(std::span<const int32_t> input_ids, std::span<const GridTHW> grids,
                           int32_t image_token_id, int64_t spatial_merge_size, int64_t* t,
                           int64_t* h, int64_t* w);

} // namespace vlm::io
