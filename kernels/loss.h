// Softmax cross-entropy over rows of logits [rows, vocab] (contiguous) with integer labels (int32
// or int64). Math runs in acc_t<T> (f32 for f32/bf16 logits, f64 for f64); one row is streamed at a
// time, so no fp32 copy of the logits is ever made. Rows whose label equals ignore_index
// contribute nothing.
#pragma once

#include <cstdint>

#include "src/base/dtype.h"

namespace vlm::kernels::cpu {

// Validates labels: returns the first row whose label is outside [0, vocab) and is not
// ignore_index (-1 when all are fine), and sets *num_valid to the number of non-ignored rows (=).
template <typename I>
int64_t check_labels(const I* labels, int64_t rows, int64_t vocab, int64_t ignore_index,
                     int64_t* num_valid);

// For every row: lse[r] = logsumexp(logits[r, :]) and row_loss[r] = lse[r] - logits[r, label[r]],
// or row_loss[r] = 0 (lse still written) when label[r] == ignore_index (=). Labels must have been
// validated with check_labels.
template <typename T, typename I>
void cross_entropy_fwd(acc_t<T>* row_loss, acc_t<T>* lse, const T* logits, const I* labels,
                       int64_t rows, int64_t vocab, int64_t ignore_index);

// dlogits[r, v] = (exp(logits[r, v] - lse[r]) - [v == label[r]]) * grad_loss[0] * scale, and a
// zero row where label[r] == ignore_index (=). grad_loss points at the scalar upstream gradient
// (kept as a pointer so a device launcher needs no host sync); scale is 1/num_valid for the mean
// reduction and 1 for the sum.
template <typename T, typename I>
void cross_entropy_bwd(T* dlogits, const T* logits, const acc_t<T>* lse, const I* labels,
                       const acc_t<T>* grad_loss, double scale, int64_t rows, int64_t vocab,
                       int64_t ignore_index);

} // namespace vlm::kernels::cpu
