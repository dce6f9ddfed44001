// MetadatasetV2 resolution. Reference data: tests/data/energon_prepared/mds/*.yaml resolved by
// energon's own MetadatasetV2.get_datasets (mds/expected.json, written by
// tools/golden/make_energon_prepared.py), and the §8.4 fixture of docs/energon-format.md.
#include <catch2/catch.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/energon/dataset.h"
#include "io/energon/metadataset.h"
#include "tests/error_of.h"
#include "tests/io/energon/energon_fixtures.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using vlm::io::BlendMode;
using vlm::io::DatasetSubset;
using vlm::io::EnergonDataset;
using vlm::io::resolve_metadataset;
using vlm::io::ResolvedSplit;
using vlm::testing::TempDir;

using vlm::testing::error_of;

namespace {

const std::string kMds = std::string(VLM_SOURCE_DIR) + "/tests/data/energon_prepared/mds";

const char* energon_mode_name(BlendMode m) {
  switch (m) {
  case BlendMode::none: return "NONE";
  case BlendMode::weights: return "DATASET_WEIGHT";
  case BlendMode::repetitions: return "SAMPLE_REPETITIONS";
  }
  return "";
}

// fx_mds of docs/energon-format.md §8.4: two copies of fx_basic beside the YAML.
std::string write_fx_mds(const TempDir& tmp, const std::string& yaml) {
  vlm::testing::write_fixture(tmp.path("dsA"), vlm::testing::fx_basic());
  vlm::testing::write_fixture(tmp.path("dsB"), vlm::testing::fx_basic());
  vlm::testing::write_file(tmp.path("fx_mds.yaml"), yaml);
  return tmp.path("fx_mds.yaml");
}

const char* kHeader = "__module__: megatron.energon\n__class__: MetadatasetV2\n";

} // namespace

TEST_CASE("metadataset: resolution matches energon's MetadatasetV2", "[io][metadataset]") {
  auto expected = nlohmann::json::parse(vlm::testing::read_file(kMds + "/expected.json"))["files"];
  int leaves_checked = 0;
  for (const auto& [file, splits] : expected.items()) {
    for (const auto& [split, want] : splits.items()) {
      INFO(file << " split " << split);
      ResolvedSplit r = resolve_metadataset(kMds + "/" + file, split);
      CHECK(energon_mode_name(r.mode) == want["blend_mode"].get<std::string>());
      REQUIRE(r.leaves.size() == want["leaves"].size());
      for (size_t i = 0; i < r.leaves.size(); i++) {
        const auto& leaf = r.leaves[i];
        const auto& w = want["leaves"][i];
        INFO("leaf " << i << " (" << leaf.source << ")");
        CHECK(fs::path(leaf.path) ==
              (fs::path(kMds) / w["path"].get<std::string>()).lexically_normal());
        EnergonDataset ds =
            EnergonDataset::open(leaf.path, {leaf.dataset_config, leaf.split_config});
        const auto& sp = ds.split(leaf.split);
        std::vector<std::string> shards;
        for (const auto& s : sp.shards) shards.push_back(s.name);
        CHECK(shards == w["shards"].get<std::vector<std::string>>());
        double weight = w["weight"].is_null() ? 1.0 : w["weight"].get<double>();
        double reps = w["repetitions"].is_null() ? 1.0 : w["repetitions"].get<double>();
        if (r.mode == BlendMode::weights) CHECK(leaf.weight == weight); // exact: same float ops
        if (r.mode == BlendMode::repetitions) CHECK(leaf.repetitions == reps);
        CHECK(vlm::io::merge_subflavors(ds.subflavors(), leaf.subflavors) ==
              w["subflavors"].get<std::map<std::string, std::string>>());
        if (w["shuffle_over_epochs"].is_null())
          CHECK_FALSE(leaf.shuffle_over_epochs.has_value());
        else
          CHECK(leaf.shuffle_over_epochs == w["shuffle_over_epochs"].get<int64_t>());
        if (!w["subset"].is_null()) {
          const auto& ws = w["subset"];
          CHECK(leaf.subset.rel_start == ws["range"][0].get<double>());
          CHECK(leaf.subset.rel_end == ws["range"][1].get<double>());
          CHECK(leaf.subset.has_absolute() == !ws["absolute_range"].is_null());
        } else {
          CHECK(leaf.subset.is_everything());
        }
        CHECK(sp.num_samples == w["total"].get<int64_t>());
        auto range = leaf.subset.apply(sp.num_samples);
        CHECK(std::vector<int64_t>{range.first, range.second} ==
              w["subset_range"].get<std::vector<int64_t>>());
        leaves_checked++;
      }
    }
  }
  CHECK(leaves_checked == 4 + 1 + 2 + 2);
}

