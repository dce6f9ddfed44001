#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "io/state/safetensors.h"
#include "src/base/check.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using vlm::DType;
using vlm::Shape;
using vlm::io::SafetensorsFile;
using vlm::io::TensorInfo;

using vlm::testing::error_of;

namespace {

using TempDir = vlm::testing::TempDir;

// The message of the vlm::Error that f throws, or "" when it does not throw one.
// A file with a hand-made header: the 8-byte length, the header text as given, then `data`.
std::string write_raw(const TempDir& tmp, const std::string& name, const std::string& header,
                      const std::string& data, int64_t header_len = -1) {
  std::string path = tmp.file(name);
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header_len < 0 ? header.size() : uint64_t(header_len);
  for (int i = 0; i < 8; i++) out.put(char((n >> (8 * i)) & 0xff));
  out << header << data;
  return path;
}

std::vector<unsigned char> bytes_of(const TensorInfo& t) {
  auto p = static_cast<const unsigned char*>(t.data);
  return std::vector<unsigned char>(p, p + t.nbytes);
}

} // namespace

TEST_CASE("safetensors dtype names round-trip", "[io][safetensors]") {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64,
                  DType::u8, DType::boolean})
    CHECK(vlm::io::safetensors_dtype(vlm::io::safetensors_dtype_name(t)) == t);
  CHECK(std::string(vlm::io::safetensors_dtype_name(DType::bf16)) == "BF16");
  CHECK(std::string(vlm::io::safetensors_dtype_name(DType::boolean)) == "BOOL");
  CHECK_THAT(error_of([] { vlm::io::safetensors_dtype("F8_E4M3"); }),
             Contains("F8_E4M3") && Contains("BF16"));
}

TEST_CASE("safetensors write/read round-trip", "[io][safetensors]") {
  TempDir tmp;
  std::vector<float> f32 = {1.5f, -2.f, 3.25f, 0.f, 1e-8f, 7.f};
  std::vector<vlm::bf16> bf(4);
  for (int i = 0; i < 4; i++) bf[i] = vlm::bf16(float(i) - 1.5f);
  double scalar = 3.141592653589793;
  std::vector<int64_t> i64 = {-1, 0, int64_t(1) << 40};
  std::vector<uint8_t> u8 = {0, 1, 2, 254, 255};
  std::vector<int32_t> i32 = {7, -7};
  std::vector<uint8_t> flags = {1, 0, 0, 1};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000}; // 1.0, -2.0

  // Names sort in write order, so file order == alphabetical order here.
  std::vector<TensorInfo> in = {
      {"a.f32", DType::f32, {2, 3}, f32.data(), f32.size() * 4},
      {"b.bf16", DType::bf16, {4}, bf.data(), bf.size() * 2},
      {"c.scalar", DType::f64, {}, &scalar, 8},
      {"d.empty", DType::f32, {0, 5}, nullptr, 0},
      {"e.i64", DType::i64, {3}, i64.data(), i64.size() * 8},
      {"f.u8", DType::u8, {5}, u8.data(), u8.size()},
      {"g.i32", DType::i32, {1, 2}, i32.data(), i32.size() * 4},
      {"h.bool", DType::boolean, {2, 2}, flags.data(), flags.size()},
      {"i.f16", DType::f16, {1, 1, 2}, f16.data(), f16.size() * 2},
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "héllo \"quoted\""}};
  std::string path = tmp.file("model.safetensors");
  vlm::io::write_safetensors(path, in, meta);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  // Header length is a multiple of 8, so the data region starts 8-byte aligned.
  {
    std::ifstream raw(path, std::ios::binary);
    unsigned char len[8];
    raw.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= uint64_t(len[i]) << (8 * i);
    CHECK(n % 8 == 0);
    uint64_t total = 0;
    for (const auto& t : in) total += t.nbytes;
    CHECK(fs::file_size(path) == 8 + n + total);
  }

  SafetensorsFile f(path);
  CHECK(f.path() == path);
  CHECK(f.metadata() == meta);
  std::vector<std::string> expected_names;
  for (const auto& t : in) expected_names.push_back(t.name);
  CHECK(f.names() == expected_names);
  for (const auto& t : in) {
    INFO(t.name);
    REQUIRE(f.contains(t.name));
    const TensorInfo& r = f.get(t.name);
    CHECK(r.name == t.name);
    CHECK(r.dtype == t.dtype);
    CHECK(r.shape == t.shape);
    CHECK(r.nbytes == t.nbytes);
    CHECK(bytes_of(r) == bytes_of(t));
  }
  CHECK_FALSE(f.contains("missing"));
  CHECK(reinterpret_cast<uintptr_t>(f.get("a.f32").data) % 8 == 0);
  float first;
  std::memcpy(&first, f.get("a.f32").data, 4);
  CHECK(first == 1.5f);

  // Moving keeps the mapping (and the data pointers) alive.
  const void* p = f.get("e.i64").data;
  SafetensorsFile moved(std::move(f));
  CHECK(moved.get("e.i64").data == p);
  SafetensorsFile assigned(path);
  assigned = std::move(moved);
  CHECK(assigned.get("e.i64").data == p);
  CHECK(std::memcmp(assigned.get("e.i64").data, i64.data(), 24) == 0);
}

