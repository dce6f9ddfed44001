// Caption accuracy of a VLM on the demo dataset's held-out images (`vlmtrain data make-demo`):
// does the model name what is in the picture? For each image sample of the split (caption or
// conversation), the model gets the caption prompt of training — a user turn holding only the
// image, then "<|im_start|>assistant\n" — and generates greedily until <|im_end|>. The first
// "<colour> <shape>" the generated caption names is right when the image holds a shape of that
// colour and kind (the truth is the sample's own caption: every shape drawn). Of 8 colours and 4
// shapes a guess names a present pair with probability (shapes in the image) / 32 <= 3/32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/image/preprocess.h"
#include "io/text/tokenizer.h"
#include "model/causal_lm.h"

namespace vlm::demo {

struct CaptionExample {
  std::string truth, generated;
  bool correct = false;
};

struct CaptionAccuracy {
  int64_t images = 0;
  int64_t correct = 0;                  // the first named (colour, shape) is in the image
  int64_t colour_correct = 0;           // its colour is one of the image's colours
  int64_t shape_correct = 0;            // its shape is one of the image's shapes
  int64_t skipped = 0;                  // samples the loader would skip (bad tar, chat, image)
  std::string first_skip;               // why the first of them was skipped
  std::vector<CaptionExample> examples; // the first few, for the log
  double accuracy() const { return images ? double(correct) / double(images) : 0.0; }
};

// The (colour, shape) pairs a demo caption names, in order: "A red circle and a blue square."
// gives {"red circle", "blue square"}.
std::vector<std::string> demo_caption_pairs(const std::string& text);

// Runs the first max_images image samples of `split` of the Energon dataset at `dataset`
// through the model (on `device`), images preprocessed with `image`. A sample the loader would
// skip (io::SampleError, io::ChatFormatError, io::ImageError) is skipped and counted here too.
// Progress is logged.
CaptionAccuracy evaluate_demo_captions(const model::CausalLM& model, const io::Tokenizer& tokenizer,
                                       const std::string& dataset, const std::string& split,
                                       const io::ImageProcessorConfig& image, int64_t max_images,
                                       Device device);

} // namespace vlm::demo
