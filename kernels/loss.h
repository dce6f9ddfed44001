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
// validated with check_labels. The gradient is lce_chunk_bwd with chunk = vocab and v0 = 0.
template <typename T, typename I>
void cross_entropy_fwd(acc_t<T>* row_loss, acc_t<T>* lse, const T* logits, const I* labels,
                       int64_t rows, int64_t vocab, int64_t ignore_index);

// Fused LM head + cross-entropy (linear_cross_entropy in src/core/ops/loss.h), one vocabulary
// chunk at a time; `logits` is [rows, chunk] holding the columns [v0, v0 + chunk) of x w^T.
// lce_chunk_fwd merges the chunk into the running per-row (run_max, run_sum = sum of
// exp(l - run_max)) (+=), starting from (-inf, 0), and sets target[r] (=) to the label's logit
// when the label falls in the chunk. Logits are finite or -inf.
template <typename T, typename I>
void lce_chunk_fwd(acc_t<T>* run_max, acc_t<T>* run_sum, acc_t<T>* target, const T* logits,
                   const I* labels, int64_t rows, int64_t chunk, int64_t v0, int64_t ignore_index);
// lse[r] = run_max + log(run_sum) (run_max when that is -inf) and row_loss[r] = lse - target, or 0
// for an ignored row (=).
template <typename A, typename I>
void lce_finish(A* row_loss, A* lse, const A* run_max, const A* run_sum, const A* target,
                const I* labels, int64_t rows, int64_t ignore_index);
// The gradient of the loss w.r.t. the chunk's logits (the whole row for chunk = vocab, v0 = 0):
// dlogits[r, c] = (exp(logits[r, c] - lse[r]) - [v0 + c == label[r]]) * grad_loss[0] * scale[0]
// with the product grad_loss[0] * scale[0] taken in double and rounded to acc_t<T> once, and zero
// rows for ignored labels (=). grad_loss points at the scalar upstream gradient and scale at
// 1/num_valid for the mean reduction (1 for the sum); both are pointers so that a device launcher
// reads them from device memory, without a host synchronization.
template <typename T, typename I>
void lce_chunk_bwd(T* dlogits, const T* logits, const acc_t<T>* lse, const I* labels,
                   const acc_t<T>* grad_loss, const double* scale, int64_t rows, int64_t chunk,
                   int64_t v0, int64_t ignore_index);

} // namespace vlm::kernels::cpu

// GPU versions (kernels/cuda/loss.cu), T = float or bf16, I = int32_t or int64_t; pointers on
// the current device, asynchronous on `stream`; nothing here synchronizes. Labels are not
// validated beforehand: ce_reduce reports a label outside [0, vocab) (and not ignore_index)
// through the deferred device error record, and every kernel treats such a row as ignored where
// it would otherwise read out of bounds (its loss is 0 and it is not counted; its gradient row is
// unspecified, as the failure will be reported).
namespace vlm::kernels::cuda {

// One block per row: online max/sum-exp in fp32, then lse and row_loss as the CPU op.
template <typename T, typename I>
void cross_entropy_fwd(float* row_loss, float* lse, const T* logits, const I* labels, int64_t rows,
                       int64_t vocab, int64_t ignore_index, void* stream);

// The batch loss from the per-row losses, on the device: num_valid[0] (=) = the rows whose label
// is in [0, vocab); loss[0] (=) = their row_loss summed in double (each thread of one block over
// a fixed stride of rows, then a fixed tree: the order depends on `rows` only) times scale[0],
// rounded to float once; scale[0] (=) = 1/num_valid for the mean (0 when no row is valid: a
// fully masked batch gives loss 0 and zero gradients), 1 for the sum. The first row (smallest
// index) with a label outside [0, vocab) that is not ignore_index is reported under `site`.
template <typename I>
void ce_reduce(float* loss, int64_t* num_valid, double* scale, const float* row_loss,
               const I* labels, int64_t rows, int64_t vocab, int64_t ignore_index, bool mean,
               int32_t site, void* stream);

// The fused LM head + cross-entropy chunk kernels, as the cpu:: ones (fp32 state, which the caller
// starts at run_max = -inf, run_sum = 0). lce_chunk_bwd with chunk = vocab and v0 = 0 is the plain
// cross-entropy gradient.
template <typename T, typename I>
void lce_chunk_fwd(float* run_max, float* run_sum, float* target, const T* logits, const I* labels,
                   int64_t rows, int64_t chunk, int64_t v0, int64_t ignore_index, void* stream);
template <typename I>
void lce_finish(float* row_loss, float* lse, const float* run_max, const float* run_sum,
                const float* target, const I* labels, int64_t rows, int64_t ignore_index,
                void* stream);
template <typename T, typename I>
void lce_chunk_bwd(T* dlogits, const T* logits, const float* lse, const I* labels,
                   const float* grad_loss, const double* scale, int64_t rows, int64_t chunk,
                   int64_t v0, int64_t ignore_index, void* stream);
// out[i] = in[i] rounded to nearest even bf16 (=).
void round_to_bf16(bf16* out, const float* in, int64_t n, void* stream);

} // namespace vlm::kernels::cuda
