#include "src/core/ops/conv1d.h"

#include <algorithm>
#include <vector>

#include "kernels/conv1d.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"
#include "src/core/ops/self_check.h"
#include "src/core/varlen.h"

namespace vlm {

using namespace ops_detail;

namespace {

constexpr const char* kOp = "causal_conv1d";

// The CUDA kernels' first-use check (src/core/ops/self_check.h): forward and backward, SiLU on
// and off, 40 channels over documents of 5, 1, 0, 70 and 3 tokens, against the CPU kernels in the
// same dtype. Both sides sum in fp32 in the same order; they differ by FMA contraction and expf
// (~1e-7 relative in f32) and, in bf16, by at most one rounding of an output (2^-8 relative).
// Tolerances: 1e-4 (f32), 1e-2 (bf16); a wrong tap, document boundary or missing term is O(1).
template <typename T> double cuda_error(int64_t K, Device device, void* stream) {
  const std::vector<int32_t> offsets{0, 5, 6, 6, 76, 79};
  const int64_t tokens = 79, C = 40, docs = int64_t(offsets.size()) - 1;
  const DType dtype = std::is_same_v<T, float> ? DType::f32 : DType::bf16;
  Rng rng(20260601);
  Tensor x = Tensor::randn({tokens, C}, rng, dtype), w = Tensor::randn({C, K}, rng, dtype, 0.5),
         dy = Tensor::randn({tokens, C}, rng, dtype);
  Tensor xd = x.to(device), wd = w.to(device), dyd = dy.to(device);
  const VarlenLayout varlen = VarlenLayout::of(Tensor::from_vector(offsets, {docs + 1}), tokens);
  const kernels::VarlenOffsets offsets_dev = varlen.device_offsets(device);
  double error = 0;
  for (bool silu : {false, true}) {
    Tensor y = Tensor::empty(x.shape(), dtype), dx = Tensor::empty(x.shape(), dtype),
           dw = Tensor::empty(w.shape(), dtype);
    kernels::cpu::causal_conv1d_fwd<T>(y.data<T>(), x.data<T>(), w.data<T>(), offsets.data(), docs,
                                       tokens, C, K, silu);
    kernels::cpu::causal_conv1d_bwd<T>(dx.data<T>(), dw.data<T>(), dy.data<T>(), x.data<T>(),
                                       w.data<T>(), offsets.data(), docs, tokens, C, K, silu);
    Tensor yd = Tensor::empty(x.shape(), dtype, device),
           dxd = Tensor::empty(x.shape(), dtype, device),
           dwd = Tensor::empty(w.shape(), dtype, device);
    kernels::cuda::causal_conv1d_fwd<T>(yd.data<T>(), xd.data<T>(), wd.data<T>(), offsets_dev,
                                        tokens, C, K, silu, stream);
    kernels::cuda::causal_conv1d_bwd<T>(dxd.data<T>(), dwd.data<T>(), dyd.data<T>(), xd.data<T>(),
                                        wd.data<T>(), offsets_dev, tokens, C, K, silu, stream);
    for (auto [got, want] : {std::pair{yd, y}, std::pair{dxd, dx}, std::pair{dwd, dw}})
      error = std::max(error, max_rel_error(got.to(Device::cpu()).to_doubles(), want.to_doubles()));
  }
  return error;
}

// Whether the CUDA kernels may run for this dtype and kernel size (checked on first use).
template <typename T> bool cuda_kernels_pass(int64_t K, Device device, void* stream) {
  const bool f32 = std::is_same_v<T, float>;
  const std::string key =
      detail::str_cat(kOp, " ", f32 ? "f32" : "bf16", " kernel_size=", K, " on ", device.str());
  return gpu_kernel_passes(key, f32 ? 1e-4 : 1e-2,
                           [&] { return cuda_error<T>(K, device, stream); });
}

void check_cuda_kernel_size(const Tensor& weight) {
  VLM_CHECK(weight.device().is_cpu() || weight.size(1) <= kernels::cuda::kMaxConvTaps, kOp,
            ": kernel_size <= ", kernels::cuda::kMaxConvTaps, " on CUDA, got ",
            describe("weight", weight));
}

// y from contiguous, detached x and w on one device; the CUDA kernels read the layout's device
// offsets. After a failed self-check the CUDA case runs the CPU kernel on host copies.
Tensor forward(const Tensor& x, const Tensor& w, const VarlenLayout& varlen, bool silu) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t docs = varlen.docs, K = w.size(1);
  bool on_host = false;
  dispatch(
      kOp, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::causal_conv1d_fwd<T>(out.data<T>(), x.data<T>(), w.data<T>(),
                                           varlen.cu_seqlens.data<int32_t>(), docs, x.size(0),
                                           x.size(1), K, silu);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        if (!cuda_kernels_pass<T>(K, x.device(), stream)) {
          on_host = true;
          return;
        }
        kernels::cuda::causal_conv1d_fwd<T>(out.data<T>(), x.data<T>(), w.data<T>(),
                                            varlen.device_offsets(x.device()), x.size(0), x.size(1),
                                            K, silu, stream);
      });
  if (on_host)
    return forward(x.to(Device::cpu()), w.to(Device::cpu()), varlen, silu).to(x.device());
  return out;
}

