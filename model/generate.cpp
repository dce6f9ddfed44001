#include "model/generate.h"

#include <algorithm>

#include "model/kv_cache.h"
#include "model/lm_loss.h"
#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

std::vector<int32_t> greedy_generate(const model::CausalLM& m, const GenerateInput& in,
                                     int64_t max_new_tokens, const std::vector<int32_t>& stop_ids,
                                     Device device) {
  VLM_CHECK(!in.prompt.empty(), "generate: the prompt is empty");
  VLM_CHECK(in.grids.empty() || m.has_vision(), "generate: the prompt has ", in.grids.size(),
            " images but the model has no vision tower");
  NoGradGuard no_grad;
  std::vector<int32_t> ids = in.prompt, out;
  // Positions of the whole sequence, computed on the host as the loader does; a step feeds the
  // columns of its new tokens.
  auto positions = [&](int64_t from) {
    const int64_t T = int64_t(ids.size()), n = T - from;
    if (!m.has_vision()) {
      std::vector<int64_t> pos(static_cast<size_t>(T));
      io::text_position_ids(T, pos.data());
      return Tensor::from_vector(std::vector<int64_t>(pos.begin() + from, pos.end()), {n}, device);
    }
    std::vector<int64_t> all(size_t(3 * T)), cols;
    io::mrope_position_ids(ids, in.grids, in.image_token_id, in.spatial_merge_size, all.data(),
                           all.data() + T, all.data() + 2 * T);
    for (int64_t plane = 0; plane < 3; plane++)
      cols.insert(cols.end(), all.begin() + plane * T + from, all.begin() + (plane + 1) * T);
    return Tensor::from_vector(cols, {3, n}, device);
  };

  model::KVCache cache;
  model::Batch b;
  b.kv_cache = &cache;
  if (!in.grids.empty()) { // the images go in with the prompt (the prefill)
    std::vector<int64_t> grid_flat;
    for (const auto& g : in.grids) grid_flat.insert(grid_flat.end(), g.begin(), g.end());
    b.pixel_values = Tensor::from_vector(
        in.pixel_values, {int64_t(in.pixel_values.size()) / in.patch_dim, in.patch_dim}, device);
    b.image_grid_thw = Tensor::from_vector(grid_flat, {int64_t(in.grids.size()), 3}, device);
  }
  int64_t fed = 0; // tokens already in the cache
  for (int64_t step = 0; step < max_new_tokens; step++) {
    const int64_t T = int64_t(ids.size()), n = T - fed;
    b.input_ids =
        Tensor::from_vector(std::vector<int32_t>(ids.begin() + fed, ids.end()), {n}, device);
    b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, int32_t(n)}, {2});
    b.position_ids = positions(fed);
    const Tensor last = slice(model::lm_logits(m, b), 0, n - 1, n);
    b.pixel_values = b.image_grid_thw = Tensor();
    fed = T;
    const std::vector<double> row = last.to_doubles(); // the host picks the argmax
    const auto end = in.vocab_limit > 0 && in.vocab_limit < int64_t(row.size())
                         ? row.begin() + in.vocab_limit
                         : row.end();
    const int32_t next = int32_t(std::max_element(row.begin(), end) - row.begin());
    out.push_back(next);
    ids.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
  }
  return out;
}

} // namespace vlm::model
