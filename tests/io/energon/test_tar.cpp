// Tar reading by byte range and energon's member-name rules. Reference data: name vectors run
// through energon's own regexes, and shards written by Python's tarfile (PAX, GNU, ustar) and
// indexed by the real `energon prepare` (tests/data/energon_prepared, made by
// tools/golden/make_energon_prepared.py).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/energon/tar.h"
#include "tests/io/energon/energon_fixtures.h"

using Catch::Matchers::Contains;
using vlm::io::ReadOnlyFile;
using vlm::io::TarError;
using vlm::io::TarMember;
using vlm::io::TarRangeReader;
using vlm::testing::LongNames;
using vlm::testing::TarWriter;
using vlm::testing::TempDir;

namespace {

const std::string kPrepared = std::string(VLM_SOURCE_DIR) + "/tests/data/energon_prepared";

nlohmann::json load_json(const std::string& path) {
  return nlohmann::json::parse(vlm::testing::read_file(path));
}

std::vector<TarMember> all_members(const ReadOnlyFile& f, uint64_t begin, uint64_t end,
                                   std::vector<std::string>* data = nullptr) {
  TarRangeReader r(f, begin, end);
  std::vector<TarMember> out;
  TarMember m;
  while (r.next(&m)) {
    if (data) data->push_back(r.read_data(m));
    out.push_back(m);
  }
  return out;
}

// The TarError that f throws (its kind and message), or fails the test.
template <typename F> TarError tar_error_of(F&& f) {
  try {
    f();
  } catch (const TarError& e) {
    return e;
  }
  FAIL("no TarError thrown");
  return TarError(TarError::Kind::corrupt, "", 0, "");
}

} // namespace

TEST_CASE("tar: member names split like energon's regexes", "[io][tar]") {
  nlohmann::json vectors = load_json(kPrepared + "/name_vectors.json");
  REQUIRE(vectors["vectors"].size() > 20);
  for (const auto& v : vectors["vectors"]) {
    std::string name = v["name"];
    INFO("name '" << name << "'");
    CHECK(vlm::io::tar_is_meta_name(name) == v["skip_meta"].get<bool>());
    std::string_view key, part;
    bool ok = vlm::io::tar_split_name(name, &key, &part);
    CHECK(ok == !v["key"].is_null());
    if (ok && !v["key"].is_null()) {
      CHECK(std::string(key) == v["key"].get<std::string>());
      CHECK(std::string(part) == v["part"].get<std::string>());
    }
  }
}

TEST_CASE("tar: ustar, GNU and PAX headers, base-256 and PAX sizes", "[io][tar]") {
  TempDir tmp("tar");
  const std::string long_gnu = "dir/" + std::string(150, 'g') + ".json";
  const std::string long_pax = "dir/" + std::string(120, 'p') + ".seg.mask.png";
  const std::string big(5000, 'B');
  TarWriter gnu(LongNames::gnu);
  uint64_t o_dir = gnu.add_dir("dir/");
  uint64_t o_long = gnu.add_file(long_gnu, "{}");
  uint64_t o_b256 = gnu.add_file_base256_size("dir/b256.bin", big);
  TarWriter pax(LongNames::pax);
  uint64_t o_plong = pax.add_file(long_pax, "png");
  uint64_t o_psize = pax.add_file_pax_size("dir/paxsize.txt", "sized by PAX");
  uint64_t o_global = pax.add_pax_global({{"comment", "global"}});
  uint64_t o_after = pax.add_file("dir/after.txt", "after g");

  struct Want {
    std::string name;
    char type;
    uint64_t offset;
    std::string data;
  };
  std::vector<std::pair<TarWriter*, std::vector<Want>>> cases = {
      {&gnu,
       {{"dir/", '5', o_dir, ""},
        {long_gnu, '0', o_long, "{}"},
        {"dir/b256.bin", '0', o_b256, big}}},
      {&pax,
       {{long_pax, '0', o_plong, "png"},
        {"dir/paxsize.txt", '0', o_psize, "sized by PAX"},
        // A 'g' header belongs to no member: the next member's offset is its own header.
        {"dir/after.txt", '0', o_global + 1024, "after g"}}},
  };
  for (auto& [writer, want] : cases) {
    std::string path = tmp.path("t.tar");
    vlm::testing::write_file(path, writer->finish());
    ReadOnlyFile f(path);
    std::vector<std::string> data;
    std::vector<TarMember> got = all_members(f, 0, f.size(), &data);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); i++) {
      INFO("member " << i);
      CHECK(got[i].name == want[i].name);
      CHECK(got[i].type == want[i].type);
      CHECK(got[i].offset == want[i].offset);
      CHECK(got[i].size == want[i].data.size());
      CHECK(data[i] == want[i].data);
    }
  }
  CHECK(o_after == o_global + 1024);
}

