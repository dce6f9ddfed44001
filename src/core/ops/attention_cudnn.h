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

// The backend for one plan key (a configuration and a size class), decided once per key and
// process: choose_backend, then for cuDNN the key's self-check (gpu_kernel_passes,
// VLM_GPU_SELF_CHECK) with `probe`. An own-kernel outcome is said in one line through `log`.
// Throws vlm::Error when `request` is cudnn and cuDNN cannot run (unsupported or its self-check
// fails), and in strict mode on a mismatch.
cudnn_attention::Backend
decide_attention_backend(const cudnn_attention::Capability& cap,
                         const kernels::AttentionShape& shape, DType dtype,
                         cudnn_attention::Request request, const cudnn_attention::PlanKey& key,
                         const std::function<AttentionProbe()>& probe,
                         const std::function<void(const std::string&)>& log);
// "cudnn attention 9.19.0 sm90 B8 S256 T1280 Hq16 Hkv8 D128 causal nondet scale=0.0883883": the
// self-check's key (library version and plan key).
std::string check_name(const cudnn_attention::Capability& cap, const cudnn_attention::PlanKey& key);

// The self-check's bound on cuDNN's error against the own reference on bf16 inputs: relative L2
// error of O, dQ, dK and dV, and |ΔLSE| / max(1, |LSE|) per row.
constexpr double kAttentionSelfCheckTolerance = 3e-2;

// Runs the self-check problem of one plan key on the current CUDA device: the cheapest problem of
// its size class (size_class_lengths: the longest document just past the level below, an empty
// one, lengths 1, 17, 127 and 192 where they fit; the last document's scores all near -100, the
// row-LSE < -88.7 case that broke a cuDNN backward), cuDNN as the op runs it (outputs NaN-poisoned
// first, spare rows zeroed between forward and backward) against kernels::cuda::attention_ref_*;
// with `deterministic`, the backward twice, bitwise equal.
AttentionProbe probe_cudnn_attention(const kernels::AttentionShape& shape,
                                     const cudnn_attention::SizeClass& size, bool deterministic,
                                     Device device);

// The plan key a problem of `size` runs with on `device` (determinism as requested, unless the
// deterministic workspace is over the limit: then the non-deterministic key, said once), its plans
// built and self-checked at the first call per key; nullopt: the own kernel runs it. With
// settings().build_whole_set, the first call of a configuration builds and checks every size
// class of its rows level (size_classes); a later rows level is said once, its plans built as
// they come.
std::optional<cudnn_attention::PlanKey> cudnn_plan_for(const kernels::AttentionShape& shape,
                                                       const cudnn_attention::SizeClass& size,
                                                       Device device);

// The first `rows` rows of a contiguous tensor, as a view.
Tensor first_rows(const Tensor& t, int64_t rows);

// What the cuDNN forward leaves for its backward.
struct CudnnAttentionSaved {
  Tensor q, k, v;  // [T + spare_rows, H, D] copies, spare rows zero
  Tensor out, lse; // [T + spare_rows, ...], spare rows zero; the op returns their first T rows
  Tensor ragged;   // the layout's device image (u8), shared with the batch's VarlenLayout
  int64_t spare_rows = 0;
  cudnn_attention::PlanKey key;
};

// The forward through cuDNN when this problem's plan key runs on cuDNN; nullopt: run the own
// kernel (said once per key). q, k, v: contiguous bf16 CUDA tensors; varlen: the batch's layout
// (its cache keeps the ragged image: one upload per batch).
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