TEST_CASE("safetensors: no tensors, no metadata, overwrite in place", "[io][safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("empty.safetensors");
  vlm::io::write_safetensors(path, {});
  {
    SafetensorsFile f(path);
    CHECK(f.names().empty());
    CHECK(f.metadata().empty());
  }
  std::vector<int32_t> v = {1, 2, 3};
  vlm::io::write_safetensors(path, {{"x", DType::i32, {3}, v.data(), 12}});
  SafetensorsFile f(path);
  CHECK(f.names() == std::vector<std::string>{"x"});
}

TEST_CASE("safetensors names() is in data-offset order", "[io][safetensors]") {
  TempDir tmp;
  std::string hdr = R"({"z":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                    R"("a":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})";
  SafetensorsFile f(write_raw(tmp, "order.safetensors", hdr, "xyz"));
  CHECK(f.names() == std::vector<std::string>{"z", "a"});
  CHECK(*static_cast<const char*>(f.get("a").data) == 'z');
}

TEST_CASE("safetensors missing key lists available names", "[io][safetensors]") {
  TempDir tmp;
  std::vector<uint8_t> b(12);
  std::vector<TensorInfo> in;
  for (int i = 0; i < 12; i++) in.push_back({"w" + std::to_string(i), DType::u8, {1}, &b[i], 1});
  std::string path = tmp.file("many.safetensors");
  vlm::io::write_safetensors(path, in);
  SafetensorsFile f(path);
  std::string msg = error_of([&] { f.get("model.nope.weight"); });
  CHECK_THAT(msg, Contains("model.nope.weight") && Contains(path) && Contains("w0") &&
                      Contains("w9") && Contains("2 more"));
  CHECK_THAT(msg, !Contains("w10"));
}

TEST_CASE("safetensors reader rejects bad files with clear errors", "[io][safetensors]") {
  TempDir tmp;
  const std::string good_entry = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string data16(16, '\0');

  SECTION("missing file") {
    std::string path = tmp.file("absent.safetensors");
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains(path) && Contains("cannot open"));
  }
  SECTION("file shorter than the length field") {
    std::string path = tmp.file("short.safetensors");
    std::ofstream(path, std::ios::binary) << "abc";
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains(path) && Contains("too short"));
  }
  SECTION("header length beyond the file") {
    std::string path = write_raw(tmp, "hlen.safetensors", good_entry, data16, 100000);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains(path) && Contains("header length 100000 exceeds"));
  }
  SECTION("truncated data region") {
    std::string path = tmp.file("trunc.safetensors");
    std::vector<float> v(64, 1.f);
    vlm::io::write_safetensors(path, {{"layer.weight", DType::f32, {8, 8}, v.data(), 256}});
    fs::resize_file(path, fs::file_size(path) - 10);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains(path) && Contains("'layer.weight'") && Contains("out of range"));
  }
  SECTION("invalid JSON") {
    std::string path = write_raw(tmp, "json.safetensors", R"({"t": {"dtype": )", data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains(path) && Contains("invalid JSON"));
  }
  SECTION("header is not an object") {
    std::string path = write_raw(tmp, "arr.safetensors", "[1, 2]", "");
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains("not an object"));
  }
  SECTION("offsets out of range") {
    std::string hdr = R"({"big":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})";
    std::string path = write_raw(tmp, "range.safetensors", hdr, data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains(path) && Contains("'big'") && Contains("out of range"));
  }
  SECTION("offsets inconsistent with dtype and shape") {
    std::string hdr = R"({"t":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,16]}})";
    std::string path = write_raw(tmp, "size.safetensors", hdr, data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains("'t'") && Contains("16 bytes") && Contains("needs 8"));
  }
  SECTION("begin after end") {
    std::string hdr = R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})";
    std::string path = write_raw(tmp, "rev.safetensors", hdr, data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains("'t'") && Contains("[8, 4]"));
  }
  SECTION("unknown dtype") {
    std::string hdr = R"({"q.weight":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,1]}})";
    std::string path = write_raw(tmp, "dtype.safetensors", hdr, data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains(path) && Contains("'q.weight'") && Contains("Q4_K"));
  }
  SECTION("missing field") {
    std::string hdr = R"({"t":{"dtype":"F32","data_offsets":[0,16]}})";
    std::string path = write_raw(tmp, "field.safetensors", hdr, data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains("'t'") && Contains("missing 'shape'"));
  }
  SECTION("negative dimension") {
    std::string hdr = R"({"t":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})";
    std::string path = write_raw(tmp, "neg.safetensors", hdr, data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains("'t'") && Contains("non-negative"));
  }
  SECTION("shape whose byte size overflows") {
    std::string hdr =
        R"({"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,16]}})";
    std::string path = write_raw(tmp, "ovf.safetensors", hdr, data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains("'t'") && Contains("overflows"));
  }
  SECTION("overlapping tensors") {
    std::string hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
    std::string path = write_raw(tmp, "overlap.safetensors", hdr, data16);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains("'b'") && Contains("overlaps tensor 'a'"));
  }
  SECTION("non-string metadata") {
    std::string hdr = R"({"__metadata__":{"step":5}})";
    std::string path = write_raw(tmp, "meta.safetensors", hdr, "");
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }),
               Contains(path) && Contains("'step'") && Contains("not a string"));
  }
}

