// io/image_decode and io/image_preprocess against the reference pipeline: Energon's PIL decode +
// transformers' Qwen2VLImageProcessor (torchvision backend). Golden data:
// tools/golden/gen_images.py
// -> tests/data/images/ (the image files) and tests/golden/images.safetensors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "io/image/decode.h"
#include "io/image/preprocess.h"
#include "io/image/processor_config.h"
#include "io/state/safetensors.h"
#include "tests/temp_dir.h"

using Catch::Matchers::Contains;
using vlm::io::decode_image;
using vlm::io::Image;
using vlm::io::ImageError;
using vlm::io::ImageErrorKind;
using vlm::io::ImageProcessorConfig;
using vlm::io::preprocess_image;
using vlm::io::SafetensorsFile;
using vlm::io::smart_resize;

namespace {

const std::string kImageDir = std::string(VLM_SOURCE_DIR) + "/tests/data/images/";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

const SafetensorsFile& golden() {
  static const SafetensorsFile file(std::string(VLM_SOURCE_DIR) +
                                    "/tests/golden/images.safetensors");
  return file;
}

template <typename T> std::vector<T> golden_values(const std::string& name) {
  const auto& info = golden().get(name);
  std::vector<T> v(info.nbytes / sizeof(T));
  if (info.nbytes) std::memcpy(v.data(), info.data, info.nbytes);
  return v;
}

std::string extension(const std::string& file) { return file.substr(file.rfind('.') + 1); }

// Decodes tests/data/images/<file>, expecting an ImageError; returns it.
ImageError decode_error(const std::string& file, std::string hint = "") {
  if (hint.empty()) hint = extension(file);
  try {
    decode_image(read_bytes(kImageDir + file), hint);
  } catch (const ImageError& e) {
    return e;
  }
  FAIL("decoding " << file << " did not throw an ImageError");
  return ImageError(ImageErrorKind::corrupt, "");
}

// Every "decode.<file>.rgb" tensor of the golden file.
std::vector<std::string> golden_decode_files() {
  std::vector<std::string> files;
  for (const auto& name : golden().names())
    if (name.rfind("decode.", 0) == 0) files.push_back(name.substr(7, name.size() - 7 - 4));
  return files;
}

} // namespace

TEST_CASE("image: decode equals the reference RGB (PIL + processor conversion)") {
  const auto files = golden_decode_files();
  REQUIRE(files.size() >= 30);
  int jpegs = 0, pngs = 0;
  for (const auto& file : files) {
    INFO("image " << file);
    const auto& info = golden().get("decode." + file + ".rgb");
    REQUIRE(info.shape.size() == 3);
    const Image img = decode_image(read_bytes(kImageDir + file), extension(file));
    REQUIRE(img.height == info.shape[0]);
    REQUIRE(img.width == info.shape[1]);
    const auto expected = golden_values<uint8_t>("decode." + file + ".rgb");
    REQUIRE(img.rgb.size() == expected.size());
    // Both sides run libjpeg-turbo's ISLOW IDCT with fancy upsampling (PIL: 3.x, here: the
    // system's 2.1) and PNG is lossless: the pixels must be identical.
    int max_diff = 0;
    for (size_t i = 0; i < expected.size(); i++)
      max_diff = std::max(max_diff, std::abs(int(img.rgb[i]) - int(expected[i])));
    CHECK(max_diff == 0);
    (extension(file) == "png" ? pngs : jpegs)++;
  }
  CHECK(jpegs >= 9);
  CHECK(pngs >= 25);
}

TEST_CASE("image: the magic bytes decide the format, not the hint") {
  const auto png = decode_image(read_bytes(kImageDir + "rgb8_19x13.png"), "jpg");
  const auto expected = golden_values<uint8_t>("decode.rgb8_19x13.png.rgb");
  CHECK(png.rgb == expected);
  const auto jpg = decode_image(read_bytes(kImageDir + "wide_97x31.jpg"), "png");
  CHECK(jpg.width == 97);
  CHECK(jpg.height == 31);
  CHECK(vlm::io::sniff_image_format(read_bytes(kImageDir + "unsupported_8x8.gif")) ==
        vlm::io::ImageFormat::gif);
}

