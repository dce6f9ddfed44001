// Scalar types. bf16 is real 16-bit storage with float arithmetic (round-to-nearest-even on
// conversion), so mixed-precision logic runs on CPU exactly as on GPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "src/base/enum_names.h"

namespace vlm {

enum class DType : uint8_t { f32, bf16, f16, f64, i32, i64, u8, boolean };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool is_floating(DType t);

// The dtypes models train, run and are saved in, by name: bf16 and f32, with torch's and the
// reference trainer's spellings (bfloat16, float32, fp32) as aliases. One table for the config
// (training.param_dtype, grad_dtype) and every command-line --dtype.
std::span<const EnumName<DType>> model_dtype_names();
// `what` names the setting in the error ("--dtype: unknown value 'x' (valid: bf16 | f32)").
DType parse_model_dtype(std::string_view text, std::string_view what);

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40); // quiet NaN, keep sign
    u += 0x7fffu + ((u >> 16) & 1u); // round to nearest, ties to even
    return uint16_t(u >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// IEEE half, for reading f16 checkpoints; arithmetic happens in float.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<bool>() { return DType::boolean; }

// Accumulation type: double for double, float for every narrower float type.
template <typename T> struct acc_type { using type = float; };
template <> struct acc_type<double> { using type = double; };
template <typename T> using acc_t = typename acc_type<T>::type;

// Conversions used by the templated kernels.
template <typename A, typename T> inline A to_acc(T v) {
  return static_cast<A>(static_cast<float>(v));
}
template <> inline double to_acc<double, double>(double v) { return v; }
template <> inline float to_acc<float, float>(float v) { return v; }
template <typename T, typename A> inline T from_acc(A v) { return T(static_cast<float>(v)); }
template <> inline double from_acc<double, double>(double v) { return v; }
template <> inline float from_acc<float, float>(float v) { return v; }

} // namespace vlm
