// The attention op's cuDNN path (kernels/attention_cudnn.h): which backend runs a configuration,
// its first-use self-check against the own reference kernel, and the forward/backward calls on
// tensors. The op (src/core/ops/attention.cpp) asks for cuDNN first on CUDA bf16 and runs its own
// kernel whenever the answer is no.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "kernels/attention_cudnn.h"
#include "src/core/tensor.h"
#include "src/core/varlen.h"

namespace vlm::ops_detail {

namespace cudnn_attention = kernels::cudnn_attention;

// What a self-check found: cuDNN's worst relative error against the own reference kernel, or why
// cuDNN cannot run the problem at all (`unsupported` set: a fallback, never a self-check failure).
struct AttentionProbe {
  double error = 0;
  std::string unsupported;
};

// The backend for one configuration, decided once per check_key and process: choose_backend,
// then for cuDNN the self-check (gpu_kernel_passes, VLM_GPU_SELF_CHECK) with `probe`. An own-kernel
// outcome is said in one line through `log`. Throws vlm::Error when `request` is cudnn and cuDNN
// cannot run (unsupported or its self-check fails), and in strict mode on a mismatch.
cudnn_attention::Backend
decide_attention_backend(const cudnn_attention::Capability& cap,
                         const kernels::AttentionShape& shape, DType dtype,
                         cudnn_attention::Request request, bool deterministic,
                         const std::function<AttentionProbe()>& probe,
                         const std::function<void(const std::string&)>& log);

// The self-check's bound on cuDNN's error against the own reference on bf16 inputs: relative L2
// error of O, dQ, dK and dV, and |ΔLSE| / max(1, |LSE|) per row.
constexpr double kAttentionSelfCheckTolerance = 3e-2;

// Runs the small self-check problem for `shape`'s configuration on the current CUDA device
// (documents of 1, 17, 64, 127, 128, 300 tokens, an empty one, and one of 192 tokens whose scores
// are all near -100, the row-LSE < -88.7 case that broke a cuDNN backward), cuDNN against
// kernels::cuda::attention_ref_*; outputs NaN-poisoned first, inputs' spare rows zero; with
// `deterministic`, the backward twice, bitwise equal.
AttentionProbe probe_cudnn_attention(const kernels::AttentionShape& shape, bool deterministic,
                                     Device device);

// The first `rows` rows of a contiguous tensor, as a view.
Tensor first_rows(const Tensor& t, int64_t rows);

// What the cuDNN forward leaves for its backward.
struct CudnnAttentionSaved {
  Tensor q, k, v;  // [T + kSpareRows, H, D] copies, spare rows zero
  Tensor out, lse; // [T + kSpareRows, ...]; the op returns their first T rows
  Tensor ragged;   // the layout's device image (u8), shared with the batch's VarlenLayout
  cudnn_attention::PlanKey key;
};

// The forward through cuDNN when this configuration's backend is cuDNN and its plan builds;
// nullopt: run the own kernel (said once per plan key). q, k, v: contiguous bf16 CUDA tensors;
// varlen: the batch's layout (its cache keeps the ragged image: one upload per batch).
std::optional<CudnnAttentionSaved> cudnn_attention_forward(const Tensor& q, const Tensor& k,
                                                           const Tensor& v,
                                                           const VarlenLayout& varlen,
                                                           const kernels::AttentionShape& shape);
// dq, dk, dv ([T, H, D] views) through cuDNN; false: its backward plan does not build here (said
// once), run the own kernel on the saved tensors' first T rows.
bool cudnn_attention_backward(const CudnnAttentionSaved& saved, const Tensor& dout, Tensor& dq,
                              Tensor& dk, Tensor& dv);

// Forward and backward calls cuDNN ran in this process (tests: which backend ran).
int64_t cudnn_attention_runs();

// One line for the startup log: the attention backend on `device` and why.
std::string attention_backend_summary(Device device);

} // namespace vlm::ops_detail
