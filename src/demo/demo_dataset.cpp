#include "src/demo/demo_dataset.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <nlohmann/json.hpp>

#include "io/energon/writer.h"
#include "io/image/encode.h"
#include "io/text/bpe_trainer.h"
#include "io/text/chat_format.h"
#include "src/base/rng.h"

namespace vlm::demo {

using io::EnergonWriteOptions;
using io::Image;
using io::WriterSample;

namespace {

struct Colour {
  const char* name;
  uint8_t r, g, b;
};
constexpr std::array<Colour, 8> kColours = {{{"red", 220, 40, 40},
                                             {"green", 40, 170, 60},
                                             {"blue", 40, 80, 220},
                                             {"yellow", 240, 210, 40},
                                             {"orange", 245, 140, 30},
                                             {"purple", 140, 60, 180},
                                             {"black", 20, 20, 20},
                                             {"white", 250, 250, 250}}};
constexpr std::array<const char*, 4> kShapes = {"circle", "square", "triangle", "diamond"};
constexpr std::array<const char*, 3> kCounts = {"one", "two", "three"};

struct Shape {
  int shape, colour;
  double cx, cy, r; // centre and half-size in pixels
};

bool inside(const Shape& s, double x, double y) {
  double dx = x - s.cx, dy = y - s.cy;
  switch (s.shape) {
  case 0: return dx * dx + dy * dy <= s.r * s.r;
  case 1: return std::abs(dx) <= s.r && std::abs(dy) <= s.r;
  case 2: return dy <= s.r && dy >= -s.r && std::abs(dx) <= (dy + s.r) / 2; // apex up
  default: return std::abs(dx) + std::abs(dy) <= s.r;
  }
}

std::string article(const std::string& word) {
  return std::string("aeiou").find(word[0]) != std::string::npos ? "an" : "a";
}

std::string describe(const Shape& s) {
  std::string c = kColours[size_t(s.colour)].name;
  return article(c) + " " + c + " " + kShapes[size_t(s.shape)];
}

// One sample. Most images (85%) hold one large shape, the rest two smaller ones. The training mix
// is 5% text only, 20% captions ("A red square."), 70% "Shapes?" answered with the shapes alone
// ("A square.") and 5% a conversation (caption, count, colour and shape of the first shape). Why
// so few colour words: colour is learned from the mean of the pixels within tens of steps, and
// while the loss holds as many colour words as shape words the vision tower stays on colour and
// learns shapes several times slower (measured: shape named right 50% -> 89% after 800 steps,
// same model; the same stall shows when the tiny tower alone is trained in transformers on shape
// and colour labels). A held-out sample is always an image with its caption: the prompt and answer
// of the caption accuracy (src/demo/caption_eval.h).
WriterSample make_sample(int64_t index, Rng& rng, bool held_out) {
  int64_t w = rng.randint(48, 129), h = rng.randint(48, 129);
  int bg = int(rng.randint(0, 3)); // light grey, cream, pale blue backgrounds
  const uint8_t bgs[3][3] = {{200, 200, 200}, {245, 235, 210}, {200, 220, 240}};
  int n = rng.uniform() < 0.85 ? 1 : 2;
  std::vector<Shape> shapes;
  for (int i = 0; i < n; i++) {
    const int64_t m = std::min(w, h);
    double r = double(n == 1 ? rng.randint(m / 4, m * 2 / 5 + 1) : rng.randint(m / 6, m / 3 + 1));
    shapes.push_back({int(rng.randint(0, 4)), int(rng.randint(0, 7)), rng.uniform(r, double(w) - r),
                      rng.uniform(r, double(h) - r), r});
  }
  // Largest first, in the picture (drawn first, smaller ones on top) and in the caption: the
  // first shape a caption names is the one a model can see best.
  std::stable_sort(shapes.begin(), shapes.end(),
                   [](const Shape& a, const Shape& b) { return a.r > b.r; });
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(size_t(w * h * 3));
  for (int64_t y = 0; y < h; y++)
    for (int64_t x = 0; x < w; x++) {
      const uint8_t* px = bgs[bg];
      for (const auto& s : shapes) // later shapes are drawn on top
        if (inside(s, double(x) + 0.5, double(y) + 0.5)) px = &kColours[size_t(s.colour)].r;
      std::copy(px, px + 3, img.rgb.begin() + (y * w + x) * 3);
    }

  std::string caption;
  for (size_t i = 0; i < shapes.size(); i++)
    caption += (i == 0 ? "" : i + 1 == shapes.size() ? " and " : ", ") + describe(shapes[i]);
  caption[0] = char(std::toupper(caption[0]));
  caption += ".";

  char key[32];
  std::snprintf(key, sizeof key, "%08lld", (long long)index);
  WriterSample s{key, {}};
  const double kind = held_out ? 0.1 : rng.uniform();
  if (kind < 0.05) { // text only: a description without the picture
    s.parts = {{"txt", "In the picture there is " + std::string(kCounts[shapes.size() - 1]) +
                           " shape: " + caption}};
    return s;
  }
  s.parts.push_back({"png", encode_png(img)});
  if (kind < 0.25) {
    s.parts.push_back({"txt", caption});
  } else if (kind < 0.95) {
    std::string shapes_only;
    for (size_t i = 0; i < shapes.size(); i++) {
      const std::string name = kShapes[size_t(shapes[i].shape)];
      shapes_only += (i == 0 ? "" : " and ") + article(name) + " " + name;
    }
    shapes_only[0] = char(std::toupper(shapes_only[0]));
    nlohmann::json conv = nlohmann::json::array();
    conv.push_back({{"from", "human"}, {"value", "<image>\nShapes?"}});
    conv.push_back({{"from", "gpt"}, {"value", shapes_only + "."}});
    s.parts.push_back({"json", nlohmann::json{{"conversations", conv}}.dump()});
  } else {
    const Shape& first = shapes[0];
    nlohmann::json conv = nlohmann::json::array();
    conv.push_back({{"from", "human"}, {"value", "<image>\nWhat do you see?"}});
    conv.push_back({{"from", "gpt"}, {"value", caption}});
    conv.push_back({{"from", "human"}, {"value", "How many shapes are there?"}});
    conv.push_back({{"from", "gpt"},
                    {"value", "There " + std::string(shapes.size() == 1 ? "is " : "are ") +
                                  kCounts[shapes.size() - 1] + "."}});
    conv.push_back({{"from", "human"}, {"value", "What colour is the first shape?"}});
    conv.push_back({{"from", "gpt"},
                    {"value", std::string("It is ") + kColours[size_t(first.colour)].name + "."}});
    conv.push_back({{"from", "human"}, {"value", "What shape is it?"}});
    conv.push_back({{"from", "gpt"},
                    {"value", std::string("It is ") + article(kShapes[size_t(first.shape)]) + " " +
                                  kShapes[size_t(first.shape)] + "."}});
    s.parts.push_back({"json", nlohmann::json{{"conversations", conv}}.dump()});
  }
  return s;
}

} // namespace

const std::vector<std::string>& demo_special_tokens() {
  static const std::vector<std::string> tokens = {
      "<|endoftext|>",  "<|im_start|>",  "<|im_end|>",   "<|vision_start|>",
      "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"};
  return tokens;
}

void make_demo_dataset(const std::string& root, const DemoDatasetOptions& o) {
  Rng rng(o.seed, 0x64656d6f); // "demo"
  std::map<std::string, std::vector<WriterSample>> splits;
  int64_t index = 0;
  for (int64_t i = 0; i < o.train_samples; i++)
    splits["train"].push_back(make_sample(index++, rng, /*held_out=*/false));
  for (int64_t i = 0; i < o.val_samples; i++)
    splits["val"].push_back(make_sample(index++, rng, /*held_out=*/true));

  // The tokenizer is trained on every sample's text as the tokenizer will see it: the rendered
  // chat (role words, turns, captions; special tokens are split off) or the plain text, plus the
  // role words of the chat template.
  std::vector<std::string> texts = {"system", "user", "assistant"};
  for (const auto& [split, samples] : splits)
    for (const WriterSample& s : samples) {
      io::RawSample raw;
      raw.key = s.key;
      raw.shard = split;
      for (const auto& [name, bytes] : s.parts) // an image part counts by its presence
        raw.parts[name] = name == "png" ? std::string() : bytes;
      texts.push_back(io::render_chat(io::parse_chat_sample(raw)));
    }

  EnergonWriteOptions w;
  w.samples_per_shard = o.samples_per_shard;
  w.extra_files["tokenizer.json"] =
      io::train_byte_level_bpe(texts, kDemoVocabSize, demo_special_tokens());
  io::write_energon_dataset(root, splits, w);
}

} // namespace vlm::demo
