#include "src/base/dtype.h"

#include "src/base/check.h"

namespace vlm {

size_t dtype_size(DType t) {
  switch (t) {
  case DType::f32: return 4;
  case DType::bf16: return 2;
  case DType::f16: return 2;
  case DType::f64: return 8;
  case DType::i32: return 4;
  case DType::i64: return 8;
  case DType::u8: return 1;
  case DType::boolean: return 1;
  }
  VLM_FAIL("unknown dtype ", int(t));
}

std::span<const EnumName<DType>> model_dtype_names() {
  static constexpr EnumName<DType> names[] = {{"bf16", DType::bf16},
                                              {"f32", DType::f32},
                                              {"bfloat16", DType::bf16, true},
                                              {"float32", DType::f32, true},
                                              {"fp32", DType::f32, true}};
  return names;
}

DType parse_model_dtype(std::string_view text, std::string_view what) {
  return parse_enum(model_dtype_names(), text, what);
}

const char* dtype_name(DType t) {
  switch (t) {
  case DType::f32: return "f32";
  case DType::bf16: return "bf16";
  case DType::f16: return "f16";
  case DType::f64: return "f64";
  case DType::i32: return "i32";
  case DType::i64: return "i64";
  case DType::u8: return "u8";
  case DType::boolean: return "bool";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64;
}

uint16_t f16::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u); // overflow (after rounding) -> inf
  if (absx < 0x38800000u) {                                 // subnormal half or zero
    if (absx < 0x33000000u) return uint16_t(sign);          // below half of the smallest subnormal
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(absx >> 23); // value = mant * 2^(e-150) = q * 2^-24 // bits to drop
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t q = mant >> shift;
    if (rest > half || (rest == half && (q & 1u))) q++;
    return uint16_t(sign | q);
  }
  uint32_t q = absx - 0x38000000u; // rebias exponent 127 -> 15, still 23 mantissa bits
  uint32_t rest = q & 0x1fffu;
  q >>= 13;
  if (rest > 0x1000u || (rest == 0x1000u && (q & 1u))) q++;
  return uint16_t(sign | q);
}

float f16::to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else { // normalize the subnormal
      int e = -1;
      do {
        mant <<= 1;
        e++;
      } while (!(mant & 0x400u));
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

} // namespace vlm
