#include "src/train/batches.h"

#include "src/base/check.h"

namespace vlm::train {

model::Batch batch_from_rows(const std::vector<io::PackedRow>& rows) {
  VLM_CHECK(!rows.empty(), "batch_from_rows: no rows");
  std::vector<int32_t> ids, targets;
  std::vector<int64_t> positions;
  std::vector<int32_t> cu{0};
  for (const io::PackedRow& r : rows) {
    const int32_t offset = cu.back();
    VLM_CHECK(r.position_ids.size() == r.input_ids.size(), "batch_from_rows: a row has ",
              r.position_ids.size(), " position ids for ", r.input_ids.size(),
              " tokens (MRoPE rows are for VLMs)");
    ids.insert(ids.end(), r.input_ids.begin(), r.input_ids.end());
    const std::vector<int32_t> t = io::next_token_targets(r.labels);
    targets.insert(targets.end(), t.begin(), t.end());
    positions.insert(positions.end(), r.position_ids.begin(), r.position_ids.end());
    for (size_t d = 1; d < r.cu_seqlens.size(); d++) cu.push_back(offset + r.cu_seqlens[d]);
  }
  const int64_t T = int64_t(ids.size());
  model::Batch b;
  b.input_ids = Tensor::from_vector(ids, {T});
  b.targets = Tensor::from_vector(targets, {T});
  b.position_ids = Tensor::from_vector(positions, {T});
  b.cu_seqlens = Tensor::from_vector(cu, {int64_t(cu.size())});
  return b;
}

io::LoaderConfig text_loader_config(const TrainConfig& config, const io::Tokenizer& tokenizer,
                                    const std::string& tokenizer_path, const std::string& split,
                                    bool training) {
  const DataOptions& d = config.data;
  io::LoaderConfig c;
  c.dataset = d.data_path;
  c.split = split;
  c.training = training;
  c.epochs = training ? d.epochs : 1;
  c.packing.seq_len = d.seq_len;
  c.packing.buffer_size = d.packing_buffer_size;
  c.packing.overlong = d.overlong_policy;
  c.packing.mrope = false;
  io::set_token_ids(c.packing, tokenizer);
  c.packing_plan = training ? d.packing_plan : "";
  c.tokenizer = tokenizer_path;
  c.image.min_pixels = d.min_pixels;
  c.image.max_pixels = d.max_pixels;
  c.chat.drop_images = true;
  c.num_workers = d.num_workers;
  c.seed = uint64_t(config.training.seed);
  c.shuffle_buffer_size = d.shuffle_buffer_size;
  c.max_samples_per_sequence = d.max_samples_per_sequence;
  c.validate();
  return c;
}

} // namespace vlm::train
