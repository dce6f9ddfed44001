// The built-in demo dataset (`vlmtrain data make-demo OUT`): small PNG images of coloured shapes
// on plain backgrounds, each with a caption (txt), a conversation about it (json), or, for some
// samples, text only — a CrudeWebdataset with train and val splits, written by
// io/energon_writer.h. Everything follows from the seed.
#pragma once

#include <cstdint>
#include <string>

namespace vlm::io {

struct DemoDatasetOptions {
  int64_t train_samples = 2000;
  int64_t val_samples = 200;
  int64_t samples_per_shard = 250;
  uint64_t seed = 0;
};

void make_demo_dataset(const std::string& root, const DemoDatasetOptions& options = {});

} // namespace vlm::io
