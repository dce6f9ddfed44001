#include "io/image/encode.h"

#include <png.h>

#include "src/base/check.h"

namespace vlm::io {

namespace {
void append_bytes(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::string*>(png_get_io_ptr(png));
  out->append(reinterpret_cast<const char*>(data), n);
}
void no_flush(png_structp) {}
} // namespace

std::string encode_png(const Image& img) {
  VLM_CHECK(img.width > 0 && img.height > 0 && img.rgb.size() == size_t(img.width * img.height * 3),
            "encode_png: image ", img.width, "x", img.height, " has ", img.rgb.size(),
            " bytes, expected width*height*3");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  VLM_CHECK(png, "encode_png: libpng initialisation failed");
  png_infop info = png_create_info_struct(png);
  std::string out;
  // libpng reports errors by longjmp; nothing with a destructor lives between here and the end.
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info ? &info : nullptr);
    VLM_FAIL("encode_png: libpng failed encoding a ", img.width, "x", img.height, " image");
  }
  png_set_write_fn(png, &out, append_bytes, no_flush);
  png_set_IHDR(png, info, png_uint_32(img.width), png_uint_32(img.height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < img.height; y++)
    png_write_row(png, const_cast<png_bytep>(img.rgb.data() + y * img.width * 3));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

} // namespace vlm::io