TEST_CASE("image: bad input is refused with a reason the loader can count") {
  // The reference (PIL) refuses every one of these too: the generator records its exception.
  const auto& meta = golden().metadata();
  struct Bad {
    const char* file;
    ImageErrorKind kind;
    const char* message;
  };
  const Bad bad[] = {
      {"bad_truncated.jpg", ImageErrorKind::truncated, "truncated JPEG data"},
      {"bad_truncated_progressive.jpg", ImageErrorKind::truncated, "truncated JPEG data"},
      {"bad_header.jpg", ImageErrorKind::truncated, "truncated JPEG data"},
      {"bad_truncated.png", ImageErrorKind::truncated, "truncated PNG data"},
      {"bad_zlib.png", ImageErrorKind::corrupt, "corrupt PNG data"},
      {"bad_ancillary_crc.png", ImageErrorKind::corrupt, "corrupt PNG data"},
      {"bad_empty.png", ImageErrorKind::empty, "no data"},
      {"bad_unknown.jpg", ImageErrorKind::unknown_format, "not a JPEG or PNG image"},
  };
  for (const auto& b : bad) {
    INFO("file " << b.file);
    CHECK(meta.count(std::string("bad.") + b.file) == 1);
    const ImageError e = decode_error(b.file);
    CHECK(e.kind() == b.kind);
    CHECK_THAT(e.what(), Contains(b.message));
    CHECK_THAT(e.what(), Contains("format hint '" + extension(b.file) + "'"));
  }
  const std::size_t truncated_size = read_bytes(kImageDir + "bad_truncated.jpg").size();
  CHECK_THAT(decode_error("bad_truncated.jpg").what(),
             Contains(std::to_string(truncated_size) + " bytes"));
  CHECK_THAT(decode_error("bad_unknown.jpg").what(), Contains("first bytes 74 68 69 73"));

  // Formats PIL reads but this decoder does not.
  for (const char* file : {"unsupported_8x8.gif", "unsupported_8x8.bmp"}) {
    INFO("file " << file);
    CHECK(meta.count(std::string("unsupported.") + file) == 1);
    const ImageError e = decode_error(file);
    CHECK(e.kind() == ImageErrorKind::unsupported_format);
    CHECK_THAT(e.what(), Contains("images are not supported (only JPEG and PNG)"));
  }

  // The decompression-bomb limit, checked from the header before any pixel is decoded.
  for (const char* file : {"large_200x300.jpg", "pal8_pil_50x70.png"}) {
    INFO("file " << file);
    try {
      decode_image(read_bytes(kImageDir + file), "x", 1000);
      FAIL("no error");
    } catch (const ImageError& e) {
      CHECK(e.kind() == ImageErrorKind::too_large);
      CHECK_THAT(e.what(), Contains("exceeds the decode limit of 1000 pixels"));
    }
  }
  CHECK(std::string(vlm::io::image_error_kind_name(ImageErrorKind::truncated)) == "truncated");
  CHECK(std::string(vlm::io::image_error_kind_name(ImageErrorKind::bad_size)) == "bad_size");
  // An ImageError is a vlm::Error: generic handlers catch it.
  CHECK_THROWS_AS(decode_image("", "jpg"), vlm::Error);
}

namespace {

// CRC-32 of PNG chunks (ISO 3309), for headers forged below.
uint32_t png_crc(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

// `png` with its IHDR width and height replaced (the CRC fixed), the image data left as it is.
std::string with_png_size(std::string png, uint32_t width, uint32_t height) {
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) png[at + size_t(i)] = char((v >> (24 - 8 * i)) & 0xff);
  };
  REQUIRE(png.substr(12, 4) == "IHDR"); // 8-byte signature, then length and type
  put32(16, width);
  put32(20, height);
  put32(29, png_crc(png.substr(12, 17))); // type + 13 data bytes
  return png;
}

} // namespace

TEST_CASE("image: sizes from the header are checked before the buffers are allocated") {
  // A 16-bit RGBA header just under the pixel limit would zero-fill 1.4 GB for a file of a few
  // hundred bytes: bytes per pixel count, and no PNG can expand more than deflate allows.
  const std::string rgba16 = read_bytes(kImageDir + "rgba16_17x11.png");
  const uint32_t side = 13000; // 169 M pixels < kMaxDecodePixels
  REQUIRE(int64_t(side) * side < vlm::io::kMaxDecodePixels);
  try {
    decode_image(with_png_size(rgba16, side, side), "png");
    FAIL("no error");
  } catch (const ImageError& e) {
    CHECK(e.kind() == ImageErrorKind::too_large);
    CHECK_THAT(e.what(), Contains("bytes to decode, more than the limit"));
  }
  // 8-bit RGB within the byte limit but far more than the file can hold: truncated, at once.
  const std::string rgb8 = read_bytes(kImageDir + "rgb8_19x13.png");
  try {
    decode_image(with_png_size(rgb8, 8000, 8000), "png");
    FAIL("no error");
  } catch (const ImageError& e) {
    CHECK(e.kind() == ImageErrorKind::truncated);
    CHECK_THAT(e.what(), Contains("cannot be stored in"));
  }
  // The forging itself leaves a decodable file when the size is the real one.
  CHECK(decode_image(with_png_size(rgb8, 19, 13), "png").width == 19);
}

