// Elementwise arithmetic with PyTorch broadcasting. The backward of a broadcast operand sums
// the gradient back to that operand's shape.
#pragma once

#include "src/core/tensor.h"

namespace vlm {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// alpha * x + beta
Tensor affine(const Tensor& x, double alpha, double beta = 0.0);
inline Tensor scale(const Tensor& x, double s) { return affine(x, s, 0.0); }
inline Tensor neg(const Tensor& x) { return affine(x, -1.0, 0.0); }

// In place, never recorded (optimizer updates, gradient accumulation). They refuse a tensor that
// requires grad while grad mode is on, since that would corrupt saved activations silently.
void add_(Tensor& dst, const Tensor& src, double alpha = 1.0); // dst += alpha * src
void scale_(Tensor& dst, double s);                            // dst *= s
void fill_(Tensor& dst, double value);

// The broadcast result shape of a and b; the error names the op and both shapes.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

} // namespace vlm
