// The GEMM that writes the weight gradient of a bf16 parameter straight into its f32 .grad
// (issue 34, accumulate_weight_grad in src/core/autograd.h): bf16 operands, an f32 output, fp32
// accumulation, beta = 1 onto the .grad (0 for a fresh one). Linear's weight and bias, matmul's
// 2-D right operand and the lm_head of linear_cross_entropy all go through weight_grad_gemm, so
// the CUDA call is checked in this one place (src/core/ops/self_check.h).
#pragma once

#include <functional>

#include "kernels/gemm.h"
#include "src/core/device.h"

namespace vlm::ops_detail {

// c = op(a) op(b) + beta * c (beta 0 or 1) for bf16 a and b and an f32 c, row-major and
// contiguous on `device`, laid out as kernels/gemm.h says; c is not read when beta = 0. On the
// CPU kernels::cpu::gemm_bf16_f32. On CUDA the cuBLASLt call with bf16 inputs and an f32 output
// once it passed its first-use check for this device and (trans_a, trans_b); after a mismatch the
// product of the ordinary bf16 GEMM (rounded to bf16 once, the path before issue 34) widened and
// added.
void weight_grad_gemm(float* c, const bf16* a, const bf16* b, const kernels::cpu::GemmShape& s,
                      float beta, Device device);

// --- the first-use check, the GEMM under test a parameter (tests swap in wrong ones) ----------

// Computes c = op(a) op(b) + beta * c as weight_grad_gemm does (pointers on the checked device).
using Bf16F32Gemm = std::function<void(float* c, const bf16* a, const bf16* b,
                                       const kernels::cpu::GemmShape& s, float beta)>;

// bf16 products are exact in fp32, so the only difference from an f64 product is the fp32
// accumulation (~1e-6 of the largest output here); a product rounded to bf16 is ~2e-3 off, a lost
// beta term or a wrong layout O(1).
inline constexpr double kWeightGradGemmTolerance = 1e-5;

// The check's measure: runs `gemm` on `device` for layout (trans_a, trans_b) on a few small
// problems (a single output row as a bias's gradient has, a long inner dimension as many tokens
// give; every operand 16-byte aligned, then every one an element off), with beta = 1 onto a
// random f32 start and with beta = 0 onto NaNs, and returns the max-norm relative error against
// the f64 products of the same bf16 values.
double weight_grad_gemm_check_error(bool trans_a, bool trans_b, Device device,
                                    const Bf16F32Gemm& gemm);

} // namespace vlm::ops_detail