TEST_CASE("image: smart_resize equals transformers' for sizes, budgets and extreme aspects") {
  const auto in = golden_values<int64_t>("smart_resize.inputs");
  const auto out = golden_values<int64_t>("smart_resize.outputs");
  REQUIRE(in.size() == out.size() * 2);
  REQUIRE(in.size() >= 4 * 1000);
  int errors = 0;
  for (size_t i = 0; i < out.size() / 2; i++) {
    const int64_t h = in[4 * i], w = in[4 * i + 1];
    ImageProcessorConfig cfg;
    cfg.min_pixels = in[4 * i + 2];
    cfg.max_pixels = in[4 * i + 3];
    INFO("H=" << h << " W=" << w << " min_pixels=" << cfg.min_pixels
              << " max_pixels=" << cfg.max_pixels);
    if (out[2 * i] < 0) {
      errors++;
      try {
        smart_resize(h, w, cfg);
        FAIL("transformers raises, smart_resize did not");
      } catch (const ImageError& e) {
        CHECK(e.kind() == ImageErrorKind::bad_size);
        CHECK_THAT(e.what(), Contains("exceeds 200"));
      }
    } else {
      const auto [rh, rw] = smart_resize(h, w, cfg);
      CHECK(rh == out[2 * i]);
      CHECK(rw == out[2 * i + 1]);
    }
  }
  CHECK(errors > 0); // the table covers aspect ratios above 200

  // Values from docs/qwen-models.md §4 and Python's round-half-to-even.
  const ImageProcessorConfig qwen;
  CHECK(smart_resize(768, 1024, qwen) == std::pair<int64_t, int64_t>{768, 1024});
  ImageProcessorConfig no_min = qwen;
  no_min.min_pixels = 0;
  CHECK(smart_resize(48, 80, no_min) == std::pair<int64_t, int64_t>{64, 64}); // 1.5->2, 2.5->2
  CHECK_THROWS_WITH(smart_resize(16, 16, no_min), Contains("resizes to zero size"));
  CHECK_THROWS_WITH(smart_resize(0, 16, qwen), Contains("zero size 0x16 (HxW)"));
  ImageProcessorConfig bad = qwen;
  bad.merge_size = 0;
  CHECK_THROWS_WITH(smart_resize(32, 32, bad), Contains("must be positive"));
}

TEST_CASE("image: preprocess equals the HF processor's pixel_values and grid") {
  const auto& meta = golden().metadata();
  int cases = 0;
  double max_err_all = 0.0;
  for (const auto& [key, file] : meta) {
    if (key.rfind("pre.", 0) != 0) continue;
    const std::string name = key.substr(0, key.size() - 5); // "pre.<case>"
    INFO("case " << name << " (" << file << ")");
    const auto min_max = golden_values<int64_t>(name + ".min_max_pixels");
    ImageProcessorConfig cfg;
    cfg.min_pixels = min_max[0];
    cfg.max_pixels = min_max[1];
    const auto out = preprocess_image(decode_image(read_bytes(kImageDir + file), ""), cfg);

    const auto grid = golden_values<int64_t>(name + ".grid_thw");
    REQUIRE(grid.size() == 3);
    CHECK(out.grid_thw[0] == grid[0]);
    CHECK(out.grid_thw[1] == grid[1]);
    CHECK(out.grid_thw[2] == grid[2]);
    CHECK(out.num_tokens() == grid[0] * grid[1] * grid[2] / 4);
    const auto& info = golden().get(name + ".pixel_values");
    REQUIRE(info.shape == vlm::Shape{out.num_patches, out.patch_dim});
    CHECK(out.patch_dim == 1536);
    const auto expected = golden_values<float>(name + ".pixel_values");
    double max_err = 0.0;
    for (size_t i = 0; i < expected.size(); i++)
      max_err = std::max(max_err, double(std::abs(out.pixel_values[i] - expected[i])));
    // The resize reproduces torchvision's integer arithmetic and normalization is the same
    // float32 expression, so the values are bit-identical (measured max error: 0).
    CHECK(max_err == 0.0);
    max_err_all = std::max(max_err_all, max_err);
    cases++;
  }
  CHECK(cases >= 8);
  CHECK(max_err_all == 0.0);
}

