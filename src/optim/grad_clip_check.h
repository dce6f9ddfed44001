// First-use self-check of the multi-tensor gradient kernels (kernels/optim.h multi_sum_squares and
// multi_scale, behind optim::grad_norm_squared, scale_grads and clip_grad_norm_async), per CUDA
// device and gradient dtype mix, through src/core/ops/self_check.h (VLM_GPU_SELF_CHECK). After a
// mismatch grad_clip.cpp runs the per-tensor path instead: each gradient's sum of squares by the
// CPU kernel on a host copy, and scale_ per gradient (slow, and it reads the device; but correct).
#pragma once

#include "src/core/device.h"

namespace vlm::optim {

// True when the multi-tensor kernels may run for gradients on `device` (CUDA) holding f32
// gradients (has_f32) and / or bf16 ones (has_bf16). The first call per (device, mix) runs them
// on a few gradients of that mix and compares with the CPU in f64; later calls are a cache lookup.
bool multi_tensor_grad_kernels_pass(Device device, bool has_f32, bool has_bf16);

} // namespace vlm::optim
