#include "src/core/ops/fused_norm_check.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "src/core/ops/common.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/rope.h"
#include "src/core/ops/self_check.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::ops_detail {

using kernels::RmsNormWeight;

namespace {

constexpr double kEps = 1e-6;
constexpr int64_t kRows = 37;              // add_rms_norm
constexpr int64_t kTokens = 7, kHeads = 5; // rms_norm_rope: 35 rows
constexpr uint64_t kSeed = 20260634;

const char* mode_name(RmsNormWeight mode) {
  return mode == RmsNormWeight::none ? "none" : mode == RmsNormWeight::scale ? "scale" : "offset";
}

template <typename T> const T* in_ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <typename T> T* out_ptr(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }

// A NaN-filled buffer on `device` whose data starts `shift` elements into its allocation (shift 1:
// not 16-byte aligned). An output the kernel misses stays NaN and fails the comparison.
Tensor nan_buffer(const Shape& shape, DType dtype, Device device, int64_t shift) {
  Tensor buffer = Tensor::empty({numel(shape) + shift}, dtype, device);
  fill_(buffer, std::numeric_limits<double>::quiet_NaN());
  return buffer.as_strided(shape, contiguous_strides(shape), shift);
}
Tensor nan_like(const Tensor& like, Device device, int64_t shift) {
  return like.defined() ? nan_buffer(like.shape(), like.dtype(), device, shift) : Tensor();
}
// A copy of host `values` on `device`, placed as nan_buffer places it; undefined stays undefined.
Tensor placed(const Tensor& values, Device device, int64_t shift) {
  if (!values.defined()) return values;
  Tensor t = nan_buffer(values.shape(), values.dtype(), device, shift);
  copy_(t, values);
  return t;
}

// A weight around the mode's identity (1 for scale, 0 for the zero-centred offset).
Tensor random_weight(int64_t dim, RmsNormWeight mode, Rng& rng, DType dtype) {
  if (mode == RmsNormWeight::none) return Tensor();
  return Tensor::randn({dim}, rng, dtype, 0.3, mode == RmsNormWeight::scale ? 1.0 : 0.0);
}

// The max over pairs (got, want) of max_rel_error; pairs with an undefined `want` are skipped.
double max_error(std::initializer_list<std::pair<Tensor, Tensor>> outputs) {
  double error = 0;
  for (const auto& [got, want] : outputs)
    if (want.defined())
      error = std::max(error, got.defined() ? max_rel_error(got.to_doubles(), want.to_doubles())
                                            : std::numeric_limits<double>::infinity());
  return error;
}

} // namespace

double fused_norm_tolerance(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 1e-4; }

void run_add_rms_norm_kernels(AddRmsNormProblem& p) {
  const int64_t rows = p.x.size(0), dim = p.x.size(1);
  dispatch(
      "add_rms_norm self-check", p.x.device(), p.x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::add_rms_norm_fwd<T>(p.s.data<T>(), p.y.data<T>(), p.rstd.data<acc_t<T>>(),
                                          p.x.data<T>(), p.h.data<T>(), in_ptr<T>(p.w), p.mode,
                                          rows, dim, p.eps);
        kernels::cpu::add_rms_norm_bwd<T>(p.ds.data<T>(), out_ptr<T>(p.dw), p.ds_in.data<T>(),
                                          p.dy.data<T>(), p.s.data<T>(), in_ptr<T>(p.w),
                                          p.rstd.data<acc_t<T>>(), p.mode, rows, dim);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        kernels::cuda::add_rms_norm_fwd<T>(p.s.data<T>(), p.y.data<T>(), p.rstd.data<float>(),
                                           p.x.data<T>(), p.h.data<T>(), in_ptr<T>(p.w), p.mode,
                                           rows, dim, p.eps, stream);
        kernels::cuda::add_rms_norm_bwd<T>(p.ds.data<T>(), out_ptr<T>(p.dw), p.ds_in.data<T>(),
                                           p.dy.data<T>(), p.s.data<T>(), in_ptr<T>(p.w),
                                           p.rstd.data<float>(), p.mode, rows, dim, stream);
      });
}

void run_rms_norm_rope_kernels(RmsNormRopeProblem& p) {
  dispatch(
      "rms_norm_rope self-check", p.x.device(), p.x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::rms_norm_rope_fwd<T>(p.y.data<T>(), p.rstd.data<acc_t<T>>(), p.x.data<T>(),
                                           in_ptr<T>(p.w), p.mode, p.cos.data<T>(), p.sin.data<T>(),
                                           p.shape, p.eps);
        kernels::cpu::rms_norm_rope_bwd<T>(p.dx.data<T>(), out_ptr<T>(p.dw), p.dy.data<T>(),
                                           p.x.data<T>(), in_ptr<T>(p.w), p.rstd.data<acc_t<T>>(),
                                           p.mode, p.cos.data<T>(), p.sin.data<T>(), p.shape);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        kernels::cuda::rms_norm_rope_fwd<T>(p.y.data<T>(), p.rstd.data<float>(), p.x.data<T>(),
                                            in_ptr<T>(p.w), p.mode, p.cos.data<T>(),
                                            p.sin.data<T>(), p.shape, p.eps, stream);
        kernels::cuda::rms_norm_rope_bwd<T>(
            p.dx.data<T>(), out_ptr<T>(p.dw), p.dy.data<T>(), p.x.data<T>(), in_ptr<T>(p.w),
            p.rstd.data<float>(), p.mode, p.cos.data<T>(), p.sin.data<T>(), p.shape, stream);
      });
}

