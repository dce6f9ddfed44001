#include "src/train/batches.h"

#include <algorithm>

#include "src/base/check.h"

namespace vlm::train {

model::Batch batch_from_rows(const std::vector<io::PackedRow>& rows) {
  VLM_CHECK(!rows.empty(), "batch_from_rows: no rows");
  int64_t T = 0;
  for (const io::PackedRow& r : rows) T += int64_t(r.input_ids.size());
  const bool mrope = rows[0].position_ids.size() == 3 * rows[0].input_ids.size();
  const int64_t planes = mrope ? 3 : 1;
  std::vector<int32_t> ids, targets;
  std::vector<int64_t> positions(size_t(planes * T));
  std::vector<int32_t> cu{0};
  std::vector<float> pixels;
  std::vector<int64_t> grids;
  int64_t patch_dim = 0;
  for (const io::PackedRow& r : rows) {
    const int64_t offset = cu.back(), n = int64_t(r.input_ids.size());
    VLM_CHECK(int64_t(r.position_ids.size()) == planes * n, "batch_from_rows: a row has ",
              r.position_ids.size(), " position ids for ", n, " tokens, the first row ", planes,
              " per token (MRoPE and 1-D rows do not mix)");
    ids.insert(ids.end(), r.input_ids.begin(), r.input_ids.end());
    const std::vector<int32_t> t = io::next_token_targets(r.labels);
    targets.insert(targets.end(), t.begin(), t.end());
    for (int64_t p = 0; p < planes; p++) // plane p of the row goes to plane p of the batch
      std::copy(r.position_ids.begin() + p * n, r.position_ids.begin() + (p + 1) * n,
                positions.begin() + p * T + offset);
    for (size_t d = 1; d < r.cu_seqlens.size(); d++)
      cu.push_back(int32_t(offset) + r.cu_seqlens[d]);
    if (r.image_grid_thw.empty()) continue;
    VLM_CHECK(int64_t(r.pixel_values.size()) == r.num_patches * r.patch_dim &&
                  (patch_dim == 0 || r.patch_dim == patch_dim),
              "batch_from_rows: a row has ", r.pixel_values.size(), " pixel values for ",
              r.num_patches, " patches of ", r.patch_dim, " (other rows: ", patch_dim, ")");
    patch_dim = r.patch_dim;
    pixels.insert(pixels.end(), r.pixel_values.begin(), r.pixel_values.end());
    for (const auto& g : r.image_grid_thw) grids.insert(grids.end(), g.begin(), g.end());
  }
  model::Batch b;
  b.input_ids = Tensor::from_vector(ids, {T});
  b.targets = Tensor::from_vector(targets, {T});
  b.position_ids =
      mrope ? Tensor::from_vector(positions, {3, T}) : Tensor::from_vector(positions, {T});
  b.cu_seqlens = Tensor::from_vector(cu, {int64_t(cu.size())});
  if (!grids.empty()) {
    b.pixel_values = Tensor::from_vector(pixels, {int64_t(pixels.size()) / patch_dim, patch_dim});
    b.image_grid_thw = Tensor::from_vector(grids, {int64_t(grids.size()) / 3, 3});
  }
  return b;
}

model::Batch shape_batch(const TrainConfig& config, bool mrope) {
  const int64_t L = config.data.seq_len;
  io::PackedRow row;
  row.input_ids.assign(size_t(L), 0);
  row.labels.assign(size_t(L), -100);
  row.cu_seqlens = {0, int32_t(L)};
  for (int64_t plane = 0; plane < (mrope ? 3 : 1); plane++)
    for (int64_t t = 0; t < L; t++) row.position_ids.push_back(t);
  row.num_docs = 1;
  row.real_tokens = L;
  return batch_from_rows(std::vector<io::PackedRow>(size_t(config.training.micro_batch_rows), row));
}

io::LoaderConfig loader_config(const TrainConfig& config, const io::Tokenizer& tokenizer,
                               const std::string& tokenizer_path, const std::string& split,
                               bool training, bool vision) {
  const DataOptions& d = config.data;
  io::LoaderConfig c;
  c.dataset = d.data_path;
  c.split = split;
  c.training = training;
  c.epochs = training ? d.epochs : 1;
  c.packing.seq_len = d.seq_len;
  c.packing.buffer_size = d.packing_buffer_size;
  c.packing.overlong = d.overlong_policy;
  c.packing.mrope = vision;
  io::set_token_ids(c.packing, tokenizer);
  c.packing_plan = training ? d.packing_plan : "";
  c.tokenizer = tokenizer_path;
  c.image.min_pixels = d.min_pixels;
  c.image.max_pixels = d.max_pixels;
  c.chat.drop_images = !vision;
  c.num_workers = d.num_workers;
  c.seed = uint64_t(config.training.seed);
  c.shuffle_buffer_size = d.shuffle_buffer_size;
  c.max_samples_per_sequence = d.max_samples_per_sequence;
  c.validate();
  return c;
}

} // namespace vlm::train
