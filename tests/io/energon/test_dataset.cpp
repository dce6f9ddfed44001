// The Energon dataset reader: metadata, split index spaces, excludes, sample reading, and the
// two error classes (whole-dataset vlm::Error at open / split(), per-sample SampleError).
// Reference data: the C++ fixtures of docs/energon-format.md §8
// (tests/io/energon/energon_fixtures.h), a dataset prepared by the real `energon prepare` and read
// back by energon's own reader (tests/data/energon_prepared/manifest.json), and brace-expansion
// vectors from the Python `braceexpand` package that energon uses.
#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/energon/brace_expand.h"
#include "io/energon/dataset.h"
#include "tests/error_of.h"
#include "tests/io/energon/energon_fixtures.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using vlm::io::EnergonDataset;
using vlm::io::EnergonOpenOptions;
using vlm::io::RawSample;
using vlm::io::SampleError;
using vlm::testing::Damage;
using vlm::testing::FixtureDataset;
using vlm::testing::LongNames;
using vlm::testing::TempDir;

using vlm::testing::error_of;

namespace {

const std::string kPrepared = std::string(VLM_SOURCE_DIR) + "/tests/data/energon_prepared";

template <typename F> SampleError sample_error_of(F&& f) {
  try {
    f();
  } catch (const SampleError& e) {
    return e;
  }
  FAIL("no SampleError thrown");
  return SampleError(SampleError::Reason::no_parts, "", "", -1, "");
}

std::string fnv1a64(const std::string& data) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : data) h = (h ^ c) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string key_of(int k) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%06d", k);
  return buf;
}

} // namespace

TEST_CASE("energon: brace expansion matches the braceexpand package", "[io][energon]") {
  auto doc =
      nlohmann::json::parse(vlm::testing::read_file(kPrepared + "/braceexpand_vectors.json"));
  REQUIRE(doc["vectors"].size() > 40);
  for (const auto& v : doc["vectors"]) {
    std::string pattern = v["pattern"];
    INFO("pattern '" << pattern << "'");
    if (v.contains("error")) {
      CHECK_THAT(error_of([&] { vlm::io::brace_expand(pattern); }),
                 Contains("unbalanced braces") && Contains(pattern));
    } else {
      CHECK(vlm::io::brace_expand(pattern) == v["expansion"].get<std::vector<std::string>>());
    }
  }
  // Found by hand, beyond the generated vectors.
  CHECK(vlm::io::brace_expand("}{{a,b}") == std::vector<std::string>{"}{a", "}{b"});
  CHECK_THAT(error_of([] { vlm::io::brace_expand("{0..99999999}"); }), Contains("more than"));
}