struct Grads {
  Tensor dx, dw; // undefined when not wanted
};

// dx and / or dw from contiguous, detached tensors on one device (as forward()).
Grads backward(bool want_dx, bool want_dw, const Tensor& dy, const Tensor& x, const Tensor& w,
               const VarlenLayout& varlen, bool silu) {
  const Device device = x.device();
  Grads r;
  if (want_dx) r.dx = Tensor::empty(x.shape(), x.dtype(), device);
  if (want_dw) r.dw = Tensor::empty(w.shape(), x.dtype(), device);
  const int64_t docs = varlen.docs, K = w.size(1);
  auto ptr = [](const Tensor& t, auto tag) {
    return t.defined() ? t.data<decltype(tag)>() : nullptr;
  };
  bool on_host = false;
  dispatch(
      kOp, device, x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::causal_conv1d_bwd<T>(ptr(r.dx, t), ptr(r.dw, t), dy.data<T>(), x.data<T>(),
                                           w.data<T>(), varlen.cu_seqlens.data<int32_t>(), docs,
                                           x.size(0), x.size(1), K, silu);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        if (!cuda_kernels_pass<T>(K, device, stream)) {
          on_host = true;
          return;
        }
        kernels::cuda::causal_conv1d_bwd<T>(ptr(r.dx, t), ptr(r.dw, t), dy.data<T>(), x.data<T>(),
                                            w.data<T>(), varlen.device_offsets(device), x.size(0),
                                            x.size(1), K, silu, stream);
      });
  if (!on_host) return r;
  const Device cpu = Device::cpu();
  Grads h = backward(want_dx, want_dw, dy.to(cpu), x.to(cpu), w.to(cpu), varlen, silu);
  return {want_dx ? h.dx.to(device) : Tensor(), want_dw ? h.dw.to(device) : Tensor()};
}

struct CausalConv1dBackward final : Node {
  Tensor x, weight;    // contiguous, no history
  VarlenLayout varlen; // the forward's (its device offsets are shared)
  bool silu = false;
  const char* name() const override { return "CausalConv1dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    VLM_CHECK(grads[0].shape() == x.shape() && grads[0].dtype() == x.dtype(), name(), ": ",
              describe("grad", grads[0]), " does not match ", describe("x", x));
    Grads r = backward(needs_input_grad(0), needs_input_grad(1), grads[0].contiguous(), x, weight,
                       varlen, silu);
    return {r.dx, r.dw};
  }
  void release() override {
    x = weight = Tensor();
    varlen = VarlenLayout();
  }
};

void check_operands(const Tensor& x, const Tensor& weight) {
  check_float(kOp, "x", x);
  check_float(kOp, "weight", weight);
  check_same_dtype(kOp, "x", x, "weight", weight);
  check_same_device(kOp, "x", x, "weight", weight);
  check_dim(kOp, "x", x, 2);
  check_dim(kOp, "weight", weight, 2);
  VLM_CHECK(weight.size(0) == x.size(1) && weight.size(1) >= 1, kOp, ": ",
            describe("weight", weight), " must be [C, K] with K >= 1 for ", describe("x", x),
            " ([T, C])");
}

} // namespace

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const VarlenLayout& varlen, bool silu) {
  check_operands(x, weight);
  VLM_CHECK(varlen.cu_seqlens.defined() && varlen.tokens == x.size(0), kOp, ": the layout has ",
            varlen.tokens, " tokens but ", describe("x", x));
  Tensor xc = plain(x), wc = plain(weight);
  check_cuda_kernel_size(weight);
  Tensor out = forward(xc, wc, varlen, silu);
  if (needs_grad({&x, &weight})) {
    auto node = std::make_shared<CausalConv1dBackward>();
    node->x = xc;
    node->weight = wc;
    node->varlen = varlen;
    node->silu = silu;
    record(node, {&x, &weight}, {&out});
  }
  return out;
}

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& cu_seqlens, bool silu) {
  check_operands(x, weight);
  check_cu_seqlens(kOp, cu_seqlens, "x", x);
  return causal_conv1d(x, weight, VarlenLayout::of(cu_seqlens, x.size(0)), silu);
}

} // namespace vlm