TEST_CASE("safetensors writer rejects inconsistent input", "[io][safetensors]") {
  TempDir tmp;
  std::vector<float> v(4);
  std::string path = tmp.file("w.safetensors");
  CHECK_THAT(error_of([&] {
               vlm::io::write_safetensors(path, {{"t", DType::f32, {2, 2}, v.data(), 12}});
             }),
             Contains(path) && Contains("'t'") && Contains("needs 16"));
  CHECK_THAT(error_of([&] {
               vlm::io::write_safetensors(path, {{"t", DType::f32, {1}, v.data(), 4},
                                                 {"t", DType::f32, {1}, v.data(), 4}});
             }),
             Contains("duplicate"));
  std::string bad_dir = tmp.file("no/such/dir/x.safetensors");
  CHECK_THAT(error_of([&] {
               vlm::io::write_safetensors(bad_dir, {{"t", DType::f32, {1}, v.data(), 4}});
             }),
             Contains(bad_dir));
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("safetensors written piece by piece is the file write_safetensors writes, and nothing "
          "is in place before finish()",
          "[io][safetensors]") {
  TempDir tmp;
  std::vector<float> a = {1.5f, -0.0f, 3.25f, 7.0f};
  std::vector<uint16_t> b = {0x3f80, 0xc000, 0x7fc0};
  const std::vector<TensorInfo> tensors = {{"a", DType::f32, {2, 2}, a.data(), 16},
                                           {"empty", DType::f32, {0, 3}, nullptr, 0},
                                           {"b", DType::bf16, {3}, b.data(), 6}};
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  const std::string whole = tmp.file("whole.safetensors"), pieces = tmp.file("p.safetensors");
  vlm::io::write_safetensors(whole, tensors, meta);
  {
    std::vector<TensorInfo> headers = tensors;
    for (TensorInfo& t : headers) t.data = nullptr; // the header alone
    vlm::io::SafetensorsWriter w(pieces, headers, meta);
    w.write(a.data(), 8); // a's first row, then its second
    w.write(a.data() + 2, 8);
    CHECK_FALSE(fs::exists(pieces));
    w.write(b.data(), 6);
    w.finish();
  }
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  CHECK(read(pieces) == read(whole));

  // A piece into the next tensor, too many bytes, an early finish; destroyed unfinished: nothing
  // left behind.
  const std::string path = tmp.file("bad.safetensors");
  {
    vlm::io::SafetensorsWriter w(path, tensors, meta);
    w.write(a.data(), 12);
    CHECK_THAT(error_of([&] { w.write(a.data(), 8); }),
               Contains(path) && Contains("'a'") && Contains("8 bytes given, 4 left of its 16"));
    w.write(a.data(), 4);
    CHECK_THAT(error_of([&] { w.finish(); }),
               Contains("finished at tensor 'b'") && Contains("3 of 3, 0 bytes written"));
    w.write(b.data(), 6);
    CHECK_THAT(error_of([&] { w.write(b.data(), 2); }), Contains("all 3 tensors are written"));
  }
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));
}