double add_rms_norm_check_error(DType dtype, int64_t dim, RmsNormWeight mode, Device device,
                                const AddRmsNormKernels& kernels) {
  Rng rng(kSeed);
  AddRmsNormProblem want;
  want.x = Tensor::randn({kRows, dim}, rng, dtype);
  want.h = Tensor::randn({kRows, dim}, rng, dtype, 0.5);
  want.w = random_weight(dim, mode, rng, dtype);
  want.ds_in = Tensor::randn({kRows, dim}, rng, dtype);
  want.dy = Tensor::randn({kRows, dim}, rng, dtype);
  want.mode = mode;
  want.eps = kEps;
  const Device cpu = Device::cpu();
  want.s = nan_like(want.x, cpu, 0);
  want.y = nan_like(want.x, cpu, 0);
  want.ds = nan_like(want.x, cpu, 0);
  want.dw = nan_like(want.w, cpu, 0);
  want.rstd = nan_buffer({kRows}, DType::f32, cpu, 0);
  run_add_rms_norm_kernels(want);
  double error = 0;
  for (int64_t shift : {0, 1}) {
    AddRmsNormProblem got = want;
    for (Tensor* in : {&got.x, &got.h, &got.w, &got.ds_in, &got.dy})
      *in = placed(*in, device, shift);
    for (Tensor* out : {&got.s, &got.y, &got.ds, &got.dw, &got.rstd})
      *out = nan_like(*out, device, shift);
    kernels(got);
    error = std::max(error, max_error({{got.s, want.s},
                                       {got.y, want.y},
                                       {got.rstd, want.rstd},
                                       {got.ds, want.ds},
                                       {got.dw, want.dw}}));
  }
  return error;
}

double rms_norm_rope_check_error(DType dtype, int64_t head_dim, int64_t rotary_dim,
                                 RmsNormWeight mode, Device device,
                                 const RmsNormRopeKernels& kernels) {
  Rng rng(kSeed);
  RmsNormRopeProblem want;
  want.shape.tokens = kTokens;
  want.shape.heads = kHeads;
  want.shape.head_dim = head_dim;
  want.shape.rotary_dim = rotary_dim;
  want.x = Tensor::randn({kTokens, kHeads, head_dim}, rng, dtype, 1.0, 0.3);
  want.w = random_weight(head_dim, mode, rng, dtype);
  want.dy = Tensor::randn({kTokens, kHeads, head_dim}, rng, dtype);
  // Positions far apart, so that every frequency slot turns through a different angle.
  const std::vector<int64_t> positions{0, 1, 2, 17, 300, 4095, 40000};
  const RopeTables tables =
      rope_tables(Tensor::from_vector(positions, {kTokens}), rotary_dim, 1e6, dtype);
  want.cos = tables.cos;
  want.sin = tables.sin;
  want.mode = mode;
  want.eps = kEps;
  const Device cpu = Device::cpu();
  want.y = nan_like(want.x, cpu, 0);
  want.dx = nan_like(want.x, cpu, 0);
  want.dw = nan_like(want.w, cpu, 0);
  want.rstd = nan_buffer({kTokens * kHeads}, DType::f32, cpu, 0);
  run_rms_norm_rope_kernels(want);
  double error = 0;
  for (int64_t shift : {0, 1}) {
    RmsNormRopeProblem got = want;
    for (Tensor* in : {&got.x, &got.w, &got.cos, &got.sin, &got.dy})
      *in = placed(*in, device, shift);
    for (Tensor* out : {&got.y, &got.dx, &got.dw, &got.rstd}) *out = nan_like(*out, device, shift);
    kernels(got);
    error = std::max(
        error,
        max_error({{got.y, want.y}, {got.rstd, want.rstd}, {got.dx, want.dx}, {got.dw, want.dw}}));
  }
  return error;
}

bool add_rms_norm_cuda_passes(DType dtype, int64_t dim, RmsNormWeight mode, Device device) {
  const std::string key = detail::str_cat("add_rms_norm ", dtype_name(dtype), " dim=", dim,
                                          " weight=", mode_name(mode), " on ", device.str());
  return gpu_kernel_passes(
      key, fused_norm_tolerance(dtype),
      [&] { return add_rms_norm_check_error(dtype, dim, mode, device, run_add_rms_norm_kernels); },
      "add then rms_norm (the unfused kernels) on the device");
}

bool rms_norm_rope_cuda_passes(DType dtype, int64_t head_dim, int64_t rotary_dim,
                               RmsNormWeight mode, Device device) {
  const std::string key = detail::str_cat("rms_norm_rope ", dtype_name(dtype),
                                          " head_dim=", head_dim, " rotary_dim=", rotary_dim,
                                          " weight=", mode_name(mode), " on ", device.str());
  return gpu_kernel_passes(
      key, fused_norm_tolerance(dtype),
      [&] {
        return rms_norm_rope_check_error(dtype, head_dim, rotary_dim, mode, device,
                                         run_rms_norm_rope_kernels);
      },
      "rms_norm then rope (the unfused kernels) on the device");
}

} // namespace vlm::ops_detail
