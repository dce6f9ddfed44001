#include "src/demo/caption_eval.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <sstream>

#include "io/energon/dataset.h"
#include "io/image/decode.h"
#include "io/text/chat_format.h"
#include "model/generate.h"
#include "src/base/logging.h"

namespace vlm::demo {

namespace {

// The demo dataset's words (src/demo/demo_dataset.cpp).
const std::vector<std::string> kColours = {"red",    "green",  "blue",  "yellow",
                                           "orange", "purple", "black", "white"};
const std::vector<std::string> kShapes = {"circle", "square", "triangle", "diamond"};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The image part of a sample and the caption the model should give: a caption sample's
// assistant turn, or a conversation's first answer (the caption); "" when it has no image.
std::string truth_caption(const io::ChatSample& s) {
  if (s.image_parts.empty()) return "";
  for (const auto& m : s.messages)
    if (m.role == "assistant")
      for (const auto& c : m.content)
        if (!c.is_image) return c.text;
  return "";
}

} // namespace

std::vector<std::string> demo_caption_pairs(const std::string& text) {
  std::string lower;
  for (char ch : text) lower += std::isalpha((unsigned char)ch) ? char(std::tolower(ch)) : ' ';
  std::istringstream words(lower);
  std::vector<std::string> out;
  std::string prev, w;
  while (words >> w) {
    if (contains(kShapes, w) && contains(kColours, prev)) out.push_back(prev + " " + w);
    prev = w;
  }
  return out;
}

namespace {

// Sample i of the split when it is an image sample (its chat and decoded first image), nullopt
// for a text-only or excluded one; what the loader skips is counted in acc and skipped here too.
std::optional<std::pair<io::ChatSample, io::Image>>
read_image_sample(const io::EnergonDataset& ds, const io::EnergonDataset::Split& split, int64_t i,
                  CaptionAccuracy& acc) {
  auto skip = [&](const std::string& why) {
    if (acc.skipped++ == 0) acc.first_skip = why;
    return std::nullopt;
  };
  try {
    const io::RawSample raw = ds.read_sample(split, i);
    if (raw.excluded) return std::nullopt;
    io::ChatSample sample = io::parse_chat_sample(raw);
    if (sample.image_parts.empty()) return std::nullopt; // text-only sample
    const std::string& part = sample.image_parts[0];
    io::Image img = io::decode_image(raw.parts.at(part), part);
    return std::pair(std::move(sample), std::move(img));
  } catch (const io::SampleError& e) {
    return skip(e.what());
  } catch (const io::ChatFormatError& e) {
    return skip(e.what());
  } catch (const io::ImageError& e) {
    return skip(e.what());
  }
}

// The model's greedy caption of one image, prompted as in training: a user turn with the image
// only, then the assistant's header.
std::string generate_caption(const model::CausalLM& m, const io::Tokenizer& tok,
                             const io::ChatSample& sample, const io::Image& img,
                             const io::ImageProcessorConfig& image, Device device) {
  const std::vector<int32_t> stop = {tok.token_to_id("<|im_end|>"),
                                     tok.token_to_id("<|endoftext|>")};
  model::GenerateInput in;
  in.vocab_limit = tok.vocab_size();
  const io::ProcessedImage p = io::preprocess_image(img, image);
  in.pixel_values = p.pixel_values;
  in.patch_dim = p.patch_dim;
  in.grids = {p.grid_thw};
  in.image_token_id = tok.token_to_id("<|image_pad|>");
  in.spatial_merge_size = image.merge_size;
  io::ChatSample prompt;
  prompt.kind = io::SampleKind::caption;
  prompt.image_parts = {sample.image_parts[0]};
  prompt.messages = {{"user", {io::ContentItem{true, "", 0}}}};
  in.prompt = io::tokenize_chat(prompt, tok, {p.num_tokens()}).input_ids;
  in.prompt.push_back(tok.token_to_id("<|im_start|>"));
  for (int32_t id : tok.encode("assistant\n")) in.prompt.push_back(id);
  std::vector<int32_t> gen = model::greedy_generate(m, in, 40, stop, device);
  if (!gen.empty() && (gen.back() == stop[0] || gen.back() == stop[1])) gen.pop_back();
  return tok.decode(gen, true);
}

// One image's verdict into acc: the first colour-shape pair the model names against the truth's.
void score_caption(CaptionExample& ex, const std::vector<std::string>& truth_pairs,
                   CaptionAccuracy& acc) {
  const std::vector<std::string> named = demo_caption_pairs(ex.generated);
  if (!named.empty()) {
    const std::string& first = named[0];
    const std::string colour = first.substr(0, first.find(' ')),
                      shape = first.substr(first.find(' ') + 1);
    ex.correct = contains(truth_pairs, first);
    bool colour_ok = false, shape_ok = false;
    for (const auto& pr : truth_pairs) {
      colour_ok |= pr.substr(0, pr.find(' ')) == colour;
      shape_ok |= pr.substr(pr.find(' ') + 1) == shape;
    }
    acc.colour_correct += colour_ok;
    acc.shape_correct += shape_ok;
  }
  acc.correct += ex.correct;
  acc.images++;
  if (acc.examples.size() < 4) acc.examples.push_back(ex);
}

} // namespace

CaptionAccuracy evaluate_demo_captions(const model::CausalLM& m, const io::Tokenizer& tok,
                                       const std::string& dataset, const std::string& split,
                                       const io::ImageProcessorConfig& image, int64_t max_images,
                                       Device device) {
  VLM_CHECK(m.has_vision(), "caption accuracy: the model has no vision tower");
  const io::EnergonDataset ds = io::EnergonDataset::open(dataset);
  const auto& sp = ds.split(split);
  CaptionAccuracy acc;
  for (int64_t i = 0; i < sp.num_samples && acc.images < max_images; i++) {
    const auto sample = read_image_sample(ds, sp, i, acc);
    if (!sample) continue;
    const std::string truth = truth_caption(sample->first);
    const std::vector<std::string> pairs = demo_caption_pairs(truth);
    if (pairs.empty()) continue; // no demo caption to compare with
    CaptionExample ex{truth, generate_caption(m, tok, sample->first, sample->second, image, device),
                      false};
    score_caption(ex, pairs, acc);
    if (acc.images % 25 == 0)
      log_info("caption accuracy: ", acc.images, "/", max_images, " images, ", acc.correct,
               " right so far");
  }
  return acc;
}

} // namespace vlm::demo
