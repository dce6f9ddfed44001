#include "parallel/ac/activation_checkpointing.h"

#include <memory>

#include "src/base/check.h"
#include "src/core/autograd.h"

namespace vlm::parallel {

std::span<const EnumName<AcMode>> ac_mode_names() {
  static constexpr EnumName<AcMode> names[] = {{"off", AcMode::off},
                                               {"full", AcMode::full},
                                               {"selective", AcMode::selective},
                                               {"sac", AcMode::selective, true}};
  return names;
}

const char* ac_mode_name(AcMode mode) { return enum_name(ac_mode_names(), mode); }

AcMode parse_ac_mode(const std::string& text) {
  return parse_enum(ac_mode_names(), text, "activation checkpointing mode");
}

namespace {

std::vector<Tensor> run_full(const nn::Module::Forward& forward, const std::vector<Tensor>& in) {
  if (!GradMode::is_enabled()) return forward(in);
  return checkpoint(forward, in); // checkpoint keeps `forward` (a copy) until backward
}

std::vector<Tensor> run_selective(const nn::Module::Forward& forward,
                                  const std::vector<Tensor>& in) {
  if (!GradMode::is_enabled()) return forward(in);
  // A fresh stash per call, freed with the checkpoint node after backward.
  auto stash = std::make_shared<MatmulStash>();
  auto with_stash = [forward, stash](const std::vector<Tensor>& x) {
    LinearInterceptScope scope(stash.get());
    return forward(x);
  };
  return checkpoint(with_stash, in);
}

} // namespace

std::vector<size_t> apply_activation_checkpointing(const std::vector<nn::Module*>& blocks,
                                                   AcMode mode) {
  std::vector<size_t> handles;
  if (mode == AcMode::off) return handles;
  for (nn::Module* block : blocks) {
    VLM_CHECK(block, "apply_activation_checkpointing: null block");
    VLM_CHECK(block->num_forward_wrappers() == 0,
              "apply_activation_checkpointing: ", block->type_name(),
              " is wrapped already (apply it once, before FSDP)");
    handles.push_back(block->add_forward_wrapper(mode == AcMode::full ? run_full : run_selective));
  }
  return handles;
}

Tensor MatmulStash::linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (!GradMode::is_enabled()) { // the checkpoint's first run: compute and keep
    Tensor y = vlm::linear(x, w, bias);
    outputs_.push_back(y);
    return y;
  }
  // Recomputation: hand back the kept output, with linear()'s own backward (the same GEMMs, so
  // the gradients are bit-identical to running without checkpointing).
  VLM_CHECK(next_ < outputs_.size(), "selective checkpointing: projection ", next_ + 1,
            " was not run in the first forward (", outputs_.size(),
            " kept); the block's forward must call its projections in the same order each time");
  const Tensor& kept = outputs_[next_++];
  Shape expected = x.shape();
  VLM_CHECK(!expected.empty() && w.dim() == 2, "selective checkpointing: linear of ", x.desc(),
            " and ", w.desc());
  expected.back() = w.size(0);
  VLM_CHECK(kept.shape() == expected && kept.dtype() == x.dtype(),
            "selective checkpointing: projection ", next_, " kept ", kept.desc(),
            " but the recomputation asks for ", shape_str(expected), " ", dtype_name(x.dtype()),
            "; the block's forward must be deterministic");
  return linear_from_output(x, w, bias, kept);
}

size_t MatmulStash::nbytes() const {
  size_t n = 0;
  for (const auto& t : outputs_) n += t.nbytes();
  return n;
}

} // namespace vlm::parallel
