#include "src/train/generate.h"

#include <algorithm>

#include "model/lm_loss.h"
#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::train {

std::vector<int32_t> greedy_generate(const model::CausalLM& m, const GenerateInput& in,
                                     int64_t max_new_tokens, const std::vector<int32_t>& stop_ids,
                                     Device device) {
  VLM_CHECK(!in.prompt.empty(), "generate: the prompt is empty");
  VLM_CHECK(in.grids.empty() || m.has_vision(), "generate: the prompt has ", in.grids.size(),
            " images but the model has no vision tower");
  NoGradGuard no_grad;
  std::vector<int32_t> ids = in.prompt, out;
  model::Batch b;
  if (!in.grids.empty()) {
    std::vector<int64_t> grid_flat;
    for (const auto& g : in.grids) grid_flat.insert(grid_flat.end(), g.begin(), g.end());
    b.pixel_values = Tensor::from_vector(
        in.pixel_values, {int64_t(in.pixel_values.size()) / in.patch_dim, in.patch_dim}, device);
    b.image_grid_thw = Tensor::from_vector(grid_flat, {int64_t(in.grids.size()), 3}, device);
  }
  for (int64_t step = 0; step < max_new_tokens; step++) {
    const int64_t T = int64_t(ids.size());
    b.input_ids = Tensor::from_vector(ids, {T}, device);
    b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, int32_t(T)}, {2}, device);
    std::vector<int64_t> pos(size_t(m.has_vision() ? 3 * T : T));
    if (m.has_vision())
      io::mrope_position_ids(ids, in.grids, in.image_token_id, in.spatial_merge_size, pos.data(),
                             pos.data() + T, pos.data() + 2 * T);
    else
      io::text_position_ids(T, pos.data());
    b.position_ids = m.has_vision() ? Tensor::from_vector(pos, {3, T}, device)
                                    : Tensor::from_vector(pos, {T}, device);
    const Tensor last = slice(model::lm_logits(m, b), 0, T - 1, T);
    const std::vector<double> row = last.to_doubles(); // the host picks the argmax
    const int32_t next = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(next);
    ids.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
  }
  return out;
}

} // namespace vlm::train