TEST_CASE("energon: fx_basic splits, keys, parts and excluded sample", "[io][energon]") {
  TempDir tmp;
  vlm::testing::write_fixture(tmp.path("fx_basic"), vlm::testing::fx_basic());
  EnergonDataset ds = EnergonDataset::open(tmp.path("fx_basic") + "/");
  CHECK(ds.root() == tmp.path("fx_basic"));
  CHECK(ds.split_names() == std::vector<std::string>{"train", "val", "test"});
  CHECK(ds.dataset_class() == "CrudeWebdataset");
  CHECK(ds.subflavors() == std::map<std::string, std::string>{{"type_dataset", "llava_recap"}});
  CHECK(ds.part_filter().empty());
  CHECK(ds.energon_version() == "7.3.2");
  CHECK(ds.excludes() == std::vector<std::string>{"shards/shard_000001.tar/000004"});

  const auto& train = ds.split("train");
  CHECK(train.num_samples == 5); // 5 index slots, 4 emitted
  REQUIRE(train.shards.size() == 2);
  CHECK(train.shards[0].name == "shards/shard_000000.tar");
  CHECK(train.shards[1].name == "shards/shard_000001.tar");
  CHECK(train.shards[1].count == 2);
  CHECK(train.shards[1].first_index == 3);
  CHECK(train.shards[1].index_path == tmp.path("fx_basic/shards/shard_000001.tar.idx"));
  CHECK(ds.read_shard_index(train.shards[0]) == std::vector<uint64_t>{0, 2048, 4096, 6144});
  CHECK(ds.locate(train, 3) == std::pair<size_t, int64_t>{1, 0});
  CHECK(ds.locate(train, 2) == std::pair<size_t, int64_t>{0, 2});

  for (int k = 0; k < 5; k++) {
    RawSample s = ds.read_sample("train", k);
    INFO("sample " << k);
    CHECK(s.key == key_of(k));
    CHECK(s.global_index == k);
    CHECK(s.shard == (k < 3 ? "shards/shard_000000.tar" : "shards/shard_000001.tar"));
    CHECK(s.subflavors.at("type_dataset") == "llava_recap");
    CHECK(s.excluded == (k == 4));
    CHECK(ds.is_excluded(s.shard, s.key) == (k == 4));
    if (k == 4) {
      CHECK(s.parts.empty()); // read but not emitted: the parts are never loaded
    } else {
      CHECK(s.parts == std::map<std::string, std::string>{{"json", vlm::testing::fx_basic_json(k)},
                                                          {"jpg", vlm::testing::fx_basic_jpg(k)}});
    }
  }
  const auto& val = ds.split("val");
  CHECK(val.num_samples == 1);
  CHECK(ds.read_sample(val, 0).key == "000005");
  CHECK(ds.has_split("test"));
  // `test: []` (what `energon prepare` writes for an unused split) is a valid, empty split.
  CHECK(ds.split("test").num_samples == 0);
  CHECK(ds.split("test").shards.empty());
  CHECK_THAT(error_of([&] { ds.read_sample("train", 5); }),
             Contains("sample index 5 out of range [0, 5)"));
  CHECK_THAT(error_of([&] { ds.read_sample("train", -1); }), Contains("out of range"));
}

TEST_CASE("energon: .info.yaml, split.json and leading non-sample members", "[io][energon]") {
  TempDir tmp;
  FixtureDataset fx = vlm::testing::fx_basic();
  fx.info_yaml = true;
  fx.split_json = true;
  for (auto& shard : fx.shards) shard.leading_members = true;
  vlm::testing::write_fixture(tmp.path("v"), fx);
  REQUIRE_FALSE(fs::exists(tmp.path("v/.nv-meta/.info.json")));
  REQUIRE_FALSE(fs::exists(tmp.path("v/.nv-meta/split.yaml")));
  EnergonDataset ds = EnergonDataset::open(tmp.path("v"));
  CHECK(ds.energon_version().empty());
  const auto& train = ds.split("train");
  CHECK(train.num_samples == 5);
  // idx[0] points past the directory and __meta__ members; sample 0 still starts at byte 0.
  CHECK(ds.read_shard_index(train.shards[0])[0] == 1536);
  for (int k = 0; k < 5; k++) CHECK(ds.read_sample(train, k).key == key_of(k));
  CHECK(ds.read_sample("train", 0).parts.at("json") == vlm::testing::fx_basic_json(0));
}

TEST_CASE("energon: fx_edge sample 0 skips directory, __meta__ and README", "[io][energon]") {
  for (LongNames ln : {LongNames::gnu, LongNames::pax}) {
    TempDir tmp;
    vlm::testing::write_fx_edge(tmp.path("edge"), ln);
    EnergonDataset ds = EnergonDataset::open(tmp.path("edge"));
    const auto& train = ds.split("train");
    REQUIRE(train.num_samples == 3);
    RawSample s0 = ds.read_sample(train, 0);
    CHECK(s0.key == "sub/000000");
    CHECK(s0.parts == std::map<std::string, std::string>{{"json", "{\"a\": 1}"},
                                                         {"seg.mask.png", std::string(700, 7)}});
    RawSample s1 = ds.read_sample(train, 1);
    CHECK(s1.key == vlm::testing::fx_edge_long_key());
    CHECK(s1.parts == std::map<std::string, std::string>{{"txt", "long key text"}});
    CHECK(ds.read_sample(train, 2).parts.at("txt") == "two");
  }
}

