// First-use self-checks (src/core/ops/self_check.h) of the fused norm CUDA kernels of issue 34:
// residual add + RMSNorm (add_rms_norm, kernels/norm.h) and q/k RMSNorm + RoPE (rms_norm_rope,
// kernels/rope.h). A check runs the op's CUDA kernels, forward then backward, on small random
// problems of the op's own row width (head shape) and weight mode, and compares every output with
// the CPU kernels in the same dtype. After a mismatch the op runs its unfused primitives on the
// device (add then rms_norm; rms_norm then rope), whose kernels are not part of this check.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/norm.h"
#include "kernels/rope.h"
#include "src/core/tensor.h"

namespace vlm::ops_detail {

// Whether the CUDA add_rms_norm kernels may run on `device` for rows of `dim` in `dtype` (f32 or
// bf16) with weight mode `mode`: measured at the first use of each combination, then cached.
bool add_rms_norm_cuda_passes(DType dtype, int64_t dim, kernels::RmsNormWeight mode, Device device);
// The same for rms_norm_rope on heads of `head_dim` that rotate their first `rotary_dim` dims.
bool rms_norm_rope_cuda_passes(DType dtype, int64_t head_dim, int64_t rotary_dim,
                               kernels::RmsNormWeight mode, Device device);

// Both sides compute in fp32 from the same T inputs, in another summation order (warp reductions
// on the GPU): ~1e-6 relative in f32, so 1e-4; in bf16 an output may round to the neighbouring
// value (2^-8 relative, 2^-7 at the bottom of a binade), and where two roundings follow each other
// (y = w * T(x_hat), ds = ds_in + T(dx)) to the next but one: up to ~1.6e-2 of the largest output,
// so 2e-2. A wrong term, row or rotation is O(1) (>= 0.45 in the tests), a missed output NaN.
double fused_norm_tolerance(DType dtype);

// --- the measures, the kernels under test a parameter (tests swap in wrong ones) --------------

// One add_rms_norm problem, every tensor contiguous on one device. Inputs x, h, ds_in, dy [rows,
// dim] and w [dim] (undefined for mode none); outputs s, y, ds [rows, dim], rstd [rows] (f32) and
// dw [dim] (undefined for mode none).
struct AddRmsNormProblem {
  Tensor x, h, w, ds_in, dy;
  Tensor s, y, rstd, ds, dw;
  kernels::RmsNormWeight mode = kernels::RmsNormWeight::none;
  double eps = 0;
};
// Fills a problem's outputs: the forward from x, h and w, then the backward from the forward's s
// and rstd, dy and ds_in, as the op and its backward node chain them.
using AddRmsNormKernels = std::function<void(AddRmsNormProblem&)>;
// The kernels of the problem's device (kernels::cpu or kernels::cuda).
void run_add_rms_norm_kernels(AddRmsNormProblem& p);

// One rms_norm_rope problem, contiguous on one device: x, dy [T, H, D], w [D] (undefined for mode
// none), cos, sin [T, R/2]; outputs y, dx [T, H, D], rstd [T * H] (f32), dw [D].
struct RmsNormRopeProblem {
  Tensor x, w, cos, sin, dy;
  Tensor y, rstd, dx, dw;
  kernels::RmsNormWeight mode = kernels::RmsNormWeight::none;
  kernels::RopeShape shape;
  double eps = 0;
};
using RmsNormRopeKernels = std::function<void(RmsNormRopeProblem&)>;
void run_rms_norm_rope_kernels(RmsNormRopeProblem& p);

// The checks' measures: the max-norm relative error, over every output, of `kernels` run on
// `device` against the CPU kernels on the same random problem (37 rows: several row blocks and
// dw chunks; 7 tokens x 5 heads for rms_norm_rope), once with every buffer 16-byte aligned and
// once with every buffer an element off (vector and scalar loads). Outputs start as NaN.
double add_rms_norm_check_error(DType dtype, int64_t dim, kernels::RmsNormWeight mode,
                                Device device, const AddRmsNormKernels& kernels);
double rms_norm_rope_check_error(DType dtype, int64_t head_dim, int64_t rotary_dim,
                                 kernels::RmsNormWeight mode, Device device,
                                 const RmsNormRopeKernels& kernels);

} // namespace vlm::ops_detail