TEST_CASE("metadataset: fx_mds blend weights, subset and subflavor override", "[io][metadataset]") {
  TempDir tmp("mds");
  std::string yaml = write_fx_mds(tmp, std::string(kHeader) + R"(splits:
  train:
    blend:
    - {weight: 3, path: ./dsA, subflavors: {type_dataset: synth}}
    - {weight: 1, path: ./dsB, subset: {range: [0, 2]}}
  val:
    path: ./dsA
)");
  ResolvedSplit train = resolve_metadataset(yaml, "train");
  CHECK(train.mode == BlendMode::weights);
  REQUIRE(train.leaves.size() == 2);
  CHECK(train.leaves[0].path == tmp.path("dsA"));
  CHECK(train.leaves[0].split == "train");
  CHECK(train.leaves[0].weight == 0.75);
  CHECK(train.leaves[1].weight == 0.25);
  CHECK(train.leaves[0].source == yaml + ": splits.train.blend[0]");
  // dsA's dataset.yaml says llava_recap, the metadataset says synth: the metadataset wins.
  EnergonDataset dsA = EnergonDataset::open(train.leaves[0].path);
  CHECK(
      vlm::io::merge_subflavors(dsA.subflavors(), train.leaves[0].subflavors).at("type_dataset") ==
      "synth");
  EnergonDataset dsB = EnergonDataset::open(train.leaves[1].path);
  CHECK(
      vlm::io::merge_subflavors(dsB.subflavors(), train.leaves[1].subflavors).at("type_dataset") ==
      "llava_recap");
  // dsB only yields global indices 0-1.
  CHECK(train.leaves[1].subset.apply(dsB.split("train").num_samples) ==
        std::pair<int64_t, int64_t>{0, 2});
  CHECK(train.leaves[0].subset.apply(5) == std::pair<int64_t, int64_t>{0, 5});

  ResolvedSplit val = resolve_metadataset(yaml, "val");
  CHECK(val.mode == BlendMode::none);
  REQUIRE(val.leaves.size() == 1);
  CHECK(val.leaves[0].path == tmp.path("dsA"));
  CHECK(val.leaves[0].split == "val");

  // The blend_epochized variant.
  vlm::testing::write_file(yaml, std::string(kHeader) + R"(splits:
  train:
    blend_epochized:
    - {repetitions: 2, path: ./dsA}
    - {repetitions: 0.5, path: ./dsB}
)");
  ResolvedSplit epo = resolve_metadataset(yaml, "train");
  CHECK(epo.mode == BlendMode::repetitions);
  REQUIRE(epo.leaves.size() == 2);
  CHECK(epo.leaves[0].repetitions == 2.0);
  CHECK(epo.leaves[1].repetitions == 0.5);
}

TEST_CASE("metadataset: a dataset folder is a single leaf", "[io][metadataset]") {
  TempDir tmp("mds");
  vlm::testing::write_fixture(tmp.path("ds"), vlm::testing::fx_basic());
  ResolvedSplit r = resolve_metadataset(tmp.path("ds") + "/", "val");
  CHECK(r.mode == BlendMode::none);
  REQUIRE(r.leaves.size() == 1);
  CHECK(fs::path(r.leaves[0].path) == fs::path(tmp.path("ds") + "/").lexically_normal());
  CHECK(r.leaves[0].split == "val");
  CHECK(r.leaves[0].subset.is_everything());
  CHECK(r.leaves[0].subflavors.empty());
}

TEST_CASE("metadataset: subsets follow energon's compute_subset", "[io][metadataset]") {
  DatasetSubset all;
  CHECK(all.apply(7) == std::pair<int64_t, int64_t>{0, 7});
  DatasetSubset rel;
  rel.rel_start = 0.25;
  rel.rel_end = 0.75;
  CHECK(rel.apply(10) == std::pair<int64_t, int64_t>{2, 7}); // int() truncation
  DatasetSubset both;
  both.abs_start = 2;
  both.abs_end = 10;
  both.rel_start = 0.5;
  CHECK(both.apply(12) == std::pair<int64_t, int64_t>{6, 10}); // absolute first, then relative
  DatasetSubset to_end;
  to_end.abs_start = 3;
  CHECK(to_end.apply(5) == std::pair<int64_t, int64_t>{3, 5});
  CHECK_THAT(error_of([&] { both.apply(9, "dsX"); }),
             Contains("dsX") && Contains("does not fit a split of 9 samples"));
}