TEST_CASE("energon: shard excludes, long keys and part_filter", "[io][energon]") {
  TempDir tmp;
  FixtureDataset fx = vlm::testing::fx_basic();
  fx.exclude = {"shards/shard_{000000,000002}.tar", "shards/shard_000001.tar/000003"};
  // Long keys in shard 1, written with PAX records; three parts per sample.
  fx.shards[1].long_names = LongNames::pax;
  const std::string long_key = "nested/" + std::string(130, 'n');
  fx.shards[1].samples[1].key = long_key;
  fx.shards[1].samples[1].parts.push_back({"seg.mask.png", "mask"});
  vlm::testing::write_fixture(tmp.path("x"), fx);
  EnergonDataset ds = EnergonDataset::open(tmp.path("x"));
  const auto& train = ds.split("train");
  REQUIRE(train.shards.size() == 1); // shard 0 removed by the brace pattern
  CHECK(train.num_samples == 2);
  CHECK(ds.read_sample(train, 0).excluded);
  RawSample s = ds.read_sample(train, 1);
  CHECK(s.key == long_key);
  CHECK(s.parts.size() == 3);
  CHECK(s.parts.at("seg.mask.png") == "mask");
  CHECK(ds.split("val").num_samples == 0); // every shard excluded: empty, not an error
  CHECK(ds.split("val").excluded_shards == 1);

  // part_filter: only the listed parts are read; a sample with none of them is a SampleError.
  fx.exclude.clear();
  fx.part_filter = {"json"};
  vlm::testing::write_fixture(tmp.path("pf"), fx);
  EnergonDataset pf = EnergonDataset::open(tmp.path("pf"));
  CHECK(pf.part_filter() == std::vector<std::string>{"json"});
  CHECK(pf.read_sample("train", 4).parts ==
        std::map<std::string, std::string>{{"json", vlm::testing::fx_basic_json(4)}});
  fx.part_filter = {"txt"};
  vlm::testing::write_fixture(tmp.path("pf2"), fx);
  EnergonDataset pf2 = EnergonDataset::open(tmp.path("pf2"));
  SampleError e = sample_error_of([&] { pf2.read_sample("train", 0); });
  CHECK(e.reason == SampleError::Reason::no_parts);
  CHECK_THAT(e.what(), Contains("part_filter 'txt'") && Contains("key '000000'"));
}

TEST_CASE("energon: the energon-prepared dataset read end to end", "[io][energon]") {
  auto manifest = nlohmann::json::parse(vlm::testing::read_file(kPrepared + "/manifest.json"));
  int samples_checked = 0;
  for (const auto& [config, splits] : manifest["splits"].items()) {
    EnergonOpenOptions opt;
    opt.split_config = config;
    EnergonDataset ds = EnergonDataset::open(kPrepared + "/dataset", opt);
    CHECK(ds.dataset_class() == "CrudeWebdataset");
    CHECK(ds.energon_version() == manifest["energon_version"].get<std::string>());
    for (const auto& [name, want] : splits.items()) {
      INFO("split config " << config << ", split " << name);
      const auto& split = ds.split(name);
      std::vector<std::string> shard_names;
      for (const auto& sh : split.shards) {
        shard_names.push_back(sh.name);
        CHECK(ds.read_shard_index(sh) == manifest["tar_idx"][sh.name].get<std::vector<uint64_t>>());
      }
      CHECK(shard_names == want["shards"].get<std::vector<std::string>>());
      REQUIRE(split.num_samples == int64_t(want["samples"].size()));
      for (const auto& w : want["samples"]) {
        int64_t gi = w["global_index"];
        RawSample s = ds.read_sample(split, gi);
        INFO("sample " << gi);
        CHECK(s.global_index == gi);
        CHECK(s.shard == w["shard"].get<std::string>());
        CHECK(s.excluded == w["excluded"].get<bool>());
        if (s.excluded) continue;
        CHECK(s.key == w["key"].get<std::string>());
        std::map<std::string, std::string> got_parts;
        for (const auto& [part, data] : s.parts) got_parts[part] = fnv1a64(data);
        std::map<std::string, std::string> want_parts;
        for (const auto& [part, info] : w["parts"].items()) {
          want_parts[part] = info["fnv1a64"].get<std::string>();
          CHECK(s.parts[part].size() == info["size"].get<size_t>());
        }
        CHECK(got_parts == want_parts);
        samples_checked++;
      }
    }
  }
  CHECK(samples_checked == 6 + 2); // split.yaml: all 6; split_exclude.yaml: 2 emitted
}

