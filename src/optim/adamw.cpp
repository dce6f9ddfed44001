#include "src/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <vector>

#include "kernels/optim.h"
#include "src/core/autograd.h"
#include "src/core/dispatch.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::optim {

namespace {

DType state_dtype(DType param) { return param == DType::f64 ? DType::f64 : DType::f32; }

void check_param(const ParamGroup& g, const Tensor& p, std::set<std::string>& names) {
  const std::string where = "AdamW: group '" + g.name + "'";
  VLM_CHECK(p.defined(), where, " holds an undefined tensor");
  VLM_CHECK(!p.name().empty(), where, ": parameter ", p.desc(),
            " has no name (Module::materialize names parameters; or call Tensor::set_name)");
  VLM_CHECK(names.insert(p.name()).second, where, ": parameter '", p.name(),
            "' appears twice (each parameter belongs to exactly one group)");
  VLM_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::bf16 || p.dtype() == DType::f64, where,
            ": parameter '", p.name(), "' must be f32, bf16 or f64, got ", p.desc());
  VLM_CHECK(p.is_leaf() && p.requires_grad(), where, ": parameter '", p.name(), "' ", p.desc(),
            " must be a leaf that requires grad (leave frozen parameters out of the optimizer)");
  VLM_CHECK(p.is_contiguous(), where, ": parameter '", p.name(), "' must be contiguous, got ",
            p.desc());
  VLM_CHECK(p.device().is_cpu() || p.dtype() != DType::f64, where, ": parameter '", p.name(), "' ",
            p.desc(), ": f64 parameters are updated on CPU only (CUDA: f32 or bf16)");
}

// CUDA parameters are not updated one by one: step() collects them into batches of one device
// and one (param, grad) dtype pair, each updated by one multi-tensor launch.
struct CudaBatch {
  Device device;
  DType param_dtype, grad_dtype;
  std::vector<kernels::cuda::AdamWTensor> tensors;
  std::vector<Tensor> keep; // contiguous gradients, alive until the launch is enqueued
};

// The skip flag of step() where each parameter lives: read once on the host for CPU parameters,
// copied once to each CUDA device it is not on already.
class SkipFlag {
public:
  explicit SkipFlag(const Tensor& skip) : skip_(skip) {
    VLM_CHECK(!skip.defined() || (skip.numel() == 1 && skip.dtype() == DType::f64),
              "AdamW::step: the skip flag must be one f64 value, got ", skip.desc());
  }
  bool on_host() {
    if (!host_) host_ = skip_.defined() && skip_.to_doubles()[0] != 0.0;
    return *host_;
  }
  // nullptr without a flag.
  const double* on_device(Device device) {
    if (!skip_.defined()) return nullptr;
    if (skip_.device() == device) return skip_.data<double>();
    for (const Tensor& c : copies_)
      if (c.device() == device) return c.data<double>();
    copies_.push_back(skip_.to(device));
    return copies_.back().data<double>();
  }

private:
  Tensor skip_;
  std::optional<bool> host_;
  std::vector<Tensor> copies_; // alive until the launches that read them are enqueued
};

void add_to_batch(std::vector<CudaBatch>& batches, Tensor& p, const Tensor& g, AdamWState& st,
                  const kernels::AdamWStepArgs& args) {
  VLM_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::bf16,
            "AdamW: no CUDA update for parameter ", p.desc());
  auto it = std::find_if(batches.begin(), batches.end(), [&](const CudaBatch& b) {
    return b.device == p.device() && b.param_dtype == p.dtype() && b.grad_dtype == g.dtype();
  });
  if (it == batches.end()) {
    batches.push_back(CudaBatch{p.device(), p.dtype(), g.dtype(), {}, {}});
    it = batches.end() - 1;
  }
  kernels::cuda::AdamWTensor t;
  t.param = p.data_ptr();
  t.master = st.master.defined() ? st.master.data<float>() : nullptr;
  t.grad = g.data_ptr();
  t.exp_avg = st.exp_avg.data<float>();
  t.exp_avg_sq = st.exp_avg_sq.data<float>();
  t.n = p.numel();
  t.args = args;
  it->tensors.push_back(t);
  it->keep.push_back(g);
}

// One multi-tensor launch on the current stream of the batch's device; skip: nullptr or the flag
// on that device.
void run_batch(const CudaBatch& b, const double* skip) {
  dispatch_device(
      "AdamW", b.device, [] {},
      [&](auto stream) {
        using kernels::cuda::adamw_multi_step;
        const auto* t = b.tensors.data();
        const auto n = int64_t(b.tensors.size());
        // The descriptors go up from pinned memory (no pageable upload in a step); the pinned
        // allocator reuses the block only after the work queued on this stream has finished.
        Tensor staging =
            Tensor::empty_pinned({int64_t(kernels::cuda::adamw_multi_staging_bytes(n))}, DType::u8);
        void* s = staging.data_ptr();
        if (b.param_dtype == DType::f32)
          adamw_multi_step<float, float>(t, n, skip, s, stream);
        else if (b.grad_dtype == DType::bf16)
          adamw_multi_step<bf16, bf16>(t, n, skip, s, stream);
        else
          adamw_multi_step<bf16, float>(t, n, skip, s, stream);
      });
}

