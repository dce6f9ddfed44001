#include "src/demo/caption_eval.h"

#include <algorithm>
#include <cctype>
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

CaptionAccuracy evaluate_demo_captions(const model::CausalLM& m, const io::Tokenizer& tok,
                                       const std::string& dataset, const std::string& split,
                                       const io::ImageProcessorConfig& image, int64_t max_images,
                                       Device device) {
  VLM_CHECK(m.has_vision(), "caption accuracy: the model has no vision tower");
  const io::EnergonDataset ds = io::EnergonDataset::open(dataset);
  const auto& sp = ds.split(split);
  const int32_t image_pad = tok.token_to_id("<|image_pad|>"),
                im_end = tok.token_to_id("<|im_end|>");
  const std::vector<int32_t> stop = {im_end, tok.token_to_id("<|endoftext|>")};
  std::vector<int32_t> answer_start = {tok.token_to_id("<|im_start|>")};
  for (int32_t id : tok.encode("assistant\n")) answer_start.push_back(id);

  CaptionAccuracy acc;
  auto skip = [&](const std::string& why) {
    if (acc.skipped++ == 0) acc.first_skip = why;
  };
  for (int64_t i = 0; i < sp.num_samples && acc.images < max_images; i++) {
    io::ChatSample sample;
    io::Image img;
    try { // what the loader skips is skipped here too
      const io::RawSample raw = ds.read_sample(sp, i);
      if (raw.excluded) continue;
      sample = io::parse_chat_sample(raw);
      if (sample.image_parts.empty()) continue; // text-only sample
      const std::string& part = sample.image_parts[0];
      img = io::decode_image(raw.parts.at(part), part);
    } catch (const io::SampleError& e) {
      skip(e.what());
      continue;
    } catch (const io::ChatFormatError& e) {
      skip(e.what());
      continue;
    } catch (const io::ImageError& e) {
      skip(e.what());
      continue;
    }
    const std::string truth = truth_caption(sample);
    const std::vector<std::string> pairs = demo_caption_pairs(truth);
    if (pairs.empty()) continue; // no demo caption to compare with
    const std::string& part = sample.image_parts[0];
    model::GenerateInput in;
    in.vocab_limit = tok.vocab_size();
    const io::ProcessedImage p = io::preprocess_image(img, image);
    in.pixel_values = p.pixel_values;
    in.patch_dim = p.patch_dim;
    in.grids = {p.grid_thw};
    in.image_token_id = image_pad;
    in.spatial_merge_size = image.merge_size;

    io::ChatSample prompt; // the caption prompt of training: a user turn with the image only
    prompt.kind = io::SampleKind::caption;
    prompt.image_parts = {part};
    prompt.messages = {{"user", {io::ContentItem{true, "", 0}}}};
    in.prompt = io::tokenize_chat(prompt, tok, {p.num_tokens()}).input_ids;
    in.prompt.insert(in.prompt.end(), answer_start.begin(), answer_start.end());

    std::vector<int32_t> gen = model::greedy_generate(m, in, 40, stop, device);
    if (!gen.empty() && (gen.back() == stop[0] || gen.back() == stop[1])) gen.pop_back();
    CaptionExample ex{truth, tok.decode(gen, true), false};
    const std::vector<std::string> named = demo_caption_pairs(ex.generated);
    if (!named.empty()) {
      const std::string& first = named[0];
      const std::string colour = first.substr(0, first.find(' ')),
                        shape = first.substr(first.find(' ') + 1);
      ex.correct = contains(pairs, first);
      bool colour_ok = false, shape_ok = false;
      for (const auto& pr : pairs) {
        colour_ok |= pr.substr(0, pr.find(' ')) == colour;
        shape_ok |= pr.substr(pr.find(' ') + 1) == shape;
      }
      acc.colour_correct += colour_ok;
      acc.shape_correct += shape_ok;
    }
    acc.correct += ex.correct;
    acc.images++;
    if (acc.examples.size() < 4) acc.examples.push_back(ex);
    if (acc.images % 25 == 0)
      log_info("caption accuracy: ", acc.images, "/", max_images, " images, ", acc.correct,
               " right so far");
  }
  return acc;
}

} // namespace vlm::demo