TEST_CASE("energon: whole-dataset problems are clear errors naming the path", "[io][energon]") {
  TempDir tmp;
  const std::string root = tmp.path("ds");
  vlm::testing::write_fixture(root, vlm::testing::fx_basic());
  const std::string meta = root + "/.nv-meta";

  CHECK_THAT(error_of([&] { EnergonDataset::open(tmp.path("missing")); }),
             Contains("'" + tmp.path("missing") + "' does not exist"));
  CHECK_THAT(error_of([&] { EnergonDataset::open(meta + "/split.yaml"); }),
             Contains("is not a directory"));
  fs::create_directories(tmp.path("plain"));
  CHECK_THAT(error_of([&] { EnergonDataset::open(tmp.path("plain")); }),
             Contains("not a prepared Energon dataset") && Contains(tmp.path("plain/.nv-meta")));

  SECTION("unknown split lists the known ones") {
    EnergonDataset ds = EnergonDataset::open(root);
    CHECK_THAT(error_of([&] { ds.split("validation"); }), Contains("no split 'validation'") &&
                                                              Contains(meta + "/split.yaml") &&
                                                              Contains("'train', 'val', 'test'"));
    CHECK_THAT(error_of([&] { ds.read_sample("nope", 0); }), Contains("no split 'nope'"));
  }
  SECTION("missing metadata files") {
    fs::remove(meta + "/.info.json");
    CHECK_THAT(error_of([&] { EnergonDataset::open(root); }),
               Contains(meta + "/.info.json") && Contains(meta + "/.info.yaml"));
  }
  SECTION("missing split config") {
    fs::remove(meta + "/split.yaml");
    CHECK_THAT(error_of([&] { EnergonDataset::open(root); }),
               Contains(meta + "/split.yaml") && Contains("split.json"));
    EnergonOpenOptions opt;
    opt.split_config = "custom.yaml";
    CHECK_THAT(error_of([&] { EnergonDataset::open(root, opt); }),
               Contains(meta + "/custom.yaml' does not exist"));
  }
  SECTION("missing dataset.yaml") {
    fs::remove(meta + "/dataset.yaml");
    CHECK_THAT(error_of([&] { EnergonDataset::open(root); }),
               Contains(meta + "/dataset.yaml") && Contains("does not exist"));
  }
  SECTION("split entries that are not in .info, bad braces, unknown keys") {
    vlm::testing::write_file(meta + "/split.yaml",
                             "split_parts:\n  train:\n  - shards/shard_{000000..000003}.tar\n");
    CHECK_THAT(error_of([&] { EnergonDataset::open(root); }),
               Contains("shard 'shards/shard_000003.tar' of split 'train'") &&
                   Contains(meta + "/.info.json"));
    vlm::testing::write_file(meta + "/split.yaml",
                             "split_parts:\n  train:\n  - shards/shard_{000000.tar\n");
    CHECK_THAT(error_of([&] { EnergonDataset::open(root); }),
               Contains("split 'train'") && Contains("unbalanced braces"));
    vlm::testing::write_file(meta + "/split.yaml", "split_parts: {train: []}\nexlude: []\n");
    CHECK_THAT(error_of([&] { EnergonDataset::open(root); }),
               Contains("line 2: unknown key 'exlude'"));
    vlm::testing::write_file(meta + "/dataset.yaml", "__class__: CrudeWebdataset\n"
                                                     "part_filter: sample_loader.py:part_filter\n");
    vlm::testing::write_file(meta + "/split.yaml", "split_parts: {train: []}\n");
    CHECK_THAT(error_of([&] { EnergonDataset::open(root); }), Contains("not a list of part names"));
  }
}

