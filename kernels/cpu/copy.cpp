#include "kernels/copy.h"

#include <cstring>

#include "src/base/check.h"

namespace vlm::kernels::cpu {

namespace {

// Calls f(linear_index, strided_offset) for every element of the layout, in row-major order.
template <typename F> void for_each_strided(const StridedLayout& l, F&& f) {
  int64_t n = 1;
  for (int d = 0; d < l.ndim; d++) n *= l.shape[d];
  if (n == 0) return;
  int64_t idx[kMaxDims] = {};
  int64_t off = 0;
  for (int64_t i = 0; i < n; i++) {
    f(i, off);
    for (int d = l.ndim - 1; d >= 0; d--) { // odometer increment
      idx[d]++;
      off += l.strides[d];
      if (idx[d] < l.shape[d]) break;
      off -= l.strides[d] * l.shape[d];
      idx[d] = 0;
    }
  }
}

template <size_t S> struct Bytes { unsigned char b[S]; };

template <size_t S> void gather(void* out, const void* in, const StridedLayout& l) {
  auto* o = static_cast<Bytes<S>*>(out);
  auto* x = static_cast<const Bytes<S>*>(in);
  for_each_strided(l, [&](int64_t i, int64_t off) { o[i] = x[off]; });
}

template <size_t S> void scatter(void* out, const StridedLayout& l, const void* in) {
  auto* o = static_cast<Bytes<S>*>(out);
  auto* x = static_cast<const Bytes<S>*>(in);
  for_each_strided(l, [&](int64_t i, int64_t off) { o[off] = x[i]; });
}

template <typename T> double load(const void* p, int64_t i) {
  return double(static_cast<float>(static_cast<const T*>(p)[i]));
}
template <> double load<double>(const void* p, int64_t i) {
  return static_cast<const double*>(p)[i];
}
template <> double load<int64_t>(const void* p, int64_t i) {
  return double(static_cast<const int64_t*>(p)[i]);
}
template <> double load<int32_t>(const void* p, int64_t i) {
  return double(static_cast<const int32_t*>(p)[i]);
}
template <> double load<uint8_t>(const void* p, int64_t i) {
  return double(static_cast<const uint8_t*>(p)[i]);
}
template <> double load<bool>(const void* p, int64_t i) {
  return static_cast<const bool*>(p)[i] ? 1 : 0;
}

template <typename T> void store(void* p, int64_t i, double v) {
  static_cast<T*>(p)[i] = T(static_cast<float>(v));
}
template <> void store<double>(void* p, int64_t i, double v) { static_cast<double*>(p)[i] = v; }
template <> void store<int64_t>(void* p, int64_t i, double v) {
  static_cast<int64_t*>(p)[i] = int64_t(v);
}
template <> void store<int32_t>(void* p, int64_t i, double v) {
  static_cast<int32_t*>(p)[i] = int32_t(v);
}
template <> void store<uint8_t>(void* p, int64_t i, double v) {
  static_cast<uint8_t*>(p)[i] = uint8_t(v);
}
template <> void store<bool>(void* p, int64_t i, double v) { static_cast<bool*>(p)[i] = v != 0; }

using Loader = double (*)(const void*, int64_t);
using Storer = void (*)(void*, int64_t, double);

Loader loader(DType t) {
  switch (t) {
  case DType::f32: return load<float>;
  case DType::bf16: return load<bf16>;
  case DType::f16: return load<f16>;
  case DType::f64: return load<double>;
  case DType::i32: return load<int32_t>;
  case DType::i64: return load<int64_t>;
  case DType::u8: return load<uint8_t>;
  case DType::boolean: return load<bool>;
  }
  VLM_FAIL("cast: unknown dtype");
}

Storer storer(DType t) {
  switch (t) {
  case DType::f32: return store<float>;
  case DType::bf16: return store<bf16>;
  case DType::f16: return store<f16>;
  case DType::f64: return store<double>;
  case DType::i32: return store<int32_t>;
  case DType::i64: return store<int64_t>;
  case DType::u8: return store<uint8_t>;
  case DType::boolean: return store<bool>;
  }
  VLM_FAIL("cast: unknown dtype");
}

} // namespace

void copy_strided(void* out, const void* in, size_t elem_size, const StridedLayout& l) {
  switch (elem_size) {
  case 1: return gather<1>(out, in, l);
  case 2: return gather<2>(out, in, l);
  case 4: return gather<4>(out, in, l);
  case 8: return gather<8>(out, in, l);
  }
  VLM_FAIL("copy_strided: unsupported element size ", elem_size);
}

void copy_into_strided(void* out, const StridedLayout& l, const void* in, size_t elem_size) {
  switch (elem_size) {
  case 1: return scatter<1>(out, l, in);
  case 2: return scatter<2>(out, l, in);
  case 4: return scatter<4>(out, l, in);
  case 8: return scatter<8>(out, l, in);
  }
  VLM_FAIL("copy_into_strided: unsupported element size ", elem_size);
}

void cast(void* out, DType out_type, const void* in, DType in_type, int64_t n) {
  if (out_type == in_type) {
    std::memcpy(out, in, size_t(n) * dtype_size(in_type));
    return;
  }
  // float -> bf16 is the hot path (mixed precision); keep it a direct loop.
  if (in_type == DType::f32 && out_type == DType::bf16) {
    auto* o = static_cast<bf16*>(out);
    auto* x = static_cast<const float*>(in);
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; i++) o[i] = bf16(x[i]);
    return;
  }
  if (in_type == DType::bf16 && out_type == DType::f32) {
    auto* o = static_cast<float*>(out);
    auto* x = static_cast<const bf16*>(in);
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; i++) o[i] = float(x[i]);
    return;
  }
  Loader ld = loader(in_type);
  Storer st = storer(out_type);
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; i++) st(out, i, ld(in, i));
}

void fill(void* out, DType t, double value, int64_t n) {
  Storer st = storer(t);
  if (n == 0) return;
  st(out, 0, value);
  size_t es = dtype_size(t);
  auto* o = static_cast<unsigned char*>(out);
  for (int64_t i = 1; i < n; i++) std::memcpy(o + i * es, o, es);
}

} // namespace vlm::kernels::cpu
