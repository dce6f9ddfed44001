// Image decoding for the data pipeline: JPEG (libjpeg-turbo) and PNG (libpng) bytes to 8-bit RGB,
// pixel for pixel what the reference trainer hands its image processor. There, Energon's
// SampleDecoder(image_decode="pil") runs PIL `Image.open(...).convert("RGB")`, and the HF
// processor's own RGB conversion follows (docs/reference-trainer.md §3.2). Consequences kept here:
//  * alpha is dropped, not composited (RGBA, grey+alpha, palette tRNS with partial alpha);
//  * a colour-key tRNS (PNG palette with one fully transparent entry, grey or RGB key) survives
//    PIL's convert as a key colour, and the processor composites those pixels onto white;
//  * 16-bit PNG samples keep their high byte, except 16-bit grey, which PIL clips to 255;
//  * CMYK/YCCK JPEGs are read with Adobe (inverted) polarity and converted as PIL does;
//  * EXIF orientation is NOT applied; colour profiles and PNG gamma are ignored;
//  * libjpeg warnings (corrupt but complete data) are ignored, truncated data is an error.
// Other formats the reference would accept through PIL (GIF, BMP, WebP, TIFF) are refused with
// ImageErrorKind::unsupported_format.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/check.h"

namespace vlm::io {

// An 8-bit RGB image, rows top to bottom, HWC: rgb[(y * width + x) * 3 + c].
struct Image {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Why an image was refused: the loader counts skipped samples by these.
enum class ImageErrorKind {
  empty,              // zero bytes
  unknown_format,     // magic bytes of no known image format
  unsupported_format, // a known format other than JPEG/PNG
  truncated,          // data ends before the image does
  corrupt,            // the decoder rejected the data
  too_large,          // more pixels (or decoded bytes) than the decode limit
  bad_size,           // zero-size or aspect ratio beyond the processor's limit (image_preprocess)
};
// Stable snake_case names ("truncated", ...) for counters and reports.
const char* image_error_kind_name(ImageErrorKind kind);

// A bad image: the sample is skipped, not the run. The message names the format hint, the data
// size and the decoder's own message; the loader adds shard and key.
class ImageError : public Error {
public:
  ImageError(ImageErrorKind kind, const std::string& message);
  ImageErrorKind kind() const { return kind_; }

private:
  ImageErrorKind kind_;
};

enum class ImageFormat { unknown, jpeg, png, gif, bmp, webp, tiff };
const char* image_format_name(ImageFormat format);
// From the magic bytes only.
ImageFormat sniff_image_format(std::string_view bytes);

// Pillow's decompression-bomb limit (2 * Image.MAX_IMAGE_PIXELS): PIL raises above it, so the
// reference skips such images too.
constexpr int64_t kMaxDecodePixels = 178956970;
// Bytes the decoder may hold for one image (its stored rows plus the RGB result): those of an
// 8-bit RGB image at the pixel limit, so deeper images (16-bit, alpha) get fewer pixels.
constexpr int64_t kMaxDecodeBytes = 6 * kMaxDecodePixels;
// An image file larger than this is refused before it is read (`generate --image`): PNG and JPEG
// files of images within the pixel limit are smaller.
constexpr int64_t kMaxImageFileBytes = int64_t(256) << 20;

// Decodes JPEG or PNG bytes to RGB. The format comes from the magic bytes (as PIL does);
// format_hint (the WebDataset part name, e.g. "jpg") only appears in error messages. Throws
// ImageError for bad data.
Image decode_image(std::string_view bytes, std::string_view format_hint,
                   int64_t max_pixels = kMaxDecodePixels);

} // namespace vlm::io