TEST_CASE("energon: broken shard indexes make their split unusable", "[io][energon]") {
  struct Case {
    Damage damage;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {Damage::missing_index, {"shard_000001.tar.idx' does not exist", "--tar-index-only"}},
      {Damage::short_index, {"has 16 bytes, expected 24 = 8 x (2 samples from .info + 1)"}},
      {Damage::truncated, {"ends at byte 4096 but the tar has", "truncated tar"}},
  };
  for (const Case& c : cases) {
    TempDir tmp;
    FixtureDataset fx = vlm::testing::fx_basic();
    fx.shards[1].damage = c.damage;
    vlm::testing::write_fixture(tmp.path("ds"), fx);
    EnergonDataset ds = EnergonDataset::open(tmp.path("ds"));
    std::string msg = error_of([&] { ds.split("train"); });
    INFO(msg);
    CHECK_THAT(msg, Contains("split 'train'") && Contains("shard 'shards/shard_000001.tar'"));
    for (const auto& e : c.expect) CHECK_THAT(msg, Contains(e));
    CHECK(ds.read_sample("val", 0).key == "000005"); // other splits stay usable
  }
  // A count in .info that disagrees with the index.
  TempDir tmp;
  FixtureDataset fx = vlm::testing::fx_basic();
  fx.shards[0].info_count = 4;
  vlm::testing::write_fixture(tmp.path("ds"), fx);
  CHECK_THAT(error_of([&] { EnergonDataset::open(tmp.path("ds")).split("train"); }),
             Contains("expected 40 = 8 x (4 samples"));
}

