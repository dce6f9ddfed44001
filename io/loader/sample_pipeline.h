// One sample id -> a tokenized document ready for packing:
//   EnergonDataset::read_sample -> parse_chat_sample -> decode_image + smart_resize per image
//   -> tokenize_chat (image token counts from the grids) -> TokenizedSample.
// Pixels are computed only when asked (with_pixels), or later for the samples a packed row
// actually holds (fill_row_pixels): a packing buffer of 1000 samples with pixels would hold
// gigabytes, their token ids hold kilobytes. Images are decoded in the first pass anyway, so a
// corrupt image is skipped before its sample can reach a row.
//
// Bad samples are skipped, not fatal: SampleError (tar / index damage), ChatFormatError (bad
// JSON, empty conversation, ...), ImageError (corrupt, truncated, unsupported, bad size) and
// text the tokenizer refuses (invalid UTF-8) are counted in a SkipReport by "<stage>:<reason>"
// ("read:truncated", "chat:invalid_json", "image:corrupt", "tokenize:error"), and the first few
// are kept with dataset, shard, key and message. Samples excluded by split.yaml are counted
// apart (they are not errors). Anything else (an unreadable file, an index out of range) is a
// vlm::Error: the dataset itself is broken.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/energon/dataset.h"
#include "io/image/preprocess.h"
#include "io/loader/packing.h"
#include "io/text/chat_format.h"
#include "io/text/tokenizer.h"

namespace vlm::io {

struct SkipExample {
  std::string reason;  // "<stage>:<reason>"
  std::string dataset; // dataset root
  std::string shard;   // relative to the root ("" when unknown)
  std::string key;     // sample key ("" when unknown)
  int64_t sample_id = -1;
  std::string message;
};

// Skipped samples by reason, plus the first few in detail.
struct SkipReport {
  std::map<std::string, int64_t> counts; // "<stage>:<reason>" -> samples
  int64_t excluded = 0;                  // excluded by split.yaml (not errors)
  std::vector<SkipExample> examples;     // the first ones, in the order they were met
  size_t max_examples = 8;

  int64_t total() const; // all skipped samples (excluded ones not included)
  void add(SkipExample example);
  void merge(const SkipReport& other); // counts add up; examples appended up to max_examples
  std::string summary() const;         // one line per reason, then the examples; "" when nothing
  nlohmann::json to_json() const;
  static SkipReport from_json(const nlohmann::json& j);
};

// The skip reason ("<stage>:<reason>") of an error that is about one sample: SampleError
// ("read:..."), ChatFormatError ("chat:..."), ImageError ("image:..."); "" for any other error
// (the dataset itself is broken). The one rule `data inspect`, `data pack` and training share.
std::string sample_skip_reason(const std::exception& e);

// One source of samples: a split of an opened dataset; sample ids with source s refer to it
// (io/energon/sampler.h make_sample_id).
struct PipelineSource {
  std::shared_ptr<const EnergonDataset> dataset;
  std::string split;
  // Replaces the subflavors read_sample reports (a metadataset's merged subflavors); empty:
  // keep the dataset's own.
  std::map<std::string, std::string> subflavors;
};

struct SamplePipelineConfig {
  ImageProcessorConfig image;
  ChatFormatOptions chat;
};

// A sample that made it through the pipeline.
struct PipelineSample {
  TokenizedSample tokens; // global_index = the sample id; pixels only when asked for
  std::string shard, key;
  // The encoded images in order of use (ChatSample::image_parts), for fill_row_pixels.
  std::vector<std::string> images;
};

class SamplePipeline {
public:
  SamplePipeline(std::vector<PipelineSource> sources, Tokenizer tokenizer,
                 SamplePipelineConfig cfg);

  // The sample's document, or nullopt when it is skipped (counted in *report, which may be null).
  // Thread-safe.
  std::optional<PipelineSample> process(int64_t sample_id, SkipReport* report,
                                        bool with_pixels = false) const;

  // Preprocessed pixels of one encoded image (the same bytes process() accepted); appended to
  // *append_to instead of the result's vector when given.
  ProcessedImage image_pixels(const std::string& bytes,
                              std::vector<float>* append_to = nullptr) const;

  // Fills a row packed from deferred samples: for each document d, the first doc_num_images[d]
  // images of images_of(row.sample_indices[d]), preprocessed and concatenated. Checks that the
  // grids match the row's; a mismatch is a vlm::Error.
  template <typename ImagesOf> void fill_row_pixels(PackedRow& row, ImagesOf&& images_of) const {
    begin_fill(row);
    size_t image = 0;
    for (size_t d = 0; d < row.sample_indices.size(); d++) {
      const std::vector<std::string>& imgs = images_of(row.sample_indices[d]);
      for (int32_t i = 0; i < row.doc_num_images[d]; i++)
        append_image(row, image++, row.sample_indices[d], imgs, size_t(i));
    }
    end_fill(row, image);
  }

  const Tokenizer& tokenizer() const { return tokenizer_; }
  const std::vector<PipelineSource>& sources() const { return sources_; }
  const SamplePipelineConfig& config() const { return cfg_; }

private:
  void begin_fill(PackedRow& row) const;
  void append_image(PackedRow& row, size_t image, int64_t sample_id,
                    const std::vector<std::string>& images, size_t i) const;
  void end_fill(const PackedRow& row, size_t images) const;

  std::vector<PipelineSource> sources_;
  std::vector<const EnergonDataset::Split*> splits_;
  Tokenizer tokenizer_;
  SamplePipelineConfig cfg_;
};

} // namespace vlm::io