// Runs the kernel for one parameter; the (param, grad) dtype pair picks the instantiation.
void update(Tensor& p, const Tensor& g, AdamWState& st, const kernels::AdamWStepArgs& args) {
  const int64_t n = p.numel();
  using kernels::cpu::adamw_step;
  switch (p.dtype()) {
  case DType::f32:
    adamw_step<float, float, float>(p.data<float>(), nullptr, g.data<float>(),
                                    st.exp_avg.data<float>(), st.exp_avg_sq.data<float>(), n, args);
    return;
  case DType::f64:
    adamw_step<double, double, double>(p.data<double>(), nullptr, g.data<double>(),
                                       st.exp_avg.data<double>(), st.exp_avg_sq.data<double>(), n,
                                       args);
    return;
  case DType::bf16:
    if (g.dtype() == DType::bf16)
      adamw_step<bf16, bf16, float>(p.data<bf16>(), st.master.data<float>(), g.data<bf16>(),
                                    st.exp_avg.data<float>(), st.exp_avg_sq.data<float>(), n, args);
    else
      adamw_step<bf16, float, float>(p.data<bf16>(), st.master.data<float>(), g.data<float>(),
                                     st.exp_avg.data<float>(), st.exp_avg_sq.data<float>(), n,
                                     args);
    return;
  default: VLM_FAIL("AdamW: unsupported parameter ", p.desc());
  }
}

} // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : groups_(std::move(groups)), options_(options) {
  VLM_CHECK(options_.beta1 >= 0 && options_.beta1 < 1 && options_.beta2 >= 0 && options_.beta2 < 1,
            "AdamW: betas must be in [0, 1), got (", options_.beta1, ", ", options_.beta2, ")");
  VLM_CHECK(options_.eps >= 0, "AdamW: eps must be >= 0, got ", options_.eps);
  std::set<std::string> names;
  for (const auto& g : groups_) {
    VLM_CHECK(g.lr_scale >= 0 && std::isfinite(g.lr_scale), "AdamW: group '", g.name,
              "' lr_scale must be finite and >= 0, got ", g.lr_scale);
    VLM_CHECK(g.weight_decay >= 0 && std::isfinite(g.weight_decay), "AdamW: group '", g.name,
              "' weight_decay must be finite and >= 0, got ", g.weight_decay);
    for (const auto& p : g.params) {
      check_param(g, p, names);
      AdamWState st;
      st.exp_avg = Tensor::zeros(p.shape(), state_dtype(p.dtype()), p.device());
      st.exp_avg_sq = Tensor::zeros(p.shape(), state_dtype(p.dtype()), p.device());
      if (p.dtype() == DType::bf16) st.master = p.detach().to(DType::f32);
      state_.emplace(p.name(), std::move(st));
    }
  }
}

void AdamW::step(double lr, const Tensor& skip) {
  VLM_CHECK(lr >= 0 && std::isfinite(lr), "AdamW::step: lr must be finite and >= 0, got ", lr);
  NoGradGuard no_grad;
  SkipFlag flag(skip);
  last_advanced_.clear();
  std::vector<CudaBatch> cuda_batches;
  for (auto& g : groups_) {
    for (auto& p : g.params) {
      if (!p.grad().defined()) continue;
      const Tensor& grad = p.grad();
      VLM_CHECK(grad.shape() == p.shape(), "AdamW: gradient of '", p.name(),
                "' has the wrong shape, ", describe("param", p), " vs ", describe("grad", grad));
      VLM_CHECK(grad.dtype() == p.dtype() ||
                    (p.dtype() == DType::bf16 && grad.dtype() == DType::f32),
                "AdamW: gradient of '", p.name(), "' must be ", dtype_name(p.dtype()),
                (p.dtype() == DType::bf16 ? " or f32" : ""), ", ", describe("param", p), " vs ",
                describe("grad", grad));
      VLM_CHECK(grad.device() == p.device(), "AdamW: gradient of '", p.name(),
                "' is on another device, ", describe("param", p), " vs ", describe("grad", grad));
      AdamWState& st = state_.at(p.name());
      st.step++;
      last_advanced_.push_back(&st);
      kernels::AdamWStepArgs args;
      args.lr = lr * g.lr_scale;
      args.beta1 = options_.beta1;
      args.beta2 = options_.beta2;
      args.eps = options_.eps;
      args.weight_decay = g.weight_decay;
      args.step_size = args.lr / (1.0 - std::pow(options_.beta1, double(st.step)));
      args.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(options_.beta2, double(st.step)));
      if (p.device().is_cuda())
        add_to_batch(cuda_batches, p, grad.contiguous(), st, args);
      else if (!flag.on_host())
        update(p, grad.contiguous(), st, args);
    }
  }
  for (const auto& b : cuda_batches) run_batch(b, flag.on_device(b.device));
}

void AdamW::undo_step() {
  for (AdamWState* st : last_advanced_) st->step--;
  last_advanced_.clear();
}

void AdamW::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.zero_grad();
}

void AdamW::refresh_master() {
  for (auto& g : groups_)
    for (auto& p : g.params) {
      AdamWState& st = state_.at(p.name());
      if (st.master.defined()) copy_(st.master, p.detach()); // into the master's own storage
    }
}

std::vector<std::string> AdamW::param_names() const {
  std::vector<std::string> names;
  for (const auto& g : groups_)
    for (const auto& p : g.params) names.push_back(p.name());
  return names;
}

bool AdamW::has_state(const std::string& param_name) const { return state_.count(param_name) > 0; }

AdamWState& AdamW::state(const std::string& param_name) {
  auto it = state_.find(param_name);
  VLM_CHECK(it != state_.end(), "AdamW: no state for parameter '", param_name, "' (", state_.size(),
            " parameters are optimized)");
  return it->second;
}

const AdamWState& AdamW::state(const std::string& param_name) const {
  return const_cast<AdamW*>(this)->state(param_name);
}

} // namespace vlm::optim
