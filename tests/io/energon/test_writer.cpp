// The Energon writer (used by `vlmtrain data make-demo`) produces datasets our reader opens, with
// every sample's parts intact, and the demo dataset holds decodable images and usable chats.
#include <catch2/catch.hpp>

#include <filesystem>

#include "io/energon/dataset.h"
#include "io/energon/writer.h"
#include "io/image/decode.h"
#include "io/image/encode.h"
#include "io/text/chat_format.h"
#include "src/demo/demo_dataset.h"

using namespace vlm;
using namespace vlm::io;
namespace fs = std::filesystem;

namespace {
std::string temp_root(const char* name) {
  fs::path p =
      fs::temp_directory_path() / ("vlm_writer_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}
} // namespace

TEST_CASE("energon writer: shards, index and metadata read back exactly", "[io]") {
  std::string root = temp_root("basic");
  std::map<std::string, std::vector<WriterSample>> splits;
  for (int i = 0; i < 7; i++) {
    std::string big(1000 + i * 37, char('a' + i)); // crosses 512-byte blocks
    splits["train"].push_back({"s" + std::to_string(i), {{"txt", big}, {"json", "{}"}}});
  }
  splits["val"].push_back({"dir/v0", {{"seg.mask.png", "xyz"}}});
  EnergonWriteOptions o;
  o.samples_per_shard = 3;
  o.subflavors = {{"type_dataset", "synth"}};
  write_energon_dataset(root, splits, o);
  CHECK_THROWS_WITH(write_energon_dataset(root, splits, o), Catch::Contains("already exists"));

  EnergonDataset ds = EnergonDataset::open(root);
  CHECK(ds.subflavors().at("type_dataset") == "synth");
  const auto& train = ds.split("train");
  CHECK(train.num_samples == 7);
  CHECK(train.shards.size() == 3);
  for (int i = 0; i < 7; i++) {
    RawSample s = ds.read_sample("train", i);
    CHECK(s.key == "s" + std::to_string(i));
    CHECK(s.parts.at("txt") == splits["train"][size_t(i)].parts[0].second);
    CHECK(s.parts.at("json") == "{}");
  }
  RawSample v = ds.read_sample("val", 0);
  CHECK(v.key == "dir/v0");
  CHECK(v.parts.at("seg.mask.png") == "xyz");
  fs::remove_all(root);
}

TEST_CASE("energon writer: PNG encoding round-trips through the decoder", "[io]") {
  Image img;
  img.width = 5;
  img.height = 3;
  for (int i = 0; i < 45; i++) img.rgb.push_back(uint8_t(i * 5));
  Image back = decode_image(encode_png(img), "png");
  CHECK(back.width == 5);
  CHECK(back.height == 3);
  CHECK(back.rgb == img.rgb);
}

TEST_CASE("energon writer: the demo dataset has decodable images and usable chats", "[io]") {
  std::string root = temp_root("demo");
  demo::DemoDatasetOptions o;
  o.train_samples = 40;
  o.val_samples = 8;
  o.samples_per_shard = 16;
  demo::make_demo_dataset(root, o);
  EnergonDataset ds = EnergonDataset::open(root);
  CHECK(ds.split("train").num_samples == 40);
  CHECK(ds.split("val").num_samples == 8);
  int images = 0, conversations = 0, captions = 0, texts = 0;
  for (int64_t i = 0; i < 40; i++) {
    RawSample s = ds.read_sample("train", i);
    ChatSample c = parse_chat_sample(s);
    for (const auto& part : c.image_parts) {
      Image img = decode_image(s.parts.at(part), "png");
      CHECK(img.width >= 48);
      images++;
    }
    conversations += c.kind == SampleKind::conversation;
    captions += c.kind == SampleKind::caption;
    texts += c.kind == SampleKind::text;
  }
  CHECK(images == conversations + captions);
  CHECK(conversations > 0);
  CHECK(captions > 0);
  CHECK(texts > 0);
  // Same seed, same bytes.
  std::string again = temp_root("demo2");
  demo::make_demo_dataset(again, o);
  CHECK(EnergonDataset::open(again).read_sample("train", 5).parts ==
        ds.read_sample("train", 5).parts);
  fs::remove_all(root);
  fs::remove_all(again);
}
