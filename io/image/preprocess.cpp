#include "io/image/preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace vlm::io {

namespace {

void check_config(const ImageProcessorConfig& cfg) {
  VLM_CHECK(cfg.patch_size > 0 && cfg.merge_size > 0 && cfg.temporal_patch_size > 0,
            "image processor: patch_size, merge_size and temporal_patch_size must be positive, "
            "got ",
            cfg.patch_size, ", ", cfg.merge_size, ", ", cfg.temporal_patch_size);
  VLM_CHECK(cfg.min_pixels >= 0 && cfg.max_pixels > 0,
            "image processor: need min_pixels >= 0 and max_pixels > 0, got ", cfg.min_pixels, ", ",
            cfg.max_pixels);
  for (float s : cfg.std) VLM_CHECK(s != 0.0f, "image processor: image_std must not contain 0");
}

std::string size_str(int64_t height, int64_t width) {
  std::ostringstream os;
  os << height << "x" << width << " (HxW)";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// Resize (torch aten/src/ATen/native/cpu/UpSampleKernel.cpp, uint8 antialiased separable path;
// itself a port of Pillow's ImagingResample).

// Keys cubic convolution with a = -0.5 (torch uses -0.5 when antialiasing, like PIL).
double cubic_filter(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// Per output index: the first input index, the number of taps and their int16 weights, fixed
// point with `precision` fractional bits (the most that keeps the largest weight below 2^15).
struct ResampleWeights {
  int64_t max_taps = 0;
  std::vector<int64_t> first, count;
  std::vector<int16_t> w; // [out, max_taps]
  int precision = 0;
};

ResampleWeights resample_weights(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0; // cubic: 4 taps at scale 1
  const double inv_scale = scale >= 1.0 ? 1.0 / scale : 1.0;
  ResampleWeights r;
  r.max_taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  r.first.resize(out_size);
  r.count.resize(out_size);
  std::vector<double> wf(out_size * r.max_taps, 0.0);
  double w_max = 0.0;
  for (int64_t i = 0; i < out_size; i++) {
    const double center = scale * (i + 0.5);
    // Truncation toward zero, then clamping, exactly as torch (and PIL) do.
    const int64_t lo = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    int64_t n = std::min(static_cast<int64_t>(center + support + 0.5), in_size) - lo;
    n = std::clamp(n, int64_t{0}, r.max_taps);
    double* w = wf.data() + i * r.max_taps;
    double total = 0.0;
    for (int64_t j = 0; j < n; j++) {
      w[j] = cubic_filter((j + lo - center + 0.5) * inv_scale);
      total += w[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < n; j++) {
        w[j] /= total;
        w_max = std::max(w_max, w[j]);
      }
    }
    r.first[i] = lo;
    r.count[i] = n;
  }
  for (r.precision = 0; r.precision < 22; r.precision++)
    if (static_cast<int>(0.5 + w_max * (1 << (r.precision + 1))) >= (1 << 15)) break;
  r.w.resize(wf.size());
  for (size_t k = 0; k < wf.size(); k++) {
    const double v = wf[k] * (1 << r.precision);
    r.w[k] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return r;
}

inline uint8_t fixed_to_u8(int32_t acc, int precision) {
  return static_cast<uint8_t>(std::clamp(acc >> precision, 0, 255));
}

// Along x: [h, in_w, 3] -> [h, out_w, 3].
Image resample_horizontal(const Image& src, int64_t out_w) {
  const ResampleWeights r = resample_weights(src.width, out_w);
  Image dst;
  dst.width = out_w;
  dst.height = src.height;
  dst.rgb.resize(static_cast<size_t>(out_w * src.height) * 3);
  const int32_t half = 1 << (r.precision - 1);
  for (int64_t y = 0; y < src.height; y++) {
    const uint8_t* row = src.rgb.data() + y * src.width * 3;
    uint8_t* out = dst.rgb.data() + y * out_w * 3;
    for (int64_t x = 0; x < out_w; x++) {
      const int16_t* w = r.w.data() + x * r.max_taps;
      const uint8_t* p = row + r.first[x] * 3;
      int32_t a0 = half, a1 = half, a2 = half;
      for (int64_t j = 0; j < r.count[x]; j++, p += 3) {
        a0 += p[0] * w[j];
        a1 += p[1] * w[j];
        a2 += p[2] * w[j];
      }
      out[3 * x] = fixed_to_u8(a0, r.precision);
      out[3 * x + 1] = fixed_to_u8(a1, r.precision);
      out[3 * x + 2] = fixed_to_u8(a2, r.precision);
    }
  }
  return dst;
}

// Along y: [in_h, w, 3] -> [out_h, w, 3]; rows are combined whole, so the inner loop vectorizes.
Image resample_vertical(const Image& src, int64_t out_h) {
  const ResampleWeights r = resample_weights(src.height, out_h);
  Image dst;
  dst.width = src.width;
  dst.height = out_h;
  const size_t row_len = static_cast<size_t>(src.width) * 3;
  dst.rgb.resize(row_len * out_h);
  const int32_t half = 1 << (r.precision - 1);
  std::vector<int32_t> acc(row_len);
  for (int64_t y = 0; y < out_h; y++) {
    std::fill(acc.begin(), acc.end(), half);
    const int16_t* w = r.w.data() + y * r.max_taps;
    for (int64_t j = 0; j < r.count[y]; j++) {
      const uint8_t* row = src.rgb.data() + (r.first[y] + j) * row_len;
      const int32_t wj = w[j];
      for (size_t k = 0; k < row_len; k++) acc[k] += row[k] * wj;
    }
    uint8_t* out = dst.rgb.data() + y * row_len;
    for (size_t k = 0; k < row_len; k++) out[k] = fixed_to_u8(acc[k], r.precision);
  }
  return dst;
}

} // namespace

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width,
                                         const ImageProcessorConfig& cfg) {
  check_config(cfg);
  if (height <= 0 || width <= 0)
    throw ImageError(ImageErrorKind::bad_size,
                     "image preprocess: image has zero size " + size_str(height, width));
  const int64_t factor = cfg.patch_size * cfg.merge_size;
  const double f = static_cast<double>(factor);
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  // All divisions below are Python's true division of exact integers: doubles give the same
  // results while height * width < 2^53.
  const double aspect = std::max(h, w) / std::min(h, w);
  if (aspect > 200.0) {
    std::ostringstream os;
    os << "image preprocess: aspect ratio " << aspect << " of " << size_str(height, width)
       << " exceeds 200 (the Qwen image processor's limit)";
    throw ImageError(ImageErrorKind::bad_size, os.str());
  }
  // std::nearbyint rounds half to even, as Python's round().
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  const double area = static_cast<double>(height * width);
  if (h_bar * w_bar > cfg.max_pixels) {
    const double beta = std::sqrt(area / static_cast<double>(cfg.max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < cfg.min_pixels) {
    const double beta = std::sqrt(static_cast<double>(cfg.min_pixels) / area);
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  if (h_bar <= 0 || w_bar <= 0) // only with min_pixels 0: transformers would fail in resize
    throw ImageError(ImageErrorKind::bad_size, "image preprocess: " + size_str(height, width) +
                                                   " resizes to zero size with min_pixels " +
                                                   std::to_string(cfg.min_pixels));
  return {h_bar, w_bar};
}

Image resize_bicubic(const Image& img, int64_t height, int64_t width) {
  VLM_CHECK(height > 0 && width > 0, "resize_bicubic: target ", size_str(height, width),
            " must be positive");
  VLM_CHECK(img.width > 0 && img.height > 0 &&
                img.rgb.size() == static_cast<size_t>(img.width * img.height * 3),
            "resize_bicubic: image of ", size_str(img.height, img.width), " holds ", img.rgb.size(),
            " bytes, expected height * width * 3");
  // Like torch: only the sides that change are resampled, width first.
  if (width == img.width && height == img.height) return img;
  if (height == img.height) return resample_horizontal(img, width);
  if (width == img.width) return resample_vertical(img, height);
  return resample_vertical(resample_horizontal(img, width), height);
}

ProcessedImage preprocess_image(const Image& img, const ImageProcessorConfig& cfg,
                                std::vector<float>* append_to) {
  const auto [h, w] = smart_resize(img.height, img.width, cfg);
  const Image resized = resize_bicubic(img, h, w);

  const int64_t p = cfg.patch_size, m = cfg.merge_size, t = cfg.temporal_patch_size;
  ProcessedImage out;
  out.merge_size = m;
  out.grid_thw = {1, h / p, w / p};
  out.num_patches = (h / p) * (w / p);
  out.patch_dim = 3 * t * p * p;
  std::vector<float>& values = append_to ? *append_to : out.pixel_values;
  const size_t begin = values.size();
  values.resize(begin + static_cast<size_t>(out.num_patches * out.patch_dim));

  // Rescale + normalize as the torchvision backend fuses them, in float32:
  // (x - mean * 255) / (std * 255), mean/std as float32 times 1 / rescale_factor = 255.
  float lut[3][256];
  for (int c = 0; c < 3; c++) {
    const float mean255 = cfg.mean[c] * 255.0f, std255 = cfg.std[c] * 255.0f;
    for (int v = 0; v < 256; v++) lut[c][v] = (static_cast<float>(v) - mean255) / std255;
  }

  // Patch order: merge windows in raster order, the m x m patches of a window in raster order;
  // inside a patch (c, t, y, x), the t frames being the same image.
  const int64_t windows_w = w / p / m, windows_h = h / p / m;
  const int64_t frame = p * p; // values per channel and frame
  float* dst = values.data() + begin;
  for (int64_t wy = 0; wy < windows_h; wy++)
    for (int64_t wx = 0; wx < windows_w; wx++)
      for (int64_t iy = 0; iy < m; iy++)
        for (int64_t ix = 0; ix < m; ix++, dst += out.patch_dim) {
          const int64_t y0 = (wy * m + iy) * p, x0 = (wx * m + ix) * p;
          for (int c = 0; c < 3; c++) {
            float* frame0 = dst + c * t * frame;
            for (int64_t y = 0; y < p; y++) {
              const uint8_t* src = resized.rgb.data() + ((y0 + y) * w + x0) * 3 + c;
              for (int64_t x = 0; x < p; x++) frame0[y * p + x] = lut[c][src[3 * x]];
            }
            for (int64_t k = 1; k < t; k++)
              std::memcpy(frame0 + k * frame, frame0, sizeof(float) * frame);
          }
        }
  return out;
}

} // namespace vlm::io