TEST_CASE("tar: a small read buffer and large members", "[io][tar]") {
  TempDir tmp("tar");
  TarWriter w;
  std::string a(70000, 'a'), b(3000, 'b');
  for (int i = 0; i < 1000; i++) a[size_t(i) * 70] = char('0' + i % 10);
  w.add_file("000.big", a);
  w.add_file("000.small", b);
  w.add_file("001.skipped", std::string(9000, 's'));
  w.add_file("002.last", "z");
  std::string path = tmp.path("big.tar");
  vlm::testing::write_file(path, w.finish());
  ReadOnlyFile f(path);
  TarRangeReader r(f, 0, f.size(), 2048); // smaller than most members
  TarMember m;
  REQUIRE(r.next(&m));
  CHECK(r.read_data(m) == a);
  REQUIRE(r.next(&m));
  CHECK(r.read_data(m) == b);
  REQUIRE(r.next(&m)); // data never read
  REQUIRE(r.next(&m));
  CHECK(m.name == "002.last");
  CHECK(r.read_data(m) == "z");
  CHECK_FALSE(r.next(&m));
  CHECK(r.position() == w.size()); // stopped at the end-of-archive block
}

TEST_CASE("tar: fx_edge groups into energon's samples and index", "[io][tar]") {
  for (LongNames ln : {LongNames::gnu, LongNames::pax}) {
    TempDir tmp("tar");
    vlm::testing::write_fx_edge(tmp.path(), ln);
    ReadOnlyFile f(tmp.path("edge.tar"));
    uint64_t end = 0;
    auto samples = vlm::io::scan_tar_samples(f, 0, f.size(), &end);
    REQUIRE(samples.size() == 3);
    CHECK(samples[0].key == "sub/000000");
    CHECK(samples[0].part_names() == std::vector<std::string>{"json", "seg.mask.png"});
    CHECK(samples[1].key == vlm::testing::fx_edge_long_key());
    CHECK(samples[1].part_names() == std::vector<std::string>{"txt"});
    CHECK(samples[2].key == "sub/000002");
    std::vector<uint64_t> idx = {samples[0].offset, samples[1].offset, samples[2].offset, end};
    CHECK(idx == std::vector<uint64_t>{1536, 5120, 7168, 8192}); // docs/energon-format.md §1.5
    CHECK(idx == vlm::testing::read_index(tmp.path("edge.tar.idx")));
  }
}

TEST_CASE("tar: scanning energon-prepared shards reproduces energon's .tar.idx", "[io][tar]") {
  nlohmann::json manifest = load_json(kPrepared + "/manifest.json");
  std::map<std::string, std::vector<std::string>> keys_by_shard;
  for (const auto& sp : manifest["splits"]["split.yaml"].items())
    for (const auto& s : sp.value()["samples"]) keys_by_shard[s["shard"]].push_back(s["key"]);
  REQUIRE(manifest["tar_idx"].size() == 3);
  for (const auto& [shard, idx_json] : manifest["tar_idx"].items()) {
    INFO("shard " << shard);
    ReadOnlyFile f(kPrepared + "/dataset/" + shard);
    uint64_t end = 0;
    auto samples = vlm::io::scan_tar_samples(f, 0, f.size(), &end);
    std::vector<uint64_t> idx;
    std::vector<std::string> keys;
    for (const auto& s : samples) {
      idx.push_back(s.offset);
      keys.push_back(s.key);
    }
    idx.push_back(end);
    CHECK(idx == idx_json.get<std::vector<uint64_t>>());
    CHECK(keys == keys_by_shard[shard]);
  }
}

