// The built-in demo dataset (`vlmtrain data make-demo OUT`): small PNG images of coloured shapes
// on plain backgrounds, each with a caption (txt) or a conversation about it (json), and some
// text-only samples — a CrudeWebdataset with train and val splits, written by
// io/energon/writer.h; val holds captioned images only (the held-out set of the caption
// accuracy). The mix is explained in src/demo/demo_dataset.cpp. Everything follows from the seed.
//
// The dataset carries the tokenizer it is meant to be tokenized with, OUT/tokenizer.json (so the
// demo needs no real Qwen3 tokenizer): a byte-level BPE of the Qwen kind trained on all its texts
// (io/text/bpe_trainer.h) with at most kDemoVocabSize ids, the special tokens of the chat format
// and packing last. It is written with the rest, before the folder is renamed into place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm::demo {

struct DemoDatasetOptions {
  int64_t train_samples = 4000;
  int64_t val_samples = 200;
  int64_t samples_per_shard = 250;
  uint64_t seed = 0;
};

// The demo tokenizer's size limit (the demo model's vocabulary) and its special tokens, in id
// order: <|endoftext|>, <|im_start|>, <|im_end|>, <|vision_start|>, <|vision_end|>,
// <|image_pad|>, <|video_pad|>.
constexpr int64_t kDemoVocabSize = 512;
const std::vector<std::string>& demo_special_tokens();

// Writes the dataset and its tokenizer.json to `root`, which must not exist yet; `root` is then
// either absent or complete.
void make_demo_dataset(const std::string& root, const DemoDatasetOptions& options = {});

} // namespace vlm::demo