TEST_CASE("metadataset: errors name the YAML file and key", "[io][metadataset]") {
  TempDir tmp("mds");
  auto err = [&](const std::string& body, const std::string& split = "train") {
    std::string yaml = write_fx_mds(tmp, std::string(kHeader) + body);
    return error_of([&] { resolve_metadataset(yaml, split); });
  };
  const std::string file = "metadataset '" + tmp.path("fx_mds.yaml") + "'";

  CHECK_THAT(err("splits:\n  train:\n    path: ./dsA\n", "val"),
             Contains(file) && Contains("no split 'val' (defined: 'train')"));
  CHECK_THAT(err("splits:\n  train:\n    blend:\n    - {wieght: 1, path: ./dsA}\n"),
             Contains(file + " line 6, splits.train.blend[0].wieght") &&
                 Contains("unknown key 'wieght'"));
  CHECK_THAT(err("splits:\n  train:\n    blend:\n    - {weight: heavy, path: ./dsA}\n"),
             Contains("splits.train.blend[0].weight") && Contains("non-negative number"));
  CHECK_THAT(err("splits:\n  train:\n    blend:\n    - {weight: 0, path: ./dsA}\n"),
             Contains("sum to 0"));
  CHECK_THAT(err("splits:\n  train:\n    path: ./nowhere\n"),
             Contains("splits.train.path") && Contains(tmp.path("nowhere") + "' does not exist"));
  fs::create_directories(tmp.path("empty"));
  CHECK_THAT(err("splits:\n  train:\n    path: ./empty\n"),
             Contains("neither a prepared Energon dataset"));
  CHECK_THAT(err("splits:\n  train:\n    path: ./dsA\n    subset: {range: [0%, 120%]}\n"),
             Contains("splits.train.subset.range[1]") && Contains("between 0% and 100%"));
  CHECK_THAT(err("splits:\n  train:\n    path: ./dsA\n    subset: {range: [0, 50%]}\n"),
             Contains("absolute start needs an absolute end"));
  CHECK_THAT(err("splits:\n  train:\n    path: ./dsA\n    aux: {img: ./dsB}\n"),
             Contains("splits.train.aux") && Contains("not supported"));
  CHECK_THAT(err("splits:\n  train:\n    join: [{path: ./dsA}, {path: ./dsB}]\n"),
             Contains("splits.train.join") && Contains("not supported"));

  // Mixing blend and blend_epochized through nesting.
  vlm::testing::write_file(tmp.path("inner.yaml"),
                           std::string(kHeader) +
                               "splits:\n  train:\n    blend_epochized:\n    - {path: ./dsA}\n");
  CHECK_THAT(err("splits:\n  train:\n    blend:\n    - {path: ./inner.yaml}\n"),
             Contains("splits.train.blend[0]") && Contains("cannot mix blend and blend_epochized"));
  // Absolute subsets only on dataset folders.
  CHECK_THAT(err("splits:\n  train:\n    path: ./inner.yaml\n    subset: {range: [0, 2]}\n"),
             Contains("only allowed on a reference to a dataset folder"));
  // A cycle.
  vlm::testing::write_file(tmp.path("loop.yaml"),
                           std::string(kHeader) + "splits:\n  train:\n    path: ./loop.yaml\n");
  CHECK_THAT(error_of([&] { resolve_metadataset(tmp.path("loop.yaml"), "train"); }),
             Contains("nesting deeper than 16") && Contains("loop.yaml"));
  // Legacy V1 and a missing class.
  vlm::testing::write_file(tmp.path("v1.yaml"), "__class__: Metadataset\nsplits: {}\n");
  CHECK_THAT(error_of([&] { resolve_metadataset(tmp.path("v1.yaml"), "train"); }),
             Contains("V1") && Contains(tmp.path("v1.yaml")));
  vlm::testing::write_file(tmp.path("bad.yaml"), "splits: [\n");
  CHECK_THAT(error_of([&] { resolve_metadataset(tmp.path("bad.yaml"), "train"); }),
             Contains("cannot parse metadataset YAML '" + tmp.path("bad.yaml") + "'"));
  CHECK_THAT(error_of([&] { resolve_metadataset(tmp.path("nothing.yaml"), "train"); }),
             Contains(tmp.path("nothing.yaml") + "' does not exist"));
}