TEST_CASE("image: patches come in merge-window order with (c, t, y, x) inside") {
  // 96x64 (HxW) image: a 6x4 grid of 16x16 patches, each filled with a value naming its row and
  // column, different per channel. Already a multiple of 32 within budget: no resize.
  Image img;
  img.height = 96;
  img.width = 64;
  img.rgb.resize(96 * 64 * 3);
  for (int y = 0; y < 96; y++)
    for (int x = 0; x < 64; x++)
      for (int c = 0; c < 3; c++)
        img.rgb[(y * 64 + x) * 3 + c] = uint8_t(40 * c + 8 * (y / 16) + x / 16);
  ImageProcessorConfig cfg;
  cfg.min_pixels = 1024;
  cfg.max_pixels = 8192;
  const auto out = preprocess_image(img, cfg);
  REQUIRE(out.grid_thw == std::array<int64_t, 3>{1, 6, 4});
  REQUIRE(out.num_patches == 24);
  CHECK(out.num_tokens() == 6);
  auto value = [](int c, int row, int col) {
    return (float(40 * c + 8 * row + col) - 127.5f) / 127.5f;
  };
  int k = 0;
  for (int wy = 0; wy < 3; wy++)
    for (int wx = 0; wx < 2; wx++)
      for (int iy = 0; iy < 2; iy++)
        for (int ix = 0; ix < 2; ix++, k++) {
          const float* patch = out.pixel_values.data() + k * out.patch_dim;
          for (int c = 0; c < 3; c++)
            for (int t = 0; t < 2; t++)
              for (int i = 0; i < 256; i++) {
                INFO("patch " << k << " c " << c << " t " << t << " i " << i);
                REQUIRE(patch[(c * 2 + t) * 256 + i] == value(c, 2 * wy + iy, 2 * wx + ix));
              }
        }
}

TEST_CASE("image: resize_bicubic keeps the size when asked and checks its arguments") {
  Image img;
  img.width = 5;
  img.height = 3;
  img.rgb.assign(5 * 3 * 3, 0);
  for (size_t i = 0; i < img.rgb.size(); i++) img.rgb[i] = uint8_t(i * 7);
  CHECK(vlm::io::resize_bicubic(img, 3, 5).rgb == img.rgb);
  // Constant images stay constant (the weights of every output pixel sum to 1).
  Image flat = img;
  std::fill(flat.rgb.begin(), flat.rgb.end(), uint8_t(200));
  const Image up = vlm::io::resize_bicubic(flat, 7, 11), down = vlm::io::resize_bicubic(up, 2, 3);
  CHECK(std::all_of(up.rgb.begin(), up.rgb.end(), [](uint8_t v) { return v == 200; }));
  CHECK(std::all_of(down.rgb.begin(), down.rgb.end(), [](uint8_t v) { return v == 200; }));
  CHECK_THROWS_WITH(vlm::io::resize_bicubic(img, 0, 4), Contains("must be positive"));
  Image broken = img;
  broken.rgb.pop_back();
  CHECK_THROWS_WITH(vlm::io::resize_bicubic(broken, 4, 4), Contains("expected height * width * 3"));
}

TEST_CASE("image: preprocessor_config.json round trip, HF's older keys, wrong types named") {
  vlm::testing::TempDir tmp("image_processor_config");
  ImageProcessorConfig c;
  c.min_pixels = 9216;
  c.max_pixels = 16384;
  const ImageProcessorConfig back = vlm::io::read_image_processor_config(
      tmp.write("preprocessor_config.json", vlm::io::image_processor_json(c)));
  CHECK(back.min_pixels == 9216);
  CHECK(back.max_pixels == 16384);
  CHECK(back.patch_size == c.patch_size);
  CHECK(back.merge_size == c.merge_size);
  CHECK(back.mean == c.mean);
  CHECK(back.std == c.std);
  // Snapshots written before transformers v5 hold min_pixels / max_pixels at the top level.
  const ImageProcessorConfig old = vlm::io::read_image_processor_config(
      tmp.write("old.json", R"({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14})"));
  CHECK(old.min_pixels == 3136);
  CHECK(old.max_pixels == 12845056);
  CHECK(old.patch_size == 14);
  const std::string bad = tmp.write("bad.json", R"({"size": {"longest_edge": "big"}})");
  CHECK_THROWS_WITH(vlm::io::read_image_processor_config(bad),
                    Contains("bad.json") && Contains("size.longest_edge"));
  CHECK_THROWS_WITH(vlm::io::read_image_processor_config(tmp.file("none.json")),
                    Contains("cannot open"));
}