TEST_CASE("energon: bad data inside a shard is a SampleError with a reason", "[io][energon]") {
  using R = SampleError::Reason;
  auto open_damaged = [](TempDir& tmp, Damage d) {
    FixtureDataset fx = vlm::testing::fx_basic();
    fx.shards[0].damage = d;
    vlm::testing::write_fixture(tmp.path("ds"), fx);
    return EnergonDataset::open(tmp.path("ds"));
  };
  SECTION("tar cut inside the last sample, index consistent with the cut") {
    TempDir tmp;
    EnergonDataset ds = open_damaged(tmp, Damage::truncated_consistent);
    CHECK(ds.read_sample("train", 1).key == "000001");
    SampleError e = sample_error_of([&] { ds.read_sample("train", 2); });
    CHECK(e.reason == R::truncated);
    CHECK(e.shard == "shards/shard_000000.tar");
    CHECK(e.key == "000002");
    CHECK(e.global_index == 2);
    CHECK_THAT(e.what(), Contains("split 'train' sample 2") && Contains("key '000002'") &&
                             Contains("truncated") && Contains("000002.jpg"));
    CHECK(std::string(vlm::io::sample_error_reason_name(e.reason)) == "truncated");
  }
  SECTION("an index offset into the middle of a sample") {
    TempDir tmp;
    EnergonDataset ds = open_damaged(tmp, Damage::shifted_offset);
    SampleError e0 = sample_error_of([&] { ds.read_sample("train", 0); });
    CHECK(e0.reason == R::inconsistent_key);
    CHECK_THAT(e0.what(), Contains("member '000001.json' at byte 2048"));
    SampleError e1 = sample_error_of([&] { ds.read_sample("train", 1); });
    CHECK(e1.reason == R::bad_header);
    CHECK(e1.key.empty());
    CHECK_THAT(e1.what(), Contains("at byte 2560") && Contains("bad checksum"));
    CHECK(ds.read_sample("train", 2).key == "000002"); // neighbours unaffected
  }
  SECTION("a garbage header") {
    TempDir tmp;
    EnergonDataset ds = open_damaged(tmp, Damage::garbage_header);
    CHECK(ds.read_sample("train", 0).parts.size() == 2);
    CHECK(sample_error_of([&] { ds.read_sample("train", 1); }).reason == R::bad_header);
  }
  SECTION("index entries beyond the tar") {
    TempDir tmp;
    EnergonDataset ds = open_damaged(tmp, Damage::index_past_end);
    SampleError e = sample_error_of([&] { ds.read_sample("train", 0); });
    CHECK(e.reason == R::bad_index);
    CHECK_THAT(e.what(), Contains("shard_000000.tar.idx' entries 0..1") &&
                             Contains("but the tar has 10240 bytes"));
    CHECK(sample_error_of([&] { ds.read_sample("train", 1); }).reason == R::bad_index);
  }
  SECTION("a range holding no sample member, and an end block inside a range") {
    TempDir tmp;
    vlm::testing::TarWriter w;
    w.add_file("README", std::string(100, 'r'));
    uint64_t s1 = w.add_file("000001.txt", "one");
    uint64_t end = w.size();
    fs::create_directories(tmp.path("ds/.nv-meta"));
    vlm::testing::write_file(tmp.path("ds/a.tar"), w.finish());
    // Sample 0 covers only README; sample 1 is fine; sample 2 runs into the end-of-archive block.
    vlm::testing::write_index(tmp.path("ds/a.tar.idx"), {0, s1, end, end + 1024});
    vlm::testing::write_file(tmp.path("ds/.nv-meta/.info.json"),
                             "{\"shard_counts\": {\"a.tar\": 3}}");
    vlm::testing::write_file(tmp.path("ds/.nv-meta/split.yaml"), "split_parts: {train: [a.tar]}");
    vlm::testing::write_file(tmp.path("ds/.nv-meta/dataset.yaml"), "__class__: CrudeWebdataset");
    EnergonDataset ds = EnergonDataset::open(tmp.path("ds"));
    SampleError e = sample_error_of([&] { ds.read_sample("train", 0); });
    CHECK(e.reason == R::no_parts);
    CHECK_THAT(e.what(), Contains("no sample member in bytes [0, 1024)"));
    CHECK(ds.read_sample("train", 1).parts.at("txt") == "one");
    e = sample_error_of([&] { ds.read_sample("train", 2); });
    CHECK(e.reason == R::truncated);
    CHECK_THAT(e.what(), Contains("end-of-archive block at byte 2048"));
  }
}

TEST_CASE("energon: many threads share one dataset", "[io][energon]") {
  TempDir tmp;
  FixtureDataset fx;
  int k = 0;
  for (int s = 0; s < 24; s++) {
    vlm::testing::FixtureShard shard;
    shard.name = "s/" + std::to_string(s) + ".tar";
    for (int i = 0; i < 8; i++, k++)
      shard.samples.push_back({key_of(k),
                               {{"txt", "text " + std::to_string(k)},
                                {"bin", std::string(size_t(100 + k * 13), char(k))}}});
    fx.shards.push_back(std::move(shard));
  }
  fx.splits = {{"train", {"s/{0..23}.tar"}}};
  vlm::testing::write_fixture(tmp.path("ds"), fx);
  EnergonOpenOptions opt;
  opt.max_open_files = 4; // far fewer than the 48 files: constant eviction under contention
  EnergonDataset ds = EnergonDataset::open(tmp.path("ds"), opt);
  const auto& train = ds.split("train");
  REQUIRE(train.num_samples == k);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; t++) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; rep++) {
        for (int64_t i = 0; i < train.num_samples; i++) {
          int64_t gi = (i * 7 + t * 13 + rep) % train.num_samples;
          RawSample s = ds.read_sample(train, gi);
          if (s.key != key_of(int(gi)) || s.parts["txt"] != "text " + std::to_string(gi) ||
              s.parts["bin"].size() != size_t(100 + gi * 13))
            bad++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
}