TEST_CASE("tar: malformed archives are TarErrors naming file and offset", "[io][tar]") {
  TempDir tmp("tar");
  std::string path = tmp.path("bad.tar");
  TarWriter w;
  w.add_file("000.json", "{}");
  w.add_file("000.jpg", std::string(600, 'j'));
  const std::string good = w.finish(0);

  SECTION("truncated inside a header") {
    vlm::testing::write_file(path, good.substr(0, 1024 + 300));
    ReadOnlyFile f(path);
    TarError e = tar_error_of([&] { all_members(f, 0, 4096); });
    CHECK(e.kind == TarError::Kind::truncated);
    CHECK(e.offset == 1024);
    CHECK_THAT(e.what(), Contains(path) && Contains("byte 1024") && Contains("end of the file"));
  }
  SECTION("truncated inside member data") {
    vlm::testing::write_file(path, good.substr(0, 1024 + 512 + 100));
    ReadOnlyFile f(path);
    TarError e = tar_error_of([&] { all_members(f, 0, f.size()); });
    CHECK(e.kind == TarError::Kind::truncated);
    CHECK_THAT(e.what(), Contains("000.jpg") && Contains("600 data bytes"));
  }
  SECTION("data past the end of the range") {
    vlm::testing::write_file(path, good);
    ReadOnlyFile f(path);
    TarError e = tar_error_of([&] {
      TarRangeReader r(f, 0, 1024 + 512 + 100);
      TarMember m;
      while (r.next(&m)) r.read_data(m);
    });
    CHECK(e.kind == TarError::Kind::truncated);
    CHECK_THAT(e.what(), Contains("000.jpg") && Contains("end of the range"));
  }
  SECTION("garbage where a header should be") {
    std::string bad = good;
    bad.replace(1024, 512, std::string(512, 'x'));
    vlm::testing::write_file(path, bad);
    ReadOnlyFile f(path);
    TarError e = tar_error_of([&] { all_members(f, 0, f.size()); });
    CHECK(e.kind == TarError::Kind::corrupt);
    CHECK(e.offset == 1024);
    CHECK_THAT(e.what(), Contains("bad checksum") && Contains("byte 1024"));
  }
  SECTION("a range starting inside member data") {
    vlm::testing::write_file(path, good);
    ReadOnlyFile f(path);
    TarError e = tar_error_of([&] { all_members(f, 1536, f.size()); });
    CHECK(e.kind == TarError::Kind::corrupt);
    CHECK(e.offset == 1536);
  }
  SECTION("PAX records parsed as leniently as tarfile; oversized extended headers") {
    // A record whose length overruns the data is cut at its end instead of rejected (tarfile is
    // lenient there too); a record of length 0 is an error, as in tarfile.
    auto with_pax = [&](const std::string& rec) {
      return vlm::testing::tar_header("pax", rec.size(), 'x', LongNames::pax) + rec +
             std::string(512 - rec.size(), '\0') + good;
    };
    vlm::testing::write_file(path, with_pax("99 path=renamed.json"));
    ReadOnlyFile lenient(path);
    CHECK(all_members(lenient, 0, lenient.size())[0].name == "renamed.json");
    vlm::testing::write_file(path, with_pax("0 path=x\n"));
    ReadOnlyFile f(path);
    TarError e = tar_error_of([&] { all_members(f, 0, f.size()); });
    CHECK(e.kind == TarError::Kind::corrupt);
    CHECK_THAT(e.what(), Contains("malformed PAX records"));
    std::string bad;

    bad = vlm::testing::tar_header("././@LongLink", uint64_t(1) << 40, 'L', LongNames::gnu,
                                   /*base256_size=*/true) +
          good;
    vlm::testing::write_file(path, bad);
    ReadOnlyFile f2(path);
    e = tar_error_of([&] { all_members(f2, 0, f2.size()); });
    CHECK(e.kind == TarError::Kind::corrupt);
    CHECK_THAT(e.what(), Contains("GNU long name"));
  }
  SECTION("an extended header with no member after it") {
    std::string rec = vlm::testing::pax_record("path", "a.txt");
    std::string bad = vlm::testing::tar_header("pax", rec.size(), 'x', LongNames::pax) + rec +
                      std::string(512 - rec.size(), '\0') + std::string(1024, '\0');
    vlm::testing::write_file(path, bad);
    ReadOnlyFile f(path);
    TarError e = tar_error_of([&] { all_members(f, 0, f.size()); });
    CHECK_THAT(e.what(), Contains("zero block after an extended header"));
  }
}

TEST_CASE("tar: ReadOnlyFile errors name the path", "[io][tar]") {
  TempDir tmp("tar");
  std::string missing = tmp.path("nope.tar");
  try {
    ReadOnlyFile f(missing);
    FAIL("no error");
  } catch (const vlm::Error& e) {
    CHECK_THAT(e.what(), Contains(missing) && Contains("No such file"));
  }
  try {
    ReadOnlyFile f(tmp.path());
    FAIL("no error");
  } catch (const vlm::Error& e) {
    CHECK_THAT(e.what(), Contains("not a regular file"));
  }
}
