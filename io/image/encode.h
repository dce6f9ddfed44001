// PNG encoding of 8-bit RGB images (for `vlmtrain data make-demo` and test fixtures).
#pragma once

#include <string>

#include "io/image/decode.h"

namespace vlm::io {

// The PNG file bytes of `img` (RGB, 8 bits per channel, no interlace).
std::string encode_png(const Image& img);

} // namespace vlm::io
