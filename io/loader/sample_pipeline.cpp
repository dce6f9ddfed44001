#include "io/loader/sample_pipeline.h"

#include <sstream>

#include <nlohmann/json.hpp>

#include "io/energon/sampler.h"
#include "io/text/unicode.h"
#include "src/base/check.h"

namespace vlm::io {

// ---- SkipReport ----

int64_t SkipReport::total() const {
  int64_t n = 0;
  for (const auto& [reason, count] : counts) n += count;
  return n;
}

void SkipReport::add(SkipExample example) {
  // Names and messages come from the data (keys, shard names, sample text): kept as valid UTF-8,
  // so the report prints cleanly and a checkpoint's loader state (JSON) always serializes.
  for (std::string* s :
       {&example.reason, &example.dataset, &example.shard, &example.key, &example.message})
    if (unicode::utf8_find_invalid(*s) != std::string::npos) *s = unicode::utf8_lossy(*s);
  counts[example.reason]++;
  // A sample met again (the next epoch) is counted again but shown once.
  for (const SkipExample& e : examples)
    if (e.sample_id == example.sample_id && e.reason == example.reason &&
        e.dataset == example.dataset)
      return;
  if (examples.size() < max_examples) examples.push_back(std::move(example));
}

void SkipReport::merge(const SkipReport& other) {
  for (const auto& [reason, count] : other.counts) counts[reason] += count;
  excluded += other.excluded;
  for (const SkipExample& e : other.examples)
    if (examples.size() < max_examples) examples.push_back(e);
}

std::string SkipReport::summary() const {
  if (counts.empty() && excluded == 0) return "";
  std::ostringstream os;
  os << total() << " samples skipped";
  if (excluded > 0) os << " (plus " << excluded << " excluded by split.yaml)";
  os << "\n";
  for (const auto& [reason, count] : counts) os << "  " << reason << ": " << count << "\n";
  if (!examples.empty()) os << "first skipped samples:\n";
  for (const SkipExample& e : examples)
    os << "  [" << e.reason << "] " << e.dataset << " " << e.shard << " key '" << e.key
       << "' (sample id " << e.sample_id << "): " << e.message << "\n";
  return os.str();
}

nlohmann::json SkipReport::to_json() const {
  nlohmann::json ex = nlohmann::json::array();
  for (const SkipExample& e : examples)
    ex.push_back({{"reason", e.reason},
                  {"dataset", e.dataset},
                  {"shard", e.shard},
                  {"key", e.key},
                  {"sample_id", e.sample_id},
                  {"message", e.message}});
  return {
      {"counts", counts}, {"excluded", excluded}, {"examples", ex}, {"max_examples", max_examples}};
}

SkipReport SkipReport::from_json(const nlohmann::json& j) {
  try {
    SkipReport r;
    r.counts = j.at("counts").get<std::map<std::string, int64_t>>();
    r.excluded = j.at("excluded").get<int64_t>();
    r.max_examples = j.at("max_examples").get<size_t>();
    for (const auto& e : j.at("examples"))
      r.examples.push_back({e.at("reason").get<std::string>(), e.at("dataset").get<std::string>(),
                            e.at("shard").get<std::string>(), e.at("key").get<std::string>(),
                            e.at("sample_id").get<int64_t>(), e.at("message").get<std::string>()});
    return r;
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL("skip report: malformed JSON document: ", e.what());
  }
}

std::string sample_skip_reason(const std::exception& e) {
  if (const auto* r = dynamic_cast<const SampleError*>(&e))
    return std::string("read:") + sample_error_reason_name(r->reason);
  if (const auto* c = dynamic_cast<const ChatFormatError*>(&e)) return "chat:" + c->reason();
  if (const auto* i = dynamic_cast<const ImageError*>(&e))
    return std::string("image:") + image_error_kind_name(i->kind());
  return "";
}

// ---- SamplePipeline ----

namespace {

// A text-only sample (chat.drop_images): the images are removed from the conversation.
void drop_images(ChatSample& chat) {
  for (Message& m : chat.messages)
    std::erase_if(m.content, [](const ContentItem& c) { return c.is_image; });
  chat.image_parts.clear();
}

// The grid of an encoded image, which decides its number of image tokens. With `pixels`, its
// preprocessed pixels are appended there; without, only the grid is computed (what
// preprocess_image would give), after a full decode so that a corrupt image is caught now.
// Throws ImageError.
GridTHW image_grid(const std::string& bytes, const std::string& part,
                   const ImageProcessorConfig& ic, std::vector<float>* pixels) {
  Image img = decode_image(bytes, part);
  if (pixels) {
    ProcessedImage p = preprocess_image(img, ic);
    pixels->insert(pixels->end(), p.pixel_values.begin(), p.pixel_values.end());
    return p.grid_thw;
  }
  auto [h, w] = smart_resize(img.height, img.width, ic);
  return {1, h / ic.patch_size, w / ic.patch_size};
}

} // namespace

SamplePipeline::SamplePipeline(std::vector<PipelineSource> sources, Tokenizer tokenizer,
                               SamplePipelineConfig cfg)
    : sources_(std::move(sources)), tokenizer_(std::move(tokenizer)), cfg_(std::move(cfg)) {
  VLM_CHECK(!sources_.empty(), "sample pipeline: no sources");
  for (const PipelineSource& s : sources_) {
    VLM_CHECK(s.dataset, "sample pipeline: a source has no dataset");
    const EnergonDataset::Split& split = s.dataset->split(s.split); // throws for an unknown one
    VLM_CHECK(split.num_samples > 0, "dataset '", s.dataset->root(), "' split '", s.split,
              "' is empty: ",
              split.excluded_shards ? "no shards left after excluding " +
                                          std::to_string(split.excluded_shards) + " in 'exclude'"
              : split.shards.empty() ? std::string("no shards listed")
                                     : std::string("its shards hold no samples"));
    splits_.push_back(&split);
  }
}

std::optional<PipelineSample> SamplePipeline::process(int64_t sample_id, SkipReport* report,
                                                      bool with_pixels) const {
  const int64_t src = sample_id_source(sample_id), index = sample_id_index(sample_id);
  VLM_CHECK(sample_id >= 0 && size_t(src) < sources_.size(), "sample pipeline: sample id ",
            sample_id, " names source ", src, " of ", sources_.size());
  const PipelineSource& source = sources_[size_t(src)];
  auto skip = [&](std::string reason, std::string shard, std::string key,
                  std::string message) -> std::optional<PipelineSample> {
    if (report)
      report->add({std::move(reason), source.dataset->root(), std::move(shard), std::move(key),
                   sample_id, std::move(message)});
    return std::nullopt;
  };

  RawSample raw;
  try {
    raw = source.dataset->read_sample(*splits_[size_t(src)], index);
  } catch (const SampleError& e) {
    return skip(sample_skip_reason(e), e.shard, e.key, e.what());
  }
  if (raw.excluded) {
    if (report) report->excluded++;
    return std::nullopt;
  }
  if (!source.subflavors.empty()) raw.subflavors = source.subflavors;

  ChatSample chat;
  try {
    chat = parse_chat_sample(raw);
  } catch (const ChatFormatError& e) {
    return skip(sample_skip_reason(e), raw.shard, raw.key, e.what());
  }
  if (cfg_.chat.drop_images) drop_images(chat);

  PipelineSample out;
  TokenizedSample& t = out.tokens;
  t.global_index = sample_id;
  const ImageProcessorConfig& ic = cfg_.image;
  const int64_t merge2 = ic.merge_size * ic.merge_size;
  std::vector<int64_t> image_tokens;
  for (const std::string& part : chat.image_parts) {
    std::string& bytes = raw.parts.at(part);
    GridTHW grid{};
    try {
      grid = image_grid(bytes, part, ic, with_pixels ? &t.pixel_values : nullptr);
    } catch (const ImageError& e) {
      return skip(sample_skip_reason(e), raw.shard, raw.key,
                  "image part '" + part + "': " + e.what());
    }
    t.image_grid_thw.push_back(grid);
    t.num_patches += grid[0] * grid[1] * grid[2];
    t.patch_dim = 3 * ic.temporal_patch_size * ic.patch_size * ic.patch_size;
    image_tokens.push_back(grid[0] * grid[1] * grid[2] / merge2);
    out.images.push_back(std::move(bytes));
  }

  try {
    TokenizedChat tc = tokenize_chat(chat, tokenizer_, image_tokens, cfg_.chat);
    t.input_ids = std::move(tc.input_ids);
    t.labels = std::move(tc.labels);
  } catch (const ChatFormatError& e) {
    return skip(sample_skip_reason(e), raw.shard, raw.key, e.what());
  } catch (const vlm::Error& e) { // e.g. more image tokens than the tokenizer can count
    return skip("tokenize:error", raw.shard, raw.key, e.what());
  }
  out.shard = std::move(raw.shard);
  out.key = std::move(raw.key);
  return out;
}

ProcessedImage SamplePipeline::image_pixels(const std::string& bytes,
                                            std::vector<float>* append_to) const {
  return preprocess_image(decode_image(bytes, ""), cfg_.image, append_to);
}

void SamplePipeline::begin_fill(PackedRow& row) const {
  VLM_CHECK(row.pixel_values.empty(), "fill_row_pixels: the row already has pixel values");
  VLM_CHECK(row.sample_indices.size() == row.doc_num_images.size(),
            "fill_row_pixels: sample_indices and doc_num_images differ in length");
  row.pixel_values.reserve(size_t(row.num_patches * row.patch_dim));
}

void SamplePipeline::append_image(PackedRow& row, size_t image, int64_t sample_id,
                                  const std::vector<std::string>& images, size_t i) const {
  VLM_CHECK(i < images.size(), "fill_row_pixels: sample id ", sample_id, " has ", images.size(),
            " images, the row keeps ", i + 1);
  VLM_CHECK(image < row.image_grid_thw.size(), "fill_row_pixels: the row lists ",
            row.image_grid_thw.size(), " image grids, sample id ", sample_id, " needs more");
  ProcessedImage p;
  try {
    p = image_pixels(images[i], &row.pixel_values);
  } catch (const ImageError& e) { // it decoded in process(): the bytes must have changed
    VLM_FAIL("fill_row_pixels: image ", i, " of sample id ", sample_id,
             " no longer decodes: ", e.what());
  }
  VLM_CHECK(p.grid_thw == row.image_grid_thw[image] && p.patch_dim == row.patch_dim,
            "fill_row_pixels: image ", i, " of sample id ", sample_id, " preprocesses to grid (",
            p.grid_thw[0], ", ", p.grid_thw[1], ", ", p.grid_thw[2], ") but the row expects (",
            row.image_grid_thw[image][0], ", ", row.image_grid_thw[image][1], ", ",
            row.image_grid_thw[image][2], ")");
}

void SamplePipeline::end_fill(const PackedRow& row, size_t images) const {
  VLM_CHECK(images == row.image_grid_thw.size(), "fill_row_pixels: filled ", images, " images for ",
            row.image_grid_thw.size(), " grids");
  VLM_CHECK(int64_t(row.pixel_values.size()) == row.num_patches * row.patch_dim,
            "fill_row_pixels: ", row.pixel_values.size(), " pixel values for ", row.num_patches,
            " patches of ", row.patch_dim);
}

} // namespace vlm::io
