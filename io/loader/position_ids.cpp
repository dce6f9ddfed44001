#include "io/loader/position_ids.h"

#include <algorithm>

#include "src/base/check.h"

namespace vlm::io {

int64_t image_tokens(const GridTHW& grid, int64_t spatial_merge_size) {
  return grid[0] * (grid[1] / spatial_merge_size) * (grid[2] / spatial_merge_size);
}

std::string find_image_runs(std::span<const int32_t> input_ids, std::span<const GridTHW> grids,
                            int32_t image_token_id, int64_t spatial_merge_size,
                            std::vector<ImageRun>& runs) {
  runs.clear();
  const int64_t m = spatial_merge_size;
  for (size_t i = 0; i < grids.size(); i++) {
    const GridTHW& g = grids[i];
    if (g[0] < 1 || g[1] < 1 || g[2] < 1 || g[1] % m != 0 || g[2] % m != 0)
      return detail::str_cat("image_grid_thw[", i, "] = (", g[0], ", ", g[1], ", ", g[2],
                             ") is not a valid grid (t, h, w >= 1, h and w multiples of the merge "
                             "size ",
                             m, ")");
  }
  const int64_t n = int64_t(input_ids.size());
  for (int64_t i = 0; i < n;) {
    if (input_ids[size_t(i)] != image_token_id) {
      i++;
      continue;
    }
    int64_t end = i;
    while (end < n && input_ids[size_t(end)] == image_token_id) end++;
    size_t k = runs.size();
    if (k >= grids.size())
      return detail::str_cat("image placeholder run ", k, " at token ", i, " (", end - i,
                             " tokens) has no image_grid_thw entry (", grids.size(),
                             " grids for this sample)");
    int64_t want = image_tokens(grids[k], m);
    if (end - i != want)
      return detail::str_cat("image placeholder run ", k, " at token ", i, " has ", end - i,
                             " tokens but image_grid_thw[", k, "] = (", grids[k][0], ", ",
                             grids[k][1], ", ", grids[k][2], ") needs ", want);
    runs.push_back({i, end});
    i = end;
  }
  if (runs.size() != grids.size())
    return detail::str_cat("sample has ", grids.size(), " image_grid_thw entries but ", runs.size(),
                           " image placeholder runs");
  return "";
}

void text_position_ids(int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; i++) out[i] = i;
}

int64_t mrope_position_ids(std::span<const int32_t> input_ids, std::span<const GridTHW> grids,
                           int32_t image_token_id, int64_t spatial_merge_size, int64_t* t,
                           int64_t* h, int64_t* w) {
  std::vector<ImageRun> runs;
  std::string why = find_image_runs(input_ids, grids, image_token_id, spatial_merge_size, runs);
  VLM_CHECK(why.empty(), "mrope_position_ids: ", why);
  const int64_t n = int64_t(input_ids.size()), m = spatial_merge_size;
  int64_t cur = 0, pos = 0;
  auto text_until = [&](int64_t stop) {
    for (; pos < stop; pos++, cur++) t[pos] = h[pos] = w[pos] = cur;
  };
  for (size_t k = 0; k < runs.size(); k++) {
    text_until(runs[k].begin);
    const int64_t gt = grids[k][0], gh = grids[k][1] / m, gw = grids[k][2] / m;
    for (int64_t it = 0; it < gt; it++)
      for (int64_t ih = 0; ih < gh; ih++)
        for (int64_t iw = 0; iw < gw; iw++, pos++) {
          t[pos] = cur + it;
          h[pos] = cur + ih;
          w[pos] = cur + iw;
        }
    cur += std::max(gh, gw);
  }
  text_until(n);
  return cur;
}

} // namespace vlm::io
