// Dtype dispatch for templated kernels: VLM_DISPATCH_FLOAT(dtype, "op", T, body) runs body with
// T bound to float, double or bf16, and fails naming the op and the dtype otherwise.
#pragma once

#include "src/base/check.h"
#include "src/base/dtype.h"

#define VLM_DISPATCH_FLOAT(dtype, op_name, T, ...)                                                 \
  [&] {                                                                                            \
    switch (dtype) {                                                                               \
    case ::vlm::DType::f32: {                                                                      \
      using T = float;                                                                             \
      return __VA_ARGS__();                                                                        \
    }                                                                                              \
    case ::vlm::DType::f64: {                                                                      \
      using T = double;                                                                            \
      return __VA_ARGS__();                                                                        \
    }                                                                                              \
    case ::vlm::DType::bf16: {                                                                     \
      using T = ::vlm::bf16;                                                                       \
      return __VA_ARGS__();                                                                        \
    }                                                                                              \
    default: VLM_FAIL(op_name, ": unsupported dtype ", ::vlm::dtype_name(dtype));                  \
    }                                                                                              \
  }()

#define VLM_DISPATCH_INDEX(dtype, op_name, T, ...)                                                 \
  [&] {                                                                                            \
    switch (dtype) {                                                                               \
    case ::vlm::DType::i32: {                                                                      \
      using T = int32_t;                                                                           \
      return __VA_ARGS__();                                                                        \
    }                                                                                              \
    case ::vlm::DType::i64: {                                                                      \
      using T = int64_t;                                                                           \
      return __VA_ARGS__();                                                                        \
    }                                                                                              \
    default:                                                                                       \
        VLM_FAIL(op_name, ": index dtype must be i32 or i64, got ", ::vlm::dtype_name(dtype));     \
    }                                                                                              \
  }()
