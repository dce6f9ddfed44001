#include "io/image/decode.h"

// clang-format off
#include <csetjmp>
#include <cstdio> // jpeglib.h needs FILE and size_t declared first
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
// clang-format on

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <sstream>

namespace vlm::io {

const char* image_error_kind_name(ImageErrorKind kind) {
  switch (kind) {
  case ImageErrorKind::empty: return "empty";
  case ImageErrorKind::unknown_format: return "unknown_format";
  case ImageErrorKind::unsupported_format: return "unsupported_format";
  case ImageErrorKind::truncated: return "truncated";
  case ImageErrorKind::corrupt: return "corrupt";
  case ImageErrorKind::too_large: return "too_large";
  case ImageErrorKind::bad_size: return "bad_size";
  }
  return "?";
}

ImageError::ImageError(ImageErrorKind kind, const std::string& message)
    : Error(message), kind_(kind) {}

const char* image_format_name(ImageFormat format) {
  switch (format) {
  case ImageFormat::unknown: return "unknown";
  case ImageFormat::jpeg: return "JPEG";
  case ImageFormat::png: return "PNG";
  case ImageFormat::gif: return "GIF";
  case ImageFormat::bmp: return "BMP";
  case ImageFormat::webp: return "WebP";
  case ImageFormat::tiff: return "TIFF";
  }
  return "?";
}

ImageFormat sniff_image_format(std::string_view b) {
  auto starts = [&](std::string_view magic) { return b.substr(0, magic.size()) == magic; };
  if (starts("\xFF\xD8\xFF")) return ImageFormat::jpeg;
  if (starts("\x89PNG\r\n\x1A\n")) return ImageFormat::png;
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::gif;
  if (starts("BM")) return ImageFormat::bmp;
  if (starts("RIFF") && b.size() >= 12 && b.substr(8, 4) == "WEBP") return ImageFormat::webp;
  if (starts(std::string_view("II*\0", 4)) || starts(std::string_view("MM\0*", 4)))
    return ImageFormat::tiff;
  return ImageFormat::unknown;
}

namespace {

// "<what> (format hint 'jpg', 1234 bytes)[: detail]"
std::string describe(std::string_view what, std::string_view hint, size_t size,
                     std::string_view detail = {}) {
  std::ostringstream os;
  os << "image decode: " << what << " (format hint '" << hint << "', " << size << " bytes)";
  if (!detail.empty()) os << ": " << detail;
  return os.str();
}

void check_pixel_limit(int64_t width, int64_t height, int64_t max_pixels, const char* format,
                       std::string_view hint, size_t size) {
  if (width * height <= max_pixels) return;
  std::ostringstream os;
  os << format << " image of " << width << "x" << height << " = " << width * height
     << " pixels exceeds the decode limit of " << max_pixels << " pixels";
  throw ImageError(ImageErrorKind::too_large, describe(os.str(), hint, size));
}

// The decoder's buffers (the stored rows plus the RGB result) are sized from the header, so they
// are checked before they are allocated: bytes per pixel count, not only pixels (a 16-bit RGBA
// image at the pixel limit would need 2 GB).
void check_decode_bytes(int64_t raw_bytes, int64_t width, int64_t height, const char* format,
                        std::string_view hint, size_t size) {
  const int64_t need = raw_bytes + width * height * 3;
  if (need <= kMaxDecodeBytes) return;
  std::ostringstream os;
  os << format << " image of " << width << "x" << height << " needs " << need
     << " bytes to decode, more than the limit of " << kMaxDecodeBytes << " bytes";
  throw ImageError(ImageErrorKind::too_large, describe(os.str(), hint, size));
}

// ---------------------------------------------------------------------------------------------
// JPEG. libjpeg reports fatal errors through error_exit, which must not return: we longjmp back
// into the function that called setjmp. Those functions hold only trivially destructible locals,
// so the jump skips no destructor.

struct JpegErrorManager {
  jpeg_error_mgr pub; // first member: libjpeg sees a jpeg_error_mgr*
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool hit_eof; // the source ran dry: libjpeg then inserts a fake EOI and warns
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

// Warnings (corrupt data that still decodes) are ignored, as PIL ignores them; running out of
// data is remembered because PIL refuses truncated files.
void jpeg_emit_message(j_common_ptr cinfo, int msg_level) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  if (msg_level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) err->hit_eof = true;
}

void jpeg_output_message(j_common_ptr) {}

struct JpegDecoder {
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  bool created = false;
  JpegDecoder() = default;
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  ~JpegDecoder() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// Header: returns false on a libjpeg error (message in d.err.message).
bool jpeg_read_header_into(JpegDecoder& d, std::string_view bytes) {
  d.cinfo.err = jpeg_std_error(&d.err.pub);
  d.err.pub.error_exit = jpeg_error_exit;
  d.err.pub.emit_message = jpeg_emit_message;
  d.err.pub.output_message = jpeg_output_message;
  d.err.hit_eof = false;
  d.err.message[0] = '\0';
  if (setjmp(d.err.jump)) return false;
  jpeg_create_decompress(&d.cinfo);
  d.created = true;
  jpeg_mem_src(&d.cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&d.cinfo, TRUE);
  // Output what PIL asks for: L for grey, CMYK for CMYK and YCCK (libjpeg converts YCCK),
  // RGB for everything else (YCbCr, or RGB with an Adobe marker).
  switch (d.cinfo.jpeg_color_space) {
  case JCS_GRAYSCALE: d.cinfo.out_color_space = JCS_GRAYSCALE; break;
  case JCS_CMYK:
  case JCS_YCCK: d.cinfo.out_color_space = JCS_CMYK; break;
  default: d.cinfo.out_color_space = JCS_RGB; break;
  }
  // libjpeg's defaults are PIL's: JDCT_ISLOW and fancy upsampling.
  return true;
}

bool jpeg_start(JpegDecoder& d) {
  if (setjmp(d.err.jump)) return false;
  jpeg_start_decompress(&d.cinfo);
  return true;
}

// Pixels into `out` (output_components bytes per pixel). Stops after the last scanline, without
// jpeg_finish_decompress: as in PIL, nothing after it (the EOI marker included) is needed.
bool jpeg_read_pixels(JpegDecoder& d, uint8_t* out, size_t row_bytes) {
  if (setjmp(d.err.jump)) return false;
  while (d.cinfo.output_scanline < d.cinfo.output_height) {
    JSAMPROW row = out + static_cast<size_t>(d.cinfo.output_scanline) * row_bytes;
    jpeg_read_scanlines(&d.cinfo, &row, 1);
  }
  return true;
}

// PIL's CMYK -> RGB (libImaging/Convert.c cmyk2rgb) on Adobe-inverted samples: PIL un-inverts
// them first ("CMYK;I"), so ink c = 255 - stored c and the "no black" factor nk = stored k.
uint8_t cmyk_channel_to_rgb(uint8_t stored_c, uint8_t stored_k) {
  const int ink = 255 - stored_c, nk = stored_k;
  const int t = ink * nk + 128;
  const int scaled = ((t >> 8) + t) >> 8; // ink * nk / 255, rounded
  return static_cast<uint8_t>(std::clamp(nk - scaled, 0, 255));
}

Image decode_jpeg(std::string_view bytes, std::string_view hint, int64_t max_pixels) {
  JpegDecoder d;
  auto fail = [&](const char* stage) {
    const bool truncated = d.err.hit_eof;
    return ImageError(truncated ? ImageErrorKind::truncated : ImageErrorKind::corrupt,
                      describe(truncated ? "truncated JPEG data" : "corrupt JPEG data", hint,
                               bytes.size(), std::string(stage) + ": " + d.err.message));
  };
  if (!jpeg_read_header_into(d, bytes)) throw fail("header");
  const int64_t width = d.cinfo.image_width, height = d.cinfo.image_height;
  check_pixel_limit(width, height, max_pixels, "JPEG", hint, bytes.size());
  if (!jpeg_start(d)) throw fail("start");
  const size_t row_bytes = static_cast<size_t>(d.cinfo.output_width) * d.cinfo.output_components;
  check_decode_bytes(int64_t(row_bytes) * d.cinfo.output_height, width, height, "JPEG", hint,
                     bytes.size());
  std::vector<uint8_t> raw(row_bytes * d.cinfo.output_height);
  if (!jpeg_read_pixels(d, raw.data(), row_bytes)) throw fail("scanlines");
  if (d.err.hit_eof) {
    std::snprintf(d.err.message, sizeof d.err.message, "data ends before the end of the image");
    throw fail("scanlines");
  }
  const J_COLOR_SPACE space = d.cinfo.out_color_space;

  Image img;
  img.width = width;
  img.height = height;
  const size_t n = static_cast<size_t>(width * height);
  img.rgb.resize(n * 3);
  uint8_t* o = img.rgb.data();
  if (space == JCS_GRAYSCALE) {
    for (size_t i = 0; i < n; i++) o[3 * i] = o[3 * i + 1] = o[3 * i + 2] = raw[i];
  } else if (space == JCS_CMYK) {
    for (size_t i = 0; i < n; i++)
      for (int c = 0; c < 3; c++)
        o[3 * i + c] = cmyk_channel_to_rgb(raw[4 * i + c], raw[4 * i + 3]);
  } else {
    img.rgb = std::move(raw);
  }
  return img;
}

// ---------------------------------------------------------------------------------------------
// PNG. Same longjmp discipline as JPEG. Rows are read in their stored layout (only sub-byte
// samples unpacked, no scaling) and converted below, so every PIL rule is explicit.

struct PngDecoder {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::string_view bytes;
  size_t pos = 0;
  bool truncated = false;
  char message[256] = {};
};

void png_read_from_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* d = static_cast<PngDecoder*>(png_get_io_ptr(png));
  if (length > d->bytes.size() - d->pos) {
    d->truncated = true;
    png_error(png, "data ends inside the image");
  }
  std::memcpy(out, d->bytes.data() + d->pos, length);
  d->pos += length;
}

void png_error_to_jump(png_structp png, png_const_charp msg) {
  auto* d = static_cast<PngDecoder*>(png_get_error_ptr(png));
  std::snprintf(d->message, sizeof d->message, "%s", msg);
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

struct PngHeader {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, interlace = 0;
  size_t row_bytes = 0;
};

bool png_read_header(PngDecoder& d, PngHeader& h) {
  if (setjmp(png_jmpbuf(d.png))) return false;
  png_set_read_fn(d.png, &d, png_read_from_memory);
  png_set_benign_errors(d.png, 1);
  png_set_user_limits(d.png, 0x7fffffff, 0x7fffffff); // the pixel limit is checked by the caller
  // PIL verifies the CRC of every chunk before the image data, ancillary ones included...
  png_set_crc_action(d.png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
  png_read_info(d.png, d.info);
  // ...and none of the image data chunks.
  png_set_crc_action(d.png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
  png_get_IHDR(d.png, d.info, &h.width, &h.height, &h.bit_depth, &h.color_type, &h.interlace,
               nullptr, nullptr);
  // The stored row size after png_set_packing (one byte per sample below 8 bits), computed here
  // so that the caller checks it before png_read_update_info allocates libpng's row buffers.
  const int64_t sample_bytes = h.bit_depth == 16 ? 2 : 1;
  h.row_bytes = size_t(int64_t(h.width) * png_get_channels(d.png, d.info) * sample_bytes);
  return true;
}

// Sets up the transforms and libpng's row buffers (sized by the header: check it first).
bool png_start_rows(PngDecoder& d, const PngHeader& h) {
  if (setjmp(png_jmpbuf(d.png))) return false;
  if (h.bit_depth < 8) png_set_packing(d.png); // one byte per sample, values unscaled
  png_set_interlace_handling(d.png);
  png_read_update_info(d.png, d.info);
  return png_get_rowbytes(d.png, d.info) == h.row_bytes;
}

// True once every row is in the caller's buffer: libpng stores the last row before it reads the
// end of the compressed stream (Adler-32, CRC, the next chunk header), which PIL never reads.
bool png_rows_complete(png_structp png, const PngHeader& h) {
  if (h.interlace != PNG_INTERLACE_NONE) return png_get_current_pass_number(png) >= 7;
  return png_get_current_row_number(png) >= h.height;
}

// Reads all rows and stops there (PIL needs no IEND). A failure after the last row, e.g. data
// that ends inside the final checksum, is ignored as PIL ignores it.
bool png_read_rows(PngDecoder& d, const PngHeader& h, png_bytepp rows) {
  if (setjmp(png_jmpbuf(d.png))) return png_rows_complete(d.png, h);
  png_read_image(d.png, rows);
  return true;
}

struct PngPalette {
  std::array<std::array<uint8_t, 3>, 256> rgb{}; // entries past PLTE stay black, as in PIL
  std::optional<std::array<uint8_t, 3>> key;     // pixels of this colour become white
};

// The colour key the reference ends up with (see the header comment). PIL keeps a tRNS key
// through convert("RGB") and the processor then composites matching pixels onto white; the
// key's form follows PIL's PNG plugin and its convert():
//  * palette: only a tRNS with exactly one 0 entry and all others 255 ("simple") gives a key,
//    the RGB of that entry (other alpha tables are dropped);
//  * grey 2/4/8-bit: (k, k, k) with the raw, unscaled tRNS value k, clipped to 255;
//  * grey 1-bit (PIL mode "1") and 16-bit (mode "I;16"): PIL keeps an int, which the processor's
//    convert("RGBA") reads as (v & 0xff, 0, 0), v = 255 * (k != 0) for 1-bit and k for 16-bit;
//  * RGB: (r, g, b) & 0xff (for 16-bit samples this is compared with the high bytes).
std::optional<std::array<uint8_t, 3>> png_reference_key(PngDecoder& d, const PngHeader& h) {
  png_bytep alpha = nullptr;
  int num_trans = 0;
  png_color_16p trans = nullptr;
  if (!png_get_valid(d.png, d.info, PNG_INFO_tRNS)) return std::nullopt;
  png_get_tRNS(d.png, d.info, &alpha, &num_trans, &trans);
  auto u8 = [](int v) { return static_cast<uint8_t>(v & 0xff); };
  switch (h.color_type) {
  case PNG_COLOR_TYPE_PALETTE: return std::nullopt; // handled with the palette
  case PNG_COLOR_TYPE_GRAY: {
    if (!trans) return std::nullopt;
    const int k = trans->gray;
    if (h.bit_depth == 1) return std::array<uint8_t, 3>{u8(k ? 255 : 0), 0, 0};
    if (h.bit_depth == 16) return std::array<uint8_t, 3>{u8(k), 0, 0};
    const uint8_t g = static_cast<uint8_t>(std::min(k, 255));
    return std::array<uint8_t, 3>{g, g, g};
  }
  case PNG_COLOR_TYPE_RGB:
    if (!trans) return std::nullopt;
    return std::array<uint8_t, 3>{u8(trans->red), u8(trans->green), u8(trans->blue)};
  default: return std::nullopt; // types with alpha have no tRNS
  }
}

PngPalette png_palette(PngDecoder& d) {
  PngPalette p;
  png_colorp plte = nullptr;
  int num = 0;
  if (png_get_PLTE(d.png, d.info, &plte, &num))
    for (int i = 0; i < std::min(num, 256); i++)
      p.rgb[i] = {plte[i].red, plte[i].green, plte[i].blue};
  png_bytep alpha = nullptr;
  int num_trans = 0;
  png_color_16p trans = nullptr;
  if (png_get_valid(d.png, d.info, PNG_INFO_tRNS) &&
      png_get_tRNS(d.png, d.info, &alpha, &num_trans, &trans) && alpha) {
    int zero_at = -1, zeros = 0, opaque = 0;
    for (int i = 0; i < num_trans; i++) {
      if (alpha[i] == 0) zero_at = i, zeros++;
      if (alpha[i] == 255) opaque++;
    }
    if (zeros == 1 && zeros + opaque == num_trans) p.key = p.rgb[zero_at];
  }
  return p;
}

// Stored samples -> RGB (PIL's rawmodes: 16-bit keeps the high byte, 16-bit grey clips).
void png_rows_to_rgb(const PngHeader& h, const std::vector<uint8_t>& raw, const PngPalette& pal,
                     Image& img) {
  const size_t w = h.width;
  for (size_t y = 0; y < h.height; y++) {
    const uint8_t* s = raw.data() + y * h.row_bytes;
    uint8_t* o = img.rgb.data() + y * w * 3;
    for (size_t x = 0; x < w; x++, o += 3) {
      switch (h.color_type) {
      case PNG_COLOR_TYPE_GRAY: {
        uint8_t g;
        if (h.bit_depth == 16)
          g = static_cast<uint8_t>(std::min((s[2 * x] << 8) | s[2 * x + 1], 255));
        else
          g = static_cast<uint8_t>(s[x] * (255 / ((1 << h.bit_depth) - 1)));
        o[0] = o[1] = o[2] = g;
        break;
      }
      case PNG_COLOR_TYPE_GRAY_ALPHA: {
        const size_t bytes = h.bit_depth / 8;
        o[0] = o[1] = o[2] = s[x * 2 * bytes];
        break;
      }
      case PNG_COLOR_TYPE_RGB:
      case PNG_COLOR_TYPE_RGB_ALPHA: {
        const size_t channels = h.color_type == PNG_COLOR_TYPE_RGB ? 3 : 4;
        const size_t bytes = h.bit_depth / 8;
        for (size_t c = 0; c < 3; c++) o[c] = s[(x * channels + c) * bytes];
        break;
      }
      case PNG_COLOR_TYPE_PALETTE: {
        const auto& e = pal.rgb[s[x]];
        o[0] = e[0], o[1] = e[1], o[2] = e[2];
        break;
      }
      }
    }
  }
}

Image decode_png(std::string_view bytes, std::string_view hint, int64_t max_pixels) {
  PngDecoder d;
  d.bytes = bytes;
  d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d, png_error_to_jump, png_ignore_warning);
  if (d.png) d.info = png_create_info_struct(d.png);
  if (!d.png || !d.info) {
    png_destroy_read_struct(&d.png, &d.info, nullptr);
    throw std::bad_alloc();
  }
  struct Cleanup {
    PngDecoder& d;
    ~Cleanup() { png_destroy_read_struct(&d.png, &d.info, nullptr); }
  } cleanup{d};
  auto fail = [&](const char* stage) {
    return ImageError(d.truncated ? ImageErrorKind::truncated : ImageErrorKind::corrupt,
                      describe(d.truncated ? "truncated PNG data" : "corrupt PNG data", hint,
                               bytes.size(), std::string(stage) + ": " + d.message));
  };

  PngHeader h;
  if (!png_read_header(d, h)) throw fail("header");
  check_pixel_limit(h.width, h.height, max_pixels, "PNG", hint, bytes.size());
  const int64_t raw_bytes = int64_t(h.row_bytes) * int64_t(h.height);
  check_decode_bytes(raw_bytes, h.width, h.height, "PNG", hint, bytes.size());
  // Deflate expands at most 1032:1, so a header that promises more than that of the file's size
  // belongs to a truncated or forged file: refused before its rows are zero-filled.
  if (raw_bytes > 1032 * int64_t(bytes.size()) + (int64_t(1) << 16)) {
    std::ostringstream os;
    os << "a " << h.width << "x" << h.height << " image of " << raw_bytes
       << " bytes cannot be stored in " << bytes.size() << " bytes of PNG";
    throw ImageError(ImageErrorKind::truncated,
                     describe("truncated PNG data", hint, bytes.size(), os.str()));
  }
  if (!png_start_rows(d, h)) throw fail("row setup");
  std::vector<uint8_t> raw(h.row_bytes * h.height);
  std::vector<png_bytep> rows(h.height);
  for (size_t y = 0; y < h.height; y++) rows[y] = raw.data() + y * h.row_bytes;
  if (!png_read_rows(d, h, rows.data())) throw fail("image data");

  PngPalette pal;
  if (h.color_type == PNG_COLOR_TYPE_PALETTE)
    pal = png_palette(d);
  else
    pal.key = png_reference_key(d, h);

  Image img;
  img.width = h.width;
  img.height = h.height;
  img.rgb.resize(static_cast<size_t>(img.width * img.height) * 3);
  png_rows_to_rgb(h, raw, pal, img);
  if (pal.key) {
    const auto k = *pal.key;
    for (size_t i = 0; i < img.rgb.size(); i += 3) {
      uint8_t* p = img.rgb.data() + i;
      if (p[0] == k[0] && p[1] == k[1] && p[2] == k[2]) p[0] = p[1] = p[2] = 255;
    }
  }
  return img;
}

} // namespace

Image decode_image(std::string_view bytes, std::string_view format_hint, int64_t max_pixels) {
  if (bytes.empty()) throw ImageError(ImageErrorKind::empty, describe("no data", format_hint, 0));
  const ImageFormat format = sniff_image_format(bytes);
  switch (format) {
  case ImageFormat::jpeg: return decode_jpeg(bytes, format_hint, max_pixels);
  case ImageFormat::png: return decode_png(bytes, format_hint, max_pixels);
  case ImageFormat::unknown: {
    std::ostringstream first;
    first << "first bytes";
    for (size_t i = 0; i < std::min<size_t>(bytes.size(), 8); i++) {
      char hex[4];
      std::snprintf(hex, sizeof hex, " %02x", static_cast<unsigned char>(bytes[i]));
      first << hex;
    }
    throw ImageError(ImageErrorKind::unknown_format,
                     describe("not a JPEG or PNG image", format_hint, bytes.size(), first.str()));
  }
  default:
    throw ImageError(ImageErrorKind::unsupported_format,
                     describe(std::string(image_format_name(format)) +
                                  " images are not supported (only JPEG and PNG)",
                              format_hint, bytes.size()));
  }
}

} // namespace vlm::io
